//! A conformance suite that any [`SessionLease`] backend can run.
//!
//! Each case is a function taking a fresh [`World`] and panicking on a violation. The
//! [`conformance_tests!`](crate::conformance_tests) macro turns the whole suite into one
//! `#[test]` per case for a backend:
//!
//! ```
//! use std::sync::Arc;
//! use flocklease::conformance::{World, START, TTL};
//! use flocklease::{ManualClock, MemLease, MemStore, Record, SessionId};
//!
//! struct MyWorld { store: MemStore, clock: ManualClock }
//!
//! impl World for MyWorld {
//!     type Lease = MemLease;
//!     fn instance(&self) -> MemLease {
//!         MemLease::new(self.store.clone(), Arc::new(self.clock.clone()), TTL)
//!     }
//!     fn clock(&self) -> &ManualClock { &self.clock }
//!     fn record(&self, id: &SessionId) -> Option<Record> { self.store.record(id) }
//!     fn set_record(&self, id: &SessionId, r: Record) { self.store.set_record(id, r) }
//! }
//!
//! fn world() -> MyWorld {
//!     MyWorld { store: MemStore::new(), clock: ManualClock::new(START) }
//! }
//!
//! // In a test file: one #[test] per case.
//! flocklease::conformance_tests!(world());
//! # fn main() {
//! #     flocklease::conformance::release_is_idempotent(&world());
//! # }
//! ```
//!
//! Every world starts at [`START`] with a TTL of [`TTL`] on a manual clock.

use std::time::Duration;

use crate::clock::ManualClock;
use crate::lease::{Grant, Lease, SessionLease};
use crate::name::{Owner, SessionId};
use crate::record::Record;
use crate::timestamp::Timestamp;

/// The TTL every world must use.
pub const TTL: Duration = Duration::from_secs(30);

/// The instant every world's clock starts at.
pub const START: Timestamp = match Timestamp::from_unix_secs(1_700_000_000) {
    Some(t) => t,
    None => panic!("start out of range"),
};

/// The shared state a backend runs in: a directory, a store, ... and its manual clock.
pub trait World {
    /// The backend under test.
    type Lease: SessionLease;

    /// A new lease-manager instance over this world's shared state (a new "process"), using
    /// [`World::clock`] and [`TTL`]. Dropping it must behave like its process crashing.
    fn instance(&self) -> Self::Lease;

    /// The world's clock, shared by all its instances.
    fn clock(&self) -> &ManualClock;

    /// The record of `id` as stored, if any (it must decode: cases never corrupt it).
    fn record(&self, id: &SessionId) -> Option<Record>;

    /// Stores `record` for `id` directly, as an operator or an older process might have.
    fn set_record(&self, id: &SessionId, record: Record);

    /// A new instance like [`World::instance`] whose bound on waiting for `id`'s transition
    /// lock is `timeout`, and that lock held from outside every instance (as by a stuck
    /// process) until the returned guard is dropped. `None` (the default) for a backend
    /// without such a lock: [`queued_callers_each_keep_their_own_deadline`] then checks
    /// nothing.
    fn stuck_transition(
        &self,
        id: &SessionId,
        timeout: Duration,
    ) -> Option<(Self::Lease, Box<dyn std::any::Any>)> {
        let _ = (id, timeout);
        None
    }
}

/// Generates one `#[test]` per conformance case, each on a fresh world from `$make`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::__conformance_cases!($make;
            fresh_acquire_echoes_id_and_owner,
            renew_keeps_token_and_moves_expiry,
            release_frees_for_another_owner,
            other_owner_is_held_while_held,
            same_owner_reacquire_keeps_token,
            acquire_after_release_raises_token,
            acquire_after_expiry_raises_token,
            expiry_boundary_is_expired,
            renew_after_expiry_and_takeover_is_held,
            renew_after_release_is_held,
            release_is_idempotent,
            tokens_increase_along_takeovers,
            distinct_ids_are_independent,
            renew_reclaims_after_expiry_without_competitor,
            renew_after_takeover_by_another_instance_is_held,
            renew_of_a_copy_never_acquired_here_is_held,
            same_owner_in_another_instance_is_foreign,
            crashed_holder_is_replaced_at_once,
            stale_release_leaves_successor_held,
            token_never_wraps,
            release_writes_a_tombstone,
            queued_callers_each_keep_their_own_deadline,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::$case(&$make);
            }
        )*
    };
}

