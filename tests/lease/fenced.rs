//! Fenced sections on the flock backend: the caller's work runs only while the lease is this
//! instance's, and no takeover (which needs the id's transition lock) can happen until it
//! returns, even when the lease expires meanwhile. A fake clock moves time; no sleeps.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use flocklease::{Error, FlockLease, Grant, ManualClock, Timestamp};
use support::{id, owner};

const TTL: Duration = Duration::from_secs(30);

fn open(dir: &std::path::Path, clock: &ManualClock) -> FlockLease {
    FlockLease::builder(dir)
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .lock_timeout(Duration::from_millis(100))
        .open()
        .unwrap()
}

#[test]
fn no_takeover_can_happen_while_a_fenced_section_runs_even_past_the_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let (a, b) = (open(dir.path(), &clock), open(dir.path(), &clock));
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let inside = a
        .fenced(&lease, || {
            // The holder is "paused" past its TTL inside the section: a rival's takeover
            // must wait for the section (here: its lock timeout runs out).
            clock.advance(TTL + Duration::from_secs(1));
            b.acquire(&id("s"), &owner("b"))
        })
        .unwrap()
        .expect("the section ran: the lease was a's at its start");
    assert!(
        matches!(inside, Err(Error::LockTimeout { .. })),
        "a takeover interleaved with the section: {inside:?}"
    );
    // Once the section is over, the expired lease is taken over at once...
    let taken = b.acquire(&id("s"), &owner("b")).unwrap();
    assert!(
        matches!(taken, Grant::Granted(ref l) if l.token == 2),
        "{taken:?}"
    );
    // ... and the old holder's next section does not run.
    let mut ran = false;
    assert_eq!(a.fenced(&lease, || ran = true).unwrap(), None);
    assert!(!ran, "a superseded lease's section ran");
}

#[test]
fn a_fenced_section_runs_only_for_the_holder_here_and_unexpired() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let (a, b) = (open(dir.path(), &clock), open(dir.path(), &clock));
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    assert_eq!(a.fenced(&lease, || 7).unwrap(), Some(7));
    // Another instance does not hold the generation: its section does not run, even for
    // the same owner and token.
    assert_eq!(b.fenced(&lease, || 7).unwrap(), None);
    // Expired (nobody took over yet): no section either; a renew brings it back.
    clock.advance(TTL);
    assert_eq!(a.fenced(&lease, || 7).unwrap(), None);
    let lease = a.renew(&lease).unwrap().lease().unwrap();
    assert_eq!(a.fenced(&lease, || 7).unwrap(), Some(7));
    // Released: none.
    a.release(&lease).unwrap();
    assert_eq!(a.fenced(&lease, || 7).unwrap(), None);
}

#[test]
fn a_panicking_section_gives_the_lock_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let a = open(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = a.fenced(&lease, || panic!("the caller's work failed"));
    }));
    assert!(panicked.is_err());
    // The lock is free again: a renew goes through within its lock timeout.
    assert!(matches!(a.renew(&lease).unwrap(), Grant::Granted(_)));
}

/// Issue 33.5: a fenced section does not hold the instance's state of the id across the
/// caller's closure. Inside it, `liveness_fd` answers (it deadlocked); from another thread, a
/// bounded wait on the same instance returns while the section still runs (it waited for the
/// whole section). Each check runs on its own thread with a bound, so a regression fails
/// instead of hanging.
#[test]
fn a_fenced_section_holds_no_in_process_lock_over_the_callers_work() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let a = Arc::new(open(dir.path(), &clock));
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();

    let (done, inside) = mpsc::channel();
    {
        let (a, lease) = (Arc::clone(&a), lease.clone());
        std::thread::spawn(move || {
            let fd = a.fenced(&lease, || a.liveness_fd(&lease)).unwrap();
            let _ = done.send(fd.map(|r| r.map(|fd| fd.is_some())));
        });
    }
    let answer = inside
        .recv_timeout(Duration::from_secs(10))
        .expect("liveness_fd inside a fenced section never answered");
    assert!(matches!(answer, Some(Ok(true))), "{answer:?}");

    let (waiter_done, waited) = mpsc::channel();
    let seen_in_section = a
        .fenced(&lease, || {
            let b = Arc::clone(&a);
            std::thread::spawn(move || {
                let got = b.acquire_wait(&id("s"), &owner("b"), Duration::from_millis(50));
                let _ = waiter_done.send(got.map(|g| g.is_held()));
            });
            // The section goes on until the waiter has its answer (or 10 s).
            waited.recv_timeout(Duration::from_secs(10)).ok()
        })
        .unwrap()
        .expect("the section ran");
    // Held, or the id's in-process turn timed out (the lock timeout, 100 ms): either way an
    // answer within the call's bound, while the section ran.
    match seen_in_section {
        Some(Ok(true)) | Some(Err(Error::LockTimeout { .. })) => {}
        other => panic!("the waiter did not answer while the section ran: {other:?}"),
    }
}

