//! The keep-alive handle: renews, loss by takeover, transient errors retried until expiry,
//! explicit and implicit release. The backend is wrapped to report every renew on a channel,
//! so the tests wait for events, not for time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::{
    Error, Grant, KeepAlive, Lease, Loss, ManualClock, MemLease, MemStore, Owner, SessionId,
    SessionLease,
};

const TTL: Duration = Duration::from_secs(30);
/// Only a guard against a hang: every wait below normally ends in microseconds.
const GUARD: Duration = Duration::from_secs(20);

/// A backend that reports each renew's result and can be told to fail the next renews.
struct Observed {
    inner: MemLease,
    renews: Mutex<Sender<String>>,
    failing: AtomicUsize,
}

impl SessionLease for Observed {
    fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
        self.inner.acquire(id, owner)
    }
    fn renew(&self, lease: &Lease) -> Result<Grant, Error> {
        let r = if self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            Err(Error::Io {
                op: "write",
                path: "injected".into(),
                source: std::io::Error::other("disk full"),
            })
        } else {
            self.inner.renew(lease)
        };
        let text = match &r {
            Ok(Grant::Granted(l)) => format!("granted {}", l.expiry),
            Ok(Grant::Held) => "held".into(),
            Err(_) => "error".into(),
        };
        let _ = self.renews.lock().unwrap().send(text);
        r
    }
    fn release(&self, lease: &Lease) -> Result<(), Error> {
        self.inner.release(lease)
    }
}

struct World {
    store: MemStore,
    clock: ManualClock,
}

impl World {
    fn new() -> World {
        World {
            store: MemStore::new(),
            clock: ManualClock::new(START),
        }
    }
    fn observed(&self) -> (Arc<Observed>, Receiver<String>) {
        let (tx, rx) = mpsc::channel();
        let leases = Observed {
            inner: MemLease::new(self.store.clone(), Arc::new(self.clock.clone()), TTL),
            renews: Mutex::new(tx),
            failing: AtomicUsize::new(0),
        };
        (Arc::new(leases), rx)
    }
    fn other(&self) -> MemLease {
        MemLease::new(self.store.clone(), Arc::new(self.clock.clone()), TTL)
    }
}

fn id() -> SessionId {
    SessionId::new("job").unwrap()
}

fn acquire(leases: &impl SessionLease, who: &str) -> Lease {
    leases
        .acquire(&id(), &Owner::new(who).unwrap())
        .unwrap()
        .lease()
        .unwrap()
}

/// Moves the manual clock on by `step` (at least the time until the next renew is due) once,
/// and waits for the renewer to report that renew. One advance makes exactly one renew due, so
/// the clock never runs ahead of the test however slowly the renewer is scheduled.
fn tick_until_renew(w: &World, renews: &Receiver<String>, step: Duration) -> String {
    w.clock.advance(step);
    renews
        .recv_timeout(GUARD)
        .expect("no renew after the clock moved")
}

fn keep_alive(
    w: &World,
    leases: &Arc<Observed>,
    lease: Lease,
    interval: Duration,
) -> KeepAlive<Observed> {
    KeepAlive::builder(Arc::clone(leases), lease)
        .interval(interval)
        .clock(Arc::new(w.clock.clone()))
        .clock_check(Duration::from_millis(1))
        .start()
        .unwrap()
}

