//! A resource-side fence: the check a resource keeps to refuse writes by stale lease holders.
//!
//! A lease alone cannot stop a holder that was paused (a stopped process, a long garbage
//! collection, a suspended machine) past its expiry from resuming and writing after its
//! successor was granted. The fencing token settles it, if the resource checks it: every
//! grant's token is greater than the last, so the resource keeps the highest token it has
//! admitted and refuses anything lower.
//!
//! A [`Fence`] is that check for resources on the local file system. It keeps one *fence
//! file* per resource holding the highest token admitted, as decimal text and a newline
//! (`42\n`; an empty or missing file: none yet). [`Fence::admit`] refuses a token lower than
//! the highest and records a greater one; [`Fence::write_file`] writes a whole file
//! atomically only if its token is admitted; [`Fence::with`] runs any code under the same
//! rule. The rule itself is the transition machine's `fence_step` (docs/PROTOCOL.md §9).
//!
//! # How it works
//!
//! Every admission runs under an exclusive `flock(2)` lock on `<fence file>.lock`, taken with
//! non-blocking attempts and a backoff up to the lock timeout (5 s by default, then
//! [`Error::LockTimeout`]). Under it the fence file is read, and a greater token replaces it
//! atomically and durably: written to `<fence file>.<random>.tmp`, fsynced, renamed over the
//! fence file, the directory fsynced. A recorded token is therefore never lost to a crash or a
//! power loss, and a reader sees the old value or the new one, never a mix. The token is
//! recorded *before* the guarded write, so a write that fails after its token was recorded
//! still keeps every older holder out.
//!
//! Files are opened as the lease directory's are: never through a symbolic link
//! ([`Error::Symlink`]), never a FIFO or a directory ([`Error::NotAFile`]), close-on-exec,
//! created with mode 0600; a directory writable by every user is refused unless it is sticky
//! (then files owned by other users are refused, [`Error::ForeignOwner`]), and so is a network
//! file system. A fence file that holds anything but a token is [`Error::Corrupt`], never read
//! as "no token", and is never rewritten: an operator must repair it.
//!
//! # Non-guarantees
//!
//! - The fence binds only writers that go through it (or through the same lock and file): a
//!   program writing the target directly is not stopped.
//! - The lock deleted while a call holds it lets another call admit a greater token beside
//!   it. [`Fence::write_file`] checks its admission again just before renaming the target
//!   into place (one system call before), so its write never lands after a greater
//!   admission; [`Fence::with`]'s closure is fenced only while the lock stays in place. A
//!   lock older than an hour is touched when locked, so age-based cleaners never choose it.
//! - Deleting the fence file by hand resets it; a crash leaves a `<fence file>.<random>.tmp`
//!   behind (harmless; delete it when no admission runs).
//! - One host: the lock is `flock(2)`. For a resource on another machine, let the resource
//!   itself keep the highest token (see the README's "Fencing" section).
//!
//! # Examples
//!
//! ```
//! use flocklease::{Admission, Fence};
//!
//! # fn main() -> Result<(), flocklease::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let fence = Fence::open(dir.path().join("report.fence"))?;
//! let target = dir.path().join("report.csv");
//!
//! // The holder of token 8 writes the report.
//! assert!(fence.write_file(8, &target, b"day,total\n")?.is_admitted());
//! // A holder of token 7 that was paused and resumes now is refused; the report stands.
//! assert_eq!(
//!     fence.write_file(7, &target, b"stale\n")?,
//!     Admission::Refused { highest: 8 }
//! );
//! assert_eq!(std::fs::read(&target).unwrap(), b"day,total\n");
//! # Ok(())
//! # }
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, LockOf};
use crate::fault::{FaultPoint, Faults};
use crate::flock::DEFAULT_LOCK_TIMEOUT;
use crate::flock::files::{
    Access, DEFAULT_FILE_MODE, HeldLock, Opener, lock_once, open_dir, read_bounded,
};
use crate::flock::live::fresh_tag;
use crate::front::begin_or_wait;
use crate::fs::{Fs, TempFor};
use crate::machine::{self, FenceStep};
use crate::record::DecodeError;

