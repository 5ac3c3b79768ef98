//! Fenced sections on PostgreSQL: the caller's statements commit only if the lease was the
//! caller's throughout, and a takeover (which locks the lease row for update) waits for the
//! section. A shared manual clock moves time; no sleeps.

use crate::pg;
use crate::support;

use std::sync::Arc;
use std::time::Duration;

use flocklease::pg::PgLease;
use flocklease::{Error, Grant, ManualClock, Timestamp};
use support::{id, owner};

const TTL: Duration = Duration::from_secs(30);

fn open(url: &str, clock: &ManualClock) -> PgLease {
    PgLease::builder(url)
        .clock(Arc::new(clock.clone()))
        .ttl(TTL)
        .lock_timeout(Duration::from_millis(300))
        .connect()
        .unwrap()
}

#[test]
fn a_takeover_waits_for_the_section_and_an_expired_section_commits_nothing() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    admin.execute("CREATE TABLE out (token int8)", &[]);
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let (a, b) = (open(&url, &clock), open(&url, &clock));
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let token = lease.token as i64;
    // A section that commits: a rival's acquire meanwhile waits for it (here its lock
    // timeout runs out), and the row is written.
    let during = a
        .fenced(&lease, |tx| {
            tx.execute("INSERT INTO out VALUES ($1)", &[&token])?;
            Ok(b.acquire(&id("s"), &owner("b")))
        })
        .unwrap()
        .expect("committed");
    assert!(
        matches!(during, Err(Error::LockTimeout { .. })),
        "{during:?}"
    );
    assert_eq!(
        admin.query("SELECT count(*) FROM out", &[])[0].get::<_, i64>(0),
        1
    );
    // A section during which the lease expires: rolled back, and the rival cannot take over
    // until it has.
    let late = a
        .fenced(&lease, |tx| {
            tx.execute("INSERT INTO out VALUES ($1)", &[&token])?;
            clock.advance(TTL + Duration::from_secs(1));
            Ok(b.acquire(&id("s"), &owner("b")))
        })
        .unwrap();
    assert!(
        late.is_none(),
        "a section that outlived its lease committed: {late:?}"
    );
    assert_eq!(
        admin.query("SELECT count(*) FROM out", &[])[0].get::<_, i64>(0),
        1
    );
    // Now the rival takes over, and the old holder's sections do not run.
    let taken = b.acquire(&id("s"), &owner("b")).unwrap();
    assert!(
        matches!(taken, Grant::Granted(ref l) if l.token == 2),
        "{taken:?}"
    );
    let mut ran = false;
    let stale = a
        .fenced(&lease, |_| {
            ran = true;
            Ok(())
        })
        .unwrap();
    assert_eq!(stale, None);
    assert!(!ran, "a superseded lease's section ran");
    // Another instance, not holding the generation, runs no section for it either.
    let new = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert_eq!(a.fenced(&new, |_| Ok(1)).unwrap(), None);
    assert_eq!(b.fenced(&new, |_| Ok(1)).unwrap(), Some(1));
}

#[test]
fn a_failing_statement_rolls_the_section_back() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    admin.execute("CREATE TABLE out (token int8)", &[]);
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let a = open(&url, &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let failed = a.fenced(&lease, |tx| {
        tx.execute("INSERT INTO out VALUES (1)", &[])?;
        tx.execute("SELECT 1/0", &[])
    });
    let err = failed.unwrap_err();
    assert!(err.to_string().contains("division by zero"), "{err}");
    assert_eq!(
        admin.query("SELECT count(*) FROM out", &[])[0].get::<_, i64>(0),
        0
    );
    // The connection and the lease are fine afterwards.
    assert!(matches!(a.renew(&lease).unwrap(), Grant::Granted(_)));
}

#[test]
fn a_section_that_would_end_its_own_transaction_is_refused_and_writes_nothing() {
    // Issue 32.5: a closure's `COMMIT` would commit what came before it without the final
    // fence check and run what comes after it unfenced.
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    admin.execute("CREATE TABLE out (token int8)", &[]);
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let a = open(&url, &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    for control in ["COMMIT", "end", "/* x */ ROLLBACK", "START TRANSACTION"] {
        let got = a.fenced(&lease, |tx| {
            tx.execute("INSERT INTO out VALUES (1)", &[])?;
            tx.execute(control, &[])?;
            tx.execute("INSERT INTO out VALUES (2)", &[])
        });
        let err = got.unwrap_err();
        assert!(err.to_string().contains("refused"), "{control}: {err}");
    }
    assert_eq!(
        admin.query("SELECT count(*) FROM out", &[])[0].get::<_, i64>(0),
        0
    );
    // A savepoint is no transaction control.
    let got = a.fenced(&lease, |tx| {
        tx.execute("SAVEPOINT p", &[])?;
        tx.execute("INSERT INTO out VALUES (3)", &[])?;
        tx.execute("ROLLBACK TO SAVEPOINT p", &[])?;
        tx.execute("INSERT INTO out VALUES (4)", &[])
    });
    assert_eq!(got.unwrap(), Some(1));
    let rows = admin.query("SELECT token FROM out", &[]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 4);
}
