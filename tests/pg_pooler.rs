//! `PgLease` through a connection pooler (a throwaway PgBouncer in front of the throwaway
//! server): a transaction-mode pooler, which breaks the session advisory locks that keep
//! leases alive, is refused at connect whichever idle server connection it reuses first; a
//! session-mode pooler keeps leases working, crash takeover included. Synchronisation is on
//! protocol lines from children and on server state read with SQL, never on sleeps.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "support/pg.rs"]
mod pg;
#[path = "support/pgbouncer.rs"]
mod pgbouncer;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use flocklease::Error;
use flocklease::pg::PgLease;
use pgbouncer::{Options, PgBouncer, PoolMode};
use support::{RoleChild, hear, id, owner, role, tell};

const ENTRY: &str = "child_entry";

/// The holder role: `URL ID OWNER`. Acquires, says `token N`, then waits for stdin to close.
#[test]
fn child_entry() {
    let Some((_, args)) = role() else { return };
    let (_leases, lease) = pg::acquire_free(&args[0], &args[1], &args[2]);
    tell(&format!("token {}", lease.token));
    while hear().is_some() {}
}

/// A fresh database on the shared server, an admin connection to it (direct, not through
/// the pooler), and a pooler in front of the server; `None` (skip) without PostgreSQL or
/// PgBouncer.
fn setup(options: &Options) -> Option<(String, pg::Admin, PgBouncer)> {
    let server = pg::server()?;
    let bouncer = PgBouncer::start(server, options)?;
    eprintln!("{} on port {}", bouncer.version, bouncer.port);
    let db = server.fresh_db();
    Some((db.clone(), server.admin(&db), bouncer))
}

/// `PgLease::connect` through `url` fails with `Error::SessionNotKept`, leaving no advisory
/// lock behind; returns the error's text.
fn refused_at_connect(url: &str, admin: &pg::Admin) -> String {
    let err = match PgLease::connect(url) {
        Err(e @ Error::SessionNotKept { .. }) => e,
        Err(e) => panic!("connect through a transaction-mode pooler failed otherwise: {e}"),
        Ok(leases) => {
            let first = leases.acquire(&id("job"), &owner("a"));
            panic!(
                "connect through a transaction-mode pooler was not refused; the first acquire \
                 then gave {first:?}"
            );
        }
    };
    assert_eq!(admin.advisory_locks(), 0, "nothing stays locked");
    eprintln!("refused: {err}");
    err.to_string()
}

#[test]
fn transaction_pooler_reusing_the_last_idle_server_connection_is_refused_at_connect() {
    let Some((db, admin, bouncer)) = setup(&Options::new(PoolMode::Transaction)) else {
        return;
    };
    let url = bouncer.url(&db);
    // A fresh pooler: the server connection released last serves the next statement.
    let text = refused_at_connect(&url, &admin);
    assert!(
        text.contains("transaction- or statement-mode pooler"),
        "{text}"
    );
    // Several idle server connections: LIFO reuse still hands the last one to every client.
    bouncer.open_server_connections(&db, 3);
    assert!(bouncer.server_connections() >= 3);
    refused_at_connect(&url, &admin);
}

#[test]
fn transaction_pooler_with_round_robin_reuse_is_refused_at_connect() {
    let mut options = Options::new(PoolMode::Transaction);
    options.round_robin = true;
    let Some((db, admin, bouncer)) = setup(&options) else {
        return;
    };
    let url = bouncer.url(&db);
    // One server connection: round robin over it is LIFO.
    refused_at_connect(&url, &admin);
    // Two, then three idle server connections: each transaction goes to the next one in turn.
    for n in [2, 3] {
        bouncer.open_server_connections(&db, n);
        assert_eq!(bouncer.server_connections(), n);
        refused_at_connect(&url, &admin);
    }
}

/// A waiting acquire on `waiter` in a thread; `free` ends the holder; the waiter must be
/// granted generation `held + 1` at once.
fn takeover(waiter: &PgLease, admin: &pg::Admin, held: u64, free: impl FnOnce()) {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let got = waiter.acquire_wait(&id("job"), &owner("b"), Duration::from_secs(20));
            tx.send(got).unwrap();
        });
        // The waiter is blocked in the server on the holder's generation, not polling.
        pg::until("the waiter blocks on the holder's advisory lock", || {
            admin.advisory_waiters() == 1
        });
        free();
        let got = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let lease = got
            .unwrap()
            .lease()
            .expect("granted once the holder is gone");
        assert_eq!(lease.token, held + 1);
        assert_eq!(admin.row("job").unwrap().0, "b");
    });
}

