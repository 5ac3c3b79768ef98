//! The one interpreter of a [`Plan`], shared by every backend and by the
//! model checker.
//!
//! A backend implements [`Transaction`] — the primitive I/O steps on one id's state — and
//! [`Run`] does the rest: it takes the transition lock, reads, asks the machine, probes when
//! asked, prepares, writes the temporary record, syncs it, renames it, syncs the directory,
//! cleans up, adopts the new generation and unlocks, in that order. No backend decides
//! anything about expiry, tokens or owners, and none chooses the order of its own steps.
//!
//! [`Run`] performs **one I/O step per call** of [`Run::next`], so a model checker can
//! interleave the steps of several processes and crash a process between any two of them;
//! [`run`] simply calls it until the transition is done, which is what the adapters do.
//! The order of the steps is [`Run::schedule`]: one list, read by every caller.

use std::time::Duration;

use crate::error::Error;
use crate::machine::{
    self, Cleanup, Decision, DirSync, Event, Input, Liveness, Local, Outcome, Plan, Prepare,
};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// The primitive steps of one transition on one id.
///
/// [`Run`] calls them in its [order](Run::schedule). Failures of the steps that return
/// `Result` abort the transition; the others are cleanup after a commit and must not fail (a
/// backend logs or ignores what it cannot do there).
pub trait Transaction {
    /// A liveness lock taken for a new generation, not yet adopted.
    type Pending;

