//! Mending an id whose record no call can use (PROTOCOL §6.6): a FIFO, a directory, a
//! symbolic link or garbage at `<stem>.lease.json`, a record deleted while the generations'
//! files remain, or one moved back below them.
//!
//! [`mend`] never loses the token. Under the id's transition lock (`<stem>.lock`, as every
//! transition and the Go package take it), it writes a *released* record (§2.3) whose token is
//! the highest the directory evidences: the record's own when it reads, and the `N` of every
//! `<stem>.N.live` (and of a liveness file left half-published, `<stem>.N.live.<tag>.tmp`),
//! or a greater one the operator knows of.
//! The record is replaced as a transition replaces it: a temporary file of its own, fsynced,
//! renamed over the record after checking that the lock is still the file at its path, then
//! the directory fsynced. It refuses while any generation's liveness file is locked (a holder
//! lives), and it leaves a record that reads and is not behind its generations alone.
//!
//! What no look at the directory can tell: a holder whose liveness file was deleted as well.
//! Its renews fail while the record is bad; after a mend the next acquire is granted a greater
//! token, so a fenced resource refuses the old holder (§9).

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::files::{self, Access, Role, read_bounded};
use super::live;
use crate::error::Error;
use crate::machine;
use crate::name::SessionId;
use crate::record::{self, Record};
use crate::timestamp::Timestamp;

/// What [`mend`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mended {
    /// A released record was written over what stood at the record's name.
    Wrote {
        /// The record.
        path: PathBuf,
        /// Its token: the highest the directory evidenced.
        token: u64,
        /// What stood there before, in words ("a FIFO", "a corrupt record", "no record",
        /// "a record of token 3", ...).
        replaced: String,
    },
    /// Nothing to mend: the record reads and no generation's file names a greater token, or
    /// the id has neither a record nor a generation's file (never granted).
    Sound {
        /// The record's token, if there is a record.
        token: Option<u64>,
    },
    /// Refused: the record is unusable and nothing in the directory names a token (a release
    /// deleted its generation's file), and `at_least` gave none: writing one would hand out a
    /// token again. Nothing written; mend with `at_least` the highest token handed out (a
    /// fence file's count, a job log's `FLOCKLEASE_TOKEN`; 1 if none was).
    NoToken {
        /// What stands at the record's name, in words.
        replaced: String,
    },
    /// Refused: a holder lives (this generation's liveness file is locked). Nothing written.
    Live {
        /// The locked liveness file.
        path: PathBuf,
    },
    /// Refused: the record reads and names a holder until its expiry, although a
    /// generation's file names a greater token (the record was moved back). Nothing written;
    /// mend again after the expiry.
    Unexpired {
        /// The recorded owner.
        owner: String,
        /// The recorded expiry.
        expiry: Timestamp,
    },
}

