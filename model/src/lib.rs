//! A [stateright] model of flocklease: N lease-manager processes on one host sharing one
//! session id's record and liveness locks, with a ticking clock, crashes, failing writes and a
//! host crash.
//!
//! Every transition runs [`flocklease::driver::run`] — the very interpreter the real adapters
//! use — over [`ModelTx`], which maps its primitive steps onto this model's state exactly as
//! `FlockLease` maps them onto files. No lease decision is made here: the model only records
//! what happened, and checks it.
//!
//! The safety properties are SPEC §6; transition properties (3, 4, 5, 6, 7) are checked inside
//! [`Model::next_state`] and leave a mark in [`State::violation`] for an `always` property to
//! see. `sometimes` properties show that each important scenario is reachable.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::time::Duration;

use flocklease::driver::{self, Transaction};
use flocklease::machine::{Event, Liveness, Local, Outcome};
use flocklease::{Error, Owner, Record, SessionId, Timestamp};
use stateright::{Model, Property};

/// The model's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseModel {
    /// Number of lease-manager processes (2 by default, up to 3).
    pub procs: usize,
    /// The clock runs from tick 0 to this tick.
    pub max_time: u8,
    /// The lease TTL, in ticks.
    pub ttl_ticks: u8,
    /// States whose record token exceeds this are not explored further.
    pub max_token: u64,
    /// How many writes may fail (each failing before or after the rename).
    pub write_faults: u8,
    /// Whether a host crash (every process dies, undurable writes are lost) can happen, once.
    pub host_crash: bool,
    /// Whether an operator (or a tmp cleaner) may delete the current generation's liveness file,
    /// once — a vanished file is not proof of death.
    pub cleaner: bool,
    /// Whether commits that change owner or token are made durable (the adapter's
    /// `Durability::Full`). With `false`, a host crash can bring back an older token.
    pub durable: bool,
}

impl Default for LeaseModel {
    /// The default configuration: what CI checks.
    fn default() -> Self {
        LeaseModel {
            procs: 2,
            max_time: 5,
            ttl_ticks: 2,
            max_token: 4,
            write_faults: 1,
            host_crash: true,
            cleaner: true,
            durable: true,
        }
    }
}

/// A process, as its own memory knows itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Proc {
    /// The generation whose liveness lock it keeps open.
    pub local: Option<Local>,
    /// The lease it believes it holds (from its last successful acquire or renew).
    pub lease: Option<LeaseView>,
    /// A lease it held earlier, kept to replay (a stale renew or release).
    pub stale: Option<LeaseView>,
}

/// What a process knows of a lease it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseView {
    /// The fencing token.
    pub token: u64,
    /// The expiry, in ticks.
    pub expiry: u8,
}

/// The whole system.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The time, in ticks.
    pub now: u8,
    /// The record as every process sees it.
    pub record: Option<Record>,
    /// The record as it would be after a power loss.
    pub durable: Option<Record>,
    /// Liveness files by token: `Some(p)` while process `p` holds its lock, `None` when the
    /// file exists unlocked.
    pub live: BTreeMap<u64, Option<usize>>,
    /// The processes.
    pub procs: Vec<Proc>,
    /// Failing writes left to inject.
    pub faults_left: u8,
    /// Whether the host crash is still to come.
    pub host_crash_left: bool,
    /// Whether the cleaner's deletion is still to come.
    pub cleaner_left: bool,
    /// Ghost: the highest token ever granted to a caller.
    pub max_granted: u64,
    /// Ghost: the notable scenario the last transition was, if any.
    pub scenario: Option<Scenario>,
    /// Ghost: the first transition property a transition broke, if any.
    pub violation: Option<&'static str>,
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
    /// A failed write left the process able to retry.
    FailedWrite,
    /// An acquire was refused although the holder's liveness file had vanished: the unexpired
    /// record still protected the holder.
    HeldDespiteMissingFile,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Process `p` acquires.
    Acquire(usize),
    /// Process `p` renews its current lease.
    Renew(usize),
    /// Process `p` releases its current lease.
    Release(usize),
    /// Process `p` renews the stale lease it kept.
    RenewStale(usize),
    /// Process `p` releases the stale lease it kept.
    ReleaseStale(usize),
    /// Process `p` acquires, renews or releases, and its record write fails.
    FailingWrite(usize, Op, Fault),
    /// Process `p` crashes and restarts with no local state, keeping only a copy of its last
    /// lease to replay.
    Crash(usize),
    /// The clock ticks.
    Tick,
    /// The host crashes: every process dies, undurable writes are lost.
    HostCrash,
    /// An operator deletes the liveness file of the recorded generation.
    DeleteLiveFile,
}

