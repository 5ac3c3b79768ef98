//! The one interpreter of a [`Plan`], shared by every backend and by the
//! model checker.
//!
//! A backend implements [`Transaction`] — one transition on one id, in the protocol's terms:
//! begin under the id's lock, probe, the commit's steps (exactly one of them the commit
//! point), undo, cleanup, adopt, end — and [`Run`] does the rest: it asks the machine, and
//! calls the steps in the one order [`Run::schedule`] gives. No backend decides anything about
//! expiry, tokens or owners, and none chooses the order of its own steps; a backend only says
//! at which [`Grain`] another actor can come between two of them.
//!
//! [`Run`] performs **one step per call** of [`Run::next`], so a model checker can interleave
//! the steps of several processes and crash a process between any two of them; [`run`]
//! simply calls it until the transition is done, which is what the adapters do.

use std::time::Duration;

use crate::error::Error;
use crate::machine::{
    self, Cleanup, Decision, DirSync, Event, Input, Liveness, Local, Outcome, Plan, Prepare,
};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// Where another actor can come between two steps of a backend's transition: what one step
/// of [`Run`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grain {
    /// One system call per step (the flock backend, and memory, which mirrors it): the lock
    /// and the read are two steps; the commit is the new generation's liveness file, the
    /// temporary record, its fsync, the rename (the commit point) and the directory's fsync;
    /// every cleanup is a step; the transition lock is released last.
    SystemCall,
    /// One statement per step (PostgreSQL): the lock and the read are one step (`SELECT … FOR
    /// UPDATE`); the commit is one step (the new generation's advisory lock, the `UPDATE` and
    /// the `COMMIT`, which ends the transaction and so releases the row lock); only the
    /// cleanups that touch the server are steps (closing a generation; no files are left to
    /// delete or sweep); a transition that commits nothing ends with a step of its own.
    Statement,
}

/// One step of a plan's commit, as [`commit_steps`] lists them for a [`Grain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommitStep {
    /// [`Prepare::LockLive`]: the new generation's liveness lock, taken before the commit
    /// point (at [`Grain::Statement`] the commit point takes it).
    LockLive,
    /// [`Prepare::EnsureLive`]: the local generation's liveness lock checked, and taken again
    /// if it was lost.
    EnsureLive,
    /// The temporary record written ([`Grain::SystemCall`]).
    WriteTemp,
    /// The temporary record's fsync ([`Grain::SystemCall`], durable directories).
    SyncTemp,
    /// The commit point: the rename over the record, or the statement that commits. Before
    /// it nothing is visible to anyone else; after it the record is the plan's.
    Point,
    /// The directory's fsync after the rename ([`Grain::SystemCall`], when the plan asks:
    /// [`DirSync`]).
    SyncDir,
}

/// The commit's steps of `plan` at `grain`, in order; exactly one is [`CommitStep::Point`]
/// when the plan commits a record.
pub fn commit_steps(grain: Grain, plan: &Plan) -> Vec<CommitStep> {
    let mut steps = Vec::new();
    for p in &plan.prepare {
        match p {
            // At statement grain the commit statement takes the lock itself.
            Prepare::LockLive { .. } if grain == Grain::Statement && plan.commit.is_some() => {}
            Prepare::LockLive { .. } => steps.push(CommitStep::LockLive),
            Prepare::EnsureLive { .. } => steps.push(CommitStep::EnsureLive),
        }
    }
    if plan.commit.is_some() {
        if grain == Grain::SystemCall {
            steps.extend([CommitStep::WriteTemp, CommitStep::SyncTemp]);
        }
        steps.push(CommitStep::Point);
        if grain == Grain::SystemCall && plan.sync_dir != DirSync::No {
            steps.push(CommitStep::SyncDir);
        }
    }
    steps
}

/// The rules of an id's in-process turn ([`Hold::Turn`]), which the front's gate runs under its
/// mutex and the model checker runs with its threads; and the registry's rule for which ids'
/// entries it keeps when it prunes, which the model checker judges its instances' slots by.
#[cfg(feature = "internals")]
pub use crate::front::{GateState, Idle, TurnLook, keeps};