/// Mends the record of `id` in the lease directory `dir` as of `now` (see the
/// [module](self)): writes a released record whose token is the highest the directory
/// evidences, and at least `at_least` (what the operator knows beyond the directory: a fence
/// file's count, a log; 0 for nothing), under the id's transition lock, unless a holder lives
/// or there is nothing to mend.
///
/// A release deletes its generation's file: a record replaced after a release leaves no
/// name to read its token from, and without `at_least` nothing is written
/// ([`Mended::NoToken`]): a guess would hand out tokens again.
///
/// # Errors
///
/// - [`Error::NotADirectory`], [`Error::WorldWritable`], [`Error::Io`] for the directory.
/// - [`Error::LockTimeout`] when the transition lock stayed taken for
///   [`DEFAULT_LOCK_TIMEOUT`](crate::DEFAULT_LOCK_TIMEOUT); [`Error::NotAFile`],
///   [`Error::Symlink`], [`Error::ForeignOwner`], [`Error::ForeignDenied`] for a bad
///   `<stem>.lock` (remove it: the next call creates it again).
/// - [`Error::ForeignOwner`], [`Error::ForeignDenied`] for another user's record in a shared
///   directory (it is refused, not replaced).
/// - [`Error::LockReplaced`] when the lock was deleted or replaced meanwhile (nothing
///   written); [`Error::Io`] for a failed step (a directory at the record's name that is not
///   empty: look at it and remove it).
///
/// # Examples
///
/// ```
/// use flocklease::mend::{Mended, mend};
/// use flocklease::{FlockLease, Owner, SessionId, SessionLease, Timestamp};
///
/// let dir = tempfile::tempdir().unwrap();
/// let id = SessionId::new("nightly").unwrap();
/// let leases = FlockLease::open(dir.path()).unwrap();
/// let lease = leases.acquire(&id, &Owner::new("a").unwrap()).unwrap().lease().unwrap();
/// leases.release(&lease).unwrap();
/// // An operator's mistake: the record becomes a directory.
/// let record = dir.path().join(format!("{}.lease.json", id.stem()));
/// std::fs::remove_file(&record).unwrap();
/// std::fs::create_dir(&record).unwrap();
/// assert!(leases.acquire(&id, &Owner::new("b").unwrap()).is_err());
/// // The release deleted its generation's file: the operator says what the token was.
/// match mend(dir.path(), &id, Timestamp::now(), lease.token).unwrap() {
///     Mended::Wrote { token, .. } => assert_eq!(token, lease.token),
///     other => panic!("{other:?}"),
/// }
/// let next = leases.acquire(&id, &Owner::new("b").unwrap()).unwrap().lease().unwrap();
/// assert_eq!(next.token, lease.token + 1);
/// ```
pub fn mend(dir: &Path, id: &SessionId, now: Timestamp, at_least: u64) -> Result<Mended, Error> {
    let opener = super::status::opener(dir, false)?;
    let dir_file = File::open(dir).map_err(|e| Error::io("open", dir, e))?;
    let paths = files::Paths::new(dir, id.stem().to_owned());
    let started = Instant::now();
    let lock = files::lock_at_path(
        &paths.lock,
        &opener.faults,
        || opener.open(&paths.lock, Access::LockCreate),
        Some(started + crate::DEFAULT_LOCK_TIMEOUT),
        started,
    )?;
    // Under the lock: what the record is, then what the generations' names say.
    let found = read_record(&opener, &paths.record)?;
    let generations = generations(dir, &paths.stem)?;
    let highest = generations
        .iter()
        .map(|(n, _)| *n)
        .chain((at_least > 0).then_some(at_least))
        .max();
    let (token, replaced) = match found {
        Found::Record(rec) if highest.is_none_or(|n| n <= rec.token) => {
            return Ok(Mended::Sound {
                token: Some(rec.token),
            });
        }
        Found::Record(rec) if !rec.is_tombstone() && !machine::is_expired(rec.expiry, now) => {
            return Ok(Mended::Unexpired {
                owner: rec.owner,
                expiry: rec.expiry,
            });
        }
        Found::Record(rec) => (
            highest.unwrap_or(rec.token),
            format!(
                "a record of token {} (behind its generations' files)",
                rec.token
            ),
        ),
        Found::Missing => match highest {
            None => return Ok(Mended::Sound { token: None }),
            Some(n) => (n, "no record".to_owned()),
        },
        Found::Bad(what) => match highest {
            Some(n) => (n, what),
            None => return Ok(Mended::NoToken { replaced: what }),
        },
    };
    // A holder lives while its generation's file is locked: whatever the record says.
    for (_, live_path) in generations.iter().filter(|(_, p)| is_live(p)) {
        let opened = opener.open(live_path, Access::Probe);
        if let live::Found::Own(file) = live::identify(opened, live_path, None, live::peek)?
            && !live::holder_gone(&file).map_err(|e| Error::io("lock", live_path, e))?
        {
            return Ok(Mended::Live {
                path: live_path.clone(),
            });
        }
    }
    let tombstone = Record {
        owner: String::new(),
        token,
        expiry: now,
    };
    write_over(&opener, &dir_file, &paths, &tombstone, &lock)?;
    drop(lock);
    Ok(Mended::Wrote {
        path: paths.record,
        token,
        replaced,
    })
}

