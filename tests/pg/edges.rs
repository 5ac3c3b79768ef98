//! `PgLease` at its edges: a client stopped in the middle of a transition (the server ends
//! its session, so the row lock it held is free again for everyone else), calls from inside
//! async runtimes (never a panic), and database errors that carry the server's own message.
//! Synchronisation is on protocol lines from children and on server state read with SQL,
//! never on sleeps.

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flocklease::Error;
use flocklease::pg::{PgLease, PgStep};
use nix::sys::signal::{Signal, kill};
use support::{RoleChild, hear, id, owner, role, tell, wait_stopped};

const ENTRY: &str = "edges::child_entry";

/// The roles. `stuck URL`: acquires `job` (TTL 6 s, lock timeout 1 s), says `token N`,
/// then renews; the renew's transaction, once its row is locked, says `stuck PID` (the
/// transition's server session) before its commit and waits there for the parent's SIGSTOP.
#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    match role.as_str() {
        "stuck" => {
            let armed = Arc::new(AtomicBool::new(false));
            let hook_armed = Arc::clone(&armed);
            let leases = PgLease::builder(&args[0])
                .ttl(Duration::from_secs(6))
                .lock_timeout(Duration::from_secs(1))
                .faults(Arc::new(move |step, pid| {
                    if step == PgStep::Commit && hook_armed.swap(false, Ordering::SeqCst) {
                        tell(&format!("stuck {pid}"));
                        // Stopped here by the parent; resumed only to be killed.
                        let _ = hear();
                    }
                    None
                }))
                .connect()
                .unwrap();
            let lease = leases
                .acquire(&id("job"), &owner("stuck"))
                .unwrap()
                .lease()
                .unwrap();
            tell(&format!("token {}", lease.token));
            armed.store(true, Ordering::SeqCst);
            let _ = leases.renew(&lease);
            while hear().is_some() {}
        }
        "slow-waiter" => {
            // `waiter URL`: TTL 300 ms; its waiting acquire, once the holder released and its
            // row lock read the server's clock, says `at commit` and waits for `go` (the
            // parent stops it meanwhile); then says `granted TOKEN EXPIRY_NANOS`.
            let armed = Arc::new(AtomicBool::new(true));
            let hook_armed = Arc::clone(&armed);
            let leases = PgLease::builder(&args[0])
                .ttl(Duration::from_millis(300))
                .faults(Arc::new(move |step, _pid| {
                    if step == PgStep::Commit && hook_armed.swap(false, Ordering::SeqCst) {
                        tell("at commit");
                        assert_eq!(hear().as_deref(), Some("go"));
                    }
                    None
                }))
                .connect()
                .unwrap();
            tell("ready");
            let got = leases
                .acquire_wait(&id("job"), &owner("waiter"), Duration::from_secs(20))
                .unwrap()
                .lease()
                .expect("granted");
            tell(&format!(
                "granted {} {}",
                got.token,
                got.expiry.unix_nanos()
            ));
            while hear().is_some() {}
        }
        other => panic!("unknown role {other}"),
    }
}

/// A fresh database on the shared server, or `None` (skip) without PostgreSQL.
fn fresh() -> Option<(String, pg::Admin)> {
    let server = pg::server()?;
    let db = server.fresh_db();
    Some((server.url(&db), server.admin(&db)))
}

/// A holder SIGSTOPped in the middle of its renew's transaction holds the lease row locked;
/// the server ends that session within the idle-in-transaction bound (here 1 s: the lock
/// timeout), so a rival's acquire is answered again — `Held`, since the stopped holder's
/// liveness session is intact — instead of failing with `LockTimeout` until the holder
/// runs again. (Without the bound, every attempt below timed out.)
#[test]
fn a_client_stopped_mid_transaction_does_not_keep_the_row_locked() {
    let Some((url, admin)) = fresh() else { return };
    let mut child = RoleChild::spawn(ENTRY, "stuck", &[&url]);
    assert_eq!(child.line(), "token 1");
    let stuck: i32 = child
        .line()
        .strip_prefix("stuck ")
        .unwrap()
        .parse()
        .unwrap();
    kill(child.pid(), Signal::SIGSTOP).unwrap();
    wait_stopped(child.pid());
    let in_tx = admin.query(
        "SELECT state FROM pg_stat_activity WHERE pid = $1",
        &[&stuck],
    );
    assert_eq!(
        in_tx[0].get::<_, String>(0),
        "idle in transaction",
        "the stopped holder's transition holds the row in an open transaction"
    );
    let rival = PgLease::builder(&url)
        .lock_timeout(Duration::from_millis(300))
        .connect()
        .unwrap();
    // At most 20 attempts of 300 ms each: four times the bound.
    let mut timeouts = 0;
    let answer = loop {
        match rival.acquire(&id("job"), &owner("rival")) {
            Err(Error::LockTimeout { .. }) if timeouts < 20 => timeouts += 1,
            other => break other,
        }
    };
    eprintln!("answered after {timeouts} row-lock timeouts of 300 ms");
    assert!(
        matches!(answer, Ok(flocklease::Grant::Held)),
        "the rival is answered, and the stopped holder still holds: {answer:?}"
    );
    admin.until_ended(stuck);
    kill(child.pid(), Signal::SIGCONT).unwrap();
    child.kill();
}

