//! No backend hands out a lease already expired: a pause between a transition's commit and the
//! call's return (a stopped or descheduled process) that outlasts the TTL makes the grant
//! expired on the backend's clock before the caller sees it; the call then renews it (nobody
//! took over) or answers it lost. And a `KeepAlive` started on an expired lease renews it at
//! once, or starts lost, instead of refusing with `InvalidInterval`. The pause is a fault
//! hook moving a manual clock at the last step of the commit: no sleeps.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flocklease::fault::FaultPoint;
use flocklease::{Clock, FlockLease, Grant, KeepAlive, Loss, ManualClock, Timestamp};
use support::{id, owner};

const TTL: Duration = Duration::from_secs(30);

fn start() -> Timestamp {
    Timestamp::from_unix_secs(1_700_000_000).unwrap()
}

/// A lease manager whose clock jumps past the TTL once, at step `at` of a commit (the record's
/// expiry is computed, the call has not returned), when `armed`.
fn pausing(
    dir: &std::path::Path,
    clock: &ManualClock,
    armed: &Arc<AtomicBool>,
    at: FaultPoint,
) -> FlockLease {
    let (clock2, armed2) = (clock.clone(), Arc::clone(armed));
    FlockLease::builder(dir)
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .faults(Arc::new(move |point, _path| {
            if point == at && armed2.swap(false, Ordering::SeqCst) {
                clock2.advance(TTL + Duration::from_secs(1));
            }
            None
        }))
        .open()
        .unwrap()
}

#[test]
fn an_acquire_paused_past_the_ttl_after_its_commit_returns_a_renewed_lease() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(start());
    let armed = Arc::new(AtomicBool::new(true));
    // The directory sync after the rename: the commit is done.
    let leases = pausing(dir.path(), &clock, &armed, FaultPoint::SyncDir);
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    assert!(!armed.load(Ordering::SeqCst), "the pause happened");
    assert!(
        lease.expiry > clock.now(),
        "granted already expired: {:?} at {:?}",
        lease.expiry,
        clock.now()
    );
    assert_eq!(lease.token, 1, "reclaimed by a renew, not a new generation");
    assert_eq!(lease.expiry, clock.now().checked_add(TTL).unwrap());
}

#[test]
fn a_renew_paused_past_the_ttl_after_its_commit_returns_a_renewed_lease() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(start());
    let armed = Arc::new(AtomicBool::new(false));
    // A renew syncs no directory (no new name): the pause comes just before its rename.
    let leases = pausing(dir.path(), &clock, &armed, FaultPoint::Rename);
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    armed.store(true, Ordering::SeqCst);
    let renewed = leases.renew(&lease).unwrap().lease().unwrap();
    assert!(!armed.load(Ordering::SeqCst), "the pause happened");
    assert!(renewed.expiry > clock.now(), "renewed already expired");
    assert_eq!(renewed.token, lease.token);
}

#[test]
fn a_keep_alive_started_on_an_expired_lease_renews_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(start());
    let leases = Arc::new(
        FlockLease::builder(dir.path())
            .clock(Arc::new(clock.clone()))
            .ttl(TTL)
            .open()
            .unwrap(),
    );
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    clock.advance(TTL + Duration::from_secs(5));
    // The builder's default clock is the lease manager's (here the manual one).
    let keep = KeepAlive::builder(Arc::clone(&leases), lease.clone())
        .start()
        .unwrap();
    assert!(!keep.is_lost(), "{:?}", keep.loss());
    assert_eq!(keep.lease().token, lease.token);
    assert!(keep.lease().expiry > clock.now());
    drop(keep);
    // Taken over while it was expired: the keep-alive starts lost, saying so.
    let lease = leases
        .acquire(&id("t"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    clock.advance(TTL + Duration::from_secs(5));
    let rival = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .open()
        .unwrap();
    assert!(matches!(
        rival.acquire(&id("t"), &owner("b")).unwrap(),
        Grant::Granted(_)
    ));
    let keep = KeepAlive::start(Arc::clone(&leases), lease);
    assert_eq!(keep.loss(), Some(Loss::TakenOver));
}