fn id(s: &str) -> SessionId {
    SessionId::new(s).expect("valid id")
}

fn owner(s: &str) -> Owner {
    Owner::new(s).expect("valid owner")
}

fn granted(g: Result<Grant, crate::Error>, what: &str) -> Lease {
    match g {
        Ok(Grant::Granted(l)) => l,
        Ok(Grant::Held) => panic!("{what}: expected a grant, got held"),
        Err(e) => panic!("{what}: expected a grant, got error: {e}"),
    }
}

fn held(g: Result<Grant, crate::Error>, what: &str) {
    match g {
        Ok(Grant::Held) => {}
        Ok(Grant::Granted(l)) => panic!("{what}: expected held, got a grant {l:?}"),
        Err(e) => panic!("{what}: expected held, got error: {e}"),
    }
}

fn at(secs: u64) -> Timestamp {
    START
        .checked_add(Duration::from_secs(secs))
        .expect("in range")
}

/// A fresh acquire echoes the id and owner, with token 1 and expiry = now + TTL.
pub fn fresh_acquire_echoes_id_and_owner<W: World>(w: &W) {
    let l = w.instance();
    let lease = granted(l.acquire(&id("s"), &owner("a")), "fresh acquire");
    assert_eq!(lease.session_id, id("s"));
    assert_eq!(lease.owner, owner("a"));
    assert_eq!(lease.token, 1);
    assert_eq!(lease.expiry, at(30));
    let r = w.record(&id("s")).expect("record written");
    assert_eq!((r.owner.as_str(), r.token, r.expiry), ("a", 1, at(30)));
}

/// Renew after TTL/2 keeps the token and moves the expiry later.
pub fn renew_keeps_token_and_moves_expiry<W: World>(w: &W) {
    let l = w.instance();
    let lease = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL / 2);
    let renewed = granted(l.renew(&lease), "renew");
    assert_eq!(renewed.token, lease.token);
    assert_eq!(renewed.expiry, at(45));
    assert_eq!(w.record(&id("s")).map(|r| r.expiry), Some(at(45)));
}

/// Release frees the lease for another owner.
pub fn release_frees_for_another_owner<W: World>(w: &W) {
    let l = w.instance();
    let lease = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    l.release(&lease).expect("release");
    let other = granted(
        l.acquire(&id("s"), &owner("b")),
        "acquire by b after release",
    );
    assert_eq!(other.owner, owner("b"));
}

/// Another owner's acquire while the lease is held is answered held, and changes nothing.
pub fn other_owner_is_held_while_held<W: World>(w: &W) {
    let l = w.instance();
    granted(l.acquire(&id("s"), &owner("a")), "acquire");
    let before = w.record(&id("s"));
    held(l.acquire(&id("s"), &owner("b")), "acquire by b");
    assert_eq!(w.record(&id("s")), before, "a held acquire must not write");
}

/// The same owner re-acquiring in the same instance keeps the token and refreshes the expiry.
pub fn same_owner_reacquire_keeps_token<W: World>(w: &W) {
    let l = w.instance();
    let first = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(Duration::from_secs(10));
    let again = granted(l.acquire(&id("s"), &owner("a")), "re-acquire");
    assert_eq!(again.token, first.token);
    assert_eq!(again.expiry, at(40));
}

/// Acquire after release gives a strictly greater token.
pub fn acquire_after_release_raises_token<W: World>(w: &W) {
    let l = w.instance();
    let first = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    l.release(&first).expect("release");
    let second = granted(l.acquire(&id("s"), &owner("a")), "acquire after release");
    assert!(second.token > first.token);
}

