//! Recovery after a crash at scale: the cost of taking over many dead ids does not grow with
//! the directory (its own binary: it holds many descriptors, which would disturb the
//! descriptor counts of tests running beside it).

#![allow(clippy::unwrap_used)]

mod support;

use std::fs;
use std::sync::Arc;

use flocklease::conformance::START;
use flocklease::fault::FaultPoint;
use flocklease::{FlockLease, ManualClock};
use support::{id, open_manual, owner};

/// After a crash, a survivor takes over every id the dead instance held: the deferred sweeps
/// of those takeovers share listings of the directory (at most one per `SWEEP_SHARE`-th of
/// the directory's entries), instead of one listing each, so recovering N ids costs O(N)
/// whatever else the directory holds; the others' leftovers found by a shared listing are
/// removed by their own next transition.
#[test]
fn recovering_many_dead_ids_shares_the_sweeps_listings() {
    const BACKGROUND: usize = 640;
    const DEAD: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    for i in 0..BACKGROUND {
        let l = a.acquire(&id(&format!("bg-{i}")), &owner("a")).unwrap();
        a.release(&l.lease().unwrap()).unwrap();
    }
    let dead: Vec<_> = (0..DEAD).map(|i| id(&format!("dead-{i}"))).collect();
    for d in &dead {
        a.acquire(d, &owner("a")).unwrap().lease().unwrap();
    }
    // The crash: every liveness lock of `a` is dropped. Each dead id leaves a temporary
    // record behind, as a crash inside a transition would.
    drop(a);
    let leftover = |d: &flocklease::SessionId| {
        dir.path()
            .join(format!("{}.lease.json.0123456789abcdef.tmp", d.stem()))
    };
    for d in &dead {
        fs::write(leftover(d), b"{").unwrap();
    }
    let listings = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&listings);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, _| {
        if point == FaultPoint::ReadDir {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        None
    });
    let b = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .faults(hook)
        .open()
        .unwrap();
    let mut held = vec![];
    for d in &dead {
        let l = b.acquire(d, &owner("b")).unwrap().lease().unwrap();
        assert_eq!(l.token, 2, "a crash takeover");
        held.push(b.renew(&l).unwrap().lease().unwrap());
    }
    let entries = fs::read_dir(dir.path()).unwrap().count();
    let listings = listings.load(std::sync::atomic::Ordering::Relaxed);
    // One listing at the first sweep, then one per `entries / SWEEP_SHARE` sweeps.
    let bound = 1 + DEAD / (entries / flocklease::flock::SWEEP_SHARE);
    assert!(
        (1..=bound).contains(&listings),
        "{listings} listings for {DEAD} recovered ids among {entries} entries (at most {bound})"
    );
    // A second transition on each id removes what a shared listing found for it.
    for l in &held {
        b.renew(l).unwrap().lease().unwrap();
    }
    let left = dead.iter().filter(|d| leftover(d).exists()).count();
    assert!(
        left < DEAD / 2,
        "{left} of {DEAD} leftovers still there after two transitions on each id"
    );
}
