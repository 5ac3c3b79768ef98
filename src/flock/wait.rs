//! Locks and waits. Nothing here starts a thread or keeps a descriptor past its call (but for
//! at most two idle inotify instances per lease manager, see [`Watches`]), and every wait ends
//! by its deadline:
//!
//! - [`Gate`](crate::front::Gate) (shared with the PostgreSQL backend): the in-process turn on
//!   one id, so the k-th caller waits for its own deadline, not k lock timeouts.
//! - [`try_lock_until`]: the transition lock, taken with non-blocking attempts (a waiting
//!   acquire's again at once for 50 µs first, yielding the CPU between them) and an
//!   exponential backoff (20 µs to 1 ms) until the deadline. Transitions hold it for
//!   microseconds to a few milliseconds, so the backoff stays close to that.
//! - [`wait_for_holder`]: a holder's liveness lock. The wait watches the liveness file with
//!   an inotify mark on the file itself (never on the directory, whose size would then set the
//!   wait's cost): the kernel reports the close of the holder's descriptor (`IN_CLOSE_WRITE`)
//!   when the holder releases or dies, so the wait wakes at that instant without a thread
//!   blocked in `flock(2)`. Its checks use a *shared* try-lock, which a holder's exclusive
//!   lock excludes but which never excludes another probe or waiter: a waiter never looks like
//!   a holder.

use std::cell::Cell;
use std::fs::{self, File, TryLockError};
use std::io::{self, PipeReader, PipeWriter};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::live::holder_gone;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// How long a waiting acquire tries a busy transition lock again at once before it pauses.
const SPIN_LOCK: Duration = Duration::from_micros(50);
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
}

/// Whether `cancel` asks the wait to end.
pub(super) fn cancelled(cancel: Option<&Cancel>) -> bool {
    cancel.is_some_and(|c| c.flag.load(Ordering::Acquire))
}

thread_local! {
    /// Whether this thread is making a waiting acquire's attempt ([`eager`]).
    static EAGER: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread's transition-lock takes as a waiting acquire's, until the guard drops:
/// [`try_lock_until`] then tries a busy lock again at once for [`SPIN_LOCK`] before it pauses.
pub(super) fn eager() -> Eager {
    EAGER.set(true);
    Eager(())
}

/// The guard of [`eager`].
pub(super) struct Eager(());

impl Drop for Eager {
    fn drop(&mut self) {
        EAGER.set(false);
    }
}

/// Locks `file` exclusively, retrying a busy lock with a growing pause until `deadline`
/// (`None`: no limit). `Ok(false)` at the deadline.
pub(crate) fn try_lock_until(file: &File, deadline: Option<Instant>) -> io::Result<bool> {
    let mut pause = FIRST_BACKOFF;
    let mut spin_until = None;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
        // A waiting acquire's attempt, first, for a moment, again at once (the CPU given up
        // between attempts): it comes right after the holder let go, whose transition ends in
        // microseconds, and a caller that sleeps through that instant loses the lock to one
        // that asks again at once — a loop that releases and acquires again without pause
        // would keep the lease from every waiter (PROTOCOL §4.6). Other callers do not spin:
        // many plain acquires of one id spinning on two cores halve its throughput.
        if EAGER.get() {
            let now = Instant::now();
            let spin = *spin_until.get_or_insert(now + SPIN_LOCK);
            if now < spin && deadline.is_none_or(|d| now < d) {
                thread::yield_now();
                continue;
            }
        }
        if !sleep_before(deadline, pause) {
            return Ok(false);
        }
        pause = (pause * 2).min(MAX_BACKOFF);
    }
}

/// What a wait watches on the holder's liveness file (a mark on its inode, not on the
/// directory): every close of a descriptor of it, a change of its link count (unlinked, or
/// replaced by a rename over its name), its move, and its end. `IN_DONT_FOLLOW`: a link at the
/// name is never followed (the wait then sees that the name is not the file it holds).
const WAIT_MASK: AddWatchFlags = AddWatchFlags::IN_CLOSE_WRITE
    .union(AddWatchFlags::IN_CLOSE_NOWRITE)
    .union(AddWatchFlags::IN_ATTRIB)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_DONT_FOLLOW);

