//! A read-only view of a lease directory: every session's record, its id where known, and
//! whether its holder lives.
//!
//! Looking never disturbs anyone and never blocks:
//!
//! - **Liveness** is probed with a *non-blocking shared* `flock` on the recorded generation's
//!   `<stem>.<token>.live`, dropped at once. Holders lock that file exclusively, so the probe
//!   fails (`live`) exactly while a holder's lock is held, and a probe can neither block a holder
//!   nor make a crashed holder look alive. This works on every local file system and across pid
//!   namespaces, unlike matching `/proc/locks` lines against `stat` (btrfs reports another
//!   device number there).
//! - **A bad file is judged as a call would judge it**: the record and the transition lock are
//!   opened read-only by the library's own opener (`O_NOFOLLOW | O_NONBLOCK`, the directory's
//!   ownership policy), so a FIFO, directory, socket or symbolic link planted under their
//!   names, or a file of another user in a shared directory, is reported in that row (state
//!   `unreadable`) with exactly the error, and remedy, that an acquire of the id would return
//!   ([`crate::Error`]'s text), never waited on or followed.
//!
//! # Session ids
//!
//! The record is exactly `{"owner","token","expiry"}` (shared with the Go package), and a stem
//! is a one-way hash, so the id of a session is not in the directory. `flocklease run` writes
//! it, while holding the lease, to a sidecar file `<stem>.id` ([`write_id`]): the id's bytes,
//! nothing else. The Go package never lists the directory and the adapter's sweep only removes
//! `.live` and temporary record files, so both ignore it. A sidecar is believed only if the
//! stem of its content is its own stem; it is never followed if it is a symbolic link. Records
//! written by other programs have no sidecar: their id is unknown (`None`) unless the caller
//! names it ([`session`]).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Error;
use crate::flock::files::{self, Access, Opener, Role};
use crate::flock::live;
use crate::machine::{self, Liveness};
use crate::name::{MAX_ID_BYTES, SessionId};
use crate::record::{LiveTag, Record};
use crate::timestamp::Timestamp;

/// The suffix of the sidecar file that names a stem's session id: `<stem>.id`.
pub const ID_SUFFIX: &str = ".id";

/// What one session of a lease directory looks like now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SessionStatus {
    /// The session's file stem.
    pub stem: String,
    /// The session id, when known: named by the caller, or read from a `<stem>.id` sidecar
    /// whose content hashes to this stem. Omitted from JSON when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The recorded owner (empty once released); `None` (JSON `null`) when the record could
    /// not be read or decoded.
    pub owner: Option<String>,
    /// The recorded fencing token; `None` when the record could not be read or decoded.
    pub token: Option<u64>,
    /// The recorded expiry, RFC 3339; `None` when the record could not be read or decoded.
    pub expiry: Option<String>,
    /// `live` (unexpired, its holder's lock is held), `dead` (unexpired, but its holder is
    /// gone), `unknown` (unexpired, its liveness file is missing or unusable), `expired`,
    /// `released`, `corrupt` (the record does not decode), `unreadable` (the record or the
    /// transition lock is no regular file, a symbolic link, another user's file in a shared
    /// directory, or cannot be opened or read: every call on the id fails with the error
    /// shown), `exhausted` (a takeover is due, but the token is `u64::MAX`: tokens never
    /// wrap, so every acquire fails) or `blocked` (a takeover is due, but a directory or
    /// another user's file stands at the next generation's liveness file, so every acquire
    /// fails until it is removed).
    pub state: &'static str,
    /// Whether an acquire by another owner would be granted now (the machine's answer).
    pub acquirable: bool,
    /// For a `corrupt` or `unreadable` row, the error every call on the id returns (with its
    /// remedy); for a liveness file that cannot be probed, why its state is `unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SessionStatus {
    /// Whether another owner would be refused now: the lease is held (`live`, or `unknown`
    /// before its expiry). A `corrupt` or `unreadable` record is neither held nor free.
    pub fn is_held(&self) -> bool {
        !self.acquirable && !self.is_broken()
    }

    /// Whether the record is `corrupt`, `unreadable`, `exhausted` or `blocked`: every acquire
    /// of this id
    /// fails until an operator repairs it.
    pub fn is_broken(&self) -> bool {
        matches!(
            self.state,
            "corrupt" | "unreadable" | "exhausted" | "blocked"
        )
    }
}

