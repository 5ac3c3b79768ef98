//! Paths and opening: every file of the lease directory is opened here, without following
//! symbolic links or blocking on special files, close-on-exec, with the directory's ownership
//! policy applied.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::error::{Error, LockOf};
use crate::fault::{FaultPoint, Faults};
use crate::record::{self, LiveTag, MAX_RECORD_BYTES, Record};

/// The files of one id.
#[derive(Debug)]
pub(super) struct Paths {
    pub(super) stem: String,
    pub(super) lock: PathBuf,
    pub(super) record: PathBuf,
    pub(super) dir: PathBuf,
}

impl Paths {
    pub(super) fn new(dir: &Path, stem: String) -> Paths {
        Paths {
            lock: dir.join(format!("{stem}.lock")),
            record: dir.join(format!("{stem}.lease.json")),
            dir: dir.to_owned(),
            stem,
        }
    }

    pub(super) fn live(&self, token: u64) -> PathBuf {
        self.dir.join(format!("{}.{token}.live", self.stem))
    }

    /// The temporary record of one transition, unique to it (`tag`): two transitions never
    /// write the same temporary file, even if a deleted `<stem>.lock` let them run at once.
    pub(super) fn temp(&self, tag: crate::record::LiveTag) -> PathBuf {
        self.dir
            .join(format!("{}.lease.json.{:016x}.tmp", self.stem, tag.0))
    }
}

/// How a file is opened.
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// `<stem>.lock`, created if missing.
    LockCreate,
    /// A generation's `.live` file being published, under its unique temporary name: created
    /// exclusively (see `live::publish`).
    LiveCreate,
    /// A generation's `.live` file, to probe it (never created).
    Probe,
    /// A generation's `.live` file, to wait for its holder (never created).
    Wait,
    /// The record, to read it.
    Read,
    /// The temporary record, created exclusively.
    Temp,
    /// `<stem>.queue`, to take a place in it (created if missing, appended to).
    Queue,
    /// `<stem>.queue`, to see whether anyone waits (never created).
    QueueLook,
}

impl Access {
    fn fault_point(self) -> FaultPoint {
        match self {
            Access::LockCreate => FaultPoint::OpenStable,
            Access::LiveCreate => FaultPoint::OpenLive,
            Access::Probe => FaultPoint::OpenProbe,
            Access::Wait => FaultPoint::OpenWait,
            Access::Read => FaultPoint::OpenRecord,
            Access::Temp => FaultPoint::CreateTemp,
            Access::Queue | Access::QueueLook => FaultPoint::OpenQueue,
        }
    }

    fn creates(self) -> bool {
        matches!(
            self,
            Access::LockCreate | Access::LiveCreate | Access::Temp | Access::Queue
        )
    }
}

/// Which file of an id [`Opener::inspect`] looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `<stem>.lease.json`.
    Record,
    /// `<stem>.lock`.
    Lock,
}

/// Who may own the files this instance opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerCheck {
    /// The directory's permissions decide who may create files (a private or group
    /// directory): any owner is trusted.
    Any,
    /// A sticky world-writable directory: a file must be owned by this process's effective
    /// user, or it is refused with [`Error::ForeignOwner`].
    Mine(u32),
}

impl OwnerCheck {
    /// The ownership rule, the one every open of the directory's files and `status` apply: a
    /// file owned by `uid` at `path` is used, or refused with [`Error::ForeignOwner`].
    pub(crate) fn admit(self, path: &Path, uid: u32) -> Result<(), Error> {
        match self {
            OwnerCheck::Mine(me) if uid != me => Err(Error::ForeignOwner {
                path: path.to_owned(),
                uid,
            }),
            _ => Ok(()),
        }
    }
}