/// Acquire after expiry gives a strictly greater token, for another owner and for the same.
pub fn acquire_after_expiry_raises_token<W: World>(w: &W) {
    let l = w.instance();
    let first = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL + Duration::from_secs(1));
    let b = granted(
        l.acquire(&id("s"), &owner("b")),
        "acquire by b after expiry",
    );
    assert!(b.token > first.token);
    w.clock().advance(TTL + Duration::from_secs(1));
    let a = granted(l.acquire(&id("s"), &owner("b")), "same owner after expiry");
    assert!(a.token > b.token, "an expired lease is a new generation");
}

/// `now >= expiry` is expired: at the boundary the lease can be taken over.
pub fn expiry_boundary_is_expired<W: World>(w: &W) {
    let l = w.instance();
    let first = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().set(first.expiry);
    let b = granted(
        l.acquire(&id("s"), &owner("b")),
        "acquire at the expiry instant",
    );
    assert!(b.token > first.token);
}

/// Renew after expiry and a takeover is held (lost), and does not disturb the new holder.
pub fn renew_after_expiry_and_takeover_is_held<W: World>(w: &W) {
    let l = w.instance();
    let a = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL);
    let b = granted(l.acquire(&id("s"), &owner("b")), "takeover");
    held(l.renew(&a), "renew of the superseded lease");
    held(l.renew(&a), "second renew of the superseded lease");
    granted(l.renew(&b), "the successor still renews");
}

/// Renew after release is held.
pub fn renew_after_release_is_held<W: World>(w: &W) {
    let l = w.instance();
    let a = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    l.release(&a).expect("release");
    held(l.renew(&a), "renew after release");
}

/// Releasing twice, and releasing a lease never acquired, succeed without writing.
pub fn release_is_idempotent<W: World>(w: &W) {
    let l = w.instance();
    let a = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    l.release(&a).expect("first release");
    let after = w.record(&id("s"));
    l.release(&a).expect("second release");
    assert_eq!(w.record(&id("s")), after);
    let never = Lease {
        session_id: id("never"),
        owner: owner("a"),
        token: 7,
        expiry: at(30),
    };
    l.release(&never)
        .expect("release of a never-acquired lease");
    assert_eq!(w.record(&id("never")), None);
}

/// Tokens strictly increase along takeovers A → B → A.
pub fn tokens_increase_along_takeovers<W: World>(w: &W) {
    let l = w.instance();
    let mut last = 0;
    for who in ["a", "b", "a", "b"] {
        let lease = granted(l.acquire(&id("s"), &owner(who)), "acquire");
        assert!(lease.token > last, "token {} after {last}", lease.token);
        last = lease.token;
        l.release(&lease).expect("release");
    }
}

/// Distinct ids lease independently.
pub fn distinct_ids_are_independent<W: World>(w: &W) {
    let l = w.instance();
    let x = granted(l.acquire(&id("x"), &owner("a")), "acquire x");
    let y = granted(
        l.acquire(&id("y"), &owner("b")),
        "acquire y by another owner",
    );
    assert_eq!((x.token, y.token), (1, 1));
    l.release(&x).expect("release x");
    granted(l.renew(&y), "y unaffected by x's release");
}

/// With two instances, a renew after expiry with no competitor reclaims the lease: same token,
/// expiry = now + TTL.
pub fn renew_reclaims_after_expiry_without_competitor<W: World>(w: &W) {
    let l1 = w.instance();
    let _l2 = w.instance();
    let a = granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL * 3);
    let renewed = granted(l1.renew(&a), "renew after expiry");
    assert_eq!(renewed.token, a.token);
    assert_eq!(renewed.expiry, at(120));
}

/// A renew after a genuine takeover by another instance is held.
pub fn renew_after_takeover_by_another_instance_is_held<W: World>(w: &W) {
    let l1 = w.instance();
    let l2 = w.instance();
    let a = granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL);
    let b = granted(
        l2.acquire(&id("s"), &owner("b")),
        "takeover by another instance",
    );
    assert!(b.token > a.token);
    held(l1.renew(&a), "renew after takeover");
}

