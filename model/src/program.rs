//! The flock adapter's own transaction, run by the model checker: processes calling the
//! library's `FlockTx` through the library's driver (`flocklease::driver::run`) on a simulated
//! lease directory ([`Sim`], the library's `flock::sys::Dir` seam), a crash that closes
//! everything a process holds or a crash of the host that keeps only what was fsynced, a
//! clock step past the TTL, and a cleaner that deletes the transition lock's file or a
//! liveness file.
//!
//! The simulated directory ([`Files`]) is part of the model's state: names, inodes and their
//! bytes, the open file descriptions and which of them holds each inode's `flock`. A process's
//! step runs its whole history again from its start — every call its script made so far, on
//! one instance's state (the id's slot, its deferred sweeps) — with every file-system call it
//! made in earlier steps answered from its log ([`Proc::log`]; a replayed call made from
//! another line of the code than the logged one panics), up to the next call another
//! process could see or be seen by ([`Sim`]'s visible calls: an open or a stat of a shared
//! name, a rename, an unlink, a listing, the directory's fsync, an unlock, a probe of a lock,
//! the close of a locked file, a kept lock's `flock`, a wait for a busy lock), which it makes
//! on the simulated files and logs; the transition lock's first `flock` runs with its open,
//! and a publish's try-lock on its own new file is its own; calls on what only it can
//! reach (its temporary files under fresh names, their writes and fsyncs, reads and stats of
//! what it opened, the directory's fsync, the clock) are made in the same step. At the visible
//! call after that the step ends: that call and every one after it fails without acting, and
//! the run is discarded. A wait for a transition lock held by another description is a step
//! not enabled until the lock is free (the kernel's `flock` waits). Closing a file is a call
//! too (the handle's `drop`), so a dropped liveness file releases its lock exactly where the
//! adapter drops it.
//!
//! The transition lock's attempt is the library's too (`flock::sys::lock_once_on`, the
//! kernel's `files::lock_once` over its own seam, `LockSteps`: the descriptor kept from the
//! id's last transition locked and checked first, else `<stem>.lock` opened, creating it, and
//! locked; a busy lock waited for only while it is still the file at the path; the lock
//! checked to be the file at the path), and so are the front's loop around it
//! (`front::begin_or_wait`) and the lock's end (`Slot::end`: unlocked unless the run did,
//! then kept). The rest of the front (the turn, the state mutex, the final expiry check) is
//! not run here.
//!
//! The properties: **one holder at a time** (no two processes hold unexpired grants),
//! **a holder's record names it** (while a process holds an unexpired grant, the record at the
//! name is its generation), **the record's token never goes down**, **grants are fenced** (an
//! unexpired grant to another process has a greater token than every grant before it), **a
//! crashed holder is replaced at once**, **a fsynced commit survives a host crash** (the
//! record on disk has the token of every returned grant, or a greater one), and **a call
//! fails only when its transition lock was removed while it held it**, or it overlapped a
//! call whose lock was; **the held flag** (`held_at`, which a waiting acquire's look reads)
//! says held after a grant and not after a release; **locks are given back**: a call ends
//! holding no lock but, after a grant, its generation's liveness lock, and **leaves no
//! temporary file of its own**; **the registry prunes exactly what loses nothing** (between
//! calls, `driver::keeps` of the slot's `Idle` lets the registry drop the instance's entry
//! exactly when the process holds no lock in the directory and its slot owes no sweep). Each
//! holds outside the window POSIX leaves between the commit check's stat of `<stem>.lock` and the
//! rename (PROTOCOL §11): the cleaner does not act while a process is in it (the lease model
//! shows that window reachable).
//!
//! Beside it, `check` runs the same processes with failed steps instead of the cleaner: a
//! mishap is then a crash, a crash of the host, or one step failing with `ENOSPC` at the
//! adapter's fault seam ([`ProgramAction::Fault`]; the call goes on, and may fail).
//!
//! Left out (PROTOCOL says it too): a write or fsync that half acted, permissions, owners,
//! symbolic links and special files, a Go prober's empty files, a record or liveness file
//! moved back, the lock timeout, and the instance's other threads.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicI64;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use flocklease::driver::{Idle, keeps};
use flocklease::error::LockOf;
use flocklease::fault::FaultPoint;
use flocklease::flock::sys::{
    Access, Dir, FlockTx, LockSteps, Peeked, Slot, Sweeps, begin_or_wait, held_at, lock_and_record,
    lock_once_on,
};
use flocklease::machine::{Event, Outcome};
use flocklease::record::{self, LiveTag};
use flocklease::{Error, Owner, SessionId, Timestamp};
use stateright::{Model, Property};

use crate::harness::SmallModel;

/// The lease directory.
const DIR: &str = "/d";
/// The id.
const ID: &str = "s";
/// The lease's TTL, in seconds.
const TTL: i64 = 10;
/// The model's clock at the start, in seconds since the epoch.
const START: i64 = 1_000;

/// One call of a process's script.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Acquire the lease.
    Acquire,
    /// Renew what the process's last grant gave it (skipped without one).
    Renew,
    /// Release what the process's last grant gave it (skipped without one).
    Release,
}

/// Mistakes planted in the model's own actors (the program's are planted in its source:
/// `model/tests/plants.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Planted {
    /// The simulated `flock` lets a second description lock a locked inode.
    SharedFlock,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct ProgramModel {
    /// Each process's calls, in order.
    pub scripts: Vec<Vec<Call>>,
    /// How many mishaps: a crash of a process (which ends its script), of the host, or a
    /// failed step (see `faults`).
    pub crashes: u8,
    /// How many times the clock steps past the TTL.
    pub ticks: u8,
    /// How many times the cleaner deletes `<stem>.lock`.
    pub cleaner: u8,
    /// Whether a mishap may be a failed file-system step (`ENOSPC`, at the adapter's fault
    /// seam) instead of a crash: each takes one of `crashes`.
    pub faults: bool,
    /// A mistake planted in the simulated directory.
    pub planted: Option<Planted>,
}

impl Default for ProgramModel {
    fn default() -> Self {
        ProgramModel {
            scripts: vec![
                vec![Call::Acquire, Call::Renew, Call::Release],
                vec![Call::Acquire, Call::Acquire],
            ],
            crashes: 1,
            ticks: 1,
            cleaner: 1,
            faults: false,
            planted: None,
        }
    }
}

/// An open file description: the process that opened it and its number there.
pub type Desc = (u8, u16);

/// The simulated lease directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Files {
    /// Each name and the inode it names.
    pub names: BTreeMap<String, u8>,
    /// Each inode's bytes (an inode lives while a name or an open description refers to it).
    pub inodes: BTreeMap<u8, Vec<u8>>,
    /// The open file descriptions and the inode each opened.
    pub open: BTreeMap<Desc, u8>,
    /// Which description holds each locked inode's exclusive `flock`.
    pub locked: BTreeMap<u8, Desc>,
    /// The names as the disk has them: the directory as of its last fsync.
    pub durable_names: BTreeMap<String, u8>,
    /// Each inode's bytes as the disk has them: as of its last fsync.
    pub durable_data: BTreeMap<u8, Vec<u8>>,
}