/// Opens the files of one lease directory under its policy.
#[derive(Debug)]
pub(crate) struct Opener {
    pub(crate) owners: OwnerCheck,
    /// The directory is sticky and world-writable: the kernel may refuse `O_CREAT` on another
    /// user's existing file (`fs.protected_regular`), so existing files are opened without it.
    pub(crate) sticky: bool,
    /// Mode of new files (0600 unless configured for a group).
    pub(crate) file_mode: u32,
    pub(crate) faults: Faults,
    /// Where every liveness file published is also sent, locked, before it is placed
    /// ([`FlockLeaseBuilder::share_liveness`](super::FlockLeaseBuilder::share_liveness)).
    pub(crate) share: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

impl Opener {
    /// Opens `path` in the lease directory without following symbolic links or blocking on
    /// special files; every descriptor is close-on-exec (std's default).
    pub(crate) fn open(&self, path: &Path, access: Access) -> Result<File, Error> {
        self.faults.check(access.fault_point(), path)?;
        let mut opts = OpenOptions::new();
        match access {
            Access::LockCreate => {
                opts.read(true).write(true).create(true);
            }
            Access::LiveCreate => {
                opts.read(true).write(true).create_new(true);
            }
            Access::Probe | Access::Wait | Access::Read | Access::QueueLook => {
                opts.read(true);
            }
            Access::Queue => {
                opts.read(true).append(true).create(true);
            }
            Access::Temp => {
                // Never reuse a file found at the name: it may be planted.
                opts.write(true).create_new(true);
            }
        }
        opts.mode(self.file_mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK);
        let opened = if self.sticky && matches!(access, Access::LockCreate | Access::Queue) {
            let mut existing = opts.clone();
            existing.create(false);
            match existing.open(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => opts.open(path),
                other => other,
            }
        } else {
            opts.open(path)
        };
        let file = opened.map_err(|e| self.open_error(path, e))?;
        self.check_file(path, &file, access)?;
        Ok(file)
    }

    /// [`Opener::open`] of a file of the lease directory whose descriptor is `dir`, its name
    /// looked up from that descriptor (`openat`: one path component instead of the whole
    /// path), with the same flags, mode and checks: the record's read, the temporary record,
    /// a new liveness file and a probe, a transition's hot path. Other kinds of access are
    /// [`Opener::open`]'s.
    pub(crate) fn open_in(&self, dir: &File, path: &Path, access: Access) -> Result<File, Error> {
        use nix::fcntl::OFlag;
        let (flags, mode) = match access {
            Access::Read | Access::Probe => (OFlag::O_RDONLY, 0),
            // Never reuse a file found at the name: it may be planted.
            Access::Temp => (
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                self.file_mode,
            ),
            Access::LiveCreate => (
                OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL,
                self.file_mode,
            ),
            _ => return self.open(path, access),
        };
        self.faults.check(access.fault_point(), path)?;
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let name = path.file_name().unwrap_or(path.as_os_str());
        let mode = nix::sys::stat::Mode::from_bits_truncate(mode);
        let fd = nix::fcntl::openat(std::os::fd::AsFd::as_fd(dir), name, flags, mode)
            .map_err(|e| self.open_error(path, io::Error::from(e)))?;
        let file = File::from(fd);
        self.check_file(path, &file, access)?;
        Ok(file)
    }