/// A holder's own `acquire_wait` while another thread's section of the same instance has the
/// instance's state, and another process waits in the id's line: the look reads that the
/// instance holds the id, so the call tries at once (waiting for the id's turn, which the
/// section has) and its attempt is a refresh of its own lease — never a place in the line
/// behind its own generation, which would answer Held at its deadline. (A first version of the look that
/// never waits left the turn to the line when the state was busy; the look reads a flag the
/// state keeps now.) The section is paused at its lock attempt, holding the state; the
/// holder's wait must not join the line.
#[test]
fn a_holders_own_wait_beside_its_section_is_a_refresh() {
    use flocklease::fault::{FaultHook, FaultPoint};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, mpsc};
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    // The holder's instance: its section pauses at its lock attempt (state held) until let go;
    // a place it takes in the line is reported.
    let armed = Arc::new(AtomicBool::new(false));
    let (paused_tx, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (joined_tx, joined) = mpsc::channel();
    let pause = Mutex::new(Some((paused_tx, go)));
    let joined_tx = Mutex::new(joined_tx);
    let hook: FaultHook = {
        let armed = Arc::clone(&armed);
        Arc::new(move |point, _| {
            if point == FaultPoint::LockStable
                && armed.load(Ordering::SeqCst)
                && let Some((paused, go)) = pause.lock().unwrap().take()
            {
                paused.send(()).unwrap();
                let _ = go.recv();
            }
            if point == FaultPoint::OpenQueue {
                let _ = joined_tx.lock().unwrap().send(());
            }
            None
        })
    };
    let a = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .lock_timeout(Duration::from_secs(10))
        .faults(hook)
        .open()
        .unwrap();
    // The other process's waiter tells when it waits in the line (its place taken).
    let (waiting_tx, waiting) = mpsc::channel();
    let waiting_tx = Mutex::new(Some(waiting_tx));
    let c_hook: FaultHook = Arc::new(move |point, _| {
        if point == FaultPoint::OpenWait
            && let Some(tx) = waiting_tx.lock().unwrap().take()
        {
            let _ = tx.send(());
        }
        None
    });
    let c = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .faults(c_hook)
        .open()
        .unwrap();
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    armed.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| c.acquire_wait(&id("s"), &owner("c"), Duration::from_secs(10)));
        waiting.recv().unwrap();
        let section = s.spawn(|| a.fenced(&lease, || ()));
        paused.recv().unwrap();
        let refresh = s.spawn(|| a.acquire_wait(&id("s"), &owner("a"), Duration::from_secs(1)));
        // Fixed: the refresh waits for the section's turn and never looks at the line. The
        // mistake takes a place (reported here) as soon as its thread runs, then waits out its
        // timeout: the window is twice that timeout, so a slow start cannot hide it.
        let lined_up = joined.recv_timeout(Duration::from_secs(2)).is_ok();
        go_tx.send(()).unwrap();
        let got = refresh.join().unwrap();
        assert!(
            section.join().unwrap().unwrap().is_some(),
            "the section ran"
        );
        assert!(
            !lined_up,
            "the holder's own wait took a place in the line: {got:?}"
        );
        let refreshed = match got {
            Ok(Grant::Granted(l)) => l,
            other => panic!("the holder's own wait was not a refresh: {other:?}"),
        };
        assert_eq!(refreshed.token, lease.token, "a refresh keeps the token");
        // The waiter in the line gets the lease once the holder lets go.
        a.release(&refreshed).unwrap();
        let next = waiter
            .join()
            .unwrap()
            .unwrap()
            .lease()
            .expect("granted after the release");
        assert!(next.token > lease.token);
    });
}

/// A waiting acquire's look at what its instance holds never waits for another thread's call
/// that has the instance's state while it waits for the transition lock: the wait keeps its
/// bound of `timeout` plus one lock timeout. (Its look used to take the state: it waited for
/// a section's wait for the lock, then its own attempt waited again — two lock timeouts past
/// `timeout`, which the model's threads found.) Here another process's section holds the lock;
/// this instance's section waits for it holding the state; a wait of another thread starts
/// then and must answer within its bound.
#[test]
fn a_wait_beside_a_section_waiting_for_the_lock_keeps_its_bound() {
    use flocklease::fault::{FaultHook, FaultPoint};
    use std::sync::mpsc;
    use std::time::Instant;
    const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
    const WAIT: Duration = Duration::from_millis(50);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let rival = open(dir.path(), &clock);
    let lease = rival
        .acquire(&id("s"), &owner("r"))
        .unwrap()
        .lease()
        .unwrap();
    // This instance tells when its section tries the lock (the state held by then).
    let (trying, tried) = mpsc::channel();
    let trying = std::sync::Mutex::new(Some(trying));
    let hook: FaultHook = Arc::new(move |point, _| {
        if point == FaultPoint::LockStable
            && let Some(tx) = trying.lock().unwrap().take()
        {
            let _ = tx.send(());
        }
        None
    });
    let a = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .lock_timeout(LOCK_TIMEOUT)
        .faults(hook)
        .open()
        .unwrap();
    let (rival_in, rival_holds) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let lease_r = &lease;
        let rival = &rival;
        s.spawn(move || {
            rival
                .fenced(lease_r, || {
                    rival_in.send(()).unwrap();
                    let _ = released.recv_timeout(Duration::from_secs(30));
                })
                .unwrap();
        });
        rival_holds.recv().unwrap();
        let section = s.spawn(|| a.fenced(&lease, || ()));
        tried.recv().unwrap();
        let started = Instant::now();
        let got = a.acquire_wait(&id("s"), &owner("b"), WAIT);
        let took = started.elapsed();
        release.send(()).unwrap();
        // Held, or the attempt's lock timeout: either way by the bound (with room for a slow
        // machine: the old look took two lock timeouts).
        assert!(
            matches!(got, Ok(Grant::Held) | Err(Error::LockTimeout { .. })),
            "{got:?}"
        );
        assert!(
            took < WAIT + LOCK_TIMEOUT + LOCK_TIMEOUT / 2,
            "the wait took {took:?}, past its bound of {:?}",
            WAIT + LOCK_TIMEOUT
        );
        let _ = section.join().unwrap();
    });
}
