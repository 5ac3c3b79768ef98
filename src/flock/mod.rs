//! [`FlockLease`]: the real adapter over a lease directory, with `flock(2)` locks.
//!
//! Per session id, with `<stem>` its [safe name](crate::stem):
//!
//! | file | role |
//! | --- | --- |
//! | `<stem>.lock` | stable transition lock, held only during one acquire/renew/release |
//! | `<stem>.<token>.live` | liveness lock of one generation, held by its process for its whole life; it carries the generation's tag, which the record names |
//! | `<stem>.lease.json` | the record, replaced atomically through a temporary file of the transition's own, `<stem>.lease.json.<random>.tmp` |
//!
//! A generation's liveness file is published already locked: it never stands
//! unlocked under its name while its holder runs, and a probe counts only the file carrying the
//! record's tag as the generation's. A transition commits only while the `<stem>.lock` it holds
//! is still the file at that path.
//!
//! This module only does file work; every decision comes from [`machine`], through the front
//! and [`driver::run`](crate::driver::run).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::driver::{Hold, HoldStep};
use crate::error::Error;
use crate::fault::Faults;
use crate::lease::{DEFAULT_TTL, Grant, Lease};
use crate::machine;
use crate::name::{Owner, SessionId};
use crate::record::{LiveTag, Record};

pub(crate) mod files;
pub(crate) mod live;
pub mod mend;
mod queue;
pub mod status;
// The lockstep harness's stepper: reachable only where the module is public.
#[cfg(all(feature = "fault-injection", feature = "internals"))]
mod step;
pub mod sys;
mod tx;
pub(crate) mod wait;

use crate::front::Backend;
use crate::front::Leases;
use files::{Access, DEFAULT_FILE_MODE, HeldLock, Opener};
use wait::Cancel;

#[cfg(all(feature = "fault-injection", feature = "internals"))]
pub use step::{LineStepper, Stepper};
#[cfg(feature = "internals")]
pub use tx::SWEEP_SHARE;

/// The order in which [`FlockLease::fenced`] takes and gives back what it holds, which the
/// model checker's threads of one instance run too (`check --config threads`): the turn, the
/// state, the lock; the check; the state given back **before** the caller's closure (which may
/// call [`FlockLease::liveness_fd`], or another thread a wait, on the same instance), the
/// lock and the turn after it.
pub const SECTION: [HoldStep; 8] = [
    HoldStep::Take(Hold::Turn),
    HoldStep::Take(Hold::State),
    HoldStep::Take(Hold::Lock),
    HoldStep::Check,
    HoldStep::Give(Hold::State),
    HoldStep::Run,
    HoldStep::Give(Hold::Lock),
    HoldStep::Give(Hold::Turn),
];

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
/// use flocklease::{FlockLease, Grant, Owner, SessionId};
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
pub type FlockLease = Leases<Files>;

/// The flock backend of one [`FlockLease`]: its lease directory and how it opens files there.
#[derive(Debug)]
pub struct Files {
    dir: PathBuf,
    dir_file: File,
    durability: Durability,
    opener: Opener,
    /// Inotify instances kept for waiting acquires.
    watches: wait::Watches,
    /// How many `<stem>.lock` descriptors the ids' slots keep (at most
    /// [`files::KEEP_LOCKS`]).
    kept_locks: Arc<std::sync::atomic::AtomicUsize>,
    /// The deferred sweeps of this instance's takeovers, and the one listing they share.
    sweeps: Mutex<tx::Sweeps>,
    /// Records are written without the generation's tag, as the Go package writes them (a
    /// test seam: the lockstep of such records; always false otherwise).
    #[cfg(feature = "fault-injection")]
    untagged_records: bool,
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
    file_mode: u32,
    trust_foreign_owners: bool,
    faults: Faults,
    share_liveness: Option<std::os::fd::OwnedFd>,
    #[cfg(feature = "fault-injection")]
    untagged_records: bool,
}

