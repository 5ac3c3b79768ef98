//! A [stateright] model of flocklease at the granularity of its I/O: N lease-manager
//! processes on one host sharing one session id's record, temporary file, transition lock and
//! liveness locks, with a ticking clock, process crashes between any two I/O steps, failing
//! steps, an operator deleting a liveness file and a host crash.
//!
//! Every call is a [`flocklease::driver::Run`] — the very interpreter the real adapters use —
//! and every model action advances one process's run by **one I/O step** (lock the transition
//! lock, read, probe, lock the new generation, write the temporary file, fsync it, rename it,
//! fsync the directory, clean up, adopt, unlock), over [`ModelTx`], which maps each step onto
//! this model's state as `FlockLease` maps it onto files. The order of the steps is the
//! driver's; no lease decision is made here: the model records what happened, and checks it.
//!
//! The safety properties are SPEC §6 ([`props`]). A call's properties are judged when it
//! ends, against what it read under the lock, and leave a mark in [`State::violations`] for an
//! `always` property to see. `sometimes` properties show that each scenario is reachable.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use flocklease::driver::{Io, Run, Step};
use flocklease::machine::{Event, Local, Outcome};
use flocklease::{Error, Owner, Record, SessionId, Timestamp};
use stateright::{Model, Property};

pub mod props;
pub mod report;
mod tx;

pub use tx::{Ghost, ModelTx, Seen};

/// Which backend's primitives the model gives the processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Files and `flock(2)`: a liveness lock lasts as long as its process.
    Flock,
    /// PostgreSQL: liveness is a session advisory lock on the holder's connection, which can
    /// be lost while the holder runs; there is no liveness file to delete.
    Postgres,
}

/// The model's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseModel {
    /// The configuration's name, for reports.
    pub name: &'static str,
    /// Number of lease-manager processes (2 by default, up to 3).
    pub procs: usize,
    /// The clock runs from tick 0 to this tick.
    pub max_time: u8,
    /// The lease TTL, in ticks.
    pub ttl_ticks: u8,
    /// No call starts once the record's token exceeds this (calls under way finish, and every
    /// state is checked).
    pub max_token: u64,
    /// How many I/O steps may fail (any fallible step of any call).
    pub faults: u8,
    /// Whether a host crash (every process dies, what was not durable is lost) can happen, once.
    pub host_crash: bool,
    /// Whether an operator (or a tmp cleaner) may delete the current generation's liveness file,
    /// once — a vanished file is not proof of death.
    pub cleaner: bool,
    /// Whether the adapter fsyncs (`Durability::Full`). With `false`, a host crash can bring
    /// back an older token.
    pub durable: bool,
    /// Whether every process uses the same owner string (SPEC §3.1: still foreign to each other).
    pub shared_owner: bool,
    /// The backend.
    pub backend: Backend,
    /// PostgreSQL: how many times a holder's liveness connection may drop while it runs.
    pub liveness_losses: u8,
}

/// The named configurations `check --config NAME` knows.
pub const CONFIGS: [&str; 4] = ["default", "large", "shared-owner", "postgres"];

impl Default for LeaseModel {
    /// The default configuration: what `check` runs and CI checks first.
    fn default() -> Self {
        LeaseModel {
            name: "default",
            procs: 2,
            max_time: 2,
            ttl_ticks: 2,
            max_token: 2,
            faults: 1,
            host_crash: true,
            cleaner: true,
            durable: true,
            shared_owner: false,
            backend: Backend::Flock,
            liveness_losses: 0,
        }
    }
}

impl LeaseModel {
    /// The named configuration `name` (see [`CONFIGS`]).
    pub fn named(name: &str) -> Option<LeaseModel> {
        let d = LeaseModel::default();
        Some(match name {
            "default" => d,
            // Longer histories: more ticks and one more generation.
            "large" => LeaseModel {
                name: "large",
                max_time: 3,
                max_token: 3,
                ..d
            },
            "shared-owner" => LeaseModel {
                name: "shared-owner",
                shared_owner: true,
                ..d
            },
            "postgres" => LeaseModel {
                name: "postgres",
                backend: Backend::Postgres,
                cleaner: false,
                host_crash: false,
                liveness_losses: 1,
                ..d
            },
            _ => return None,
        })
    }

