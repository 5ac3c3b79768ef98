//! Fault injection through the adapter's I/O seam: for every fault point, in every transition
//! that reaches it, the step fails once — at its first occurrence in the call, then at its
//! second, and so on while the call reaches that many. Each time: the error is reported (or success, when the
//! record was already committed), no lease is lost, no lock leaks, the next call recovers and
//! tokens stay monotone.

use crate::support;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::{Error, FlockLease, Grant, Lease, ManualClock, Record, record};
use support::{files_ending, id, owner};

struct Harness {
    dir: tempfile::TempDir,
    clock: ManualClock,
    /// The point to fail and how many of its occurrences to let pass first.
    armed: Arc<Mutex<Option<(FaultPoint, usize)>>>,
    fired: Arc<AtomicBool>,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            dir: tempfile::tempdir().unwrap(),
            clock: ManualClock::new(START),
            armed: Arc::default(),
            fired: Arc::default(),
        }
    }

    fn instance(&self) -> FlockLease {
        let (armed, fired) = (Arc::clone(&self.armed), Arc::clone(&self.fired));
        let hook: FaultHook = Arc::new(move |point, _path| {
            let mut armed = armed.lock().unwrap();
            match armed.as_mut() {
                Some((p, 0)) if *p == point => {
                    *armed = None;
                    fired.store(true, Ordering::SeqCst);
                    Some(std::io::Error::other("injected fault"))
                }
                Some((p, skip)) if *p == point => {
                    *skip -= 1;
                    None
                }
                _ => None,
            }
        });
        FlockLease::builder(self.dir.path())
            .clock(Arc::new(self.clock.clone()))
            .ttl(Duration::from_secs(30))
            .lock_timeout(Duration::from_secs(2))
            .faults(hook)
            .open()
            .unwrap()
    }

    /// Runs `op` with `point` failing at its occurrence number `nth` (0: the first); returns
    /// the result and whether the fault fired.
    fn with_fault<T>(&self, (point, nth): Arm, op: impl FnOnce() -> T) -> (T, bool) {
        self.fired.store(false, Ordering::SeqCst);
        *self.armed.lock().unwrap() = Some((point, nth));
        let out = op();
        *self.armed.lock().unwrap() = None;
        (out, self.fired.load(Ordering::SeqCst))
    }

    fn record(&self) -> Option<Record> {
        let path = self
            .dir
            .path()
            .join(format!("{}.lease.json", id("s").stem()));
        fs::read(path).ok().map(|b| record::decode(&b).unwrap())
    }

    /// Another instance's acquire is refused: the lease is still held.
    fn assert_refused(&self, ctx: &str) {
        let got = self.instance().acquire(&id("s"), &owner("b")).unwrap();
        assert!(got.is_held(), "{ctx}: another owner got the lease");
    }

    /// No lock leaked: the transition lock is free and every liveness file but the one of
    /// `held` (a generation legitimately held) can be locked.
    fn assert_no_leak(&self, held: Option<u64>, ctx: &str) {
        let dir = self.dir.path();
        let stem = id("s").stem().to_owned();
        // (Absent when its very creation was the failing step.)
        if let Ok(lock) = File::open(dir.join(format!("{stem}.lock"))) {
            lock.try_lock()
                .unwrap_or_else(|e| panic!("{ctx}: transition lock leaked: {e:?}"));
        }
        for name in files_ending(dir, ".live") {
            if Some(name.as_str()) == held.map(|t| format!("{stem}.{t}.live")).as_deref() {
                continue;
            }
            let f = File::open(dir.join(&name)).unwrap();
            f.try_lock()
                .unwrap_or_else(|e| panic!("{ctx}: {name} still locked: {e:?}"));
        }
    }
}

/// A fault point and how many of its occurrences pass before it fails.
type Arm = (FaultPoint, usize);

fn granted(g: Result<Grant, Error>, ctx: &str) -> Lease {
    match g {
        Ok(Grant::Granted(l)) => l,
        other => panic!("{ctx}: expected a grant, got {other:?}"),
    }
}

fn assert_injected(e: &Error, dir: &Path, ctx: &str) {
    assert!(matches!(e, Error::Io { .. }), "{ctx}: {e}");
    assert!(e.to_string().contains("injected fault"), "{ctx}: {e}");
    let path = e.path().unwrap();
    assert!(
        path.starts_with(dir),
        "{ctx}: {path:?} outside the lease directory"
    );
}

