//! Locks and waits. Nothing here starts a thread or keeps a descriptor past its call, and every
//! wait ends by its deadline:
//!
//! - [`Gate`]: the in-process turn on one id, a condition variable with a timed wait, so the
//!   k-th caller waits for its own deadline, not k lock timeouts.
//! - [`try_lock_until`]: the transition lock, taken with non-blocking attempts and an
//!   exponential backoff (20 µs to 1 ms) until the deadline. Transitions hold it for
//!   microseconds to a few milliseconds, so the backoff stays close to that.
//! - [`wait_for_holder`]: a holder's liveness lock. The wait watches the liveness file with
//!   inotify: the kernel reports the close of the holder's descriptor (`IN_CLOSE_WRITE`) when
//!   the holder releases or dies, so the wait wakes at that instant without a thread blocked in
//!   `flock(2)`. Its checks use a *shared* try-lock, which a holder's exclusive lock excludes
//!   but which never excludes another probe or waiter: a waiter never looks like a holder.

use std::fs::{File, TryLockError};
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

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

/// One id's in-process turn: at most one caller of an instance runs a transition on an id.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: Mutex<GateState>,
    free: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    busy: bool,
    /// Callers waiting for the turn: only then does leaving it wake anyone (a condition
    /// variable's notify is a system call even with nobody waiting).
    waiting: usize,
}

impl Gate {
    /// Takes the turn, waiting until `deadline` at most (`None`: no limit). Returns `None` at
    /// the deadline.
    pub(super) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let mut st = lock(&self.state);
        while st.busy {
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    Some(left)
                }
            };
            st.waiting += 1;
            st = match left {
                None => self.free.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.free
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            st.waiting -= 1;
        }
        st.busy = true;
        Some(Turn { gate: self })
    }

    /// Whether nobody has the turn now (for pruning idle ids).
    pub(super) fn is_free(&self) -> bool {
        self.state
            .try_lock()
            .is_ok_and(|st| !st.busy && st.waiting == 0)
    }
}

/// A caller's turn on an id; dropping it (also on unwinding) lets the next caller in.
pub(super) struct Turn<'a> {
    gate: &'a Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.gate.state);
        st.busy = false;
        if st.waiting > 0 {
            self.gate.free.notify_one();
        }
    }
}

/// Locks `file` exclusively, retrying a busy lock with a growing pause until `deadline`
/// (`None`: no limit). `Ok(false)` at the deadline.
pub(super) fn try_lock_until(file: &File, deadline: Option<Instant>) -> io::Result<bool> {
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

/// Whether the holder of the liveness lock that `file` opened is gone: a shared try-lock,
/// dropped at once (closing the caller's descriptor releases it too).
pub(super) fn holder_gone(file: &File) -> io::Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => {
            // Unlock now, so the instant this descriptor holds a shared lock is as short as
            // possible (it excludes nobody but an exclusive locker of this very file).
            let _ = file.unlock();
            Ok(true)
        }
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Idle inotify instances of one lease manager, reused by its waits. Closing an instance with
/// a watch costs the kernel a grace period (milliseconds), so a wait removes its watch and
/// hands the instance back instead; at most [`IDLE_WATCHES`] are kept.
#[derive(Debug, Default)]
pub(super) struct Watches {
    idle: Mutex<Vec<Inotify>>,
}

/// How many idle inotify instances a lease manager keeps for its waits.
const IDLE_WATCHES: usize = 2;

impl Watches {
    fn take(&self) -> nix::Result<Inotify> {
        match lock(&self.idle).pop() {
            Some(ino) => Ok(ino),
            None => Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK),
        }
    }

    fn give(&self, ino: Inotify) {
        // Drop what the last wait left queued (its IN_IGNORED, late events).
        while ino.read_events().is_ok_and(|e| !e.is_empty()) {}
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_WATCHES {
            idle.push(ino);
        }
    }
}

/// Waits until the holder of the liveness lock at `path` (opened as `file`) releases it or
/// dies, or until `wake`. Returns early on any change of the file (it may have been deleted or
/// replaced); the caller then looks again.
pub(super) fn wait_for_holder(
    watches: &Watches,
    path: &Path,
    file: &File,
    wake: Instant,
) -> io::Result<()> {
    let flags = AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_CLOSE_NOWRITE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    let Ok(ino) = watches.take() else {
        // No inotify instance (the per-user limit, 128 by default, is reached): poll instead.
        return poll_for_holder(file, wake);
    };
    let wd = match ino.add_watch(path, flags) {
        Ok(wd) => wd,
        Err(_) => {
            watches.give(ino);
            return poll_for_holder(file, wake);
        }
    };
    let result = watch_holder(&ino, wd, file, wake);
    let _ = ino.rm_watch(wd);
    watches.give(ino);
    result
}

fn watch_holder(
    ino: &Inotify,
    wd: nix::sys::inotify::WatchDescriptor,
    file: &File,
    wake: Instant,
) -> io::Result<()> {
    // Checked after the watch exists, so a release between the two is not missed.
    if holder_gone(file)? {
        return Ok(());
    }
    loop {
        let left = wake.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
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
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let events = ino.read_events().unwrap_or_default();
        let ours = events.iter().filter(|e| e.wd == wd);
        let (mut closed, mut looked) = (false, false);
        for e in ours {
            if e.mask.intersects(
                AddWatchFlags::IN_ATTRIB
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
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
        poll_for_holder(file, settle.min(wake))?;
        if holder_gone(file)? {
            return Ok(());
        }
    }
}

/// Checks `file`'s lock with a growing pause until the holder is gone or `until` passes.
fn poll_for_holder(file: &File, until: Instant) -> io::Result<()> {
    let mut pause = FIRST_BACKOFF;
    loop {
        if holder_gone(file)? {
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
