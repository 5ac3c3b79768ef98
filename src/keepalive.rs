//! [`KeepAlive`]: a handle that owns an acquired lease, renews it on a background thread and
//! tells its owner the moment the lease is lost.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::error::Error;
use crate::lease::{Grant, Lease, SessionLease};
use crate::machine;

/// How often, by default, a sleeping renewer or waiter looks at the wall clock again.
/// Monotonic clocks stop while the machine is suspended; the wall clock does not.
pub const DEFAULT_CLOCK_CHECK: Duration = Duration::from_secs(1);

/// Why a kept-alive lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// A renew answered [`Grant::Held`]: another owner took the lease over.
    TakenOver,
    /// The wall clock reached the lease's expiry without a successful renew (renews failed,
    /// were stuck, or the process was suspended). Another owner may take it over from now on,
    /// whether or not anyone has yet.
    Expired {
        /// The last renew error, as text, if a renew failed.
        last_error: Option<String>,
    },
    /// The backend reported that the generation's liveness lock is gone while the holder runs
    /// (with `pg::PgLease` (feature `postgres`): its liveness connection ended — dropped, ended
    /// by the server, server restart). A rival may take the lease over before its expiry;
    /// its token will be greater. Reported at once, not at the next renew.
    LivenessLost,
    /// The backend's store is no longer where the lease lives
    /// ([`SessionLease::store_gone`](crate::SessionLease::store_gone)): for a
    /// [`FlockLease`](crate::FlockLease), its lease directory was removed, replaced or
    /// unmounted. A rival on the directory now at the path is granted at once, with token 1.
    /// Reported within a clock check (a second by default), not at the next renew.
    StoreGone {
        /// What happened, as text (the directory and how it changed).
        what: String,
    },
    /// The renewer failed (a panic in the backend or the loss callback); the lease is no
    /// longer renewed.
    RenewerFailed {
        /// What happened, as text.
        reason: String,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::TakenOver => f.write_str("lease taken over by another owner"),
            Loss::Expired {
                last_error: Some(e),
            } => write!(f, "lease expired while renewing failed: {e}"),
            Loss::Expired { last_error: None } => {
                f.write_str("lease expired without a successful renew")
            }
            Loss::RenewerFailed { reason } => write!(f, "lease renewer failed: {reason}"),
            Loss::LivenessLost => f.write_str("liveness lock of the lease lost"),
            Loss::StoreGone { what } => write!(f, "lease lost: {what}"),
        }
    }
}

type LossCallback = Box<dyn FnOnce(&Loss) + Send>;
type RenewCallback = Box<dyn Fn(&Lease) + Send>;

/// Options for a [`KeepAlive`]; start from [`KeepAlive::builder`].
#[must_use]
pub struct KeepAliveBuilder<L> {
    leases: Arc<L>,
    lease: Lease,
    interval: Option<Duration>,
    clock: Arc<dyn Clock>,
    clock_check: Duration,
    on_loss: Option<LossCallback>,
    on_renew: Option<RenewCallback>,
}