#[test]
fn every_fault_point_of_every_transition() {
    let mut fired = BTreeSet::new();
    let mut later = 0;
    for point in FaultPoint::ALL {
        for (name, scenario) in [
            ("fresh acquire", fresh_acquire as fn(Arm) -> bool),
            ("takeover from a crashed holder", takeover_from_crashed),
            ("takeover from a tombstone", takeover_from_tombstone),
            ("renew", renew),
            ("renew after a crash takeover", renew_after_takeover),
            ("release", release),
            ("refresh", refresh),
            (
                "renew restoring a replaced liveness file",
                renew_replaced_live,
            ),
            ("waiting acquire", waiting_acquire),
        ] {
            // Every occurrence in turn, until the call no longer reaches that many.
            for nth in 0.. {
                if !scenario((point, nth)) {
                    break;
                }
                fired.insert(point);
                later += usize::from(nth > 0);
                eprintln!("{point:?} #{} failed during {name}: recovered", nth + 1);
            }
        }
    }
    assert!(later > 0, "no later occurrence of any point was reached");
    let missed: Vec<_> = FaultPoint::ALL
        .iter()
        .filter(|p| !fired.contains(p))
        .collect();
    assert!(missed.is_empty(), "fault points never reached: {missed:?}");
}

fn fresh_acquire(arm: Arm) -> bool {
    let point = arm.0;
    let h = Harness::new();
    let a = h.instance();
    let (r, fired) = h.with_fault(arm, || a.acquire(&id("s"), &owner("a")));
    let ctx = format!("fresh acquire, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, 1);
        return false;
    }
    let err = r.unwrap_err();
    assert_injected(&err, h.dir.path(), &ctx);
    // Nothing durable was granted; after a failed directory fsync the record may name a
    // generation whose lock was dropped: a dead one, replaced at once.
    let rec = h.record();
    match point {
        FaultPoint::SyncDir => assert_eq!(rec.map(|r| r.token), Some(1), "{ctx}"),
        _ => assert_eq!(rec, None, "{ctx}"),
    }
    h.assert_no_leak(None, &ctx);
    let l = granted(a.acquire(&id("s"), &owner("a")), &ctx);
    assert!(l.token >= 1);
    h.assert_refused(&ctx);
    true
}

