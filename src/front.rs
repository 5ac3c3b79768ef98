//! The front every backend shares, between the public calls and one transition: the per-id
//! [`Registry`] of an instance, each id's in-process turn ([`Gate`], with each caller's own
//! deadline), and the one [`SessionLease`](crate::SessionLease) path — an acquire, renew or release as a machine
//! event, its outcome as the caller's [`Grant`], never a grant already expired
//! ([`checked`]). A backend gives the front one transition of an id and its clock
//! ([`Backend`]); [`session_lease!`] and [`lease_methods!`] give it the trait and the same
//! inherent `acquire`, `renew`, `release`, `acquire_guard` methods as every other backend.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::error::Error;
use crate::lease::{Grant, Lease};
use crate::machine::{self, Event, Outcome};
use crate::name::{Owner, SessionId};

/// What a backend gives the front.
pub(crate) trait Backend {
    /// Runs one transition for `event` on `id` (the backend's registry entry, turn, lock,
    /// run and end) and returns the machine's outcome.
    fn transition(&self, id: &SessionId, event: Event) -> Result<Outcome, Error>;

    /// The clock expiry is judged by as a call returns ([`checked`]).
    fn lease_clock(&self) -> Arc<dyn Clock>;
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
    checked(b, id, owner, b.transition(id, event))
}

/// [`SessionLease::renew`](crate::SessionLease::renew) for every backend.
pub(crate) fn renew<B: Backend + ?Sized>(b: &B, lease: &Lease) -> Result<Grant, Error> {
    let event = Event::Renew {
        owner: lease.owner.clone(),
        token: lease.token,
    };
    let answer = b.transition(&lease.session_id, event);
    checked(b, &lease.session_id, &lease.owner, answer)
}

/// [`SessionLease::release`](crate::SessionLease::release) for every backend.
pub(crate) fn release<B: Backend + ?Sized>(b: &B, lease: &Lease) -> Result<(), Error> {
    let event = Event::Release {
        owner: lease.owner.clone(),
        token: lease.token,
    };
    b.transition(&lease.session_id, event).map(drop)
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
                answer = b.transition(id, Event::Renew { owner, token });
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
/// gives it the inherent methods of [`lease_methods!`].
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
        }

        $crate::front::lease_methods!($adapter);
    };
}
pub(crate) use session_lease;

/// Gives a lease manager inherent `acquire`, `renew`, `release` and `acquire_guard` methods
/// that call its [`SessionLease`](crate::SessionLease) implementation, so that callers of every
/// backend need not import the trait.
macro_rules! lease_methods {
    ($adapter:ty) => {
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
pub(crate) use lease_methods;

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

    /// Every entry (for an instance's drop).
    #[cfg(feature = "postgres")]
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