/// Lists the sessions of `dir` (every `<stem>.lease.json`), sorted by stem, as of `now`.
/// Holds every row in memory; [`scan_each`] streams them instead.
///
/// # Errors
///
/// [`Error::Io`] when the directory cannot be read. A corrupt or unreadable record is reported
/// in its row.
pub fn scan(dir: &Path, now: Timestamp) -> Result<Vec<SessionStatus>, Error> {
    let mut out = vec![];
    scan_each(dir, now, |row| out.push(row))?;
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    Ok(out)
}

/// Calls `each` with the status of every session of `dir` as of `now`, in the directory's
/// order, as it is read: memory stays the same however many sessions the directory holds
/// (what `flocklease status` prints from).
///
/// # Errors
///
/// As [`scan`]; rows already passed to `each` stay passed.
pub fn scan_each(dir: &Path, now: Timestamp, each: impl FnMut(SessionStatus)) -> Result<(), Error> {
    scan_each_trusting(dir, now, false, each)
}

/// [`scan_each`], trusting lease files of other users in a shared (sticky, world-writable)
/// directory when `trust_foreign_owners` is set, as a
/// [`FlockLeaseBuilder::trust_foreign_owners`](crate::FlockLeaseBuilder::trust_foreign_owners)
/// instance does (`flocklease status --trust-foreign-owners`: root reading a user's rows).
///
/// # Errors
///
/// As [`scan`].
pub fn scan_each_trusting(
    dir: &Path,
    now: Timestamp,
    trust_foreign_owners: bool,
    mut each: impl FnMut(SessionStatus),
) -> Result<(), Error> {
    let opener = opener(dir, trust_foreign_owners)?;
    for entry in fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".lease.json")) else {
            continue;
        };
        let id = read_id(dir, stem);
        // A record deleted since the listing: nothing to report.
        if let Some(row) = status_of(&opener, dir, stem, id, now) {
            each(row);
        }
    }
    Ok(())
}

/// The status of one session id of `dir` as of `now`, or `None` when it has no record (it has
/// never been granted: free).
///
/// # Errors
///
/// [`Error::NotADirectory`] or [`Error::Io`] when `dir` is not a readable directory (so a
/// mistyped directory is never reported as "free"), [`Error::WorldWritable`] when no call
/// could use it. A corrupt or unreadable record or transition lock is reported in the row (a
/// bad lock also without a record: the id is then not free, since every call fails).
pub fn session(dir: &Path, id: &SessionId, now: Timestamp) -> Result<Option<SessionStatus>, Error> {
    session_trusting(dir, id, now, false)
}

/// [`session`], trusting other users' lease files in a shared directory as
/// [`scan_each_trusting`] does.
///
/// # Errors
///
/// As [`session`].
pub fn session_trusting(
    dir: &Path,
    id: &SessionId,
    now: Timestamp,
    trust_foreign_owners: bool,
) -> Result<Option<SessionStatus>, Error> {
    let opener = opener(dir, trust_foreign_owners)?;
    // Without a record the id is free, unless its lock is a file no call can use.
    Ok(status_of(
        &opener,
        dir,
        id.stem(),
        Some(id.as_str().to_owned()),
        now,
    ))
}

/// The library's opener for `dir` under its ownership policy (as a default
/// [`FlockLease`](crate::FlockLease) would open it).
pub(crate) fn opener(dir: &Path, trust_foreign_owners: bool) -> Result<Opener, Error> {
    let (owners, sticky) = files::policy(dir, trust_foreign_owners)?;
    Ok(Opener {
        owners,
        sticky,
        file_mode: files::DEFAULT_FILE_MODE,
        faults: Default::default(),
        share: None,
    })
}