fn takeover_from_crashed(arm: Arm) -> bool {
    let point = arm.0;
    let h = Harness::new();
    let old = granted(h.instance().acquire(&id("s"), &owner("a")), "setup");
    // The holder instance is dropped: its process "crashed".
    let before = h.record();
    let b = h.instance();
    let (r, fired) = h.with_fault(arm, || b.acquire(&id("s"), &owner("b")));
    let ctx = format!("takeover, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, old.token + 1);
        return false;
    }
    if point == FaultPoint::Unlink {
        // Removing the dead generation's file is cleanup after the commit: the takeover
        // stands, the file stays until the listing at the taker's next transition.
        let taken = granted(r, &ctx);
        assert_eq!(taken.token, old.token + 1);
        h.assert_refused(&ctx);
        let dead = h
            .dir
            .path()
            .join(format!("{}.{}.live", id("s").stem(), old.token));
        assert!(
            dead.exists(),
            "{ctx}: the dead generation's file went anyway"
        );
        assert!(!b.renew(&taken).unwrap().is_held(), "{ctx}");
        assert!(
            !dead.exists(),
            "{ctx}: the next transition did not sweep it"
        );
        return true;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    if point != FaultPoint::SyncDir {
        assert_eq!(
            h.record(),
            before,
            "{ctx}: record changed by a failed takeover"
        );
    }
    h.assert_no_leak(None, &ctx);
    let l = granted(b.acquire(&id("s"), &owner("b")), &ctx);
    assert!(l.token > old.token, "{ctx}: token went back");
    true
}

/// The taker's first renew, which also lists the directory for the takeover's older
/// leftovers: a failure of that listing is cleanup and loses nothing; any other failure is a
/// renew's.
fn renew_after_takeover(arm: Arm) -> bool {
    let point = arm.0;
    let h = Harness::new();
    granted(h.instance().acquire(&id("s"), &owner("a")), "setup");
    let b = h.instance();
    let taken = granted(b.acquire(&id("s"), &owner("b")), "setup");
    let before = h.record();
    let (r, fired) = h.with_fault(arm, || b.renew(&taken));
    let ctx = format!("renew after a crash takeover, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, taken.token);
        return false;
    }
    if point == FaultPoint::ReadDir {
        assert_eq!(granted(r, &ctx).token, taken.token, "{ctx}");
        h.assert_refused(&ctx);
        return true;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    assert_eq!(h.record(), before, "{ctx}");
    h.assert_no_leak(Some(taken.token), &ctx);
    h.assert_refused(&ctx);
    assert_eq!(granted(b.renew(&taken), &ctx).token, taken.token);
    true
}

fn renew(arm: Arm) -> bool {
    same_generation(arm, "renew", |a, lease| a.renew(lease))
}

fn refresh(arm: Arm) -> bool {
    same_generation(arm, "refresh", |a, lease| {
        a.acquire(&lease.session_id, &lease.owner)
    })
}

/// A renew or a refresh: the generation stays; a failure must lose nothing.
fn same_generation(
    arm: Arm,
    name: &str,
    op: fn(&FlockLease, &Lease) -> Result<Grant, Error>,
) -> bool {
    let h = Harness::new();
    let a = h.instance();
    let lease = granted(a.acquire(&id("s"), &owner("a")), "setup");
    h.clock.advance(Duration::from_secs(10));
    let before = h.record();
    let (r, fired) = h.with_fault(arm, || op(&a, &lease));
    let ctx = format!("{name}, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, lease.token);
        return false;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    assert_eq!(h.record(), before, "{ctx}");
    h.assert_no_leak(Some(lease.token), &ctx);
    // Not lost: still held against others, and the next try succeeds with the same token.
    h.assert_refused(&ctx);
    assert_eq!(granted(op(&a, &lease), &ctx).token, lease.token);
    true
}

fn release(arm: Arm) -> bool {
    let point = arm.0;
    let h = Harness::new();
    let a = h.instance();
    let lease = granted(a.acquire(&id("s"), &owner("a")), "setup");
    let (r, fired) = h.with_fault(arm, || a.release(&lease));
    let ctx = format!("release, {arm:?}");
    if !fired {
        r.unwrap();
        return false;
    }
    match point {
        // After the commit: the release happened, only its cleanup or the (best-effort)
        // directory sync of the tombstone failed. No error after the commit.
        FaultPoint::Unlink | FaultPoint::SyncDir => {
            r.unwrap();
            assert!(h.record().unwrap().owner.is_empty(), "{ctx}");
            h.assert_no_leak(None, &ctx);
        }
        _ => {
            assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
            // Still held: the record names it and others are refused.
            assert_eq!(h.record().map(|r| r.token), Some(lease.token), "{ctx}");
            assert!(!h.record().unwrap().owner.is_empty(), "{ctx}");
            h.assert_refused(&ctx);
            // The generation is still tracked: a retry completes the release.
            a.release(&lease).unwrap();
            assert!(h.record().unwrap().owner.is_empty(), "{ctx}");
            h.assert_no_leak(None, &ctx);
        }
    }
    let next = granted(h.instance().acquire(&id("s"), &owner("b")), &ctx);
    assert!(next.token > lease.token, "{ctx}");
    // The takeover from the tombstone removed the released generation's file, whether or not
    // the release could.
    assert_eq!(
        files_ending(h.dir.path(), ".live"),
        vec![format!("{}.{}.live", id("s").stem(), next.token)],
        "{ctx}"
    );
    true
}

/// An acquire after a clean release: a fault before the commit changes nothing; after it
/// (the unlink of the released generation's file) the grant stands.
fn takeover_from_tombstone(arm: Arm) -> bool {
    let point = arm.0;
    let h = Harness::new();
    let a = h.instance();
    let old = granted(a.acquire(&id("s"), &owner("a")), "setup");
    a.release(&old).unwrap();
    let before = h.record();
    let b = h.instance();
    let (r, fired) = h.with_fault(arm, || b.acquire(&id("s"), &owner("b")));
    let ctx = format!("takeover from a tombstone, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, old.token + 1);
        return false;
    }
    if point == FaultPoint::Unlink {
        assert_eq!(granted(r, &ctx).token, old.token + 1);
        return true;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    if point != FaultPoint::SyncDir {
        assert_eq!(
            h.record(),
            before,
            "{ctx}: record changed by a failed takeover"
        );
    }
    h.assert_no_leak(None, &ctx);
    assert!(granted(b.acquire(&id("s"), &owner("b")), &ctx).token > old.token);
    true
}

/// A renew after someone replaced the holder's liveness file with another file: the renew
/// removes it and restores a locked one. A failure there is an error, the generation stays
/// this instance's, and the next renew restores it.
fn renew_replaced_live(arm: Arm) -> bool {
    let h = Harness::new();
    let a = h.instance();
    let lease = granted(a.acquire(&id("s"), &owner("a")), "setup");
    let live = h
        .dir
        .path()
        .join(format!("{}.{}.live", id("s").stem(), lease.token));
    fs::remove_file(&live).unwrap();
    fs::write(&live, b"").unwrap();
    let (r, fired) = h.with_fault(arm, || a.renew(&lease));
    let ctx = format!("renew restoring, {arm:?}");
    if !fired {
        assert_eq!(granted(r, &ctx).token, lease.token);
        return false;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    assert_eq!(granted(a.renew(&lease), &ctx).token, lease.token);
    // Restored: the file at the path is locked again, so others are refused.
    h.assert_refused(&ctx);
    true
}

/// A waiting acquire whose wait fails: the error is reported and nothing is disturbed.
fn waiting_acquire(arm: Arm) -> bool {
    let h = Harness::new();
    let a = h.instance();
    let lease = granted(a.acquire(&id("s"), &owner("a")), "setup");
    let b = h.instance();
    let wait = || b.acquire_wait(&id("s"), &owner("b"), Duration::from_millis(30));
    let (r, fired) = h.with_fault(arm, wait);
    let ctx = format!("waiting acquire, {arm:?}");
    if !fired {
        assert_eq!(r.unwrap(), Grant::Held, "{ctx}");
        return false;
    }
    if arm.0 == FaultPoint::OpenQueue {
        // The line is best effort: a failed open of `<stem>.queue` leaves the wait unqueued,
        // never the call's error.
        assert_eq!(r.unwrap(), Grant::Held, "{ctx}");
        h.assert_no_leak(Some(lease.token), &ctx);
        return true;
    }
    assert_injected(&r.unwrap_err(), h.dir.path(), &ctx);
    h.assert_no_leak(Some(lease.token), &ctx);
    assert_eq!(granted(a.renew(&lease), &ctx).token, lease.token);
    assert_eq!(wait().unwrap(), Grant::Held, "{ctx}");
    true
}

/// A socket pair: the end to give `share_liveness`, and the receiver's, which never reads (a
/// descriptor in flight keeps the generation's lock, as a received one does).
fn receiver() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

#[test]
fn a_shared_generation_whose_commit_failed_is_given_back() {
    // Issue 45.5: an attempt whose commit fails leaves its generation's liveness file locked
    // by the copy sent to the receiver; every later acquire failed LiveLockBusy at once for as
    // long as the receiver kept it. The failed attempt removes its file now.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let (ours, theirs) = receiver();
    let failing = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .share_liveness(ours)
        .faults(Arc::new(|point, _| {
            (point == FaultPoint::Rename).then(|| std::io::Error::other("planted"))
        }))
        .open()
        .unwrap();
    assert!(failing.acquire(&id("a"), &owner("x")).is_err());
    let other = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .open()
        .unwrap();
    let lease = other
        .acquire_wait(&id("a"), &owner("y"), Duration::from_secs(2))
        .unwrap()
        .lease()
        .expect("granted: the failed attempt's generation was given back");
    assert_eq!(lease.token, 1, "no generation was committed before");
    drop(theirs);
}

#[test]
fn acquire_wait_looks_again_while_a_generation_name_is_locked_by_someone_else() {
    // A file at the new generation's name, locked by someone who is not the recorded holder:
    // an attempt fails LiveLockBusy; a waiting acquire looks again until that lock goes.
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let (tried_tx, tried_rx) = std::sync::mpsc::channel::<()>();
    let tried_tx = Mutex::new(tried_tx);
    let waiter = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .faults(Arc::new(move |point, _| {
            if point == FaultPoint::PublishLive {
                let _ = tried_tx.lock().unwrap().send(());
            }
            None
        }))
        .open()
        .unwrap();
    let planted = dir.path().join(format!("{}.1.live", id("b").stem()));
    let blocker = File::create(&planted).unwrap();
    blocker.lock().unwrap();
    // With the lock kept to the deadline, the answer is the lock's, after the deadline.
    let started = std::time::Instant::now();
    let err = waiter
        .acquire_wait(&id("b"), &owner("y"), Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(err, Error::LiveLockBusy { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "gave up before its deadline"
    );
    while tried_rx.try_recv().is_ok() {}
    // Let go after the waiter's first look: it is granted.
    let granted = std::thread::scope(|s| {
        let waiting =
            s.spawn(|| waiter.acquire_wait(&id("b"), &owner("y"), Duration::from_secs(20)));
        tried_rx.recv().unwrap();
        drop(blocker);
        waiting.join().unwrap()
    });
    assert_eq!(granted.unwrap().lease().map(|l| l.token), Some(1));
}