/// What a fenced section or a transition holds of an id (PROTOCOL §9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hold {
    /// The id's in-process turn (`front::Gate`): waited for until the call's deadline.
    Turn,
    /// This instance's state of the id (a mutex): waited for without a deadline, so never
    /// held across a wait without one.
    State,
    /// The id's transition lock, waited for until the call's deadline (flock: `<stem>.lock`;
    /// PostgreSQL: the transaction's connection, whose first statement, in the run, locks the
    /// row in the server; memory: nothing of its own — its transaction takes the store's
    /// mutex for the run, without a deadline).
    Lock,
}

/// One step of what a transition ([`TRANSITION`]) or a fenced section (`flock::SECTION`) holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HoldStep {
    /// Takes what it names.
    Take(Hold),
    /// The machine's check (`machine::fence_holds`) of the record and the state: the section
    /// runs nothing if it fails.
    Check,
    /// Gives back what it names.
    Give(Hold),
    /// The section's closure; the transition's run.
    Run,
}

/// The order in which a transition of every backend (`acquire`, `renew`, `release`, each
/// attempt of a wait) takes and gives back what it holds. The crate's front runs it for every
/// backend, and the model checker's threads run it too:
/// - the turn, the state, the lock (its wait for the lock holds the state, bounded by the
///   deadline where the backend has one);
/// - the run (whose last step gives the lock back: the driver ends every run by releasing it);
/// - then everything given back (flock: the lock's descriptor closed, which unlocks it if the
///   run did not get to it).
pub const TRANSITION: [HoldStep; 7] = [
    HoldStep::Take(Hold::Turn),
    HoldStep::Take(Hold::State),
    HoldStep::Take(Hold::Lock),
    HoldStep::Run,
    HoldStep::Give(Hold::Lock),
    HoldStep::Give(Hold::State),
    HoldStep::Give(Hold::Turn),
];

/// What a transition reads when it begins, under the id's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Begun {
    /// The backend's clock, read once per transition.
    pub now: Timestamp,
    /// The record (`None` when there is none).
    pub record: Option<Record>,
    /// The generation this instance holds for the id.
    pub local: Option<Local>,
}

/// One transition on one id, as a backend carries it out: the steps [`Run`] calls.
///
/// Failures of the steps that return `Result` abort the transition ([`Transaction::undo`]
/// then runs); the others are cleanup after the commit and must not fail (a backend logs or
/// ignores what it cannot do there).
pub trait Transaction {
    /// A liveness lock taken for a new generation, not yet adopted.
    type Pending;

    /// The grain of this backend's steps (the [`Run`] driving it must be made with the same).
    fn grain(&self) -> Grain;