/// A fence file: the highest fencing token a resource has admitted, kept on the local file
/// system under a lock of its own. See the [module documentation](self).
///
/// One `Fence` may be shared by threads (`&Fence` is enough for every call); every call takes
/// the lock for itself, so threads, processes and other `Fence` values on the same file
/// exclude each other alike.
///
/// # Examples
///
/// ```
/// use flocklease::{Admission, Fence};
///
/// # fn main() -> Result<(), flocklease::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let fence = Fence::open(dir.path().join("orders.fence"))?;
/// assert_eq!(fence.admit(3)?, Admission::Admitted { previous: None });
/// assert_eq!(fence.admit(3)?, Admission::Admitted { previous: Some(3) });
/// assert_eq!(fence.admit(2)?, Admission::Refused { highest: 3 });
/// assert_eq!(fence.highest()?, Some(3));
/// # Ok(())
/// # }
/// ```
pub type Fence = FenceOn<Kernel>;

/// A [`Fence`] on the file system `F`: the kernel's, or the model checker's simulated one
/// (`flocklease_model::resource`), which runs this very code. Use it as [`Fence`].
#[derive(Debug)]
pub struct FenceOn<F: Fs> {
    path: PathBuf,
    lock_path: PathBuf,
    dir: PathBuf,
    lock_timeout: Duration,
    fs: F,
}

/// The kernel's file system, as a [`Fence`] uses it: the lease directory's rules for opening
/// files (never through a symbolic link, close-on-exec, the owner policy), and the fence's
/// directory open for its fsyncs.
#[derive(Debug)]
pub struct Kernel {
    dir: PathBuf,
    dir_file: File,
    opener: Opener,
}

/// What a [`Fence`] answered for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Admission {
    /// The token is at least the highest admitted before, and is now recorded as the highest
    /// (durably, before anything it guards was done).
    Admitted {
        /// The highest token admitted before this one (`None`: this was the first). Equal to
        /// the token when the same lease writes again.
        previous: Option<u64>,
    },
    /// The token is lower than one admitted before: its lease was superseded. Nothing was
    /// changed or written.
    Refused {
        /// The highest token admitted.
        highest: u64,
    },
}

impl Admission {
    /// Whether the token was admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::Admission;
    ///
    /// assert!(Admission::Admitted { previous: None }.is_admitted());
    /// assert!(!Admission::Refused { highest: 4 }.is_admitted());
    /// ```
    pub fn is_admitted(&self) -> bool {
        matches!(self, Admission::Admitted { .. })
    }
}

/// A token refused by [`Fence::with`]: a greater one was admitted before. An error type, so
/// it can travel in a caller's own errors with `?`.
///
/// # Examples
///
/// ```
/// use flocklease::fence::Stale;
///
/// let stale = Stale { token: 7, highest: 8 };
/// assert_eq!(stale.to_string(), "token 7 refused: the fence has admitted 8");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stale {
    /// The token refused.
    pub token: u64,
    /// The highest token the fence has admitted.
    pub highest: u64,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "token {} refused: the fence has admitted {}",
            self.token, self.highest
        )
    }
}

impl std::error::Error for Stale {}

/// Options for a [`Fence`]; start from [`Fence::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use flocklease::Fence;
///
/// # fn main() -> Result<(), flocklease::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let fence = Fence::builder(dir.path().join("report.fence"))
///     .lock_timeout(Duration::from_secs(30))
///     .open()?;
/// # let _ = fence;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use]
pub struct FenceBuilder {
    path: PathBuf,
    lock_timeout: Duration,
    allow_network_fs: bool,
    faults: Faults,
}

