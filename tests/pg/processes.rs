//! `PgLease` against a real server with real processes and sessions: crash takeover by a
//! waiter, a liveness connection ended by the server (seen at once through `KeepAlive`, and
//! re-locked by a renew when nobody took over), hosts with skewed clocks, stale releases, a
//! stuck row lock, and the schema checks. Synchronisation is on protocol lines from children
//! and on server state read with SQL (`pg_locks`), never on sleeps.

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flocklease::pg::PgLease;
use flocklease::{Clock, Error, KeepAlive, Loss, SessionLease, SystemClock, Timestamp};
use support::{RoleChild, hear, id, owner, role, tell};

const ENTRY: &str = "processes::child_entry";

/// The holder role: `URL ID OWNER`. Acquires, says `token N`, then waits for stdin to close.
///
/// `stepped URL`: acquires `job` with a 2 s TTL and says `token N`; then answers `wall` with
/// its wall clock (unix nanoseconds) and `expired?` with whether the lease manager's clock
/// reads the lease expired.
#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    if role == "stepped" {
        let leases = PgLease::builder(&args[0])
            .ttl(Duration::from_secs(2))
            .connect()
            .unwrap();
        let lease = leases
            .acquire(&id("job"), &owner("stepped"))
            .unwrap()
            .lease()
            .expect("free");
        tell(&format!("token {}", lease.token));
        while let Some(line) = hear() {
            match line.as_str() {
                "wall" => tell(&SystemClock.now().unix_nanos().to_string()),
                "expired?" => tell(if leases.clock().now() >= lease.expiry {
                    "yes"
                } else {
                    "no"
                }),
                other => panic!("unknown request {other}"),
            }
        }
        return;
    }
    let (_leases, lease) = pg::acquire_free(&args[0], &args[1], &args[2]);
    tell(&format!("token {}", lease.token));
    while hear().is_some() {}
}

/// libfaketime, which makes a child's wall clock step (`LD_PRELOAD`); `None` (skip, loudly)
/// when it is not installed, unless `FLOCKLEASE_REQUIRE_FAKETIME=1` (CI).
fn faketime_lib() -> Option<std::path::PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path().join("faketime/libfaketime.so.1")))
        .chain([std::path::PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )])
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var("FLOCKLEASE_REQUIRE_FAKETIME").as_deref() != Ok("1"),
            "FLOCKLEASE_REQUIRE_FAKETIME=1 but libfaketime is not installed (package faketime)"
        );
        eprintln!("*** libfaketime NOT FOUND: the wall-clock step test DID NOT RUN ***");
    }
    found
}

/// Issue 32.4: the holder's wall clock steps back 10 s (an NTP step, a VM restore) right
/// after its acquire. The lease manager's clock still reads the lease expired as soon as the
/// server's clock does (it is the server's last reading plus the time elapsed on this host's
/// boot-time clock), not 10 s later, so `KeepAlive` reports the loss on time. The step is made
/// by libfaketime in the child only (a real step would disturb the whole machine).
#[test]
fn a_wall_clock_step_back_does_not_delay_the_expiry_seen_here() {
    let Some(lib) = faketime_lib() else { return };
    let Some((url, admin)) = fresh() else { return };
    let dir = tempfile::tempdir().unwrap();
    let offset = dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let preload = format!("LD_PRELOAD={}", lib.display());
    let file = format!("FAKETIME_TIMESTAMP_FILE={}", offset.display());
    let wrapper = [
        "/usr/bin/env",
        &preload,
        &file,
        "FAKETIME_NO_CACHE=1",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
    ];
    let mut child = RoleChild::spawn_wrapped(&wrapper, ENTRY, "stepped", &[&url]);
    assert_eq!(child.line(), "token 1");
    std::fs::write(&offset, "-10\n").unwrap();
    // The step is in effect in the child (else this test would show nothing).
    child.say("wall");
    let wall: i128 = child.line().parse().unwrap();
    let behind = SystemClock.now().unix_nanos() - wall;
    assert!(
        behind > 9_000_000_000,
        "the child's wall clock is {behind} ns behind, not stepped back 10 s"
    );
    pg::until("the server's clock to pass the expiry", || {
        admin.query(
            "SELECT clock_timestamp() >= expiry FROM flocklease_leases WHERE id = 'job'",
            &[],
        )[0]
        .get::<_, bool>(0)
    });
    child.say("expired?");
    assert_eq!(
        child.line(),
        "yes",
        "the holder's clock reads its lease unexpired after the server's clock passed the expiry"
    );
    child.finish();
}

