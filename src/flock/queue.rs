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
use std::time::Duration;

use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;

use super::files::{Access, Opener};
use crate::line;

#[cfg(doc)]
use crate::line::HANDOFF_GRACE;

/// How often a waiter that is not first looks again while the lease is free (for at most
/// [`HANDOFF_GRACE`]): the first waiter's grant ends it.
pub(super) const HANDOFF_POLL: Duration = Duration::from_micros(200);

/// When a waiter leaves a file grown past this many bytes (one per wait), it is emptied if
/// nobody else is in the line, and otherwise the blocks before the last [`KEEP`] bytes are
/// given back (a hole: offsets, and so the order, stay as they are).
const TRIM_AT: u64 = 64 * 1024;
/// The bytes a hole punched into a grown file leaves in place at its end.
const KEEP: u64 = 4096;

/// One waiting call's part in the line: its place, and how long it has let a free lease go to
/// the places ahead. The rule's decisions are [`line`]'s; times are on the call's own clock
/// (`now`: since the wait began).
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    line: Line,
    /// How long the call has let a free lease go: the wait tells it what it sees
    /// ([`line::Yielded::let_go`], [`line::Yielded::saw_held`]).
    pub(crate) yielded: line::Yielded,
}

/// One call's place in the line, or why it has none.
#[derive(Debug, Default)]
enum Line {
    /// Not in the line yet: the call has not had to wait.
    #[default]
    Outside,
    /// In the line.
    In(Place),
    /// The file cannot be used: the wait is unqueued.
    Off,
}

impl Waiter {
    /// Whether this call may try to acquire now ([`line::Place::may_try`]): nobody waits
    /// before it. A call still outside tries only when nobody waits at all (so a holder that
    /// released and asks again at once lines up behind the waiters instead of taking the lease
    /// back); one in the line when no earlier place is held but those it passed over (a place
    /// ahead whose grace is over is passed over here); an unqueued call always.
    /// `token` reads the record's token, asked only while the call counts how long it has
    /// let the lease go ([`line::Yielded::seen`]).
    pub(crate) fn may_try(
        &mut self,
        opener: &Opener,
        path: &Path,
        now: Duration,
        token: impl FnOnce() -> Option<u64>,
    ) -> bool {
        match &mut self.line {
            Line::Outside => !anyone_waiting(opener, path),
            Line::In(Place { file, rule }) => {
                rule.may_try(&mut self.yielded, now, token, |start, len| {
                    // A failed check answers none: the line only orders attempts.
                    held_by_others(file, start, len).unwrap_or(None)
                })
            }
            Line::Off => true,
        }
    }

    /// Takes a place at the end of the line, if the call has none yet.
    pub(crate) fn join(&mut self, opener: &Opener, path: &Path) {
        if matches!(self.line, Line::Outside) {
            self.line = Place::take(opener, path).map_or(Line::Off, Line::In);
        }
    }

    /// Whether the call holds a place in the line.
    pub(crate) fn is_in(&self) -> bool {
        matches!(self.line, Line::In(_))
    }

    /// The rule's state: the place (`None`: outside or unqueued) and the count of the lease
    /// left free.
    #[cfg(all(feature = "fault-injection", feature = "internals"))]
    pub(crate) fn rule(&self) -> (Option<line::Place>, line::Yielded) {
        let place = match &self.line {
            Line::In(p) => Some(p.rule),
            Line::Outside | Line::Off => None,
        };
        (place, self.yielded)
    }
}

/// A place in the line: the byte at offset `at`, write-locked by this open file description.
#[derive(Debug)]
pub(super) struct Place {
    file: File,
    /// The byte and what was passed over: the rule's own state ([`line::Place`]).
    rule: line::Place,
}

impl Place {
    fn take(opener: &Opener, path: &Path) -> Option<Place> {
        let mut file = opener.open(path, Access::Queue).ok()?;
        // An emptying by the last waiter out may come between the append and the lock (it
        // holds the whole file locked meanwhile): then append again, at the new end.
        for _ in 0..3 {
            file.write_all(b".").ok()?;
            // O_APPEND: the byte went to the end, whatever others appended meanwhile.
            let at = i64::try_from(file.stream_position().ok()?).ok()? - 1;
            if set_lock(&file, lock_range(libc::F_WRLCK, at, 1)).is_err() {
                continue;
            }
            // Locked: nobody can empty the file now. Emptied before the lock, the byte is gone
            // and later arrivals would get earlier offsets: take another place.
            if file.metadata().ok()?.len() > at as u64 {
                return Some(Place {
                    file,
                    rule: line::Place::new(at),
                });
            }
            set_lock(&file, lock_range(libc::F_UNLCK, at, 1)).ok()?;
        }
        None
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let Ok(meta) = self.file.metadata() else {
            return;
        };
        if meta.len() <= TRIM_AT {
            return;
        }
        // The last one out empties the file, holding all of it locked so that no arrival can
        // lock a place meanwhile (one that appended first appends again: `Place::take`).
        if set_lock(&self.file, lock_range(libc::F_WRLCK, 0, 0)).is_ok() {
            let _ = self.file.set_len(0);
            return;
        }
        // Others wait: give back the blocks of the bytes before the last few (a file system
        // that cannot punch holes keeps them).
        let _ = nix::fcntl::fallocate(
            &self.file,
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            0,
            (meta.len() - KEEP) as libc::off_t,
        );
    }
}

/// Whether any waiter holds a place in the line at `path` (missing or unusable: no).
fn anyone_waiting(opener: &Opener, path: &Path) -> bool {
    opener
        .open(path, Access::QueueLook)
        .is_ok_and(|file| held_by_others(&file, 0, 0).is_ok_and(|lock| lock.is_some()))
}

/// A lock that a description other than `file`'s holds on `len` bytes from `start` (`len` 0:
/// to the end and beyond), if any (of several, the kernel reports one), as its start and
/// length (0: to the end and beyond).
fn held_by_others(file: &File, start: i64, len: i64) -> nix::Result<Option<(i64, i64)>> {
    let mut probe = lock_range(libc::F_WRLCK, start, len);
    fcntl(file, FcntlArg::F_OFD_GETLK(&mut probe))?;
    Ok((i32::from(probe.l_type) != libc::F_UNLCK).then_some((probe.l_start, probe.l_len)))
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