impl FenceBuilder {
    /// How long a call waits for the fence's lock (`<fence file>.lock`) before
    /// [`Error::LockTimeout`] (default [`DEFAULT_LOCK_TIMEOUT`], 5 s). A call holds it while
    /// it records a token and, for [`Fence::write_file`] and [`Fence::with`], while it writes:
    /// give writes that take long a longer timeout. A value too large for the clock means no
    /// limit.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Makes chosen steps fail, or pause, for tests: the hook is called with
    /// [`FaultPoint::Rename`] and the target just before
    /// [`Fence::write_file`] checks its admission again and renames the target into place.
    /// See [`fault`](crate::fault).
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, faults: crate::fault::FaultHook) -> Self {
        self.faults = Faults::new(faults);
        self
    }

    /// Accepts a fence file on a network file system (NFS, SMB/CIFS, ...), which is refused by
    /// default because `flock(2)` is not reliable there.
    pub fn allow_network_filesystem(mut self, allow: bool) -> Self {
        self.allow_network_fs = allow;
        self
    }

    /// Opens the fence: checks its directory (which must exist), creates the lock file
    /// `<fence file>.lock` if missing (mode 0600), and reads the fence file once, so a broken
    /// one is reported now. The fence file itself is created by the first admission.
    ///
    /// # Errors
    ///
    /// - [`Error::NotAFile`] when the path names no file (`/`, `..`).
    /// - [`Error::Io`] when the directory is missing or unreadable.
    /// - [`Error::WorldWritable`], [`Error::NetworkFilesystem`], [`Error::NotADirectory`]: the
    ///   directory is unsafe or unsuitable.
    /// - [`Error::Symlink`], [`Error::NotAFile`], [`Error::ForeignOwner`]: what stands at the
    ///   fence file's or the lock file's path is refused.
    /// - [`Error::Corrupt`] when the fence file does not hold a token.
    pub fn open(self) -> Result<Fence, Error> {
        let path = self.path;
        let (dir, _) = dir_and_name(&path)?;
        // The directory must exist: a typo never creates a tree.
        fs::metadata(dir).map_err(|e| Error::io("open", dir, e))?;
        let (dir_file, owners, sticky) = open_dir(dir, self.allow_network_fs, false)?;
        let kernel = Kernel {
            dir: dir.to_owned(),
            dir_file,
            opener: Opener {
                owners,
                sticky,
                file_mode: DEFAULT_FILE_MODE,
                faults: self.faults,
                share: None,
            },
        };
        let fence = FenceOn::on(kernel, &path, self.lock_timeout)?;
        // The lock file is made now, so a directory that refuses it is reported here.
        HeldLock::open(&fence.lock_path, || {
            fence.fs.opener.open(&fence.lock_path, Access::LockCreate)
        })?;
        fence.highest()?;
        Ok(fence)
    }
}

impl Fence {
    /// Opens the fence file at `path` with the default options: see [`FenceBuilder::open`].
    ///
    /// # Errors
    ///
    /// As [`FenceBuilder::open`].
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::Fence;
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let fence = Fence::open(dir.path().join("report.fence"))?; // e.g. /srv/report.fence
    /// assert_eq!(fence.highest()?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Fence, Error> {
        Fence::builder(path).open()
    }

    /// Options for the fence file at `path`: see [`FenceBuilder`].
    pub fn builder(path: impl AsRef<Path>) -> FenceBuilder {
        FenceBuilder {
            path: path.as_ref().to_owned(),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            allow_network_fs: false,
            faults: Faults::default(),
        }
    }
}

impl<F: Fs> FenceOn<F> {
    /// The fence file at `path` on `fs`, with `lock_timeout`; nothing is opened or checked
    /// (the kernel's fence opens through [`FenceBuilder::open`], which checks its directory
    /// first; the model checker makes its writers' fences here).
    ///
    /// # Errors
    ///
    /// [`Error::NotAFile`] when the path names no file (`/`, `..`).
    pub fn on(fs: F, path: &Path, lock_timeout: Duration) -> Result<Self, Error> {
        let (dir, name) = dir_and_name(path)?;
        let mut lock_name = name.to_owned();
        lock_name.push(".lock");
        Ok(FenceOn {
            lock_path: dir.join(lock_name),
            path: dir.join(name),
            dir: dir.to_owned(),
            lock_timeout,
            fs,
        })
    }

