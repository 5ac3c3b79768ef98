//! The front every backend shares, between the public calls and the driver's run:
//! - the per-id [`Registry`] of an instance;
//! - each id's in-process turn ([`Gate`], with each caller's own deadline);
//! - one [`transition`] in [`TRANSITION`]'s order, its lock taken by the one bounded
//!   begin-or-wait loop ([`begin_or_wait`]);
//! - the one [`SessionLease`](crate::SessionLease) path: an acquire, renew or release as a
//!   machine event, its outcome as the caller's [`Grant`], never a grant already expired
//!   ([`checked`]).
//!
//! A backend gives the front its entries, one attempt at an id's lock, the transaction under
//! it and its end ([`Backend`]); [`session_lease!`] gives it the trait and the same inherent
//! `acquire`, `renew`, `release`, `acquire_guard` methods as every other backend.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::driver::{self, Hold, HoldStep, TRANSITION, Transaction};
#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
use crate::driver::{Grain, Io, Run, Step};
use crate::error::{Error, LockOf};
use crate::lease::{Grant, Lease};
use crate::machine::{self, Event, Outcome};
use crate::name::{Owner, SessionId};

/// What a backend gives the front: its entry for an id, one attempt at the id's transition
/// lock ([`Backend::begin`]), the transaction that runs under it ([`Backend::tx`]) and the
/// end of it ([`Backend::end`]). The front does the rest, the same for every backend
/// ([`transition`]): the registry's entry, the turn with the caller's deadline, the bounded
/// begin-or-wait loop, the run, the end — in [`TRANSITION`]'s order — and above it the one
/// [`SessionLease`](crate::SessionLease) path with its grant and final expiry check.
pub(crate) trait Backend {
    /// What the instance keeps for one id: made on first use, pruned when idle.
    type Entry: Idle;
    /// The part of an entry a transition changes, under the entry's mutex.
    type State;
    /// The id's transition lock once taken, with what the run carries to its end.
    type Held;
    /// A new generation's liveness lock, taken and not adopted yet.
    type Pending;
    /// One transition under the lock.
    type Tx<'a>: Transaction<Pending = Self::Pending>
    where
        Self: 'a;
    /// What a transition hands its caller besides the outcome (PostgreSQL: the wait for the
    /// holder an acquire was answered held by).
    type After;

    /// This instance's entry for `id`.
    fn entry(&self, id: &SessionId) -> Arc<Self::Entry>;

    /// An entry's turn and state.
    fn parts(entry: &Self::Entry) -> (&Gate, &Mutex<Self::State>);

    /// How long a call may wait for an id's turn and transition lock (`Duration::MAX`: no
    /// limit).
    fn lock_timeout(&self) -> Duration;

    /// The lease time-to-live.
    fn ttl(&self) -> Duration;

    /// The lock an [`Error::LockTimeout`] on `id` names.
    fn lock_of(&self, id: &SessionId, entry: &Self::Entry) -> LockOf;

    /// One attempt at `id`'s transition lock for `event`, waiting for it until `deadline` at
    /// most. `Ok(None)`: not taken (busy to the deadline, or the lock was replaced while
    /// waited for); [`begin_or_wait`] tries again while the deadline has not passed.
    ///
    /// # Errors
    ///
    /// I/O failure; nothing is held then.
    fn begin(
        &self,
        id: &SessionId,
        entry: &Self::Entry,
        state: &mut Self::State,
        event: &Event,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Held>, Error>;

    /// The transaction of one run under `held`.
    fn tx<'a>(
        &'a self,
        id: &'a SessionId,
        entry: &'a Self::Entry,
        state: &'a mut Self::State,
        held: &'a mut Self::Held,
    ) -> Self::Tx<'a>;

    /// Ends a run that answered `outcome`: gives back the lock if the run did not, keeps what
    /// the instance keeps.
    fn end(
        &self,
        entry: &Self::Entry,
        state: &mut Self::State,
        held: Self::Held,
        outcome: &Result<Outcome, Error>,
    ) -> Self::After;

    /// Called after each step of [`TRANSITION`] (the flock backend's fault hook).
    fn observe(&self, entry: &Self::Entry) {
        let _ = entry;
    }

    /// The clock expiry is judged by as a call returns ([`checked`]).
    fn lease_clock(&self) -> Arc<dyn Clock>;

