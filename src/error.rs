//! The error type, [`Error`] (also at the crate root), and the detail types its variants
//! carry. Every variant that involves a file names it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::name::SessionId;

pub use crate::name::InvalidInput;
pub use crate::record::DecodeError;
pub use crate::timestamp::{OutOfRange, TimeError};

/// A failure of a lease operation. Contention is not an error: see [`Grant::Held`](crate::Grant).
///
/// Messages are lower-case, name the file involved, and the cause is available via
/// [`std::error::Error::source`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An I/O step failed on `path`.
    ///
    /// Remedy: check the file system (space, permissions, mount) and retry; the operation left
    /// the lease state as it was.
    Io {
        /// What was being done (`"open"`, `"read"`, `"write"`, `"fsync"`, `"rename"`, ...).
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The record file, or a [fence file](crate::fence) ([`DecodeError::FenceToken`]), is
    /// corrupt. Nothing was written and no lock was kept.
    ///
    /// Remedy: inspect the file; an operator must repair or remove it. It is never silently
    /// treated as free or as "no token admitted", since that would reset the fencing token.
    /// A fence file is repaired by writing the highest token ever handed out, e.g.
    /// `echo 42 > report.fence`.
    Corrupt {
        /// The record file.
        path: PathBuf,
        /// Why it is corrupt.
        source: DecodeError,
    },
    /// A path inside the lease directory is a symbolic link, which is never followed.
    ///
    /// Remedy: remove the link; the lease directory should be writable by its users only.
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// A path inside the lease directory is not a regular file (a directory, FIFO, socket, ...).
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// The lease directory is writable by every user and not sticky, so anyone could replace
    /// its files.
    ///
    /// Remedy: use a private subdirectory (`mkdir -m 0700`), or `chmod o-w` the directory. A
    /// sticky world-writable directory such as `/tmp` is accepted (see
    /// [`FlockLeaseBuilder::open`](crate::FlockLeaseBuilder::open)).
    WorldWritable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The lease path exists but is not a directory.
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The lease directory is on a network file system, where `flock(2)` is not reliable.
    ///
    /// Remedy: use a local directory, or opt in with
    /// [`FlockLeaseBuilder::allow_network_filesystem`](crate::FlockLeaseBuilder::allow_network_filesystem)
    /// if every process runs on the same host and the file system's locks are known to work.
    NetworkFilesystem {
        /// The directory.
        path: PathBuf,
        /// The file-system name (`"nfs"`, `"cifs"`, ...).
        fs: &'static str,
    },
    /// The id's transition lock stayed taken for the whole lock timeout: another transition on
    /// this id is stuck (its process may be stopped, or hung on a slow disk or a lost reply).
    /// This is a failure, never contention: a held lease is [`Grant::Held`](crate::Grant).
    /// The lock is `<stem>.lock` for flock ([`LockOf::File`]) and the id's lease row for
    /// PostgreSQL ([`LockOf::Row`], the server's `lock_timeout`).
    ///
    /// Remedy: find the process holding `<stem>.lock` (`fuser`, `lsof`), or the session
    /// holding the row lock (`pg_locks`, `pg_stat_activity`), and resume or end it; a longer
    /// lock timeout if transitions are legitimately slow.
    ///
    /// A [`Fence`](crate::Fence) reports its lock `<fence file>.lock` the same way: another
    /// admission or fenced write on it is stuck
    /// ([`FenceBuilder::lock_timeout`](crate::fence::FenceBuilder::lock_timeout)).
    LockTimeout {
        /// The lock waited for.
        lock: LockOf,
        /// How long this call waited (PostgreSQL, after a wait for a holder: the lock timeout,
        /// which bounds that part alone).
        waited: Duration,
    },
    /// A lease file in a shared (sticky, world-writable) directory belongs to another user: it
    /// may have been planted, so it is neither trusted nor followed.
    ///
    /// Remedy: remove the file (as its owner or root) and use a private subdirectory, or opt
    /// in with [`trust_foreign_owners`](crate::FlockLeaseBuilder::trust_foreign_owners) when
    /// the directory is shared on purpose.
    ForeignOwner {
        /// The file.
        path: PathBuf,
        /// The user id owning it.
        uid: u32,
    },
    /// The kernel refused to open a lease file of another user in a shared (sticky,
    /// world-writable) directory (`EACCES`/`EPERM`): its mode lets no one else write it (the
    /// default 0600), or `fs.protected_regular` refuses to open another user's file there for
    /// creating. Trusting other users' files
    /// ([`trust_foreign_owners`](crate::FlockLeaseBuilder::trust_foreign_owners)) cannot lift
    /// this: only the kernel's refusal is left.
    ///
    /// Remedy: share the id through a group directory (setgid, mode 2770, lease files 0660)
    /// instead of a sticky one, use a lease directory of your own, or have the file's owner
    /// (or root) remove it if it is left over.
    ForeignDenied {
        /// The file.
        path: PathBuf,
        /// The user id owning it.
        uid: u32,
        /// The kernel's refusal.
        source: io::Error,
    },
    /// The mode given to [`file_mode`](crate::FlockLeaseBuilder::file_mode) is unusable: it
    /// must include `0o600`, may not let other users write (`0o002`), and has no other bits
    /// than `0o666`.
    InvalidFileMode {
        /// The mode given.
        mode: u32,
    },
    /// The liveness lock of the generation about to be granted is already held by someone:
    /// the record was moved back (restored from a backup, edited) under a live holder.
    ///
    /// Remedy: restore the record with a token at least as high as every `.live` file's.
    LiveLockBusy {
        /// The liveness file.
        path: PathBuf,
    },
    /// The transition lock `<stem>.lock` was deleted or replaced while this transition held
    /// it (a tmp cleaner or an operator), or the record is no longer the file the transition
    /// read: another transition may be running beside this one, so nothing was committed.
    /// Retry; the next transition locks the file now at the path.
    LockReplaced {
        /// The transition lock's path.
        path: PathBuf,
    },
    /// This process has as many descriptors open as its limit allows (`EMFILE`; or the whole
    /// system, `ENFILE`), even after the instance gave back the descriptors it keeps only to
    /// save work (idle inotify instances). Nothing was changed.
    ///
    /// Remedy: each held lease keeps one descriptor open (its liveness lock), so a process
    /// holding many leases needs a higher limit: `ulimit -n`, `LimitNOFILE=` in a systemd
    /// unit, or `setrlimit(RLIMIT_NOFILE)` up to the hard limit.
    TooManyOpenFiles {
        /// The file that could not be opened.
        path: PathBuf,
        /// The process's soft limit on open descriptors (`RLIMIT_NOFILE`), if known.
        limit: Option<u64>,
    },
    /// A takeover is due but the token is already `u64::MAX`; tokens never wrap.
    TokenExhausted {
        /// The session id.
        id: SessionId,
    },
    /// `now + ttl` lies past the year 9999: the clock or the TTL is unusable.
    ExpiryOutOfRange {
        /// The session id.
        id: SessionId,
    },
    /// A keep-alive interval is zero, not shorter than the time the lease has left (it would
    /// renew after the expiry), or too large for the clock.
    InvalidInterval {
        /// The interval asked for.
        interval: Duration,
        /// The time the lease had left.
        left: Duration,
    },
    /// An argument was refused.
    InvalidInput(InvalidInput),
    /// A PostgreSQL statement or connection failed (`pg::PgLease` (feature `postgres`)). The
    /// transition did not commit, or its outcome was checked and differs from what the caller
    /// asked for; the lease state is as it was.
    ///
    /// Remedy: check that the server is reachable and the role may use the lease table; retry.
    #[cfg(feature = "postgres")]
    Database {
        /// What was being done (`"connect"`, `"lock the lease row"`, `"commit"`, ...).
        op: &'static str,
        /// The session id involved, if any.
        id: Option<SessionId>,
        /// The driver's error (its SQLSTATE, if the server answered, is in its message).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The lease row of `id` holds a value no lease can have (an expiry of `infinity`, or
    /// outside the years 0001–9999). Nothing was written.
    ///
    /// Remedy: an operator must repair the row (never delete it: that resets the token).
    #[cfg(feature = "postgres")]
    CorruptRow {
        /// The session id.
        id: SessionId,
        /// What is wrong.
        reason: String,
    },
    /// The lease tables were created by another version of the library.
    ///
    /// Remedy: use a matching library version, or another schema (`search_path`).
    #[cfg(feature = "postgres")]
    SchemaVersion {
        /// The version found in the database.
        found: i32,
        /// The version this library uses.
        expected: i32,
    },
    /// Another lease table `flocklease_leases` exists in another schema of the same database.
    /// Advisory locks are per database, not per schema, so the two tables' generations would
    /// share liveness locks.
    ///
    /// Remedy: use one lease table per database (a separate database for a separate set of
    /// leases).
    #[cfg(feature = "postgres")]
    SharedLockSpace {
        /// The schemas holding a lease table.
        schemas: Vec<String>,
    },
    /// The server or database cannot serve leases as it is: a standby or a read-only
    /// session (no grant can be recorded), a lease table `flocklease_leases` of another
    /// shape (a table of someone else's), or no schema to create the lease tables in.
    /// Found at connect, before anything is written.
    ///
    /// Remedy: as `remedy` says (connect to the primary; drop or rename the foreign table).
    #[cfg(feature = "postgres")]
    UnfitServer {
        /// What was found.
        detail: String,
        /// What fixes it.
        remedy: String,
    },
    /// The connection does not keep a server session of its own: a transaction- or
    /// statement-mode pooler (PgBouncer `pool_mode = transaction` or `statement`) sits between
    /// the library and the server, which breaks the session advisory locks that keep leases
    /// alive. Every statement that takes, keeps or gives up a lock proves in itself that it
    /// runs in the server session its connection marked when it was opened; this error is
    /// the proof failing (or the pooler's own refusal, or a prepared statement unknown to the
    /// session that got it), before anything is granted or committed.
    ///
    /// A session-mode pooler that hands a used server session to a new client without
    /// resetting it (PgBouncer with an empty `server_reset_query`) is refused the same way:
    /// the session still has the last client's prepared statements or advisory locks.
    ///
    /// Remedy: connect directly to the server, or through a session-mode pooler that resets
    /// server sessions with `DISCARD ALL` (PgBouncer's default).
    #[cfg(feature = "postgres")]
    SessionNotKept {
        /// What was observed.
        detail: String,
    },
    /// TLS for PostgreSQL connections cannot be set up: no usable root certificate (the CA
    /// file holds none, the system's store is empty), or the connection string asks for TLS
    /// (`sslmode=require`) in a build without the `postgres-tls` feature.
    ///
    /// Remedy: name a PEM file with the server's CA (`PgTls::ca_file`), or enable the
    /// `postgres-tls` feature.
    #[cfg(feature = "postgres")]
    TlsSetup {
        /// What is missing.
        detail: String,
    },
    /// A blocking `pg::PgLease` (feature `postgres`) call made inside a current-thread async
    /// runtime's context runs on a thread of its own while the caller waits; that thread
    /// could not be started (the system's thread limit) or it panicked.
    ///
    /// Remedy: make the call in `tokio::task::spawn_blocking`, or from a multi-thread
    /// runtime (where it is announced with `block_in_place`).
    #[cfg(feature = "postgres")]
    AsyncContext,
    /// The `COMMIT` of a PostgreSQL transition (an acquire, renew or release) is not known to
    /// have happened durably: its reply never came (or a session-ending error came instead)
    /// and the re-read could not settle it, or it was answered with a warning (an operator's
    /// `pg_cancel_backend` during the wait for the synchronous standbys); and the standbys
    /// that must confirm commits did not confirm it within the reply bound. The row may name
    /// the new generation (whose liveness lock this instance then does not hold: it looks
    /// dead, and the next acquire replaces it with a greater token) or still the old one.
    /// Never reported for a commit known to have happened durably.
    ///
    /// Remedy: the lease's state lives in its row alone, so the next call on the id settles
    /// it: acquire again (a grant that did land is replaced by a greater token), renew again
    /// (a lost lease answers as lost), release again (releasing twice is harmless). Never
    /// fence with the token of a call that answered this. A fenced section's commit has its
    /// own error, [`Error::FencedCommitUnknown`].
    #[cfg(feature = "postgres")]
    CommitUnknown {
        /// The session id.
        id: SessionId,
        /// Why the outcome could not be settled.
        detail: String,
    },
    /// A fenced section's `COMMIT` ([`PgLease::fenced`](crate::pg::PgLease::fenced)) is not
    /// known to have happened durably: its reply never came (or a session-ending error came
    /// instead), or it was answered with a warning and the synchronous standbys did not
    /// confirm it within the reply bound. The section's writes may be in the database, or
    /// not, or on the primary alone (lost if it fails over); nothing the library does later
    /// settles that, and running the section again may write them twice.
    ///
    /// Remedy: look at the data before running the section again (write it so that it can
    /// tell: a row keyed by the work item, an upsert, a unique constraint), or make the
    /// section's writes idempotent. The lease itself is unaffected: if it is still held, the
    /// next section runs under it.
    #[cfg(feature = "postgres")]
    FencedCommitUnknown {
        /// The session id.
        id: SessionId,
        /// The token of the lease the section ran under.
        token: u64,
        /// Why the outcome could not be settled.
        detail: String,
    },
    /// The liveness lock of the generation about to be granted or restored is held by another
    /// session: the row was moved back (restored from a backup, edited) under a live holder,
    /// or this holder's previous session is still ending on the server.
    ///
    /// Remedy: restore the row with a token above every live generation's; retry later.
    #[cfg(feature = "postgres")]
    AdvisoryLockBusy {
        /// The session id.
        id: SessionId,
        /// The generation's token.
        token: u64,
    },
}

/// What kind of failure an [`Error`] is, for a caller that acts on the kind instead of
/// matching every variant: [`Error::kind`]. One meaning per kind across the backends (the
/// flock backend's stuck transition lock and PostgreSQL's stuck row lock are both
/// [`ErrorKind::LockTimeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A system call, the file system or the database failed (out of descriptors included):
    /// check the system and retry. The lease state is as it was.
    Io,
    /// A lock another process's transition holds (the transition lock, a lease row) stayed
    /// taken for the whole lock timeout: that transition is stuck. Never contention.
    LockTimeout,
    /// Something changed under the call (the lock replaced, a generation's liveness lock
    /// busy, a transition's commit whose outcome could not be settled): call again.
    Retry,
    /// A fenced section's writes may or may not have committed, and no later call tells
    /// (`Error::FencedCommitUnknown`, feature `postgres`): look at the data before running the
    /// section again.
    WritesUnknown,
    /// A record or row holds what no lease can, or a schema this version does not know: the
    /// data needs a human.
    Corrupt,
    /// The place or server is refused as it is set up (a symbolic link, not a file, an unsafe
    /// or network directory, another user's file, an unfit server or pooler, TLS, an async
    /// context): fix the setup.
    Setup,
    /// An argument was refused (an id, an owner, a TTL, an interval, an expiry out of range).
    InvalidInput,
    /// The id's token reached its maximum: no new generation can be granted.
    Exhausted,
}