    /// The fence file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The highest token admitted so far (`None`: none yet). Read without the lock: the fence
    /// file is only ever replaced whole. A value for reports; to act on it, use
    /// [`admit`](Fence::admit), which decides under the lock.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`] when the fence file does not hold a token; [`Error::Symlink`],
    /// [`Error::NotAFile`], [`Error::ForeignOwner`] for what is refused at its path;
    /// [`Error::Io`].
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::Fence;
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let fence = Fence::open(dir.path().join("f"))?;
    /// let _ = fence.admit(12)?;
    /// assert_eq!(Fence::open(dir.path().join("f"))?.highest()?, Some(12));
    /// # Ok(())
    /// # }
    /// ```
    pub fn highest(&self) -> Result<Option<u64>, Error> {
        let Some(bytes) = self.fs.read(&self.path)? else {
            return Ok(None);
        };
        decode(&bytes).map_err(|source| Error::Corrupt {
            path: self.path.clone(),
            source,
        })
    }

    /// Admits `token` if it is not lower than the highest token admitted before, and records
    /// it as the highest (durably) if it is greater. Equal tokens are admitted: the same lease
    /// may write many times.
    ///
    /// Admitting alone fences nothing: the resource must also refuse the writes of holders
    /// refused here. For a whole file use [`write_file`](Fence::write_file); for anything else
    /// [`with`](Fence::with), which writes under the fence's lock.
    ///
    /// # Errors
    ///
    /// [`Error::LockTimeout`] when the lock stayed taken for the lock timeout;
    /// [`Error::LockReplaced`] when the lock file was deleted or replaced meanwhile (nothing
    /// was recorded: retry); [`Error::Corrupt`] when the fence file does not hold a token (it
    /// is left as it is); [`Error::Io`] (a failed directory fsync after the rename is reported
    /// too: the token may not be durable); as [`highest`](Fence::highest) for what stands at
    /// the paths.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::{Admission, Fence};
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let fence = Fence::open(dir.path().join("f"))?;
    /// assert_eq!(fence.admit(5)?, Admission::Admitted { previous: None });
    /// assert_eq!(fence.admit(9)?, Admission::Admitted { previous: Some(5) });
    /// assert_eq!(fence.admit(5)?, Admission::Refused { highest: 9 });
    /// # Ok(())
    /// # }
    /// ```
    pub fn admit(&self, token: u64) -> Result<Admission, Error> {
        Ok(match self.locked(token, |_| ())? {
            Ok((previous, ())) => Admission::Admitted { previous },
            Err(highest) => Admission::Refused { highest },
        })
    }