    /// [`SessionLease::on_liveness_lost`](crate::SessionLease::on_liveness_lost); the default
    /// drops `notify` (a backend that cannot tell).
    fn on_liveness_lost(&self, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        let _ = (lease, notify);
    }

    /// [`SessionLease::store_gone`](crate::SessionLease::store_gone); the default: never.
    fn store_gone(&self) -> Option<String> {
        None
    }
}

/// One transition for `event` on `id`, the same for every backend: [`TRANSITION`]'s steps —
/// the id's turn by the caller's deadline (this call's lock timeout from now), the state, the
/// transition lock ([`begin_or_wait`]), the run ([`driver::run`]), the end.
///
/// # Errors
///
/// [`Error::LockTimeout`] when the turn or the lock is not had by the deadline; whatever
/// [`Backend::begin`] or the run reports.
pub(crate) fn transition<B: Backend + ?Sized>(
    b: &B,
    id: &SessionId,
    event: Event,
) -> Result<(Outcome, B::After), Error> {
    let started = Instant::now();
    let deadline = deadline_after(b.lock_timeout());
    let entry = b.entry(id);
    let state = B::parts(&entry).1;
    let timeout = || timed_out(b, id, &entry, started);
    let (mut turn, mut slot, mut held) = (None, None, None);
    let (mut event, mut outcome, mut after) = (Some(event), None, None);
    for step in TRANSITION {
        match step {
            HoldStep::Take(Hold::Turn) => {
                turn = Some(self::turn(b, id, &entry, deadline, started)?)
            }
            HoldStep::Take(Hold::State) => slot = Some(lock(state)),
            HoldStep::Take(Hold::Lock) => {
                let st = slot.as_mut().expect("TRANSITION takes the state first");
                let ev = event.as_ref().expect("TRANSITION locks before it runs");
                held = Some(begin_or_wait(deadline, timeout, || {
                    b.begin(id, &entry, st, ev, deadline)
                })?);
            }
            // A transition's checks are the machine's, in its run.
            HoldStep::Check => {}
            HoldStep::Run => {
                let st = slot.as_mut().expect("TRANSITION takes the state first");
                let h = held.as_mut().expect("TRANSITION takes the lock first");
                let event = event.take().expect("TRANSITION runs once");
                let mut tx = b.tx(id, &entry, st, h);
                outcome = Some(driver::run(&mut tx, id, b.ttl(), event));
            }
            HoldStep::Give(Hold::Lock) => {
                if let (Some(st), Some(h), Some(o)) = (slot.as_mut(), held.take(), &outcome) {
                    after = Some(b.end(&entry, st, h, o));
                }
            }
            HoldStep::Give(Hold::State) => slot = None,
            HoldStep::Give(Hold::Turn) => turn = None,
        }
        b.observe(&entry);
    }
    debug_assert!(turn.is_none() && slot.is_none() && held.is_none());
    let outcome = outcome.expect("TRANSITION runs")?;
    Ok((outcome, after.expect("TRANSITION ends the run")))
}

/// `id`'s in-process turn on `b` by `deadline` (`None`: no limit), or the call's
/// [`Error::LockTimeout`] (it `started` waiting then): a transition's, a fenced section's, and
/// a waiting PostgreSQL acquire's first look at what its instance holds.
pub(crate) fn turn<'e, B: Backend + ?Sized>(
    b: &B,
    id: &SessionId,
    entry: &'e B::Entry,
    deadline: Option<Instant>,
    started: Instant,
) -> Result<Turn<'e>, Error>
where
    B::State: 'e,
{
    B::parts(entry)
        .0
        .enter(deadline)
        .ok_or_else(|| timed_out(b, id, entry, started))
}

/// The [`Error::LockTimeout`] of a call on `id` that `started` waiting for `b`'s lock of it.
fn timed_out<B: Backend + ?Sized>(
    b: &B,
    id: &SessionId,
    entry: &B::Entry,
    started: Instant,
) -> Error {
    Error::LockTimeout {
        lock: b.lock_of(id, entry),
        waited: started.elapsed(),
    }
}

