//! The line of one id's waiting acquires, `<stem>.queue` (PROTOCOL §4.6): when the lease is
//! free, the waiter that has waited longest tries first.
//!
//! A waiter appends one byte to the file (`O_APPEND`: the kernel gives each append its own
//! offset, in the order the appends happen) and holds an OFD write lock (`fcntl(2)`
//! `F_OFD_SETLK`, owned by the open file description) on that byte until its call ends. Its
//! turn has come when no other description holds a lock on an earlier byte: one
//! `F_OFD_GETLK`. The kernel drops the lock when the call closes the file or its process dies,
//! so a dead waiter never holds up the line. OFD locks and the protocol's `flock(2)` locks do
//! not interact on Linux.
//!
//! The line orders *attempts* only: every attempt is an ordinary acquire, decided by the
//! machine, and nothing a transition reads depends on this file. It is best effort: a file
//! that cannot be used (planted, another user's, a full disk) leaves the wait unqueued, as
//! waits were before there was a line; the call never fails for it.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use super::files::{Access, Opener};

/// How long a waiter that is not first lets a free lease go to the first one before it tries
/// too: the first waiter may be stopped (`SIGSTOP`) or starved of CPU. Well above the longest
/// pause of a wait's loop (10 ms), far below any TTL.
pub(super) const HANDOFF_GRACE: Duration = Duration::from_millis(50);

/// How often a waiter that is not first looks again while the lease is free (for at most
/// [`HANDOFF_GRACE`]): the first waiter's grant ends it.
pub(super) const HANDOFF_POLL: Duration = Duration::from_micros(200);

/// The file is emptied when the last waiter leaves and it has grown past this many bytes
/// (one per wait).
const TRIM_AT: u64 = 4096;

/// One call's place in the line, or why it has none.
#[derive(Debug)]
pub(super) enum Line {
    /// Not in the line yet: the call has not had to wait.
    Outside,
    /// In the line.
    In(Place),
    /// The file cannot be used: the wait is unqueued.
    Off,
}

impl Line {
    /// Whether this call may try to acquire now: nobody waits before it. A call still
    /// `Outside` tries only when nobody waits at all (so a holder that released and asks again
    /// at once lines up behind the waiters instead of taking the lease back); one `In` the line
    /// when no earlier place is held; an `Off` call always.
    pub(super) fn turn(&self, opener: &Opener, path: &Path) -> bool {
        match self {
            Line::Outside => !anyone_waiting(opener, path),
            Line::In(place) => place.first(),
            Line::Off => true,
        }
    }

    /// Takes a place at the end of the line, if the call has none yet.
    pub(super) fn join(&mut self, opener: &Opener, path: &Path) {
        if matches!(self, Line::Outside) {
            *self = Place::take(opener, path).map_or(Line::Off, Line::In);
        }
    }
}

/// A place in the line: the byte at offset `at`, write-locked by this open file description.
#[derive(Debug)]
pub(super) struct Place {
    file: File,
    at: i64,
}

impl Place {
    fn take(opener: &Opener, path: &Path) -> Option<Place> {
        let mut file = opener.open(path, Access::Queue).ok()?;
        file.write_all(b".").ok()?;
        // O_APPEND: the byte went to the end, whatever others appended meanwhile.
        let at = i64::try_from(file.stream_position().ok()?).ok()? - 1;
        set_lock(&file, lock_range(libc::F_WRLCK, at, 1)).ok()?;
        // Closing the file (dropping the place) drops the lock.
        Some(Place { file, at })
    }

    /// Whether no other waiter holds an earlier place. A failed check answers yes: the line
    /// only orders attempts.
    fn first(&self) -> bool {
        self.at == 0 || !held_by_others(&self.file, 0, self.at).unwrap_or(false)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // The last one out empties a grown file. A waiter that appended but has not locked yet
        // may lose its rank to the next arrival: the order of one pair, never an attempt.
        if !held_by_others(&self.file, 0, 0).unwrap_or(true)
            && self.file.metadata().is_ok_and(|m| m.len() > TRIM_AT)
        {
            let _ = self.file.set_len(0);
        }
    }
}

/// Whether any waiter holds a place in the line at `path` (missing or unusable: no).
fn anyone_waiting(opener: &Opener, path: &Path) -> bool {
    match opener.open(path, Access::QueueLook) {
        Ok(file) => held_by_others(&file, 0, 0).unwrap_or(false),
        Err(_) => false,
    }
}

/// Whether a description other than `file`'s holds a lock on `len` bytes from `start` (`len`
/// 0: to the end and beyond).
fn held_by_others(file: &File, start: i64, len: i64) -> nix::Result<bool> {
    let mut probe = lock_range(libc::F_WRLCK, start, len);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
    Ok(i32::from(probe.l_type) != libc::F_UNLCK)
}

fn set_lock(file: &File, range: libc::flock) -> nix::Result<()> {
    fcntl(file, FcntlArg::F_OFD_SETLK(&range)).map(drop)
}

fn lock_range(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        // Must be 0 for OFD locks.
        l_pid: 0,
    }
}

/// The path of `<stem>.queue` in `dir`.
pub(super) fn path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}.queue"))
}

/// When a waiter that is not first has let a free lease go for [`HANDOFF_GRACE`] since
/// `since`, it tries too.
pub(super) fn grace_over(since: Option<Instant>) -> bool {
    since.is_some_and(|t| t.elapsed() >= HANDOFF_GRACE)
}