    /// Writes `bytes` to `target` as a whole file, atomically, if `token` is admitted: under
    /// the fence's lock for the whole call, the token is admitted (and recorded), then the
    /// bytes go to a temporary file in `target`'s directory (`.<name>.<random>.tmp`), which is
    /// fsynced and renamed over `target`, and the directory is fsynced. A refused token
    /// leaves `target` untouched. A new file gets mode 0666 less the umask; a replaced one
    /// keeps its permission bits.
    ///
    /// # Errors
    ///
    /// As [`admit`](Fence::admit); besides, [`Error::Symlink`] or [`Error::NotAFile`] when
    /// `target` is a symbolic link or not a regular file (it is never followed or replaced),
    /// and [`Error::Io`] when the write fails (`target` is then as it was, unless the
    /// failure was the directory's fsync after the rename; the token stays recorded).
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::Fence;
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let fence = Fence::open(dir.path().join("report.fence"))?;
    /// let token = 3; // the lease's token, e.g. from FLOCKLEASE_TOKEN
    /// if !fence.write_file(token, dir.path().join("report.csv"), b"a,b\n")?.is_admitted() {
    ///     eprintln!("superseded by a newer holder; output dropped");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_file(
        &self,
        token: u64,
        target: impl AsRef<Path>,
        bytes: &[u8],
    ) -> Result<Admission, Error> {
        let target = target.as_ref();
        let write = |lock: &F::Lock| {
            self.write_atomically(
                target,
                bytes,
                || {
                    self.fs.hook(FaultPoint::Rename, target)?;
                    self.still_admits(token, lock)
                },
                || self.fs.hook(FaultPoint::CommitTarget, target),
            )
        };
        match self.locked(token, write)? {
            Ok((previous, written)) => match written? {
                Ok(()) => Ok(Admission::Admitted { previous }),
                Err(highest) => Ok(Admission::Refused { highest }),
            },
            Err(highest) => Ok(Admission::Refused { highest }),
        }
    }

    /// Runs `f` under the fence's lock if `token` is admitted (and recorded first), and
    /// returns what it returns; a refused token runs nothing and is [`Stale`].
    ///
    /// This fences a resource only if every writer of it writes under this fence's `with`
    /// (or [`write_file`](Fence::write_file)), and only inside `f`: a write that `f` starts
    /// and leaves running past its return is not fenced. `f` holds the lock, so keep it
    /// within the [lock timeout](FenceBuilder::lock_timeout) of other callers.
    ///
    /// # Errors
    ///
    /// As [`admit`](Fence::admit); `f` did not run then.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::Fence;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let fence = Fence::open(dir.path().join("ledger.fence"))?;
    /// let ledger = dir.path().join("ledger.log");
    /// let append = |line: &str| -> std::io::Result<()> {
    ///     use std::io::Write;
    ///     let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&ledger)?;
    ///     writeln!(f, "{line}")
    /// };
    /// fence.with(4, || append("credit 10"))???; // admitted: appended
    /// let refused = fence.with(3, || append("debit 10"))?; // a stale holder
    /// assert_eq!(refused.unwrap_err().highest, 4);
    /// assert_eq!(std::fs::read_to_string(&ledger)?, "credit 10\n");
    /// # Ok(())
    /// # }
    /// ```
    pub fn with<T>(&self, token: u64, f: impl FnOnce() -> T) -> Result<Result<T, Stale>, Error> {
        Ok(self
            .locked(token, |_| f())?
            .map(|(_, value)| value)
            .map_err(|highest| Stale { token, highest }))
    }
}

impl<F: Fs> FenceOn<F> {
    /// Under the lock: decides on `token` ([`machine::fence_step`]), records it if it is
    /// greater, and runs `f` if it is admitted. `Ok(Err(highest))` when refused.
    fn locked<T>(
        &self,
        token: u64,
        f: impl FnOnce(&F::Lock) -> T,
    ) -> Result<Result<(Option<u64>, T), u64>, Error> {
        let lock = self.lock()?;
        let admitted = self.admitted(token, &lock);
        let answer = match admitted {
            Ok(Ok(previous)) => Ok(Ok((previous, f(&lock)))),
            Ok(Err(highest)) => Ok(Err(highest)),
            Err(e) => Err(e),
        };
        self.unlock(lock);
        answer
    }

    /// Under `lock`: reads the fence file and decides on `token` ([`machine::fence_step`]),
    /// recording it if it is greater. `Ok(Ok(previous))` when admitted, `Ok(Err(highest))`
    /// when refused.
    fn admitted(&self, token: u64, lock: &F::Lock) -> Result<Result<Option<u64>, u64>, Error> {
        let previous = self.highest()?;
        match machine::fence_step(previous, token) {
            FenceStep::Refuse { highest } => return Ok(Err(highest)),
            FenceStep::Admit {
                record: Some(token),
            } => {
                if let Err(highest) = self.store(token, previous, lock)? {
                    return Ok(Err(highest));
                }
            }
            FenceStep::Admit { record: None } => {}
        }
        Ok(Ok(previous))
    }