    /// Looks at an existing file of the directory without changing anything, and judges it as
    /// a call would: `None` when it is missing; [`Error::Symlink`], [`Error::NotAFile`],
    /// [`Error::ForeignOwner`] or [`Error::Io`] exactly when [`Opener::open`] (and the type
    /// check a transition makes after it) would fail on it. One rule decides a bad file for
    /// the library, `status` and `flocklease run` alike.
    ///
    /// The record is opened read-only, as a transition reads it. The lock is opened for
    /// writing (never created), as a transition opens it, so a lock this user may not write
    /// is reported as the call would fail on it; but by a reader who cannot write to the
    /// directory at all (an observer, or a read-only file system), who could never acquire,
    /// it is opened read-only and judged by its type and owner. A transition's write open
    /// fails on a directory before its owner is checked, so for the lock a directory is
    /// reported as such first.
    pub(crate) fn inspect(&self, path: &Path, role: Role) -> Result<Option<File>, Error> {
        let flags = nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK;
        let read_only = || OpenOptions::new().read(true).custom_flags(flags).open(path);
        let opened = match role {
            Role::Record => read_only(),
            Role::Lock => match OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(path)
            {
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(nix::libc::EACCES | nix::libc::EPERM | nix::libc::EROFS)
                    ) && !writable_dir(path) =>
                {
                    read_only()
                }
                other => other,
            },
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.open_error(path, e)),
        };
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        let not_a_file = || Error::NotAFile {
            path: path.to_owned(),
        };
        if role == Role::Lock && meta.is_dir() {
            return Err(not_a_file());
        }
        self.owners.admit(path, meta.uid())?;
        if !meta.is_file() {
            return Err(not_a_file());
        }
        Ok(Some(file))
    }

    /// Applies the ownership policy and the configured mode to a freshly opened file.
    fn check_file(&self, path: &Path, file: &File, access: Access) -> Result<(), Error> {
        let default_mode = self.file_mode == DEFAULT_FILE_MODE;
        if self.owners == OwnerCheck::Any && (default_mode || !access.creates()) {
            // The fast path: nothing to check, nothing to widen.
            return Ok(());
        }
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        self.owners.admit(path, meta.uid())?;
        // The umask may have narrowed a group mode: widen our own new files to it.
        if access.creates()
            && !default_mode
            && meta.uid() == nix::unistd::geteuid().as_raw()
            && meta.permissions().mode() & 0o777 != self.file_mode
        {
            file.set_permissions(fs::Permissions::from_mode(self.file_mode))
                .map_err(|e| Error::io("chmod", path, e))?;
        }
        Ok(())
    }

    fn open_error(&self, path: &Path, e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Error::Symlink {
                path: path.to_owned(),
            },
            Some(nix::libc::EISDIR | nix::libc::ENXIO) => Error::NotAFile {
                path: path.to_owned(),
            },
            // In a sticky directory the kernel refuses to open or remove another user's file
            // (its mode, fs.protected_regular, the sticky bit): say whose it is, and that it
            // is the kernel's refusal, which trusting other users' files does not lift.
            Some(nix::libc::EACCES | nix::libc::EPERM) if self.sticky => {
                match fs::symlink_metadata(path) {
                    Ok(m) if m.uid() != nix::unistd::geteuid().as_raw() => Error::ForeignDenied {
                        path: path.to_owned(),
                        uid: m.uid(),
                        source: e,
                    },
                    _ => Error::io("open", path, e),
                }
            }
            _ => Error::io("open", path, e),
        }
    }
}

/// Whether this process may create files in `path`'s directory (effective ids).
fn writable_dir(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    nix::unistd::faccessat(
        nix::fcntl::AT_FDCWD,
        dir,
        nix::unistd::AccessFlags::W_OK,
        nix::fcntl::AtFlags::AT_EACCESS,
    )
    .is_ok()
}

/// The mode of new lease files unless configured otherwise.
pub(crate) const DEFAULT_FILE_MODE: u32 = 0o600;

/// Opens the lease directory: creates it if missing (mode 0700, only its last component,
/// synced into its parent), checks it, and decides the ownership policy.
pub(crate) fn open_dir(
    dir: &Path,
    allow_network_fs: bool,
    trust_foreign: bool,
) -> Result<(File, OwnerCheck, bool), Error> {
    create_dir(dir)?;
    let (owners, sticky) = policy(dir, trust_foreign)?;
    if !allow_network_fs {
        let st = nix::sys::statfs::statfs(dir)
            .map_err(|e| Error::io("statfs", dir, io::Error::from(e)))?;
        if let Some(fs) = network_fs_name(st.filesystem_type().0 as i64) {
            return Err(Error::NetworkFilesystem {
                path: dir.to_owned(),
                fs,
            });
        }
    }
    let file = File::open(dir).map_err(|e| Error::io("open", dir, e))?;
    Ok((file, owners, sticky))
}

