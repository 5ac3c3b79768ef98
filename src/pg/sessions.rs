//! Listing the lease table for status reports, without taking any lock a holder or a
//! transition needs: liveness is read from `pg_locks` (a read-only view), never probed.

use super::PgLease;
use super::conn::{Fail, within};
use super::tx::record_of;
use crate::error::Error;
use crate::machine::{self, Liveness, is_expired};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// One lease row, as [`PgLease::sessions`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSession {
    /// The session id.
    pub id: String,
    /// The record (`None` for a row inserted by a first use that never committed a grant).
    pub record: Option<Record>,
    /// Whether a session holds the recorded generation's liveness lock (from `pg_locks`).
    pub live: bool,
    /// The server's clock when the table was read.
    pub now: Timestamp,
    /// Why the row is unusable, for a row edited by hand: an id that is no valid session id,
    /// an expiry out of range. Its `record` is `None` then; every transition on it fails.
    pub problem: Option<String>,
}

impl PgSession {
    /// Whether the lease is held: another owner's acquire would be refused (the machine's
    /// answer), as when a holder is recorded, unexpired, and its liveness lock is held. Not at
    /// an exhausted token, where every acquire fails.
    pub fn is_held(&self) -> bool {
        self.problem.is_none() && self.free_for_others() == Ok(false)
    }

    /// Whether the row is unusable: `corrupt` or `exhausted` (see [`PgSession::state`]).
    pub fn is_broken(&self) -> bool {
        matches!(self.state(), "corrupt" | "exhausted")
    }

    fn free_for_others(&self) -> Result<bool, machine::StepError> {
        let liveness = if self.live {
            Liveness::Live
        } else {
            Liveness::Dead
        };
        machine::free_for_others(self.record.as_ref(), liveness, self.now)
    }

    /// `held`, `dead` (holder gone before its expiry), `expired`, `released`, `free` (never
    /// granted), `corrupt` (see [`PgSession::problem`]) or `exhausted` (a takeover is due but
    /// the token is `u64::MAX`: every acquire fails).
    pub fn state(&self) -> &'static str {
        if self.problem.is_some() {
            return "corrupt";
        }
        if self.free_for_others() == Err(machine::StepError::TokenExhausted) {
            return "exhausted";
        }
        match &self.record {
            None => "free",
            Some(r) if r.is_tombstone() => "released",
            Some(r) if is_expired(r.expiry, self.now) => "expired",
            Some(_) if self.live => "held",
            Some(_) => "dead",
        }
    }
}

impl PgLease {
    /// Every lease row (or only `id`'s), in id order, with its liveness read from `pg_locks`
    /// and the server's clock. Takes no lock: a status reader never makes a dead holder look
    /// alive nor blocks a holder. Also refreshes [`PgLease::clock`]'s offset. A row edited by
    /// hand into something unusable is listed with its [`PgSession::problem`].
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the table cannot be read.
    pub fn sessions(&self, id: Option<&SessionId>) -> Result<Vec<PgSession>, Error> {
        let inner = &self.inner;
        let conn = inner.tx_conn(id)?;
        let sql = format!(
            "SELECT r.id, r.owner, r.token, r.expiry, EXISTS (SELECT 1 FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock' \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid::int8 = r.key AND l.objsubid = 2 \
             AND l.objid::int8 = (r.token & 4294967295)) \
             FROM {} r WHERE $1::text IS NULL OR r.id = $1 ORDER BY r.id",
            inner.configs.transition.table
        );
        let wanted = id.map(SessionId::as_str);
        let clock_sql = "SELECT clock_timestamp()";
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&wanted];
        let sent = inner.local_clock.now();
        let read = within(&inner.rt, conn.reply_bound, async {
            tokio::try_join!(
                conn.client.query(&sql, &params),
                conn.client.query_one(clock_sql, &[])
            )
        })
        .and_then(|r| r.map_err(Fail::Db));
        if read.as_ref().is_err_and(Fail::outcome_unknown) {
            // Its session ended rather than kept half-way through a read.
            conn.poison();
        }
        inner.give_back(conn);
        let (rows, clock) = read.map_err(|fail| fail.into_error("list the leases", id))?;
        let now = clock
            .try_get::<_, super::sqltime::SqlTime>(0)
            .ok()
            .and_then(|t| t.to_timestamp())
            .unwrap_or(Timestamp::MAX);
        if inner.clock.is_none() {
            // Read after the table, so ahead of the server's clock by at most the round trip.
            inner.measured(now, sent);
        }
        // A row edited by hand is reported as such; the others are listed all the same.
        let col = super::conn::mismatch;
        rows.iter()
            .map(|r| {
                let name: String = r.try_get(0).map_err(col)?;
                let (owner, token, expiry) = (
                    r.try_get(1).map_err(col)?,
                    r.try_get(2).map_err(col)?,
                    r.try_get(3).map_err(col)?,
                );
                let read = SessionId::new(name.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|sid| {
                        record_of(&sid, owner, token, expiry).map_err(|e| e.to_string())
                    });
                let (record, problem) = match read {
                    Ok(record) => (record, None),
                    Err(problem) => (None, Some(problem)),
                };
                Ok(PgSession {
                    record,
                    id: name,
                    live: r.try_get(4).map_err(col)?,
                    now,
                    problem,
                })
            })
            .collect()
    }
}
