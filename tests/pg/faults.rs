//! Fault injection through `PgLease`'s network seam: in every scenario, every statement
//! (`PgStep`) fails in each way — the server answers an error, the connection is ended by the
//! server just before it (`pg_terminate_backend`), or the server runs it and the reply is lost
//! (an unknown outcome, the commit included) — at its first occurrence in the call, then its
//! second, and so on while the call reaches that many. Each time: an error leaves the row as
//! it was, a success matches the row, no advisory lock other than the row's own generation is
//! held, no row lock is left behind, and the next call recovers with monotone tokens.

use crate::pg;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::pg::{PgFault, PgFaultHook, PgLease, PgStep};
use flocklease::{Grant, Lease, ManualClock, Owner, SessionId, SessionLease};

/// How a step fails.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Fail,
    LoseReply,
    Disconnect,
}

struct Harness {
    url: String,
    admin: Arc<pg::Admin>,
    clock: ManualClock,
    armed: Arc<Mutex<Option<(PgStep, Kind, usize)>>>,
    fired: Arc<AtomicBool>,
}

impl Harness {
    fn new() -> Option<Harness> {
        let server = pg::server()?;
        let db = server.fresh_db();
        let url = server.url(&db);
        drop(PgLease::connect(&url).unwrap());
        Some(Harness {
            admin: Arc::new(server.admin(&db)),
            url,
            clock: ManualClock::new(START),
            armed: Arc::default(),
            fired: Arc::default(),
        })
    }

    fn instance(&self) -> PgLease {
        let (armed, fired, admin) = (
            Arc::clone(&self.armed),
            Arc::clone(&self.fired),
            Arc::clone(&self.admin),
        );
        let hook: PgFaultHook = Arc::new(move |step, pid| {
            let mut armed = armed.lock().unwrap();
            match armed.as_mut() {
                Some((s, kind, 0)) if *s == step => {
                    let kind = *kind;
                    *armed = None;
                    fired.store(true, Ordering::SeqCst);
                    match kind {
                        Kind::Fail => Some(PgFault::Fail),
                        Kind::LoseReply => Some(PgFault::LoseReply),
                        Kind::Disconnect => {
                            admin.terminate(pid);
                            None
                        }
                    }
                }
                Some((s, _, skip)) if *s == step => {
                    *skip -= 1;
                    None
                }
                _ => None,
            }
        });
        PgLease::builder(&self.url)
            .clock(Arc::new(self.clock.clone()))
            .ttl(Duration::from_secs(30))
            .lock_timeout(Duration::from_secs(2))
            .faults(hook)
            .connect()
            .unwrap()
    }

    fn with_fault<T>(&self, arm: (PgStep, Kind, usize), op: impl FnOnce() -> T) -> (T, bool) {
        self.fired.store(false, Ordering::SeqCst);
        *self.armed.lock().unwrap() = Some(arm);
        let out = op();
        *self.armed.lock().unwrap() = None;
        (out, self.fired.load(Ordering::SeqCst))
    }