#[test]
fn session_pooler_keeps_leases_and_a_dropped_holder_is_replaced_by_a_waiter() {
    let Some((db, admin, bouncer)) = setup(&Options::new(PoolMode::Session)) else {
        return;
    };
    let url = bouncer.url(&db);
    let holder = PgLease::connect(&url).unwrap();
    let rival = PgLease::connect(&url).unwrap();
    let lease = holder
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .expect("free");
    assert_eq!(admin.advisory_holders(admin.key("job"), 1).len(), 1);
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
    // A renew and a release and a second generation work too.
    let lease = holder.renew(&lease).unwrap().lease().expect("renewed");
    holder.release(&lease).unwrap();
    let lease = holder
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .expect("free again");
    assert_eq!(lease.token, 2);
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
    takeover(&rival, &admin, lease.token, || drop(holder));
}

/// A session-mode pooler that does not reset server sessions between clients
/// (`server_reset_query` empty) hands a dead holder's server session, its advisory lock
/// still held, to the next client: that client is refused at connect with an error that names
/// the fix, and nothing is granted through the used session.
#[test]
fn session_pooler_without_a_reset_is_refused_naming_the_reset() {
    let options = Options {
        reset: false,
        pool_size: 2,
        ..Options::new(PoolMode::Session)
    };
    let Some((db, admin, bouncer)) = setup(&options) else {
        return;
    };
    let url = bouncer.url(&db);
    let mut child = RoleChild::spawn(ENTRY, "hold", &[&url, "job", "child"]);
    assert_eq!(child.line(), "token 1");
    child.kill();
    // The child's server sessions go back to the pool as they are: its liveness lock stays.
    assert_eq!(admin.advisory_holders(admin.key("job"), 1).len(), 1);
    let text = match PgLease::connect(&url) {
        Err(e @ Error::SessionNotKept { .. }) => e.to_string(),
        Err(e) => panic!("expected SessionNotKept, got {e:?}"),
        Ok(_) => panic!("a used server session was accepted"),
    };
    eprintln!("refused: {text}");
    assert!(text.contains("server_reset_query = DISCARD ALL"), "{text}");
}

#[test]
fn session_pooler_sigkilled_holder_process_is_replaced_by_a_waiter() {
    let Some((db, admin, bouncer)) = setup(&Options::new(PoolMode::Session)) else {
        return;
    };
    let url = bouncer.url(&db);
    let mut child = RoleChild::spawn(ENTRY, "hold", &[&url, "job", "child"]);
    let held: u64 = child
        .line()
        .strip_prefix("token ")
        .unwrap()
        .parse()
        .unwrap();
    let rival = PgLease::connect(&url).unwrap();
    assert!(rival.acquire(&id("job"), &owner("b")).unwrap().is_held());
    // SIGKILL: the pooler sees its client go, resets the server session (`DISCARD ALL`), and
    // the lock goes with it.
    takeover(&rival, &admin, held, || child.kill());
}

