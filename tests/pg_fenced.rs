//! Fenced sections on PostgreSQL: the caller's statements commit only if the lease was the
//! caller's throughout, and a takeover (which locks the lease row for update) waits for the
//! section. A shared manual clock moves time; no sleeps.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "support/pg.rs"]
mod pg;
mod support;

use std::sync::Arc;
use std::time::Duration;

use flocklease::pg::PgLease;
use flocklease::{Error, Grant, ManualClock, SessionLease, Timestamp};
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
        matches!(during, Err(Error::RowLockTimeout { .. })),
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
fn a_section_whose_session_is_ended_is_never_reported_failed_if_it_committed() {
    // Issue 32.3: a nemesis ends the sections' server sessions (`pg_terminate_backend`) at
    // random moments; a FATAL that arrives after the COMMIT took effect and before its reply
    // must not be reported as a failure (a caller that retries would write twice). Each
    // section inserts its own number; the checker compares every answer with the table.
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    admin.execute("CREATE TABLE out (n int8)", &[]);
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let a = open(&url, &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let nemesis = {
        let (stop, url, db) = (stop.clone(), url.clone(), db.clone());
        std::thread::spawn(move || {
            let admin = pg::Admin::connect(&url);
            let mut ended = 0u64;
            let mut rng = 0x2545_f491_4f6c_dd1d_u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                std::thread::sleep(Duration::from_micros(rng % 20_000));
                // The transition connections (the sections'), never the liveness one.
                ended += admin
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = $1 AND application_name = 'flocklease' \
                         AND state <> 'idle'",
                        &[&db],
                    )
                    .len() as u64;
            }
            ended
        })
    };
    let mut answers = vec![];
    for n in 0..400i64 {
        let got = a.fenced(&lease, |tx| {
            tx.execute("INSERT INTO out VALUES ($1)", &[&n])?;
            tx.execute("SELECT pg_sleep(0.0005)", &[])
        });
        answers.push((n, got));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let ended = nemesis.join().unwrap();
    let written: std::collections::HashSet<i64> = admin
        .query("SELECT n FROM out", &[])
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (mut ok, mut unknown, mut failed, mut failed_but_written) = (0, 0, 0, vec![]);
    for (n, got) in &answers {
        match got {
            Ok(Some(_)) => {
                ok += 1;
                assert!(written.contains(n), "section {n} answered Ok but is not in the table");
            }
            Ok(None) => panic!("section {n}: the lease was never lost"),
            Err(Error::CommitUnknown { .. }) => unknown += 1,
            Err(e) => {
                failed += 1;
                if written.contains(n) {
                    failed_but_written.push(format!("{n}: {e}"));
                }
            }
        }
    }
    eprintln!(
        "{} sections, {ended} sessions ended: {ok} ok, {unknown} unknown, {failed} failed",
        answers.len()
    );
    assert!(
        failed_but_written.is_empty(),
        "committed sections reported as failures: {failed_but_written:#?}"
    );
    assert!(failed + unknown >= 10, "too few sessions ended to prove anything");
}