/// Which lock an [`Error::LockTimeout`] waited for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockOf {
    /// A lock file: an id's `<stem>.lock` (flock), or a fence's `<fence file>.lock`.
    File(PathBuf),
    /// The lease row of this session id (PostgreSQL).
    Row(SessionId),
}

impl Error {
    /// What kind of failure this is ([`ErrorKind`]).
    ///
    /// ```
    /// use flocklease::{Error, ErrorKind, FlockLease};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let file = dir.path().join("a-file");
    /// std::fs::write(&file, b"").unwrap();
    /// let e: Error = FlockLease::open(&file).unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::Setup);
    /// // Anything that takes an io::Error takes it too, kind and message kept.
    /// let io: std::io::Error = e.into();
    /// assert!(io.to_string().contains("a-file"));
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io { .. } | Error::TooManyOpenFiles { .. } => ErrorKind::Io,
            Error::LockTimeout { .. } => ErrorKind::LockTimeout,
            Error::LiveLockBusy { .. } | Error::LockReplaced { .. } => ErrorKind::Retry,
            Error::Corrupt { .. } => ErrorKind::Corrupt,
            Error::Symlink { .. }
            | Error::NotAFile { .. }
            | Error::WorldWritable { .. }
            | Error::NotADirectory { .. }
            | Error::NetworkFilesystem { .. }
            | Error::ForeignOwner { .. }
            | Error::ForeignDenied { .. }
            | Error::InvalidFileMode { .. } => ErrorKind::Setup,
            Error::TokenExhausted { .. } => ErrorKind::Exhausted,
            Error::ExpiryOutOfRange { .. }
            | Error::InvalidInterval { .. }
            | Error::InvalidInput(_) => ErrorKind::InvalidInput,
            #[cfg(feature = "postgres")]
            Error::Database { .. } => ErrorKind::Io,
            #[cfg(feature = "postgres")]
            Error::CorruptRow { .. } | Error::SchemaVersion { .. } => ErrorKind::Corrupt,
            #[cfg(feature = "postgres")]
            Error::SharedLockSpace { .. }
            | Error::UnfitServer { .. }
            | Error::SessionNotKept { .. }
            | Error::TlsSetup { .. }
            | Error::AsyncContext => ErrorKind::Setup,
            #[cfg(feature = "postgres")]
            Error::CommitUnknown { .. } | Error::AdvisoryLockBusy { .. } => ErrorKind::Retry,
            #[cfg(feature = "postgres")]
            Error::FencedCommitUnknown { .. } => ErrorKind::WritesUnknown,
        }
    }
}

