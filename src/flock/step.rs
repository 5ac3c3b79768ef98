//! [`Stepper`]: one transition of a real [`FlockLease`] advanced one I/O step at a time, for
//! the lockstep harness that runs the model's schedules against the real adapter; and
//! [`LineStepper`]: one waiting call's place in an id's line of waiters, looked with the
//! harness's clock, for the line's lockstep (feature `fault-injection`; never for production
//! use).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::FlockLease;
use super::queue;
use crate::driver::Grain;
use crate::front::Steps;
use crate::line;
use crate::machine::Event;
use crate::name::SessionId;

/// One transition of a [`FlockLease`] in progress, advanced by `next(&lease)`: the front's own
/// steps (`front::Steps`). Its lock step is one attempt of the production lock — open
/// (creating) `<stem>.lock`, a non-blocking lock, the identity check — answering
/// `Step::Blocked` while another transition holds the lock. Dropping it mid-way closes what it
/// holds (the transition lock, a new generation's liveness file), as a crash would.
pub type Stepper = Steps<super::Files, super::tx::PendingLive>;

impl FlockLease {
    /// A transition for `event` on `id`, not started: see [`Stepper`].
    pub fn stepper(&self, id: &SessionId, event: Event) -> Stepper {
        Steps::new(self, id, event, Grain::SystemCall)
    }
}

impl Stepper {
    /// The temporary record this transition wrote and has not renamed yet.
    pub fn temp_path(&self) -> Option<&Path> {
        let (_, st) = self.held.as_ref()?;
        st.temp.as_ref().map(|(_, p)| p.as_path())
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
            path: queue::path(&self.inner.dir, id.stem()),
            waiter: queue::Waiter::default(),
        }
    }
}

impl LineStepper<'_> {
    /// Takes a place at the end of the line (the wait's first pause).
    pub fn join(&mut self) {
        self.waiter.join(&self.lease.inner.opener, &self.path);
    }

    /// One look at `now` (since the wait began), with the record at `token`: whether the call
    /// may try to acquire.
    pub fn may_try(&mut self, now: Duration, token: Option<u64>) -> bool {
        self.waiter
            .may_try(&self.lease.inner.opener, &self.path, now, || token)
    }

    /// The lease was seen free at `now` with the record at `token`, and it is an earlier
    /// waiter's turn.
    pub fn let_go(&mut self, now: Duration, token: Option<u64>) {
        self.waiter.yielded.let_go(now, token);
    }

    /// A live holder was seen.
    pub fn saw_held(&mut self) {
        self.waiter.yielded.saw_held();
    }

    /// The rule's state: the place in the line (`None`: outside or unqueued) and the count of
    /// the lease left free.
    pub fn state(&self) -> (Option<line::Place>, line::Yielded) {
        self.waiter.rule()
    }
}