impl<L: SessionLease + 'static> KeepAliveBuilder<L> {
    /// A function called on the renewer thread after each successful renew, with the renewed
    /// lease (its new expiry): to pass the expiry on, e.g. to a process that stops the work
    /// at the expiry should this process stop renewing. Keep it short; a panic in it is
    /// contained (the keep-alive goes on).
    pub fn on_renew(mut self, f: impl Fn(&Lease) + Send + 'static) -> Self {
        self.on_renew = Some(Box::new(f));
        self
    }

    /// How often to renew. Default: a third of the time the lease had left when the keep-alive
    /// started (TTL/3 for a fresh lease), at least 1 ms. It must be shorter than that time
    /// left (see [`KeepAliveBuilder::start`]).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// The clock the lease's expiry is compared with (default: the lease manager's,
    /// [`SessionLease::clock`]: for a `pg::PgLease` (feature `postgres`) its estimate of the
    /// server's clock, by which the server judges expiry).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// How often a sleeping renewer looks at the wall clock again (default
    /// [`DEFAULT_CLOCK_CHECK`], at least 1 ms). After a suspend, renews and the loss at expiry
    /// happen within this much of the wall-clock instant they were due.
    pub fn clock_check(mut self, every: Duration) -> Self {
        self.clock_check = every.max(Duration::from_millis(1));
        self
    }

    /// A function called once, on the keep-alive's watcher thread, when the lease is lost —
    /// also while the renewer is stuck in a renew (a dead network, a stopped disk). Keep it
    /// short (signal a process, send on a channel). A panic in it is contained: the loss is
    /// already recorded for [`KeepAlive::is_lost`] and [`KeepAlive::wait_lost`].
    pub fn on_loss(mut self, f: impl FnOnce(&Loss) + Send + 'static) -> Self {
        self.on_loss = Some(Box::new(f));
        self
    }

    /// Starts renewing in a background thread, and watching for the loss in another (so a
    /// renew that blocks cannot delay the report of a loss).
    ///
    /// If a thread cannot be started, the keep-alive starts lost ([`Loss::RenewerFailed`]);
    /// [`KeepAlive::release`] still releases the lease.
    ///
    /// A lease already expired on the clock is renewed first, at once (a renew succeeds when
    /// nobody took over); if that answers held or fails, the keep-alive starts lost
    /// ([`Loss::TakenOver`], [`Loss::Expired`] with the error).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInterval`] when the interval is zero, not shorter than the time the
    /// (unexpired) lease has left, or too large for the clock.
    pub fn start(mut self) -> Result<KeepAlive<L>, Error> {
        if let Some(loss) = self.reclaim_if_expired() {
            return Ok(self.spawn_lost(loss));
        }
        let left = self
            .lease
            .expiry
            .saturating_duration_since(self.clock.now());
        let interval = self
            .interval
            .unwrap_or_else(|| (left / 3).max(Duration::from_millis(1)));
        if interval.is_zero() || interval >= left || Instant::now().checked_add(interval).is_none()
        {
            return Err(Error::InvalidInterval { interval, left });
        }
        Ok(self.spawn(interval, None))
    }

    /// Renews the lease at once if it has expired on the clock: `None` when it is unexpired
    /// (renewed, or it was), else the loss to start with.
    fn reclaim_if_expired(&mut self) -> Option<Loss> {
        if !machine::is_expired(self.lease.expiry, self.clock.now()) {
            return None;
        }
        match self.leases.renew(&self.lease) {
            // Unexpired on the backend's clock (its contract); this clock may differ.
            Ok(Grant::Granted(renewed)) => {
                self.lease = renewed;
                machine::is_expired(self.lease.expiry, self.clock.now())
                    .then_some(Loss::Expired { last_error: None })
            }
            Ok(Grant::Held) => Some(Loss::TakenOver),
            Err(e) => Some(Loss::Expired {
                last_error: Some(e.to_string()),
            }),
        }
    }

    /// A keep-alive that is lost from the start: it never renews.
    fn spawn_lost(self, loss: Loss) -> KeepAlive<L> {
        // Recorded before the threads start: the watcher would otherwise see the expired
        // lease first and report that instead.
        self.spawn(Duration::from_secs(3600), Some(loss))
    }

    /// A keep-alive renewing every `interval`, lost from the start if `lost` says so.
    fn spawn(self, interval: Duration, lost: Option<Loss>) -> KeepAlive<L> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                lease: self.lease,
                lost,
                stop: false,
                last_error: None,
                wakers: Vec::new(),
            }),
            changed: Condvar::new(),
            clock: Arc::clone(&self.clock),
            clock_check: self.clock_check,
            on_loss: Mutex::new(self.on_loss),
            store_gone: {
                let leases = Arc::clone(&self.leases);
                Box::new(move || leases.store_gone())
            },
        });
        // The first renew is due one interval from now (not from when the thread runs).
        let renewer = Renewer {
            leases: Arc::clone(&self.leases),
            shared: Arc::clone(&shared),
            on_renew: self.on_renew,
            interval,
            first_due: self.clock.now().checked_add(interval),
        };
        // A backend whose liveness can vanish while we run reports it here, at once.
        // (The state's lock is not held: the backend may call back before returning.)
        let weak = Arc::downgrade(&shared);
        let lease = shared.lock().lease.clone();
        self.leases.on_liveness_lost(
            &lease,
            Box::new(move || {
                if let Some(shared) = weak.upgrade() {
                    shared.lose(Loss::LivenessLost);
                }
            }),
        );
        let thread = thread::Builder::new()
            .name("flocklease-keepalive".into())
            .spawn(move || renewer.run())
            .ok();
        let watching = Arc::clone(&shared);
        let watcher = thread::Builder::new()
            .name("flocklease-keepalive-watch".into())
            .spawn(move || watching.watch())
            .ok();
        // No thread, no renewals or no report: a loss rather than a pretence.
        let failed = match (&thread, &watcher) {
            (None, _) => Some("could not start the renewer thread"),
            (Some(_), None) => Some("could not start the watcher thread"),
            _ => None,
        };
        if let Some(reason) = failed {
            shared.lose(Loss::RenewerFailed {
                reason: reason.into(),
            });
            let loss = shared.lock().lost.clone();
            if let (None, Some(loss)) = (&watcher, loss) {
                shared.report(&loss);
            }
        }
        KeepAlive {
            leases: self.leases,
            shared,
            thread,
            watcher,
            released: false,
        }
    }
}