/// A fresh database on the shared server, or `None` (skip) without PostgreSQL.
fn fresh() -> Option<(String, pg::Admin)> {
    let server = pg::server()?;
    let db = server.fresh_db();
    Some((server.url(&db), server.admin(&db)))
}

#[test]
fn sigkilled_holder_process_is_replaced_by_a_waiter_within_milliseconds() {
    let Some((url, admin)) = fresh() else { return };
    let mut child = RoleChild::spawn(ENTRY, "hold", &[&url, "job", "child"]);
    let held: u64 = child
        .line()
        .strip_prefix("token ")
        .unwrap()
        .parse()
        .unwrap();
    let leases = PgLease::connect(&url).unwrap();
    assert!(leases.acquire(&id("job"), &owner("me")).unwrap().is_held());
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let got = leases.acquire_wait(&id("job"), &owner("me"), Duration::from_secs(20));
            tx.send((got, Instant::now())).unwrap();
        });
        // The waiter is blocked in the server on the holder's generation, not polling.
        pg::until("the waiter blocks on the advisory lock", || {
            admin.advisory_waiters() == 1
        });
        let killed = Instant::now();
        child.kill();
        let (got, at) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let lease = got.unwrap().lease().expect("granted after the crash");
        let latency = at - killed;
        eprintln!("takeover after SIGKILL: {latency:?}");
        assert_eq!(lease.token, held + 1);
        assert!(
            latency < Duration::from_secs(2),
            "took {latency:?}: the waiter was not woken by the crash"
        );
    });
}

#[test]
fn liveness_connection_ended_by_the_server_is_reported_at_once_and_fenced_by_the_token() {
    let Some((url, admin)) = fresh() else { return };
    let leases = Arc::new(PgLease::connect(&url).unwrap());
    let lease = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let keep = KeepAlive::builder(Arc::clone(&leases), lease.clone())
        .clock(leases.clock())
        .on_loss(move |loss| tx.send(loss.clone()).unwrap())
        .start()
        .unwrap();
    let key = admin.key("job");
    let holders = admin.advisory_holders(key, 1);
    assert_eq!(holders.len(), 1, "one session holds generation 1");
    let ended = Instant::now();
    admin.terminate(holders[0]);
    // The TTL is 30 s and renews every 10 s: only the connection's end can report this fast.
    let loss = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(loss, Loss::LivenessLost);
    eprintln!("liveness loss reported after {:?}", ended.elapsed());
    assert_eq!(keep.loss(), Some(Loss::LivenessLost));
    // A rival sees the generation dead and takes over before the expiry; the token orders them.
    let rival = PgLease::connect(&url).unwrap();
    let taken = rival
        .acquire(&id("job"), &owner("b"))
        .unwrap()
        .lease()
        .expect("dead generation taken over before its expiry");
    assert!(taken.expiry > lease.expiry || taken.token > lease.token);
    assert_eq!(taken.token, lease.token + 1);
    // The old holder's renew is a definitive loss, and its release leaves the rival alone.
    assert!(leases.renew(&lease).unwrap().is_held());
    drop(keep);
    assert_eq!(admin.row("job").unwrap().0, "b");
    assert_eq!(admin.advisory_holders(key, 2).len(), 1);
}

#[test]
fn renew_relocks_a_generation_whose_connection_ended_when_nobody_took_over() {
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::connect(&url).unwrap();
    let lease = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let key = admin.key("job");
    let before = admin.advisory_holders(key, 1);
    admin.terminate(before[0]);
    assert!(admin.advisory_holders(key, 1).is_empty());
    let renewed = leases.renew(&lease).unwrap().lease().expect("still ours");
    assert_eq!(renewed.token, lease.token);
    let after = admin.advisory_holders(key, 1);
    assert_eq!(after.len(), 1, "the generation is locked again");
    assert_ne!(after, before, "on a new session");
    // And it is live again for rivals.
    let rival = PgLease::connect(&url).unwrap();
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
    // The same through a refreshing acquire by the holder (which an acquire's speculative
    // probe of its own generation would break).
    admin.terminate(after[0]);
    let again = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .expect("refresh");
    assert_eq!(again.token, lease.token);
    assert_eq!(admin.advisory_holders(key, 1).len(), 1);
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
}

