//! The [`SessionLease`] trait every backend implements, and the values it trades in.

use std::time::Duration;

use crate::error::Error;
use crate::name::{Owner, SessionId};
use crate::timestamp::Timestamp;

/// The default lease time-to-live: 30 seconds.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// A granted lease: the right of `owner` to drive `session_id` until `expiry`.
///
/// `token` is the fencing epoch: it strictly increases with every takeover of the id and never
/// changes on renew, so a resource that remembers the highest token it has seen can refuse a
/// stale holder.
///
/// It serializes (serde) as `{"session_id", "owner", "token", "expiry"}` with the expiry in
/// RFC 3339, for handing it to a worker; deserializing validates the id and owner. A copy is
/// only data: renewing or releasing it works only on the instance holding the generation.
///
/// ```
/// use flocklease::{Lease, Owner, SessionId, Timestamp};
///
/// let lease = Lease {
///     session_id: SessionId::new("job").unwrap(),
///     owner: Owner::new("w1").unwrap(),
///     token: 7,
///     expiry: Timestamp::parse_rfc3339("2030-01-01T00:00:00Z").unwrap(),
/// };
/// let json = serde_json::to_string(&lease).unwrap();
/// assert_eq!(json, r#"{"session_id":"job","owner":"w1","token":7,"expiry":"2030-01-01T00:00:00Z"}"#);
/// assert_eq!(serde_json::from_str::<Lease>(&json).unwrap(), lease);
/// assert_eq!(lease.to_string(), "job held by w1 with token 7 until 2030-01-01T00:00:00Z");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// The session id the lease is for.
    pub session_id: SessionId,
    /// Who holds it.
    pub owner: Owner,
    /// The fencing token (first grant of an id: 1).
    pub token: u64,
    /// When it expires unless renewed (`now >= expiry` means expired).
    pub expiry: Timestamp,
}

impl std::fmt::Display for Lease {
    /// `ID held by OWNER with token N until EXPIRY`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} held by {} with token {} until {}",
            self.session_id, self.owner, self.token, self.expiry
        )
    }
}

/// The answer to an acquire or renew: granted, or held by someone else.
///
/// Contention is an expected outcome, not an error: a failure is always an [`Error`], and
/// `Held` is never reported for a failure.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Grant {
    /// The lease is granted (acquire) or extended (renew).
    Granted(Lease),
    /// Another live owner holds the lease (acquire), or this lease was lost (renew).
    Held,
}

impl Grant {
    /// The lease, if granted.
    pub fn lease(self) -> Option<Lease> {
        match self {
            Grant::Granted(l) => Some(l),
            Grant::Held => None,
        }
    }

    /// Whether the lease is held by someone else (or lost).
    pub fn is_held(&self) -> bool {
        matches!(self, Grant::Held)
    }
}

/// An exclusive, time-limited session lease with a monotone fencing token.
///
/// Implemented by [`FlockLease`](crate::FlockLease) (processes on one host sharing a
/// directory) and [`MemLease`](crate::MemLease) (instances in one process, for tests). Other
/// backends may implement it; the conformance suite (`conformance`, feature `internals`) checks one.
pub trait SessionLease: Send + Sync {
    /// Acquires the lease of `id` for `owner`.
    ///
    /// Returns [`Grant::Granted`] with a fresh expiry when the id is free, released, expired,
    /// held by a crashed process, or already held by this instance for `owner` (then with the
    /// same token, unless it had expired: then the next one); [`Grant::Held`] when another live
    /// owner holds it.
    ///
    /// # Errors
    ///
    /// [`Error`] when the lease state cannot be read or written, or the transition is impossible
    /// (token exhausted).
    fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error>;

    /// Renews `lease`: the same token with expiry = now + TTL.
    ///
    /// Succeeds, even after expiry, as long as the record still names this generation; returns
    /// [`Grant::Held`] when the lease was lost (taken over, or not held by this instance).
    ///
    /// # Errors
    ///
    /// [`Error`] when the record cannot be read or written; the lease is then still held and a
    /// later renew may succeed.
    fn renew(&self, lease: &Lease) -> Result<Grant, Error>;

    /// Releases `lease`. Idempotent: releasing a stale, foreign or already released lease is a
    /// successful no-op, and never disturbs a successor.
    ///
    /// # Errors
    ///
    /// [`Error`] when the tombstone cannot be written; the lease is then still held and a later
    /// release may retry.
    fn release(&self, lease: &Lease) -> Result<(), Error>;

    /// Asks to be told, once, when this instance learns that the liveness lock of `lease`'s
    /// generation is gone while the lease may still be recorded — so that a rival can take it
    /// over before its expiry.
    ///
    /// A `flock(2)` liveness lock cannot vanish while its process runs, so the default does
    /// nothing and drops `notify`. `pg::PgLease` (feature `postgres`) calls `notify` (from any
    /// thread, possibly before returning when the loss is already known or the generation is
    /// not held here) the moment the generation's liveness connection ends. After a release
    /// of the generation, `notify` is dropped uncalled. [`KeepAlive`](crate::KeepAlive) turns
    /// the call into [`Loss::LivenessLost`](crate::Loss::LivenessLost).
    fn on_liveness_lost(&self, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        let _ = (lease, notify);
    }