    /// The advisory locks granted on `id`'s key, as `(token, count)`.
    fn locks(&self, id: &str) -> Vec<(i64, i64)> {
        self.admin
            .query(
                "SELECT objid::int8, count(*) FROM pg_locks l JOIN flocklease_leases r \
                 ON l.classid::int8 = r.key WHERE r.id = $1 AND l.locktype = 'advisory' \
                 AND l.granted AND l.database = (SELECT oid FROM pg_database \
                 WHERE datname = current_database()) GROUP BY 1",
                &[&id],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    /// No lock but the row's own generation's, held once at most.
    fn assert_no_leak(&self, id: &str, what: &str) {
        let row = self.admin.row(id);
        for (token, count) in self.locks(id) {
            let current = row
                .as_ref()
                .is_some_and(|(o, t, _)| !o.is_empty() && *t == token);
            assert!(
                current && count == 1,
                "{what}: leaked advisory lock on generation {token} (x{count}); row {row:?}"
            );
        }
    }
}

/// The row as a record: the placeholder (empty owner, token 0) reads as no record.
fn record(h: &Harness, id: &str) -> Option<(String, i64, i64)> {
    h.admin
        .row(id)
        .filter(|(o, t, _)| !(o.is_empty() && *t == 0))
}

fn sid(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}

fn who(s: &str) -> Owner {
    Owner::new(s).unwrap()
}

/// What a scenario's faulted call does, after its setup.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// Acquire of a new id.
    AcquireFresh,
    /// Acquire over a crashed holder (probe, takeover).
    AcquireCrashed,
    /// Acquire over this instance's own expired generation (takeover, old one unlocked).
    AcquireOwnExpired,
    /// Renew of a held lease.
    Renew,
    /// Renew after the liveness connection was ended by the server (re-lock).
    RenewRelock,
    /// Release of a held lease.
    Release,
}

const SCENARIOS: [Scenario; 6] = [
    Scenario::AcquireFresh,
    Scenario::AcquireCrashed,
    Scenario::AcquireOwnExpired,
    Scenario::Renew,
    Scenario::RenewRelock,
    Scenario::Release,
];

#[test]
fn every_statement_failing_in_every_way_loses_nothing_and_leaks_nothing() {
    let Some(h) = Harness::new() else { return };
    let mut runs = 0;
    let mut n = 0;
    for scenario in SCENARIOS {
        for step in PgStep::ALL {
            for kind in [Kind::Fail, Kind::LoseReply, Kind::Disconnect] {
                for nth in 0.. {
                    n += 1;
                    let id = format!("s{n}");
                    let fired = run_one(&h, scenario, &id, (step, kind, nth));
                    if !fired {
                        break;
                    }
                    runs += 1;
                }
            }
        }
    }
    eprintln!("{runs} faulted calls checked");
    assert!(
        runs >= 60,
        "only {runs} faults fired: the seam is not reached"
    );
}

/// Sets `scenario` up on `id`, runs its call with the fault armed, checks; returns whether
/// the fault fired.
fn run_one(h: &Harness, scenario: Scenario, id: &str, arm: (PgStep, Kind, usize)) -> bool {
    let what = format!("{scenario:?} {arm:?}");
    let a = h.instance();
    let i = sid(id);
    // Setup, without faults.
    let held: Option<Lease> = match scenario {
        Scenario::AcquireFresh => None,
        Scenario::AcquireCrashed => {
            let b = h.instance();
            assert!(b.acquire(&i, &who("b")).unwrap().lease().is_some());
            drop(b);
            None
        }
        Scenario::AcquireOwnExpired => {
            let l = a.acquire(&i, &who("a")).unwrap().lease().unwrap();
            h.clock.advance(Duration::from_secs(31));
            Some(l)
        }
        Scenario::Renew | Scenario::Release => a.acquire(&i, &who("a")).unwrap().lease(),
        Scenario::RenewRelock => {
            let l = a.acquire(&i, &who("a")).unwrap().lease().unwrap();
            let key = h.admin.key(id);
            let holders = h.admin.advisory_holders(key, l.token as u32);
            h.admin.terminate(holders[0]);
            Some(l)
        }
    };
    let before = record(h, id);
    let before_token = before.as_ref().map_or(0, |r| r.1);
    let call = |a: &PgLease| -> Result<Option<Grant>, flocklease::Error> {
        match scenario {
            Scenario::AcquireFresh | Scenario::AcquireCrashed | Scenario::AcquireOwnExpired => {
                a.acquire(&i, &who("a")).map(Some)
            }
            Scenario::Renew | Scenario::RenewRelock => a.renew(held.as_ref().unwrap()).map(Some),
            Scenario::Release => a.release(held.as_ref().unwrap()).map(|()| None),
        }
    };
    let (result, fired) = h.with_fault(arm, || call(&a));
    if !fired {
        return false;
    }
    let after = record(h, id);
    match &result {
        Err(_) => assert_eq!(after, before, "{what}: an error after the row changed"),
        Ok(Some(Grant::Granted(l))) => {
            let (owner, token, _) = after.clone().unwrap();
            assert_eq!(
                (owner.as_str(), token as u64),
                ("a", l.token),
                "{what}: grant vs row"
            );
        }
        Ok(Some(Grant::Held)) => panic!("{what}: a fault reported as held"),
        Ok(None) => {
            let (owner, _, _) = after.clone().unwrap();
            assert_eq!(owner, "", "{what}: released but no tombstone");
        }
    }
    h.assert_no_leak(id, &what);
    // The next call recovers (a leaked row lock would time out here).
    let again = call(&a).unwrap_or_else(|e| panic!("{what}: no recovery: {e}"));
    match again {
        Some(Grant::Granted(l)) => {
            assert!(l.token as i64 >= before_token, "{what}: token went back");
            let (owner, token, _) = h.admin.row(id).unwrap();
            assert_eq!(
                (owner.as_str(), token as u64),
                ("a", l.token),
                "{what}: recovered grant vs row"
            );
            // And it is really held: a rival is refused.
            let rival = h.instance();
            assert!(
                rival.acquire(&i, &who("r")).unwrap().is_held(),
                "{what}: not live"
            );
        }
        Some(Grant::Held) => panic!("{what}: recovery answered held"),
        None => assert_eq!(h.admin.row(id).unwrap().0, "", "{what}: not released"),
    }
    h.assert_no_leak(id, &format!("{what}, after recovery"));
    drop(a);
    h.clock.set(START);
    true
}

#[test]
fn a_commit_whose_reply_is_lost_is_resolved_by_rereading_the_row() {
    let Some(h) = Harness::new() else { return };
    let a = h.instance();
    // The server committed; the reply was lost: the caller is told the truth, a grant.
    let (got, fired) = h.with_fault((PgStep::Commit, Kind::LoseReply, 0), || {
        a.acquire(&sid("lost"), &who("a"))
    });
    assert!(fired);
    let lease = got.unwrap().lease().expect("committed, so granted");
    assert_eq!(record(&h, "lost").map(|r| r.1), Some(lease.token as i64));
    assert!(
        h.instance()
            .acquire(&sid("lost"), &who("r"))
            .unwrap()
            .is_held()
    );
    // The session ended before COMMIT reached the server: nothing committed, an error.
    let (got, fired) = h.with_fault((PgStep::Commit, Kind::Disconnect, 0), || {
        a.acquire(&sid("cut"), &who("a"))
    });
    assert!(fired);
    assert!(got.is_err());
    assert_eq!(record(&h, "cut"), None);
    assert!(
        h.locks("cut").is_empty(),
        "the new generation's lock was dropped"
    );
}

/// The server stops answering just as a first acquire's `COMMIT` goes out (the hook SIGSTOPs
/// that session's backend): the call fails with `Error::CommitUnknown` after the reply bound —
/// never a hang, never `LockTimeout` from re-reading a row the stopped session still locks —
/// and once the backend runs again the next acquire settles it with a new generation.
#[test]
fn a_commit_the_server_never_answers_is_unknown_and_the_next_call_settles_it() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let stopped: Arc<Mutex<Option<i32>>> = Arc::default();
    let seen = Arc::clone(&stopped);
    let hook: PgFaultHook = Arc::new(move |step, pid| {
        let mut seen = seen.lock().unwrap();
        if step == PgStep::Commit && seen.is_none() {
            kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
            *seen = Some(pid);
        }
        None
    });
    let leases = PgLease::builder(&url)
        .ttl(Duration::from_secs(3))
        .lock_timeout(Duration::from_millis(200))
        .faults(hook)
        .connect()
        .unwrap();
    let (id, me) = (SessionId::new("job").unwrap(), Owner::new("me").unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let got = std::thread::scope(|s| {
        s.spawn(|| tx.send(leases.acquire(&id, &me)).unwrap());
        let got = rx.recv_timeout(Duration::from_secs(60));
        if let Some(pid) = *stopped.lock().unwrap() {
            kill(Pid::from_raw(pid), Signal::SIGCONT).unwrap();
        }
        got
    });
    let err = got
        .expect("the acquire still waits for the stopped session")
        .unwrap_err();
    assert!(
        matches!(err, flocklease::Error::CommitUnknown { .. }),
        "{err:?}"
    );
    // Once running again, the stopped session ends (it was told to) and its row lock goes.
    admin.until_ended(stopped.lock().unwrap().unwrap());
    // Its COMMIT may or may not have landed: token 1 (never committed) or 2 (committed, its
    // generation dead: replaced at once).
    let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
    assert!(matches!(lease.token, 1 | 2), "{}", lease.token);
    assert!(
        PgLease::connect(&url)
            .unwrap()
            .acquire(&id, &Owner::new("rival").unwrap())
            .unwrap()
            .is_held()
    );
}

/// A takeover whose new generation's lock is held by another session (one of an earlier,
/// failed takeover that is still ending; here, taken by hand) commits nothing: the lock is
/// tried by the commit statement itself, which changes the row only if it was granted. So the
/// row never names a generation whose lock is someone else's, and nothing leaks.
#[test]
fn a_takeover_whose_generation_lock_is_taken_commits_nothing() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let id = sid("planted");
    // A holder that crashed (its instance dropped: its liveness lock is gone, its row stays).
    let gone = PgLease::connect(&url).unwrap();
    assert_eq!(
        gone.acquire(&id, &who("a")).unwrap().lease().unwrap().token,
        1
    );
    drop(gone);
    let key = admin.key("planted");
    admin.query("SELECT pg_advisory_lock($1::int4, 2)", &[&key]);
    let me = admin.query("SELECT pg_backend_pid()", &[])[0].get::<_, i32>(0);
    let leases = PgLease::connect(&url).unwrap();
    let err = leases.acquire(&id, &who("b")).unwrap_err();
    assert!(
        matches!(err, flocklease::Error::AdvisoryLockBusy { token: 2, .. }),
        "{err:?}"
    );
    let (owner, token, _) = admin.row("planted").unwrap();
    assert_eq!((owner.as_str(), token), ("a", 1), "the row changed");
    assert_eq!(admin.advisory_holders(key, 2), vec![me], "a lock leaked");
    assert!(admin.advisory_holders(key, 1).is_empty());
    // Once it is free, the takeover goes through, and the lease is really held.
    admin.query("SELECT pg_advisory_unlock($1::int4, 2)", &[&key]);
    let lease = leases.acquire(&id, &who("b")).unwrap().lease().unwrap();
    assert_eq!(lease.token, 2);
    assert!(
        PgLease::connect(&url)
            .unwrap()
            .acquire(&id, &who("r"))
            .unwrap()
            .is_held()
    );
}