/// The system clock moved by a fixed offset: a host whose clock is wrong.
#[derive(Debug)]
struct Skewed(i128);

impl Clock for Skewed {
    fn now(&self) -> Timestamp {
        Timestamp::from_unix_nanos(SystemClock.now().unix_nanos() + self.0).unwrap()
    }
}

#[test]
fn hosts_with_skewed_clocks_agree_on_expiry() {
    let Some((url, admin)) = fresh() else { return };
    let hour = 3_600_000_000_000i128;
    let ahead = PgLease::builder(&url)
        .local_clock(Arc::new(Skewed(hour)))
        .connect()
        .unwrap();
    let behind = PgLease::builder(&url)
        .local_clock(Arc::new(Skewed(-hour)))
        .connect()
        .unwrap();
    let server_now = || -> i128 {
        let micros: i64 = admin.query(
            "SELECT (extract(epoch from clock_timestamp()) * 1000000)::int8",
            &[],
        )[0]
        .get(0);
        i128::from(micros) * 1000
    };
    let lease = ahead
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    // The expiry is the server's now + TTL, whatever this host's clock says.
    let off = lease.expiry.unix_nanos() - 30_000_000_000 - server_now();
    assert!(
        off.abs() < 1_000_000_000,
        "expiry off the server's clock by {off} ns"
    );
    // The host one hour ahead would think the lease long expired; the server says live.
    assert!(ahead.acquire(&id("job"), &owner("a2")).unwrap().is_held());
    assert!(behind.acquire(&id("job"), &owner("b")).unwrap().is_held());
    // Both estimate the server's clock, not their own.
    assert!(
        behind
            .acquire(&id("other"), &owner("b"))
            .unwrap()
            .lease()
            .is_some()
    );
    for l in [&ahead, &behind] {
        let d = l.clock().now().unix_nanos() - server_now();
        assert!(d.abs() < 1_000_000_000, "clock estimate off by {d} ns");
    }
    // Expired by the server's clock: the host one hour behind takes over at once.
    admin.execute(
        "UPDATE flocklease_leases SET expiry = clock_timestamp() WHERE id = 'job'",
        &[],
    );
    let taken = behind
        .acquire(&id("job"), &owner("b"))
        .unwrap()
        .lease()
        .expect("expired by the server's clock");
    assert_eq!(taken.token, lease.token + 1);
    assert!(ahead.renew(&lease).unwrap().is_held());
}

#[test]
fn a_stale_release_never_unlocks_a_successor() {
    let Some((url, admin)) = fresh() else { return };
    let (a, b, c) = (
        PgLease::connect(&url).unwrap(),
        PgLease::connect(&url).unwrap(),
        PgLease::connect(&url).unwrap(),
    );
    let old = a.acquire(&id("job"), &owner("a")).unwrap().lease().unwrap();
    admin.execute(
        "UPDATE flocklease_leases SET expiry = clock_timestamp() WHERE id = 'job'",
        &[],
    );
    let new = b.acquire(&id("job"), &owner("b")).unwrap().lease().unwrap();
    let row = admin.row("job");
    a.release(&old).unwrap();
    assert_eq!(admin.row("job"), row, "a stale release must not write");
    let key = admin.key("job");
    assert_eq!(admin.advisory_holders(key, new.token as u32).len(), 1);
    assert!(admin.advisory_holders(key, old.token as u32).is_empty());
    assert!(c.acquire(&id("job"), &owner("c")).unwrap().is_held());
    assert!(b.renew(&new).unwrap().lease().is_some());
}