    /// The owner string of process `p`.
    pub fn owner(&self, p: usize) -> Owner {
        if self.shared_owner {
            owner(0)
        } else {
            owner(p)
        }
    }
}

/// A process, as its own memory knows itself.
#[derive(Clone, Debug, Default)]
pub struct Proc {
    /// The generation whose liveness lock it keeps open.
    pub local: Option<Local>,
    /// The lease it believes it holds (from its last successful acquire or renew).
    pub lease: Option<LeaseView>,
    /// A lease it held earlier, kept to replay (a stale renew or release).
    pub stale: Option<LeaseView>,
    /// The call under way, if any.
    pub call: Option<Call>,
    /// PostgreSQL: the generation whose liveness connection dropped, until a call notices.
    pub lost: Option<u64>,
    /// For display only (not part of the state's identity): its last call and the answer.
    pub last: Option<(Kind, Said)>,
}

impl PartialEq for Proc {
    fn eq(&self, o: &Proc) -> bool {
        (&self.local, self.lease, self.stale, &self.call, self.lost)
            == (&o.local, o.lease, o.stale, &o.call, o.lost)
    }
}
impl Eq for Proc {}
impl Hash for Proc {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (&self.local, self.lease, self.stale, &self.call, self.lost).hash(h);
    }
}

/// A call under way: the driver's run and what the properties need to know about it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    /// What was called.
    pub kind: Kind,
    /// The lease it was called with (renew, release).
    pub view: Option<LeaseView>,
    /// The driver's progress.
    pub run: Run<u64>,
    /// What it saw and did.
    pub ghost: Ghost,
}

/// What a call answered, for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Said {
    /// Granted this token, expiring at this tick.
    Granted(u64, u8),
    /// Held (acquire) or lost (renew).
    Held,
    /// Released.
    Released,
    /// An error.
    Failed,
    /// Crashed during the call.
    Crashed,
}

/// What a process knows of a lease it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseView {
    /// The fencing token.
    pub token: u64,
    /// The expiry, in ticks.
    pub expiry: u8,
}

/// The temporary record file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Temp {
    /// What was written to it.
    pub record: Record,
    /// Whether its contents were fsynced.
    pub synced: bool,
}

/// The whole system.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The time, in ticks.
    pub now: u8,
    /// The record as every process sees it.
    pub record: Option<Record>,
    /// Whether the visible record's contents were fsynced before its rename.
    pub record_synced: bool,
    /// The record as it would be after a power loss.
    pub durable: Option<Record>,
    /// The temporary record file, if one exists.
    pub temp: Option<Temp>,
    /// The process holding the transition lock, if any.
    pub stable: Option<usize>,
    /// Liveness files by token: `Some(p)` while process `p` holds its lock, `None` when the
    /// file exists unlocked.
    pub live: BTreeMap<u64, Option<usize>>,
    /// Ghost: bit `t` is set once generation `t`'s liveness file was ever created.
    pub created: u32,
    /// The processes.
    pub procs: Vec<Proc>,
    /// Failing steps left to inject.
    pub faults_left: u8,
    /// Whether the host crash is still to come.
    pub host_crash_left: bool,
    /// Whether the cleaner's deletion is still to come.
    pub cleaner_left: bool,
    /// PostgreSQL: liveness losses left to inject.
    pub losses_left: u8,
    /// Ghost: the highest token ever reported granted to a caller.
    pub max_granted: u64,
    /// Ghost: the notable scenario the last step completed, if any.
    pub scenario: Option<Scenario>,
    /// Ghost: the call properties some call broke, one bit each
    /// ([`props::CALL_PROPERTIES`]).
    pub violations: u16,
}

impl State {
    fn was_created(&self, token: u64) -> bool {
        token >= 32 || self.created & (1 << token) != 0
    }

    fn note_created(&mut self, token: u64) {
        if token < 32 {
            self.created |= 1 << token;
        }
    }
}