impl FlockLease {
    /// Opens (creating its last component with mode 0700 if needed) the lease directory `dir`
    /// with the default
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
            file_mode: DEFAULT_FILE_MODE,
            trust_foreign_owners: false,
            faults: Faults::default(),
            share_liveness: None,
            #[cfg(feature = "fault-injection")]
            untagged_records: false,
        }
    }

    /// The lease directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lease time-to-live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Acquires the lease of `id` for `owner`, waiting up to `timeout` while another owner
    /// holds it.
    ///
    /// The wait watches the holder's liveness file (an inotify mark on that file, so its cost
    /// does not grow with the directory), so it ends the moment the holder releases or
    /// dies (the kernel drops its lock), or when its lease expires, and then retries the
    /// acquire: no polling interval. Only when the holder's liveness file is missing (deleted
    /// by hand), or no inotify instance is available, does it re-check with a pause of up to
    /// 10 ms. The wait starts no thread and takes no lock a holder, a probe or a transition
    /// needs: a waiter never makes a crashed holder look alive.
    ///
    /// Waiting acquires of an id **line up** (`<stem>.queue`, PROTOCOL §4.6): when the lease is
    /// free, the one that has waited longest tries first, and a call made while others wait
    /// goes to the back of the line, even right after its own release (but an instance that
    /// holds the id asks at once: the same owner's call is a refresh). A waiter ahead that
    /// leaves a free lease alone for 50 ms (stopped, starved of CPU) is passed over. The line
    /// orders attempts only; each attempt is an ordinary acquire. Callers that do not wait in
    /// line ([`SessionLease::acquire`](crate::SessionLease::acquire), the Go package) are not
    /// held back by it.
    ///
    /// Returns [`Grant::Held`] when `timeout` passes with the lease still held: contention is
    /// an answer, not an error. A timeout too large for the clock means no limit.
    ///
    /// # Errors
    ///
    /// Any error of [`SessionLease::acquire`](crate::SessionLease::acquire), among them [`Error::LockTimeout`] naming
    /// `<stem>.lock` when another transition on the id stays stuck for the lock timeout (each
    /// attempt is bounded by it, so the call may end up to one lock timeout after `timeout`).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use flocklease::{FlockLease, Grant, Owner, SessionId};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let (a, b) = (FlockLease::open(dir.path()).unwrap(), FlockLease::open(dir.path()).unwrap());
    /// let id = SessionId::new("job").unwrap();
    /// let first = a.acquire(&id, &Owner::new("a").unwrap()).unwrap().lease().unwrap();
    /// // Held for the whole wait: the answer is contention, not an error.
    /// let b_owner = Owner::new("b").unwrap();
    /// assert_eq!(b.acquire_wait(&id, &b_owner, Duration::from_millis(20)).unwrap(), Grant::Held);
    /// std::thread::scope(|s| {
    ///     s.spawn(|| a.release(&first).unwrap());
    ///     // Returns as soon as `a` releases.
    ///     let second = b.acquire_wait(&id, &b_owner, Duration::from_secs(10)).unwrap();
    ///     assert_eq!(second.lease().unwrap().token, first.token + 1);
    /// });
    /// ```
    pub fn acquire_wait(
        &self,
        id: &SessionId,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Grant, Error> {
        self.acquire_until(id, owner, wait::deadline_after(timeout), None)
    }

    /// Acquires the lease of `id` for `owner`, waiting as long as it takes (see
    /// [`FlockLease::acquire_wait`]).
    ///
    /// # Errors
    ///
    /// Any error of [`SessionLease::acquire`](crate::SessionLease::acquire).
    pub fn acquire_blocking(&self, id: &SessionId, owner: &Owner) -> Result<Lease, Error> {
        match self.acquire_until(id, owner, None, None)? {
            Grant::Granted(lease) => Ok(lease),
            // Without a deadline the loop only ends with a grant or an error.
            Grant::Held => unreachable!("a wait without a deadline answered held"),
        }
    }

    /// The wait of [`FlockLease::acquire_wait`], which `cancel` (if any) ends early: it then
    /// answers held, before any further attempt.
    fn acquire_until(
        &self,
        id: &SessionId,
        owner: &Owner,
        deadline: Option<Instant>,
        cancel: Option<&Cancel>,
    ) -> Result<Grant, Error> {
        let entry = self.entry(id);
        let paths = files::Paths::new(&self.inner.dir, id.stem().to_owned());
        let queue_path = queue::path(&self.inner.dir, &paths.stem);
        // This call's place in the id's line of waiters (PROTOCOL §4.6): taken when it first
        // has to wait, kept until it returns; and how long it has let a free lease go to the
        // places ahead, on a clock started now.
        let mut line = queue::Waiter::default();
        let origin = Instant::now();
        // Consecutive waits that returned at once (the record changed under us, the file is
        // missing): pause increasingly, so a loop that cannot block never spins.
        let mut pause = Duration::ZERO;
        // The liveness file the last wait watched, kept open until after the next attempt: if
        // that attempt (a takeover) unlinks it, the kernel drops the wait's inotify mark with it
        // only when this descriptor closes, after the attempt, not on its path (wait.rs).
        let mut watched: Option<File> = None;
        // The last attempt found the new generation's name locked (see below).
        let mut busy: Option<Error> = None;
        loop {
            if wait::cancelled(cancel) {
                return Ok(Grant::Held);
            }
            // An instance that holds the id tries at once: its own owner's call is a refresh
            // (re-entrant), another owner's is answered held and lines up. Else the line
            // decides. The look never waits: it reads until when the instance holds the id
            // (the expiry it last committed, `tx::held_at`), not under the state's mutex, which
            // another thread's call may hold while it waits for the transition lock (up to its
            // lock timeout) — so the wait keeps its bound of one lock timeout past `timeout`
            // (the model's threads check it) and the line its order (a busy state is no turn).
            let held_here = tx::held_at(&entry.held, self.clock.now());
            // The record as the line's look read it (only while its count runs), for the
            // wait below if no attempt follows.
            let mut read = None;
            let line_turn = !held_here
                && line.may_try(&self.inner.opener, &queue_path, origin.elapsed(), || {
                    let peeked = self.peek_record(&paths.record);
                    // Unreadable: no token (the count starts again, nobody is passed).
                    let token = peeked
                        .as_ref()
                        .ok()
                        .and_then(|p| p.as_ref())
                        .map(|(r, _)| r.token);
                    read = Some(peeked);
                    token
                });
            let turn = held_here || line_turn;
            if turn {
                // The first in the line, right after the holder let go, tries the transition
                // lock eagerly; only one waiter per id is first, so only one spins (unqueued
                // waiters spinning on two cores cost a quarter of the grants: BENCHMARKS.md).
                let _eager = (line_turn && line.is_in()).then(wait::eager);
                match self.acquire(id, owner) {
                    Ok(Grant::Granted(lease)) => return Ok(Grant::Granted(lease)),
                    Ok(Grant::Held) => busy = None,
                    // The new generation's name is locked by someone who is not the recorded
                    // holder (a receiver of a failed attempt's descriptor, a record moved
                    // back under a live holder): it may let go, so look again until the
                    // deadline, pausing increasingly; at the deadline, this is the answer.
                    Err(e @ Error::LiveLockBusy { .. }) => {
                        busy = Some(e);
                        pause = next_pause(pause);
                    }
                    Err(e) => return Err(e),
                }
            }
            drop(watched.take());
            line.join(&self.inner.opener, &queue_path);
            if deadline.is_some_and(|d| Instant::now() >= d)
                || (!pause.is_zero() && !wait::sleep_before(deadline, pause))
            {
                return busy.map_or(Ok(Grant::Held), Err);
            }
            // Held, or left to an earlier waiter: wait for the holder's generation to end —
            // its lock or its expiry — then let the machine decide again. Reading without the
            // transition lock is safe: the record is only ever replaced by an atomic rename.
            let started = Instant::now();
            let peeked = match read.take() {
                Some(peeked) if !turn => peeked?,
                _ => self.peek_record(&paths.record)?,
            };
            let tag = peeked.as_ref().and_then(|(_, tag)| *tag);
            let seen = peeked.as_ref().map(|(rec, _)| rec.token);
            let waiting = peeked.and_then(|(rec, _)| machine::wait_for(&rec, self.clock.now()));
            let Some(machine::Wait {
                token,
                until_expiry,
            }) = waiting
            else {
                // No holder to wait for (no record, released or expired): ask again, or, when
                // an earlier waiter's turn it is, give it a moment to take the lease.
                if turn {
                    pause = next_pause(pause);
                } else {
                    line.yielded.let_go(origin.elapsed(), seen);
                    wait::sleep_before(deadline, queue::HANDOFF_POLL);
                    pause = Duration::ZERO;
                }
                continue;
            };
            let at_expiry = wait::deadline_after(until_expiry);
            let wake = deadline.into_iter().chain(at_expiry).min();
            // Neither can be represented: look again in a while.
            let wake = wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            let live = paths.live(token);
            let opened = self.relieved(|| self.inner.opener.open(&live, Access::Wait));
            match live::identify(opened, &live, tag, live::peek)? {
                live::Found::Own(file) => {
                    if !turn && live::holder_gone(&file).map_err(|e| Error::io("lock", &live, e))? {
                        // The holder is gone and an earlier waiter's turn it is.
                        line.yielded.let_go(origin.elapsed(), seen);
                        wait::sleep_before(deadline, queue::HANDOFF_POLL);
                        pause = Duration::ZERO;
                        continue;
                    }
                    line.yielded.saw_held();
                    wait::wait_for_holder(&self.inner.watches, &live, &file, wake, cancel)
                        .map_err(|e| Error::io("wait for", &live, e))?;
                    watched = Some(file);
                }
                live::Found::Missing | live::Found::NotOwn(_) => {
                    // No lock of the generation's to wait on: the record's expiry decides, so
                    // look now and then.
                    wait::sleep_before(Some(wake), MISSING_POLL);
                }
            }
            pause = if started.elapsed() < Duration::from_micros(50) {
                next_pause(pause)
            } else {
                Duration::ZERO
            };
        }
    }

    /// Runs `f` as a **fenced section** of `lease`: only while the lease is this instance's,
    /// and with no takeover able to happen until `f` returns. Returns `Ok(None)`, without
    /// running `f`, when the lease is not held here any more (taken over, released, expired,
    /// or its generation not held by this instance).
    ///
    /// The section holds the id's transition lock (`<stem>.lock`, exclusively) from before the
    /// check until `f` returns: every takeover — this crate's, in any process, or the Go
    /// package's — needs that lock, so none can be granted while `f` runs, even if the lease
    /// expires meanwhile. That makes `f`'s writes those of the one holder, whatever the
    /// holder's process does before or after (a pause, a stop past the TTL), which a check
    /// like [`KeepAlive::is_lost`](crate::KeepAlive::is_lost) before writing cannot promise.
    ///
    /// **Cost:** every transition on the id — a rival's acquire, and this instance's own
    /// renew — waits for the section (at most its lock timeout, then
    /// [`Error::LockTimeout`]). Keep `f` short (a write, a rename), well below the lock
    /// timeout; its wait for the lock is bounded by the lock timeout too.
    ///
    /// # Errors
    ///
    /// [`Error::LockTimeout`] when the transition lock stays busy for the lock timeout; an
    /// error reading the record. `f` has not run then.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::{FlockLease, Owner, SessionId};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// # let out = dir.path().join("report.csv");
    /// let leases = FlockLease::open(dir.path())?;
    /// let lease = leases.acquire(&SessionId::new("report")?, &Owner::new("a")?)?.lease().unwrap();
    /// let wrote = leases.fenced(&lease, || std::fs::write(&out, "total,42\n"))?;
    /// match wrote {
    ///     Some(result) => result?,               // written as the one holder
    ///     None => eprintln!("lease lost: not written"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn fenced<T>(&self, lease: &Lease, f: impl FnOnce() -> T) -> Result<Option<T>, Error> {
        let started = Instant::now();
        let deadline = wait::deadline_after(self.lock_timeout);
        let id = &lease.session_id;
        let entry = self.entry(id);
        let observe = || <Files as Backend>::observe(self, id);
        // What the section holds, taken and given back in `SECTION`'s order, which the model
        // checker's threads run too. A panic of `f` gives everything back (the lock by an
        // explicit unlock: `Unlocking`).
        let turn = self.turn(id, &entry, deadline, started)?;
        observe();
        let slot = lock(&entry.state);
        observe();
        let paths = Arc::clone(&slot.paths);
        let open = || self.open_lock(&paths.lock);
        let faults = &self.inner.opener.faults;
        let stable = files::lock_at_path(&paths.lock, faults, open, deadline, started)?;
        let stable = Unlocking(stable);
        observe();
        let held_here = slot
            .local
            .as_ref()
            .is_some_and(|g| g.local.token == lease.token && g.local.owner == lease.owner);
        let record = self.peek_record(&paths.record)?;
        let holds = machine::fence_holds(
            record.as_ref().map(|(r, _)| r),
            &lease.owner,
            lease.token,
            held_here,
            self.clock.now(),
        );
        observe();
        if !holds {
            return Ok(None);
        }
        drop(slot);
        observe();
        let out = f();
        observe();
        drop(stable);
        observe();
        drop(turn);
        observe();
        Ok(Some(out))
    }

    fn peek_record(&self, path: &Path) -> Result<Option<(Record, Option<LiveTag>)>, Error> {
        let file = match self.relieved(|| self.inner.opener.open(path, Access::Read)) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        files::read_record(&file, path).map(Some)
    }

    /// Whether this instance's turn on `id` and its state of `id` are taken now (for the
    /// threads' lockstep, from a [`FaultPoint::Held`] hook).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn holds(&self, id: &SessionId) -> (bool, bool) {
        let entry = self.entry(id);
        (!entry.gate.is_free(), entry.state.try_lock().is_err())
    }

    /// How many ids this instance keeps state for (for tests of the pruning).
    #[doc(hidden)]
    pub fn tracked_ids(&self) -> usize {
        self.ids.len()
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

    /// How long one call may wait for an id's transition lock (held by another transition)
    /// before [`Error::LockTimeout`]. Each call's wait is its own: callers queued on one id in
    /// this process each wait at most this long. A value too large for the clock means no
    /// limit.
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

    /// The permission bits of new lease files (default `0o600`). Use `0o660` in a directory
    /// shared by a group (`chgrp GROUP DIR; chmod 2770 DIR`, so new files get the directory's
    /// group): the bits are applied whatever the umask. Must include `0o600` and may not let
    /// other users write (`0o002`) or anyone execute.
    pub fn file_mode(mut self, mode: u32) -> Self {
        self.file_mode = mode;
        self
    }

    /// In a sticky world-writable directory (`/tmp`, `/run/lock`), also trust lease files
    /// owned by other users. By default such a file is refused with [`Error::ForeignOwner`],
    /// since any user can plant one there. Has no effect in a directory that is not
    /// world-writable, where the directory's permissions already decide who may create files.
    pub fn trust_foreign_owners(mut self, trust: bool) -> Self {
        self.trust_foreign_owners = trust;
        self
    }

    /// Sends every liveness file this instance publishes over `socket` (a connected Unix
    /// socket, `SOCK_SEQPACKET` or `SOCK_STREAM`) the moment it is locked, before it is placed
    /// at its name: a message `live PATH` carrying the descriptor (`SCM_RIGHTS`). That is
    /// the first publication at a grant and every republication by a renew that found the file
    /// deleted or replaced (PROTOCOL §4.5).
    ///
    /// A descriptor in flight, or received, shares the generation's lock, so the process at the
    /// other end keeps the lease live if this one dies, and no file is ever placed at the
    /// generation's name that it does not keep: `flocklease run` gives its watchdog the lease's
    /// liveness this way (PROTOCOL §7). The send never blocks and its failure (the other end
    /// gone, its buffer full) is ignored: the publication goes on, kept by this process alone.
    pub fn share_liveness(mut self, socket: std::os::fd::OwnedFd) -> Self {
        self.share_liveness = Some(socket);
        self
    }

    /// Makes chosen I/O steps fail, for tests. See [`fault`](crate::fault).
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, faults: crate::fault::FaultHook) -> Self {
        self.faults = Faults::new(faults);
        self
    }

    /// Writes records without the generation's tag, as the Go package does, so that a test
    /// can run the adapter as a directory of Go holders would have it (the lockstep with the
    /// model's `go-records`). Not for use: a record without a tag gives up what the tag adds
    /// (PROTOCOL §1.4).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn untagged_records(mut self, untagged: bool) -> Self {
        self.untagged_records = untagged;
        self
    }

    /// Opens the lease directory, creating it if missing: mode 0700, only its last component
    /// (a missing parent is an [`Error::Io`] naming it, so a mistyped path never creates a
    /// tree), synced into its parent. A relative path is relative to the working directory
    /// when this is called. `flocklease run --dir` follows the same rule.
    ///
    /// Directory policy: a private or group directory is used as it is; a world-writable
    /// directory is accepted only with the sticky bit (`/tmp`), and then every lease file
    /// opened in it must belong to this process's user (see
    /// [`FlockLeaseBuilder::trust_foreign_owners`]). A private subdirectory
    /// (`mkdir -m 0700 /tmp/myapp-leases`) avoids the question.
    ///
    /// # Errors
    ///
    /// - [`Error::NotADirectory`] when the path is something else;
    /// - [`Error::WorldWritable`] when any user may write to it and it is not sticky;
    /// - [`Error::NetworkFilesystem`] when it is on a network file system and that was not
    ///   allowed;
    /// - [`Error::InvalidFileMode`] when [`FlockLeaseBuilder::file_mode`] is unusable;
    /// - [`Error::Io`] when it cannot be created, inspected or opened.
    pub fn open(self) -> Result<FlockLease, Error> {
        let mode = self.file_mode;
        if mode & !0o666 != 0 || mode & 0o600 != 0o600 || mode & 0o002 != 0 {
            return Err(Error::InvalidFileMode { mode });
        }
        let (dir_file, owners, sticky) =
            files::open_dir(&self.dir, self.allow_network_fs, self.trust_foreign_owners)?;
        let files = Files {
            watches: wait::Watches::default(),
            kept_locks: Arc::default(),
            dir: self.dir,
            dir_file,
            durability: self.durability,
            sweeps: Mutex::default(),
            #[cfg(feature = "fault-injection")]
            untagged_records: self.untagged_records,
            opener: Opener {
                owners,
                sticky,
                file_mode: mode,
                faults: self.faults,
                share: self.share_liveness.map(Arc::new),
            },
        };
        Ok(Leases::with(files, self.ttl, self.lock_timeout, self.clock))
    }
}