/// A commit whose reply is lost but which did commit: the new generation's lock went with the
/// session that sent it, and is taken again on a fresh connection only under the row lock,
/// if the row still names the generation. Here a rival takes over in between (the hook runs it
/// just before that re-lock, when the generation looks dead): the call still reports what it
/// committed, a grant, but holds no lock of the superseded generation, and the loss of its
/// liveness is reported at once.
#[test]
fn a_lost_commit_reply_restores_the_generation_lock_only_if_nobody_took_over() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let rival: Arc<Mutex<Option<(PgLease, Grant)>>> = Arc::default();
    let (lost, relocking) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let hook: PgFaultHook = {
        let (rival, url) = (Arc::clone(&rival), url.clone());
        Arc::new(move |step, _pid| match step {
            PgStep::Commit if !lost.swap(true, Ordering::SeqCst) => Some(PgFault::LoseReply),
            PgStep::RelockLive if !relocking.swap(true, Ordering::SeqCst) => {
                let leases = PgLease::connect(&url).unwrap();
                let got = leases.acquire(&sid("raced"), &who("r")).unwrap();
                *rival.lock().unwrap() = Some((leases, got));
                None
            }
            _ => None,
        })
    };
    let a = PgLease::builder(&url).faults(hook).connect().unwrap();
    let lease = a
        .acquire(&sid("raced"), &who("a"))
        .unwrap()
        .lease()
        .expect("committed, so granted");
    assert_eq!(lease.token, 1);
    let (_keep, got) = rival.lock().unwrap().take().expect("the rival ran");
    assert_eq!(got.lease().map(|l| l.token), Some(2), "the rival took over");
    assert_eq!(
        admin.row("raced").map(|r| (r.0, r.1)),
        Some(("r".into(), 2))
    );
    let key = admin.key("raced");
    assert!(
        admin.advisory_holders(key, 1).is_empty(),
        "the superseded generation was locked again"
    );
    // Told at once, and free to call into the lease manager from the callback (here: a renew
    // of the lost lease). Subscribed on a thread of its own: a callback run under the id's
    // in-process lock would hang it there.
    let a = Arc::new(a);
    let (tx, rx) = std::sync::mpsc::channel();
    let (a2, lost_lease) = (Arc::clone(&a), lease.clone());
    std::thread::spawn(move || {
        let (a3, l3) = (Arc::clone(&a2), lost_lease.clone());
        a2.on_liveness_lost(
            &lost_lease,
            Box::new(move || tx.send(a3.renew(&l3).map(|g| g.is_held())).unwrap()),
        );
    });
    let renewed = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the loss is reported at once, and the callback can call in");
    assert!(renewed.unwrap(), "the renew sees it lost");
}