/// A notable scenario, for the `sometimes` properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// An acquire took over the lease of a crashed holder before its expiry.
    TakeoverAfterCrash,
    /// An acquire took over an expired lease whose holder still runs.
    TakeoverOfExpiredRunningHolder,
    /// A renew succeeded for a lease that had expired (the holder was suspended).
    RenewAfterSuspension,
    /// A stale release ran while a successor held the lease.
    StaleReleaseAfterSuccessor,
    /// A lease was granted after a host crash.
    GrantAfterHostCrash,
    /// A failed step left the process able to retry.
    FailedStep,
    /// An acquire was refused although the holder's liveness file had vanished: the unexpired
    /// record still protected the holder.
    HeldDespiteMissingFile,
    /// A process crashed after its rename and before its call ended.
    CrashAfterCommit,
    /// PostgreSQL: a rival took over while the old holder, its liveness lost, still ran.
    TakeoverAfterLivenessLoss,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Process `p` calls: the call takes the transition lock (its first I/O step).
    Call(usize, Kind),
    /// Process `p` performs the next I/O step of its call (named for the reader: it is the
    /// one its run schedules next).
    Step(usize, Io),
    /// Process `p` performs the next I/O step of its call, and that step fails.
    Fail(usize, Io),
    /// Process `p` crashes and restarts with no local state, keeping only a copy of its last
    /// lease to replay.
    Crash(usize),
    /// The clock ticks.
    Tick,
    /// The host crashes: every process dies, undurable writes are lost.
    HostCrash,
    /// An operator deletes the liveness file of the recorded generation.
    DeleteLiveFile,
    /// PostgreSQL: process `p`'s liveness connection drops; the server releases its lock.
    LoseLiveness(usize),
}

/// What a process calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Acquire.
    Acquire,
    /// Renew its current lease.
    Renew,
    /// Release its current lease.
    Release,
    /// Renew the stale lease it kept.
    RenewStale,
    /// Release the stale lease it kept.
    ReleaseStale,
}

/// The owner string of process `p` (when owners are not shared).
pub fn owner(p: usize) -> Owner {
    // "p0", "p1", ... are valid owners: non-empty, short, no control characters.
    Owner::new(format!("p{p}")).expect("valid owner")
}

/// The one session id of the model.
pub fn session() -> SessionId {
    SessionId::new("model").expect("valid id")
}

/// Tick `t` as a timestamp.
pub fn at(t: u8) -> Timestamp {
    Timestamp::from_unix_secs(i64::from(t)).expect("in range")
}

/// A timestamp of the model as ticks.
pub fn ticks(t: Timestamp) -> u8 {
    // Every timestamp in the model is a whole number of seconds below 256.
    u8::try_from(t.unix_nanos() / 1_000_000_000).expect("model time fits in u8")
}

impl LeaseModel {
    /// The initial state of this configuration.
    pub fn initial(&self) -> State {
        self.init_states().remove(0)
    }

    /// Runs `event` as process `p` at the state's time, every step at once with no fault and
    /// no interleaving: the reference the adapters are compared against in property tests.
    ///
    /// # Errors
    ///
    /// What the interpreter reports (token exhausted, a busy liveness lock).
    pub fn apply(&self, state: &mut State, p: usize, event: Event) -> Result<Outcome, Error> {
        let mut run = Run::new(event, self.ttl());
        loop {
            let (step, _) = self.advance(state, p, &mut run, Ghost::default(), false);
            match step {
                Step::Done(result) => return result,
                Step::Continue => {}
                Step::Blocked => panic!("transition lock held by another process"),
            }
        }
    }