/// A transition lock given up by an explicit unlock when dropped (also while unwinding): a
/// copy of its descriptor in a process forked meanwhile (a fenced section's closure may fork)
/// must not keep it locked, as closing alone would.
struct Unlocking(HeldLock);

impl Drop for Unlocking {
    fn drop(&mut self) {
        let _ = self.0.file.unlock();
    }
}

/// How often a waiter re-checks when the holder's liveness file is missing (it cannot wait on
/// a lock that has no file).
const MISSING_POLL: Duration = Duration::from_millis(10);

fn next_pause(pause: Duration) -> Duration {
    (pause * 2).clamp(Duration::from_micros(50), MISSING_POLL)
}

use crate::front::lock;

impl FlockLease {
    /// [`FlockLease::acquire_wait`] as a [`Future`], for async code: the
    /// wait runs on a thread of its own (started now, ended by the grant or the deadline), so
    /// no executor thread blocks, and that thread wakes the task. No runtime is required.
    ///
    /// Dropping the future before it resolves abandons the wait: the waiting thread stops
    /// waiting at once and makes no further attempt (one already under way finishes first); a
    /// lease it was granted in the meantime is released at once.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use flocklease::{FlockLease, Grant, Owner, SessionId};
    ///
    /// # async fn example(leases: Arc<FlockLease>) -> Result<(), flocklease::Error> {
    /// let id = SessionId::new("reindex")?;
    /// match leases.acquire_wait_async(&id, &Owner::unique(), Duration::from_secs(60)).await? {
    ///     Grant::Granted(lease) => { /* work, then */ leases.release(&lease)?; }
    ///     Grant::Held => eprintln!("still held after a minute"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_wait_async(
        self: &Arc<Self>,
        id: &SessionId,
        owner: &Owner,
        timeout: Duration,
    ) -> AcquireWait {
        let shared = Arc::new(Mutex::new(AsyncWait::default()));
        let cancel = match Cancel::new() {
            Ok(c) => Arc::new(c),
            Err(e) => {
                lock(&shared).result = Some(Err(Error::io("start a wait in", &self.inner.dir, e)));
                return AcquireWait {
                    shared,
                    leases: Arc::clone(self),
                    cancel: None,
                };
            }
        };
        let (leases, id, owner, state, stop) = (
            Arc::clone(self),
            id.clone(),
            owner.clone(),
            Arc::clone(&shared),
            Arc::clone(&cancel),
        );
        let spawned = std::thread::Builder::new()
            .name("flocklease-acquire-wait".into())
            .spawn(move || {
                let deadline = wait::deadline_after(timeout);
                let result = leases.acquire_until(&id, &owner, deadline, Some(&stop));
                let mut st = lock(&state);
                if st.abandoned {
                    // Nobody will take the lease: give it back.
                    if let Ok(Grant::Granted(lease)) = &result {
                        drop(st);
                        let _ = leases.release(lease);
                    }
                    return;
                }
                st.result = Some(result);
                if let Some(w) = st.waker.take() {
                    w.wake();
                }
            });
        if let Err(e) = spawned {
            lock(&shared).result = Some(Err(Error::io(
                "start a thread to wait for",
                &self.inner.dir,
                e,
            )));
        }
        AcquireWait {
            shared,
            leases: Arc::clone(self),
            cancel: Some(cancel),
        }
    }
}