/// The operation a failing write belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// An acquire.
    Acquire,
    /// A renew of the current lease.
    Renew,
    /// A release of the current lease.
    Release,
}

/// Where a write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Creating, writing, fsyncing or renaming the temporary file: the old record stands.
    BeforeRename,
    /// The directory fsync after the rename: the new record is visible but not durable.
    AfterRename,
}

/// The owner string of process `p`.
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

impl LeaseModel {
    /// The initial state of this configuration.
    pub fn initial(&self) -> State {
        self.init_states().remove(0)
    }

    /// Runs `event` as process `p` at the state's time through the shared interpreter, with no
    /// fault: the reference the adapters are compared against in property tests.
    ///
    /// # Errors
    ///
    /// What the interpreter reports (token exhausted, a busy liveness lock).
    pub fn apply(&self, state: &mut State, p: usize, event: Event) -> Result<Outcome, Error> {
        self.transition(state, p, event, None)
    }

    /// Process `p` crashes: its liveness locks vanish, it forgets everything.
    pub fn crash(&self, state: &mut State, p: usize) {
        crash(state, p);
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.ttl_ticks))
    }

    /// Runs one operation of process `p` through the shared interpreter.
    fn transition(
        &self,
        state: &mut State,
        p: usize,
        event: Event,
        fault: Option<Fault>,
    ) -> Result<Outcome, Error> {
        let now = at(state.now);
        let mut tx = ModelTx {
            state,
            p,
            fault,
            durable_policy: self.durable,
        };
        driver::run(&mut tx, &session(), now, self.ttl(), event)
    }

    fn op(&self, last: &State, p: usize, kind: Kind, fault: Option<Fault>) -> State {
        let mut s = last.clone();
        s.scenario = None;
        let view = match kind {
            Kind::Acquire => None,
            Kind::Renew | Kind::Release => last.procs[p].lease,
            Kind::RenewStale | Kind::ReleaseStale => last.procs[p].stale,
        };
        let event = match (kind, view) {
            (Kind::Acquire, _) => Event::Acquire { owner: owner(p) },
            (Kind::Renew | Kind::RenewStale, Some(v)) => Event::Renew {
                owner: owner(p),
                token: v.token,
            },
            (Kind::Release | Kind::ReleaseStale, Some(v)) => Event::Release {
                owner: owner(p),
                token: v.token,
            },
            // actions() only offers lease operations to processes that have that lease.
            _ => unreachable!("no lease to operate on"),
        };
        if fault.is_some() {
            s.faults_left -= 1;
        }
        let before = last;
        let result = self.transition(&mut s, p, event, fault);
        self.observe(before, &mut s, p, kind, view, fault, &result);
        s
    }

    /// Updates what process `p` believes after its operation, and checks the transition
    /// properties (SPEC §6 items 2–7) on (before, after).
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &self,
        before: &State,
        s: &mut State,
        p: usize,
        kind: Kind,
        view: Option<LeaseView>,
        fault: Option<Fault>,
        result: &Result<Outcome, Error>,
    ) {
        let me = owner(p);
        let names = |r: &Option<Record>, token: u64| {
            r.as_ref()
                .is_some_and(|r| r.owner == me.as_str() && r.token == token)
        };
        let mut flag = |name: &'static str| {
            if s.violation.is_none() {
                s.violation = Some(name);
            }
        };
        match result {
            Err(_) => {
                // A process whose release failed stops using the lease; it may retry the
                // release (a replay of the stale lease).
                if kind == Kind::Release {
                    let proc = &mut s.procs[p];
                    proc.stale = proc.lease.take();
                }
                // 7: a failure commits nothing durable, and with no fault injected nothing
                // fails at all in this model.
                if s.durable != before.durable {
                    flag("no failure after commit");
                }
                if fault.is_none() {
                    flag("no failure without a fault");
                }
                s.scenario = Some(Scenario::FailedWrite);
            }
            Ok(Outcome::Granted { token, expiry }) => {
                let token = *token;
                // 7: success means the record now says so.
                let expected = Record {
                    owner: me.as_str().to_owned(),
                    token,
                    expiry: *expiry,
                };
                if s.record.as_ref() != Some(&expected) {
                    flag("no success without commit");
                }
                if matches!(kind, Kind::Renew | Kind::RenewStale) {
                    // 4: renew succeeds only for the record's current generation.
                    if !names(&before.record, token) {
                        flag("renew only for the current generation");
                    }
                    if view.is_some_and(|v| v.expiry <= before.now) {
                        s.scenario = Some(Scenario::RenewAfterSuspension);
                    }
                }
                let new_generation = before.record.as_ref().is_none_or(|r| r.token != token);
                if new_generation {
                    // 2: every grant of a new generation raises the token above all before.
                    if token <= before.max_granted {
                        flag("tokens strictly increase");
                    }
                    let old = before.record.as_ref();
                    let old_holder = old.and_then(|r| before.live.get(&r.token).copied().flatten());
                    let unexpired =
                        old.is_some_and(|r| !r.is_tombstone() && at(before.now) < r.expiry);
                    if unexpired && old_holder.is_none() {
                        s.scenario = Some(Scenario::TakeoverAfterCrash);
                    } else if !unexpired
                        && old.is_some_and(|r| !r.is_tombstone())
                        && old_holder.is_some_and(|q| q != p)
                    {
                        s.scenario = Some(Scenario::TakeoverOfExpiredRunningHolder);
                    }
                    if !before.host_crash_left && self.host_crash {
                        s.scenario = Some(Scenario::GrantAfterHostCrash);
                    }
                }
                s.max_granted = s.max_granted.max(token);
                let v = LeaseView {
                    token,
                    expiry: ticks(*expiry),
                };
                let proc = &mut s.procs[p];
                if let Some(old) = proc.lease.filter(|l| l.token != token) {
                    proc.stale = Some(old);
                }
                // A kept copy of this very generation is current again, not stale.
                if proc.stale.is_some_and(|l| l.token == token) {
                    proc.stale = None;
                }
                proc.lease = Some(v);
            }
            Ok(Outcome::Held) => {
                // 5: renew by the current holder with the record unchanged always succeeds.
                if matches!(kind, Kind::Renew | Kind::RenewStale) {
                    if let Some(v) = view {
                        let holds = before.procs[p]
                            .local
                            .as_ref()
                            .is_some_and(|l| l.token == v.token && l.owner == me);
                        if holds && names(&before.record, v.token) {
                            flag("renew by the current holder succeeds");
                        }
                    }
                    // The lease is lost: keep it only as a stale one to replay.
                    let proc = &mut s.procs[p];
                    if kind == Kind::Renew {
                        proc.stale = proc.lease.take();
                    }
                }
                // 6: an acquire after the recorded holder crashed succeeds at once.
                if kind == Kind::Acquire {
                    let missing = before
                        .record
                        .as_ref()
                        .is_some_and(|r| !r.is_tombstone() && !before.live.contains_key(&r.token));
                    if missing {
                        s.scenario = Some(Scenario::HeldDespiteMissingFile);
                    }
                    let crashed = before.record.as_ref().is_some_and(|r| {
                        !r.is_tombstone()
                            && before.live.get(&r.token) == Some(&None)
                            && before.procs[p]
                                .local
                                .as_ref()
                                .is_none_or(|l| l.token != r.token)
                    });
                    if crashed {
                        flag("crashed holder replaced at once");
                    }
                }
            }
            Ok(Outcome::Released) => {
                let holds = |v: LeaseView| {
                    before.procs[p]
                        .local
                        .as_ref()
                        .is_some_and(|l| l.token == v.token && l.owner == me)
                };
                let current = view.is_some_and(|v| holds(v) && names(&before.record, v.token));
                if !current {
                    // 3: a stale or foreign release changes neither the record nor anyone
                    // else's lock.
                    if s.record != before.record || others(&s.live, p) != others(&before.live, p) {
                        flag("stale release changes nothing");
                    }
                    if before.record.as_ref().is_some_and(|r| !r.is_tombstone())
                        && view.is_some_and(|v| !names(&before.record, v.token))
                    {
                        s.scenario = Some(Scenario::StaleReleaseAfterSuccessor);
                    }
                } else if !s.record.as_ref().is_some_and(|r| r.owner.is_empty()) {
                    // 7: a successful release of the current generation committed a tombstone.
                    flag("no success without commit");
                }
                let proc = &mut s.procs[p];
                match kind {
                    Kind::Release => proc.stale = proc.lease.take(),
                    Kind::ReleaseStale => proc.stale = None,
                    _ => {}
                }
            }
        }
    }
}

