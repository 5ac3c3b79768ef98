//! The surface a service adopts: the guard (one holder at a time, even across threads of one
//! instance), conversions, and the async surface driven by a real runtime.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use flocklease::conformance::START;
use flocklease::{
    Grant, KeepAlive, Lease, Loss, ManualClock, MemLease, MemStore, Owner, SessionId, Timestamp,
};
use support::{id, open_real, owner};

/// Eight threads share one instance and compete with guards: never two inside at once (with
/// one shared owner string they would all be inside together: the re-entrancy trap).
#[test]
fn guards_give_one_holder_at_a_time_across_threads_of_one_instance() {
    let dir = tempfile::tempdir().unwrap();
    let leases = Arc::new(open_real(dir.path(), Duration::from_secs(60)));
    let inside = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (leases, inside, entered, start) = (
                Arc::clone(&leases),
                Arc::clone(&inside),
                Arc::clone(&entered),
                Arc::clone(&start),
            );
            std::thread::spawn(move || {
                start.wait();
                let mut mine = 0;
                while mine < 20 {
                    let Some(guard) = leases.acquire_guard(&id("job")).unwrap() else {
                        std::thread::yield_now();
                        continue;
                    };
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    entered.fetch_add(1, Ordering::SeqCst);
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                    mine += 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(entered.load(Ordering::SeqCst), 160);
    // Each entry was a new generation: 160 grants, tokens 1..=160.
    let last = leases
        .acquire_guard(&id("job"))
        .unwrap()
        .unwrap()
        .into_lease();
    assert_eq!(last.token, 161);
}

/// The trap itself, pinned: one instance, one owner string, two "holders" at once.
#[test]
fn the_same_owner_on_one_instance_is_re_entrant() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open_real(dir.path(), Duration::from_secs(60));
    let shared = Owner::this_process();
    let a = leases.acquire(&id("s"), &shared).unwrap().lease().unwrap();
    let b = leases.acquire(&id("s"), &shared).unwrap().lease().unwrap();
    assert_eq!(a.token, b.token, "a refresh, not a second generation");
    assert!(
        leases
            .acquire(&id("s"), &Owner::unique())
            .unwrap()
            .is_held()
    );
}

#[test]
fn a_guard_releases_on_drop_and_on_panic() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open_real(dir.path(), Duration::from_secs(60));
    let other = open_real(dir.path(), Duration::from_secs(60));
    {
        let guard = leases.acquire_guard(&id("s")).unwrap().unwrap();
        assert_eq!(guard.token, 1);
        assert!(other.acquire(&id("s"), &owner("o")).unwrap().is_held());
    }
    let got = other
        .acquire(&id("s"), &owner("o"))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(got.token, 2);
    other.release(&got).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _guard = leases.acquire_guard(&id("s")).unwrap().unwrap();
        panic!("the work failed");
    }));
    assert!(panicked.is_err());
    assert_eq!(
        other
            .acquire(&id("s"), &owner("o"))
            .unwrap()
            .lease()
            .unwrap()
            .token,
        4
    );
    // Renew keeps the token; a lost lease renews false and its drop is harmless.
    let mut mine = leases.acquire_guard(&id("r")).unwrap().unwrap();
    assert!(mine.renew().unwrap());
    assert_eq!(mine.token, 1);
}