/// Records `id` in its sidecar `<dir>/<stem>.id` unless it already says so. Call it while
/// holding the lease, so that one writer at a time touches the file.
///
/// The file is opened without following links or blocking, created with `mode` (the lease
/// files' mode, [`FlockLeaseBuilder::file_mode`](crate::FlockLeaseBuilder::file_mode): 0o600
/// by default, 0o660 in a directory shared by a group), applied whatever the umask to a file
/// this process owns, and written only if it is a regular file. A torn or stale sidecar is
/// harmless: readers check that its content hashes to its stem.
///
/// # Errors
///
/// [`Error::Symlink`], [`Error::NotAFile`] or [`Error::Io`] naming the sidecar.
pub fn write_id(dir: &Path, id: &SessionId, mode: u32) -> Result<(), Error> {
    if read_id(dir, id.stem()).as_deref() == Some(id.as_str()) {
        return Ok(());
    }
    let path = id_path(dir, id.stem());
    let mut file = open_nonblocking(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode),
        &path,
    )?;
    let meta = file.metadata().map_err(|e| Error::io("stat", &path, e))?;
    // The umask may have narrowed a group mode: widen our own file to it.
    if meta.permissions().mode() & 0o777 != mode && meta.uid() == nix::unistd::geteuid().as_raw() {
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("chmod", &path, e))?;
    }
    file.write_all(id.as_str().as_bytes())
        .map_err(|e| Error::io("write", &path, e))
}

/// The id named by `<stem>.id`, if that file is a regular file whose content is a valid id
/// with this stem.
fn read_id(dir: &Path, stem: &str) -> Option<String> {
    let path = id_path(dir, stem);
    let file = open_nonblocking(OpenOptions::new().read(true), &path).ok()?;
    let mut bytes = vec![];
    file.take(MAX_ID_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    let id = SessionId::new(String::from_utf8(bytes).ok()?).ok()?;
    (id.stem() == stem).then(|| id.as_str().to_owned())
}

fn status_of(
    opener: &Opener,
    dir: &Path,
    stem: &str,
    id: Option<String>,
    now: Timestamp,
) -> Option<SessionStatus> {
    let row = |state, rec: Option<&Record>, acquirable, error| {
        Some(SessionStatus {
            stem: stem.to_owned(),
            id: id.clone(),
            owner: rec.map(|r| r.owner.clone()),
            token: rec.map(|r| r.token),
            expiry: rec.map(|r| r.expiry.to_string()),
            state,
            acquirable,
            error,
        })
    };
    let broken = |state, rec, error: String| row(state, rec, false, Some(error));
    // The files every call on the id opens, in a call's order: the lock, then the record.
    let paths = files::Paths::new(dir, stem.to_owned());
    let lock = opener.inspect(&paths.lock, Role::Lock);
    let decoded = match opener.inspect(&paths.record, Role::Record) {
        Ok(Some(f)) => Some(files::read_record(&f, &paths.record)),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    };
    // A call fails on a bad lock before it reads the record: that error first.
    if let Err(e) = lock {
        let rec = decoded
            .as_ref()
            .and_then(|d| d.as_ref().ok())
            .map(|(r, _)| r);
        return broken("unreadable", rec, e.to_string());
    }
    let (rec, tag) = match decoded {
        Some(Ok(r)) => r,
        Some(Err(e @ Error::Corrupt { .. })) => return broken("corrupt", None, e.to_string()),
        Some(Err(e)) => return broken("unreadable", None, e.to_string()),
        // No record and a usable lock (the record may have gone since it was listed): free.
        None => return None,
    };
    let live = dir.join(format!("{stem}.{}.live", rec.token));
    let (liveness, probe_error) = probe(opener, &live, tag);
    let state = if rec.is_tombstone() {
        "released"
    } else if machine::is_expired(rec.expiry, now) {
        "expired"
    } else {
        match liveness {
            Liveness::Live => "live",
            Liveness::Dead => "dead",
            Liveness::Unknown => "unknown",
        }
    };
    // Ask the machine whether a stranger's acquire would be granted.
    let (acquirable, state, error) = match machine::free_for_others(Some(&rec), liveness, now) {
        Ok(free) => (free, state, probe_error.filter(|_| state == "unknown")),
        Err(machine::StepError::TokenExhausted) => (
            false,
            "exhausted",
            Some(format!(
                "a takeover is due but the fencing token is exhausted (u64::MAX); every \
                 acquire fails until {} is repaired",
                paths.record.display()
            )),
        ),
        // The expiry out of range: only at the very end of time.
        Err(_) => (false, state, None),
    };
    // Free by the machine, but the takeover's new liveness file cannot be published.
    let (acquirable, state, error) = match next_blocked(dir, stem, rec.token) {
        Some(why) if acquirable => (false, "blocked", Some(why)),
        _ => (acquirable, state, error),
    };
    row(state, Some(&rec), acquirable, error)
}

/// Why the next generation's liveness file (`<stem>.<token + 1>.live`) cannot be published, if
/// it cannot: a directory stands there (a rename does not replace one), or, in a sticky
/// directory, a file the kernel does not let this user replace (another user's, in a
/// directory not this user's, unless root: the takeover's rename over it fails). Judged for
/// the user `status` runs as: an acquirer of another user may be told otherwise.
fn next_blocked(dir: &Path, stem: &str, token: u64) -> Option<String> {
    let next = token.checked_add(1)?;
    let path = dir.join(format!("{stem}.{next}.live"));
    let meta = fs::symlink_metadata(&path).ok()?;
    if meta.is_dir() {
        return Some(format!(
            "a directory stands at {}, the next generation's liveness file: every acquire \
             fails until it is removed (rmdir, or rm -r after a look at what it holds)",
            path.display()
        ));
    }
    let d = fs::metadata(dir).ok()?;
    let me = nix::unistd::geteuid().as_raw();
    let kept = d.mode() & 0o1000 != 0 && me != 0 && meta.uid() != me && d.uid() != me;
    kept.then(|| {
        format!(
            "{} (the next generation's liveness file) belongs to uid {} in a shared directory: \
             every acquire of uid {me} fails until it is removed",
            path.display(),
            meta.uid()
        )
    })
}

/// Probes a generation's liveness file as the library does ([`live::identify`], then a
/// non-blocking shared lock, dropped at once): a file that is not the generation's own counts
/// as unknown (the machine then falls back to the expiry), with the reason.
fn probe(opener: &Opener, path: &Path, tag: Option<LiveTag>) -> (Liveness, Option<String>) {
    let opened = opener.open(path, Access::Probe);
    match live::identify(opened, path, tag, live::peek)
        .and_then(|found| live::probe(found, path, live::holder_gone))
    {
        Ok(probed) => (probed.liveness, probed.reason),
        Err(e) => (Liveness::Unknown, Some(e.to_string())),
    }
}

/// Opens `path` without following a symbolic link or blocking on a FIFO, and checks that it is
/// a regular file.
fn open_nonblocking(opts: &mut OpenOptions, path: &Path) -> Result<File, Error> {
    let file = open_nofollow(opts, path)?;
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.to_owned(),
        });
    }
    Ok(file)
}

