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

use std::sync::mpsc;
use std::time::Duration;

use flocklease::pg::PgLease;
use flocklease::{Error, SessionLease};
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
    assert!(text.contains("transaction-mode pooler"), "{text}");
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
        Err(Error::RowLockTimeout { waited, .. }) => {
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
