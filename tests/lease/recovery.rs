//! Recovery after a crash at scale: the cost of taking over many dead ids does not grow with
//! the directory (its own binary: it holds many descriptors, which would disturb the
//! descriptor counts of tests running beside it).

use crate::support;

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
    // One listing at the first sweep, then one per `entries / SWEEP_SHARE` sweeps left (a
    // first wait does not count).
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

/// Two dead ids taken over by one instance, each with a leftover.
fn two_dead(dir: &std::path::Path, clock: &ManualClock) -> Vec<flocklease::SessionId> {
    let a = open_manual(dir, clock);
    let dead = vec![id("dead-a"), id("dead-b")];
    for d in &dead {
        a.acquire(d, &owner("a")).unwrap().lease().unwrap();
    }
    drop(a);
    for d in &dead {
        fs::write(leftover(dir, d), b"{").unwrap();
    }
    dead
}

fn leftover(dir: &std::path::Path, d: &flocklease::SessionId) -> std::path::PathBuf {
    dir.join(format!("{}.lease.json.0123456789abcdef.tmp", d.stem()))
}

/// A listing that fails names nothing: the other pending ids still sweep at their next
/// transition (they are not told "nothing to remove").
#[test]
fn a_failed_shared_listing_leaves_the_other_sweeps_pending() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let dead = two_dead(dir.path(), &clock);
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = Arc::clone(&failed);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, _| {
        (point == FaultPoint::ReadDir && !once.swap(true, std::sync::atomic::Ordering::SeqCst))
            .then(|| std::io::Error::other("injected listing failure"))
    });
    let b = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .faults(hook)
        .open()
        .unwrap();
    let la = b.acquire(&dead[0], &owner("b")).unwrap().lease().unwrap();
    let lb = b.acquire(&dead[1], &owner("b")).unwrap().lease().unwrap();
    // The first sweep lists, and the listing fails.
    b.renew(&la).unwrap().lease().unwrap();
    assert!(failed.load(std::sync::atomic::Ordering::SeqCst));
    // The second id's sweep was not settled by it: it lists for itself.
    b.renew(&lb).unwrap().lease().unwrap();
    assert!(
        !leftover(dir.path(), &dead[1]).exists(),
        "the failed listing cancelled the other id's sweep"
    );
}

/// A sweep left waiting for a shared listing (the directory is large, takeovers have stopped)
/// still runs: its own waiting transitions count towards the next listing.
#[test]
fn a_waiting_sweep_runs_even_when_takeovers_stop() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let filler = open_manual(dir.path(), &clock);
    for i in 0..640 {
        let l = filler
            .acquire(&id(&format!("bg-{i}")), &owner("a"))
            .unwrap();
        filler.release(&l.lease().unwrap()).unwrap();
    }
    drop(filler);
    let dead = two_dead(dir.path(), &clock);
    let b = open_manual(dir.path(), &clock);
    // The first takeover's sweep lists the large directory at once...
    let la = b.acquire(&dead[0], &owner("b")).unwrap().lease().unwrap();
    b.renew(&la).unwrap().lease().unwrap();
    assert!(!leftover(dir.path(), &dead[0]).exists());
    // ...so the next one waits for entries/64 more sweeps, and no more takeovers come.
    let lb = b.acquire(&dead[1], &owner("b")).unwrap().lease().unwrap();
    let entries = fs::read_dir(dir.path()).unwrap().count();
    let mut renews = 0;
    while leftover(dir.path(), &dead[1]).exists() {
        b.renew(&lb).unwrap().lease().unwrap();
        renews += 1;
        assert!(
            renews <= entries / flocklease::flock::SWEEP_SHARE + 1,
            "still waiting after {renews} renews ({entries} entries)"
        );
    }
    assert!(renews > 1, "the shared listing did not wait at all");
}