/// The ownership policy of an existing lease directory, and whether it is sticky and
/// world-writable (read only: nothing is created). Shared by [`open_dir`] and
/// [`crate::status`], so a look at a directory judges its files as a call would.
pub(crate) fn policy(dir: &Path, trust_foreign: bool) -> Result<(OwnerCheck, bool), Error> {
    let meta = fs::metadata(dir).map_err(|e| Error::io("stat", dir, e))?;
    if !meta.is_dir() {
        return Err(Error::NotADirectory {
            path: dir.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    let owners = if mode & 0o002 == 0 {
        OwnerCheck::Any
    } else if mode & 0o1000 == 0 {
        // Anyone may replace anyone's files: no policy makes that safe.
        return Err(Error::WorldWritable {
            path: dir.to_owned(),
            mode,
        });
    } else if trust_foreign {
        OwnerCheck::Any
    } else {
        OwnerCheck::Mine(nix::unistd::geteuid().as_raw())
    };
    Ok((owners, mode & 0o1002 == 0o1002))
}

/// Creates the lease directory if it is missing: only its last component (mode 0700), never
/// its parents, so a mistyped parent is an error rather than a new tree; the new entry is
/// synced into its parent so the directory, and the tokens granted in it, survive power loss.
/// A relative path is taken relative to the working directory.
pub(crate) fn create_dir(dir: &Path) -> Result<(), Error> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match fs::symlink_metadata(dir) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("stat", dir, e)),
    }
    let missing_parent = |why: &str| {
        Error::io(
            "create directory",
            dir,
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "its parent {} {why} (only the last component is created: create the \
                     parent first)",
                    parent.display()
                ),
            ),
        )
    };
    match fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(missing_parent("is not a directory")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(missing_parent("does not exist"));
        }
        Err(e) => return Err(Error::io("stat", parent, e)),
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => File::open(parent)
            .and_then(|p| p.sync_all())
            .map_err(|e| Error::io("fsync", parent, e)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io("create directory", dir, e)),
    }
}

/// An open lock file, locked, and which file it is (its device and inode): an id's
/// `<stem>.lock`, or a fence's `<fence file>.lock`.
#[derive(Debug)]
pub struct HeldLock {
    pub(crate) file: File,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Its place among the descriptors an instance keeps between transitions (an id's
    /// `<stem>.lock` only, once kept: [`KeepPlace`]).
    pub(crate) place: Option<KeepPlace>,
}

/// How many `<stem>.lock` descriptors an instance keeps open between transitions, one per id
/// (a place frees when its id's entry is pruned or its descriptor dropped): a transition on a
/// kept one neither opens nor `fstat`s nor closes it (three system calls of the fourteen a
/// renew made, or of the fourteen of a "held" answer). Ids beyond open and close theirs each
/// time. At the descriptor limit they are given back first ([`super::FlockLease::relieved`]).
pub(crate) const KEEP_LOCKS: usize = 64;

/// One of the [`KEEP_LOCKS`] places for a kept `<stem>.lock` descriptor, given back when
/// dropped (its descriptor closed with it).
#[derive(Debug)]
pub(crate) struct KeepPlace(std::sync::Arc<AtomicUsize>);

impl KeepPlace {
    /// A place among `kept`'s, if one is free.
    pub(crate) fn take(kept: &std::sync::Arc<AtomicUsize>) -> Option<KeepPlace> {
        kept.fetch_update(Relaxed, Relaxed, |n| (n < KEEP_LOCKS).then_some(n + 1))
            .ok()
            .map(|_| KeepPlace(std::sync::Arc::clone(kept)))
    }
}

impl Drop for KeepPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl HeldLock {
    /// Opens (creating) the lock file at `path` with `open`, and notes which file it is.
    pub(crate) fn open(
        path: &Path,
        open: impl FnOnce() -> Result<File, Error>,
    ) -> Result<HeldLock, Error> {
        let file = open()?;
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        if !meta.is_file() {
            return Err(Error::NotAFile {
                path: path.to_owned(),
            });
        }
        Ok(HeldLock {
            file,
            dev: meta.dev(),
            ino: meta.ino(),
            place: None,
        })
    }