/// For code that speaks `std::io::Error`: the kind maps to the nearest
/// [`io::ErrorKind`] ([`Error::Io`] keeps its own), and the message and the cause are kept
/// (the `flocklease::Error` is the io::Error's inner error).
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match (&e, e.io_kind(), e.kind()) {
            (_, Some(kind), _) => kind,
            // A file or directory others could have planted or written: refused.
            (
                Error::ForeignOwner { .. }
                | Error::ForeignDenied { .. }
                | Error::WorldWritable { .. },
                ..,
            ) => io::ErrorKind::PermissionDenied,
            (Error::NotADirectory { .. }, ..) => io::ErrorKind::NotADirectory,
            (_, None, ErrorKind::LockTimeout) => io::ErrorKind::TimedOut,
            (_, None, ErrorKind::Corrupt) => io::ErrorKind::InvalidData,
            (_, None, ErrorKind::InvalidInput) => io::ErrorKind::InvalidInput,
            (_, None, _) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

impl Error {
    /// The file or directory involved, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Error::Io { path, .. }
            | Error::Corrupt { path, .. }
            | Error::Symlink { path }
            | Error::NotAFile { path }
            | Error::WorldWritable { path, .. }
            | Error::NotADirectory { path }
            | Error::NetworkFilesystem { path, .. }
            | Error::ForeignOwner { path, .. }
            | Error::ForeignDenied { path, .. }
            | Error::LiveLockBusy { path }
            | Error::TooManyOpenFiles { path, .. }
            | Error::LockReplaced { path } => Some(path),
            Error::LockTimeout {
                lock: LockOf::File(path),
                ..
            } => Some(path),
            _ => None,
        }
    }

    /// The underlying I/O error kind, for [`Error::Io`].
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> Error {
        if matches!(
            source.raw_os_error(),
            Some(nix::libc::EMFILE | nix::libc::ENFILE)
        ) {
            return Error::TooManyOpenFiles {
                path: path.to_owned(),
                limit: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                    .ok()
                    .map(|(soft, _)| soft),
            };
        }
        Error::Io {
            op,
            path: path.to_owned(),
            source,
        }
    }
}