    /// Takes the id's lock without blocking: `Ok(false)` when another transition holds it
    /// (the run then waits at this step). The crate's backends keep this default: the front
    /// takes the lock before the run (`front::Backend::lock`, in its bounded begin-or-wait
    /// loop); the model checker's transaction takes it here.
    ///
    /// # Errors
    ///
    /// I/O failure.
    fn lock(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    /// Releases the id's lock. The default does nothing (an adapter whose lock is a scope,
    /// such as a mutex guard or a transaction its caller ends, releases it when the run's
    /// caller returns).
    fn unlock(&mut self) {}

    /// Begins under the lock: the clock, the record, and this instance's generation.
    ///
    /// # Errors
    ///
    /// I/O failure, or [`Error::Corrupt`].
    fn begin(&mut self) -> Result<Begun, Error>;

    /// Probes generation `token`'s liveness lock without creating its file or blocking.
    ///
    /// # Errors
    ///
    /// I/O failure other than "no such file".
    fn probe(&mut self, token: u64) -> Result<Liveness, Error>;

    /// Performs one of the commit's steps, as [`commit_steps`] lists them for this backend's
    /// grain. The step that takes a new generation's liveness lock ([`CommitStep::LockLive`],
    /// or at [`Grain::Statement`] the commit point of a plan that locks one) returns it.
    ///
    /// # Errors
    ///
    /// I/O failure, or a liveness lock unexpectedly held. A failure of the commit point
    /// leaves the old record standing, except PostgreSQL's `Error::CommitUnknown`: a
    /// `COMMIT` whose reply was lost and whose outcome the re-read could not settle (it may
    /// have committed; one found committed is no failure).
    fn commit_step(
        &mut self,
        step: CommitStep,
        plan: &Plan,
    ) -> Result<Option<Self::Pending>, Error>;

    /// After a failed step: leaves nothing behind — releases `pending` (a new generation's
    /// lock, never adopted; its file stays) and removes what this transition created for a
    /// commit that did not happen.
    fn undo(&mut self, pending: Option<Self::Pending>);

    /// One cleanup step after the commit, best effort. For [`Cleanup::Sweep`] an adapter may
    /// delete the dead generation's file (`below - 1`) at once and leave the rest to its next
    /// transition on the id, still under the lock and within the bound
    /// [`machine::deferred_sweep_below`] gives for the record that transition reads (the flock
    /// adapter does, so a takeover never lists the directory).
    fn cleanup(&mut self, step: &Cleanup);

    /// Makes `pending` the local generation `local`.
    fn adopt(&mut self, pending: Self::Pending, local: Local);
}

/// Runs one transition for `event` on `id` through `tx`, and returns the machine's outcome
/// and its input once the transition began (its record and clock): [`Run::next`] until it
/// is done.
///
/// # Errors
///
/// Whatever the transaction's fallible steps report, or the machine's refusal
/// ([`Error::TokenExhausted`], [`Error::ExpiryOutOfRange`]). An error is never reported once
/// the record has been committed, except a failed directory sync that the plan requires
/// ([`DirSync::Required`]), which leaves the new generation dead.
///
/// # Panics
///
/// If the transaction's [`Transaction::lock`] keeps answering "busy": an adapter that calls
/// `run` holds the lock already (the default answers `Ok(true)`).
pub fn run<T: Transaction>(
    tx: &mut T,
    id: &SessionId,
    ttl: Duration,
    event: Event,
) -> (Result<Outcome, Error>, Option<Input>) {
    let mut run = Run::new(tx.grain(), event, ttl);
    loop {
        match run.next(tx, id) {
            Step::Done(result) => return (result, run.input),
            Step::Continue => {}
            Step::Blocked => panic!("driver::run called without the transition lock"),
        }
    }
}

/// What one call of [`Run::next`] did.
#[derive(Debug)]
#[must_use]
pub enum Step {
    /// One step done; call again.
    Continue,
    /// The id's lock is held by another transition; nothing was done.
    Blocked,
    /// The transition is over (the lock is released): its result.
    Done(Result<Outcome, Error>),
}

/// One step of a transition, as [`Run::schedule`] orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Io {
    /// [`Transaction::lock`] ([`Grain::SystemCall`]; at [`Grain::Statement`] the lock is
    /// part of [`Io::Begin`]).
    Lock,
    /// [`Transaction::begin`], then the machine's decision.
    Begin,
    /// [`Transaction::probe`] of the generation the machine named ([`Decision::Probe`]),
    /// then the machine's decision.
    Probe {
        /// The generation to probe.
        token: u64,
    },
    /// [`Transaction::commit_step`].
    Commit(CommitStep),
    /// The plan's cleanup step of this index ([`Transaction::cleanup`]).
    Cleanup(u8),
    /// [`Transaction::adopt`] of the new generation.
    Adopt,
    /// [`Transaction::unlock`] ([`Grain::Statement`]: only when nothing was committed; the
    /// commit released the lock).
    Unlock,
}

/// One transition in progress: the driver's state between two steps.
///
/// `P` is the transaction's [`Transaction::Pending`]. A run is plain data (a model checker
/// keeps one per process in its state); dropping it mid-way is what a crash does to the
/// process's memory — the backend's files and locks are the backend's business.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run<P> {
    grain: Grain,
    event: Event,
    ttl: Duration,
    /// The machine's input, once read.
    input: Option<Input>,
    /// The plan, once decided, and its steps.
    plan: Option<Plan>,
    schedule: Vec<Io>,
    /// The index in `schedule` of the next step.
    at: usize,
    /// Whether this run holds the id's lock.
    locked: bool,
    /// Whether the record was committed.
    committed: bool,
    pending: Option<(P, Local)>,
}