#[test]
fn session_pooler_keeps_the_server_side_settings_the_row_lock_bound_included() {
    // The library's server-side settings travel as `SET` statements, not as the startup
    // parameter `options` (which PgBouncer refuses, or drops when told to ignore it; this
    // pooler is not told to).
    let Some((db, admin, bouncer)) = setup(&Options::new(PoolMode::Session)) else {
        return;
    };
    let url = bouncer.url(&db);
    let leases = PgLease::builder(&url)
        .lock_timeout(Duration::from_millis(300))
        .connect()
        .unwrap();
    let lease = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&lease).unwrap();
    // Another session, directly on the server, holds the row lock in an open transaction.
    admin.execute("BEGIN", &[]);
    admin.query(
        "SELECT 1 FROM flocklease_leases WHERE id = 'job' FOR UPDATE",
        &[],
    );
    match leases.acquire(&id("job"), &owner("a")) {
        Err(Error::LockTimeout { waited, .. }) => {
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected the row-lock bound, got {other:?}"),
    }
    admin.execute("ROLLBACK", &[]);
    let again = leases
        .acquire(&id("job"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(again.token, lease.token + 1);
}

/// Other clients keep the pooler's server connections busy: `clients` connections through the
/// pooler, each running short transactions back to back (so server connections change hands
/// all the time, as under `pgbench`) until the guard is dropped.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Load {
    fn start(url: &str, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, flag) = (url.to_owned(), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut tasks = Vec::new();
                for _ in 0..clients {
                    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    tokio::spawn(conn);
                    let flag = Arc::clone(&flag);
                    tasks.push(tokio::spawn(async move {
                        let mut n = 0u64;
                        while !flag.load(Ordering::Relaxed) {
                            // The simple protocol: no prepared statement left on the server.
                            if client
                                .simple_query("BEGIN; SELECT count(*) FROM pg_class; COMMIT")
                                .await
                                .is_err()
                            {
                                break;
                            }
                            n += 1;
                        }
                        n
                    }));
                }
                let mut total = 0;
                for t in tasks {
                    total += t.await.unwrap_or(0);
                }
                total
            })
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the load; returns how many transactions it ran.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// 100 attempts, alternating between two kinds of instance (connect, then acquire `job` for a
/// new owner each time), while `load` runs through the same pooler. Every instance that was
/// granted the lease is kept (TTL one hour, never released), so a second grant while the first
/// one's liveness lock is still held would be a second holder. What a transaction pooler may
/// still do (PROTOCOL §8.5) is close or reset the server connection that holds a granted
/// generation's lock, unseen by its holder; a later grant is then a takeover from a lost
/// liveness, as after a crash. So at each grant, no earlier grant's generation lock may be held
/// by any session (`admin` reads `pg_locks`). Returns the grants, the failures' texts and how
/// many attempts were answered held.
fn attempts_under_load(url: &str, admin: &pg::Admin) -> (Vec<u64>, Vec<String>, usize) {
    let mut kept: Vec<(PgLease, flocklease::Lease)> = Vec::new();
    let mut failures = Vec::new();
    let mut held = 0;
    for i in 0..100 {
        let who = if i % 2 == 0 { "a" } else { "b" };
        let leases = match PgLease::builder(url)
            .ttl(Duration::from_secs(3600))
            .lock_timeout(Duration::from_millis(500))
            .connect()
        {
            Ok(l) => l,
            Err(e) => {
                failures.push(format!("connect: {e:?}: {e}"));
                continue;
            }
        };
        match leases.acquire(&id("job"), &owner(&format!("{who}{i}"))) {
            Ok(flocklease::Grant::Granted(lease)) => {
                let key = admin.key(id("job").as_str());
                for (_, earlier) in &kept {
                    let holders = admin.advisory_holders(key, earlier.token as u32);
                    assert!(
                        holders.is_empty(),
                        "two holders at once: token {} granted while token {}'s liveness lock                          is held by sessions {holders:?}",
                        lease.token,
                        earlier.token
                    );
                }
                kept.push((leases, lease));
            }
            Ok(flocklease::Grant::Held) => held += 1,
            Err(e) => failures.push(format!("acquire: {e:?}: {e}")),
        }
    }
    (kept.iter().map(|(_, l)| l.token).collect(), failures, held)
}

fn never_two_holders_through(mode: PoolMode) {
    let mut options = Options::new(mode);
    options.pool_size = 4;
    let Some((db, admin, bouncer)) = setup(&options) else {
        return;
    };
    let url = bouncer.url(&db);
    // The tables, created directly: the pooler modes under test cannot run that transaction.
    drop(PgLease::connect(&pg::server().unwrap().url(&db)).unwrap());
    let load = Load::start(&url, 8);
    let (grants, failures, held) = attempts_under_load(&url, &admin);
    let ran = load.stop();
    eprintln!(
        "{mode:?}: {} grants, {held} held, {} failures, {ran} load transactions; first failures: \
         {:#?}",
        grants.len(),
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    assert!(ran > 100, "the load ran ({ran} transactions)");
    // A grant is possible (an acquire that ran in the session its connection marked); a later
    // one only once the earlier one's lock was gone (checked at each grant above).
    for f in &failures {
        assert!(
            f.contains("SessionNotKept") && f.contains("transaction- or statement-mode pooler"),
            "a failure other than the pooler's refusal: {f}"
        );
    }
    assert_eq!(grants.len() + failures.len() + held, 100);
    drop(admin);
}

#[test]
fn transaction_pooler_under_load_never_gives_two_holders_and_always_says_why() {
    never_two_holders_through(PoolMode::Transaction);
}

#[test]
fn statement_pooler_under_load_never_gives_two_holders_and_always_says_why() {
    never_two_holders_through(PoolMode::Statement);
}

#[test]
fn session_pooler_under_load_grants_once_and_holds_for_the_rest() {
    let mut options = Options::new(PoolMode::Session);
    options.pool_size = 120;
    let Some((db, admin, bouncer)) = setup(&options) else {
        return;
    };
    let url = bouncer.url(&db);
    let load = Load::start(&url, 8);
    let (grants, failures, held) = attempts_under_load(&url, &admin);
    load.stop();
    assert_eq!(failures, Vec::<String>::new());
    assert_eq!(grants, vec![1]);
    assert_eq!(held, 99);
}