/// The bounded begin-or-wait loop an id's transition lock is taken by, for every backend (and
/// a fence's lock and a fenced section's, through `flock::files::lock_at_path`): `attempt`
/// (which may wait until `deadline` itself) until it answers the lock, fails, or answers
/// `None` with the deadline past ([`Error::LockTimeout`] by `timeout`).
///
/// # Errors
///
/// `attempt`'s, or `timeout`'s at the deadline.
pub(crate) fn begin_or_wait<T>(
    deadline: Option<Instant>,
    timeout: impl Fn() -> Error,
    mut attempt: impl FnMut() -> Result<Option<T>, Error>,
) -> Result<T, Error> {
    loop {
        if let Some(taken) = attempt()? {
            return Ok(taken);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timeout());
        }
    }
}

/// One transition advanced one step at a time, for the lockstep harnesses: the very
/// [`Backend::begin`], [`Backend::tx`] and [`Backend::end`] a call runs, without the turn (the
/// harness never runs two calls of one instance at once) and with the deadline the harness
/// gives (the flock stepper's: one attempt per step, [`Step::Blocked`] while another
/// transition holds the lock).
#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
pub(crate) struct Steps<B: Backend> {
    id: SessionId,
    entry: Arc<B::Entry>,
    run: Run<B::Pending>,
    /// The lock and what the run carries, once begun (the steppers read it).
    pub(crate) held: Option<B::Held>,
    /// The lock could not be had for an error: the run ended before its first step.
    failed: bool,
}

#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
impl<B: Backend> std::fmt::Debug for Steps<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("id", &self.id)
            .field("next", &self.peek())
            .finish_non_exhaustive()
    }
}

#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
impl<B: Backend> Steps<B> {
    /// A transition of `b` for `event` on `id`, at `grain`, not started.
    pub(crate) fn new(b: &B, id: &SessionId, event: Event, grain: Grain) -> Self {
        Steps {
            id: id.clone(),
            entry: b.entry(id),
            run: Run::new(grain, event, b.ttl()),
            held: None,
            failed: false,
        }
    }

    /// The step the next call of [`Steps::next`] performs (`None`: the run is over).
    pub(crate) fn peek(&self) -> Option<Io> {
        if self.failed { None } else { self.run.peek() }
    }

    /// Performs the next step on `b` (the instance that made these steps); the lock, when it
    /// is not held yet, is begun with `deadline` (a deadline already past: one attempt).
    pub(crate) fn next(&mut self, b: &B, deadline: Option<Instant>) -> Step {
        let entry = Arc::clone(&self.entry);
        let mut state = lock(B::parts(&entry).1);
        assert!(!self.failed, "a step after the run failed to begin");
        // Begun at the run's first step only: after its last there is no lock to take (and the
        // call panics below, as documented).
        if self.held.is_none() && self.run.peek().is_some() {
            match b.begin(&self.id, &entry, &mut state, self.run.event(), deadline) {
                Ok(Some(held)) => self.held = Some(held),
                Ok(None) => return Step::Blocked,
                Err(e) => {
                    // Nothing was started: the run ends here, as the call would.
                    self.failed = true;
                    return Step::Done(Err(e));
                }
            }
        }
        let held = self.held.as_mut().expect("locked before the run's steps");
        let mut tx = b.tx(&self.id, &entry, &mut state, held);
        let step = self.run.next(&mut tx, &self.id);
        drop(tx);
        if let Step::Done(outcome) = &step
            && let Some(held) = self.held.take()
        {
            b.end(&entry, &mut state, held, outcome);
        }
        step
    }
}

/// [`SessionLease::acquire`](crate::SessionLease::acquire) for every backend.
pub(crate) fn acquire<B: Backend + ?Sized>(
    b: &B,
    id: &SessionId,
    owner: &Owner,
) -> Result<Grant, Error> {
    let event = Event::Acquire {
        owner: owner.clone(),
    };
    checked(b, id, owner, transition(b, id, event).map(|(o, _)| o))
}

/// [`SessionLease::renew`](crate::SessionLease::renew) for every backend.
pub(crate) fn renew<B: Backend + ?Sized>(b: &B, lease: &Lease) -> Result<Grant, Error> {
    let event = Event::Renew {
        owner: lease.owner.clone(),
        token: lease.token,
    };
    let answer = transition(b, &lease.session_id, event).map(|(o, _)| o);
    checked(b, &lease.session_id, &lease.owner, answer)
}

/// [`SessionLease::release`](crate::SessionLease::release) for every backend.
pub(crate) fn release<B: Backend + ?Sized>(b: &B, lease: &Lease) -> Result<(), Error> {
    let event = Event::Release {
        owner: lease.owner.clone(),
        token: lease.token,
    };
    transition(b, &lease.session_id, event).map(drop)
}