/// Owns an acquired lease and keeps it alive: renews it every interval on a background thread
/// and reports the moment it is lost.
///
/// - A definitive loss ([`Grant::Held`] from renew) is reported at once as [`Loss::TakenOver`].
/// - When the wall clock reaches the lease's expiry without a successful renew, the lease is
///   lost ([`Loss::Expired`]) at that instant, whether or not anyone took it over: renew
///   *errors* are retried (at a quarter of the interval) until then.
/// - Scheduling follows the wall clock, checked at least every
///   [`clock_check`](KeepAliveBuilder::clock_check), so a suspend (during which monotonic
///   clocks stop) neither delays the renew due nor the loss at expiry by more than that.
/// - Loss is observable by polling ([`KeepAlive::is_lost`], [`KeepAlive::loss`]), by waiting
///   ([`KeepAlive::wait_lost`]), as a future ([`KeepAlive::lost`]) and through a callback
///   ([`KeepAliveBuilder::on_loss`]). A second thread watches for the loss, so every one of
///   them is right at the expiry (and at a backend's report of lost liveness) even while the
///   renewer is stuck in a renew that does not return (a dead network, a stopped disk).
/// - [`KeepAlive::release`] stops renewing and releases, returning the result; dropping the
///   handle does the same and ignores the result.
///
/// The renewer holds no lock while it sleeps, and stopping it waits at most for one renew in
/// progress.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use flocklease::{FlockLease, KeepAlive, Owner, SessionId};
///
/// # fn main() -> Result<(), flocklease::Error> {
/// let dir = tempfile::tempdir().unwrap();
/// let leases = Arc::new(FlockLease::open(dir.path())?);
/// let id = SessionId::new("reindex")?;
/// let lease = leases.acquire(&id, &Owner::new("worker-3")?)?.lease().expect("free");
///
/// let keep = KeepAlive::start(Arc::clone(&leases), lease);
/// // ... do the work, checking keep.is_lost() between steps ...
/// assert!(!keep.is_lost());
/// keep.release()?;
/// # Ok(())
/// # }
/// ```
pub struct KeepAlive<L: SessionLease + 'static> {
    leases: Arc<L>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Reports the loss (the callback, the futures) whatever the renewer is doing.
    watcher: Option<JoinHandle<()>>,
    released: bool,
}

impl<L: SessionLease + 'static> KeepAlive<L> {
    /// Keeps `lease` alive with the default options. A lease already expired is renewed at
    /// once (see [`KeepAliveBuilder::start`]); one with less than 3 ms left, whose default
    /// interval cannot be shorter than its time left, starts lost ([`Loss::Expired`]).
    pub fn start(leases: Arc<L>, lease: Lease) -> KeepAlive<L> {
        let mut builder = KeepAlive::builder(leases, lease);
        if let Some(loss) = builder.reclaim_if_expired() {
            return builder.spawn_lost(loss);
        }
        let left = builder
            .lease
            .expiry
            .saturating_duration_since(builder.clock.now());
        match (left / 3).max(Duration::from_millis(1)) {
            interval if interval < left => builder.spawn(interval, None),
            // Nothing left to keep: a keep-alive that reports the loss at once.
            interval => {
                let keep = builder.spawn(interval.max(left), None);
                keep.shared.lose(Loss::Expired { last_error: None });
                keep
            }
        }
    }

    /// A builder to set the interval, clock or loss callback.
    pub fn builder(leases: Arc<L>, lease: Lease) -> KeepAliveBuilder<L> {
        let clock = leases.clock();
        KeepAliveBuilder {
            leases,
            lease,
            interval: None,
            clock,
            clock_check: DEFAULT_CLOCK_CHECK,
            on_loss: None,
            on_renew: None,
        }
    }

    /// The lease as last renewed (same token, latest expiry).
    pub fn lease(&self) -> Lease {
        self.shared.lock().lease.clone()
    }

    /// Whether the lease is lost (at the latest once the wall clock reaches its expiry
    /// without a successful renew).
    pub fn is_lost(&self) -> bool {
        self.loss().is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<Loss> {
        let mut state = self.shared.lock();
        self.shared.check_expiry(&mut state);
        state.lost.clone()
    }

    /// Waits until the lease is lost or `timeout` passes (`None`, or a timeout too large for
    /// the clock: no limit); returns the loss.
    /// Also returns (with `None`) once the keep-alive is released.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut state = self.shared.lock();
        loop {
            self.shared.check_expiry(&mut state);
            if state.lost.is_some() || state.stop {
                return state.lost.clone();
            }
            let mut nap = self.shared.until_expiry(&state);
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                nap = nap.min(left);
            }
            state = self.shared.nap(state, nap);
        }
    }

    /// The loss as a [`Future`], for async code: it resolves with the
    /// loss when the lease is lost (a takeover, the wall-clock expiry without a renew, a
    /// renewer failure), or with `None` once the keep-alive is released. It never blocks an
    /// executor thread: the keep-alive's watcher thread wakes it.
    ///
    /// Race it against the work (e.g. with `tokio::select!`) to stop the work on a loss.
    ///
    /// ```
    /// # async fn example(keep: flocklease::KeepAlive<flocklease::FlockLease>) {
    /// if let Some(loss) = keep.lost().await {
    ///     eprintln!("stopping the work: {loss}");
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> Lost<'_> {
        Lost {
            shared: &self.shared,
        }
    }

    /// Stops renewing and releases the lease.
    ///
    /// # Errors
    ///
    /// The release's [`Error`]; the lease manager keeps the generation so a later release of
    /// [`KeepAlive::lease`] can retry.
    pub fn release(mut self) -> Result<(), Error> {
        self.stop_and_release()
    }

    fn stop_and_release(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        {
            let mut state = self.shared.lock();
            state.stop = true;
            state.wake_all();
        }
        self.shared.changed.notify_all();
        for thread in [self.thread.take(), self.watcher.take()]
            .into_iter()
            .flatten()
        {
            // A panicking renewer already recorded its loss; its result is of no further use.
            let _ = thread.join();
        }
        let lease = self.lease();
        self.leases.release(&lease)
    }
}

