//! [`FlockLease`]: the real adapter over a lease directory, with `flock(2)` locks.
//!
//! Per session id, with `<stem>` its [safe name](crate::stem):
//!
//! | file | role |
//! | --- | --- |
//! | `<stem>.lock` | stable transition lock, held only during one acquire/renew/release |
//! | `<stem>.<token>.live` | liveness lock of one generation, held by its process for its whole life |
//! | `<stem>.lease.json` | the record, replaced atomically through `<stem>.lease.json.tmp` |
//!
//! This module only does file work; every decision comes from [`machine`](crate::machine)
//! through [`driver::run`].

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::driver::{self, Transaction};
use crate::error::Error;
use crate::fault::{FaultPoint, Faults};
use crate::lease::{DEFAULT_TTL, Grant, Lease, SessionLease};
use crate::machine::{Event, Liveness, Local, Outcome};
use crate::name::{Owner, SessionId};
use crate::record::{self, MAX_RECORD_BYTES, Record};

/// The default bound on waiting for an id's transition lock: 5 seconds.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// When the record is forced to stable storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// Fsync the temporary record before the rename, and the directory after a rename that
    /// changes the owner or the token: a token handed out survives power loss, and the record is
    /// never left empty. The default.
    #[default]
    Full,
    /// No fsync. Survives process crashes, not power loss; for tmpfs, tests and benchmarks.
    NoSync,
}

/// Lease manager over a lease directory shared by cooperating processes on one host.
///
/// Each instance is one "lease-manager instance": it keeps the liveness locks of the
/// generations it granted until they are released or lost. Dropping it (or the process dying)
/// drops those locks, and other processes may then take the leases over at once.
///
/// `FlockLease` is `Send + Sync`: calls on one id are serialized within the instance, calls on
/// different ids never wait for each other.
///
/// # Examples
///
/// ```
/// use flocklease::{FlockLease, Grant, Owner, SessionId, SessionLease};
///
/// let dir = tempfile::tempdir().unwrap();
/// let leases = FlockLease::open(dir.path()).unwrap();
/// let id = SessionId::new("billing-run").unwrap();
/// let me = Owner::new("worker-1").unwrap();
///
/// let Grant::Granted(lease) = leases.acquire(&id, &me).unwrap() else {
///     panic!("someone else holds it");
/// };
/// assert_eq!(lease.token, 1);
/// let lease = leases.renew(&lease).unwrap().lease().expect("still ours");
/// leases.release(&lease).unwrap();
/// ```
#[derive(Debug)]
pub struct FlockLease {
    dir: PathBuf,
    dir_file: File,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    lock_timeout: Duration,
    durability: Durability,
    slots: Mutex<HashMap<String, Arc<SlotEntry>>>,
    /// How many transition-lock descriptors the slots keep open (at most [`LOCK_CACHE`]).
    cached_locks: std::sync::atomic::AtomicUsize,
    waiters: Waiters,
    faults: Faults,
}

/// Options for [`FlockLease`]; start from [`FlockLease::builder`].
#[derive(Debug)]
#[must_use]
pub struct FlockLeaseBuilder {
    dir: PathBuf,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    lock_timeout: Duration,
    durability: Durability,
    allow_network_fs: bool,
    faults: Faults,
}