/// Renewing (or releasing) a copy of a lease that this instance never acquired is held (a
/// no-op), and the real holder keeps it.
pub fn renew_of_a_copy_never_acquired_here_is_held<W: World>(w: &W) {
    let l1 = w.instance();
    let l2 = w.instance();
    let a = granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    held(l2.renew(&a), "renew of a copy in another instance");
    l2.release(&a).expect("release of a copy is a no-op");
    granted(l1.renew(&a), "the holder still renews");
}

/// The same owner string in another instance counts as a foreign owner.
pub fn same_owner_in_another_instance_is_foreign<W: World>(w: &W) {
    let l1 = w.instance();
    let l2 = w.instance();
    granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    held(
        l2.acquire(&id("s"), &owner("a")),
        "same owner, other instance",
    );
}

/// A crashed holder (its instance dropped) is replaced at once, with a greater token.
pub fn crashed_holder_is_replaced_at_once<W: World>(w: &W) {
    let l1 = w.instance();
    let l2 = w.instance();
    let a = granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    held(l2.acquire(&id("s"), &owner("b")), "while the holder runs");
    drop(l1);
    let b = granted(
        l2.acquire(&id("s"), &owner("b")),
        "after the holder crashed",
    );
    assert!(b.token > a.token);
}

/// A stale release from an older generation leaves the successor held.
pub fn stale_release_leaves_successor_held<W: World>(w: &W) {
    let l1 = w.instance();
    let l2 = w.instance();
    let l3 = w.instance();
    let a = granted(l1.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(TTL);
    let b = granted(l2.acquire(&id("s"), &owner("b")), "takeover");
    let before = w.record(&id("s"));
    l1.release(&a).expect("stale release");
    assert_eq!(w.record(&id("s")), before, "a stale release must not write");
    held(l3.acquire(&id("s"), &owner("c")), "successor still held");
    granted(l2.renew(&b), "successor still renews");
}

/// A token at `u64::MAX` fails closed instead of wrapping, and leaves the record as it was.
pub fn token_never_wraps<W: World>(w: &W) {
    let tomb = Record {
        owner: String::new(),
        token: u64::MAX,
        expiry: START,
    };
    w.set_record(&id("s"), tomb.clone());
    let l = w.instance();
    match l.acquire(&id("s"), &owner("a")) {
        Err(crate::Error::TokenExhausted { .. }) => {}
        other => panic!("expected token exhausted, got {other:?}"),
    }
    assert_eq!(w.record(&id("s")), Some(tomb));
}

/// Release writes a tombstone: empty owner, the same token, expiry = the release instant.
pub fn release_writes_a_tombstone<W: World>(w: &W) {
    let l = w.instance();
    let a = granted(l.acquire(&id("s"), &owner("a")), "acquire");
    w.clock().advance(Duration::from_secs(5));
    l.release(&a).expect("release");
    assert_eq!(
        w.record(&id("s")),
        Some(Record {
            owner: String::new(),
            token: a.token,
            expiry: at(5),
        })
    );
}

/// Callers queued on one id in one instance each wait for their own deadline: with the
/// transition lock stuck and a 100 ms bound, six concurrent callers are all answered with an
/// error by about 100 ms, not one after the other (the sixth after 600 ms). The bound checked
/// is loose on purpose (3.5 times the timeout).
pub fn queued_callers_each_keep_their_own_deadline<W: World>(w: &W) {
    let timeout = Duration::from_millis(100);
    let Some((leases, _stuck)) = w.stuck_transition(&id("s"), timeout) else {
        return;
    };
    let answered: Vec<Duration> = std::thread::scope(|s| {
        let callers: Vec<_> = (0..6)
            .map(|i| {
                let leases = &leases;
                s.spawn(move || {
                    let started = std::time::Instant::now();
                    let got = leases.acquire(&id("s"), &owner(&format!("c{i}")));
                    (got, started.elapsed())
                })
            })
            .collect();
        callers
            .into_iter()
            .map(|c| {
                let (got, took) = c.join().expect("caller panicked");
                assert!(got.is_err(), "the stuck lock answered {got:?}");
                took
            })
            .collect()
    });
    let slowest = answered.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < timeout * 7 / 2,
        "deadlines added up: answered after {answered:?}"
    );
}