    /// Why this instance's store is no longer where its leases live, if it is not: for
    /// [`FlockLease`](crate::FlockLease), the lease directory at its path is no longer the one
    /// it opened (removed, replaced, or unmounted: a holder there holds nothing a rival can
    /// see, and a rival on the new directory starts at token 1). One `stat`; the default (a
    /// store that cannot move) answers `None`. [`KeepAlive`](crate::KeepAlive) asks at every
    /// clock check (at least once a second) and turns an answer into
    /// [`Loss::StoreGone`](crate::Loss::StoreGone).
    fn store_gone(&self) -> Option<String> {
        None
    }

    /// The clock this backend judges expiry by: [`FlockLease`](crate::FlockLease)'s and
    /// [`MemLease`](crate::MemLease)'s own clock; `pg::PgLease` (feature `postgres`)'s estimate
    /// of the server's. No call returns [`Grant::Granted`] with an expiry at or before this
    /// clock's time at its return: a grant that expired before the call could return is
    /// renewed if nobody took over, else answered as lost. [`KeepAlive`](crate::KeepAlive)
    /// uses it by default. The default is the system clock.
    fn clock(&self) -> std::sync::Arc<dyn crate::Clock> {
        std::sync::Arc::new(crate::SystemClock)
    }

    /// Acquires the lease of `id` for a new, distinct owner ([`Owner::unique`]) and returns a
    /// guard that releases it when dropped (also when the holder panics); `None` when another
    /// owner holds it.
    ///
    /// Each guard has its own owner, so threads sharing one instance exclude each other (an
    /// acquire by the owner an instance already holds for would be a refresh). Use
    /// [`LeaseGuard::acquire_as`] to choose the owner.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::acquire`].
    ///
    /// # Examples
    ///
    /// ```
    /// use flocklease::{FlockLease, SessionId, SessionLease};
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let leases = FlockLease::open(dir.path())?;
    /// let id = SessionId::new("nightly-report")?;
    /// if let Some(guard) = leases.acquire_guard(&id)? {
    ///     println!("running with fencing token {}", guard.token);
    ///     // ... work; the lease is released when `guard` goes out of scope ...
    /// }
    /// # Ok(())
    /// # }
    /// ```
    fn acquire_guard(&self, id: &SessionId) -> Result<Option<LeaseGuard<'_, Self>>, Error>
    where
        Self: Sized,
    {
        LeaseGuard::acquire_as(self, id, &Owner::unique())
    }
}

/// A granted lease that is released when the guard is dropped (also during a panic). Derefs
/// to the [`Lease`]: `guard.token` is the fencing token. Made by
/// [`SessionLease::acquire_guard`].
///
/// To keep it alive while long work runs, hand the lease to a
/// [`KeepAlive`](crate::KeepAlive) with [`LeaseGuard::into_lease`] (a `KeepAlive` releases on
/// drop as well).
#[must_use = "dropping the guard releases the lease at once"]
pub struct LeaseGuard<'a, L: SessionLease> {
    leases: &'a L,
    lease: Lease,
    /// Released already (by [`LeaseGuard::release`] or [`LeaseGuard::into_lease`]).
    done: bool,
}

impl<'a, L: SessionLease> LeaseGuard<'a, L> {
    /// Acquires the lease of `id` for `owner`; `None` when another owner holds it.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::acquire`].
    pub fn acquire_as(
        leases: &'a L,
        id: &SessionId,
        owner: &Owner,
    ) -> Result<Option<LeaseGuard<'a, L>>, Error> {
        Ok(leases.acquire(id, owner)?.lease().map(|lease| LeaseGuard {
            leases,
            lease,
            done: false,
        }))
    }

    /// Renews the lease (same token, fresh expiry); `false` when it was lost. A lost lease's
    /// release on drop is a harmless no-op (PROTOCOL §3.3).
    ///
    /// # Errors
    ///
    /// As [`SessionLease::renew`].
    pub fn renew(&mut self) -> Result<bool, Error> {
        match self.leases.renew(&self.lease)? {
            Grant::Granted(renewed) => {
                self.lease = renewed;
                Ok(true)
            }
            Grant::Held => Ok(false),
        }
    }

    /// Releases now, returning the result that dropping would ignore.
    ///
    /// # Errors
    ///
    /// As [`SessionLease::release`].
    pub fn release(mut self) -> Result<(), Error> {
        self.done = true;
        self.leases.release(&self.lease)
    }

    /// The lease, no longer released by the guard: the caller releases it (or a
    /// [`KeepAlive`](crate::KeepAlive) does).
    pub fn into_lease(mut self) -> Lease {
        self.done = true;
        self.lease.clone()
    }
}

impl<L: SessionLease> std::ops::Deref for LeaseGuard<'_, L> {
    type Target = Lease;

    fn deref(&self) -> &Lease {
        &self.lease
    }
}

impl<L: SessionLease> Drop for LeaseGuard<'_, L> {
    /// Releases; an error is ignored (the lease then expires). Use [`LeaseGuard::release`] to
    /// see it.
    fn drop(&mut self) {
        if !self.done {
            let _ = self.leases.release(&self.lease);
        }
    }
}

impl<L: SessionLease> std::fmt::Debug for LeaseGuard<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.lease)
            .finish()
    }
}