    /// Gives up the lock (closing the lock file unlocks it).
    fn unlock(&self, lock: F::Lock) {
        // Never fails; a test's hook may pause here (the lockstep harness does).
        let _ = self.fs.hook(FaultPoint::UnlockFence, &self.lock_path);
        self.fs.unlock(lock);
    }

    /// Takes the lock by the lock timeout, on the file that is at the lock's path once it is
    /// taken (a tmp cleaner or an operator may have replaced it): the front's bounded
    /// begin-or-wait loop around [`Fs::lock_once`] (the kernel's: the flock adapter's own
    /// `lock_once`).
    fn lock(&self) -> Result<F::Lock, Error> {
        let started = Instant::now();
        let deadline = started.checked_add(self.lock_timeout);
        let timeout = || Error::LockTimeout {
            lock: LockOf::File(self.lock_path.clone()),
            waited: started.elapsed(),
        };
        begin_or_wait(deadline, timeout, || {
            self.fs.lock_once(&self.lock_path, deadline)
        })
    }

    /// At a guarded write's commit: whether `token` is still admitted (no greater token was
    /// recorded since, by [`machine::fence_step`], the rule the admission used) and `lock` is
    /// still the lock everyone takes. `Ok(Err(highest))` when a greater token was admitted
    /// meanwhile: the lock was deleted while this call held it, and another call took a new
    /// one. The write must not land then.
    fn still_admits(&self, token: u64, lock: &F::Lock) -> Result<Result<(), u64>, Error> {
        // The lock first, the fence file last (as in `store`): a greater admission recorded
        // after the lock check is then seen, unless the lock was removed after that check,
        // which is the POSIX window.
        let here = self.fs.still_at(lock, &self.lock_path)?;
        if let FenceStep::Refuse { highest } = machine::fence_step(self.highest()?, token) {
            return Ok(Err(highest));
        }
        if !here {
            return Err(Error::LockReplaced {
                path: self.lock_path.clone(),
            });
        }
        Ok(Ok(()))
    }

    /// Replaces the fence file with `token`, durably, under `lock`, if the fence file still
    /// holds `read`, what this call decided on. `Ok(Err(highest))` when a greater token was
    /// recorded meanwhile (the lock was moved aside and put back while another call admitted
    /// on a new one: its identity alone would pass).
    fn store(
        &self,
        token: u64,
        read: Option<u64>,
        lock: &F::Lock,
    ) -> Result<Result<(), u64>, Error> {
        let mut name = self.path.file_name().unwrap_or_default().to_owned();
        name.push(format!(".{:016x}.tmp", self.fs.fresh()));
        let tmp = self.dir.join(name);
        let file = self.fs.create(&tmp, TempFor::Fence)?;
        // Recorded only under the lock everyone else takes, and only over the value decided
        // on: both checked again just before the rename, the lock first and the fence file
        // last. (In the other order, the lock moved aside, another call's whole store on a
        // new lock, and the lock put back could all fall between the two checks.)
        let may_land = || {
            let here = self.fs.still_at(lock, &self.lock_path)?;
            let now = self.highest()?;
            if now != read {
                return Ok(Err(now));
            }
            if !here {
                return Err(Error::LockReplaced {
                    path: self.lock_path.clone(),
                });
            }
            Ok(Ok(()))
        };
        let renaming = || self.fs.hook(FaultPoint::Rename, &self.path);
        let stored = self.replace_whole(
            &tmp,
            file,
            &self.path,
            encode(token).as_bytes(),
            may_land,
            renaming,
        )?;
        if let Err(now) = stored {
            // Changed since the read: decided again on what is there now. Still admitted
            // means the lock was not the one everyone takes: retry.
            return match machine::fence_step(now, token) {
                FenceStep::Refuse { highest } => Ok(Err(highest)),
                FenceStep::Admit { .. } => Err(Error::LockReplaced {
                    path: self.lock_path.clone(),
                }),
            };
        }
        Ok(Ok(()))
    }