/// `answer` (an acquire's or a renew's, for `owner` on `id`) as the caller gets it from `b`:
/// never a grant already expired on `b`'s clock. The call's final expiry check
/// ([`machine::FinalCheck`]) decides: returned while unexpired; renewed on `b` first — which
/// succeeds only if nobody took over meanwhile (the machine decides) — and judged again; or
/// answered lost ([`Grant::Held`]) once still expired after [`machine::RECLAIMS`] renews, or
/// when a renew failed (never an error: the first answer's commit happened, and an expired
/// lease is free for others whatever this instance still holds).
pub(crate) fn checked<B: Backend + ?Sized>(
    b: &B,
    id: &SessionId,
    owner: &Owner,
    mut answer: Result<Outcome, Error>,
) -> Result<Grant, Error> {
    let mut check = machine::FinalCheck::default();
    loop {
        match check.next(answer, || b.lease_clock().now()) {
            machine::Then::Return(answer) => return answer.map(|o| grant(o, id, owner)),
            machine::Then::Renew { token } => {
                let owner = owner.clone();
                answer = transition(b, id, Event::Renew { owner, token }).map(|(o, _)| o);
            }
        }
    }
}

/// The deadline `timeout` from now; `None` (no limit) when it lies beyond what `Instant` can
/// represent. Every caller's bound on a wait starts here.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// Turns an acquire or renew outcome into the caller's [`Grant`].
pub(crate) fn grant(outcome: Outcome, id: &SessionId, owner: &Owner) -> Grant {
    match outcome {
        Outcome::Granted { token, expiry } => Grant::Granted(Lease {
            session_id: id.clone(),
            owner: owner.clone(),
            token,
            expiry,
        }),
        Outcome::Held => Grant::Held,
        // The machine answers Released only to a release event.
        Outcome::Released => unreachable!("acquire or renew answered Released"),
    }
}

/// Implements [`SessionLease`](crate::SessionLease) for a [`Backend`] through the front, and
/// gives it inherent `acquire`, `renew`, `release` and `acquire_guard` methods that call it, so
/// that callers of every backend need not import the trait.
macro_rules! session_lease {
    ($adapter:ty) => {
        impl $crate::SessionLease for $adapter {
            fn acquire(
                &self,
                id: &$crate::SessionId,
                owner: &$crate::Owner,
            ) -> Result<$crate::Grant, $crate::Error> {
                $crate::front::acquire(self, id, owner)
            }

            fn renew(&self, lease: &$crate::Lease) -> Result<$crate::Grant, $crate::Error> {
                $crate::front::renew(self, lease)
            }

            fn clock(&self) -> std::sync::Arc<dyn $crate::Clock> {
                $crate::front::Backend::lease_clock(self)
            }

            fn release(&self, lease: &$crate::Lease) -> Result<(), $crate::Error> {
                $crate::front::release(self, lease)
            }

            fn on_liveness_lost(&self, lease: &$crate::Lease, notify: Box<dyn FnOnce() + Send>) {
                $crate::front::Backend::on_liveness_lost(self, lease, notify)
            }

            fn store_gone(&self) -> Option<String> {
                $crate::front::Backend::store_gone(self)
            }
        }

        impl $adapter {
            /// [`SessionLease::acquire`](crate::SessionLease::acquire), callable without
            /// importing the trait.
            ///
            /// # Errors
            ///
            /// As [`SessionLease::acquire`](crate::SessionLease::acquire).
            pub fn acquire(
                &self,
                id: &$crate::SessionId,
                owner: &$crate::Owner,
            ) -> Result<$crate::Grant, $crate::Error> {
                <Self as $crate::SessionLease>::acquire(self, id, owner)
            }

            /// [`SessionLease::renew`](crate::SessionLease::renew), callable without importing
            /// the trait.
            ///
            /// # Errors
            ///
            /// As [`SessionLease::renew`](crate::SessionLease::renew).
            pub fn renew(&self, lease: &$crate::Lease) -> Result<$crate::Grant, $crate::Error> {
                <Self as $crate::SessionLease>::renew(self, lease)
            }

            /// [`SessionLease::release`](crate::SessionLease::release), callable without
            /// importing the trait.
            ///
            /// # Errors
            ///
            /// As [`SessionLease::release`](crate::SessionLease::release).
            pub fn release(&self, lease: &$crate::Lease) -> Result<(), $crate::Error> {
                <Self as $crate::SessionLease>::release(self, lease)
            }

            /// [`SessionLease::acquire_guard`](crate::SessionLease::acquire_guard), callable
            /// without importing the trait.
            ///
            /// # Errors
            ///
            /// As [`SessionLease::acquire`](crate::SessionLease::acquire).
            pub fn acquire_guard(
                &self,
                id: &$crate::SessionId,
            ) -> Result<Option<$crate::LeaseGuard<'_, Self>>, $crate::Error> {
                <Self as $crate::SessionLease>::acquire_guard(self, id)
            }
        }
    };
}
pub(crate) use session_lease;

