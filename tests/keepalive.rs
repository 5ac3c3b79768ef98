//! The keep-alive handle: renews, loss by takeover, transient errors retried until expiry,
//! explicit and implicit release. The backend is wrapped to report every renew on a channel,
//! so the tests wait for events, not for time.

#![allow(clippy::unwrap_used)]

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

#[test]
fn renews_keep_the_token_and_move_the_expiry() {
    let w = World::new();
    let (leases, renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let keep = KeepAlive::builder(Arc::clone(&leases), lease.clone())
        .interval(Duration::from_millis(1))
        .clock(Arc::new(w.clock.clone()))
        .start();
    w.clock.advance(Duration::from_secs(10));
    // Wait for a renew that saw the advanced clock.
    let expected = format!(
        "granted {}",
        START.checked_add(Duration::from_secs(40)).unwrap()
    );
    while renews.recv_timeout(GUARD).unwrap() != expected {}
    // The renewer stores a result before it starts the next renew: one more and it is visible.
    renews.recv_timeout(GUARD).unwrap();
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
        .interval(Duration::from_millis(1))
        .clock(Arc::new(w.clock.clone()))
        .on_loss(move |loss| tx.send(loss.clone()).unwrap())
        .start();
    // Suspension past the TTL is simulated by the clock; a competitor takes over meanwhile.
    w.clock.advance(TTL);
    let competitor = w.other();
    // The renewer may have renewed at the new time first; take over once it is expired again.
    loop {
        if competitor
            .acquire(&id(), &Owner::new("b").unwrap())
            .unwrap()
            .lease()
            .is_some()
        {
            break;
        }
        w.clock.advance(TTL);
    }
    while renews.recv_timeout(GUARD).unwrap() != "held" {}
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
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_millis(4))
        .clock(Arc::new(w.clock.clone()))
        .start();
    for _ in 0..3 {
        assert_eq!(renews.recv_timeout(GUARD).unwrap(), "error");
    }
    assert!(renews.recv_timeout(GUARD).unwrap().starts_with("granted"));
    assert!(!keep.is_lost());
    keep.release().unwrap();
}

#[test]
fn errors_that_last_until_the_expiry_are_a_loss() {
    let w = World::new();
    let (leases, renews) = w.observed();
    leases.failing.store(usize::MAX, Ordering::SeqCst);
    let lease = acquire(&*leases, "a");
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_millis(4))
        .clock(Arc::new(w.clock.clone()))
        .start();
    assert_eq!(renews.recv_timeout(GUARD).unwrap(), "error");
    assert!(!keep.is_lost(), "an error with time to spare is no loss");
    w.clock.advance(TTL);
    match keep.wait_lost(Some(GUARD)) {
        Some(Loss::Expired { last_error }) => {
            assert!(last_error.contains("disk full"), "{last_error}")
        }
        other => panic!("expected an expiry loss, got {other:?}"),
    }
}

#[test]
fn dropping_the_handle_releases_and_shutdown_does_not_wait_for_the_interval() {
    let w = World::new();
    let (leases, _renews) = w.observed();
    let lease = acquire(&*leases, "a");
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_secs(3600))
        .clock(Arc::new(w.clock.clone()))
        .start();
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        drop(keep);
        tx.send(()).unwrap();
    });
    done.recv_timeout(GUARD)
        .expect("drop waited for the renew interval");
    assert!(w.store.record(&id()).unwrap().owner.is_empty());
}