#[test]
fn a_stuck_row_lock_is_a_typed_timeout_and_does_not_delay_other_ids() {
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::builder(&url)
        .lock_timeout(Duration::from_millis(200))
        .connect()
        .unwrap();
    assert!(
        leases
            .acquire(&id("stuck"), &owner("a"))
            .unwrap()
            .lease()
            .is_some()
    );
    // Another session holds the row lock in an open transaction (a stopped process).
    admin.execute("BEGIN", &[]);
    admin.execute(
        "SELECT 1 FROM flocklease_leases WHERE id = 'stuck' FOR UPDATE",
        &[],
    );
    let started = Instant::now();
    match leases.acquire(&id("stuck"), &owner("b")) {
        Err(Error::LockTimeout {
            lock: flocklease::LockOf::Row(i),
            ..
        }) => assert_eq!(i, id("stuck")),
        other => panic!("expected a row lock timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    let other = leases.acquire(&id("free"), &owner("b")).unwrap();
    assert!(other.lease().is_some(), "another id is served meanwhile");
    admin.execute("ROLLBACK", &[]);
    assert!(leases.acquire(&id("stuck"), &owner("b")).unwrap().is_held());
}

#[test]
fn tables_of_another_version_or_in_two_schemas_are_refused() {
    let Some((url, admin)) = fresh() else { return };
    drop(PgLease::connect(&url).unwrap());
    admin.execute("UPDATE flocklease_schema SET version = 99", &[]);
    match PgLease::connect(&url) {
        Err(Error::SchemaVersion {
            found: 99,
            expected: 1,
        }) => {}
        other => panic!("expected a schema version error, got {other:?}"),
    }
    admin.execute("UPDATE flocklease_schema SET version = 1", &[]);
    admin.execute("CREATE SCHEMA other", &[]);
    admin.execute("CREATE TABLE other.flocklease_leases (id text)", &[]);
    match PgLease::connect(&url) {
        Err(Error::SharedLockSpace { schemas }) => assert_eq!(schemas, ["other", "public"]),
        other => panic!("expected a shared lock space error, got {other:?}"),
    }
}

/// Every client uses the database's one lease table, whatever its `search_path`: a client
/// whose `search_path` lists another (writable) schema first neither creates a second table
/// (which used to make every client's connect fail with `SharedLockSpace` from then on) nor
/// misses the first one's holder.
#[test]
fn every_client_uses_the_one_lease_table_whatever_its_search_path() {
    let Some((url, admin)) = fresh() else { return };
    let first = PgLease::connect(&url).unwrap();
    let held = first
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .expect("free");
    admin.execute("CREATE SCHEMA other", &[]);
    let other_path = format!("{url} options='-c search_path=other,public'");
    let second = PgLease::connect(&other_path).unwrap();
    assert!(second.acquire(&id("job"), &owner("b")).unwrap().is_held());
    let tables: i64 = admin.query(
        "SELECT count(*) FROM pg_class WHERE relname = 'flocklease_leases'",
        &[],
    )[0]
    .get(0);
    assert_eq!(tables, 1, "one lease table in the database");
    first.release(&held).unwrap();
    let next = second
        .acquire(&id("job"), &owner("b"))
        .unwrap()
        .lease()
        .expect("free once released");
    assert_eq!(next.token, held.token + 1);
    // And a third client, with the default path, still connects.
    drop(PgLease::connect(&url).unwrap());
}

/// Once the lease tables exist, a role with SELECT, INSERT and UPDATE on them (no CREATE on
/// any schema) connects and takes leases.
#[test]
fn a_role_without_the_create_privilege_uses_the_existing_tables() {
    let Some((url, admin)) = fresh() else { return };
    drop(PgLease::connect(&url).unwrap());
    let db: String = admin.query("SELECT current_database()::text", &[])[0].get(0);
    let role = format!("app_{db}");
    admin.execute(&format!("CREATE ROLE {role} LOGIN"), &[]);
    admin.execute(
        &format!("REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}"),
        &[],
    );
    admin.execute(
        &format!("GRANT SELECT, INSERT, UPDATE ON flocklease_leases TO {role}"),
        &[],
    );
    admin.execute(&format!("GRANT SELECT ON flocklease_schema TO {role}"), &[]);
    let app_url = url.replace("user=postgres", &format!("user={role}"));
    let leases = match PgLease::connect(&app_url) {
        Ok(leases) => leases,
        Err(e) => panic!("a role without CREATE could not connect: {e}"),
    };
    let lease = leases
        .acquire(&id("job"), &owner("app"))
        .unwrap()
        .lease()
        .expect("free");
    assert_eq!(lease.token, 1);
    leases.release(&lease).unwrap();
}

/// A table named `flocklease_leases` that is not the library's, and a read-only session, are
/// refused at connect with an error that says what is wrong and what fixes it (not as a
/// pooler problem, nor as a database error at the first transition).
#[test]
fn a_foreign_lease_table_and_a_read_only_session_are_refused_at_connect() {
    let Some((url, admin)) = fresh() else { return };
    let read_only = format!("{url} options='-c default_transaction_read_only=on'");
    match PgLease::connect(&read_only) {
        Err(Error::UnfitServer { detail, remedy }) => {
            assert!(detail.contains("read-only"), "{detail}");
            assert!(remedy.contains("default_transaction_read_only"), "{remedy}");
        }
        Err(e) => panic!("expected UnfitServer, got {e:?}"),
        Ok(_) => panic!("a read-only session was accepted"),
    }
    admin.execute(
        "CREATE TABLE flocklease_leases (id text PRIMARY KEY, owner text, token int4)",
        &[],
    );
    admin.execute(
        "CREATE TABLE flocklease_schema (version int4 NOT NULL)",
        &[],
    );
    admin.execute("INSERT INTO flocklease_schema VALUES (1)", &[]);
    match PgLease::connect(&url) {
        Err(Error::UnfitServer { detail, remedy }) => {
            assert!(
                detail.contains("column key (integer) is missing"),
                "{detail}"
            );
            assert!(
                detail.contains("column token is integer, not bigint"),
                "{detail}"
            );
            assert!(detail.contains("\"public\".flocklease_leases"), "{detail}");
            assert!(remedy.contains("drop or rename"), "{remedy}");
        }
        Err(e) => panic!("expected UnfitServer, got {e:?}"),
        Ok(_) => panic!("a foreign table was accepted"),
    }
}

#[test]
fn liveness_loss_callback_fires_at_once_for_a_lease_not_held_here() {
    let Some((url, _admin)) = fresh() else { return };
    let a = PgLease::connect(&url).unwrap();
    let b = PgLease::connect(&url).unwrap();
    let lease = a.acquire(&id("job"), &owner("a")).unwrap().lease().unwrap();
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    b.on_liveness_lost(&lease, Box::new(move || tx.send("b").unwrap()));
    assert_eq!(rx.try_recv(), Ok("b"), "b holds nothing: lost already");
    a.on_liveness_lost(&lease, Box::new(move || tx2.send("a").unwrap()));
    a.release(&lease).unwrap();
    assert!(rx.try_recv().is_err(), "a release is not a loss");
}

#[test]
fn cycles_reuse_one_transition_and_one_liveness_connection() {
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::connect(&url).unwrap();
    let sessions = || -> Vec<(String, i64)> {
        admin
            .query(
                "SELECT application_name, count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name LIKE 'flocklease%' \
                 GROUP BY 1 ORDER BY 1",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    };
    let pids = || {
        admin.query("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'flocklease%' ORDER BY pid", &[]).iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>()
    };
    let l = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&l).unwrap();
    let first = pids();
    for _ in 0..20 {
        let l = leases
            .acquire(&id("job"), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        leases.release(&l).unwrap();
    }
    assert_eq!(
        sessions(),
        [
            ("flocklease".to_owned(), 1),
            ("flocklease-liveness".to_owned(), 1)
        ]
    );
    assert_eq!(pids(), first, "no connection was replaced");
}

#[test]
fn idle_connections_ended_by_the_server_are_replaced() {
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::connect(&url).unwrap();
    let l = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&l).unwrap();
    // A server restart, as the idle connections see it: every session of the instance ends.
    for pid in admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name LIKE 'flocklease%'",
            &[],
        )
        .iter()
        .map(|r| r.get::<_, i32>(0))
    {
        admin.terminate(pid);
    }
    let again = leases.acquire(&id("job"), &owner("a")).unwrap().lease();
    assert_eq!(
        again.map(|l| l.token),
        Some(l.token + 1),
        "the next call recovers"
    );
}

#[test]
fn an_idle_holder_keeps_only_its_liveness_session_and_reconnects_to_renew() {
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::builder(&url)
        .idle_timeout(Some(Duration::from_millis(50)))
        .connect()
        .unwrap();
    let lease = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let sessions = |app: &str| -> i64 {
        admin.query(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1",
            &[&app],
        )[0]
        .get(0)
    };
    // The pooled transition connection closes once idle; the held generation's stays.
    pg::until("the idle transition connection closes", || {
        sessions("flocklease") == 0
    });
    assert_eq!(sessions("flocklease-liveness"), 1);
    assert_eq!(admin.advisory_holders(admin.key("job"), 1).len(), 1);
    // The next renew opens a connection again and keeps the lease.
    let renewed = leases.renew(&lease).unwrap().lease().expect("still ours");
    assert_eq!(renewed.token, lease.token);
    let rival = PgLease::connect(&url).unwrap();
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
}

/// A server session that stops answering (its backend SIGSTOPped: the server's kernel still
/// acknowledges every packet and keepalive) fails the call after the reply bound — the row
/// lock's `lock_timeout` plus a third of the TTL — instead of blocking it, nothing stays locked,
/// and once the backend runs again the lease is renewed as if nothing had happened.
#[test]
fn a_stopped_server_session_fails_the_call_instead_of_blocking_it() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Some((url, admin)) = fresh() else { return };
    let leases = PgLease::builder(&url)
        .ttl(Duration::from_secs(3))
        .lock_timeout(Duration::from_millis(200))
        .connect()
        .unwrap();
    let lease = leases
        .acquire(&id("job"), &owner("me"))
        .unwrap()
        .lease()
        .unwrap();
    // The transition session the renew will use (the instance's only one), not its liveness
    // session.
    let stopped: Vec<Pid> = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'flocklease'",
            &[],
        )
        .iter()
        .map(|r| Pid::from_raw(r.get(0)))
        .collect();
    assert_eq!(stopped.len(), 1);
    for &p in &stopped {
        kill(p, Signal::SIGSTOP).unwrap();
    }
    let (tx, rx) = mpsc::channel();
    let got = std::thread::scope(|s| {
        s.spawn(|| tx.send(leases.renew(&lease)).unwrap());
        // Generous: the bound is 1.2 s, and ending the stopped session may wait 2 s more.
        let got = rx.recv_timeout(Duration::from_secs(60));
        for &p in &stopped {
            kill(p, Signal::SIGCONT).unwrap();
        }
        got
    });
    let err = got
        .expect("the renew still waits for the stopped session")
        .unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err:?}");
    assert!(
        err.to_string().contains("no reply from the server"),
        "{err}"
    );
    // The stopped session was told to end; once it runs again, it does.
    admin.until_ended(stopped[0].as_raw());
    // Nothing was left locked and the generation is intact: renewed, and refused to a rival.
    assert!(leases.renew(&lease).unwrap().lease().is_some());
    let rival = PgLease::connect(&url).unwrap();
    assert!(
        rival
            .acquire(&id("job"), &owner("rival"))
            .unwrap()
            .is_held()
    );
}

