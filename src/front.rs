//! The front every backend shares: [`Leases`], one lease manager over one [`Backend`].
//!
//! The front owns what is the same for every backend — the per-id [`Registry`], each id's
//! in-process turn ([`Gate`], with each caller's own deadline) and state mutex ([`Entry`]),
//! the TTL, the lock timeout, the clock — and runs one [`transition`] as straight-line code
//! in the order the model checks (`driver::TRANSITION`): the turn, the state, the id's
//! transition lock (the one bounded begin-or-wait loop, [`begin_or_wait`]), the run, then
//! everything given back in reverse. Above it is the one [`SessionLease`](crate::SessionLease)
//! path: an acquire, renew or release as a machine event, its outcome as the caller's
//! [`Grant`], never a grant already expired ([`checked`]).
//!
//! A backend says only how to take its lock, what runs under it, and how to give it back.

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::driver::{self, Transaction};
#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
use crate::driver::{Grain, Io, Run, Step};
use crate::error::{Error, LockOf};
use crate::lease::{Grant, Lease, LeaseGuard, SessionLease};
use crate::machine::{self, Event, Outcome};
use crate::name::{Owner, SessionId};

/// A lease manager: one instance over one backend's store. Use it as
/// [`FlockLease`](crate::FlockLease), [`MemLease`](crate::MemLease) or `PgLease` (feature
/// `postgres`); each adds its own constructor and calls to the [`SessionLease`] methods
/// written here once.
pub struct Leases<B: Backend> {
    /// The backend: its store and whatever else it keeps.
    pub(crate) inner: B,
    /// This instance's entry of each id in use.
    pub(crate) ids: Registry<Entry<B::State>>,
    /// The lease time-to-live.
    pub(crate) ttl: Duration,
    /// How long a call may wait for an id's turn and transition lock (`Duration::MAX`: no
    /// limit).
    pub(crate) lock_timeout: Duration,
    /// The clock expiry is judged by as a call returns ([`checked`]).
    pub(crate) clock: Arc<dyn Clock>,
}

/// What a backend is to the front ([`Leases`]): the state it keeps per id, how it takes an
/// id's transition lock (an owned value), the transaction that runs under it, and how it gives
/// the lock back.
pub trait Backend: Sized + Send + Sync {
    /// What the instance keeps for one id, under the id's state mutex.
    type State: Idle + Send;
    /// An id's transition lock once taken, with what the run carries to its end.
    type Lock;
    /// One transition under the lock.
    type Tx<'a>: Transaction
    where
        Self: 'a;

    /// A new id's state.
    fn state(&self, id: &SessionId) -> Self::State;

    /// One attempt at `id`'s transition lock for `event`, waiting for it until `deadline` at
    /// most. `Ok(None)`: not taken (busy to the deadline, or the lock was replaced while
    /// waited for); [`begin_or_wait`] tries again while the deadline has not passed.
    ///
    /// # Errors
    ///
    /// I/O failure; nothing is held then.
    fn lock(
        l: &Leases<Self>,
        id: &SessionId,
        state: &mut Self::State,
        event: &Event,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Lock>, Error>;

    /// The transaction of one run under `lock`.
    fn tx<'a>(
        l: &'a Leases<Self>,
        id: &'a SessionId,
        entry: &'a Entry<Self::State>,
        state: &'a mut Self::State,
        lock: &'a mut Self::Lock,
    ) -> Self::Tx<'a>;

    /// Gives `lock` back after the run that answered `outcome` (unlocks it if the run did
    /// not), keeping what the instance keeps.
    fn unlock(
        l: &Leases<Self>,
        entry: &Entry<Self::State>,
        state: &mut Self::State,
        lock: Self::Lock,
        outcome: &Result<Outcome, Error>,
    );

    /// The lock an [`Error::LockTimeout`] on `id` names (the default: the id's row).
    fn lock_of(_: &Leases<Self>, id: &SessionId) -> LockOf {
        LockOf::Row(id.clone())
    }

