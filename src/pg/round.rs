//! The waiting acquire's wait, and a transition's first and last round trips.

use std::time::{Duration, Instant};

use super::conn::{self, Conn, Fail, exec, within};
use super::fault::PgStep;
use super::sqltime::SqlTime;
use super::tx::gen_key;
use super::{Inner, row_record, schema};
use crate::error::Error;
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;

impl Inner {
    /// The transition's first round trip: `BEGIN`, the row locked and read, the server's
    /// clock read after the lock (with the server session's pid, checked against the
    /// connection's). Inserts the row first if missing.
    #[allow(clippy::type_complexity)]
    pub(super) fn begin(
        &self,
        id: &SessionId,
        conn: &Conn,
        probe: Option<Option<i64>>,
    ) -> Result<(i32, Option<Record>, Timestamp, Option<(i32, bool)>), Error> {
        let started = Instant::now();
        let map = |e: Fail| {
            if e.is_lock_timeout() {
                Error::RowLockTimeout {
                    id: id.clone(),
                    waited: started.elapsed(),
                }
            } else {
                e.into_error("lock the lease row", Some(id))
            }
        };
        let idp = id.as_str();
        let first = exec(&self.rt, &self.faults, PgStep::LockRow, conn, |c| {
            conn::lock_and_read(c, idp, probe)
        })
        .map_err(map)?;
        let (row, clock, probe) = match first.row {
            Some(row) => (row, first.clock, first.probe),
            None => {
                // First use of the id: insert a placeholder row to lock (outside the
                // transaction, so a concurrent first user's insert cannot abort ours), then
                // lock and read it as above.
                exec(
                    &self.rt,
                    &self.faults,
                    PgStep::InsertRow,
                    conn,
                    |c| async move {
                        c.client.execute(&c.stmts.rollback, &[]).await?;
                        c.client.execute(&c.stmts.insert_row, &[&id.as_str()]).await
                    },
                )
                .map_err(map)?;
                let again = exec(&self.rt, &self.faults, PgStep::LockRow, conn, |c| {
                    conn::lock_and_read(c, idp, probe)
                })
                .map_err(map)?;
                match again.row {
                    Some(row) => (row, again.clock, again.probe),
                    None => {
                        return Err(Error::CorruptRow {
                            id: id.clone(),
                            reason: "the row vanished right after its insert (deleted by hand?)"
                                .into(),
                        });
                    }
                }
            }
        };
        // The transaction's server session must be the connection's own: through a
        // transaction-mode pooler an acquire's generation lock, taken in this transaction,
        // would stay with a server connection that the pooler hands to other clients.
        let pid: i32 = clock.get(1);
        if pid != conn.pid {
            return Err(Error::SessionNotKept {
                detail: format!(
                    "a transaction ran in server session {pid}, the connection opened in \
                     session {}",
                    conn.pid
                ),
            });
        }
        let (key, record) = row_record(id, &row)?;
        let now = clock
            .get::<_, SqlTime>(0)
            .to_timestamp()
            .ok_or_else(|| Error::CorruptRow {
                id: id.clone(),
                reason: "the server's clock is outside the years 0001-9999".into(),
            })?;
        Ok((key, record, now, probe))
    }

    /// Ends a transition's transaction: rolls back what was not committed, and keeps the
    /// connection if it is sound.
    pub(super) fn end_tx(&self, conn: Conn, finished: bool) {
        if !finished && conn.reusable() {
            let rolled_back = within(
                &self.rt,
                conn.reply_bound,
                conn.client.execute(&conn.stmts.rollback, &[]),
            )
            .is_ok_and(|r| r.is_ok());
            if !rolled_back {
                conn.poison();
            }
        }
        self.give_back(conn);
    }

    /// Waits until the holder of `id`'s recorded generation is gone, its expiry passes, or
    /// `left` runs out (whichever first); returns at once if nobody seems to hold it.
    pub(super) fn wait_for_holder(
        &self,
        id: &SessionId,
        left: Option<Duration>,
    ) -> Result<(), Error> {
        let conn = self.tx_conn(Some(id))?;
        let db = |e: tokio_postgres::Error| Fail::Db(e).into_error("wait for the holder", Some(id));
        let peek_sql = format!(
            "SELECT key, owner, token, expiry FROM {} WHERE id = $1",
            schema::TABLE
        );
        let idp = id.as_str();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&idp];
        let peek = within(&self.rt, conn.reply_bound, async {
            tokio::try_join!(
                conn.client.execute(&conn.stmts.begin, &[]),
                conn.client.query_opt(&peek_sql, &params),
                conn.client.query_one(&conn.stmts.clock, &[]),
            )
        });
        let mut finished = false;
        let result = match peek {
            Err(fail) => {
                conn.poison();
                Err(fail.into_error("wait for the holder", Some(id)))
            }
            Ok(Err(e)) => Err(db(e)),
            Ok(Ok((_, None, _))) => Ok(()),
            Ok(Ok((_, Some(row), clock))) => {
                let (key, record) = row_record(id, &row)?;
                let now = clock.get::<_, SqlTime>(0).to_timestamp();
                let waiting = match (record, now) {
                    (Some(r), Some(now)) => crate::machine::wait_for(&r, now),
                    _ => None,
                };
                match waiting {
                    Some(crate::machine::Wait {
                        token,
                        until_expiry,
                    }) => {
                        let wait = left.map_or(until_expiry, |l| l.min(until_expiry));
                        let ms = format!("{}ms", wait.as_millis().clamp(1, i32::MAX as u128));
                        let gk = gen_key(token);
                        let p1: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ms];
                        let p2: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &gk];
                        // The ROLLBACK is pipelined too: it ends the wait's transaction (and
                        // drops its shared lock) as soon as the wait returns.
                        // The server ends the wait at `wait`; a server that does not is stuck.
                        let bound = wait.saturating_add(conn.reply_bound);
                        let waited = within(&self.rt, bound, async {
                            tokio::join!(
                                conn.client.query_one(&conn.stmts.wait_timeout, &p1),
                                conn.client.execute(&conn.stmts.wait, &p2),
                                conn.client.execute(&conn.stmts.rollback, &[]),
                            )
                        });
                        match waited {
                            Err(fail) => {
                                conn.poison();
                                Err(fail.into_error("wait for the holder", Some(id)))
                            }
                            Ok((timeout_set, lock, rollback)) => {
                                finished = rollback.is_ok();
                                match (timeout_set, lock) {
                                    (Ok(_), Ok(_)) => Ok(()),
                                    (Err(e), _) | (_, Err(e)) => {
                                        // The holder's expiry (or the caller's deadline) came
                                        // first.
                                        let fail = Fail::Db(e);
                                        if fail.is_lock_timeout() {
                                            Ok(())
                                        } else {
                                            Err(fail.into_error("wait for the holder", Some(id)))
                                        }
                                    }
                                }
                            }
                        }
                    }
                    None => Ok(()),
                }
            }
        };
        self.end_tx(conn, finished);
        result
    }
}