/// What stands at the record's name.
enum Found {
    Record(Record),
    Missing,
    /// Something no call can use, in words.
    Bad(String),
}

/// Reads the record as a call would ([`files::Opener::inspect`]): a file no call can use is
/// [`Found::Bad`]; another user's file in a shared directory, or an I/O failure, an error.
fn read_record(opener: &files::Opener, path: &Path) -> Result<Found, Error> {
    match opener.inspect(path, Role::Record) {
        Ok(Some(file)) => {
            let bytes = read_bounded(&file).map_err(|e| Error::io("read", path, e))?;
            Ok(match record::decode(&bytes) {
                Ok(rec) => Found::Record(rec),
                Err(e) => Found::Bad(format!("a corrupt record ({e})")),
            })
        }
        Ok(None) => Ok(Found::Missing),
        Err(Error::NotAFile { .. } | Error::Symlink { .. }) => Ok(Found::Bad(kind_of(path))),
        Err(e) => Err(e),
    }
}

/// What stands at `path`, in words (not following a link).
fn kind_of(path: &Path) -> String {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return "an unreadable file".to_owned();
    };
    let t = meta.file_type();
    let what = if t.is_fifo() {
        "a FIFO"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "a file no call can use"
    };
    what.to_owned()
}

/// The generations `dir` names for `stem`: every `<stem>.N.live` and `<stem>.N.live.<tag>.tmp`,
/// with its `N`.
fn generations(dir: &Path, stem: &str) -> Result<Vec<(u64, PathBuf)>, Error> {
    let mut out = vec![];
    let prefix = format!("{stem}.");
    for entry in fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((digits, tail)) = rest.split_once('.') else {
            continue;
        };
        let live = tail == "live"
            || tail
                .strip_prefix("live.")
                .is_some_and(|t| t.ends_with(".tmp"));
        if let (true, Ok(n)) = (live, digits.parse::<u64>()) {
            out.push((n, entry.path()));
        }
    }
    Ok(out)
}

/// Whether `path` is a generation's published liveness file (not a half-published one).
fn is_live(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "live")
}

/// Replaces the record of `paths` with `rec` as a transition does: a temporary file of its
/// own (created exclusively), written, fsynced, renamed over the record once the lock is
/// checked to be still the file at its path, then the directory fsynced. An empty directory
/// at the record's name is removed first (a rename cannot replace it); the temporary file is
/// removed on any failure.
fn write_over(
    opener: &files::Opener,
    dir_file: &File,
    paths: &files::Paths,
    rec: &Record,
    lock: &files::HeldLock,
) -> Result<(), Error> {
    let (path, lock_path) = (&paths.record, &paths.lock);
    let temp = paths.temp(live::fresh_tag());
    let mut file = opener.open_in(dir_file, &temp, Access::Temp)?;
    let done = (|| {
        file.write_all(&record::encode(rec))
            .map_err(|e| Error::io("write", &temp, e))?;
        file.sync_data().map_err(|e| Error::io("fsync", &temp, e))?;
        if fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir(path).map_err(|e| Error::io("remove directory", path, e))?;
        }
        if lock
            .at(lock_path, Some(dir_file), &opener.faults)?
            .is_none()
        {
            return Err(Error::LockReplaced {
                path: lock_path.to_owned(),
            });
        }
        fs::rename(&temp, path).map_err(|e| Error::io("rename", path, e))
    })();
    if done.is_err() {
        let _ = fs::remove_file(&temp);
        return done;
    }
    dir_file
        .sync_all()
        .map_err(|e| Error::io("fsync", &paths.dir, e))
}