    /// Called after each step of a transition (the flock backend's fault hook).
    fn observe(_: &Leases<Self>, _: &SessionId) {}

    /// [`SessionLease::on_liveness_lost`]; the default drops `notify` (a backend that cannot
    /// tell).
    fn on_liveness_lost(_: &Leases<Self>, _: &Lease, _: Box<dyn FnOnce() + Send>) {}

    /// [`SessionLease::store_gone`]; the default: never.
    fn store_gone(_: &Leases<Self>) -> Option<String> {
        None
    }

    /// Called when the instance is dropped, before its entries are.
    fn close(_: &mut Leases<Self>) {}
}

/// One id's entry in an instance: its turn, its state, and until when the instance holds it.
#[derive(Debug, Default)]
pub struct Entry<S> {
    /// Taken for a whole transition: one caller at a time per id, each waiting for its own
    /// deadline.
    pub(crate) gate: Gate,
    /// Locked while a transition runs, and for moments by the calls that only look.
    pub(crate) state: Mutex<S>,
    /// Until when this instance holds the id (Unix nanoseconds; `i64::MIN`, or 0 as made: not
    /// held), readable without the state's mutex: kept by a backend whose waits read it
    /// (flock: set at each commit point, `flock::tx::held_at`).
    pub(crate) held: AtomicI64,
}

impl<S: Idle> Idle for Entry<S> {
    fn idle(&self) -> bool {
        self.gate.is_free() && self.state.try_lock().is_ok_and(|s| s.idle())
    }
}

impl<B: Backend> Leases<B> {
    /// An instance over `inner`; a zero `ttl` means [`DEFAULT_TTL`](crate::DEFAULT_TTL).
    pub(crate) fn with(
        inner: B,
        ttl: Duration,
        lock_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Leases {
            inner,
            ids: Registry::default(),
            ttl: if ttl.is_zero() {
                crate::lease::DEFAULT_TTL
            } else {
                ttl
            },
            lock_timeout,
            clock,
        }
    }

    /// This instance's entry for `id`.
    pub(crate) fn entry(&self, id: &SessionId) -> Arc<Entry<B::State>> {
        self.ids.entry(id.as_str(), || Entry {
            gate: Gate::default(),
            state: Mutex::new(self.inner.state(id)),
            held: AtomicI64::new(i64::MIN),
        })
    }

    /// `id`'s in-process turn by `deadline` (`None`: no limit), or the call's
    /// [`Error::LockTimeout`] (it `started` waiting then): a transition's, a fenced section's,
    /// and a waiting PostgreSQL acquire's first look at what its instance holds.
    pub(crate) fn turn<'e>(
        &self,
        id: &SessionId,
        entry: &'e Entry<B::State>,
        deadline: Option<Instant>,
        started: Instant,
    ) -> Result<Turn<'e>, Error> {
        entry
            .gate
            .enter(deadline)
            .ok_or_else(|| self.timed_out(id, started))
    }

    /// The [`Error::LockTimeout`] of a call on `id` that `started` waiting for its lock.
    fn timed_out(&self, id: &SessionId, started: Instant) -> Error {
        Error::LockTimeout {
            lock: B::lock_of(self, id),
            waited: started.elapsed(),
        }
    }

    /// [`SessionLease::acquire`], callable without importing the trait.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::acquire`].
    pub fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
        let event = Event::Acquire {
            owner: owner.clone(),
        };
        checked(self, id, owner, transition(self, id, event))
    }

    /// [`SessionLease::renew`], callable without importing the trait.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::renew`].
    pub fn renew(&self, lease: &Lease) -> Result<Grant, Error> {
        let event = Event::Renew {
            owner: lease.owner.clone(),
            token: lease.token,
        };
        let answer = transition(self, &lease.session_id, event);
        checked(self, &lease.session_id, &lease.owner, answer)
    }

    /// [`SessionLease::release`], callable without importing the trait.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::release`].
    pub fn release(&self, lease: &Lease) -> Result<(), Error> {
        let event = Event::Release {
            owner: lease.owner.clone(),
            token: lease.token,
        };
        transition(self, &lease.session_id, event).map(drop)
    }

    /// [`SessionLease::acquire_guard`], callable without importing the trait.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::acquire`].
    pub fn acquire_guard(&self, id: &SessionId) -> Result<Option<LeaseGuard<'_, Self>>, Error> {
        <Self as SessionLease>::acquire_guard(self, id)
    }
}

