//! Events for the `tracing` ecosystem (feature `tracing`): one per transition's outcome, with
//! the id, owner, token and why, and the keep-alive's loss as a warning. Emitted at the one
//! place every backend's transitions pass ([`crate::front`]), from what the transition read
//! (the machine's input) and what it answered; nothing here decides anything.
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

use std::time::{Duration, Instant};

use crate::error::Error;
use crate::machine::{Event, Input, Outcome};
use crate::name::SessionId;

/// What one transition's events need, noted as it runs.
pub(crate) struct Noted {
    id: SessionId,
    event: Event,
    ttl: Duration,
    started: Instant,
}

impl Noted {
    /// Starts noting a transition for `event` on `id` (an instance with lease time `ttl`).
    pub(crate) fn new(id: &SessionId, event: &Event, ttl: Duration) -> Noted {
        Noted {
            id: id.clone(),
            event: event.clone(),
            ttl,
            started: Instant::now(),
        }
    }

    /// Emits the event for the transition's `outcome`, after it read what `input` holds.
    pub(crate) fn done(&self, input: Option<&Input>, outcome: &Result<Outcome, Error>) {
        let id = self.id.as_str();
        let took_ms = self.started.elapsed().as_millis() as u64;
        let (kind, owner, token) = match &self.event {
            Event::Acquire { owner } => ("acquire", owner.as_str(), None),
            Event::Renew { owner, token } => ("renew", owner.as_str(), Some(*token)),
            Event::Release { owner, token } => ("release", owner.as_str(), Some(*token)),
        };
        let before = input.and_then(|i| Some((i.record.as_ref()?, i.now)));
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