impl<L: SessionLease + 'static> Drop for KeepAlive<L> {
    /// Stops renewing and releases; a release error is ignored (the lease then expires).
    fn drop(&mut self) {
        let _ = self.stop_and_release();
    }
}

impl<L: SessionLease + 'static> fmt::Debug for KeepAlive<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("KeepAlive")
            .field("lease", &state.lease)
            .field("lost", &state.lost)
            .finish()
    }
}

/// The future of [`KeepAlive::lost`].
#[must_use = "futures do nothing unless polled"]
pub struct Lost<'a> {
    shared: &'a Shared,
}

impl std::future::Future for Lost<'_> {
    type Output = Option<Loss>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Loss>> {
        let mut state = self.shared.lock();
        self.shared.check_expiry(&mut state);
        if state.lost.is_some() || state.stop {
            return std::task::Poll::Ready(state.lost.clone());
        }
        if !state.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.wakers.push(cx.waker().clone());
        }
        std::task::Poll::Pending
    }
}

impl fmt::Debug for Lost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    clock: Arc<dyn Clock>,
    clock_check: Duration,
    /// The loss callback, taken by the one call that runs it.
    on_loss: Mutex<Option<LossCallback>>,
    /// The backend's [`SessionLease::store_gone`], asked by the watcher at each clock check.
    store_gone: Box<dyn Fn() -> Option<String> + Send + Sync>,
}

struct State {
    lease: Lease,
    lost: Option<Loss>,
    stop: bool,
    /// The last renew error since the last successful renew.
    last_error: Option<String>,
    /// Tasks waiting on [`KeepAlive::lost`].
    wakers: Vec<std::task::Waker>,
}

