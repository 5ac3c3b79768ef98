//! [`Stepper`]: one transition of a real [`FlockLease`] advanced one I/O step at a time, for
//! the lockstep harness that runs the model's schedules against the real adapter; and
//! [`LineStepper`]: one waiting call's place in an id's line of waiters, looked with the
//! harness's clock, for the line's lockstep (feature `fault-injection`; never for production
//! use).
//!
//! A stepper does what [`FlockLease`]'s calls do, but for the in-process turn on the id (the
//! harness never runs two calls of one instance at once) and the wait for the transition
//! lock: its [`Io::Lock`] step is the production lock loop with a deadline already
//! past — one attempt: open (creating) `<stem>.lock`, a non-blocking lock, the identity check
//! — and answers [`Step::Blocked`] when another transition holds the lock.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::files::HeldLock;
use super::queue;
use super::tx::{FlockTx, PendingLive, TxState};
use super::{FlockLease, SlotEntry, lock};
use crate::driver::{Grain, Io, Run, Step};
use crate::error::Error;
use crate::line;
use crate::machine::Event;
use crate::name::SessionId;

/// One transition of a [`FlockLease`] in progress, advanced by [`Stepper::next`].
///
/// Dropping it mid-way closes what it holds (the transition lock, a new generation's liveness
/// file): what a crash of the process would do to them.
#[derive(Debug)]
pub struct Stepper {
    id: SessionId,
    entry: Arc<SlotEntry>,
    run: Run<PendingLive>,
    lock: Option<HeldLock>,
    st: TxState,
    /// The first step failed before the run started.
    failed: bool,
}

impl FlockLease {
    /// A transition for `event` on `id`, not started: see [`Stepper`].
    pub fn stepper(&self, id: &SessionId, event: Event) -> Stepper {
        Stepper {
            id: id.clone(),
            entry: self.slot(id.stem()),
            run: Run::new(Grain::SystemCall, event, self.ttl),
            lock: None,
            st: TxState::default(),
            failed: false,
        }
    }
}

impl Stepper {
    /// The step the next call of [`Stepper::next`] performs (`None`: the run is over).
    pub fn peek(&self) -> Option<Io> {
        if self.failed {
            return None;
        }
        self.run.peek()
    }

    /// The temporary record this transition wrote and has not renamed yet.
    pub fn temp_path(&self) -> Option<&Path> {
        self.st.temp.as_ref().map(|(_, p)| p.as_path())
    }

    /// Performs the next I/O step on `lease` (the instance that made this stepper).
    ///
    /// # Panics
    ///
    /// When called after [`Step::Done`].
    pub fn next(&mut self, lease: &FlockLease) -> Step {
        let entry = Arc::clone(&self.entry);
        let mut slot = lock(&entry.state);
        if self.run.peek() == Some(Io::Lock) && self.lock.is_none() {
            // The production lock loop, with a deadline already past: one attempt.
            let now = Instant::now();
            match lease.lock_stable(&entry.paths.lock, Some(now), now) {
                Ok(l) => {
                    self.lock = Some(l);
                    self.st.carried_sweep = slot.pending_sweep.take();
                }
                Err(Error::LockTimeout { .. }) => return Step::Blocked,
                Err(e) => {
                    // Nothing was started: the run ends here, as the call would.
                    self.failed = true;
                    return Step::Done(Err(e));
                }
            }
        }
        let lock = self.lock.as_ref().expect("locked before the run's steps");
        let mut tx = FlockTx {
            lease,
            paths: &entry.paths,
            slot: &mut slot,
            stable: &lock.file,
            stable_id: (lock.dev, lock.ino),
            st: &mut self.st,
        };
        let step = self.run.next(&mut tx, &self.id);
        if matches!(step, Step::Done(_))
            && let Some(lock) = self.lock.take()
        {
            lease.end_transition(&mut slot, lock, std::mem::take(&mut self.st));
        }
        step
    }
}

/// One waiting call's part in an id's line of waiters (`<stem>.queue`, PROTOCOL §4.6), for the
/// line's lockstep harness: the very place and count a wait of [`FlockLease::acquire_wait`]
/// keeps (the flock backend's `queue::Waiter`), on the real file, with the harness's clock
/// instead of the call's. Dropping it leaves the line, as the call's return does.
#[derive(Debug)]
pub struct LineStepper<'a> {
    lease: &'a FlockLease,
    path: PathBuf,
    waiter: queue::Waiter,
}

impl FlockLease {
    /// A waiting call's part in `id`'s line, outside the line: see [`LineStepper`].
    pub fn line_stepper(&self, id: &SessionId) -> LineStepper<'_> {
        LineStepper {
            lease: self,
            path: queue::path(&self.dir, id.stem()),
            waiter: queue::Waiter::default(),
        }
    }
}

impl LineStepper<'_> {
    /// Takes a place at the end of the line (the wait's first pause).
    pub fn join(&mut self) {
        self.waiter.join(&self.lease.opener, &self.path);
    }

    /// One look at `now` (since the wait began): whether the call may try to acquire.
    pub fn may_try(&mut self, now: Duration) -> bool {
        self.waiter.may_try(&self.lease.opener, &self.path, now)
    }

    /// The lease was seen free at `now` with the record at `token`, and it is an earlier
    /// waiter's turn.
    pub fn let_go(&mut self, now: Duration, token: Option<u64>) {
        self.waiter.let_go(now, token);
    }

    /// A live holder was seen.
    pub fn saw_held(&mut self) {
        self.waiter.saw_held();
    }

    /// The rule's state: the place in the line (`None`: outside or unqueued) and the count of
    /// the lease left free.
    pub fn state(&self) -> (Option<line::Place>, line::Yielded) {
        self.waiter.rule()
    }
}