impl Files {
    /// A new inode holding `bytes`: the lowest free number, so that a freed inode's number is
    /// given again (what the adapter's identity checks must survive).
    fn make(&mut self, bytes: Vec<u8>) -> u8 {
        let ino = (0..=u8::MAX)
            .find(|i| !self.inodes.contains_key(i) && !self.durable_names.values().any(|n| n == i))
            .expect("fewer than 256 inodes");
        self.inodes.insert(ino, bytes);
        ino
    }

    /// Frees the inodes nothing refers to any more.
    fn collect(&mut self) {
        let (names, open, durable) = (&self.names, &self.open, &self.durable_names);
        let used = |i: &u8| {
            names.values().any(|n| n == i)
                || open.values().any(|n| n == i)
                || durable.values().any(|n| n == i)
        };
        self.inodes.retain(|i, _| used(i));
        self.durable_data.retain(|i, _| used(i));
    }

    /// The host crashes: every description closes, and the directory and the files are what
    /// the disk has (a name or bytes never fsynced are lost; an inode whose name survives but
    /// whose bytes were never fsynced is empty).
    fn host_crash(&mut self) {
        self.open.clear();
        self.locked.clear();
        self.names = self.durable_names.clone();
        self.inodes = (self.names.values())
            .map(|i| (*i, self.durable_data.get(i).cloned().unwrap_or_default()))
            .collect();
        self.collect();
    }

    /// Closes every description of process `p` (a crash): its locks go with them.
    fn close_all(&mut self, p: u8) {
        self.open.retain(|d, _| d.0 != p);
        self.locked.retain(|_, d| d.0 != p);
        self.collect();
    }

    /// The record at `name`, if a valid one stands there.
    fn record(&self, name: &str) -> Option<record::Record> {
        let bytes = self.inodes.get(self.names.get(name)?)?;
        record::decode_tagged(bytes).ok().map(|(r, _)| r)
    }
}

/// What a file-system call answered, in a process's log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// An open: the inode, or nothing at the name.
    Open(Option<u8>),
    /// A stat of a name: the inode there, if any.
    Standing(Option<u8>),
    /// A yes or no (a lock taken, a holder gone, a rename without replacement done).
    Bool(bool),
    /// A listing's names.
    Names(Vec<String>),
    /// A read's bytes.
    Bytes(Vec<u8>),
    /// Nothing at the name (`ENOENT`), or something already there (`EEXIST`).
    Refused(bool),
    /// The clock, in seconds since the epoch.
    Now(i64),
    /// Done.
    Done,
}

/// One process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proc {
    /// What its file-system calls answered, from its start (emptied by a crash).
    pub log: Vec<(u32, Answer)>,
    /// How many of its script's calls have ended.
    pub done: usize,
    /// It crashed: its script is over.
    pub crashed: bool,
    /// Ghost: the grant its last call that answered one gave it, `(token, expiry in
    /// seconds)`, until it releases it or crashes.
    pub holds: Option<(u64, i64)>,
    /// Ghost: its last visible call was a stat of `<stem>.lock` (the commit check's, or the
    /// lock attempt's): the window before a rename, in which the cleaner does not act.
    pub in_window: bool,
    /// Ghost: the call in progress has made a visible call (so a crash now is mid-call).
    pub started: bool,
    /// Ghost: it holds its transition lock (its attempt's check passed), not yet given back.
    pub holding: bool,
    /// Ghost: the call in progress began after a holder crashed holding its generation's
    /// file (see [`ProgramState::crashed_holder`]).
    pub after_crash: bool,
    /// Ghost: its last commit of a record naming it came after the cleaner's last deletion of
    /// a liveness file.
    pub clean: bool,
    /// Ghost: the cleaner deleted a liveness file during its call in progress (after the
    /// call may have checked its own).
    pub disturbed: bool,
    /// Ghost: a fault failed a step of its call in progress (which may fail then).
    pub faulted: bool,
    /// Ghost: the cleaner deleted the transition lock's name while this process held the
    /// lock, or while a call whose lock it was still ran beside this process's call in
    /// progress (which may fail then, and only then: two transitions overlapped).
    pub lock_removed: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProgramState {
    /// The simulated directory.
    pub files: Files,
    /// The processes.
    pub procs: Vec<Proc>,
    /// The clock, in seconds since the epoch.
    pub now: i64,
    /// Clock steps left.
    pub ticks: u8,
    /// Crashes left.
    pub crashes: u8,
    /// The cleaner's acts left.
    pub cleaner: u8,
    /// Ghost: the greatest token a record put at the name carried.
    pub max_token: Option<u64>,
    /// Ghost: the last grant, `(token, process)`.
    pub last_grant: Option<(u64, u8)>,
    /// Ghost: a record with a lower token replaced a greater one.
    pub went_back: bool,
    /// Ghost: a grant to another process did not exceed every grant before it.
    pub unfenced: bool,
    /// Ghost: a process was granted the lease after another crashed holding it.
    pub replaced_crashed: bool,
    /// Ghost: a process renewed a grant past its expiry.
    pub renewed_late: bool,
    /// Ghost: the token of a holder that crashed while its generation's file stood at its
    /// name, locked by it, and that nobody has replaced since (cleared by a grant, or by the
    /// cleaner acting, which may take the file away).
    pub crashed_holder: Option<u64>,
    /// Ghost: an acquire that began after a crashed holder's end was answered "held" while
    /// nobody had replaced it.
    pub not_replaced: bool,
    /// Ghost: the greatest token a returned grant carried (its commit was fsynced).
    pub max_returned: Option<u64>,
    /// Ghost: after a host crash, the record on disk had a lower token than a returned grant.
    pub lost: bool,
    /// Ghost: a call failed although its transition lock was not removed while it held it.
    pub failed: bool,
    /// Ghost: the process whose transition lock the cleaner removed while it held it, until
    /// its call ends.
    pub overlap: Option<u8>,
    /// Ghost: after a call, the instance's held flag disagreed with its answer (held after a
    /// release, or not held after a grant).
    pub held_wrong: bool,
    /// Ghost: a call ended with a lock kept that it should have given back (any but its
    /// generation's liveness file after a grant, any after a release).
    pub kept_locked: bool,
    /// Ghost: a call ended leaving a temporary file of its own.
    pub left_temporary: bool,
    /// Ghost: after a call, the registry would have pruned the instance's entry for the id
    /// while it held a lock or owed a sweep, or kept it while it did neither.
    pub pruned_wrong: bool,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgramAction {
    /// A process's next step.
    Step(u8),
    /// A process crashes: the kernel closes everything it had open.
    Crash(u8),
    /// The host crashes: every process ends, and the lease directory is what the disk has.
    HostCrash,
    /// The clock steps past the TTL.
    Tick,
    /// The cleaner deletes `<stem>.lock`.
    DeleteLock,
    /// The cleaner deletes the liveness file of the greatest token.
    DeleteLive,
    /// A process's next step, its first fault point failing (`ENOSPC`).
    Fault(u8),
}

/// Exclusion.
pub const ONE_HOLDER: &str = "no two processes hold unexpired grants at once";
/// The record names the holder.
pub const NAMED: &str = "while a process holds an unexpired grant, the record names its generation";
/// The record's token.
pub const NEVER_BACK: &str = "the record's token never goes down";
/// Fencing.
pub const FENCED: &str =
    "an unexpired grant to another process carries a greater token than every grant before it";
/// A crashed holder is replaced at once.
pub const AT_ONCE: &str =
    "an acquire that begins after a holder crashed is granted, unless someone else was";
/// Durability.
pub const DURABLE: &str = "after a host crash, the record on disk has the token of every returned grant, or a greater one";
/// Calls answer.
pub const ANSWERS: &str = "a call fails only when its transition lock was removed while it held it, or it overlapped a call whose lock was";
/// Progress: no process is stuck (a step blocked for ever, a lock never given back).
pub const PROGRESS: &str = "every process ends its script, or crashes";
/// The held flag.
pub const HELD_FLAG: &str =
    "after a grant the instance's held flag says it holds the id, after a release it does not";
/// Locks given back.
pub const GIVEN_BACK: &str =
    "a call ends holding no lock but, after a grant, its generation's liveness lock";
/// Temporary files.
pub const NO_LEFTOVER: &str = "a call ends leaving no temporary file of its own";
/// The registry's pruning.
pub const PRUNED: &str = "between calls, the registry may prune an instance's entry for the id exactly when it holds no lock and owes no sweep";
/// Reachability: a crashed holder replaced.
pub const REPLACED: &str = "a process is granted the lease a crashed holder held";
/// Reachability: a late renew.
pub const LATE_RENEW: &str = "a holder renews past its expiry when nobody took over";

/// The process whose temporary file `name` is (`<…>.<tag>.tmp`, the tag's high half the
/// process's number: `Sim::fresh_tag`).
fn temporary_of(name: &str) -> Option<u8> {
    let tag = name.strip_suffix(".tmp")?.rsplit('.').next()?;
    u8::try_from(u64::from_str_radix(tag, 16).ok()? >> 32).ok()
}

/// The id's transition lock's and record's file names, as the adapter names them (made once:
/// the actions and properties of every state ask for them).
static NAMES: LazyLock<(String, String)> =
    LazyLock::new(|| lock_and_record(&SessionId::new(ID).expect("a valid id")));

/// The id's transition lock's file name.
fn lock_name() -> &'static str {
    &NAMES.0
}