impl<P> Run<P> {
    /// A transition at `grain` for `event` with lease time-to-live `ttl`, not started.
    pub fn new(grain: Grain, event: Event, ttl: Duration) -> Run<P> {
        Run {
            grain,
            event,
            ttl,
            input: None,
            plan: None,
            schedule: match grain {
                Grain::SystemCall => vec![Io::Lock, Io::Begin],
                Grain::Statement => vec![Io::Begin],
            },
            at: 0,
            locked: false,
            committed: false,
            pending: None,
        }
    }

    /// The event this run carries out.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The step the next call of [`Run::next`] performs (`None`: none is left; the previous
    /// call returned [`Step::Done`]).
    pub fn peek(&self) -> Option<Io> {
        self.schedule.get(self.at).copied()
    }

    /// Whether the next step takes the id's lock (and so waits while another run holds it).
    pub fn next_locks(&self) -> bool {
        !self.locked && matches!(self.peek(), Some(Io::Lock | Io::Begin))
    }

    /// Whether the next step can fail (a fault injected there is seen by the driver).
    pub fn next_can_fail(&self) -> bool {
        match self.peek() {
            Some(Io::Begin | Io::Probe { .. }) => true,
            // A best-effort sync's failure is ignored: as good as no failure.
            Some(Io::Commit(CommitStep::SyncDir)) => self
                .plan
                .as_ref()
                .is_some_and(|p| p.sync_dir == DirSync::Required),
            Some(Io::Commit(_)) => true,
            _ => false,
        }
    }

    /// The new generation locked for this run and not adopted yet, if any.
    pub fn pending(&self) -> Option<&Local> {
        self.pending.as_ref().map(|(_, l)| l)
    }

    /// The order of a plan's steps after the decision — the one list every backend and the
    /// model follow: the commit's steps ([`commit_steps`]: a new generation's liveness lock
    /// before the commit point), the cleanup, the new generation adopted, and only then the
    /// lock released (at [`Grain::Statement`] a commit releases it).
    pub fn schedule(grain: Grain, plan: &Plan) -> Vec<Io> {
        let mut steps: Vec<Io> = commit_steps(grain, plan)
            .into_iter()
            .map(Io::Commit)
            .collect();
        for (i, c) in plan.cleanup.iter().enumerate() {
            // No files at statement grain: nothing to delete or sweep.
            if grain == Grain::SystemCall || matches!(c, Cleanup::CloseLocal { .. }) {
                steps.push(Io::Cleanup(index(i)));
            }
        }
        if plan.new_generation().is_some() {
            steps.push(Io::Adopt);
        }
        if grain == Grain::SystemCall || plan.commit.is_none() {
            steps.push(Io::Unlock);
        }
        steps
    }

    /// Performs the next step through `tx` (`id` names the id in errors).
    ///
    /// A failing step ends the run in the same call: the driver undoes what the transition
    /// prepared ([`Transaction::undo`]), releases the lock and returns [`Step::Done`] with the
    /// error.
    ///
    /// # Panics
    ///
    /// When called again after [`Step::Done`].
    pub fn next<T: Transaction<Pending = P>>(&mut self, tx: &mut T, id: &SessionId) -> Step {
        debug_assert_eq!(tx.grain(), self.grain, "a run of another grain");
        let io = self.peek().expect("Run::next called after Done");
        match self.perform(io, tx, id) {
            Ok(true) => {}
            Ok(false) => return Step::Blocked,
            Err(e) => return Step::Done(Err(self.fail(e, tx))),
        }
        self.at += 1;
        if self.at < self.schedule.len() {
            return Step::Continue;
        }
        let plan = self.plan.as_ref().expect("a finished run has a plan");
        Step::Done(Ok(plan.outcome))
    }