/// From a task of a multi-thread runtime every call works (the wait is announced with
/// `block_in_place`), dropping the instance included; inside a current-thread runtime, on its
/// own thread and in `spawn_blocking`, calls work too (on a thread of their own), and dropping
/// an instance there does not panic either.
#[test]
fn calls_from_inside_async_runtimes_work_or_are_refused_never_panic() {
    let Some((url, admin)) = fresh() else { return };
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let token = multi.block_on({
        let url = url.clone();
        async move {
            tokio::spawn(async move {
                let leases = PgLease::connect(&url).unwrap();
                let lease = leases
                    .acquire(&id("job"), &owner("a"))
                    .unwrap()
                    .lease()
                    .unwrap();
                let lease = leases.renew(&lease).unwrap().lease().unwrap();
                leases.release(&lease).unwrap();
                let again = leases.acquire(&id("job"), &owner("a")).unwrap().lease();
                drop(leases); // inside the runtime: unlocks, then shuts its runtime down
                again.unwrap().token
            })
            .await
            .unwrap()
        }
    });
    assert_eq!(token, 2);
    // Dropped in the task: the generation's lock is gone, not left to a stray connection.
    pg::until("the dropped instance's lock to go", || {
        admin.advisory_locks() == 0
    });
    let outside = PgLease::connect(&url).unwrap();
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    single.block_on(async {
        let inside = PgLease::connect(&url).unwrap();
        let lease = inside
            .acquire(&id("job"), &owner("b"))
            .unwrap()
            .lease()
            .unwrap();
        assert_eq!(lease.token, 3);
        assert!(outside.acquire(&id("job"), &owner("c")).unwrap().is_held());
        let url = url.clone();
        let from_blocking = tokio::task::spawn_blocking(move || {
            let leases = PgLease::connect(&url).unwrap();
            let held = leases.acquire(&id("job"), &owner("d")).unwrap().is_held();
            drop(leases);
            held
        })
        .await
        .unwrap();
        assert!(from_blocking, "the lease is b's");
        inside.release(&lease).unwrap();
        drop(inside);
        drop(outside);
    });
}

/// An error from the server reads with the server's own message, not only "db error".
#[test]
fn database_errors_carry_the_servers_message() {
    let Some(server) = pg::server() else { return };
    let url = server.url("no_such_database_here");
    let err = PgLease::connect(&url).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    assert!(
        text.contains("database \"no_such_database_here\" does not exist"),
        "{text}"
    );
}

/// A waiter stopped (SIGSTOP) after its row lock read the server's clock, resumed once the
/// server's clock passed the lease's TTL: its `acquire_wait` used to return a grant whose
/// expiry had passed already. Now the grant is renewed before it is returned (nobody took
/// over), so its expiry is ahead of the server's clock when the caller gets it.
#[test]
fn a_waiter_stopped_past_the_ttl_before_its_commit_is_never_granted_an_expired_lease() {
    let Some((url, admin)) = fresh() else { return };
    let holder = PgLease::connect(&url).unwrap();
    let held = holder
        .acquire(&id("job"), &owner("holder"))
        .unwrap()
        .lease()
        .unwrap();
    let mut child = RoleChild::spawn(ENTRY, "slow-waiter", &[&url]);
    assert_eq!(child.line(), "ready");
    pg::until("the waiter blocks on the holder's lock", || {
        admin.advisory_waiters() == 1
    });
    holder.release(&held).unwrap();
    assert_eq!(child.line(), "at commit");
    kill(child.pid(), Signal::SIGSTOP).unwrap();
    wait_stopped(child.pid());
    // The server's clock moves past the waiter's TTL (300 ms) while it is stopped; within the
    // idle-in-transaction bound (1 s), so its transaction survives.
    let server_now =
        || admin.query("SELECT clock_timestamp()", &[])[0].get::<_, std::time::SystemTime>(0);
    let stopped_at = server_now();
    pg::until("the server's clock passes the TTL", || {
        server_now()
            .duration_since(stopped_at)
            .is_ok_and(|d| d > Duration::from_millis(450))
    });
    kill(child.pid(), Signal::SIGCONT).unwrap();
    child.say("go");
    let line = child.line();
    let mut words = line.strip_prefix("granted ").unwrap().split(' ');
    let (token, expiry): (u64, i128) = (
        words.next().unwrap().parse().unwrap(),
        words.next().unwrap().parse().unwrap(),
    );
    let now = server_now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    assert_eq!(token, held.token + 1);
    assert!(
        expiry > now,
        "granted a lease that expired {} ms before the server's clock",
        (now - expiry) / 1_000_000
    );
    child.kill();
}
