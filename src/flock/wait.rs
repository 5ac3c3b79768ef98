//! Locks and waits. Nothing here starts a thread or keeps a descriptor past its call (but for
//! at most two idle inotify instances per lease manager, see [`Watches`]), and every wait ends
//! by its deadline:
//!
//! - [`Gate`](crate::gate::Gate) (shared with the PostgreSQL backend): the in-process turn on
//!   one id, so the k-th caller waits for its own deadline, not k lock timeouts.
//! - [`try_lock_until`]: the transition lock, taken with non-blocking attempts and an
//!   exponential backoff (20 µs to 1 ms) until the deadline. Transitions hold it for
//!   microseconds to a few milliseconds, so the backoff stays close to that.
//! - [`wait_for_holder`]: a holder's liveness lock. The wait watches the liveness file with
//!   inotify, through a watch on the lease directory: the kernel reports the close of the holder's descriptor (`IN_CLOSE_WRITE`) when
//!   the holder releases or dies, so the wait wakes at that instant without a thread blocked in
//!   `flock(2)`. Its checks use a *shared* try-lock, which a holder's exclusive lock excludes
//!   but which never excludes another probe or waiter: a waiter never looks like a holder.

use std::ffi::OsStr;
use std::fs::{File, TryLockError};
use std::io::{self, PipeReader, PipeWriter};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::live::holder_gone;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The first pause between two attempts on a busy lock.
const FIRST_BACKOFF: Duration = Duration::from_micros(20);
/// The longest pause between two attempts on a busy transition lock.
const MAX_BACKOFF: Duration = Duration::from_millis(1);
/// The longest pause between two checks when inotify cannot help (no instance available, or
/// the liveness file is missing).
const MAX_POLL: Duration = Duration::from_millis(10);
/// How often a parked waiter looks at the lock even without an event.
const RECHECK: Duration = Duration::from_secs(1);
/// After a close event, how long to look again without sleeping.
const SPIN: Duration = Duration::from_micros(100);
/// After a wake-up, how long the holder's lock may still be seen: the kernel reports the close
/// an instant before it drops the descriptor's locks.
const SETTLE: Duration = Duration::from_millis(5);

/// Ends a wait early, from another thread: the wait of an abandoned
/// [`acquire_wait_async`](super::FlockLease::acquire_wait_async) future. A parked wait polls
/// the read end of a pipe beside its inotify instance, so [`Cancel::cancel`] wakes it at once;
/// the other pauses of a wait are at most [`MAX_POLL`] and check the flag after each.
#[derive(Debug)]
pub(super) struct Cancel {
    flag: AtomicBool,
    rx: PipeReader,
    tx: Mutex<Option<PipeWriter>>,
}

impl Cancel {
    pub(super) fn new() -> io::Result<Cancel> {
        let (rx, tx) = io::pipe()?;
        Ok(Cancel {
            flag: AtomicBool::new(false),
            rx,
            tx: Mutex::new(Some(tx)),
        })
    }

