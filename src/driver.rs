//! The one interpreter of a [`Plan`](crate::machine::Plan), shared by every backend.
//!
//! A backend implements [`Transaction`] — the primitive steps on one id's state, done while it
//! holds that id's transition lock — and [`run`] does the rest: it reads, asks the machine,
//! probes when asked, prepares, commits, cleans up and reports, in the order the machine's
//! documentation prescribes. No backend decides anything about expiry, tokens or owners.

use std::time::Duration;

use crate::error::Error;
use crate::machine::{
    self, Cleanup, Decision, DirSync, Event, Input, Liveness, Local, Outcome, Prepare,
};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// The primitive steps of one transition on one id, performed under its transition lock.
///
/// Failures of the steps that return `Result` abort the transition; the others are cleanup
/// after a commit and must not fail (a backend logs or ignores what it cannot do there).
pub trait Transaction {
    /// A liveness lock taken for a new generation, not yet adopted. Dropping it releases it.
    type Pending;

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

    /// Checks the local generation's liveness file is in place, restoring it if not
    /// ([`Prepare::EnsureLive`]).
    ///
    /// # Errors
    ///
    /// I/O failure.
    fn ensure_live(&mut self, token: u64) -> Result<(), Error>;

    /// Replaces the record atomically.
    ///
    /// # Errors
    ///
    /// I/O failure; the old record then stands.
    fn commit(&mut self, record: &Record) -> Result<(), Error>;

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

    /// Deletes liveness files of generations below `below` and leftover temporary files.
    fn sweep(&mut self, below: u64);

    /// Makes `pending` the local generation `local` (after a successful commit).
    fn adopt(&mut self, pending: Self::Pending, local: Local);
}

/// Runs one transition for `event` on `id` through `tx`, and returns the machine's outcome.
///
/// # Errors
///
/// Whatever the transaction's fallible steps report, or the machine's refusal
/// ([`Error::TokenExhausted`], [`Error::ExpiryOutOfRange`]). An error is never reported once
/// the record has been committed.
pub fn run<T: Transaction>(
    tx: &mut T,
    id: &SessionId,
    now: Timestamp,
    ttl: Duration,
    event: Event,
) -> Result<Outcome, Error> {
    let mut input = Input {
        record: tx.read()?,
        liveness: None,
        local: tx.local(),
        now,
        ttl,
        event,
    };
    let plan = loop {
        match machine::step(&input).map_err(|e| step_error(e, id))? {
            Decision::Plan(plan) => break plan,
            Decision::Probe { token } => {
                // The machine asks at most once: with liveness known it always plans.
                assert!(input.liveness.is_none(), "machine asked to probe twice");
                input.liveness = Some(tx.probe(token)?);
            }
        }
    };
    // Preparation: a failure drops what was locked so far (the `?` drops `pending`).
    let mut pending = None;
    for p in &plan.prepare {
        match p {
            Prepare::LockLive { token, owner } => {
                let lock = tx.lock_live(*token)?;
                pending = Some((
                    lock,
                    Local {
                        token: *token,
                        owner: owner.clone(),
                    },
                ));
            }
            Prepare::EnsureLive { token } => tx.ensure_live(*token)?,
        }
    }
    if let Some(record) = &plan.commit {
        tx.commit(record)?;
        match plan.sync_dir {
            DirSync::No => {}
            // A new token that might not survive power loss must not be used: fail, and the
            // `?` drops the new generation's lock, so the visible record names a dead
            // generation that the next acquire replaces at once.
            DirSync::Required => tx.sync_dir()?,
            // A tombstone keeps the token: committed is enough, the sync is a bonus.
            DirSync::BestEffort => {
                let _ = tx.sync_dir();
            }
        }
    }
    // Committed: from here on nothing is reported but the outcome.
    for c in &plan.cleanup {
        match c {
            Cleanup::CloseLocal { token } => tx.close_local(*token),
            Cleanup::DeleteLive { token } => tx.delete_live(*token),
            Cleanup::Sweep { below } => tx.sweep(*below),
        }
    }
    if let Some((lock, local)) = pending {
        tx.adopt(lock, local);
    }
    Ok(plan.outcome)
}

fn step_error(e: machine::StepError, id: &SessionId) -> Error {
    match e {
        machine::StepError::TokenExhausted => Error::TokenExhausted { id: id.clone() },
        machine::StepError::ExpiryOutOfRange => Error::ExpiryOutOfRange { id: id.clone() },
    }
}

/// Turns an acquire or renew outcome into the caller's [`Grant`](crate::Grant).
pub(crate) fn grant(outcome: Outcome, id: &SessionId, owner: &crate::Owner) -> crate::Grant {
    match outcome {
        Outcome::Granted { token, expiry } => crate::Grant::Granted(crate::Lease {
            session_id: id.clone(),
            owner: owner.clone(),
            token,
            expiry,
        }),
        Outcome::Held => crate::Grant::Held,
        // The machine answers Released only to a release event.
        Outcome::Released => unreachable!("acquire or renew answered Released"),
    }
}

/// Implements [`SessionLease`](crate::SessionLease) for an adapter with a method
/// `fn transition(&self, id: &SessionId, event: Event) -> Result<Outcome, Error>`: builds the
/// event from the call and turns the outcome into the caller's answer. Also gives the adapter
/// inherent `acquire`, `renew`, `release` and `acquire_guard` methods that forward to the
/// trait, so callers need not import it.
macro_rules! session_lease_via_transition {
    ($adapter:ty) => {
        impl $crate::SessionLease for $adapter {
            fn acquire(
                &self,
                id: &$crate::SessionId,
                owner: &$crate::Owner,
            ) -> Result<$crate::Grant, $crate::Error> {
                let event = $crate::machine::Event::Acquire {
                    owner: owner.clone(),
                };
                Ok($crate::driver::grant(
                    self.transition(id, event)?,
                    id,
                    owner,
                ))
            }

            fn renew(&self, lease: &$crate::Lease) -> Result<$crate::Grant, $crate::Error> {
                let event = $crate::machine::Event::Renew {
                    owner: lease.owner.clone(),
                    token: lease.token,
                };
                let outcome = self.transition(&lease.session_id, event)?;
                Ok($crate::driver::grant(
                    outcome,
                    &lease.session_id,
                    &lease.owner,
                ))
            }

            fn release(&self, lease: &$crate::Lease) -> Result<(), $crate::Error> {
                let event = $crate::machine::Event::Release {
                    owner: lease.owner.clone(),
                    token: lease.token,
                };
                self.transition(&lease.session_id, event).map(drop)
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
pub(crate) use session_lease_via_transition;