    /// Writes `bytes` to `target` whole: a temporary file beside it, fsynced, renamed over
    /// it, the directory fsynced; `commit` is asked just before the rename whether the write
    /// may still land (`Ok(Err(highest))`: no; the temporary file is removed and nothing
    /// changes), and `renaming` (the fault seam) just before the rename itself.
    fn write_atomically(
        &self,
        target: &Path,
        bytes: &[u8],
        commit: impl FnOnce() -> Result<Result<(), u64>, Error>,
        renaming: impl FnOnce() -> Result<(), Error>,
    ) -> Result<Result<(), u64>, Error> {
        let (dir, name) = dir_and_name(target)?;
        let mode = self.fs.mode(target)?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{:016x}.tmp", self.fs.fresh()));
        let tmp = dir.join(tmp_name);
        let file = self.fs.create(&tmp, TempFor::Target(mode))?;
        self.replace_whole(&tmp, file, target, bytes, commit, renaming)
    }

    /// The fence's one atomic replace (of its fence file, and of a guarded write's target):
    /// `bytes` into the new temporary file `tmp` (open as `file`), fsynced; `may_land` asked
    /// just before the rename (`Ok(Err(r))`: it may not, and nothing changes); `renaming`
    /// (the fault seam); the rename over `target` (`tmp` stands beside it); then the
    /// directory's fsync. The temporary file is removed on a failure or a refusal before the
    /// rename.
    fn replace_whole<R>(
        &self,
        tmp: &Path,
        mut file: F::Temp,
        target: &Path,
        bytes: &[u8],
        may_land: impl FnOnce() -> Result<Result<(), R>, Error>,
        renaming: impl FnOnce() -> Result<(), Error>,
    ) -> Result<Result<(), R>, Error> {
        let renamed = self
            .fs
            .write_sync(&mut file, tmp, bytes)
            .and_then(|()| may_land())
            .and_then(|may| match may {
                Ok(()) => renaming()
                    .and_then(|()| self.fs.rename(tmp, target))
                    .map(Ok),
                Err(refused) => Ok(Err(refused)),
            });
        match renamed {
            // The rename's directory: the temporary file's, beside the target.
            Ok(Ok(())) => self
                .fs
                .sync_dir(tmp.parent().unwrap_or(Path::new(".")))
                .map(Ok),
            other => {
                self.fs.remove(tmp);
                other
            }
        }
    }
}

impl Fs for Kernel {
    type Lock = HeldLock;
    type Temp = File;

    fn lock_once(&self, path: &Path, deadline: Option<Instant>) -> Result<Option<HeldLock>, Error> {
        let open = || self.opener.open(path, Access::LockCreate);
        lock_once(path, None, &self.opener.faults, open, None, deadline)
    }

    fn still_at(&self, lock: &HeldLock, path: &Path) -> Result<bool, Error> {
        Ok(lock.at(path, None, &self.opener.faults)?.is_some())
    }

