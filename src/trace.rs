//! Events for the `tracing` ecosystem (feature `tracing`): one per transition's outcome, with
//! the id, owner, token and why, and the keep-alive's loss as a warning. Emitted at the one
//! place every backend's transitions pass ([`crate::front`]), from what the transition read
//! (its [`Begun`]) and what it answered; nothing here decides anything.
//!
//! Events (target `flocklease`), each with the fields `id` and `owner`, and `took_ms` (the
//! call's time, its waits for the id's turn and lock included) for transitions:
//!
//! | event | level | fields |
//! | --- | --- | --- |
//! | lease granted | INFO | `token`, `expiry`, `reason`: `new` (free or released), `takeover` (its holder's liveness was gone), `expired` (its holder's lease had expired), `refresh` (this instance held it already) |
//! | lease held | DEBUG | `holder`, `holder_token` (the acquire is refused) |
//! | lease renewed | DEBUG, WARN when slow | `token`, `expiry`; slow: `took_ms` above a third of the TTL (the keep-alive's interval) |
//! | renew lost | WARN | `token` (the renew found the lease taken over or expired and taken) |
//! | lease released | INFO | `token` |
//! | transition failed | WARN | `event`, `error` |
//! | keep-alive lost the lease | WARN | `token`, `loss` |

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crate::driver::{Begun, CommitStep, Grain, Transaction};
use crate::error::Error;
use crate::machine::{Cleanup, Event, Liveness, Local, Outcome, Plan};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// What one transition's events need, noted as it runs.
pub(crate) struct Noted {
    id: SessionId,
    event: Event,
    ttl: Duration,
    started: Instant,
    /// The record and clock the transition read (its last `begin`).
    begun: RefCell<Option<(Option<Record>, Timestamp)>>,
}

impl Noted {
    /// Starts noting a transition for `event` on `id` (an instance with lease time `ttl`).
    pub(crate) fn new(id: &SessionId, event: &Event, ttl: Duration) -> Noted {
        Noted {
            id: id.clone(),
            event: event.clone(),
            ttl,
            started: Instant::now(),
            begun: RefCell::new(None),
        }
    }

    /// `tx`, noting what its `begin` reads.
    pub(crate) fn wrap<T: Transaction>(&self, tx: T) -> Noting<'_, T> {
        Noting { noted: self, tx }
    }

    /// Emits the event for the transition's `outcome`.
    pub(crate) fn done(&self, outcome: &Result<Outcome, Error>) {
        let id = self.id.as_str();
        let took_ms = self.started.elapsed().as_millis() as u64;
        let (kind, owner, token) = match &self.event {
            Event::Acquire { owner } => ("acquire", owner.as_str(), None),
            Event::Renew { owner, token } => ("renew", owner.as_str(), Some(*token)),
            Event::Release { owner, token } => ("release", owner.as_str(), Some(*token)),
        };
        let begun = self.begun.borrow();
        let before = begun
            .as_ref()
            .and_then(|(r, now)| Some((r.as_ref()?, *now)));
        match (outcome, kind) {
            (Err(e), _) => tracing::warn!(
                target: "flocklease",
                id, owner, event = kind, error = %e, took_ms,
                "lease transition failed"
            ),
            (Ok(Outcome::Granted { token, expiry }), "acquire") => {
                let reason = match before {
                    None => "new",
                    Some((r, _)) if r.is_tombstone() => "new",
                    Some((r, _)) if r.token == *token => "refresh",
                    Some((r, now)) if r.expiry <= now => "expired",
                    Some(_) => "takeover",
                };
                tracing::info!(
                    target: "flocklease",
                    id, owner, token, expiry = %expiry, reason, took_ms,
                    "lease granted"
                );
            }
            (Ok(Outcome::Granted { token, expiry }), _) => {
                if Duration::from_millis(took_ms) > self.ttl / 3 {
                    tracing::warn!(
                        target: "flocklease",
                        id, owner, token, expiry = %expiry, took_ms,
                        "lease renewed slowly (longer than a third of the TTL)"
                    );
                } else {
                    tracing::debug!(
                        target: "flocklease",
                        id, owner, token, expiry = %expiry, took_ms,
                        "lease renewed"
                    );
                }
            }
            (Ok(Outcome::Held), "acquire") => {
                let (holder, holder_token) = before.map_or(("", 0), |(r, _)| (&*r.owner, r.token));
                tracing::debug!(
                    target: "flocklease",
                    id, owner, holder, holder_token, took_ms,
                    "lease held"
                );
            }
            (Ok(Outcome::Held), _) => tracing::warn!(
                target: "flocklease",
                id, owner, token, took_ms,
                "renew lost: the lease was taken over or expired"
            ),
            (Ok(Outcome::Released), _) => tracing::info!(
                target: "flocklease",
                id, owner, token, took_ms,
                "lease released"
            ),
        }
    }
}

/// The keep-alive's loss of `lease`, as a warning.
pub(crate) fn keepalive_lost(lease: &crate::Lease, loss: &crate::Loss) {
    tracing::warn!(
        target: "flocklease",
        id = lease.session_id.as_str(),
        owner = lease.owner.as_str(),
        token = lease.token,
        loss = %loss,
        "keep-alive lost the lease"
    );
}

/// A transaction whose `begin` is noted in a [`Noted`]; every step is the wrapped one's.
pub(crate) struct Noting<'n, T> {
    noted: &'n Noted,
    tx: T,
}

impl<T: Transaction> Transaction for Noting<'_, T> {
    type Pending = T::Pending;

    fn grain(&self) -> Grain {
        self.tx.grain()
    }

    fn lock(&mut self) -> Result<bool, Error> {
        self.tx.lock()
    }

    fn unlock(&mut self) {
        self.tx.unlock()
    }

    fn begin(&mut self) -> Result<Begun, Error> {
        let begun = self.tx.begin()?;
        *self.noted.begun.borrow_mut() = Some((begun.record.clone(), begun.now));
        Ok(begun)
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        self.tx.probe(token)
    }

    fn commit_step(
        &mut self,
        step: CommitStep,
        plan: &Plan,
    ) -> Result<Option<Self::Pending>, Error> {
        self.tx.commit_step(step, plan)
    }

    fn undo(&mut self, pending: Option<Self::Pending>) {
        self.tx.undo(pending)
    }

    fn cleanup(&mut self, step: &Cleanup) {
        self.tx.cleanup(step)
    }

    fn adopt(&mut self, pending: Self::Pending, local: Local) {
        self.tx.adopt(pending, local)
    }
}