impl FlockLease {
    /// Opens (creating it with mode 0700 if needed) the lease directory `dir` with the default
    /// options: TTL 30 s, system clock, [`Durability::Full`], a 5 s bound on lock waits.
    ///
    /// # Errors
    ///
    /// See [`FlockLeaseBuilder::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<FlockLease, Error> {
        FlockLease::builder(dir).open()
    }

    /// A builder for a lease directory `dir`.
    pub fn builder(dir: impl AsRef<Path>) -> FlockLeaseBuilder {
        FlockLeaseBuilder {
            dir: dir.as_ref().to_owned(),
            ttl: DEFAULT_TTL,
            clock: Arc::new(SystemClock),
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            durability: Durability::Full,
            allow_network_fs: false,
            faults: Faults::default(),
        }
    }

    /// The lease directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The lease time-to-live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Acquires the lease of `id` for `owner`, waiting up to `timeout` while another owner
    /// holds it.
    ///
    /// The wait blocks on the holder's liveness lock, so it ends the moment the holder releases
    /// or dies (the kernel drops its lock), or when its lease expires, and then retries the
    /// acquire: no polling interval. Only when the holder's liveness file is missing (deleted
    /// by hand) does it re-check every 10 ms until the lease expires.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] naming the record file when `timeout` passes first; any error of
    /// [`SessionLease::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use flocklease::{FlockLease, Owner, SessionId, SessionLease};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let (a, b) = (FlockLease::open(dir.path()).unwrap(), FlockLease::open(dir.path()).unwrap());
    /// let id = SessionId::new("job").unwrap();
    /// let first = a.acquire(&id, &Owner::new("a").unwrap()).unwrap().lease().unwrap();
    /// std::thread::scope(|s| {
    ///     s.spawn(|| a.release(&first).unwrap());
    ///     // Returns as soon as `a` releases.
    ///     let second = b.acquire_wait(&id, &Owner::new("b").unwrap(), Duration::from_secs(10)).unwrap();
    ///     assert_eq!(second.token, first.token + 1);
    /// });
    /// ```
    pub fn acquire_wait(
        &self,
        id: &SessionId,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Lease, Error> {
        self.acquire_until(id, owner, Some(Instant::now() + timeout))
    }

    /// Acquires the lease of `id` for `owner`, waiting as long as it takes (see
    /// [`FlockLease::acquire_wait`]).
    ///
    /// # Errors
    ///
    /// Any error of [`SessionLease::acquire`].
    pub fn acquire_blocking(&self, id: &SessionId, owner: &Owner) -> Result<Lease, Error> {
        self.acquire_until(id, owner, None)
    }

    fn acquire_until(
        &self,
        id: &SessionId,
        owner: &Owner,
        deadline: Option<Instant>,
    ) -> Result<Lease, Error> {
        let start = Instant::now();
        let entry = self.slot(id.stem());
        let paths = &entry.paths;
        loop {
            if let Grant::Granted(lease) = self.acquire(id, owner)? {
                return Ok(lease);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::Timeout {
                    path: paths.record.clone(),
                    waited: start.elapsed(),
                });
            }
            // Held: wait for the holder's generation to end — its lock or its expiry — then
            // let the machine decide again. Reading without the transition lock is safe: the
            // record is only ever replaced by an atomic rename.
            let Some(rec) = self.peek_record(&paths.record)? else {
                continue;
            };
            let until_expiry = rec.expiry.saturating_duration_since(self.clock.now());
            let wake = match deadline {
                Some(d) => d.min(Instant::now() + until_expiry),
                None => Instant::now() + until_expiry,
            };
            let live = paths.live(rec.token);
            match self.open_file(&live, Access::Probe) {
                Ok(file) => self.waiters.wait(&live, file, wake),
                Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => {
                    thread::sleep(
                        wake.saturating_duration_since(Instant::now())
                            .min(MISSING_POLL),
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads the record without the transition lock.
    fn peek_record(&self, path: &Path) -> Result<Option<Record>, Error> {
        let file = match self.open_file(path, Access::Read) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = read_bounded(&file).map_err(|e| Error::io("read", path, e))?;
        record::decode(&bytes)
            .map(Some)
            .map_err(|source| Error::Corrupt {
                path: path.to_owned(),
                source,
            })
    }

    fn transition(&self, id: &SessionId, event: Event) -> Result<Outcome, Error> {
        let entry = self.slot(id.stem());
        // In-process serialization of one id; each holder is bounded by its lock timeout.
        let mut slot = entry.state.lock().unwrap_or_else(PoisonError::into_inner);
        let paths = &entry.paths;
        let lock = self.lock_stable(&paths.lock, slot.lock.take())?;
        let mut tx = FlockTx {
            lease: self,
            paths,
            slot: &mut slot,
        };
        let outcome = driver::run(&mut tx, id, self.clock.now(), self.ttl, event);
        slot.lock = self.keep_lock(lock);
        outcome
    }

    /// Unlocks the transition lock and keeps its descriptor for the next transition on the id,
    /// while fewer than [`LOCK_CACHE`] are kept (beyond that, or if unlocking fails, it is
    /// closed, which unlocks too).
    fn keep_lock(&self, mut lock: StableLock) -> Option<StableLock> {
        use std::sync::atomic::Ordering::Relaxed;
        if lock.file.unlock().is_err() {
            self.uncount(lock.counted);
            return None;
        }
        if !lock.counted {
            let admitted = self
                .cached_locks
                .fetch_update(Relaxed, Relaxed, |n| (n < LOCK_CACHE).then_some(n + 1))
                .is_ok();
            if !admitted {
                return None;
            }
            lock.counted = true;
        }
        Some(lock)
    }

    fn slot(&self, stem: &str) -> Arc<SlotEntry> {
        let mut slots = lock_map(&self.slots);
        if let Some(entry) = slots.get(stem) {
            return Arc::clone(entry);
        }
        let entry = Arc::new(SlotEntry {
            paths: Paths::new(&self.dir, stem.to_owned()),
            state: Mutex::default(),
        });
        slots.insert(stem.to_owned(), Arc::clone(&entry));
        entry
    }

    /// Takes `<stem>.lock`, waiting at most the lock timeout, and checks that the locked file is
    /// still the one at that path (an operator or a tmp cleaner may have replaced it). `cached`
    /// is this id's descriptor from an earlier transition, if any.
    fn lock_stable(
        &self,
        path: &Path,
        mut cached: Option<StableLock>,
    ) -> Result<StableLock, Error> {
        let deadline = Instant::now() + self.lock_timeout;
        loop {
            let lock = match cached.take() {
                Some(lock) => lock,
                None => self.open_stable(path)?,
            };
            let counted = lock.counted;
            let StableLock { file, dev, ino, .. } = lock;
            let locked = self
                .faults
                .check(FaultPoint::LockStable, path)
                .and_then(|()| lock_until(file, deadline).map_err(|e| Error::io("lock", path, e)));
            let file = match locked {
                Ok(Some(file)) => file,
                failed => {
                    // The descriptor is gone (dropped with the failure or left to the waiting
                    // thread): it no longer counts against the cache.
                    self.uncount(counted);
                    failed?;
                    return Err(Error::Timeout {
                        path: path.to_owned(),
                        waited: self.lock_timeout,
                    });
                }
            };
            let lock = StableLock {
                file,
                dev,
                ino,
                counted,
            };
            let current = self
                .faults
                .check(FaultPoint::StatStable, path)
                .and_then(|()| match fs::symlink_metadata(path) {
                    Ok(now) => Ok(now.dev() == dev && now.ino() == ino),
                    // Removed while we waited: lock whatever is created there now.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(Error::io("stat", path, e)),
                });
            match current {
                Ok(true) => return Ok(lock),
                Ok(false) => self.uncount(lock.counted),
                Err(e) => {
                    self.uncount(lock.counted);
                    return Err(e);
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    path: path.to_owned(),
                    waited: self.lock_timeout,
                });
            }
        }
    }

    /// Opens (creating) `<stem>.lock` and notes which file it is.
    fn open_stable(&self, path: &Path) -> Result<StableLock, Error> {
        let file = self.open_file(path, Access::LockCreate)?;
        self.faults.check(FaultPoint::StatStable, path)?;
        let held = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        if !held.is_file() {
            return Err(Error::NotAFile {
                path: path.to_owned(),
            });
        }
        Ok(StableLock {
            file,
            dev: held.dev(),
            ino: held.ino(),
            counted: false,
        })
    }

    /// A kept descriptor was closed: it no longer counts against [`LOCK_CACHE`].
    fn uncount(&self, counted: bool) {
        if counted {
            self.cached_locks
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Opens a file in the lease directory without following symbolic links or blocking on
    /// special files. New files get mode 0600; every descriptor is close-on-exec.
    fn open_file(&self, path: &Path, access: Access) -> Result<File, Error> {
        self.faults.check(access.fault_point(), path)?;
        let mut opts = OpenOptions::new();
        match access {
            Access::LockCreate | Access::LiveCreate => {
                opts.read(true).write(true).create(true);
            }
            Access::Probe | Access::Read => {
                opts.read(true);
            }
            Access::Temp => {
                opts.write(true).create(true).truncate(true);
            }
        }
        opts.mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK);
        opts.open(path).map_err(|e| open_error(path, e))
    }
}

impl FlockLeaseBuilder {
    /// The lease time-to-live; zero means the default (30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = if ttl.is_zero() { DEFAULT_TTL } else { ttl };
        self
    }

    /// The clock expiry is computed with (default: [`SystemClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How long one call may wait for an id's transition lock before [`Error::Timeout`].
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// When to fsync (default [`Durability::Full`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Accepts a lease directory on a network file system (NFS, SMB/CIFS, Ceph, 9p, ...),
    /// which is refused by default because `flock(2)` is not reliable there. Only for a
    /// directory used by processes of one host whose file system honours `flock`.
    pub fn allow_network_filesystem(mut self, allow: bool) -> Self {
        self.allow_network_fs = allow;
        self
    }

    /// Makes chosen I/O steps fail, for tests. See [`fault`](crate::fault).
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, faults: crate::fault::FaultHook) -> Self {
        self.faults = Faults::new(faults);
        self
    }

    /// Opens the lease directory, creating it (mode 0700, parents as needed) if missing.
    ///
    /// # Errors
    ///
    /// - [`Error::NotADirectory`] when the path is something else;
    /// - [`Error::WorldWritable`] when any user may write to it;
    /// - [`Error::NetworkFilesystem`] when it is on a network file system and that was not
    ///   allowed;
    /// - [`Error::Io`] when it cannot be created, inspected or opened.
    pub fn open(self) -> Result<FlockLease, Error> {
        let dir = self.dir;
        match DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create directory", &dir, e)),
        }
        let meta = fs::metadata(&dir).map_err(|e| Error::io("stat", &dir, e))?;
        if !meta.is_dir() {
            return Err(Error::NotADirectory { path: dir });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o002 != 0 {
            return Err(Error::WorldWritable { path: dir, mode });
        }
        if !self.allow_network_fs {
            let st = nix::sys::statfs::statfs(&dir)
                .map_err(|e| Error::io("statfs", &dir, io::Error::from(e)))?;
            if let Some(fs) = network_fs_name(st.filesystem_type().0 as i64) {
                return Err(Error::NetworkFilesystem { path: dir, fs });
            }
        }
        let dir_file = File::open(&dir).map_err(|e| Error::io("open", &dir, e))?;
        Ok(FlockLease {
            dir,
            dir_file,
            ttl: self.ttl,
            clock: self.clock,
            lock_timeout: self.lock_timeout,
            durability: self.durability,
            slots: Mutex::new(HashMap::new()),
            cached_locks: std::sync::atomic::AtomicUsize::new(0),
            waiters: Waiters::default(),
            faults: self.faults,
        })
    }
}

crate::driver::session_lease_via_transition!(FlockLease);

/// What this instance holds for one id.
#[derive(Debug, Default)]
struct Slot {
    local: Option<LocalGen>,
    /// This id's transition-lock descriptor, kept open (unlocked) between transitions.
    lock: Option<StableLock>,
}

/// An open `<stem>.lock` and the identity of the file it opened.
#[derive(Debug)]
struct StableLock {
    file: File,
    dev: u64,
    ino: u64,
    /// Whether it counts against [`LOCK_CACHE`].
    counted: bool,
}

/// How many transition-lock descriptors an instance keeps open between transitions. Ids
/// beyond that open and close theirs each time (two more syscalls), so an instance used with
/// very many ids stays far from the descriptor limit.
pub const LOCK_CACHE: usize = 256;

/// One id's cached paths and state.
#[derive(Debug)]
struct SlotEntry {
    paths: Paths,
    state: Mutex<Slot>,
}

/// A generation this instance holds: the locked liveness file stays open for its whole life.
#[derive(Debug)]
struct LocalGen {
    local: Local,
    file: File,
    /// The (device, inode) of `file`, to check it is still the one at its path.
    dev: u64,
    ino: u64,
}

#[derive(Clone, Copy, Debug)]
enum Access {
    LockCreate,
    LiveCreate,
    Probe,
    Read,
    Temp,
}

impl Access {
    fn fault_point(self) -> FaultPoint {
        match self {
            Access::LockCreate => FaultPoint::OpenStable,
            Access::LiveCreate => FaultPoint::OpenLive,
            Access::Probe => FaultPoint::OpenProbe,
            Access::Read => FaultPoint::OpenRecord,
            Access::Temp => FaultPoint::CreateTemp,
        }
    }
}

#[derive(Debug)]
struct Paths {
    stem: String,
    lock: PathBuf,
    record: PathBuf,
    temp: PathBuf,
    dir: PathBuf,
}

impl Paths {
    fn new(dir: &Path, stem: String) -> Paths {
        Paths {
            lock: dir.join(format!("{stem}.lock")),
            record: dir.join(format!("{stem}.lease.json")),
            temp: dir.join(format!("{stem}.lease.json.tmp")),
            dir: dir.to_owned(),
            stem,
        }
    }

    fn live(&self, token: u64) -> PathBuf {
        self.dir.join(format!("{}.{token}.live", self.stem))
    }
}

struct FlockTx<'a> {
    lease: &'a FlockLease,
    paths: &'a Paths,
    slot: &'a mut Slot,
}

impl FlockTx<'_> {
    fn durable(&self) -> bool {
        self.lease.durability == Durability::Full
    }

    fn write_temp(&self, record: &Record) -> Result<(), Error> {
        let path = &self.paths.temp;
        let mut tmp = self.lease.open_file(path, Access::Temp)?;
        self.lease.faults.check(FaultPoint::WriteTemp, path)?;
        tmp.write_all(&record::encode(record))
            .map_err(|e| Error::io("write", path, e))?;
        if self.durable() {
            self.lease.faults.check(FaultPoint::SyncTemp, path)?;
            tmp.sync_data().map_err(|e| Error::io("fsync", path, e))?;
        }
        Ok(())
    }
}