/// A waiting acquire keeps no in-process lock while it waits: the same instance's renew and
/// release of the lease it waits for go on meanwhile, and the release ends the wait at once.
#[test]
fn a_waiting_acquire_does_not_hold_up_the_instance_s_other_calls() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let leases = PgLease::builder(&url)
        .ttl(Duration::from_secs(30))
        .connect()
        .unwrap();
    let lease = leases
        .acquire(&id("shared"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let got = leases.acquire_wait(&id("shared"), &owner("b"), Duration::from_secs(60));
            tx.send(got).unwrap();
        });
        pg::until("the waiter waits on the server", || {
            admin.advisory_waiters() == 1
        });
        // With the id's lock kept by the wait, this would wait for the lease's expiry, when
        // the waiter takes it over.
        let renewed = leases
            .renew(&lease)
            .unwrap()
            .lease()
            .expect("renewed while the other call waits");
        assert_eq!(renewed.token, lease.token);
        match rx.try_recv() {
            Err(mpsc::TryRecvError::Empty) => {}
            other => panic!("the waiter ended while the lease was held: {other:?}"),
        }
        leases.release(&renewed).unwrap();
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the release ends the wait")
            .unwrap();
        assert_eq!(got.lease().unwrap().token, lease.token + 1);
    });
}