    /// Process `p` crashes: its locks vanish, it forgets everything.
    pub fn crash(&self, state: &mut State, p: usize) {
        crash(state, p);
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.ttl_ticks))
    }

    /// Advances `run` of process `p` by one I/O step; returns its result and what the
    /// transaction noted (and whether an armed fault fired).
    fn advance(
        &self,
        state: &mut State,
        p: usize,
        run: &mut Run<u64>,
        ghost: Ghost,
        fault: bool,
    ) -> (Step, (Ghost, bool)) {
        let mut tx = ModelTx {
            state,
            p,
            fault,
            fired: false,
            durable: self.durable,
            backend: self.backend,
            ghost,
        };
        let step = run.next(&mut tx, &session());
        (step, (tx.ghost, tx.fired))
    }

    fn event(&self, p: usize, kind: Kind, view: Option<LeaseView>) -> Event {
        let owner = self.owner(p);
        match (kind, view) {
            (Kind::Acquire, _) => Event::Acquire { owner },
            (Kind::Renew | Kind::RenewStale, Some(v)) => Event::Renew {
                owner,
                token: v.token,
            },
            (Kind::Release | Kind::ReleaseStale, Some(v)) => Event::Release {
                owner,
                token: v.token,
            },
            // actions() only offers lease operations to processes that have that lease.
            _ => unreachable!("no lease to operate on"),
        }
    }

    /// Process `p` starts a call and takes its first step; `None` if that is not possible.
    fn call(&self, last: &State, p: usize, kind: Kind) -> Option<State> {
        let view = match kind {
            Kind::Acquire => None,
            Kind::Renew | Kind::Release => last.procs[p].lease,
            Kind::RenewStale | Kind::ReleaseStale => last.procs[p].stale,
        };
        let mut s = last.clone();
        s.scenario = None;
        s.procs[p].call = Some(Call {
            kind,
            view,
            run: Run::new(self.event(p, kind, view), self.ttl()),
            ghost: Ghost::default(),
        });
        self.step(&s, p, false)
    }

    /// Process `p` performs one I/O step (failing if `fault`); `None` if it cannot.
    fn step(&self, last: &State, p: usize, fault: bool) -> Option<State> {
        let mut s = last.clone();
        s.scenario = None;
        let mut call = s.procs[p].call.take()?;
        let ghost = std::mem::take(&mut call.ghost);
        let (step, (ghost, fired)) = self.advance(&mut s, p, &mut call.run, ghost, fault);
        call.ghost = ghost;
        if fault && !fired {
            // An armed fault that would not fire is no step of the model.
            return None;
        }
        if fired {
            s.faults_left -= 1;
        }
        match step {
            Step::Blocked => return None,
            Step::Continue => s.procs[p].call = Some(call),
            Step::Done(result) => props::observe(self, &mut s, p, &call, fired, &result),
        }
        Some(s)
    }

    /// Whether process `p` can take the next step of its call (or start one).
    fn can_step(s: &State, p: usize, run: Option<&Run<u64>>) -> bool {
        let lock_free = s.stable.is_none_or(|q| q == p);
        match run.map(Run::peek) {
            None | Some(Some(Io::LockStable)) => lock_free,
            Some(Some(_)) => true,
            Some(None) => false,
        }
    }
}