    /// Asks the wait to end; it answers "held" at its next look.
    pub(super) fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
        // The write end closed: the read end polls as hung up, for good.
        drop(lock(&self.tx).take());
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// Whether `cancel` asks the wait to end.
pub(super) fn cancelled(cancel: Option<&Cancel>) -> bool {
    cancel.is_some_and(Cancel::is_cancelled)
}

/// Locks `file` exclusively, retrying a busy lock with a growing pause until `deadline`
/// (`None`: no limit). `Ok(false)` at the deadline.
pub(crate) fn try_lock_until(file: &File, deadline: Option<Instant>) -> io::Result<bool> {
    let mut pause = FIRST_BACKOFF;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
        if !sleep_before(deadline, pause) {
            return Ok(false);
        }
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// What a parked instance's directory watch reports: only events of the directory itself
/// (deleted or moved), which are rare. A wait widens it to the directory's entries.
const IDLE_MASK: AddWatchFlags = AddWatchFlags::IN_DELETE_SELF.union(AddWatchFlags::IN_MOVE_SELF);

/// What a wait watches: every close, attribute change, creation, deletion and rename of an
/// entry of the lease directory (each event names its entry), and the directory itself.
const WAIT_MASK: AddWatchFlags = IDLE_MASK
    .union(AddWatchFlags::IN_CLOSE_WRITE)
    .union(AddWatchFlags::IN_CLOSE_NOWRITE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_CREATE)
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO);

/// The inotify instances of one lease manager's waits, each with a watch on the lease
/// directory that stays in place between waits.
///
/// Why the directory and why it stays: removing the last inotify mark of an inode queues a
/// kernel work item (measured at 20–45 µs on a two-core virtual machine, on the waiter's path
/// right after the holder dies), and a mark on the holder's liveness file is removed at the
/// latest when the takeover deletes that file. A mark on the directory is never the last one
/// while an idle instance keeps its own, and a wait only changes its mark's mask: widened to
/// the directory's entries for the wait, narrowed back to events of the directory itself after.
/// Closing an instance costs the kernel a grace period (milliseconds), so at most
/// [`IDLE_WATCHES`] idle instances are kept and reused.
#[derive(Debug)]
pub(super) struct Watches {
    dir: PathBuf,
    idle: Mutex<Vec<DirWatch>>,
}

#[derive(Debug)]
struct DirWatch {
    ino: Inotify,
    wd: WatchDescriptor,
}

/// How many idle inotify instances a lease manager keeps for its waits.
const IDLE_WATCHES: usize = 2;

impl Watches {
    pub(super) fn new(dir: PathBuf) -> Watches {
        Watches {
            dir,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Closes the idle instances (descriptors are short); returns how many.
    pub(super) fn give_back(&self) -> usize {
        std::mem::take(&mut *lock(&self.idle)).len()
    }

    /// An instance whose directory watch reports the directory's entries.
    fn take(&self) -> nix::Result<DirWatch> {
        let parked = lock(&self.idle).pop();
        let ino = match parked {
            Some(w) => {
                // Whatever came while parked (the directory's own events) is stale now.
                while w.ino.read_events().is_ok_and(|e| !e.is_empty()) {}
                w.ino
            }
            None => Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?,
        };
        // On a parked instance this changes the existing mark's mask (the same watch
        // descriptor comes back) unless the directory was replaced meanwhile.
        let wd = ino.add_watch(&self.dir, WAIT_MASK)?;
        Ok(DirWatch { ino, wd })
    }

    /// Parks `w` again with its watch narrowed, or closes it when enough are parked.
    fn give(&self, w: DirWatch) {
        // Events of the wait still queued are dropped at the next take.
        match w.ino.add_watch(&self.dir, IDLE_MASK) {
            Ok(wd) if wd == w.wd => {}
            // The directory was replaced or the watch is gone: do not keep this instance.
            _ => return,
        }
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_WATCHES {
            idle.push(w);
        }
    }
}

/// Waits until the holder of the liveness lock at `path` (opened as `file`) releases it or
/// dies, until `wake`, or until `cancel` is cancelled. Returns early on any change of the file
/// (it may have been deleted or replaced); the caller then looks again.
pub(super) fn wait_for_holder(
    watches: &Watches,
    path: &Path,
    file: &File,
    wake: Instant,
    cancel: Option<&Cancel>,
) -> io::Result<()> {
    let (Ok(w), Some(name)) = (watches.take(), path.file_name()) else {
        // No inotify instance (the per-user limit, 128 by default, is reached), or the
        // directory cannot be watched: poll instead.
        return poll_for_holder(file, wake, cancel);
    };
    let result = watch_holder(&w, name, file, wake, cancel);
    watches.give(w);
    result
}

fn watch_holder(
    w: &DirWatch,
    name: &OsStr,
    file: &File,
    wake: Instant,
    cancel: Option<&Cancel>,
) -> io::Result<()> {
    // Checked after the watch reports the directory's entries, so a release between the two
    // is not missed.
    if holder_gone(file)? {
        return Ok(());
    }
    loop {
        let left = wake.saturating_duration_since(Instant::now());
        if left.is_zero() || cancelled(cancel) {
            return Ok(());
        }
        let mut fds = vec![PollFd::new(w.ino.as_fd(), PollFlags::POLLIN)];
        if let Some(c) = cancel {
            fds.push(PollFd::new(c.rx.as_fd(), PollFlags::POLLIN));
        }
        // Whole milliseconds, rounded up, so the wait never ends before `wake`; and a look at
        // the lock now and then, in case it was dropped without any close (an explicit unlock
        // by another implementation).
        let nap = left.min(RECHECK);
        let ms = nap.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) if nap < left => {
                if holder_gone(file)? {
                    return Ok(());
                }
                continue;
            }
            Ok(0) => return Ok(()),
            Ok(_) if cancelled(cancel) => return Ok(()),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let events = w.ino.read_events().unwrap_or_default();
        if events
            .iter()
            .any(|e| e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW))
        {
            // Events were lost (the queue overflowed; its event names no watch): look again.
            return Ok(());
        }
        let (mut closed, mut looked) = (false, false);
        for e in events.iter().filter(|e| e.wd == w.wd) {
            if e.mask.intersects(
                AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
            ) {
                // The directory itself changed: look again.
                return Ok(());
            }
            if e.name.as_deref() != Some(name) {
                // Another entry of the directory (another id, a temporary record).
                continue;
            }
            if e.mask.intersects(
                AddWatchFlags::IN_ATTRIB
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_MOVED_TO,
            ) {
                // Deleted, renamed or replaced: the record decides what to wait for next.
                return Ok(());
            }
            closed |= e.mask.contains(AddWatchFlags::IN_CLOSE_WRITE);
            looked |= e.mask.contains(AddWatchFlags::IN_CLOSE_NOWRITE);
        }
        if !closed {
            // A read-only descriptor was closed: another probe or waiter, or a probe of another
            // implementation that held the lock for an instant. One look suffices.
            if looked && holder_gone(file)? {
                return Ok(());
            }
            continue;
        }
        // A descriptor with write access was closed: the holder's, or someone else's. The
        // kernel reports the close just before dropping its locks: look again at once, a few
        // times (a sleep would cost the timer slack, ~50 µs), then for a moment with pauses.
        let spin_until = Instant::now() + SPIN;
        while Instant::now() < spin_until.min(wake) {
            if holder_gone(file)? {
                return Ok(());
            }
            thread::yield_now();
        }
        let settle = Instant::now() + SETTLE;
        poll_for_holder(file, settle.min(wake), cancel)?;
        if holder_gone(file)? {
            return Ok(());
        }
    }
}

/// Checks `file`'s lock with a growing pause until the holder is gone, `until` passes or
/// `cancel` is cancelled.
fn poll_for_holder(file: &File, until: Instant, cancel: Option<&Cancel>) -> io::Result<()> {
    let mut pause = FIRST_BACKOFF;
    loop {
        if cancelled(cancel) || holder_gone(file)? {
            return Ok(());
        }
        if !sleep_before(Some(until), pause) {
            return Ok(());
        }
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Sleeps `pause`, or until `deadline` if that comes first; `false` when the deadline has
/// already passed.
pub(super) fn sleep_before(deadline: Option<Instant>, pause: Duration) -> bool {
    let pause = match deadline {
        None => pause,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            pause.min(left)
        }
    };
    thread::sleep(pause);
    true
}

/// The deadline `timeout` from now; `None` (no limit) when it lies beyond what `Instant` can
/// represent.
pub(super) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A flag updated in single assignments: usable after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