    /// Performs `io`; `Ok(false)`: the lock is busy.
    fn perform<T: Transaction<Pending = P>>(
        &mut self,
        io: Io,
        tx: &mut T,
        id: &SessionId,
    ) -> Result<bool, Error> {
        match io {
            Io::Lock => {
                if !tx.lock()? {
                    return Ok(false);
                }
                self.locked = true;
            }
            Io::Begin => {
                if !self.locked {
                    if !tx.lock()? {
                        return Ok(false);
                    }
                    self.locked = true;
                }
                let begun = tx.begin()?;
                self.input = Some(Input {
                    record: begun.record,
                    liveness: None,
                    local: begun.local,
                    now: begun.now,
                    ttl: self.ttl,
                    event: self.event.clone(),
                });
                self.decide(id)?;
            }
            Io::Probe { token } => {
                let input = self.input.as_mut().expect("probe after begin");
                // The machine asks at most once: with liveness known it always plans.
                assert!(input.liveness.is_none(), "machine asked to probe twice");
                input.liveness = Some(tx.probe(token)?);
                self.decide(id)?;
            }
            Io::Commit(step) => {
                let plan = self
                    .plan
                    .as_ref()
                    .expect("a commit step after the decision");
                // A new generation's liveness lock (its step, or the commit point that takes
                // it) must not fail after the commit: only the directory sync can, and then
                // `fail` releases it.
                let sync = (step == CommitStep::SyncDir).then_some(plan.sync_dir);
                let locked = plan.new_generation();
                let result = tx.commit_step(step, plan);
                let taken = match (sync, result) {
                    // A new token that might not survive power loss must not be used: fail;
                    // the failure abandons the new generation's lock, so the visible record
                    // names a dead generation that the next acquire replaces at once.
                    (Some(DirSync::Required), r) => r?,
                    // A tombstone keeps the token: committed is enough, the sync is a bonus.
                    (Some(_), _) => None,
                    (None, r) => r?,
                };
                if let (Some(lock), Some(local)) = (taken, locked) {
                    self.pending = Some((lock, local));
                }
                if step == CommitStep::Point {
                    // Committed: from here on nothing is reported but the outcome (or a
                    // required directory sync's failure).
                    self.committed = true;
                    if self.grain == Grain::Statement {
                        // The `COMMIT` ended the transaction, and its lock with it.
                        self.locked = false;
                        tx.unlock();
                    }
                }
            }
            Io::Cleanup(i) => {
                let plan = self
                    .plan
                    .as_ref()
                    .expect("a cleanup step after the decision");
                tx.cleanup(&plan.cleanup[usize::from(i)]);
            }
            Io::Adopt => {
                if let Some((lock, local)) = self.pending.take() {
                    tx.adopt(lock, local);
                }
            }
            Io::Unlock => {
                if self.locked {
                    tx.unlock();
                    self.locked = false;
                }
            }
        }
        Ok(true)
    }

    /// Asks the machine, and schedules what it answered.
    fn decide(&mut self, id: &SessionId) -> Result<(), Error> {
        let input = self.input.as_ref().expect("a decision after the read");
        match machine::step(input).map_err(|e| step_error(e, id))? {
            Decision::Probe { token } => self.schedule.push(Io::Probe { token }),
            Decision::Plan(plan) => {
                // Checked in every build: a few comparisons beside the transition's system
                // calls, and the model checker (a release build) runs it on every plan.
                assert!(
                    plan.commit_keeps_invariants(input),
                    "a plan breaks the commit's invariants: {input:?} -> {plan:?}"
                );
                self.schedule.extend(Run::<P>::schedule(self.grain, &plan));
                self.plan = Some(plan);
            }
        }
        Ok(())
    }

    /// Ends the run after a step failed with `e`: undoes what it prepared, releases the lock,
    /// and returns `e`.
    fn fail<T: Transaction<Pending = P>>(&mut self, e: Error, tx: &mut T) -> Error {
        if self.plan.is_some() {
            tx.undo(self.pending.take().map(|(lock, _)| lock));
        }
        if self.locked {
            tx.unlock();
            self.locked = false;
        }
        self.at = self.schedule.len();
        e
    }
}

fn index(i: usize) -> u8 {
    // A plan has at most a few preparation and cleanup steps.
    u8::try_from(i).expect("a plan has fewer than 256 steps")
}