    /// Its status when it is the file at `path` now (`None`: deleted, or replaced by another
    /// file), one stat of the path (in `dir`, see [`standing`]) after `faults`'
    /// [`FaultPoint::StatStable`].
    pub(crate) fn at(
        &self,
        path: &Path,
        dir: Option<&File>,
        faults: &Faults,
    ) -> Result<Option<Standing>, Error> {
        faults.check(FaultPoint::StatStable, path)?;
        self.standing_at(path, dir)
            .map_err(|e| Error::io("stat", path, e))
    }

    /// Its status when it is the file at `path` now (one stat of the path, in `dir`).
    fn standing_at(&self, path: &Path, dir: Option<&File>) -> io::Result<Option<Standing>> {
        Ok(standing(dir, path)?.filter(|m| m.id() == (self.dev, self.ino)))
    }
}

/// What a stat found standing at a path: which file it is, and when it was last modified.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Standing {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Its modification time, in whole seconds since the Unix epoch.
    pub(crate) mtime: i64,
}

impl Standing {
    /// Which file it is: (device, inode).
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// What stands at `path` now, not following a symbolic link (`None`: nothing). The one stat
/// behind every "is this still the file I hold" of the crate: the transition lock's and a
/// fence's identity checks, the commit check's and a renew's look at its liveness file. With
/// `dir`, the directory `path` is in (the lease directory's descriptor), the file's name is
/// looked up from it (`fstatat`): one component instead of the whole path.
pub(crate) fn standing(dir: Option<&File>, path: &Path) -> io::Result<Option<Standing>> {
    use nix::sys::stat::fstatat;
    use std::os::fd::AsFd;
    let found = match dir {
        Some(dir) => fstatat(
            dir.as_fd(),
            path.file_name().unwrap_or(path.as_os_str()),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        None => fstatat(
            nix::fcntl::AT_FDCWD,
            path,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
    };
    match found {
        // `dev_t` and `ino_t` are 64 bits on 64-bit Linux, narrower elsewhere.
        #[allow(clippy::useless_conversion)]
        Ok(st) => Ok(Some(Standing {
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
            mtime: i64::from(st.st_mtime),
        })),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// The (device, inode) of an open file (one `fstat`).
pub(crate) fn identity(file: &File) -> io::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(file).map_err(io::Error::from)?;
    // As in `standing`.
    #[allow(clippy::useless_conversion)]
    Ok((u64::from(st.st_dev), u64::from(st.st_ino)))
}

impl super::FlockLease {
    /// Opens (creating) the transition lock at `path` ([`Access::LockCreate`], relieved).
    pub(crate) fn open_lock(&self, path: &Path) -> Result<File, Error> {
        self.relieved(|| self.inner.opener.open(path, Access::LockCreate))
    }

    /// Runs `open` (a step whose only descriptor-making call is its open: retrying it after
    /// that failed repeats nothing); if the process is out of descriptors, gives back the
    /// descriptors this instance keeps only to save work ([`Self::give_back`]) and tries once
    /// more. So a
    /// call, a release above all, never fails for want of a descriptor the instance could
    /// have closed.
    pub(crate) fn relieved<T>(
        &self,
        mut open: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        match open() {
            Err(Error::TooManyOpenFiles { .. }) if self.give_back() > 0 => open(),
            other => other,
        }
    }

    /// Closes the descriptors this instance keeps only to save work: the idle inotify
    /// instances and the kept `<stem>.lock` descriptors of ids nobody is using now (an id in
    /// use, this caller's own included, keeps its own; never waits). How many it closed.
    fn give_back(&self) -> usize {
        let mut closed = self.inner.watches.give_back();
        for entry in self.ids.entries() {
            if let Ok(mut slot) = entry.state.try_lock()
                && slot.kept.take().is_some()
            {
                closed += 1;
            }
        }
        closed
    }
}

/// Locks the lock file at `path` by `deadline`, on the file that is at the path once it is
/// locked: a cleaner or an operator may have deleted or replaced it meanwhile, and then the
/// path is opened again (`open` opens it, creating it), within the same deadline. Waits only
/// while the file it waits for is still the one at the path. A lock older than an hour is
/// touched ([`keep_fresh`]). [`Error::LockTimeout`] at the deadline. The one "lock the file at
/// this path" of the crate: the front's bounded begin-or-wait loop around [`lock_once`], which
/// a fenced section's lock and `mend`'s take here, a [`Fence`](crate::Fence)'s through its
/// file-system seam (`fs::Fs::lock_once`), and the front's transition through
/// `front::Backend::lock` (the lockstep's stepper: one attempt).
pub(crate) fn lock_at_path(
    path: &Path,
    faults: &Faults,
    open: impl Fn() -> Result<File, Error>,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<HeldLock, Error> {
    let timeout = || Error::LockTimeout {
        lock: LockOf::File(path.to_owned()),
        waited: started.elapsed(),
    };
    crate::front::begin_or_wait(deadline, timeout, || {
        lock_once(path, None, faults, &open, None, deadline)
    })
}

/// One attempt of [`lock_at_path`]: opens the path, locks the file, waiting for it until
/// `deadline` while it is still the file at the path, and checks it is. `None`: not taken by
/// the deadline, or the file locked is not the one at the path any more.
///
/// `dir` is the directory the path is in, if open (its file's name is then looked up from
/// it, see [`standing`]). `kept` is a descriptor of the path's file kept (unlocked) from an
/// earlier attempt, if any: it is locked instead of opening the path, and if the file it
/// locks is no longer the one at the path (deleted, replaced, moved aside since), dropped and
/// the path opened as without it, in the same attempt — so an attempt's outcome is the same
/// with or without it.
pub(crate) fn lock_once(
    path: &Path,
    dir: Option<&File>,
    faults: &Faults,
    open: impl Fn() -> Result<File, Error>,
    kept: Option<HeldLock>,
    deadline: Option<Instant>,
) -> Result<Option<HeldLock>, Error> {
    lock_once_on(&KernelLocks { dir, faults, open }, path, kept, deadline)
}

/// What one attempt at a lock file asks of the file system, a system call each
/// ([`lock_once_on`]): the kernel's (what every lock of the crate takes), and, inside the model
/// checker, a simulated lease directory's, so that the attempt it checks is this one.
pub trait LockSteps {
    /// An open lock file, knowing which file it is.
    type Lock;

    /// The fault seam at `point` (`Err`: the step fails there).
    ///
    /// # Errors
    ///
    /// The injected failure.
    fn fault(&self, point: FaultPoint, path: &Path) -> Result<(), Error>;

    /// Opens (creating) the lock file at `path`, and notes which file it is.
    ///
    /// # Errors
    ///
    /// What stands at the path is refused, or I/O failed.
    fn open_lock(&self, path: &Path) -> Result<Self::Lock, Error>;

    /// One `flock` that does not wait: `Ok(false)` when another description holds it.
    ///
    /// # Errors
    ///
    /// The `flock` failed.
    fn try_lock(&self, lock: &Self::Lock) -> io::Result<bool>;

    /// Waits for the lock until `deadline` (`None`: no limit): `Ok(false)` at the deadline.
    ///
    /// # Errors
    ///
    /// A `flock` failed.
    fn wait_lock(&self, lock: &Self::Lock, deadline: Option<Instant>) -> io::Result<bool>;

    /// Whether `lock` is the file at `path` now (one stat of the path): its modification
    /// time (whole seconds since the Unix epoch) when it is.
    ///
    /// # Errors
    ///
    /// The stat failed.
    fn at(&self, lock: &Self::Lock, path: &Path) -> io::Result<Option<i64>>;

    /// Touches a lock file locked now whose modification time, `mtime`, is older than an
    /// hour (a tmp cleaner ages files by it). Best effort.
    fn keep_fresh(&self, lock: &Self::Lock, mtime: i64);
}

/// One attempt at the lock file at `path` on `l`: `kept`, a descriptor of it kept unlocked
/// from an earlier attempt, is locked first, and dropped if the file it locks is no longer the
/// one at the path; else (or then) the path is opened, creating it, and locked. A busy lock
/// is waited for until `deadline` only while it is still the file at the path; a lock taken
/// is checked to be the file at the path. `None`: not taken by the deadline, or the file
/// locked is not the one at the path any more. The one attempt of the crate (the kernel's
/// steps behind every lock file it takes), which the model checker runs on its simulated
/// directory.
///
/// # Errors
///
/// The open, a `flock` or a stat failed, or a fault was injected; nothing is held then.
pub fn lock_once_on<L: LockSteps>(
    l: &L,
    path: &Path,
    kept: Option<L::Lock>,
    deadline: Option<Instant>,
) -> Result<Option<L::Lock>, Error> {
    if let Some(lock) = kept {
        match attempt(l, path, lock, deadline)? {
            Attempt::Taken(lock) => return Ok(Some(lock)),
            Attempt::Busy => return Ok(None),
            Attempt::Moved => {}
        }
    }
    match attempt(l, path, l.open_lock(path)?, deadline)? {
        Attempt::Taken(lock) => Ok(Some(lock)),
        Attempt::Busy | Attempt::Moved => Ok(None),
    }
}

/// What one lock of an open lock file came to.
enum Attempt<Lock> {
    /// Locked, and the file at the path.
    Taken(Lock),
    /// Not locked by the deadline, while the file at the path.
    Busy,
    /// Not the file at the path (dropped: its descriptor closed, which unlocks it).
    Moved,
}

/// Locks `lock`, waiting for it until `deadline` while it is still the file at `path`, and
/// checks it is.
fn attempt<L: LockSteps>(
    l: &L,
    path: &Path,
    lock: L::Lock,
    deadline: Option<Instant>,
) -> Result<Attempt<L::Lock>, Error> {
    l.fault(FaultPoint::LockStable, path)?;
    let taken = match l.try_lock(&lock) {
        Ok(true) => true,
        // Busy: wait for it only while it is still the file at the path (a failed stat
        // answers no).
        Ok(false) if l.at(&lock, path).is_ok_and(|at| at.is_some()) => l
            .wait_lock(&lock, deadline)
            .map_err(|e| Error::io("lock", path, e))?,
        Ok(false) => return Ok(Attempt::Moved),
        Err(e) => return Err(Error::io("lock", path, e)),
    };
    if !taken {
        return Ok(Attempt::Busy);
    }
    l.fault(FaultPoint::StatStable, path)?;
    Ok(
        match l.at(&lock, path).map_err(|e| Error::io("stat", path, e))? {
            Some(mtime) => {
                l.keep_fresh(&lock, mtime);
                Attempt::Taken(lock)
            }
            None => Attempt::Moved,
        },
    )
}

/// The kernel's [`LockSteps`]: `open` opens the lock file; its name is looked up in `dir`, if
/// open (see [`standing`]).
struct KernelLocks<'a, O> {
    dir: Option<&'a File>,
    faults: &'a Faults,
    open: O,
}

impl<O: Fn() -> Result<File, Error>> LockSteps for KernelLocks<'_, O> {
    type Lock = HeldLock;

    fn fault(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        self.faults.check(point, path)
    }

    fn open_lock(&self, path: &Path) -> Result<HeldLock, Error> {
        HeldLock::open(path, &self.open)
    }

    fn try_lock(&self, lock: &HeldLock) -> io::Result<bool> {
        match lock.file.try_lock() {
            Ok(()) => Ok(true),
            Err(fs::TryLockError::WouldBlock) => Ok(false),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn wait_lock(&self, lock: &HeldLock, deadline: Option<Instant>) -> io::Result<bool> {
        super::wait::try_lock_until(&lock.file, deadline)
    }

    fn at(&self, lock: &HeldLock, path: &Path) -> io::Result<Option<i64>> {
        Ok(lock.standing_at(path, self.dir)?.map(|m| m.mtime))
    }

    fn keep_fresh(&self, lock: &HeldLock, mtime: i64) {
        keep_fresh(&lock.file, mtime);
    }
}

/// How old a lock file's modification time may grow before a transition touches it.
const TOUCH_AFTER: Duration = Duration::from_secs(3600);

/// Keeps tmp cleaners that age files by modification time (systemd-tmpfiles, tmpreaper: days)
/// from ever choosing a lock in use: a lock older than [`TOUCH_AFTER`] is touched when locked.
/// Best effort (a failure only leaves the lock's age as it was).
fn keep_fresh(file: &File, mtime: i64) {
    let now = std::time::SystemTime::now();
    let modified = u64::try_from(mtime).map_or(std::time::UNIX_EPOCH, |secs| {
        std::time::UNIX_EPOCH + Duration::from_secs(secs)
    });
    let old = now
        .duration_since(modified)
        .is_ok_and(|age| age > TOUCH_AFTER);
    if old {
        let _ = file.set_modified(now);
    }
}

/// Reads and decodes the record file `file` opened at `path` (named in the errors).
pub(crate) fn read_record(file: &File, path: &Path) -> Result<(Record, Option<LiveTag>), Error> {
    let bytes = read_bounded(file).map_err(|e| Error::io("read", path, e))?;
    record::decode_tagged(&bytes).map_err(|source| Error::Corrupt {
        path: path.to_owned(),
        source,
    })
}

/// Reads a whole record file: one `read` for any record of normal size (a short read of a
/// regular file means end of file), never more than the size limit plus one byte.
pub(crate) fn read_bounded(mut file: &File) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..])?;
        len += n;
        if n == 0 || len < buf.len() || len > MAX_RECORD_BYTES {
            break;
        }
        buf.resize((buf.len() * 4).min(MAX_RECORD_BYTES + 1), 0);
    }
    buf.truncate(len);
    Ok(buf)
}

/// The name of a network or cluster file system by its `statfs` magic, if it is one.
fn network_fs_name(magic: i64) -> Option<&'static str> {
    Some(match magic {
        0x6969 => "nfs",
        0x517b => "smb",
        0xff53_4d42 => "cifs",
        0xfe53_4d42 => "smb2",
        0x5346_414f => "afs",
        0x7375_7245 => "coda",
        0x564c => "ncp",
        0x00c3_6400 => "ceph",
        0x0102_1997 => "9p",
        0x0bd0_0bd0 => "lustre",
        0x0116_1970 => "gfs2",
        0x7461_636f => "ocfs2",
        // FUSE: sshfs, s3fs, rclone and other remote mounts report it (as do some local
        // ones, such as ntfs-3g: `allow_network_filesystem` admits them).
        0x6573_5546 => "fuse",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_magics_are_recognised() {
        assert_eq!(network_fs_name(0x6969), Some("nfs"));
        assert_eq!(network_fs_name(0xff53_4d42), Some("cifs"));
        assert_eq!(network_fs_name(0x6573_5546), Some("fuse"));
        // tmpfs and ext4 are local.
        assert_eq!(network_fs_name(0x0102_1994), None);
        assert_eq!(network_fs_name(0xef53), None);
    }
}