#[test]
fn leases_ids_owners_and_timestamps_convert_as_people_expect() {
    let lease = Lease {
        session_id: "orders/eu".parse().unwrap(),
        owner: Owner::try_from("w1").unwrap(),
        token: 42,
        expiry: Timestamp::parse_rfc3339("2030-05-01T12:00:00.25+02:00").unwrap(),
    };
    let json = serde_json::to_string(&lease).unwrap();
    assert_eq!(
        json,
        r#"{"session_id":"orders/eu","owner":"w1","token":42,"expiry":"2030-05-01T10:00:00.25Z"}"#
    );
    assert_eq!(serde_json::from_str::<Lease>(&json).unwrap(), lease);
    // Deserializing validates: an empty owner would read as a tombstone.
    let bad = json.replace("\"w1\"", "\"\"");
    assert!(serde_json::from_str::<Lease>(&bad).is_err());
    assert_eq!(
        lease.to_string(),
        "orders/eu held by w1 with token 42 until 2030-05-01T10:00:00.25Z"
    );
    assert_eq!(
        format!("{:?}", lease.expiry),
        "Timestamp(2030-05-01T10:00:00.25Z)"
    );
    let st: SystemTime = lease.expiry.into();
    assert_eq!(Timestamp::try_from(st).unwrap(), lease.expiry);
    let before_epoch = Timestamp::parse_rfc3339("1969-12-31T23:59:59.5Z").unwrap();
    assert_eq!(
        Timestamp::try_from(SystemTime::from(before_epoch)).unwrap(),
        before_epoch
    );
    let now = Timestamp::now();
    assert!(now > Timestamp::parse_rfc3339("2020-01-01T00:00:00Z").unwrap());
    assert!("".parse::<SessionId>().is_err());
    assert!(SessionId::try_from(String::from("x")).is_ok());
    assert!(Owner::try_from(String::new()).is_err());
    let me = Owner::this_process();
    assert!(me.as_str().ends_with(&format!(":{}", std::process::id())));
    assert_ne!(Owner::unique(), Owner::unique());
    assert!(Owner::unique().as_str().starts_with(me.as_str()));
}

/// A waiting acquire awaited on a single-threaded runtime: if it blocked the executor thread,
/// the task that releases the holder could never run and the wait would end held.
#[test]
fn acquire_wait_async_does_not_block_the_executor() {
    let dir = tempfile::tempdir().unwrap();
    let holder = open_real(dir.path(), Duration::from_secs(60));
    let lease = holder
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let waiter = Arc::new(open_real(dir.path(), Duration::from_secs(60)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let got = rt.block_on(async {
        let wait = waiter.acquire_wait_async(&id("s"), &owner("b"), Duration::from_secs(30));
        let release = async {
            tokio::task::yield_now().await;
            holder.release(&lease).unwrap();
        };
        let (got, ()) = tokio::join!(wait, release);
        got
    });
    assert_eq!(got.unwrap().lease().unwrap().token, lease.token + 1);
}

/// An abandoned wait gives back whatever it is granted (an attempt under way when the future
/// is dropped finishes first; `tests/waits.rs` shows the wait itself stops at once).
#[test]
fn a_dropped_async_wait_releases_what_it_gets() {
    let dir = tempfile::tempdir().unwrap();
    let holder = open_real(dir.path(), Duration::from_secs(60));
    let lease = holder
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let waiter = Arc::new(open_real(dir.path(), Duration::from_secs(60)));
    let wait = waiter.acquire_wait_async(&id("s"), &owner("b"), Duration::from_secs(30));
    drop(wait);
    holder.release(&lease).unwrap();
    // Whether or not the waiting thread's last attempt got token 2 (and gave it back), a third
    // party gets the lease, and the abandoned waiter does not keep it.
    let third = open_real(dir.path(), Duration::from_secs(60));
    let got = third
        .acquire_wait(&id("s"), &owner("c"), Duration::from_secs(30))
        .unwrap();
    let token = got.lease().unwrap().token;
    assert!(token >= 2, "{token}");
    assert!(matches!(
        waiter.acquire(&id("s"), &owner("b")).unwrap(),
        Grant::Held
    ));
}

/// `KeepAlive::lost` resolves on a runtime when the expiry passes without a renew.
#[test]
fn keep_alive_loss_is_a_future() {
    let clock = ManualClock::new(START);
    let leases = Arc::new(MemLease::new(
        MemStore::new(),
        Arc::new(clock.clone()),
        Duration::from_secs(30),
    ));
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let keep = KeepAlive::builder(Arc::clone(&leases), lease)
        .interval(Duration::from_secs(20))
        .clock(Arc::new(clock.clone()))
        .clock_check(Duration::from_millis(1))
        .start()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let loss = rt.block_on(async {
        let advance = async {
            tokio::task::yield_now().await;
            // Past the expiry in one jump: no renew was due before it.
            clock.advance(Duration::from_secs(30));
        };
        let (loss, ()) = tokio::join!(keep.lost(), advance);
        loss
    });
    assert_eq!(loss, Some(Loss::Expired { last_error: None }));
}