/// The future of [`FlockLease::acquire_wait_async`].
#[must_use = "futures do nothing unless polled; dropping this one abandons the wait"]
#[derive(Debug)]
pub struct AcquireWait {
    shared: Arc<Mutex<AsyncWait>>,
    leases: Arc<FlockLease>,
    /// Ends the waiting thread's wait when the future is dropped.
    cancel: Option<Arc<Cancel>>,
}

#[derive(Debug, Default)]
struct AsyncWait {
    result: Option<Result<Grant, Error>>,
    waker: Option<std::task::Waker>,
    abandoned: bool,
}

impl std::future::Future for AcquireWait {
    type Output = Result<Grant, Error>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Grant, Error>> {
        let mut st = lock(&self.shared);
        match st.result.take() {
            Some(result) => std::task::Poll::Ready(result),
            None => {
                st.waker = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

impl Drop for AcquireWait {
    /// Abandons the wait: the waiting thread stops; a lease granted but never taken is
    /// released.
    fn drop(&mut self) {
        let mut st = lock(&self.shared);
        st.abandoned = true;
        if let Some(c) = &self.cancel {
            c.cancel();
        }
        if let Some(Ok(Grant::Granted(lease))) = st.result.take() {
            drop(st);
            let _ = self.leases.release(&lease);
        }
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
    /// It never waits for a transition lock, but it may wait for another thread's transition
    /// of the id, which holds the instance's state while it waits for the lock and while it
    /// runs (at most that call's lock timeout plus its run's writes and syncs), or for a
    /// section's wait for the lock (its lock timeout); inside a fenced section of the id it
    /// answers at once.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] naming the liveness file when the descriptor cannot be duplicated.
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::{FlockLease, Owner, SessionId};
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
        let entry = self.entry(&lease.session_id);
        let slot = lock(&entry.state);
        match slot.local.as_ref() {
            Some(generation)
                if generation.local.token == lease.token
                    && generation.local.owner == lease.owner =>
            {
                // `try_clone` duplicates with F_DUPFD_CLOEXEC.
                let copy = generation
                    .live
                    .file
                    .try_clone()
                    .map_err(|e| Error::io("duplicate", &slot.paths.live(lease.token), e))?;
                Ok(Some(copy.into()))
            }
            _ => Ok(None),
        }
    }
}
