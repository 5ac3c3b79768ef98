//! [`KeepAlive`]: a handle that owns an acquired lease, renews it on a background thread and
//! tells its owner the moment the lease is lost.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::lease::{Grant, Lease, SessionLease};
use crate::machine;

/// Why a kept-alive lease was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Loss {
    /// A renew answered [`Grant::Held`]: another owner took the lease over.
    TakenOver,
    /// Renewing kept failing until the lease expired; the last error is given. Another owner may
    /// take it over from now on.
    Expired {
        /// The last renew error, as text.
        last_error: String,
    },
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loss::TakenOver => f.write_str("lease taken over by another owner"),
            Loss::Expired { last_error } => {
                write!(f, "lease expired while renewing failed: {last_error}")
            }
        }
    }
}

type LossCallback = Box<dyn FnOnce(&Loss) + Send>;

/// Options for a [`KeepAlive`]; start from [`KeepAlive::builder`].
#[must_use]
pub struct KeepAliveBuilder<L> {
    leases: Arc<L>,
    lease: Lease,
    interval: Option<Duration>,
    clock: Arc<dyn Clock>,
    on_loss: Option<LossCallback>,
}

impl<L: SessionLease + 'static> KeepAliveBuilder<L> {
    /// How often to renew. Default: a third of the time the lease had left when the keep-alive
    /// started (TTL/3 for a fresh lease), at least 10 ms.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// The clock the lease's expiry is compared with (default: [`SystemClock`]); use the
    /// lease manager's clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A function called once, on the renewer thread, the moment the lease is lost. Keep it
    /// short (signal a process, send on a channel).
    pub fn on_loss(mut self, f: impl FnOnce(&Loss) + Send + 'static) -> Self {
        self.on_loss = Some(Box::new(f));
        self
    }

    /// Starts renewing in a background thread.
    pub fn start(self) -> KeepAlive<L> {
        let interval = self.interval.unwrap_or_else(|| {
            (self
                .lease
                .expiry
                .saturating_duration_since(self.clock.now())
                / 3)
            .max(Duration::from_millis(10))
        });
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                lease: self.lease,
                lost: None,
                stop: false,
            }),
            changed: Condvar::new(),
        });
        let renewer = Renewer {
            leases: Arc::clone(&self.leases),
            shared: Arc::clone(&shared),
            interval,
            clock: self.clock,
            on_loss: self.on_loss,
        };
        let thread = thread::Builder::new()
            .name("flocklease-keepalive".into())
            .spawn(move || renewer.run())
            .ok();
        let keep = KeepAlive {
            leases: self.leases,
            shared,
            thread,
        };
        if keep.thread.is_none() {
            // No thread, no renewals: report it as a loss rather than pretend.
            keep.shared.lose(Loss::Expired {
                last_error: "could not start the renewer thread".into(),
            });
        }
        keep
    }
}

/// Owns an acquired lease and keeps it alive: renews it every interval on a background thread
/// and reports the moment it is lost.
///
/// - A definitive loss ([`Grant::Held`] from renew) is reported at once as [`Loss::TakenOver`].
/// - A renew *error* is transient while time is left: it is retried (at a quarter of the
///   interval) until the lease's expiry passes, then reported as [`Loss::Expired`].
/// - Loss is observable by polling ([`KeepAlive::is_lost`], [`KeepAlive::loss`]), by waiting
///   ([`KeepAlive::wait_lost`]) and through a callback ([`KeepAliveBuilder::on_loss`]).
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
/// use flocklease::{FlockLease, KeepAlive, Owner, SessionId, SessionLease};
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
}

impl<L: SessionLease + 'static> KeepAlive<L> {
    /// Keeps `lease` alive with the default options.
    pub fn start(leases: Arc<L>, lease: Lease) -> KeepAlive<L> {
        KeepAlive::builder(leases, lease).start()
    }

    /// A builder to set the interval, clock or loss callback.
    pub fn builder(leases: Arc<L>, lease: Lease) -> KeepAliveBuilder<L> {
        KeepAliveBuilder {
            leases,
            lease,
            interval: None,
            clock: Arc::new(SystemClock),
            on_loss: None,
        }
    }

    /// The lease as last renewed (same token, latest expiry).
    pub fn lease(&self) -> Lease {
        self.shared.lock().lease.clone()
    }

    /// Whether the lease is lost.
    pub fn is_lost(&self) -> bool {
        self.shared.lock().lost.is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn loss(&self) -> Option<Loss> {
        self.shared.lock().lost.clone()
    }

    /// Waits until the lease is lost or `timeout` passes (`None`: no limit); returns the loss.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<Loss> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = self.shared.lock();
        loop {
            if state.lost.is_some() || state.stop {
                return state.lost.clone();
            }
            state = match deadline {
                None => self
                    .shared
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.shared
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
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
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        {
            let mut state = self.shared.lock();
            state.stop = true;
        }
        self.shared.changed.notify_all();
        let _ = thread.join();
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

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    lease: Lease,
    lost: Option<Loss>,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain data updated in single assignments: usable after a panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lose(&self, loss: Loss) {
        self.lock().lost.get_or_insert(loss);
        self.changed.notify_all();
    }
}

struct Renewer<L> {
    leases: Arc<L>,
    shared: Arc<Shared>,
    interval: Duration,
    clock: Arc<dyn Clock>,
    on_loss: Option<LossCallback>,
}

impl<L: SessionLease> Renewer<L> {
    fn run(mut self) {
        let mut next = Instant::now() + self.interval;
        loop {
            // Sleep until the next renew or a stop, holding no lock meanwhile.
            let lease = {
                let mut state = self.shared.lock();
                loop {
                    if state.stop {
                        return;
                    }
                    let left = next.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    state = self
                        .shared
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                state.lease.clone()
            };
            let loss = match self.leases.renew(&lease) {
                Ok(Grant::Granted(renewed)) => {
                    self.shared.lock().lease = renewed;
                    next = Instant::now() + self.interval;
                    continue;
                }
                Ok(Grant::Held) => Loss::TakenOver,
                Err(_) if !machine::is_expired(lease.expiry, self.clock.now()) => {
                    // Transient while the lease is still valid: retry sooner, and no later
                    // than its expiry, when a failure becomes a loss.
                    let until_expiry = lease.expiry.saturating_duration_since(self.clock.now());
                    let retry = (self.interval / 4).min(until_expiry);
                    next = Instant::now() + retry.max(Duration::from_millis(1));
                    continue;
                }
                Err(e) => Loss::Expired {
                    last_error: e.to_string(),
                },
            };
            self.shared.lose(loss.clone());
            if let Some(f) = self.on_loss.take() {
                f(&loss);
            }
            return;
        }
    }
}