impl<B: Backend> SessionLease for Leases<B> {
    fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
        Leases::acquire(self, id, owner)
    }

    fn renew(&self, lease: &Lease) -> Result<Grant, Error> {
        Leases::renew(self, lease)
    }

    fn release(&self, lease: &Lease) -> Result<(), Error> {
        Leases::release(self, lease)
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    fn on_liveness_lost(&self, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        B::on_liveness_lost(self, lease, notify);
    }

    fn store_gone(&self) -> Option<String> {
        B::store_gone(self)
    }
}

impl<B: Backend> Drop for Leases<B> {
    fn drop(&mut self) {
        B::close(self);
    }
}

impl<B: Backend + std::fmt::Debug> std::fmt::Debug for Leases<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("inner", &self.inner)
            .field("ttl", &self.ttl)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

/// One transition for `event` on `id`, the same for every backend, in `driver::TRANSITION`'s
/// order: the id's turn by the caller's deadline (this call's lock timeout from now), the
/// state, the transition lock ([`begin_or_wait`]), the run ([`driver::run`]); then the lock,
/// the state and the turn given back, in reverse.
///
/// # Errors
///
/// [`Error::LockTimeout`] when the turn or the lock is not had by the deadline; whatever
/// [`Backend::lock`] or the run reports.
pub(crate) fn transition<B: Backend>(
    l: &Leases<B>,
    id: &SessionId,
    event: Event,
) -> Result<Outcome, Error> {
    transition_then(l, id, event, |_| ()).map(|(o, ())| o)
}

/// [`transition`], and `then` of the id's state before it is given back.
pub(crate) fn transition_then<B: Backend, R>(
    l: &Leases<B>,
    id: &SessionId,
    event: Event,
    then: impl FnOnce(&mut B::State) -> R,
) -> Result<(Outcome, R), Error> {
    #[cfg(feature = "tracing")]
    let noted = crate::trace::Noted::new(id, &event, l.ttl);
    let started = Instant::now();
    let deadline = deadline_after(l.lock_timeout);
    let entry = l.entry(id);
    let turn = l.turn(id, &entry, deadline, started)?;
    B::observe(l, id);
    let mut state = lock(&entry.state);
    B::observe(l, id);
    let timeout = || l.timed_out(id, started);
    let mut held = begin_or_wait(deadline, timeout, || {
        B::lock(l, id, &mut state, &event, deadline)
    })?;
    B::observe(l, id);
    let (outcome, _read) = driver::run(
        &mut B::tx(l, id, &entry, &mut state, &mut held),
        id,
        l.ttl,
        event,
    );
    #[cfg(feature = "tracing")]
    noted.done(_read.as_ref(), &outcome);
    B::observe(l, id);
    B::unlock(l, &entry, &mut state, held, &outcome);
    B::observe(l, id);
    let after = then(&mut state);
    drop(state);
    B::observe(l, id);
    drop(turn);
    B::observe(l, id);
    Ok((outcome?, after))
}

