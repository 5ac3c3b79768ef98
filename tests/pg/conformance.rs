//! The conformance suite, unchanged, against `PgLease` on a throwaway PostgreSQL server (each
//! case in its own database). The world's manual clock replaces the server's clock, as the suite
//! requires; `tests/pg/processes.rs` checks the server's clock.

use crate::pg;

use std::sync::Arc;
use std::time::Duration;

use flocklease::conformance::{START, TTL, World};
use flocklease::pg::PgLease;
use flocklease::{ManualClock, Record, SessionId, Timestamp};

struct PgWorld {
    url: String,
    admin: pg::Admin,
    clock: ManualClock,
}

fn world() -> Option<PgWorld> {
    let server = pg::server()?;
    let db = server.fresh_db();
    let url = server.url(&db);
    // Creates the tables, so `set_record` works before any instance exists.
    drop(PgLease::connect(&url).expect("connect"));
    Some(PgWorld {
        admin: server.admin(&db),
        url,
        clock: ManualClock::new(START),
    })
}

impl World for PgWorld {
    type Lease = PgLease;
    fn instance(&self) -> PgLease {
        PgLease::builder(&self.url)
            .clock(Arc::new(self.clock.clone()))
            .ttl(TTL)
            .connect()
            .expect("connect")
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn record(&self, id: &SessionId) -> Option<Record> {
        let (owner, token, micros) = self.admin.row(id.as_str())?;
        if token == 0 && owner.is_empty() {
            return None; // the placeholder row: no record
        }
        Some(Record {
            owner,
            token: token as u64,
            expiry: Timestamp::from_unix_nanos(i128::from(micros) * 1000).unwrap(),
        })
    }
    fn set_record(&self, id: &SessionId, r: Record) {
        let micros = i64::try_from(r.expiry.unix_nanos() / 1000).unwrap();
        self.admin.execute(
            "INSERT INTO flocklease_leases (id, owner, token, expiry) \
             VALUES ($1, $2, $3, 'epoch'::timestamptz + ($4::int8 || ' microseconds')::interval) \
             ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, \
             expiry = EXCLUDED.expiry",
            &[&id.as_str(), &r.owner, &(r.token as i64), &micros],
        );
    }
    fn stuck_transition(
        &self,
        id: &SessionId,
        timeout: Duration,
    ) -> Option<(PgLease, Box<dyn std::any::Any>)> {
        let leases = PgLease::builder(&self.url)
            .clock(Arc::new(self.clock.clone()))
            .ttl(TTL)
            .lock_timeout(timeout)
            .connect()
            .expect("connect");
        // The row, locked in an open transaction of a session of its own.
        let stuck = pg::Admin::connect(&self.url);
        stuck.execute(
            "INSERT INTO flocklease_leases (id, owner, token, expiry) \
             VALUES ($1, '', 0, 'epoch') ON CONFLICT (id) DO NOTHING",
            &[&id.as_str()],
        );
        stuck.execute("BEGIN", &[]);
        stuck.query(
            "SELECT 1 FROM flocklease_leases WHERE id = $1 FOR UPDATE",
            &[&id.as_str()],
        );
        Some((leases, Box::new(stuck)))
    }
}

// A missing server skips every case (returning early from it), after a loud notice.
flocklease::conformance_tests!({
    match world() {
        Some(w) => w,
        None => return,
    }
});

/// Guards the skip above: with `FLOCKLEASE_REQUIRE_PG=1` a missing server fails.
#[test]
fn server_is_there_when_required() {
    if std::env::var(pg::REQUIRE).is_ok_and(|v| v == "1") {
        assert!(pg::server().is_some());
    }
    let _ = Duration::ZERO;
}