fn crash(s: &mut State, p: usize) {
    // The kernel drops the process's flocks (liveness locks and the transition lock); its
    // files stay (a temporary file too).
    for holder in s.live.values_mut() {
        if *holder == Some(p) {
            *holder = None;
        }
    }
    if s.stable == Some(p) {
        s.stable = None;
    }
    if s.procs[p].call.as_ref().is_some_and(|c| c.ghost.renamed) {
        s.scenario = Some(Scenario::CrashAfterCommit);
    }
    // The restarted process has no local state, but may replay a copy of the lease it held
    // (persisted by the application, or handed over): a lease this instance never acquired.
    let proc = &mut s.procs[p];
    let copy = proc.lease.or(proc.stale);
    let last = proc.call.as_ref().map(|c| (c.kind, Said::Crashed));
    *proc = Proc {
        stale: copy,
        last: last.or(proc.last),
        ..Proc::default()
    };
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            record_synced: false,
            durable: None,
            temp: None,
            stable: None,
            live: BTreeMap::new(),
            created: 0,
            procs: vec![Proc::default(); self.procs],
            faults_left: self.faults,
            host_crash_left: self.host_crash,
            cleaner_left: self.cleaner,
            losses_left: self.liveness_losses,
            max_granted: 0,
            scenario: None,
            violations: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Past the token bound only the calls under way go on, so the grant that crossed
        // the bound is reported and checked.
        let beyond = s.record.as_ref().is_some_and(|r| r.token > self.max_token);
        for (p, proc) in s.procs.iter().enumerate() {
            let run = proc.call.as_ref().map(|c| &c.run);
            if let Some(io) = run.and_then(Run::peek) {
                if LeaseModel::can_step(s, p, run) {
                    actions.push(Action::Step(p, io));
                    if !beyond && s.faults_left > 0 && run.is_some_and(Run::next_can_fail) {
                        actions.push(Action::Fail(p, io));
                    }
                }
            } else if !beyond && LeaseModel::can_step(s, p, None) {
                actions.push(Action::Call(p, Kind::Acquire));
                if proc.lease.is_some() {
                    actions.push(Action::Call(p, Kind::Renew));
                    actions.push(Action::Call(p, Kind::Release));
                }
                if proc.stale.is_some() {
                    actions.push(Action::Call(p, Kind::RenewStale));
                    actions.push(Action::Call(p, Kind::ReleaseStale));
                }
            }
            if beyond {
                continue;
            }
            if proc.local.is_some() || proc.lease.is_some() || proc.call.is_some() {
                actions.push(Action::Crash(p));
            }
            let holds_lock = proc
                .local
                .as_ref()
                .is_some_and(|l| s.live.get(&l.token) == Some(&Some(p)));
            if s.losses_left > 0 && holds_lock && proc.call.is_none() {
                actions.push(Action::LoseLiveness(p));
            }
        }
        if beyond {
            return;
        }
        if s.now < self.max_time {
            actions.push(Action::Tick);
        }
        if s.host_crash_left {
            actions.push(Action::HostCrash);
        }
        let current = s.record.as_ref().map(|r| r.token);
        if s.cleaner_left && current.is_some_and(|t| s.live.contains_key(&t)) {
            actions.push(Action::DeleteLiveFile);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        match action {
            Action::Call(p, kind) => self.call(last, p, kind),
            Action::Step(p, _) => self.step(last, p, false),
            Action::Fail(p, _) => self.step(last, p, true),
            Action::Crash(p) => {
                let mut s = last.clone();
                s.scenario = None;
                crash(&mut s, p);
                Some(s)
            }
            Action::Tick => {
                let mut s = last.clone();
                s.scenario = None;
                s.now += 1;
                Some(s)
            }
            Action::HostCrash => {
                let mut s = last.clone();
                s.scenario = None;
                for p in 0..s.procs.len() {
                    crash(&mut s, p);
                }
                s.scenario = None;
                s.record = s.durable.clone();
                s.record_synced = true;
                s.temp = None;
                s.host_crash_left = false;
                Some(s)
            }
            Action::DeleteLiveFile => {
                let mut s = last.clone();
                s.scenario = None;
                // The holder keeps its descriptor and lock on the unlinked file, which no
                // probe can reach any more: the path is simply gone.
                if let Some(t) = s.record.as_ref().map(|r| r.token) {
                    s.live.remove(&t);
                }
                s.cleaner_left = false;
                Some(s)
            }
            Action::LoseLiveness(p) => {
                let mut s = last.clone();
                s.scenario = None;
                // The server ends the session: its advisory locks go; the process runs on.
                for holder in s.live.values_mut() {
                    if *holder == Some(p) {
                        *holder = None;
                    }
                }
                s.procs[p].lost = s.procs[p].local.as_ref().map(|l| l.token);
                s.losses_left -= 1;
                Some(s)
            }
        }
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::properties(self)
    }

    fn format_action(&self, action: &Action) -> String {
        match action {
            Action::Call(p, kind) => {
                format!("p{p} calls {} (lock the transition lock)", kind.label())
            }
            Action::Step(p, io) => format!("p{p} {}", io_label(*io)),
            Action::Fail(p, io) => format!("p{p} {} FAILS (injected I/O error)", io_label(*io)),
            Action::Crash(p) => format!("p{p} crashes"),
            Action::Tick => "tick".into(),
            Action::HostCrash => "host crash".into(),
            Action::DeleteLiveFile => "operator deletes the current liveness file".into(),
            Action::LoseLiveness(p) => format!("p{p}'s liveness connection drops"),
        }
    }
}

impl Kind {
    /// The call as a word.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Acquire => "acquire",
            Kind::Renew => "renew",
            Kind::Release => "release",
            Kind::RenewStale => "renew (stale lease)",
            Kind::ReleaseStale => "release (stale lease)",
        }
    }
}

/// An I/O step as a few words.
pub fn io_label(io: Io) -> String {
    match io {
        Io::LockStable => "locks the transition lock".into(),
        Io::Read => "reads the record".into(),
        Io::Probe { token } => format!("probes generation {token}"),
        Io::Prepare(i) => format!("prepares (step {i}: lock or check its liveness file)"),
        Io::WriteTemp => "writes the temporary file".into(),
        Io::SyncTemp => "fsyncs the temporary file".into(),
        Io::Rename => "renames it over the record (commit)".into(),
        Io::SyncDir => "fsyncs the directory".into(),
        Io::Cleanup(i) => format!("cleans up (step {i})"),
        Io::Adopt => "adopts the new generation".into(),
        Io::UnlockStable => "unlocks the transition lock".into(),
    }
}