/// The bounded begin-or-wait loop an id's transition lock is taken by, for every backend (and
/// a fenced section's lock, through `flock::files::lock_at_path`, and a fence's, whose loop
/// the model checker runs): `attempt`
/// (which may wait until `deadline` itself) until it answers the lock, fails, or answers
/// `None` with the deadline past ([`Error::LockTimeout`] by `timeout`).
///
/// # Errors
///
/// `attempt`'s, or `timeout`'s at the deadline.
pub fn begin_or_wait<T>(
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

/// One transition advanced one step at a time, for the lockstep harnesses
/// (`flock::Stepper`, `pg::PgStepper`): the very [`Backend::lock`], [`Backend::tx`] and
/// [`Backend::unlock`] a call runs, without the turn (the harness never runs two calls of one
/// instance at once). Dropping it mid-way drops what it holds, as a crash of the process does.
#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
pub struct Steps<B: Backend, P> {
    id: SessionId,
    entry: Arc<Entry<B::State>>,
    run: Run<P>,
    /// The lock and what the run carries, once taken (the steppers read it).
    pub(crate) held: Option<B::Lock>,
    /// The lock could not be had for an error: the run ended before its first step.
    failed: bool,
}

#[cfg(all(
    feature = "fault-injection",
    any(feature = "internals", feature = "postgres")
))]
impl<B: Backend, P> Steps<B, P>
where
    for<'a> B::Tx<'a>: Transaction<Pending = P>,
{
    /// A transition of `l` for `event` on `id`, at `grain`, not started.
    pub(crate) fn new(l: &Leases<B>, id: &SessionId, event: Event, grain: Grain) -> Self {
        Steps {
            id: id.clone(),
            entry: l.entry(id),
            run: Run::new(grain, event, l.ttl),
            held: None,
            failed: false,
        }
    }

    /// The step the next call of [`Steps::next`] performs (`None`: the run is over).
    pub fn peek(&self) -> Option<Io> {
        if self.failed { None } else { self.run.peek() }
    }

    /// Performs the next step on `l` (the instance that made these steps). The lock, when it
    /// is not held yet, is taken as the run's first step takes it: [`Io::Lock`] (system-call
    /// grain) is one attempt, [`Step::Blocked`] while another transition holds the lock;
    /// [`Io::Begin`] (statement grain) has it without a deadline, the row lock waiting in the
    /// server within the session's `lock_timeout`.
    ///
    /// # Panics
    ///
    /// When called after [`Step::Done`].
    pub fn next(&mut self, l: &Leases<B>) -> Step {
        let entry = Arc::clone(&self.entry);
        let mut state = lock(&entry.state);
        assert!(!self.failed, "a step after the run failed to begin");
        // Taken at the run's first step only: after its last there is no lock to take (and
        // the call panics below, as documented).
        if self.held.is_none() && self.run.peek().is_some() {
            let deadline = (self.run.peek() == Some(Io::Lock)).then(Instant::now);
            match B::lock(l, &self.id, &mut state, self.run.event(), deadline) {
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
        let mut tx = B::tx(l, &self.id, &entry, &mut state, held);
        let step = self.run.next(&mut tx, &self.id);
        drop(tx);
        if let Step::Done(outcome) = &step
            && let Some(held) = self.held.take()
        {
            B::unlock(l, &entry, &mut state, held, outcome);
        }
        step
    }
}

/// `answer` (an acquire's or a renew's, for `owner` on `id`) as the caller gets it from `l`:
/// never a grant already expired on `l`'s clock. The call's final expiry check
/// ([`machine::FinalCheck`]) decides: returned while unexpired; renewed on `l` first — which
/// succeeds only if nobody took over meanwhile (the machine decides) — and judged again; or
/// answered lost ([`Grant::Held`]) once still expired after [`machine::RECLAIMS`] renews, or
/// when a renew failed (never an error: the first answer's commit happened, and an expired
/// lease is free for others whatever this instance still holds).
pub(crate) fn checked<B: Backend>(
    l: &Leases<B>,
    id: &SessionId,
    owner: &Owner,
    mut answer: Result<Outcome, Error>,
) -> Result<Grant, Error> {
    let mut check = machine::FinalCheck::default();
    loop {
        match check.next(answer, || l.clock.now()) {
            machine::Then::Return(answer) => return answer.map(|o| grant(o, id, owner)),
            machine::Then::Renew { token } => {
                let owner = owner.clone();
                answer = transition(l, id, Event::Renew { owner, token });
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
pub trait Idle {
    /// Whether nobody is inside and nothing is held for the id. Never waits: an entry whose
    /// state is locked is in use.
    fn idle(&self) -> bool;
}

/// Whether a pruning registry keeps an entry: while a caller refers to it (`shared`: it may
/// be about to use it), or while it is in use (not [`Idle`]: it holds a lock or owes work).
/// Pruning anything else loses nothing; pruning an entry in use would drop what it holds (a
/// generation's liveness lock) or split the id in two.
pub fn keeps(shared: bool, idle: bool) -> bool {
    shared || !idle
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
                .retain(|_, entry| keeps(Arc::strong_count(entry) != 1, entry.idle()));
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

/// What an id's turn keeps under its mutex, and its rules: taken or not, and how many callers
/// wait for it. The front's `Gate` runs them under its mutex with a condition variable; the
/// model checker (`check --config threads`) runs the same rules with its threads parked and
/// woken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GateState {
    busy: bool,
    /// Callers waiting for the turn: only then does leaving it wake anyone (a condition
    /// variable's notify is a system call even with nobody waiting).
    waiting: usize,
}

/// What a caller's look at the turn came to ([`GateState::look`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnLook {
    /// It has the turn.
    Taken,
    /// The turn is taken and the caller's deadline has come: it gives up.
    TimedOut,
    /// The turn is taken: the caller is counted as waiting, and waits to be woken (or for its
    /// deadline), then looks again.
    Park,
}

impl GateState {
    /// One look at the turn by a caller, under the gate's mutex (`parked`: it waited, and
    /// woke, woken or at its deadline): no longer counted as waiting; then the turn is taken
    /// if free, or, taken, the caller gives up if it is `past` its deadline (asked only then)
    /// or parks.
    pub fn look(&mut self, parked: bool, past: impl FnOnce() -> bool) -> TurnLook {
        if parked {
            self.woke();
        }
        if self.take() {
            TurnLook::Taken
        } else if past() {
            TurnLook::TimedOut
        } else {
            self.park();
            TurnLook::Park
        }
    }

    /// Takes the turn if it is free (`true`).
    fn take(&mut self) -> bool {
        let free = !self.busy;
        self.busy = true;
        free
    }

    /// Counts a caller that found the turn taken as waiting (so that leaving the turn wakes
    /// it).
    fn park(&mut self) {
        self.waiting += 1;
    }

    /// A waiting caller woke: no longer counted.
    fn woke(&mut self) {
        self.waiting -= 1;
    }

    /// The turn's holder leaves it: whether a waiting caller is to be woken.
    pub fn leave(&mut self) -> bool {
        self.busy = false;
        self.waiting > 0
    }

    /// Whether the turn is taken.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// How many callers wait for the turn.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether nobody has the turn or waits for it.
    fn idle(&self) -> bool {
        !self.busy() && self.waiting() == 0
    }
}

impl Gate {
    /// Takes the turn, waiting until `deadline` at most (`None`: no limit). Returns `None` at
    /// the deadline.
    pub(crate) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let mut st = lock(&self.state);
        let mut parked = false;
        loop {
            // The time left, read only when the turn is taken.
            let mut left = None;
            let past = || {
                left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                left.is_some_and(|l| l.is_zero())
            };
            match st.look(parked, past) {
                TurnLook::Taken => return Some(Turn { gate: self }),
                TurnLook::TimedOut => return None,
                TurnLook::Park => parked = true,
            }
            st = match left {
                None => self.free.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.free
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    /// Whether nobody has the turn now (for pruning idle ids).
    pub(crate) fn is_free(&self) -> bool {
        self.state.try_lock().is_ok_and(|st| st.idle())
    }
}

/// A caller's turn on an id; dropping it (also on unwinding) lets the next caller in.
pub(crate) struct Turn<'a> {
    gate: &'a Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if lock(&self.gate.state).leave() {
            self.gate.free.notify_one();
        }
    }
}

/// Locks `m`, also after a panic of another thread that held it: the crate's maps, slots,
/// pools and flags are changed in single steps, so what a panic left is usable data.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