/// The liveness locks held by processes other than `p`.
fn others(live: &BTreeMap<u64, Option<usize>>, p: usize) -> Vec<(u64, usize)> {
    live.iter()
        .filter_map(|(t, h)| h.filter(|q| *q != p).map(|q| (*t, q)))
        .collect()
}

fn ticks(t: Timestamp) -> u8 {
    // Every timestamp in the model is a whole number of seconds below 256.
    u8::try_from(t.unix_nanos() / 1_000_000_000).expect("model time fits in u8")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Acquire,
    Renew,
    Release,
    RenewStale,
    ReleaseStale,
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            durable: None,
            live: BTreeMap::new(),
            procs: vec![Proc::default(); self.procs],
            faults_left: self.write_faults,
            host_crash_left: self.host_crash,
            cleaner_left: self.cleaner,
            max_granted: 0,
            scenario: None,
            violation: None,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (p, proc) in s.procs.iter().enumerate() {
            actions.push(Action::Acquire(p));
            if proc.lease.is_some() {
                actions.push(Action::Renew(p));
                actions.push(Action::Release(p));
            }
            if proc.stale.is_some() {
                actions.push(Action::RenewStale(p));
                actions.push(Action::ReleaseStale(p));
            }
            if s.faults_left > 0 {
                for fault in [Fault::BeforeRename, Fault::AfterRename] {
                    actions.push(Action::FailingWrite(p, Op::Acquire, fault));
                    if proc.lease.is_some() {
                        actions.push(Action::FailingWrite(p, Op::Renew, fault));
                        actions.push(Action::FailingWrite(p, Op::Release, fault));
                    }
                }
            }
            if proc.local.is_some() || proc.lease.is_some() {
                actions.push(Action::Crash(p));
            }
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
        Some(match action {
            Action::Acquire(p) => self.op(last, p, Kind::Acquire, None),
            Action::Renew(p) => self.op(last, p, Kind::Renew, None),
            Action::Release(p) => self.op(last, p, Kind::Release, None),
            Action::RenewStale(p) => self.op(last, p, Kind::RenewStale, None),
            Action::ReleaseStale(p) => self.op(last, p, Kind::ReleaseStale, None),
            Action::FailingWrite(p, op, fault) => {
                let kind = match op {
                    Op::Acquire => Kind::Acquire,
                    Op::Renew => Kind::Renew,
                    Op::Release => Kind::Release,
                };
                self.op(last, p, kind, Some(fault))
            }
            Action::Crash(p) => {
                let mut s = last.clone();
                s.scenario = None;
                crash(&mut s, p);
                s
            }
            Action::Tick => {
                let mut s = last.clone();
                s.scenario = None;
                s.now += 1;
                s
            }
            Action::HostCrash => {
                let mut s = last.clone();
                s.scenario = None;
                for p in 0..s.procs.len() {
                    crash(&mut s, p);
                }
                s.record = s.durable.clone();
                s.host_crash_left = false;
                s
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
                s
            }
        })
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.record.as_ref().is_none_or(|r| r.token <= self.max_token)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one unexpired holder, the record's",
                |_, s: &State| {
                    let now = at(s.now);
                    let holders: Vec<(usize, LeaseView)> = s
                        .procs
                        .iter()
                        .enumerate()
                        .filter_map(|(p, proc)| proc.lease.map(|l| (p, l)))
                        .filter(|(_, l)| now < at(l.expiry))
                        .collect();
                    match holders.as_slice() {
                        [] => true,
                        [(p, l)] => s
                            .record
                            .as_ref()
                            .is_some_and(|r| r.owner == owner(*p).as_str() && r.token == l.token),
                        _ => false,
                    }
                },
            ),
            Property::always(
                "tokens never go back, even after a host crash",
                |_, s: &State| {
                    let durable = s.durable.as_ref().map_or(0, |r| r.token);
                    let visible = s.record.as_ref().map_or(0, |r| r.token);
                    durable >= s.max_granted && visible >= durable
                },
            ),
            Property::always("no transition property broken", |_, s: &State| {
                s.violation.is_none()
            }),
            Property::sometimes("takeover after a crash", |_, s: &State| {
                s.scenario == Some(Scenario::TakeoverAfterCrash)
            }),
            Property::sometimes("takeover of an expired, running holder", |_, s: &State| {
                s.scenario == Some(Scenario::TakeoverOfExpiredRunningHolder)
            }),
            Property::sometimes("renew after suspension past the TTL", |_, s: &State| {
                s.scenario == Some(Scenario::RenewAfterSuspension)
            }),
            Property::sometimes("stale release after a successor exists", |_, s: &State| {
                s.scenario == Some(Scenario::StaleReleaseAfterSuccessor)
            }),
            Property::sometimes("grant after a host crash", |m: &LeaseModel, s: &State| {
                !m.host_crash || s.scenario == Some(Scenario::GrantAfterHostCrash)
            }),
            Property::sometimes("a failed write", |m: &LeaseModel, s: &State| {
                m.write_faults == 0 || s.scenario == Some(Scenario::FailedWrite)
            }),
            Property::sometimes(
                "held although the holder's liveness file vanished",
                |m: &LeaseModel, s: &State| {
                    !m.cleaner || s.scenario == Some(Scenario::HeldDespiteMissingFile)
                },
            ),
        ]
    }

    fn format_action(&self, action: &Action) -> String {
        match action {
            Action::Acquire(p) => format!("p{p} acquire"),
            Action::Renew(p) => format!("p{p} renew"),
            Action::Release(p) => format!("p{p} release"),
            Action::RenewStale(p) => format!("p{p} renew (stale lease)"),
            Action::ReleaseStale(p) => format!("p{p} release (stale lease)"),
            Action::FailingWrite(p, op, fault) => {
                let at = match fault {
                    Fault::BeforeRename => "its record write",
                    Fault::AfterRename => "its directory fsync (if it makes one)",
                };
                let op = format!("{op:?}").to_lowercase();
                format!("p{p} {op} with a fault armed at {at}")
            }
            Action::Crash(p) => format!("p{p} crashes"),
            Action::Tick => "tick".into(),
            Action::HostCrash => "host crash".into(),
            Action::DeleteLiveFile => "operator deletes the current liveness file".into(),
        }
    }
}