impl Transaction for FlockTx<'_> {
    /// Dropping it un-adopted (the commit failed) closes the descriptor, which releases the
    /// lock. The file stays: if the rename happened but the directory sync failed, the record
    /// names this generation, and a present, unlocked file lets the next acquire see it dead and
    /// replace it at once; otherwise the next takeover reuses the same name.
    type Pending = PendingLive;

    fn read(&mut self) -> Result<Option<Record>, Error> {
        let path = &self.paths.record;
        let file = match self.lease.open_file(path, Access::Read) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.lease.faults.check(FaultPoint::ReadRecord, path)?;
        let buf = read_bounded(&file).map_err(|e| match e.raw_os_error() {
            Some(nix::libc::EISDIR) => Error::NotAFile { path: path.clone() },
            _ => Error::io("read", path, e),
        })?;
        record::decode(&buf)
            .map(Some)
            .map_err(|source| Error::Corrupt {
                path: path.clone(),
                source,
            })
    }

    fn local(&self) -> Option<Local> {
        self.slot.local.as_ref().map(|g| g.local.clone())
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        let path = self.paths.live(token);
        let file = match self.lease.open_file(&path, Access::Probe) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(Liveness::Missing),
            Err(e) => return Err(e),
        };
        self.lease.faults.check(FaultPoint::LockProbe, &path)?;
        match file.try_lock() {
            // Closing the probe's descriptor releases the lock again.
            Ok(()) => Ok(Liveness::Dead),
            Err(TryLockError::WouldBlock) => Ok(Liveness::Live),
            Err(TryLockError::Error(e)) => Err(Error::io("lock", &path, e)),
        }
    }

    fn lock_live(&mut self, token: u64) -> Result<PendingLive, Error> {
        let path = self.paths.live(token);
        let file = self.lease.open_file(&path, Access::LiveCreate)?;
        self.lease.faults.check(FaultPoint::LockLive, &path)?;
        match file.try_lock() {
            Ok(()) => {
                let m = file.metadata().map_err(|e| Error::io("stat", &path, e))?;
                Ok(PendingLive {
                    file,
                    dev: m.dev(),
                    ino: m.ino(),
                })
            }
            Err(TryLockError::WouldBlock) => Err(Error::LiveLockBusy { path }),
            Err(TryLockError::Error(e)) => Err(Error::io("lock", &path, e)),
        }
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        let path = self.paths.live(token);
        let Some(generation) = self.slot.local.as_mut() else {
            return Ok(());
        };
        self.lease.faults.check(FaultPoint::StatLive, &path)?;
        match fs::symlink_metadata(&path) {
            Ok(m) if m.dev() == generation.dev && m.ino() == generation.ino => return Ok(()),
            Ok(_) => {
                // Something else stands at our path: it is not ours to keep.
                fs::remove_file(&path).map_err(|e| Error::io("unlink", &path, e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("stat", &path, e)),
        }
        // Restore: a fresh file at the path, locked, replaces the orphaned descriptor.
        let file = self.lease.open_file(&path, Access::LiveCreate)?;
        match file.try_lock() {
            Ok(()) => {
                let m = file.metadata().map_err(|e| Error::io("stat", &path, e))?;
                (generation.file, generation.dev, generation.ino) = (file, m.dev(), m.ino());
                Ok(())
            }
            Err(TryLockError::WouldBlock) => Err(Error::LiveLockBusy { path }),
            Err(TryLockError::Error(e)) => Err(Error::io("lock", &path, e)),
        }
    }

    fn commit(&mut self, record: &Record, sync_dir: bool) -> Result<(), Error> {
        if let Err(e) = self.write_temp(record) {
            let _ = fs::remove_file(&self.paths.temp);
            return Err(e);
        }
        let (from, to) = (&self.paths.temp, &self.paths.record);
        let renamed = self
            .lease
            .faults
            .check(FaultPoint::Rename, to)
            .and_then(|()| fs::rename(from, to).map_err(|e| Error::io("rename", to, e)));
        if let Err(e) = renamed {
            let _ = fs::remove_file(from);
            return Err(e);
        }
        if sync_dir && self.durable() {
            // Until the directory is synced the new owner or token may not survive power loss:
            // report a failure here, so the caller does not use a token that could be reissued.
            // The driver then drops the new generation's lock; the record names a dead
            // generation that the next acquire replaces at once with a greater token.
            let dir = &self.lease.dir;
            self.lease.faults.check(FaultPoint::SyncDir, dir)?;
            self.lease
                .dir_file
                .sync_all()
                .map_err(|e| Error::io("fsync", dir, e))?;
        }
        Ok(())
    }

    fn close_local(&mut self, token: u64) {
        if self
            .slot
            .local
            .as_ref()
            .is_some_and(|g| g.local.token == token)
        {
            // Closing the descriptor releases the liveness lock.
            self.slot.local = None;
        }
    }

    fn delete_live(&mut self, token: u64) {
        let path = self.paths.live(token);
        if self.lease.faults.check(FaultPoint::Unlink, &path).is_ok() {
            let _ = fs::remove_file(path);
        }
    }

    fn sweep(&mut self, below: u64) {
        let Ok(entries) = fs::read_dir(&self.paths.dir) else {
            return;
        };
        let prefix = format!("{}.", self.paths.stem);
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            let stale = rest == "lease.json.tmp"
                || rest
                    .strip_suffix(".live")
                    .and_then(|t| t.parse::<u64>().ok())
                    .is_some_and(|t| t < below);
            if stale {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    fn adopt(&mut self, pending: PendingLive, local: Local) {
        let PendingLive { file, dev, ino } = pending;
        self.slot.local = Some(LocalGen {
            local,
            file,
            dev,
            ino,
        });
    }
}

/// How often a waiter re-checks when the holder's liveness file is missing (it cannot block on a
/// lock that has no file).
const MISSING_POLL: Duration = Duration::from_millis(10);

/// Threads blocked on holders' liveness locks, one per generation waited on, shared by every
/// waiting acquire of this instance. Each ends (and wakes its waiters) when the holder's lock
/// is released — by a release or by the holder's death — and releases it again at once.
#[derive(Debug, Default)]
struct Waiters {
    map: Arc<Mutex<HashMap<PathBuf, Arc<GenerationEnd>>>>,
}

#[derive(Debug, Default)]
struct GenerationEnd {
    ended: Mutex<bool>,
    cond: std::sync::Condvar,
}

impl Waiters {
    /// Waits until the generation whose liveness file `file` opened ends, or until `wake`.
    fn wait(&self, path: &Path, file: File, wake: Instant) {
        let end = {
            let mut map = lock_map(&self.map);
            if let Some(end) = map.get(path) {
                Arc::clone(end)
            } else {
                let end = Arc::new(GenerationEnd::default());
                map.insert(path.to_owned(), Arc::clone(&end));
                let (shared, key, signal) =
                    (Arc::clone(&self.map), path.to_owned(), Arc::clone(&end));
                let spawned =
                    thread::Builder::new()
                        .name("flocklease-wait".into())
                        .spawn(move || {
                            // Blocks until the holder's lock is gone; dropping the file right
                            // away releases ours, so probes never mistake the waiter for a holder
                            // for longer than this instant.
                            let _ = file.lock();
                            drop(file);
                            lock_map(&shared).remove(&key);
                            *lock_map(&signal.ended) = true;
                            signal.cond.notify_all();
                        });
                if spawned.is_err() {
                    // No thread to wait with: let the caller retry.
                    map.remove(path);
                    return;
                }
                end
            }
        };
        let mut ended = lock_map(&end.ended);
        while !*ended {
            let left = wake.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            ended = end
                .cond
                .wait_timeout(ended, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A new generation's locked liveness file, not yet adopted.
struct PendingLive {
    file: File,
    dev: u64,
    ino: u64,
}

/// Locks `file` exclusively, waiting until `deadline` at most. A contended wait blocks in
/// `flock(2)` on a helper thread, so it ends the moment the holder unlocks or dies, with no
/// polling. Returns `None` at the deadline; the helper then drops the descriptor (unlocking it
/// again) as soon as its own `flock` returns.
fn lock_until(file: File, deadline: Instant) -> io::Result<Option<File>> {
    match file.try_lock() {
        Ok(()) => return Ok(Some(file)),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let (tx, rx) = mpsc::sync_channel(1);
    thread::Builder::new()
        .name("flocklease-lock-wait".into())
        .spawn(move || {
            let result = file.lock().map(|()| file);
            // If nobody waits any more, dropping the file here releases the lock.
            let _ = tx.send(result);
        })?;
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(result) => result.map(Some),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(io::Error::other("lock wait thread died")),
    }
}

/// Reads a whole record file: one `read` for any record of normal size (a short read of a
/// regular file means end of file), never more than the size limit plus one byte.
fn read_bounded(mut file: &File) -> io::Result<Vec<u8>> {
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

fn open_error(path: &Path, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(nix::libc::ELOOP) => Error::Symlink {
            path: path.to_owned(),
        },
        Some(nix::libc::EISDIR | nix::libc::ENXIO) => Error::NotAFile {
            path: path.to_owned(),
        },
        _ => Error::io("open", path, e),
    }
}

fn lock_map<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The map only caches slots; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
        // tmpfs and ext4 are local.
        assert_eq!(network_fs_name(0x0102_1994), None);
        assert_eq!(network_fs_name(0xef53), None);
    }
}

impl FlockLease {
    /// A close-on-exec duplicate of the locked liveness file of `lease`'s generation, if this
    /// instance holds that exact generation (same id, token and owner); `None` otherwise.
    ///
    /// `flock(2)` locks belong to the open file description, so the duplicate shares the
    /// generation's liveness lock: while any process keeps a copy open, probes see the
    /// generation alive and other processes are answered "held" until its expiry, even after
    /// this process has died. This is how `flocklease run` keeps the lease live for a job whose
    /// wrapper was killed, as `flock(1)` children keep its lock: the caller clears `FD_CLOEXEC`
    /// on the duplicate in the child only (every descriptor of this crate is close-on-exec, so
    /// nothing else is inherited) and closes its own copy after spawning.
    ///
    /// A copy never outlives the lease's expiry as a guarantee: an expired lease is taken over
    /// whatever its liveness. Release still frees the lease at once (the tombstone decides, and
    /// the next grant locks a new generation's file), and if a renew has to restore a deleted
    /// liveness file, copies made earlier lock the old, unlinked file and no longer count.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] naming the liveness file when the descriptor cannot be duplicated.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::{FlockLease, Owner, SessionId, SessionLease};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let leases = FlockLease::open(dir.path()).unwrap();
    /// let id = SessionId::new("job").unwrap();
    /// let lease = leases.acquire(&id, &Owner::new("me").unwrap()).unwrap().lease().unwrap();
    /// assert!(leases.liveness_fd(&lease).unwrap().is_some());
    /// leases.release(&lease).unwrap();
    /// assert!(leases.liveness_fd(&lease).unwrap().is_none());
    /// ```
    pub fn liveness_fd(&self, lease: &Lease) -> Result<Option<std::os::fd::OwnedFd>, Error> {
        let entry = self.slot(lease.session_id.stem());
        let slot = entry.state.lock().unwrap_or_else(PoisonError::into_inner);
        match slot.local.as_ref() {
            Some(generation)
                if generation.local.token == lease.token
                    && generation.local.owner == lease.owner =>
            {
                // `try_clone` duplicates with F_DUPFD_CLOEXEC.
                let copy = generation
                    .file
                    .try_clone()
                    .map_err(|e| Error::io("duplicate", &entry.paths.live(lease.token), e))?;
                Ok(Some(copy.into()))
            }
            _ => Ok(None),
        }
    }
}