impl State {
    /// Wakes every task waiting on [`KeepAlive::lost`].
    fn wake_all(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data updated in single assignments: usable after a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a change of `state`, `nap` at most.
    fn nap<'a>(&self, state: MutexGuard<'a, State>, nap: Duration) -> MutexGuard<'a, State> {
        let waited = self.changed.wait_timeout(state, nap);
        waited.unwrap_or_else(PoisonError::into_inner).0
    }

    fn lose(&self, loss: Loss) {
        let mut state = self.lock();
        state.lost.get_or_insert(loss);
        state.wake_all();
        drop(state);
        self.changed.notify_all();
    }

    /// Runs the loss callback, once.
    fn report(&self, loss: &Loss) {
        let f = crate::front::lock(&self.on_loss).take();
        if let Some(f) = f {
            // The loss is recorded: a panicking callback cannot hide it.
            let _ = catch_unwind(AssertUnwindSafe(|| f(loss)));
        }
        // Said after the callback acted: a subscriber whose writer blocks never delays it.
        #[cfg(feature = "tracing")]
        crate::trace::keepalive_lost(&self.lock().lease, loss);
    }

    /// The watcher thread: waits for a loss — recorded by the renewer or the backend, or the
    /// wall clock reaching the expiry — and reports it; returns on a stop.
    fn watch(&self) {
        let loss = {
            let mut state = self.lock();
            loop {
                self.check_expiry(&mut state);
                if state.lost.is_none() && !state.stop {
                    // One stat, asked without the state's lock.
                    drop(state);
                    let gone = (self.store_gone)();
                    state = self.lock();
                    if let Some(what) = gone {
                        state.lost.get_or_insert(Loss::StoreGone { what });
                        state.wake_all();
                        self.changed.notify_all();
                    }
                }
                // A loss recorded before a stop is still reported (the caller may have seen it
                // with `is_lost` and released at once).
                if let Some(loss) = &state.lost {
                    break loss.clone();
                }
                if state.stop {
                    return;
                }
                let nap = self.until_expiry(&state);
                state = self.nap(state, nap);
            }
        };
        self.report(&loss);
    }

    /// Records the loss at expiry if the wall clock has reached it.
    fn check_expiry(&self, state: &mut State) {
        if state.lost.is_none()
            && !state.stop
            && machine::is_expired(state.lease.expiry, self.clock.now())
        {
            state.lost = Some(Loss::Expired {
                last_error: state.last_error.clone(),
            });
            state.wake_all();
            self.changed.notify_all();
        }
    }

    /// How long to sleep before looking at the wall clock again: until the expiry, at most
    /// the clock-check period (a suspend stops the monotonic clock a sleep is measured on).
    fn until_expiry(&self, state: &State) -> Duration {
        state
            .lease
            .expiry
            .saturating_duration_since(self.clock.now())
            .min(self.clock_check)
            .max(Duration::from_micros(100))
    }
}

struct Renewer<L> {
    leases: Arc<L>,
    shared: Arc<Shared>,
    on_renew: Option<RenewCallback>,
    interval: Duration,
    first_due: Option<crate::Timestamp>,
}

impl<L: SessionLease> Renewer<L> {
    /// Renews until a loss or a stop, and records the loss (the watcher reports it).
    fn run(self) {
        let shared = Arc::clone(&self.shared);
        let loss = match catch_unwind(AssertUnwindSafe(|| self.renew_until_lost())) {
            Ok(None) => return,
            Ok(Some(loss)) => loss,
            Err(panic) => Loss::RenewerFailed {
                reason: panic_text(&panic),
            },
        };
        shared.lose(loss);
    }

    /// Renews on schedule; returns the loss, or `None` when stopped.
    fn renew_until_lost(&self) -> Option<Loss> {
        let clock = &self.shared.clock;
        // The next renew is due at a wall-clock instant (none past the year 9999: the expiry
        // then comes first).
        let mut due = self.first_due?;
        loop {
            // Sleep until the renew is due, the expiry passes, or a stop; holding no lock
            // meanwhile, and looking at the wall clock at least every clock-check period.
            let lease = {
                let mut state = self.shared.lock();
                loop {
                    if state.stop {
                        return None;
                    }
                    self.shared.check_expiry(&mut state);
                    if let Some(loss) = &state.lost {
                        return Some(loss.clone());
                    }
                    let to_due = due.saturating_duration_since(clock.now());
                    if to_due.is_zero() {
                        break;
                    }
                    let nap = to_due.min(self.shared.until_expiry(&state));
                    state = self.shared.nap(state, nap);
                }
                state.lease.clone()
            };
            // The next renew is scheduled from when this one started, whatever it took.
            let started = clock.now();
            match self.leases.renew(&lease) {
                Ok(Grant::Granted(renewed)) => {
                    if let Some(f) = &self.on_renew {
                        let _ = catch_unwind(AssertUnwindSafe(|| f(&renewed)));
                    }
                    let mut state = self.shared.lock();
                    state.lease = renewed;
                    state.last_error = None;
                    due = started.checked_add(self.interval)?;
                }
                Ok(Grant::Held) => return Some(Loss::TakenOver),
                // The backend cannot keep the liveness lock where it was taken (a pooler
                // that shares server sessions): the lease cannot be known to be live.
                #[cfg(feature = "postgres")]
                Err(Error::SessionNotKept { .. }) => return Some(Loss::LivenessLost),
                Err(e) => {
                    // Transient while the lease is valid: retry sooner; at the expiry the
                    // failure becomes a loss (check_expiry above).
                    self.shared.lock().last_error = Some(e.to_string());
                    let retry = (self.interval / 4).max(Duration::from_millis(1));
                    due = started.checked_add(retry)?;
                }
            }
        }
    }
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".into()
    }
}