/// The id's record's file name.
fn record_name() -> &'static str {
    &NAMES.1
}

/// The error every call of a step that is over returns (the process's run goes on to its end
/// and is discarded; the next step runs it again).
fn over(path: &Path) -> Error {
    Error::Io {
        op: "model step",
        path: path.to_owned(),
        source: io::Error::other("the model's step ends here"),
    }
}

/// A path's name in the lease directory.
fn name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The simulated directory as one process's step sees it: the files, and the process's log.
pub struct Sim<'a> {
    files: &'a RefCell<Files>,
    me: u8,
    log: RefCell<Vec<(u32, Answer)>>,
    /// How far the log has been replayed.
    pos: Cell<usize>,
    /// Descriptions opened so far (replayed identically).
    opened: Cell<u16>,
    /// Tags given so far (replayed identically).
    tags: Cell<u64>,
    /// This step has made its one visible call.
    made: Cell<bool>,
    /// The step is over: every call from now on fails without acting.
    over: Cell<bool>,
    /// The step found the transition lock held by another description.
    blocked: Cell<bool>,
    /// The step's first fault point fails (the fault actor's step); cleared when one did.
    armed: Cell<bool>,
    /// The process holds its transition lock (its attempt's check passed) and has not given
    /// it back.
    holding: Cell<bool>,
    /// What the step's visible call was, for the window ghost: 1 a stat of `<stem>.lock`, 2
    /// a stat of the record, 0 anything else.
    kind: Cell<u8>,
    /// The record's name.
    record: String,
    /// The clock.
    now: i64,
    /// The planted mistake.
    planted: Option<Planted>,
    /// The instance's deferred sweeps.
    sweeps: Mutex<Sweeps>,
    /// The lock file's name.
    lock: String,
    /// The description of the lock file its attempt has just opened, until the attempt's
    /// `flock` (which runs with the open, in the same step).
    just_opened: Cell<Option<Desc>>,
}

/// An open file of the simulated directory. Dropping it closes it.
#[derive(Debug)]
pub struct SimFile<'a> {
    desc: Desc,
    ino: u8,
    sim: &'a Sim<'a>,
}

impl fmt::Debug for Sim<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sim(p{})", self.me)
    }
}

impl Drop for SimFile<'_> {
    fn drop(&mut self) {
        let desc = self.desc;
        // Visible only when it releases a lock.
        let locked = self.sim.files.borrow().locked.values().any(|d| *d == desc);
        self.sim.call(locked, |f| {
            f.open.remove(&desc);
            f.locked.retain(|_, d| *d != desc);
            f.collect();
            Some(Answer::Done)
        });
    }
}

impl<'a> Sim<'a> {
    /// One call: replayed from the log; or made now on the files by `act` (`None`: it
    /// blocks), when it is the step's one visible call (`visible`) or the process's own; or,
    /// at the step's second visible call, the step's end.
    ///
    /// Each answer is logged with the line of the call that made it, and a replay asserts
    /// that the call it answers is made from the same line: a run that drifted from the one
    /// it replays (an answer given to another call) panics instead of checking something else.
    #[track_caller]
    fn call(
        &self,
        visible: bool,
        act: impl FnOnce(&mut Files) -> Option<Answer>,
    ) -> Option<Answer> {
        let line = std::panic::Location::caller().line();
        if self.over.get() {
            return None;
        }
        let pos = self.pos.get();
        if let Some((logged, answer)) = self.log.borrow().get(pos) {
            assert_eq!(
                *logged, line,
                "p{}'s replay drifted at its call {pos}: {answer:?} was answered to the call \
                 at line {logged}",
                self.me
            );
            self.pos.set(pos + 1);
            return Some(answer.clone());
        }
        if visible && self.made.get() {
            self.over.set(true);
            return None;
        }
        let Some(answer) = act(&mut self.files.borrow_mut()) else {
            self.blocked.set(true);
            self.over.set(true);
            return None;
        };
        if visible {
            self.made.set(true);
            self.kind.set(0);
        }
        self.log.borrow_mut().push((line, answer.clone()));
        self.pos.set(pos + 1);
        Some(answer)
    }