/// The per-id entries of one instance: one per id in use, made on first use; idle ones are
/// pruned when the map grows past [`PRUNE_AT`], then past twice the size left after pruning,
/// so memory stays bounded by the ids in use, not every id ever seen.
#[derive(Debug)]
pub(crate) struct Registry<E> {
    slots: Mutex<Slots<E>>,
}

#[derive(Debug)]
struct Slots<E> {
    map: HashMap<String, Arc<E>>,
    prune_at: usize,
}

/// The size of a registry that first makes it prune its idle entries.
pub(crate) const PRUNE_AT: usize = 1024;

/// A registry entry that can tell whether it is idle (may be pruned).
pub(crate) trait Idle {
    /// Whether nobody is inside and nothing is held for the id. Never waits: an entry whose
    /// state is locked is in use.
    fn idle(&self) -> bool;
}

impl<E: Idle> Registry<E> {
    /// The entry for `key`, made by `new` if there is none.
    pub(crate) fn entry(&self, key: &str, new: impl FnOnce() -> E) -> Arc<E> {
        let mut slots = lock(&self.slots);
        if let Some(entry) = slots.map.get(key) {
            return Arc::clone(entry);
        }
        if slots.map.len() >= slots.prune_at {
            // Only the map refers to an entry with a strong count of one, and new references
            // are made under the map's lock: nobody can be about to use a removed entry.
            slots
                .map
                .retain(|_, entry| Arc::strong_count(entry) != 1 || !entry.idle());
            slots.prune_at = (slots.map.len() * 2).max(PRUNE_AT);
        }
        let entry = Arc::new(new());
        slots.map.insert(key.to_owned(), Arc::clone(&entry));
        entry
    }

    /// How many ids have an entry.
    pub(crate) fn len(&self) -> usize {
        lock(&self.slots).map.len()
    }

    /// Every entry (for an instance's drop, or to give back what entries keep).
    pub(crate) fn entries(&self) -> Vec<Arc<E>> {
        lock(&self.slots).map.values().cloned().collect()
    }
}

impl<E> Default for Registry<E> {
    fn default() -> Self {
        Registry {
            slots: Mutex::new(Slots {
                map: HashMap::new(),
                prune_at: PRUNE_AT,
            }),
        }
    }
}

/// One id's in-process turn: at most one caller of an instance runs a transition on an id.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    free: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    busy: bool,
    /// Callers waiting for the turn: only then does leaving it wake anyone (a condition
    /// variable's notify is a system call even with nobody waiting).
    waiting: usize,
}

impl Gate {
    /// Takes the turn, waiting until `deadline` at most (`None`: no limit). Returns `None` at
    /// the deadline.
    pub(crate) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let mut st = lock(&self.state);
        while st.busy {
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    Some(left)
                }
            };
            st.waiting += 1;
            st = match left {
                None => self.free.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.free
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            st.waiting -= 1;
        }
        st.busy = true;
        Some(Turn { gate: self })
    }

    /// Whether nobody has the turn now (for pruning idle ids).
    pub(crate) fn is_free(&self) -> bool {
        self.state
            .try_lock()
            .is_ok_and(|st| !st.busy && st.waiting == 0)
    }
}

/// A caller's turn on an id; dropping it (also on unwinding) lets the next caller in.
pub(crate) struct Turn<'a> {
    gate: &'a Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.gate.state);
        st.busy = false;
        if st.waiting > 0 {
            self.gate.free.notify_one();
        }
    }
}

/// Locks `m`, also after a panic of another thread that held it: the crate's maps, slots,
/// pools and flags are changed in single steps, so what a panic left is usable data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