    /// Takes the id's transition lock without blocking: `Ok(false)` when another transition
    /// holds it (the run then waits at this step). An adapter that takes the lock itself
    /// before the run, with its own bounded wait, keeps this default.
    ///
    /// # Errors
    ///
    /// I/O failure.
    fn lock_stable(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    /// Releases the id's transition lock. The default does nothing (an adapter whose lock is
    /// a scope, such as a mutex guard, releases it when the run's caller returns).
    fn unlock_stable(&mut self) {}

    /// The current wall-clock time, read once per transition, under the transition lock.
    fn now(&self) -> Timestamp;

    /// Reads the record (`None` when there is none).
    ///
    /// # Errors
    ///
    /// I/O failure, or [`Error::Corrupt`].
    fn read(&mut self) -> Result<Option<Record>, Error>;

    /// The generation this instance holds for the id.
    fn local(&self) -> Option<Local>;

    /// Probes generation `token`'s liveness lock without creating its file or blocking.
    ///
    /// # Errors
    ///
    /// I/O failure other than "no such file".
    fn probe(&mut self, token: u64) -> Result<Liveness, Error>;

    /// Creates and locks generation `token`'s liveness lock ([`Prepare::LockLive`]).
    ///
    /// # Errors
    ///
    /// I/O failure, or the lock is unexpectedly held.
    fn lock_live(&mut self, token: u64) -> Result<Self::Pending, Error>;

    /// Releases a liveness lock taken by [`Transaction::lock_live`] that will not be adopted
    /// (a later step failed). Its file stays.
    fn abandon(&mut self, pending: Self::Pending);

    /// Checks the local generation's liveness file is in place, restoring it if not
    /// ([`Prepare::EnsureLive`]).
    ///
    /// # Errors
    ///
    /// I/O failure.
    fn ensure_live(&mut self, token: u64) -> Result<(), Error>;

    /// Creates the temporary record file (replacing any leftover) and writes `record` to it.
    ///
    /// # Errors
    ///
    /// I/O failure; the driver then calls [`Transaction::discard_temp`].
    fn write_temp(&mut self, record: &Record) -> Result<(), Error>;

    /// Makes the temporary file's contents durable (a backend or a mode without fsync
    /// returns `Ok`).
    ///
    /// # Errors
    ///
    /// I/O failure; the driver then calls [`Transaction::discard_temp`].
    fn sync_temp(&mut self) -> Result<(), Error>;

    /// Renames the temporary file over the record: the commit.
    ///
    /// # Errors
    ///
    /// I/O failure; the old record then stands, and the driver calls
    /// [`Transaction::discard_temp`].
    fn rename(&mut self) -> Result<(), Error>;

    /// Removes the temporary file this transition created, after a failure before the
    /// commit.
    fn discard_temp(&mut self);

    /// Makes the last commit durable (the directory sync after the rename); called when the
    /// plan asks for it ([`DirSync`]). A backend without such a step returns `Ok`.
    ///
    /// # Errors
    ///
    /// I/O failure: the committed record is visible but may not survive power loss.
    fn sync_dir(&mut self) -> Result<(), Error>;

    /// Closes and forgets the local generation `token` (nothing if another is held).
    fn close_local(&mut self, token: u64);

    /// Deletes generation `token`'s liveness file, if present.
    fn delete_live(&mut self, token: u64);

    /// Deletes liveness files of generations below `below` and leftover temporary files:
    /// cleanup after the commit, best effort. An adapter may delete the dead generation's
    /// (`below - 1`) at once and leave the rest to its next transition on the id, still under
    /// the transition lock and within the bound [`machine::deferred_sweep_below`] gives for the
    /// record that transition reads (the flock adapter does, so a takeover never lists the
    /// directory).
    fn sweep(&mut self, below: u64);

    /// Makes `pending` the local generation `local`.
    fn adopt(&mut self, pending: Self::Pending, local: Local);
}

/// Runs one transition for `event` on `id` through `tx`, and returns the machine's outcome:
/// [`Run::next`] until it is done.
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
/// If the transaction's [`Transaction::lock_stable`] keeps answering "busy": an adapter that
/// calls `run` holds the transition lock already (the default answers `Ok(true)`).
pub fn run<T: Transaction>(
    tx: &mut T,
    id: &SessionId,
    ttl: Duration,
    event: Event,
) -> Result<Outcome, Error> {
    let mut run = Run::new(event, ttl);
    loop {
        match run.next(tx, id) {
            Step::Done(result) => return result,
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
    /// The transition lock is held by another transition; nothing was done.
    Blocked,
    /// The transition is over (the lock is released): its result.
    Done(Result<Outcome, Error>),
}

/// One I/O step of a transition, as [`Run::schedule`] orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Io {
    /// [`Transaction::lock_stable`].
    LockStable,
    /// [`Transaction::now`], [`Transaction::read`] and [`Transaction::local`], then the
    /// machine's decision.
    Read,
    /// [`Transaction::probe`] of the generation the machine named
    /// ([`Decision::Probe`]), then the machine's decision.
    Probe {
        /// The generation to probe.
        token: u64,
    },
    /// The plan's preparation step of this index ([`Transaction::lock_live`] or
    /// [`Transaction::ensure_live`]).
    Prepare(u8),
    /// [`Transaction::write_temp`].
    WriteTemp,
    /// [`Transaction::sync_temp`].
    SyncTemp,
    /// [`Transaction::rename`]: the commit.
    Rename,
    /// [`Transaction::sync_dir`].
    SyncDir,
    /// The plan's cleanup step of this index.
    Cleanup(u8),
    /// [`Transaction::adopt`] of the new generation.
    Adopt,
    /// [`Transaction::unlock_stable`].
    UnlockStable,
}

/// One transition in progress: the driver's state between two I/O steps.
///
/// `P` is the transaction's [`Transaction::Pending`]. A run is plain data (a model checker
/// keeps one per process in its state); dropping it mid-way is what a crash does to the
/// process's memory — the backend's files and locks are the backend's business.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run<P> {
    event: Event,
    ttl: Duration,
    /// The machine's input, once read.
    input: Option<Input>,
    /// The plan, once decided, and its steps.
    plan: Option<Plan>,
    schedule: Vec<Io>,
    /// The index in `schedule` of the next step.
    at: usize,
    /// Whether this run holds the transition lock.
    locked: bool,
    /// Whether the record was renamed into place.
    committed: bool,
    pending: Option<(P, Local)>,
}

impl<P> Run<P> {
    /// A transition for `event` with lease time-to-live `ttl`, not started.
    pub fn new(event: Event, ttl: Duration) -> Run<P> {
        Run {
            event,
            ttl,
            input: None,
            plan: None,
            schedule: vec![Io::LockStable, Io::Read],
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

    /// Whether the next step can fail (a fault injected there is seen by the driver).
    pub fn next_can_fail(&self) -> bool {
        match self.peek() {
            Some(Io::Read | Io::Probe { .. } | Io::Prepare(_) | Io::WriteTemp | Io::SyncTemp) => {
                true
            }
            Some(Io::Rename) => true,
            // A best-effort sync's failure is ignored: as good as no failure.
            Some(Io::SyncDir) => self
                .plan
                .as_ref()
                .is_some_and(|p| p.sync_dir == DirSync::Required),
            _ => false,
        }
    }

    /// The plan, once the machine has decided.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    /// Whether this run holds the transition lock.
    pub fn holds_lock(&self) -> bool {
        self.locked
    }

    /// Whether the record has been renamed into place.
    pub fn committed(&self) -> bool {
        self.committed
    }

    /// The new generation locked for this run and not adopted yet, if any.
    pub fn pending(&self) -> Option<&Local> {
        self.pending.as_ref().map(|(_, l)| l)
    }

    /// The order of a plan's I/O steps after the decision — the one list every backend and
    /// the model follow: the new generation's liveness lock before the commit, the commit
    /// (temporary file, its fsync, the rename, the directory fsync), the cleanup, the new
    /// generation adopted, and only then the transition lock released.
    pub fn schedule(plan: &Plan) -> Vec<Io> {
        let mut steps = Vec::new();
        for i in 0..plan.prepare.len() {
            steps.push(Io::Prepare(index(i)));
        }
        if plan.commit.is_some() {
            steps.extend([Io::WriteTemp, Io::SyncTemp, Io::Rename]);
            if plan.sync_dir != DirSync::No {
                steps.push(Io::SyncDir);
            }
        }
        for i in 0..plan.cleanup.len() {
            steps.push(Io::Cleanup(index(i)));
        }
        if plan
            .prepare
            .iter()
            .any(|p| matches!(p, Prepare::LockLive { .. }))
        {
            steps.push(Io::Adopt);
        }
        steps.push(Io::UnlockStable);
        steps
    }

    /// Performs the next I/O step through `tx` (`id` names the id in errors).
    ///
    /// A failing step ends the run in the same call: the driver abandons a new generation's
    /// lock, removes the temporary file if the failure came before the commit, releases the
    /// transition lock and returns [`Step::Done`] with the error.
    ///
    /// # Panics
    ///
    /// When called again after [`Step::Done`].
    pub fn next<T: Transaction<Pending = P>>(&mut self, tx: &mut T, id: &SessionId) -> Step {
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
        // The last step was the unlock.
        let plan = self.plan.as_ref().expect("a finished run has a plan");
        Step::Done(Ok(plan.outcome))
    }

    /// Performs `io`; `Ok(false)`: the transition lock is busy.
    fn perform<T: Transaction<Pending = P>>(
        &mut self,
        io: Io,
        tx: &mut T,
        id: &SessionId,
    ) -> Result<bool, Error> {
        match io {
            Io::LockStable => {
                if !tx.lock_stable()? {
                    return Ok(false);
                }
                self.locked = true;
            }
            Io::Read => {
                let now = tx.now();
                let record = tx.read()?;
                self.input = Some(Input {
                    record,
                    liveness: None,
                    local: tx.local(),
                    now,
                    ttl: self.ttl,
                    event: self.event.clone(),
                });
                self.decide(id)?;
            }
            Io::Probe { token } => {
                let input = self.input.as_mut().expect("probe after read");
                // The machine asks at most once: with liveness known it always plans.
                assert!(input.liveness.is_none(), "machine asked to probe twice");
                input.liveness = Some(tx.probe(token)?);
                self.decide(id)?;
            }
            Io::Prepare(i) => match self.plan().map(|p| p.prepare[usize::from(i)].clone()) {
                Some(Prepare::LockLive { token, owner }) => {
                    let lock = tx.lock_live(token)?;
                    self.pending = Some((lock, Local { token, owner }));
                }
                Some(Prepare::EnsureLive { token }) => tx.ensure_live(token)?,
                None => unreachable!("a preparation step without a plan"),
            },
            Io::WriteTemp => {
                let plan = self.plan.as_ref().expect("a write after the decision");
                tx.write_temp(plan.commit.as_ref().expect("a write with a record"))?;
            }
            Io::SyncTemp => tx.sync_temp()?,
            Io::Rename => {
                tx.rename()?;
                // Committed: from here on nothing is reported but the outcome (or a required
                // directory sync's failure).
                self.committed = true;
            }
            Io::SyncDir => match self.plan.as_ref().map(|p| p.sync_dir) {
                // A new token that might not survive power loss must not be used: fail; the
                // failure abandons the new generation's lock, so the visible record names a
                // dead generation that the next acquire replaces at once.
                Some(DirSync::Required) => tx.sync_dir()?,
                // A tombstone keeps the token: committed is enough, the sync is a bonus.
                Some(DirSync::BestEffort) => {
                    let _ = tx.sync_dir();
                }
                Some(DirSync::No) | None => {}
            },
            Io::Cleanup(i) => match self.plan().map(|p| p.cleanup[usize::from(i)].clone()) {
                Some(Cleanup::CloseLocal { token }) => tx.close_local(token),
                Some(Cleanup::DeleteLive { token }) => tx.delete_live(token),
                Some(Cleanup::Sweep { below }) => tx.sweep(below),
                None => unreachable!("a cleanup step without a plan"),
            },
            Io::Adopt => {
                if let Some((lock, local)) = self.pending.take() {
                    tx.adopt(lock, local);
                }
            }
            Io::UnlockStable => {
                if self.locked {
                    tx.unlock_stable();
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
                self.schedule.extend(Run::<P>::schedule(&plan));
                self.plan = Some(plan);
            }
        }
        Ok(())
    }

    /// Ends the run after step `at` failed with `e`: drops what it prepared, releases the
    /// transition lock, and returns `e`.
    fn fail<T: Transaction<Pending = P>>(&mut self, e: Error, tx: &mut T) -> Error {
        if let Some((lock, _)) = self.pending.take() {
            tx.abandon(lock);
        }
        if matches!(self.peek(), Some(Io::WriteTemp | Io::SyncTemp | Io::Rename)) {
            tx.discard_temp();
        }
        if self.locked {
            tx.unlock_stable();
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