#[test]
fn renews_keep_the_token_and_move_the_expiry() {
    let w = World::new();
    let (leases, renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let keep = keep_alive(&w, &leases, lease.clone(), Duration::from_secs(10));
    // The renew is due 10 s of wall clock later, not before.
    assert!(renews.recv_timeout(Duration::from_millis(50)).is_err());
    w.clock.advance(Duration::from_secs(10));
    let expected = format!(
        "granted {}",
        START.checked_add(Duration::from_secs(40)).unwrap()
    );
    assert_eq!(renews.recv_timeout(GUARD).unwrap(), expected);
    // The renewer stores the result before it sleeps again: the next renew shows it is visible.
    assert!(tick_until_renew(&w, &renews, Duration::from_secs(10)).starts_with("granted"));
    let now = keep.lease();
    assert_eq!(now.token, lease.token);
    assert!(now.expiry >= START.checked_add(Duration::from_secs(40)).unwrap());
    assert!(!keep.is_lost());
    keep.release().unwrap();
    assert!(w.store.record(&id()).unwrap().owner.is_empty(), "released");
}

#[test]
fn a_takeover_is_reported_at_once_by_poll_wait_and_callback() {
    let w = World::new();
    let (leases, renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let (tx, callback) = mpsc::channel();
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_secs(10))
        .clock(Arc::new(w.clock.clone()))
        .clock_check(Duration::from_millis(1))
        .on_loss(move |loss| tx.send(loss.clone()).unwrap())
        .start()
        .unwrap();
    // A competitor whose clock runs a TTL ahead sees the lease expired and takes it over
    // while, by the holder's clock, it is still valid.
    let ahead = ManualClock::new(START.checked_add(TTL).unwrap());
    let competitor = MemLease::new(w.store.clone(), Arc::new(ahead), TTL);
    assert!(
        competitor
            .acquire(&id(), &Owner::new("b").unwrap())
            .unwrap()
            .lease()
            .is_some()
    );
    assert_eq!(
        tick_until_renew(&w, &renews, Duration::from_secs(10)),
        "held"
    );
    assert_eq!(keep.wait_lost(Some(GUARD)), Some(Loss::TakenOver));
    assert!(keep.is_lost());
    assert_eq!(callback.recv_timeout(GUARD).unwrap(), Loss::TakenOver);
    // Releasing a lost lease is a harmless no-op: the successor keeps it.
    keep.release().unwrap();
    assert_eq!(w.store.record(&id()).unwrap().owner, "b");
}

#[test]
fn transient_errors_with_time_to_spare_are_retried_not_a_loss() {
    let w = World::new();
    let (leases, renews) = w.observed();
    leases.failing.store(3, Ordering::SeqCst);
    let lease = acquire(&*leases, "a");
    let keep = keep_alive(&w, &leases, lease, Duration::from_secs(4));
    for _ in 0..3 {
        assert_eq!(
            tick_until_renew(&w, &renews, Duration::from_secs(4)),
            "error"
        );
    }
    assert!(tick_until_renew(&w, &renews, Duration::from_secs(4)).starts_with("granted"));
    assert!(!keep.is_lost());
    keep.release().unwrap();
}

#[test]
fn errors_that_last_until_the_expiry_are_a_loss() {
    let w = World::new();
    let (leases, renews) = w.observed();
    leases.failing.store(usize::MAX, Ordering::SeqCst);
    let lease = acquire(&*leases, "a");
    let keep = keep_alive(&w, &leases, lease, Duration::from_secs(4));
    assert_eq!(
        tick_until_renew(&w, &renews, Duration::from_secs(4)),
        "error"
    );
    assert!(!keep.is_lost(), "an error with time to spare is no loss");
    // A second attempt: the renewer recorded the first error before it scheduled this one.
    assert_eq!(
        tick_until_renew(&w, &renews, Duration::from_secs(4)),
        "error"
    );
    w.clock.advance(TTL);
    match keep.wait_lost(Some(GUARD)) {
        Some(Loss::Expired {
            last_error: Some(e),
        }) => assert!(e.contains("disk full"), "{e}"),
        other => panic!("expected an expiry loss, got {other:?}"),
    }
}

/// A renew stuck in the backend (a stopped peer holding the transition lock) does not delay
/// the loss: at the expiry, polling and waiting report it, and the callback fires once the
/// renewer is free again.
#[test]
fn the_loss_is_reported_at_the_expiry_even_while_a_renew_is_stuck() {
    struct Stuck {
        inner: MemLease,
        entered: Mutex<Sender<()>>,
        unblock: Mutex<Receiver<()>>,
    }
    impl SessionLease for Stuck {
        fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
            self.inner.acquire(id, owner)
        }
        fn renew(&self, lease: &Lease) -> Result<Grant, Error> {
            self.entered.lock().unwrap().send(()).unwrap();
            let _ = self.unblock.lock().unwrap().recv();
            self.inner.renew(lease)
        }
        fn release(&self, lease: &Lease) -> Result<(), Error> {
            self.inner.release(lease)
        }
    }
    let w = World::new();
    let (entered_tx, entered) = mpsc::channel();
    let (unblock, unblock_rx) = mpsc::channel();
    let leases = Arc::new(Stuck {
        inner: MemLease::new(w.store.clone(), Arc::new(w.clock.clone()), TTL),
        entered: Mutex::new(entered_tx),
        unblock: Mutex::new(unblock_rx),
    });
    let lease = acquire(&*leases, "a");
    let (told_tx, told) = mpsc::channel();
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_secs(10))
        .clock(Arc::new(w.clock.clone()))
        .clock_check(Duration::from_millis(1))
        .on_loss(move |loss| told_tx.send(loss.clone()).unwrap())
        .start()
        .unwrap();
    /// Lets the stuck renew return however the test ends (before `keep` is dropped, which
    /// waits for the renewer), so a failed assertion fails the test instead of hanging it.
    struct Unblock(Sender<()>);
    impl Drop for Unblock {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let _unblock = Unblock(unblock);
    w.clock.advance(Duration::from_secs(10));
    entered.recv_timeout(GUARD).unwrap();
    assert!(!keep.is_lost(), "10 s before the expiry");
    let expired = Some(Loss::Expired { last_error: None });
    std::thread::scope(|s| {
        // A task awaiting the loss, parked before the expiry: something must wake it.
        let awaiting = s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(async { tokio::time::timeout(GUARD, keep.lost()).await })
        });
        w.clock.advance(Duration::from_secs(20));
        // Exactly at the expiry, with the renew still stuck: every way of hearing of it.
        assert_eq!(keep.loss(), expired);
        assert_eq!(keep.wait_lost(Some(GUARD)), expired);
        assert_eq!(told.recv_timeout(GUARD).ok(), expired, "the callback");
        assert_eq!(
            awaiting.join().unwrap().ok().flatten(),
            expired,
            "the future"
        );
    });
    drop(_unblock);
    drop(keep);
}