fn step_error(e: machine::StepError, id: &SessionId) -> Error {
    match e {
        machine::StepError::TokenExhausted => Error::TokenExhausted { id: id.clone() },
        machine::StepError::ExpiryOutOfRange => Error::ExpiryOutOfRange { id: id.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::Owner;

    /// Every plan the machine makes over a grid of inputs (the record absent, the caller's,
    /// another owner's, a tombstone; unexpired or expired; each liveness; held here or not;
    /// each event).
    fn plans() -> Vec<Plan> {
        let (me, other) = (Owner::new("me").unwrap(), Owner::new("other").unwrap());
        let now = Timestamp::from_unix_secs(100).unwrap();
        let ttl = Duration::from_secs(10);
        let mut records = vec![None];
        for owner in [&me, &other] {
            for expiry in [90, 110] {
                records.push(Some(Record {
                    owner: owner.as_str().to_owned(),
                    token: 3,
                    expiry: Timestamp::from_unix_secs(expiry).unwrap(),
                }));
            }
        }
        records.push(Some(Record {
            owner: String::new(),
            token: 3,
            expiry: now,
        }));
        let events = [
            Event::Acquire { owner: me.clone() },
            Event::Renew {
                owner: me.clone(),
                token: 3,
            },
            Event::Release {
                owner: me.clone(),
                token: 3,
            },
        ];
        let locals = [
            None,
            Some(Local {
                token: 3,
                owner: me.clone(),
            }),
        ];
        let mut plans = vec![];
        for record in &records {
            for event in &events {
                for local in &locals {
                    for liveness in [Liveness::Live, Liveness::Dead, Liveness::Unknown] {
                        let mut input = Input {
                            record: record.clone(),
                            liveness: None,
                            local: local.clone(),
                            now,
                            ttl,
                            event: event.clone(),
                        };
                        loop {
                            match machine::step(&input) {
                                Ok(Decision::Probe { .. }) => input.liveness = Some(liveness),
                                Ok(Decision::Plan(plan)) => break plans.push(plan),
                                Err(_) => break,
                            }
                        }
                    }
                }
            }
        }
        plans
    }

    /// The contracts of the one order, at both grains: exactly one commit point when the plan
    /// commits (none otherwise); a new generation's lock before it (at statement grain, taken
    /// by it); cleanups after it; the adoption after every commit step; the lock released
    /// last, or (statement grain) by the commit itself.
    #[test]
    fn every_plan_has_one_commit_point_in_the_one_order() {
        let plans = plans();
        assert!(plans.len() > 20, "{}", plans.len());
        for plan in &plans {
            for grain in [Grain::SystemCall, Grain::Statement] {
                let steps = Run::<()>::schedule(grain, plan);
                let at = |io: Io| steps.iter().position(|s| *s == io);
                let points = steps
                    .iter()
                    .filter(|s| **s == Io::Commit(CommitStep::Point))
                    .count();
                assert_eq!(
                    points,
                    usize::from(plan.commit.is_some()),
                    "{plan:?} {steps:?}"
                );
                let point = at(Io::Commit(CommitStep::Point));
                let lock_live = at(Io::Commit(CommitStep::LockLive));
                if plan.new_generation().is_some() && plan.commit.is_some() {
                    match grain {
                        Grain::SystemCall => assert!(lock_live < point, "{steps:?}"),
                        Grain::Statement => assert_eq!(lock_live, None, "{steps:?}"),
                    }
                }
                for (i, s) in steps.iter().enumerate() {
                    if matches!(s, Io::Cleanup(_)) {
                        assert!(point.is_none_or(|p| p < i), "{steps:?}");
                    }
                    if matches!(s, Io::Commit(_)) {
                        assert!(at(Io::Adopt).is_none_or(|a| i < a), "{steps:?}");
                    }
                }
                match (grain, plan.commit.is_some()) {
                    (Grain::Statement, true) => assert_eq!(at(Io::Unlock), None, "{steps:?}"),
                    _ => assert_eq!(steps.last(), Some(&Io::Unlock), "{steps:?}"),
                }
            }
        }
    }
}