    fn unlock(&self, lock: HeldLock) {
        // Explicitly, not only by closing: a process forked meanwhile keeps a copy.
        let _ = lock.file.unlock();
    }

    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Error> {
        let file = match self.opener.open(path, Access::Read) {
            Ok(file) => file,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        if !meta.is_file() {
            return Err(Error::NotAFile {
                path: path.to_owned(),
            });
        }
        read_bounded(&file)
            .map(Some)
            .map_err(|e| Error::io("read", path, e))
    }

    fn mode(&self, path: &Path) -> Result<Option<u32>, Error> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => Err(Error::Symlink {
                path: path.to_owned(),
            }),
            Ok(m) if !m.is_file() => Err(Error::NotAFile {
                path: path.to_owned(),
            }),
            Ok(m) => Ok(Some(m.permissions().mode() & 0o777)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("stat", path, e)),
        }
    }

    fn fresh(&self) -> u64 {
        fresh_tag().0
    }

    fn create(&self, path: &Path, what: TempFor) -> Result<File, Error> {
        let TempFor::Target(mode) = what else {
            return self.opener.open(path, Access::Temp);
        };
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o666)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| Error::io("create", path, e))?;
        if let Some(mode) = mode {
            // A replaced file keeps its permission bits.
            if let Err(e) = file.set_permissions(fs::Permissions::from_mode(mode)) {
                let _ = fs::remove_file(path);
                return Err(Error::io("chmod", path, e));
            }
        }
        Ok(file)
    }

    fn write_sync(&self, file: &mut File, path: &Path, bytes: &[u8]) -> Result<(), Error> {
        file.write_all(bytes)
            .map_err(|e| Error::io("write", path, e))?;
        file.sync_all().map_err(|e| Error::io("fsync", path, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<(), Error> {
        fs::rename(from, to).map_err(|e| Error::io("rename", to, e))
    }

    fn remove(&self, path: &Path) {
        let _ = fs::remove_file(path);
    }

    fn sync_dir(&self, dir: &Path) -> Result<(), Error> {
        let synced = if dir == self.dir {
            self.dir_file.sync_all()
        } else {
            File::open(dir).and_then(|d| d.sync_all())
        };
        synced.map_err(|e| Error::io("fsync", dir, e))
    }

    fn hook(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        self.opener.faults.check(point, path)
    }
}

/// The directory a file path is in and its name: a bare name's directory is the working
/// directory (`.`), never the empty path, so the fence's lock, its fence file and a guarded
/// write's temporary file are made beside the file the path names.
///
/// # Errors
///
/// [`Error::NotAFile`] when the path names no file (`/`, `..`).
fn dir_and_name(path: &Path) -> Result<(&Path, &OsStr), Error> {
    let Some(name) = path.file_name() else {
        return Err(Error::NotAFile {
            path: path.to_owned(),
        });
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((dir, name))
}

/// The fence file's content for `token`.
fn encode(token: u64) -> String {
    format!("{token}\n")
}

/// The token a fence file holds: empty is none; otherwise exactly decimal digits without a
/// leading zero (but `0` itself) and one newline, at most `u64::MAX`. Never panics.
fn decode(bytes: &[u8]) -> Result<Option<u64>, DecodeError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| {
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(32)]);
        let more = if bytes.len() > 32 { "…" } else { "" };
        DecodeError::FenceToken(format!("{why} in {shown:?}{more} ({} bytes)", bytes.len()))
    };
    let Some(digits) = bytes.strip_suffix(b"\n") else {
        return Err(bad("no newline at the end"));
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad("not decimal digits"));
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return Err(bad("a leading zero"));
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| bad("over u64::MAX"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codec_round_trips_and_refuses_everything_but_a_canonical_token() {
        for token in [0, 1, 42, u64::MAX] {
            assert_eq!(decode(encode(token).as_bytes()), Ok(Some(token)));
        }
        assert_eq!(decode(b""), Ok(None));
        for bad in [
            &b"\n"[..],
            b"42",
            b"42\n\n",
            b" 42\n",
            b"+42\n",
            b"-1\n",
            b"042\n",
            b"4 2\n",
            b"18446744073709551616\n",
            b"99999999999999999999999999\n",
            b"\xff\n",
            b"{\"token\":4}\n",
        ] {
            assert!(
                matches!(decode(bad), Err(DecodeError::FenceToken(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_corrupt_fence_file_is_described_with_a_bounded_excerpt() {
        let long = vec![b'x'; 1000];
        let Err(e) = decode(&long) else {
            panic!("accepted")
        };
        let text = e.to_string();
        assert!(text.contains("no newline at the end"), "{text}");
        assert!(text.contains("(1000 bytes)"), "{text}");
        assert!(text.len() < 200, "{text}");
        // Cut, and said to be: an excerpt of 32 bytes and an ellipsis; a short one whole.
        assert!(text.contains(&format!("{:?}…", "x".repeat(32))), "{text}");
        let short = decode(b"42").unwrap_err().to_string();
        assert!(short.contains("\"42\" (2 bytes)"), "{short}");
    }
}