/// What to do about a lease file that no call can use, by the file's role (its name):
/// `remove` is what the remedy does to it (remove the file, or the link).
fn remedy(path: &Path, remove: &str) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if name.ends_with(".lock") {
        format!("{remove}: the next call creates the transition lock again")
    } else if name.ends_with(".lease.json") {
        // Deleting the record would reset the token; the generations' files keep its
        // high-water mark in their names.
        format!(
            "{remove} and write a released record whose token is at least the highest N of \
             the id's <stem>.N.live files (docs/PROTOCOL.md §6.6): without a record the \
             fencing token would start again at 1"
        )
    } else if is_live_name(&name) {
        // Only a takeover publishes there, by one rename, which cannot replace a directory:
        // no acquire of the id succeeds until it is gone (PROTOCOL §6.6).
        format!(
            "it stands at a generation's liveness file name, where an acquire publishes its \
             own, so every acquire of the id fails until it is gone; {remove} (a directory: \
             rmdir, or rm -r after a look at what it holds): nothing of the lease is in it"
        )
    } else {
        format!("{remove}: lease files are regular files of their own")
    }
}

/// Whether `name` is a generation's liveness file name, `<stem>.<token>.live`.
fn is_live_name(name: &str) -> bool {
    name.strip_suffix(".live")
        .and_then(|rest| rest.rsplit_once('.'))
        .is_some_and(|(_, token)| !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, path, source } => write!(f, "{op} {}: {source}", path.display()),
            Error::Corrupt {
                path,
                source: source @ DecodeError::FenceToken(_),
            } => write!(f, "corrupt fence file {}: {source}", path.display()),
            Error::Corrupt { path, source } => {
                write!(f, "corrupt lease record {}: {source}", path.display())
            }
            Error::Symlink { path } => write!(
                f,
                "refusing to follow symbolic link {}; {}",
                path.display(),
                remedy(path, "remove the link")
            ),
            Error::NotAFile { path } => write!(
                f,
                "{} is not a regular file; {}",
                path.display(),
                remedy(path, "remove it")
            ),
            Error::WorldWritable { path, mode } => write!(
                f,
                "lease directory {} is writable by every user without the sticky bit (mode \
                 {mode:o}), so anyone could replace its files; use a private subdirectory \
                 (mkdir -m 0700) or remove o+w",
                path.display()
            ),
            Error::NotADirectory { path } => write!(f, "{} is not a directory", path.display()),
            Error::NetworkFilesystem { path, fs } => write!(
                f,
                "lease directory {} is on a network file system ({fs}) where flock is \
                 unreliable; to use it all the same: allow_network_filesystem (the library's \
                 builder), --allow-network-filesystem (flocklease run)",
                path.display()
            ),
            Error::LockTimeout {
                lock: LockOf::File(path),
                waited,
            } => write!(
                f,
                "transition lock {} stayed taken for {:.3} s: the transition holding it (a \
                 lease's, or a fence's admission) is stuck (a stopped or hung process?)",
                path.display(),
                waited.as_secs_f64()
            ),
            Error::LockTimeout {
                lock: LockOf::Row(id),
                waited,
            } => write!(
                f,
                "lease row of session {id} stayed locked for {:.3} s: another transition on \
                 this id is stuck",
                waited.as_secs_f64()
            ),
            Error::ForeignOwner { path, uid } => write!(
                f,
                "refusing lease file {} owned by another user (uid {uid}) in a shared \
                 directory, where anyone could have planted it; use a lease directory of your \
                 own (mkdir -m 0700), trust the directory's users (trust_foreign_owners: \
                 the library's builder; --trust-foreign-owners: flocklease run), or, if it was \
                 planted, remove it as its owner or root",
                path.display()
            ),
            Error::ForeignDenied { path, uid, source } => write!(
                f,
                "the kernel refused to open lease file {} of another user (uid {uid}) in a \
                 shared (sticky) directory: {source}; trusting other users' files \
                 (--trust-foreign-owners, trust_foreign_owners) cannot lift this, since only \
                 its owner may open it there (its mode, or fs.protected_regular). To share the \
                 id between users, use a group directory instead (chgrp GROUP DIR; chmod 2770 \
                 DIR; --file-mode 660 for every user, root too); else use a lease directory of \
                 your own, or have uid {uid} or root remove the file if it is left over",
                path.display()
            ),
            Error::InvalidFileMode { mode } => write!(
                f,
                "file mode {mode:o} is unusable for lease files: it must include 600, may not \
                 let others write, and has no bits beyond 666"
            ),
            Error::LockReplaced { path } => write!(
                f,
                "transition lock {} (or the record beside it) was deleted or replaced during \
                 the transition; nothing was committed (retry; keep tmp cleaners away from the \
                 lease directory)",
                path.display()
            ),
            Error::LiveLockBusy { path } => write!(
                f,
                "liveness lock {} of a new generation is already held; was the record restored?",
                path.display()
            ),
            Error::TooManyOpenFiles { path, limit } => {
                write!(f, "cannot open {}: too many open files", path.display())?;
                if let Some(limit) = limit {
                    write!(f, " (this process's limit is {limit})")?;
                }
                f.write_str(
                    "; each held lease keeps one descriptor open, so raise the limit \
                     (ulimit -n, LimitNOFILE= in a systemd unit, setrlimit RLIMIT_NOFILE)",
                )
            }
            Error::TokenExhausted { id } => {
                write!(f, "fencing token of session {id} is exhausted (u64::MAX)")
            }
            Error::ExpiryOutOfRange { id } => {
                write!(f, "expiry of session {id} would lie past the year 9999")
            }
            Error::InvalidInterval { interval, left } => write!(
                f,
                "keep-alive interval {:.3} s is unusable: it must be positive and shorter than \
                 the {:.3} s the lease has left",
                interval.as_secs_f64(),
                left.as_secs_f64()
            ),
            Error::InvalidInput(e) => write!(f, "invalid input: {e}"),
            #[cfg(feature = "postgres")]
            Error::Database { op, id, source } => {
                write!(f, "postgresql: {op}")?;
                if let Some(id) = id {
                    write!(f, " (session {id})")?;
                }
                write!(f, ": {source}")?;
                // The driver's error says only its kind ("db error"); the server's or the
                // pooler's own message is its cause.
                let mut cause = source.source();
                while let Some(c) = cause {
                    write!(f, ": {c}")?;
                    cause = c.source();
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Error::CorruptRow { id, reason } => {
                write!(f, "corrupt lease row of session {id}: {reason}")
            }
            #[cfg(feature = "postgres")]
            Error::SchemaVersion { found, expected } => write!(
                f,
                "lease tables have schema version {found}, this library uses {expected}"
            ),
            #[cfg(feature = "postgres")]
            Error::SharedLockSpace { schemas } => write!(
                f,
                "lease tables in several schemas of one database ({}) would share its advisory \
                 locks; use one lease table per database",
                schemas.join(", ")
            ),
            #[cfg(feature = "postgres")]
            Error::UnfitServer { detail, remedy } => {
                write!(f, "postgresql: {detail}; {remedy}")
            }
            #[cfg(feature = "postgres")]
            Error::TlsSetup { detail } => write!(f, "postgresql TLS: {detail}"),
            #[cfg(feature = "postgres")]
            Error::SessionNotKept { detail } => write!(
                f,
                "the postgresql connection does not keep a server session of its own \
                 ({detail}): a transaction- or statement-mode pooler, or one that does not \
                 reset sessions? connect directly or through a session-mode pooler resetting \
                 with DISCARD ALL"
            ),
            #[cfg(feature = "postgres")]
            Error::AsyncContext => f.write_str(
                "a blocking postgresql call inside a current-thread async runtime could not \
                 run on a thread of its own; call it in tokio::task::spawn_blocking, or from \
                 a multi-thread runtime",
            ),
            #[cfg(feature = "postgres")]
            Error::CommitUnknown { id, detail } => write!(
                f,
                "postgresql: a transition of session {id} may or may not have committed \
                 durably ({detail}); the row alone holds the lease's state, and the next call \
                 on the id settles it"
            ),
            #[cfg(feature = "postgres")]
            Error::FencedCommitUnknown { id, token, detail } => write!(
                f,
                "postgresql: the writes of a fenced section of session {id} (token {token}) may \
                 or may not have committed durably ({detail}); nothing settles this later: \
                 look at the data before running the section again"
            ),
            #[cfg(feature = "postgres")]
            Error::AdvisoryLockBusy { id, token } => write!(
                f,
                "liveness lock of generation {token} of session {id} is held by another \
                 session; was the row restored?"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } | Error::ForeignDenied { source, .. } => Some(source),
            Error::Corrupt { source, .. } => Some(source),
            Error::InvalidInput(e) => Some(e),
            #[cfg(feature = "postgres")]
            Error::Database { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

impl From<InvalidInput> for Error {
    fn from(e: InvalidInput) -> Error {
        Error::InvalidInput(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_carry_over_to_io_errors() {
        let stuck = Error::LockTimeout {
            lock: LockOf::File("/d/x.lock".into()),
            waited: Duration::from_secs(5),
        };
        assert_eq!(stuck.kind(), ErrorKind::LockTimeout);
        let io: io::Error = stuck.into();
        assert_eq!(io.kind(), io::ErrorKind::TimedOut);
        assert!(io.to_string().contains("/d/x.lock"), "{io}");
        assert!(io.get_ref().is_some_and(|e| e.is::<Error>()));
        let failed = Error::io(
            "read",
            Path::new("/d/x.lease.json"),
            io::Error::from(io::ErrorKind::PermissionDenied),
        );
        assert_eq!(failed.kind(), ErrorKind::Io);
        assert_eq!(
            io::Error::from(failed).kind(),
            io::ErrorKind::PermissionDenied
        );
        let replaced = Error::LockReplaced {
            path: "/d/x.lock".into(),
        };
        assert_eq!(replaced.kind(), ErrorKind::Retry);
        // Refused files and directories keep a kind std callers match on.
        let planted = Error::ForeignOwner {
            path: "/d/x.lock".into(),
            uid: 1000,
        };
        assert_eq!(
            io::Error::from(planted).kind(),
            io::ErrorKind::PermissionDenied
        );
        let file = Error::NotADirectory {
            path: "/d/x".into(),
        };
        assert_eq!(io::Error::from(file).kind(), io::ErrorKind::NotADirectory);
    }

    #[test]
    fn a_refusal_names_the_option_that_lifts_it_for_both_kinds_of_user() {
        let nfs = Error::NetworkFilesystem {
            path: "/n".into(),
            fs: "nfs",
        }
        .to_string();
        assert!(nfs.contains("--allow-network-filesystem"), "{nfs}");
        assert!(nfs.contains("allow_network_filesystem"), "{nfs}");
        let foreign = Error::ForeignOwner {
            path: "/d/x.lock".into(),
            uid: 1000,
        }
        .to_string();
        assert!(foreign.contains("--trust-foreign-owners"), "{foreign}");
        assert!(foreign.contains("trust_foreign_owners"), "{foreign}");
    }
}