    /// A new description of `ino` (`None`: nothing).
    fn file(&'a self, ino: Option<u8>) -> Option<SimFile<'a>> {
        let ino = ino?;
        let n = self.opened.get();
        self.opened.set(n + 1);
        Some(SimFile {
            desc: (self.me, n),
            ino,
            sim: self,
        })
    }

    /// Notes, for a call being made now, the description it opens.
    fn next_desc(&self) -> Desc {
        (self.me, self.opened.get())
    }

    /// A stat of `name` (visible): the inode there, if any (`None`: the step ended).
    #[track_caller]
    fn stat(&self, name: &str) -> Option<Option<u8>> {
        match self.call(true, |f| Some(Answer::Standing(f.names.get(name).copied())))? {
            Answer::Standing(ino) => Some(ino),
            _ => None,
        }
    }

    /// The commit check's stat of `name` (visible), which opens or keeps the window the
    /// cleaner does not act in (see [`Proc::in_window`]).
    fn standing_name(&self, name: &str) -> Option<Option<u8>> {
        let fresh = self.pos.get() == self.log.borrow().len();
        let answer = self.stat(name);
        if fresh && answer.is_some() {
            if name == self.lock {
                self.kind.set(1);
            } else if name == self.record {
                self.kind.set(2);
            }
        }
        answer
    }
}

/// The transition lock's attempt (`lock_once_on`, the kernel's own) on the simulated
/// directory: the open of `<stem>.lock` (creating it) is a step, its `flock` runs with it; a
/// kept descriptor's `flock` is a step of its own; each stat of the path is a step; a wait is
/// a step not enabled while another description holds the lock (the kernel's `flock` waits).
impl<'a> LockSteps for &'a Sim<'a> {
    type Lock = SimFile<'a>;

    /// Never fails: the faults configuration fails the transaction's steps (`Dir::fault`),
    /// not the attempt's (before its `flock`, or after it, which drops the lock taken): those
    /// are left to the fault-injection tests. (A failure at a kept descriptor's first point
    /// falls in the step that ended the call before, which the ghost would charge.)
    fn fault(&self, _: FaultPoint, _: &Path) -> Result<(), Error> {
        Ok(())
    }

