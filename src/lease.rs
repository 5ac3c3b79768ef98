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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
/// backends may implement it; [`conformance`](crate::conformance) checks one.
pub trait SessionLease: Send + Sync {
    /// Acquires the lease of `id` for `owner`.
    ///
    /// Returns [`Grant::Granted`] with a fresh expiry when the id is free, released, expired,
    /// held by a crashed process, or already held by this instance for `owner` (then with the
    /// same token); [`Grant::Held`] when another live owner holds it.
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
    /// nothing and drops `notify`. [`PgLease`](crate::pg::PgLease) calls `notify` (from any
    /// thread, possibly before returning when the loss is already known or the generation is
    /// not held here) the moment the generation's liveness connection ends. After a release
    /// of the generation, `notify` is dropped uncalled. [`KeepAlive`](crate::KeepAlive) turns
    /// the call into [`Loss::LivenessLost`](crate::Loss::LivenessLost).
    fn on_liveness_lost(&self, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        let _ = (lease, notify);
    }
}