fn crash(s: &mut State, p: usize) {
    // The kernel drops the process's flocks; its files stay.
    for holder in s.live.values_mut() {
        if *holder == Some(p) {
            *holder = None;
        }
    }
    // The restarted process has no local state, but may replay a copy of the lease it held
    // (persisted by the application, or handed over): a lease this instance never acquired.
    let proc = &mut s.procs[p];
    let copy = proc.lease.or(proc.stale);
    *proc = Proc {
        stale: copy,
        ..Proc::default()
    };
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rec = |r: &Option<Record>| match r {
            None => "none".to_owned(),
            Some(r) if r.is_tombstone() => format!("tombstone#{}", r.token),
            Some(r) => format!("{}#{}@{}", r.owner, r.token, ticks(r.expiry)),
        };
        write!(
            f,
            "t={} record={} durable={}",
            self.now,
            rec(&self.record),
            rec(&self.durable)
        )?;
        let live: Vec<String> = self
            .live
            .iter()
            .map(|(t, h)| match h {
                Some(p) => format!("{t}:p{p}"),
                None => format!("{t}:-"),
            })
            .collect();
        write!(f, " live=[{}]", live.join(","))?;
        for (p, proc) in self.procs.iter().enumerate() {
            let lease = proc
                .lease
                .map_or("-".into(), |l| format!("#{}@{}", l.token, l.expiry));
            let stale = proc.stale.map_or(String::new(), |l| {
                format!(" stale #{}@{}", l.token, l.expiry)
            });
            write!(f, " | p{p} lease {lease}{stale}")?;
        }
        if let Some(v) = self.violation {
            write!(f, " | VIOLATION: {v}")?;
        }
        Ok(())
    }
}

