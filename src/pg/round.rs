//! A transition's first round trip (with a waiting acquire's wait ahead of it) and its end.

use std::time::{Duration, Instant};

use super::conn::{self, Conn, Fail, HolderWait, within};
use super::fault::PgStep;
use super::sqltime::{SqlTime, truncate_to_micros};
use super::tx::{First, IdState, LiveGen, TxData};
use super::{Inner, row_record};
use crate::error::Error;
use crate::name::SessionId;

impl Inner {
    /// The transition's first round trip: `BEGIN`, the row locked and read, the server's
    /// clock read after the lock (with the server session's pid, checked against the
    /// connection's), and the lease clock's time once the row is locked. Inserts the row first
    /// if missing.
    pub(super) fn first_round(
        &self,
        id: &SessionId,
        conn: &Conn,
        probe: Option<Option<i64>>,
        wait: Option<HolderWait>,
        lock_left: Option<Duration>,
    ) -> Result<First, Error> {
        let sent = self.local_clock.now();
        let started = Instant::now();
        let map = |e: Fail| {
            if e.is_lock_timeout() {
                Error::LockTimeout {
                    lock: crate::error::LockOf::Row(id.clone()),
                    // After a wait for a holder, only the server's bound is known.
                    waited: wait.map_or_else(|| started.elapsed(), |_| self.lock_timeout),
                }
            } else {
                e.into_error("lock the lease row", Some(id))
            }
        };
        let idp = id.as_str();
        // A wait ahead of the round trip adds its own length to the reply's bound.
        let bound = wait.map_or(conn.reply_bound, |w| {
            w.wait.saturating_add(conn.reply_bound)
        });
        let first = self
            .exec_within(PgStep::LockRow, conn, bound, |c| {
                conn::lock_and_read(c, idp, probe, wait, lock_left)
            })
            .map_err(map)?;
        let arrived = first.arrived;
        let (row, clock, probe) = match first.row {
            Some(row) => (row, first.clock, first.probe),
            None => {
                // First use of the id: insert a placeholder row to lock (outside the
                // transaction, so a concurrent first user's insert cannot abort ours), then
                // lock and read it as above.
                self.exec(PgStep::InsertRow, conn, |c| async move {
                    c.client.execute(&c.stmts.rollback, &[]).await?;
                    c.client.execute(&c.stmts.insert_row, &[&id.as_str()]).await
                })
                .map_err(map)?;
                let again = self
                    .exec(PgStep::LockRow, conn, |c| {
                        conn::lock_and_read(c, idp, probe, None, lock_left)
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
        let (pid, ours): (i32, bool) = (
            clock.try_get(1).map_err(super::conn::mismatch)?,
            clock.try_get(2).map_err(super::conn::mismatch)?,
        );
        if pid != conn.pid || !ours {
            // Rolled back, then closed at the end of the transition, never pooled; and
            // neither session is ended on its account (both may serve other clients).
            conn.disown();
            return Err(Error::SessionNotKept {
                detail: format!(
                    "a transaction ran in server session {pid} ({} this connection's mark), \
                     the connection opened in session {}",
                    if ours { "with" } else { "without" },
                    conn.pid
                ),
            });
        }
        let (key, record) = row_record(id, &row)?;
        let now = clock
            .try_get::<_, SqlTime>(0)
            .map_err(super::conn::mismatch)?
            .to_timestamp()
            .ok_or_else(|| Error::CorruptRow {
                id: id.clone(),
                reason: "the server's clock is outside the years 0001-9999".into(),
            })?;
        if wait.is_none() {
            // A wait for a holder ahead of the round trip says nothing of the clocks' offset.
            self.measured(arrived.to_timestamp().unwrap_or(now), sent);
        }
        Ok(First {
            key,
            record,
            now: match &self.clock {
                Some(c) => truncate_to_micros(c.now()),
                None => now,
            },
            probed: probe,
            read_at: Instant::now(),
        })
    }

    /// Ends a run's transaction: the connection becomes the new generation's liveness
    /// connection if the commit took its lock there, else the transaction ends
    /// ([`Inner::end_tx`]).
    pub(super) fn end_run(&self, state: &mut IdState, conn: Conn, data: TxData) {
        match (data.adopt_here, data.first) {
            (Some(local), Some(first)) => {
                state.local = Some(LiveGen {
                    local,
                    key: first.key,
                    conn,
                });
            }
            _ => self.end_tx(conn, data.finished),
        }
    }

    /// Ends a transition's transaction: rolls back what was not committed, and keeps the
    /// connection if it is sound.
    pub(super) fn end_tx(&self, conn: Conn, finished: bool) {
        if !finished && conn.answers() {
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
}