/// A client that stops in the middle of an acquire's transaction (its fault hook blocks before
/// the commit) is ended by the server after the database's `idle_in_transaction_session_timeout`,
/// as any transaction is: the row lock does not outlive it, and a rival's acquire goes through.
#[test]
fn a_client_stopped_mid_acquire_is_ended_by_the_database_s_idle_transaction_timeout() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    admin.execute(
        &format!("ALTER DATABASE \"{db}\" SET idle_in_transaction_session_timeout = '1s'"),
        &[],
    );
    let (paused_tx, paused_rx) = std::sync::mpsc::channel();
    let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
    let resume_rx = Mutex::new(resume_rx);
    let seen = AtomicBool::new(false);
    let hook: PgFaultHook = Arc::new(move |step, _pid| {
        if step == PgStep::Commit && !seen.swap(true, Ordering::SeqCst) {
            paused_tx.send(()).unwrap();
            let _ = resume_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(30));
        }
        None
    });
    let a = PgLease::builder(&url).faults(hook).connect().unwrap();
    let b = PgLease::builder(&url)
        .lock_timeout(Duration::from_secs(5))
        .connect()
        .unwrap();
    std::thread::scope(|s| {
        let stopped = s.spawn(|| a.acquire(&sid("paused"), &who("a")));
        paused_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the acquire reached its commit");
        // With the row lock kept by the stopped client, this ends in LockTimeout.
        let got = b.acquire(&sid("paused"), &who("b")).unwrap();
        assert_eq!(got.lease().map(|l| l.token), Some(1));
        resume_tx.send(()).unwrap();
        assert!(stopped.join().unwrap().is_err(), "its session was ended");
    });
    assert_eq!(
        admin.row("paused").map(|r| (r.0, r.1)),
        Some(("b".into(), 1))
    );
}