    fn open_lock(&self, path: &Path) -> Result<SimFile<'a>, Error> {
        let n = name(path);
        let desc = self.next_desc();
        let answer = self.call(true, |f| {
            let ino = match f.names.get(&n) {
                Some(&ino) => ino,
                None => {
                    let ino = f.make(Vec::new());
                    f.names.insert(n.clone(), ino);
                    ino
                }
            };
            f.open.insert(desc, ino);
            Some(Answer::Open(Some(ino)))
        });
        match answer {
            Some(Answer::Open(ino)) => {
                self.just_opened.set(Some(desc));
                self.file(ino).ok_or_else(|| over(path))
            }
            _ => Err(over(path)),
        }
    }

    fn try_lock(&self, lock: &SimFile<'a>) -> io::Result<bool> {
        // With its open, one step (an actor between them only makes the lock busy or land on
        // a file the check finds moved).
        let visible = self.just_opened.take() != Some(lock.desc);
        let (ino, desc) = (lock.ino, lock.desc);
        let shared = self.planted == Some(Planted::SharedFlock);
        match self.call(visible, |f| {
            let free = shared || f.locked.get(&ino).is_none_or(|d| *d == desc);
            if free {
                f.locked.insert(ino, desc);
            }
            Some(Answer::Bool(free))
        }) {
            Some(Answer::Bool(b)) => Ok(b),
            _ => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn wait_lock(&self, lock: &SimFile<'a>, _: Option<Instant>) -> io::Result<bool> {
        let (ino, desc) = (lock.ino, lock.desc);
        match self.call(true, |f| {
            if f.locked.get(&ino).is_some_and(|d| *d != desc) {
                return None;
            }
            f.locked.insert(ino, desc);
            Some(Answer::Done)
        }) {
            Some(_) => Ok(true),
            None => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn at(&self, lock: &SimFile<'a>, path: &Path) -> io::Result<Option<i64>> {
        // A stat of the path (not the commit check's: it opens no window, so the cleaner may
        // act while the attempt waits, and right after its check).
        match self.stat(&name(path)) {
            // The model has no modification times: a lock is never old.
            Some(here) => Ok((here == Some(lock.ino)).then_some(0)),
            None => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn keep_fresh(&self, _: &SimFile<'a>, _: i64) {}
}

impl<'a> Dir for &'a Sim<'a> {
    type File = SimFile<'a>;

    fn fault(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        // Logged (a replay fails the same point); the process's own until its step acts.
        let fails = self.call(false, |_| Some(Answer::Bool(self.armed.replace(false))));
        match fails {
            Some(Answer::Bool(false)) => Ok(()),
            Some(_) => Err(Error::Io {
                op: "model fault",
                path: path.to_owned(),
                source: io::Error::from_raw_os_error(28),
            }),
            None => {
                let _ = point;
                Err(over(path))
            }
        }
    }

    fn now(&self) -> Timestamp {
        // Its own (the clock steps between steps), and logged: a replay reads what it read.
        let now = match self.call(false, |_| Some(Answer::Now(self.now))) {
            Some(Answer::Now(now)) => now,
            _ => self.now,
        };
        Timestamp::from_unix_secs(now).expect("the model's clock is in range")
    }

    fn durable(&self) -> bool {
        true
    }

    fn shares(&self) -> bool {
        false
    }

    fn tags_records(&self) -> bool {
        true
    }

    fn sweeps(&self) -> MutexGuard<'_, Sweeps> {
        self.sweeps.lock().expect("one thread")
    }

    fn fresh_tag(&self) -> LiveTag {
        let n = self.tags.get();
        self.tags.set(n + 1);
        // A crashed process never runs again: its number and a count make a tag no other
        // file carries, the same in every replay.
        LiveTag((u64::from(self.me) << 32) | n)
    }

    fn open(&self, path: &Path, access: Access) -> Result<SimFile<'a>, Error> {
        let n = name(path);
        let desc = self.next_desc();
        let creates = matches!(access, Access::Temp | Access::LiveCreate);
        // A fresh name of its own is the process's own; any other name is shared.
        let answer = self.call(!creates, |f| {
            let ino = if creates {
                // O_EXCL: never a file found at the name.
                if f.names.contains_key(&n) {
                    return Some(Answer::Refused(true));
                }
                let ino = f.make(Vec::new());
                f.names.insert(n.clone(), ino);
                Some(ino)
            } else {
                f.names.get(&n).copied()
            };
            if let Some(ino) = ino {
                f.open.insert(desc, ino);
            }
            Some(Answer::Open(ino))
        });
        match answer {
            Some(Answer::Open(Some(ino))) => Ok(self.file(Some(ino)).expect("an inode")),
            Some(Answer::Refused(true)) => Err(Error::Io {
                op: "open",
                path: path.to_owned(),
                source: io::Error::from(io::ErrorKind::AlreadyExists),
            }),
            Some(Answer::Open(None)) => Err(Error::Io {
                op: "open",
                path: path.to_owned(),
                source: io::Error::from(io::ErrorKind::NotFound),
            }),
            _ => Err(over(path)),
        }
    }

    fn read(&self, file: &SimFile<'a>) -> io::Result<Vec<u8>> {
        // Contents never change once a name is given to them: the process's own. Logged, since
        // the inode's number may be given to another file once this one is closed.
        let ino = file.ino;
        // An open description keeps its inode: the bytes are there.
        match self.call(false, |f| {
            Some(Answer::Bytes(
                f.inodes.get(&ino).cloned().unwrap_or_default(),
            ))
        }) {
            Some(Answer::Bytes(bytes)) => Ok(bytes),
            _ => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn peek(&self, file: &SimFile<'a>, buf: Option<&mut [u8]>) -> io::Result<Peeked> {
        let Some(buf) = buf else {
            return Ok(Peeked::File(0));
        };
        let bytes = self.read(file)?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(Peeked::File(n))
    }

    fn identity(&self, file: &SimFile<'a>) -> io::Result<(u64, u64)> {
        Ok((0, u64::from(file.ino)))
    }

    fn standing(&self, path: &Path) -> io::Result<Option<(u64, u64)>> {
        match self.standing_name(&name(path)) {
            Some(ino) => Ok(ino.map(|i| (0, u64::from(i)))),
            None => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn write(&self, file: &SimFile<'a>, bytes: &[u8]) -> io::Result<()> {
        let ino = file.ino;
        self.call(false, |f| {
            f.inodes.insert(ino, bytes.to_vec());
            Some(Answer::Done)
        })
        .map(drop)
        .ok_or_else(|| io::Error::other("the model's step ends here"))
    }

    fn sync(&self, file: &SimFile<'a>) -> io::Result<()> {
        // Its own file, before any name of it is published.
        let ino = file.ino;
        self.call(false, |f| {
            let bytes = f.inodes.get(&ino).cloned().unwrap_or_default();
            f.durable_data.insert(ino, bytes);
            Some(Answer::Done)
        })
        .map(drop)
        .ok_or_else(|| io::Error::other("the model's step ends here"))
    }

    fn try_lock(&self, file: &SimFile<'a>) -> io::Result<bool> {
        // Only on a new file of its own, under a fresh name.
        let (ino, desc) = (file.ino, file.desc);
        match self.call(false, |f| {
            let free = !f.locked.contains_key(&ino);
            if free {
                f.locked.insert(ino, desc);
            }
            Some(Answer::Bool(free))
        }) {
            Some(Answer::Bool(b)) => Ok(b),
            _ => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn holder_gone(&self, file: &SimFile<'a>) -> io::Result<bool> {
        let (ino, desc) = (file.ino, file.desc);
        match self.call(true, |f| {
            Some(Answer::Bool(f.locked.get(&ino).is_none_or(|d| *d == desc)))
        }) {
            Some(Answer::Bool(b)) => Ok(b),
            _ => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn unlock(&self, file: &SimFile<'a>) -> io::Result<()> {
        let (ino, desc) = (file.ino, file.desc);
        self.call(true, |f| {
            if f.locked.get(&ino) == Some(&desc) {
                f.locked.remove(&ino);
            }
            Some(Answer::Done)
        })
        .map(drop)
        .ok_or_else(|| io::Error::other("the model's step ends here"))
    }

    fn place_new(&self, from: &Path, to: &Path) -> Result<bool, Error> {
        let (from_name, to_name) = (name(from), name(to));
        match self.call(true, |f| {
            if f.names.contains_key(&to_name) {
                return Some(Answer::Bool(false));
            }
            let Some(ino) = f.names.remove(&from_name) else {
                return Some(Answer::Refused(false));
            };
            f.names.insert(to_name.clone(), ino);
            Some(Answer::Bool(true))
        }) {
            Some(Answer::Bool(b)) => Ok(b),
            Some(_) => Err(Error::Io {
                op: "rename",
                path: to.to_owned(),
                source: io::Error::from(io::ErrorKind::NotFound),
            }),
            None => Err(over(to)),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_name, to_name) = (name(from), name(to));
        let answer = self.call(true, |f| {
            let Some(ino) = f.names.remove(&from_name) else {
                return Some(Answer::Bool(false));
            };
            f.names.insert(to_name.clone(), ino);
            f.collect();
            Some(Answer::Bool(true))
        });
        match answer {
            Some(Answer::Bool(true)) => Ok(()),
            Some(_) => Err(io::Error::from(io::ErrorKind::NotFound)),
            None => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn unlink(&self, path: &Path) -> io::Result<()> {
        let n = name(path);
        let answer = self.call(true, |f| {
            let gone = f.names.remove(&n).is_some();
            f.collect();
            Some(Answer::Bool(gone))
        });
        match answer {
            Some(Answer::Bool(true)) => Ok(()),
            Some(_) => Err(io::Error::from(io::ErrorKind::NotFound)),
            None => Err(io::Error::other("the model's step ends here")),
        }
    }

    fn sync_dir(&self) -> io::Result<()> {
        // Seen by a host crash: what the disk has changes.
        self.call(true, |f| {
            f.durable_names = f.names.clone();
            f.collect();
            Some(Answer::Done)
        })
        .map(drop)
        .ok_or_else(|| io::Error::other("the model's step ends here"))
    }

    fn list(&self, each: &mut dyn FnMut(&OsStr)) -> Option<usize> {
        let answer = self.call(true, |f| {
            Some(Answer::Names(f.names.keys().cloned().collect()))
        });
        let Some(Answer::Names(names)) = answer else {
            return None;
        };
        for n in &names {
            each(OsStr::new(n));
        }
        Some(names.len())
    }
}

/// What one step of a process did.
struct Stepped {
    /// The process's log after the step (`None`: the step blocked).
    log: Option<Vec<(u32, Answer)>>,
    /// The outcomes of its script's calls that ended, in order (a skipped call: `None`).
    ended: Vec<Option<Result<Outcome, ()>>>,
    /// After each of those calls, whether the instance's held flag (`held_at`) said it held
    /// the id.
    says_held: Vec<bool>,
    /// After each of those calls, with no caller in the instance's entry for the id: whether
    /// the registry would prune it (`driver::keeps` of the slot's `Idle`), whether the slot
    /// owes a sweep, and how many locks the process holds in the directory.
    between: Vec<(bool, bool, usize)>,
    /// Its visible call (see `Sim::kind`).
    kind: u8,
    /// Whether it holds its transition lock at the step's end.
    holding: bool,
    /// The armed fault failed a step.
    fired: bool,
}

/// Runs process `me`'s history (`script`, from its start) on `files`, its earlier calls
/// answered from `log`, to the end of its next step.
fn run_step(
    files: &RefCell<Files>,
    me: u8,
    proc: &Proc,
    script: &[Call],
    now: i64,
    planted: Option<Planted>,
    fail: bool,
) -> Stepped {
    let id = SessionId::new(ID).expect("a valid id");
    let owner = Owner::new(format!("p{me}")).expect("a valid owner");
    let sim = Sim {
        files,
        me,
        log: RefCell::new(proc.log.clone()),
        pos: Cell::new(0),
        opened: Cell::new(0),
        tags: Cell::new(0),
        made: Cell::new(false),
        over: Cell::new(false),
        blocked: Cell::new(false),
        armed: Cell::new(fail),
        kind: Cell::new(0),
        holding: Cell::new(false),
        record: record_name().to_owned(),
        now,
        planted,
        sweeps: Mutex::default(),
        lock: lock_name().to_owned(),
        just_opened: Cell::new(None),
    };
    let mut slot: Slot<SimFile<'_>> = Slot::new(Path::new(DIR), &id);
    let held = AtomicI64::new(i64::MIN);
    let mut ended = Vec::new();
    let mut says_held = Vec::new();
    let mut between = Vec::new();
    let judged = |slot: &Slot<SimFile<'_>>| {
        let locks = (files.borrow().locked.values())
            .filter(|d| d.0 == me)
            .count();
        (!keeps(false, slot.idle()), slot.owes_sweep(), locks)
    };
    let mut kept: Option<SimFile<'_>> = None;
    let mut token = None;
    for call in script {
        let event = match (call, token) {
            (Call::Acquire, _) => Event::Acquire {
                owner: owner.clone(),
            },
            (Call::Renew, Some(token)) => Event::Renew {
                owner: owner.clone(),
                token,
            },
            (Call::Release, Some(token)) => Event::Release {
                owner: owner.clone(),
                token,
            },
            (_, None) => {
                ended.push(None);
                says_held.push(false);
                between.push(judged(&slot));
                continue;
            }
        };
        // The transition lock, through the front's loop: attempt after attempt until it is
        // the file at the path (no deadline: a blocked attempt waits).
        let lock_path = Path::new(DIR).join(&sim.lock);
        let timeout = || Error::LockTimeout {
            lock: LockOf::File(lock_path.clone()),
            waited: Duration::ZERO,
        };
        let taken = begin_or_wait(None, timeout, || {
            lock_once_on(&&sim, &lock_path, kept.take(), None)
        });
        if sim.over.get() {
            break;
        }
        let Ok(stable) = taken else {
            ended.push(Some(Err(())));
            says_held.push(held_at(
                &held,
                Timestamp::from_unix_secs(now).expect("in range"),
            ));
            between.push(judged(&slot));
            continue;
        };
        sim.holding.set(true);
        let mut st = slot.begin();
        let id_of = (0, u64::from(stable.ino));
        let (outcome, _) = flocklease::driver::run(
            &mut FlockTx::new(&sim, &held, &mut slot, (&stable, id_of), &mut st),
            &id,
            Duration::from_secs(TTL as u64),
            event,
        );
        // Given back as the kernel's adapter does: unlocked, its descriptor kept for the next
        // transition; else closed.
        if slot.end(&held, &mut st, || (&sim).unlock(&stable).is_ok()) {
            kept = Some(stable);
        } else {
            drop(stable);
        }
        if sim.over.get() {
            break;
        }
        sim.holding.set(false);
        if let Ok(Outcome::Granted { token: t, .. }) = &outcome {
            token = Some(*t);
        }
        ended.push(Some(outcome.map_err(drop)));
        says_held.push(held_at(
            &held,
            Timestamp::from_unix_secs(now).expect("in range"),
        ));
        between.push(judged(&slot));
    }
    // The run is over, its values dropped after it: nothing more acts.
    sim.over.set(true);
    drop(kept);
    drop(slot);
    Stepped {
        log: (!sim.blocked.get()).then(|| sim.log.take()),
        ended,
        says_held,
        between,
        kind: sim.kind.get(),
        holding: sim.holding.get(),
        fired: fail && !sim.armed.get(),
    }
}

impl ProgramModel {
    /// Process `p`'s next step (`fail`: its first fault point fails); `None` when it blocks
    /// (or, with `fail`, reaches no fault point).
    fn step(&self, s: &mut ProgramState, p: u8, fail: bool) -> Option<()> {
        let i = usize::from(p);
        let record = record_name();
        let record_before = s.files.names.get(record).copied();
        let files = RefCell::new(std::mem::take(&mut s.files));
        let stepped = run_step(
            &files,
            p,
            &s.procs[i],
            &self.scripts[i],
            s.now,
            self.planted,
            fail,
        );
        s.files = files.into_inner();
        let log = stepped.log?;
        // A release gives the grant up from its first step on.
        if self.scripts[i].get(s.procs[i].done) == Some(&Call::Release) {
            s.procs[i].holds = None;
        }
        s.procs[i].log = log;
        s.procs[i].holding = stepped.holding;
        if fail && !stepped.fired {
            // No fault point in this step: the same as its step without a fault.
            return None;
        }
        s.procs[i].faulted |= stepped.fired;
        // This step committed a record naming this process: its generation's file is the
        // one the record names (until the cleaner deletes one).
        if s.files.names.get(record).copied() != record_before
            && s.files
                .record(record)
                .is_some_and(|r| r.owner == format!("p{p}"))
            && !s.procs[i].disturbed
        {
            s.procs[i].clean = true;
        }
        if !s.procs[i].started {
            s.procs[i].after_crash = s.crashed_holder.is_some();
        }
        if s.overlap.is_some() {
            // Two transitions overlap (the cleaner removed a running one's lock): what either
            // does to the other's files is excused, until the one whose lock it was ends.
            s.procs[i].lock_removed = true;
            for proc in &mut s.procs {
                proc.clean = false;
            }
        }
        // The window runs from a stat of the lock through the stat of the record to the
        // rename; any other visible call ends it.
        match stepped.kind {
            1 => s.procs[i].in_window = true,
            2 => {}
            _ => s.procs[i].in_window = false,
        }
        s.procs[i].started = true;
        // The record's token, judged after every step that may have renamed one into place.
        if let Some(r) = s.files.record(record) {
            if s.max_token.is_some_and(|m| r.token < m) {
                s.went_back = true;
            }
            s.max_token = s.max_token.max(Some(r.token));
        }
        let done = s.procs[i].done;
        for (k, outcome) in stepped.ended.iter().enumerate().skip(done) {
            let call = self.scripts[i][k];
            let proc = &mut s.procs[i];
            proc.done = k + 1;
            proc.started = false;
            proc.disturbed = false;
            if matches!(outcome, Some(Err(()))) && !proc.lock_removed && !proc.faulted {
                s.failed = true;
            }
            proc.faulted = false;
            // What it keeps locked after a call: after a grant its generation's liveness file
            // alone, after a release nothing (a call that overlapped another transition is not
            // judged: each may publish a file the other's sweep deletes, whose lock goes at a
            // later transition).
            // No call leaves a temporary file of its own behind (a failed commit's undo
            // removes its temporary record; a publish renames its file or removes it).
            if s.files.names.keys().any(|n| temporary_of(n) == Some(p)) {
                s.left_temporary = true;
            }
            let locks = s.files.locked.values().filter(|d| d.0 == p).count();
            match outcome {
                _ if proc.lock_removed => {}
                Some(Ok(Outcome::Granted { .. })) if locks > 1 => s.kept_locked = true,
                Some(Ok(Outcome::Released)) if locks > 0 => s.kept_locked = true,
                _ => {}
            }
            // The registry, pruning between calls, drops the instance's entry for the id
            // exactly when that loses nothing: no lock held (a liveness lock would go with
            // it), no sweep owed (a leftover would stay for good); and keeps it otherwise
            // (memory bounded by the ids in use).
            let (prunable, owes_sweep, held) = stepped.between[k];
            if !proc.lock_removed && prunable == (held > 0 || owes_sweep) {
                s.pruned_wrong = true;
            }
            proc.lock_removed = false;
            if s.overlap == Some(p) {
                s.overlap = None;
            }
            // The held flag, which a waiting acquire's look reads: held after a grant, not
            // after a release.
            match outcome {
                Some(Ok(Outcome::Granted { expiry, .. }))
                    if !stepped.says_held[k]
                        && expiry.unix_nanos() / 1_000_000_000 > s.now.into() =>
                {
                    s.held_wrong = true;
                }
                Some(Ok(Outcome::Released)) if stepped.says_held[k] => s.held_wrong = true,
                _ => {}
            }
            if call == Call::Acquire
                && matches!(outcome, Some(Ok(Outcome::Held)))
                && proc.after_crash
                && s.crashed_holder.is_some()
            {
                s.not_replaced = true;
            }
            if let Some(Ok(Outcome::Granted { token, expiry })) = outcome {
                s.max_returned = s.max_returned.max(Some(*token));
                if s.crashed_holder.take().is_some() {
                    s.replaced_crashed = true;
                }
                let expiry_secs =
                    i64::try_from(expiry.unix_nanos() / 1_000_000_000).unwrap_or(i64::MAX);
                let late = proc.holds.is_some_and(|(_, e)| e <= s.now);
                if call == Call::Renew && late {
                    s.renewed_late = true;
                }
                proc.holds = Some((*token, expiry_secs));
                // An expired grant is one nobody may act on (the front answers it lost): only
                // a live one is judged.
                if expiry_secs <= s.now {
                    continue;
                }
                match s.last_grant {
                    Some((t, q)) if q != p && *token <= t => s.unfenced = true,
                    Some((t, _)) if *token < t => s.unfenced = true,
                    _ => {}
                }
                s.last_grant = Some((*token, p));
            }
        }
        Some(())
    }

    /// Whether process `p` has a call to make.
    fn active(&self, s: &ProgramState, p: usize) -> bool {
        !s.procs[p].crashed && s.procs[p].done < self.scripts[p].len()
    }
}

impl Model for ProgramModel {
    type State = ProgramState;
    type Action = ProgramAction;

    fn init_states(&self) -> Vec<ProgramState> {
        vec![ProgramState {
            files: Files::default(),
            procs: vec![
                Proc {
                    log: Vec::new(),
                    done: 0,
                    crashed: false,
                    holds: None,
                    in_window: false,
                    started: false,
                    holding: false,
                    after_crash: false,
                    clean: false,
                    disturbed: false,
                    lock_removed: false,
                    faulted: false,
                };
                self.scripts.len()
            ],
            now: START,
            ticks: self.ticks,
            crashes: self.crashes,
            cleaner: self.cleaner,
            max_token: None,
            last_grant: None,
            went_back: false,
            unfenced: false,
            replaced_crashed: false,
            renewed_late: false,
            crashed_holder: None,
            not_replaced: false,
            max_returned: None,
            lost: false,
            failed: false,
            overlap: None,
            held_wrong: false,
            kept_locked: false,
            pruned_wrong: false,
            left_temporary: false,
        }]
    }

    fn actions(&self, s: &ProgramState, actions: &mut Vec<ProgramAction>) {
        for p in 0..s.procs.len() {
            let pid = u8::try_from(p).expect("few processes");
            if self.active(s, p) {
                actions.push(ProgramAction::Step(pid));
                if self.faults && s.crashes > 0 {
                    actions.push(ProgramAction::Fault(pid));
                }
            }
            // A crash closes what the process holds: only one that holds something matters.
            if s.crashes > 0
                && !s.procs[p].crashed
                && (s.procs[p].holds.is_some() || s.procs[p].started)
            {
                actions.push(ProgramAction::Crash(pid));
            }
        }
        if s.crashes > 0 {
            actions.push(ProgramAction::HostCrash);
        }
        if s.ticks > 0 {
            actions.push(ProgramAction::Tick);
        }
        let lock = lock_name();
        if s.cleaner > 0 && s.files.names.contains_key(lock) && !s.procs.iter().any(|p| p.in_window)
        {
            actions.push(ProgramAction::DeleteLock);
        }
        if s.cleaner > 0 && s.files.names.keys().any(|n| n.ends_with(".live")) {
            actions.push(ProgramAction::DeleteLive);
        }
    }

    fn next_state(&self, last: &ProgramState, action: ProgramAction) -> Option<ProgramState> {
        let mut s = last.clone();
        match action {
            ProgramAction::Step(p) => self.step(&mut s, p, false)?,
            ProgramAction::Crash(p) => {
                s.crashes -= 1;
                // A holder — the record names it, unexpired — whose last commit came after the
                // cleaner's last deletion of a liveness file: its end is what a rival's probe
                // sees at once (PROTOCOL §5), whether its call returned or not.
                let named = s.files.record(record_name());
                if let Some(r) = named
                    && r.owner == format!("p{p}")
                    && r.expiry.unix_nanos() / 1_000_000_000 > i128::from(s.now)
                    && s.procs[usize::from(p)].clean
                    && s.overlap.is_none()
                {
                    s.crashed_holder = Some(r.token);
                }
                s.files.close_all(p);
                if s.overlap == Some(p) {
                    s.overlap = None;
                }
                let proc = &mut s.procs[usize::from(p)];
                proc.crashed = true;
                proc.holds = None;
                proc.log.clear();
                proc.in_window = false;
            }
            ProgramAction::HostCrash => {
                s.crashes -= 1;
                s.files.host_crash();
                for proc in &mut s.procs {
                    proc.crashed = true;
                    proc.holds = None;
                    proc.log.clear();
                    proc.in_window = false;
                }
                s.crashed_holder = None;
                // What the disk has: a returned grant's commit was fsynced, so it is there
                // (or a later one).
                let token = s.files.record(record_name()).map(|r| r.token);
                if s.max_returned.is_some_and(|m| token.is_none_or(|t| t < m)) {
                    s.lost = true;
                }
                // A commit whose call had not returned may be lost: judged from the disk on.
                s.max_token = token;
            }
            ProgramAction::Fault(p) => {
                s.crashes -= 1;
                self.step(&mut s, p, true)?;
            }
            ProgramAction::Tick => {
                s.ticks -= 1;
                s.now += TTL + 1;
            }
            ProgramAction::DeleteLock => {
                s.cleaner -= 1;
                let ino = s.files.names.get(lock_name());
                // A process that has taken it (an attempt still checking it only retries).
                if let Some(d) = ino.and_then(|i| s.files.locked.get(i))
                    && s.procs[usize::from(d.0)].holding
                {
                    s.procs[usize::from(d.0)].lock_removed = true;
                    s.overlap = Some(d.0);
                    // Two transitions may overlap now: a crashed holder's file may be taken.
                    s.crashed_holder = None;
                }
                s.files.names.remove(lock_name());
                s.files.collect();
            }
            ProgramAction::DeleteLive => {
                s.cleaner -= 1;
                s.crashed_holder = None;
                for proc in &mut s.procs {
                    proc.clean = false;
                    proc.disturbed |= proc.started;
                }
                let live = s
                    .files
                    .names
                    .keys()
                    .filter(|n| n.ends_with(".live"))
                    .max_by_key(|n| n.rsplit('.').nth(1).and_then(|t| t.parse::<u64>().ok()));
                let live = live.cloned()?;
                s.files.names.remove(&live);
                s.files.collect();
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ONE_HOLDER, |_, s: &ProgramState| {
                s.procs
                    .iter()
                    .filter(|p| p.holds.is_some_and(|(_, e)| e > s.now))
                    .count()
                    <= 1
            }),
            Property::always(NAMED, |_, s: &ProgramState| {
                let r = s.files.record(record_name());
                s.procs.iter().enumerate().all(|(i, p)| match p.holds {
                    Some((t, e)) if e > s.now => r
                        .as_ref()
                        .is_some_and(|r| r.token == t && r.owner == format!("p{i}")),
                    _ => true,
                })
            }),
            Property::always(NEVER_BACK, |_, s: &ProgramState| !s.went_back),
            Property::always(AT_ONCE, |_, s: &ProgramState| !s.not_replaced),
            Property::always(DURABLE, |_, s: &ProgramState| !s.lost),
            Property::always(ANSWERS, |_, s: &ProgramState| !s.failed),
            Property::eventually(PROGRESS, |m: &ProgramModel, s: &ProgramState| {
                (s.procs.iter().zip(&m.scripts))
                    .all(|(p, script)| p.crashed || p.done == script.len())
            }),
            Property::always(FENCED, |_, s: &ProgramState| !s.unfenced),
            Property::always(HELD_FLAG, |_, s: &ProgramState| !s.held_wrong),
            Property::always(GIVEN_BACK, |_, s: &ProgramState| !s.kept_locked),
            Property::always(NO_LEFTOVER, |_, s: &ProgramState| !s.left_temporary),
            Property::always(PRUNED, |_, s: &ProgramState| !s.pruned_wrong),
            Property::sometimes(REPLACED, |_, s: &ProgramState| s.replaced_crashed),
            Property::sometimes(LATE_RENEW, |_, s: &ProgramState| s.renewed_late),
        ]
    }
}

impl fmt::Display for ProgramState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}", self.now - START)?;
        for (n, ino) in &self.files.names {
            let lock = self
                .files
                .locked
                .get(ino)
                .map_or(String::new(), |d| format!(" locked by p{}", d.0));
            write!(f, " | {n} #{ino}{lock}")?;
        }
        // A lock on a file no name reaches any more (deleted, or replaced).
        for (ino, d) in &self.files.locked {
            if !self.files.names.values().any(|i| i == ino) {
                write!(f, " | #{ino} (no name) locked by p{}", d.0)?;
            }
        }
        for (i, p) in self.procs.iter().enumerate() {
            write!(f, " | p{i} done {}", p.done)?;
            if let Some((t, e)) = p.holds {
                write!(f, " holds {t} until t={}", e - START)?;
            }
            if p.crashed {
                write!(f, " crashed")?;
            }
        }
        Ok(())
    }
}

impl SmallModel for ProgramModel {
    type Planted = Planted;
    const CONFIG: &'static str = "flock-program";
    const TITLE: &'static str = "the flock adapter's transaction";
    const PLANTED: &'static [(&'static str, Planted)] = &[("shared-flock", Planted::SharedFlock)];

    fn planted_mut(&mut self) -> Option<&mut Option<Planted>> {
        Some(&mut self.planted)
    }

    /// Faults beside crashes, without the cleaner (with it, about three million states more).
    fn alongside(&self) -> Vec<Self> {
        if self.faults || self.planted.is_some() {
            return Vec::new();
        }
        vec![ProgramModel {
            cleaner: 0,
            faults: true,
            ..self.clone()
        }]
    }

    /// Two acquires and nothing else: enough for two holders, and small enough to explore
    /// whole (the default configuration with a shared lock runs into millions of states).
    fn shown_in(_planted: Planted) -> Option<Self> {
        Some(ProgramModel {
            scripts: vec![vec![Call::Acquire], vec![Call::Acquire]],
            crashes: 0,
            ticks: 0,
            cleaner: 0,
            faults: false,
            planted: None,
        })
    }

    fn header(&self) -> String {
        let scripts: Vec<String> = self
            .scripts
            .iter()
            .enumerate()
            .map(|(i, s)| format!("p{i} {s:?}"))
            .collect();
        format!(
            "the flock adapter's own transaction (FlockTx, driver::run) on a simulated lease \
             directory: {}; {} {}, {} clock step(s) past the TTL, a cleaner deleting \
             <stem>.lock or a liveness file {} time(s)",
            scripts.join(", "),
            self.crashes,
            if self.faults {
                "crash(es) or failed step(s) (ENOSPC)"
            } else {
                "crash(es)"
            },
            self.ticks,
            self.cleaner
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness;

    #[test]
    fn the_default_configuration_holds() {
        // Pinned: a change to the actors, the adapter or the machine that moves it must say
        // why. 569 805 before the host crash and what the disk keeps were modelled; 704 035
        // with them; 555 193 with property ANSWERS, the lock's open and flock one step, and
        // the lock taken through the front's loop; 561 160 with a crashed holder judged from
        // the record (its call need not have returned) and the ghost's unused token gone;
        // 605 253 with the transition lock's descriptor kept between transitions, as the
        // kernel's adapter keeps it (each process's stays open); 2 504 345 with the attempt
        // the library's own (`lock_once_on`: a busy lock's stat and wait are steps, and an
        // attempt at a busy lock no longer at the path gives up and opens the path again);
        // 3 779 336 with the attempt's stats opening no window (the cleaner acts while a
        // process waits).
        harness::assert_holds(ProgramModel::default(), 3_779_336);
    }

    #[test]
    fn failed_steps_leave_nothing_behind() {
        // Pinned likewise: faults beside crashes, without the cleaner. It found a fault before
        // the temporary record's write (the seam the tests fail it through) leaving the
        // created file behind, unknown to the undo.
        let faults = ProgramModel::default().alongside();
        assert_eq!(faults.len(), 1);
        // 20 370 before the attempt was the library's own.
        harness::assert_holds(faults[0].clone(), 104_209);
    }

    #[test]
    fn a_shared_flock_lets_two_transitions_run_at_once() {
        // Two transitions at once: the second's publish of the same generation finds the
        // first's file locked and fails, which nothing excuses.
        harness::assert_caught::<ProgramModel>(Planted::SharedFlock, ANSWERS);
    }
}