/// Monotonic clocks stop during a suspend: the renewer follows the wall clock, so a renew
/// due by the wall clock happens within the clock-check period, not after the interval
/// measured on a stopped clock.
#[test]
fn renews_follow_the_wall_clock_across_a_suspend() {
    let w = World::new();
    let (leases, renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let _keep = keep_alive(&w, &leases, lease, Duration::from_secs(25));
    // The machine "slept" 25 s: the wall clock jumped, no real time passed.
    w.clock.advance(Duration::from_secs(25));
    let got = renews
        .recv_timeout(Duration::from_secs(5))
        .expect("the renew waited for the monotonic interval");
    assert!(got.starts_with("granted"), "{got}");
}

#[test]
fn a_panicking_renewer_or_callback_is_a_loss_not_a_hang() {
    struct Panics(MemLease);
    impl SessionLease for Panics {
        fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
            self.0.acquire(id, owner)
        }
        fn renew(&self, _: &Lease) -> Result<Grant, Error> {
            panic!("backend bug")
        }
        fn release(&self, lease: &Lease) -> Result<(), Error> {
            self.0.release(lease)
        }
    }
    let w = World::new();
    let leases = Arc::new(Panics(w.other()));
    let lease = acquire(&*leases, "a");
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_secs(10))
        .clock(Arc::new(w.clock.clone()))
        .clock_check(Duration::from_millis(1))
        .on_loss(|_| panic!("callback bug"))
        .start()
        .unwrap();
    w.clock.advance(Duration::from_secs(10));
    match keep.wait_lost(None) {
        Some(Loss::RenewerFailed { reason }) => assert!(reason.contains("backend bug"), "{reason}"),
        other => panic!("expected a renewer failure, got {other:?}"),
    }
    // Releasing still works and frees the lease.
    keep.release().unwrap();
    assert!(w.store.record(&id()).unwrap().owner.is_empty());
}

#[test]
fn unusable_intervals_are_refused_at_build_time() {
    let w = World::new();
    let (leases, _renews) = w.observed();
    let lease = acquire(&*leases, "a");
    for interval in [Duration::ZERO, TTL, TTL * 2, Duration::MAX] {
        let err = KeepAlive::builder(Arc::clone(&leases), lease.clone())
            .interval(interval)
            .clock(Arc::new(w.clock.clone()))
            .start()
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidInterval { .. }),
            "{interval:?}: {err}"
        );
    }
}

#[test]
fn dropping_the_handle_releases_and_shutdown_does_not_wait_for_the_interval() {
    let w = World::new();
    let (leases, _renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let keep = keep_alive(&w, &leases, lease, Duration::from_secs(20));
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        drop(keep);
        tx.send(()).unwrap();
    });
    done.recv_timeout(GUARD)
        .expect("drop waited for the renew interval");
    assert!(w.store.record(&id()).unwrap().owner.is_empty());
}

#[test]
fn a_lease_directory_removed_under_the_holder_is_a_loss_at_the_next_clock_check() {
    // Issue 50: the directory removed (logind at logout) and recreated: a rival there starts
    // at token 1, so the holder must know at once, not at its next renew.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("leases");
    let leases = Arc::new(flocklease::FlockLease::open(&dir).unwrap());
    let lease = acquire(&*leases, "a");
    // The default interval: its first renew is 10 s away.
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .clock_check(Duration::from_millis(1))
        .start()
        .unwrap();
    assert!(!keep.is_lost());
    // The replacement is swapped in with one `renameat2(RENAME_EXCHANGE)`, so the watcher
    // (checking every millisecond) never sees the path missing in between: a remove and a
    // create would let it answer "was removed" first, which is a different message.
    std::fs::create_dir(tmp.path().join("other")).unwrap();
    let parent = std::fs::File::open(tmp.path()).unwrap();
    nix::fcntl::renameat2(
        &parent,
        "other",
        &parent,
        "leases",
        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
    )
    .unwrap();
    match keep.wait_lost(Some(GUARD)) {
        Some(Loss::StoreGone { what }) => assert!(what.contains("was replaced"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_lease_directory_removed_and_not_recreated_is_a_loss_that_says_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("leases");
    let leases = Arc::new(flocklease::FlockLease::open(&dir).unwrap());
    let lease = acquire(&*leases, "a");
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .clock_check(Duration::from_millis(1))
        .start()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    match keep.wait_lost(Some(GUARD)) {
        Some(Loss::StoreGone { what }) => assert!(what.contains("was removed"), "{what}"),
        other => panic!("{other:?}"),
    }
}