fn injected(op: &'static str) -> Error {
    Error::Io {
        op,
        path: "model.lease.json".into(),
        source: io::Error::other("injected"),
    }
}

/// The model's interpretation of the primitive steps: the same meaning `FlockLease` gives them
/// on files, over [`State`].
pub struct ModelTx<'a> {
    state: &'a mut State,
    p: usize,
    fault: Option<Fault>,
    durable_policy: bool,
}

impl Transaction for ModelTx<'_> {
    type Pending = u64;

    fn read(&mut self) -> Result<Option<Record>, Error> {
        Ok(self.state.record.clone())
    }

    fn local(&self) -> Option<Local> {
        self.state.procs[self.p].local.clone()
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        Ok(match self.state.live.get(&token) {
            None => Liveness::Missing,
            Some(None) => Liveness::Dead,
            Some(Some(_)) => Liveness::Live,
        })
    }

    fn lock_live(&mut self, token: u64) -> Result<u64, Error> {
        // The file is created now; its lock is taken for good on adopt (a transition is atomic
        // in the model, so nobody can observe the difference).
        match self.state.live.entry(token).or_insert(None) {
            Some(_) => Err(Error::LiveLockBusy {
                path: format!("model.{token}.live").into(),
            }),
            None => Ok(token),
        }
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        self.state.live.insert(token, Some(self.p));
        Ok(())
    }

    fn commit(&mut self, record: &Record) -> Result<(), Error> {
        if self.fault == Some(Fault::BeforeRename) {
            return Err(injected("write"));
        }
        self.state.record = Some(record.clone());
        Ok(())
    }

    fn sync_dir(&mut self) -> Result<(), Error> {
        if !self.durable_policy {
            return Ok(());
        }
        if self.fault == Some(Fault::AfterRename) {
            return Err(injected("fsync"));
        }
        self.state.durable = self.state.record.clone();
        Ok(())
    }

    fn close_local(&mut self, token: u64) {
        let proc = &mut self.state.procs[self.p];
        if proc.local.as_ref().is_some_and(|l| l.token == token) {
            proc.local = None;
            if let Some(h) = self.state.live.get_mut(&token)
                && *h == Some(self.p)
            {
                *h = None;
            }
        }
    }

    fn delete_live(&mut self, token: u64) {
        self.state.live.remove(&token);
    }

    fn sweep(&mut self, below: u64) {
        self.state.live.retain(|t, _| *t >= below);
    }

    fn adopt(&mut self, token: u64, local: Local) {
        self.state.live.insert(token, Some(self.p));
        self.state.procs[self.p].local = Some(local);
    }
}