/// Two threads of one instance: B waits for the holder, and its next attempt's row lock comes
/// right behind the wait's end; meanwhile A, which holds the id's in-process lock, asks for
/// the row after B. B must give the row up (it tries the in-process lock only briefly, then
/// rolls back and starts over in order), or A's acquire ends in `LockTimeout`. The fault
/// hook orders the steps: at B's second attempt it lets the holder go, locks the row from an
/// admin session (so that B queues for it) and starts A, whose own first round trip waits until
/// B is queued; the admin session lets go once A is queued behind B.
#[test]
fn a_waiting_acquire_holding_the_row_gives_it_up_to_a_call_holding_the_in_process_lock() {
    use std::sync::OnceLock;
    use std::sync::atomic::AtomicUsize;
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = Arc::new(server.admin(&db));
    let locker = Arc::new(server.admin(&db));
    let holder = PgLease::connect(&url).unwrap();
    let held = holder
        .acquire(&sid("x"), &who("h"))
        .unwrap()
        .lease()
        .unwrap();
    let holder = Arc::new(Mutex::new(Some((holder, held))));
    let me: Arc<OnceLock<std::sync::Weak<PgLease>>> = Arc::default();
    type Started = Option<std::thread::JoinHandle<Result<Grant, flocklease::Error>>>;
    let a_thread: Arc<Mutex<Started>> = Arc::default();
    let pids: Arc<Mutex<(Option<i32>, Option<i32>)>> = Arc::default();
    let rounds = AtomicUsize::new(0);
    // Whether session `pid` waits for a lock.
    let queued = |admin: &pg::Admin, pid: i32| -> bool {
        admin.query(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
            &[&pid],
        )[0]
        .get::<_, i64>(0)
            > 0
    };
    let hook: PgFaultHook = {
        let (holder, me, a_thread, admin, locker, pids) = (
            Arc::clone(&holder),
            Arc::clone(&me),
            Arc::clone(&a_thread),
            Arc::clone(&admin),
            Arc::clone(&locker),
            Arc::clone(&pids),
        );
        Arc::new(move |step, pid| {
            if step != PgStep::LockRow {
                return None;
            }
            match rounds.fetch_add(1, Ordering::SeqCst) {
                // B's second attempt, its wait ahead.
                1 => {
                    pids.lock().unwrap().0 = Some(pid);
                    let (h, lease) = holder.lock().unwrap().take().unwrap();
                    h.release(&lease).unwrap();
                    locker.execute("BEGIN", &[]);
                    locker.query(
                        "SELECT 1 FROM flocklease_leases WHERE id = 'x' FOR UPDATE",
                        &[],
                    );
                    let leases = me.get().unwrap().upgrade().unwrap();
                    let a = std::thread::spawn(move || leases.acquire(&sid("x"), &who("a")));
                    *a_thread.lock().unwrap() = Some(a);
                }
                // A's first round trip, under the id's in-process lock: once B is queued.
                2 => {
                    let b = pids.lock().unwrap().0.unwrap();
                    pg::until("B queues for the row", || queued(&admin, b));
                    pids.lock().unwrap().1 = Some(pid);
                }
                _ => {}
            }
            None
        })
    };
    let leases = Arc::new(
        PgLease::builder(&url)
            .lock_timeout(Duration::from_secs(2))
            .faults(hook)
            .connect()
            .unwrap(),
    );
    me.set(Arc::downgrade(&leases)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let b = {
        let leases = Arc::clone(&leases);
        std::thread::spawn(move || {
            let got = leases.acquire_wait(&sid("x"), &who("b"), Duration::from_secs(60));
            tx.send(got).unwrap();
        })
    };
    pg::until("A queues for the row behind B", || {
        let a = pids.lock().unwrap().1;
        a.is_some_and(|a| queued(&admin, a))
    });
    locker.execute("COMMIT", &[]);
    let a = a_thread.lock().unwrap().take().unwrap();
    let a_lease = a
        .join()
        .unwrap()
        .expect("A's acquire is not held up by B's row lock")
        .lease()
        .expect("A got the released lease");
    // B waits on, now for A's generation, and gets it once A releases.
    leases.release(&a_lease).unwrap();
    let b_lease = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("B's wait ended")
        .unwrap()
        .lease()
        .expect("B got the lease");
    assert_eq!(b_lease.token, a_lease.token + 1);
    b.join().unwrap();
}

#[test]
fn a_fenced_section_whose_commit_reply_is_lost_is_unknown_writes_not_a_retry() {
    // Issue 51: the section's writes may have committed and nothing settles them later (34 of
    // 37 such sections had), so re-running it as "retry" would write them again: its own
    // error and kind, and words that say to look at the data first.
    let Some(h) = Harness::new() else { return };
    h.admin.execute("CREATE TABLE written (n int8)", &[]);
    let a = h.instance();
    let lease = a
        .acquire(&sid("section"), &who("a"))
        .unwrap()
        .lease()
        .unwrap();
    let (got, fired) = h.with_fault((PgStep::Commit, Kind::LoseReply, 0), || {
        a.fenced(&lease, |tx| {
            tx.execute("INSERT INTO written VALUES (1)", &[])
        })
    });
    assert!(fired);
    let e = got.expect_err("a lost COMMIT reply");
    assert!(
        matches!(&e, flocklease::Error::FencedCommitUnknown { token, .. } if *token == lease.token),
        "{e:?}"
    );
    assert_eq!(e.kind(), flocklease::ErrorKind::WritesUnknown);
    let said = e.to_string();
    assert!(said.contains("look at the data"), "{said}");
    assert!(!said.contains("  "), "runs of blanks in: {said:?}");
    // The server did commit it (the reply alone was lost): retrying would write it twice.
    let rows = h.admin.query("SELECT count(*) FROM written", &[]);
    assert_eq!(rows[0].get::<_, i64>(0), 1);
}