/// The inotify instances of one lease manager's waits.
///
/// A wait marks the **holder's liveness file** itself, never the lease directory: a mark on a
/// directory that reports its entries' events makes the kernel flag every cached entry of the
/// directory when it is added (measured on this crate's test machine, tmpfs: 0.5 µs at 10
/// entries, 1.6 ms at 100 000, 19 ms at 300 000, holding the directory's dentry lock, which every
/// creation in the directory needs), so a waiter's cost would grow with the directory. A mark on
/// one file costs the same at any size.
///
/// Why the mark is left in place when the wait ends: removing the last inotify mark of an inode
/// queues a kernel work item (measured at 20–45 µs on a two-core virtual machine, on the waiter's
/// path right after the holder dies). A parked instance keeps the mark of its last wait; the next
/// wait on the instance removes it (while its own holder is alive, off any path that matters), or
/// the kernel drops it with the file, when the file is unlinked and its last descriptor closed
/// (the waiter keeps its descriptor until after its next attempt, see
/// [`FlockLease::acquire_until`](super::FlockLease)). So each instance has at most one mark.
/// Closing an instance costs the kernel a grace period (milliseconds), so at most
/// [`IDLE_WATCHES`] idle instances are kept and reused.
#[derive(Debug, Default)]
pub(super) struct Watches {
    idle: Mutex<Vec<Watch>>,
}

#[derive(Debug)]
struct Watch {
    ino: Inotify,
    /// The mark of this instance's last wait, if the kernel has not dropped it.
    mark: Option<WatchDescriptor>,
}

/// How many idle inotify instances a lease manager keeps for its waits.
const IDLE_WATCHES: usize = 2;

impl Watches {
    /// Closes the idle instances (descriptors are short); returns how many.
    pub(super) fn give_back(&self) -> usize {
        std::mem::take(&mut *lock(&self.idle)).len()
    }

    /// An instance with no event queued, its last wait's mark (if any) still in place.
    fn take(&self) -> nix::Result<Watch> {
        let parked = lock(&self.idle).pop();
        match parked {
            Some(w) => {
                // Whatever came while parked (events of the last wait's file) is stale now.
                while w.ino.read_events().is_ok_and(|e| !e.is_empty()) {}
                Ok(w)
            }
            None => Ok(Watch {
                ino: Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?,
                mark: None,
            }),
        }
    }

    /// Parks `w` again, or closes it when enough are parked.
    fn give(&self, w: Watch) {
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_WATCHES {
            idle.push(w);
        }
    }
}

impl Watch {
    /// Marks the file at `path`, which must be `file`; removes the instance's earlier mark on
    /// another file. `Ok(None)`: the name is not `file` any more (replaced, removed, a link
    /// planted): the caller looks again.
    fn mark(&mut self, path: &Path, file: &File) -> io::Result<Option<WatchDescriptor>> {
        let wd = match self.ino.add_watch(path, WAIT_MASK) {
            Ok(wd) => wd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let Some(old) = self.mark.replace(wd)
            && old != wd
        {
            // Already gone if the kernel dropped it with its file: nothing to do then.
            let _ = self.ino.rm_watch(old);
        }
        // The mark went to whatever stood at the name when it was added: make sure that is the
        // file this wait holds open (the same inode cannot come back to the name once gone).
        let (at_name, held) = (fs::symlink_metadata(path), file.metadata()?);
        Ok(match at_name {
            Ok(m) if m.dev() == held.dev() && m.ino() == held.ino() => Some(wd),
            _ => None,
        })
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
    let Ok(mut w) = watches.take() else {
        // No inotify instance (the per-user limit, 128 by default, is reached): poll instead.
        return poll_for_holder(file, wake, cancel);
    };
    let result = match w.mark(path, file) {
        Ok(Some(wd)) => watch_holder(&mut w, wd, file, wake, cancel),
        // Not the file held: look again at once.
        Ok(None) => Ok(()),
        // The file cannot be watched (the per-user limit of marks): poll instead.
        Err(_) => poll_for_holder(file, wake, cancel),
    };
    watches.give(w);
    result
}

fn watch_holder(
    w: &mut Watch,
    wd: WatchDescriptor,
    file: &File,
    wake: Instant,
    cancel: Option<&Cancel>,
) -> io::Result<()> {
    // Checked after the mark is in place, so a release between the two is not missed.
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
        // Events of an earlier mark of the instance, removed when this one was added, are not
        // this wait's.
        for e in events.iter().filter(|e| e.wd == wd) {
            if e.mask.intersects(
                AddWatchFlags::IN_ATTRIB
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
            ) {
                if e.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The kernel dropped the mark (the file is gone).
                    w.mark = None;
                }
                // Unlinked, renamed, replaced, or gone: the record decides what to wait for
                // next.
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
        if cancelled(cancel) || holder_gone(file)? || !sleep_before(Some(until), pause) {
            return Ok(());
        }
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Sleeps `pause`, or until `deadline` if that comes first; `false` when the deadline has
/// already passed.
pub(super) fn sleep_before(deadline: Option<Instant>, pause: Duration) -> bool {
    let left = deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    });
    if left.is_zero() {
        return false;
    }
    thread::sleep(pause.min(left));
    true
}

pub(super) use crate::front::deadline_after;

use crate::front::lock;