/// Running the checker and printing its verdicts.
pub mod report {
    use std::io::{self, Write};

    use stateright::{Checker, Expectation, Model, Path};

    use super::{Action, LeaseModel, State};

    /// One property's result.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Verdict {
        /// The property's name.
        pub name: &'static str,
        /// `always` or `sometimes`.
        pub expectation: &'static str,
        /// Whether it holds (`always`: no counterexample; `sometimes`: witnessed).
        pub ok: bool,
    }

    /// The result of an exhaustive check.
    #[derive(Clone, Debug)]
    pub struct Outcome {
        /// Distinct states explored.
        pub unique_states: usize,
        /// States generated, with repeats.
        pub states: usize,
        /// The deepest path explored.
        pub max_depth: usize,
        /// One verdict per property, in the model's order.
        pub verdicts: Vec<Verdict>,
    }

    /// Explores every reachable state of `model` (breadth first, two threads) and judges each
    /// property.
    pub fn explore(model: &LeaseModel) -> Outcome {
        let checker = model.clone().checker().threads(2).spawn_bfs().join();
        let verdicts = model
            .properties()
            .iter()
            .map(|p| {
                let found = checker.discovery(p.name).is_some();
                let (expectation, ok) = match p.expectation {
                    Expectation::Always => ("always", !found),
                    Expectation::Sometimes => ("sometimes", found),
                    Expectation::Eventually => ("eventually", !found),
                };
                Verdict {
                    name: p.name,
                    expectation,
                    ok,
                }
            })
            .collect();
        Outcome {
            unique_states: checker.unique_state_count(),
            states: checker.state_count(),
            max_depth: checker.max_depth(),
            verdicts,
        }
    }

    /// The shortest path to a discovery of property `name`, by iterative deepening (a
    /// multi-threaded breadth-first search does not guarantee the shortest path).
    pub fn shortest(
        model: &LeaseModel,
        name: &'static str,
        max_depth: usize,
    ) -> Option<Path<State, Action>> {
        (1..=max_depth + 1).find_map(|depth| {
            model
                .clone()
                .checker()
                .target_max_depth(depth)
                .spawn_bfs()
                .join()
                .discovery(name)
        })
    }

    /// Writes `path` as numbered steps.
    pub fn write_path(
        model: &LeaseModel,
        path: Path<State, Action>,
        out: &mut impl Write,
    ) -> io::Result<()> {
        for (state, action) in path.into_vec() {
            match action {
                // The action stored with a state is the one taken *from* it.
                Some(a) => writeln!(out, "      {state:?}\n   -> {}", model.format_action(&a))?,
                None => writeln!(out, "      {state:?}")?,
            }
        }
        Ok(())
    }

    /// The `check` command: explores, prints the verdicts and the shortest counterexample of
    /// each violated `always` property. Returns whether everything holds.
    pub fn check(model: &LeaseModel, out: &mut impl Write) -> io::Result<bool> {
        writeln!(out, "model: {model:?}")?;
        let start = std::time::Instant::now();
        let outcome = explore(model);
        writeln!(
            out,
            "explored {} unique states ({} generated, max depth {}) in {:.1?}",
            outcome.unique_states,
            outcome.states,
            outcome.max_depth,
            start.elapsed()
        )?;
        let mut all_ok = true;
        for v in &outcome.verdicts {
            let word = match (v.expectation, v.ok) {
                ("sometimes", true) => "witnessed",
                ("sometimes", false) => "NEVER WITNESSED",
                (_, true) => "holds",
                (_, false) => "VIOLATED",
            };
            writeln!(out, "  {:9} {:50} {word}", v.expectation, v.name)?;
            all_ok &= v.ok;
        }
        for v in outcome
            .verdicts
            .iter()
            .filter(|v| !v.ok && v.expectation == "always")
        {
            writeln!(out, "\nshortest counterexample for \"{}\":", v.name)?;
            match shortest(model, v.name, outcome.max_depth) {
                Some(path) => write_path(model, path, out)?,
                None => writeln!(out, "   (not found again by iterative deepening)")?,
            }
        }
        writeln!(out, "{}", if all_ok { "OK" } else { "FAILED" })?;
        Ok(all_ok)
    }
}