/// Opens `path` without following a symbolic link or blocking on a FIFO.
fn open_nofollow(opts: &mut OpenOptions, path: &Path) -> Result<File, Error> {
    opts.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Error::Symlink {
                path: path.to_owned(),
            },
            Some(nix::libc::ENXIO | nix::libc::EISDIR) => Error::NotAFile {
                path: path.to_owned(),
            },
            _ => Error::io("open", path, e),
        })
}

fn id_path(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}{ID_SUFFIX}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn an_id_sidecar_is_believed_only_when_it_hashes_to_its_stem() {
        let dir = tempfile::tempdir().unwrap();
        let id = SessionId::new("nightly/eu").unwrap();
        assert_eq!(read_id(dir.path(), id.stem()), None);
        write_id(dir.path(), &id, 0o600).unwrap();
        assert_eq!(
            read_id(dir.path(), id.stem()).as_deref(),
            Some("nightly/eu")
        );
        // A sidecar claiming another id under this stem is ignored.
        std::fs::write(id_path(dir.path(), id.stem()), "other").unwrap();
        assert_eq!(read_id(dir.path(), id.stem()), None);
        // Rewritten when wrong.
        write_id(dir.path(), &id, 0o600).unwrap();
        assert_eq!(
            read_id(dir.path(), id.stem()).as_deref(),
            Some("nightly/eu")
        );
    }

    #[test]
    fn a_symlinked_sidecar_is_neither_followed_nor_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let id = SessionId::new("job").unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "job").unwrap();
        std::os::unix::fs::symlink(&target, id_path(dir.path(), id.stem())).unwrap();
        assert_eq!(read_id(dir.path(), id.stem()), None);
        assert!(matches!(
            write_id(dir.path(), &id, 0o600),
            Err(Error::Symlink { .. })
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "job");
    }
}
