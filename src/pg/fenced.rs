//! Fenced sections on PostgreSQL: the caller's statements in a transaction that holds the
//! lease row locked in share mode, so a takeover (which locks the row for update) cannot
//! commit until the section has, and the section commits only if the lease was the caller's
//! throughout.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::conn::Conn;
use super::fault::PgStep;
use super::sqltime::{SqlTime, truncate_to_micros};
use super::{Inner, PgLease, row_record};
use crate::error::Error;
use crate::lease::Lease;
use crate::machine;
use crate::timestamp::Timestamp;

/// The transaction of a fenced section ([`PgLease::fenced`]): run the statements whose
/// effects must be the lease holder's alone. They commit together at the section's end, only
/// if the lease was still the caller's and unexpired then.
pub struct PgFenced<'a> {
    inner: &'a Inner,
    conn: &'a Conn,
    lease: &'a Lease,
}

impl std::fmt::Debug for PgFenced<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgFenced")
            .field("lease", self.lease)
            .finish_non_exhaustive()
    }
}

/// Whether `sql` is a statement that ends or restarts the transaction (`COMMIT`, `END`,
/// `ROLLBACK` other than `ROLLBACK TO`, `ABORT`, `BEGIN`, `START`, `PREPARE TRANSACTION`): in a
/// fenced section its later statements would run outside the fence. Leading blanks and
/// comments are skipped; a savepoint is fine.
pub(crate) fn controls_transaction(sql: &str) -> bool {
    let mut rest = sql;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    let mut words = rest
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase);
    match (words.next().as_deref(), words.next().as_deref()) {
        (Some("COMMIT" | "END" | "ABORT" | "BEGIN" | "START"), _) => true,
        (Some("ROLLBACK"), Some("TO")) => false,
        (Some("ROLLBACK"), _) => true,
        (Some("PREPARE"), Some("TRANSACTION")) => true,
        _ => false,
    }
}

impl PgFenced<'_> {
    /// The refusal of a statement that would end the section's transaction.
    fn refuse(&self, sql: &str) -> Result<(), Error> {
        if controls_transaction(sql) {
            return Err(Error::Database {
                op: "run a fenced statement",
                id: Some(self.lease.session_id.clone()),
                source: format!(
                    "refused: '{}' ends or restarts the section's transaction, and what came \
                     after it would run unfenced (the section commits by itself when the \
                     closure returns Ok)",
                    sql.trim()
                )
                .into(),
            });
        }
        Ok(())
    }

    /// Runs one statement in the section's transaction; returns the rows it changed.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with the server's message (the section then rolls back), or
    /// without sending it when it would end the transaction (`COMMIT`, `ROLLBACK`, …).
    pub fn execute(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, Error> {
        self.refuse(sql)?;
        self.inner
            .exec(PgStep::Fenced, self.conn, |c| c.client.execute(sql, params))
            .map_err(|e| e.into_error("run a fenced statement", Some(&self.lease.session_id)))
    }

    /// Runs one query in the section's transaction; returns its rows.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] with the server's message (the section then rolls back), or
    /// without sending it when it would end the transaction (`COMMIT`, `ROLLBACK`, …).
    pub fn query(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Error> {
        self.refuse(sql)?;
        self.inner
            .exec(PgStep::Fenced, self.conn, |c| c.client.query(sql, params))
            .map_err(|e| e.into_error("run a fenced query", Some(&self.lease.session_id)))
    }

    /// The lease the section runs for (its token fences the statements).
    pub fn lease(&self) -> &Lease {
        self.lease
    }
}

impl PgLease {
    /// Runs `f`'s statements as a **fenced section** of `lease`, in one transaction on the
    /// lease's database: they commit only if the lease was this instance's from the section's
    /// start to its commit, and no takeover can commit in between. Returns `Ok(None)`, with
    /// nothing committed, when the lease was not held here at the start (taken over,
    /// released, expired, or not held by this instance) or expired by the end.
    ///
    /// The transaction first locks the lease row `FOR SHARE` and reads it with the server's
    /// clock; the machine checks that the row names the lease, unexpired, and that this
    /// instance holds the generation. A takeover locks the row `FOR UPDATE`, so it waits until
    /// the section commits or rolls back (then, if the lease expired meanwhile, it takes
    /// over; the section did not commit). Before `COMMIT` the server's clock is read again
    /// and the machine checks the expiry once more. This makes "exactly one writer" true for
    /// data in the same database, not only "tokens ordered".
    ///
    /// **Cost:** two round trips more than the caller's statements (the row's share lock with
    /// the clock; the clock again, then `COMMIT`). Every transition on the id, this
    /// instance's own renew included, waits for the section (up to its `lock_timeout`, then
    /// [`Error::LockTimeout`]): keep sections short, well below the lock timeout and the
    /// lease's time left. A section left idle by a stopped client is ended by the server
    /// after the idle-in-transaction bound (see the [module documentation](super)).
    ///
    /// # Errors
    ///
    /// `f`'s error, or [`Error::Database`] from a statement (the section rolls back);
    /// [`Error::FencedCommitUnknown`] when the `COMMIT`'s reply was lost, or it was answered
    /// with a warning and the synchronous standbys did not confirm it: the writes may have
    /// committed (if so, while the lease was the caller's), and running the section again may
    /// write them twice.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use flocklease::pg::PgLease;
    /// use flocklease::{Owner, SessionId, SessionLease};
    ///
    /// # fn main() -> Result<(), flocklease::Error> {
    /// let leases = PgLease::connect("host=db.internal user=jobs dbname=jobs")?;
    /// let lease = leases.acquire(&SessionId::new("billing")?, &Owner::new("host-a")?)?.lease().unwrap();
    /// let done = leases.fenced(&lease, |tx| {
    ///     tx.execute("UPDATE invoices SET sent = true WHERE batch = $1", &[&42i64])
    /// })?;
    /// if done.is_none() {
    ///     eprintln!("lease lost: nothing written");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn fenced<T>(
        &self,
        lease: &Lease,
        f: impl FnOnce(&mut PgFenced<'_>) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        let inner = &self.inner;
        let id = &lease.session_id;
        let conn = inner.tx_conn(Some(id))?;
        let out = self.fenced_on(&conn, lease, f);
        // Anything but a commit rolls back (a lost lease, an error).
        inner.end_tx(conn, matches!(out, Ok(Some(_))));
        out
    }

    fn fenced_on<T>(
        &self,
        conn: &Conn,
        lease: &Lease,
        f: impl FnOnce(&mut PgFenced<'_>) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        let inner = &self.inner;
        let id = &lease.session_id;
        let idp = id.as_str();
        let sql = format!(
            "SELECT key, owner, token, expiry, clock_timestamp(), now() FROM {} WHERE id = $1 \
             FOR SHARE",
            inner.configs.transition.table
        );
        let params: [&(dyn ToSql + Sync); 1] = [&idp];
        let first = inner
            .exec(PgStep::Fenced, conn, |c| async move {
                let (begun, row) = tokio::join!(
                    c.client.execute(&c.stmts.begin, &[]),
                    c.client.query_opt(&sql, &params),
                );
                begun?;
                row
            })
            .map_err(|e| {
                if e.is_lock_timeout() {
                    Error::LockTimeout {
                        lock: crate::error::LockOf::Row(id.clone()),
                        waited: inner.lock_timeout,
                    }
                } else {
                    e.into_error("lock the lease row for a fenced section", Some(id))
                }
            })?;
        let record = match &first {
            Some(row) => row_record(id, row)?.1,
            None => None,
        };
        // A timestamp the server read, if the row has it.
        let read_at = |row: Option<&Row>, col: usize| {
            row.and_then(|r| r.try_get::<_, SqlTime>(col).ok()?.to_timestamp())
        };
        let clock_at = |row: Option<&Row>, col: usize| match &inner.clock {
            Some(c) => truncate_to_micros(c.now()),
            None => read_at(row, col).unwrap_or(Timestamp::MAX),
        };
        let held_here = self.holds_here(lease);
        let now = clock_at(first.as_ref(), 4);
        if !machine::fence_holds(record.as_ref(), &lease.owner, lease.token, held_here, now) {
            return Ok(None);
        }
        let out = f(&mut PgFenced { inner, conn, lease })?;
        // The row cannot have changed (it is locked in share mode): only the clock can have
        // moved past the expiry.
        let clock = inner
            .exec(PgStep::Fenced, conn, |c| {
                c.client.query_one("SELECT clock_timestamp(), now()", &[])
            })
            .map_err(|e| e.into_error("read the clock before a fenced commit", Some(id)))?;
        // `now()` is the transaction's start: another value means the closure ended the
        // section's transaction (a statement the refusal did not recognise).
        if read_at(first.as_ref(), 5) != read_at(Some(&clock), 1) {
            return Err(Error::Database {
                op: "commit a fenced section",
                id: Some(id.clone()),
                source: "the closure ended the section's transaction (COMMIT or ROLLBACK): \
                         what it wrote after that ran unfenced"
                    .into(),
            });
        }
        let now = clock_at(Some(&clock), 0);
        if !machine::fence_holds(record.as_ref(), &lease.owner, lease.token, held_here, now) {
            return Ok(None);
        }
        let unknown = |detail: String| Error::FencedCommitUnknown {
            id: id.clone(),
            token: lease.token,
            detail,
        };
        let warned = conn.warnings.count();
        match inner.exec(PgStep::Commit, conn, |c| {
            c.client.execute(&c.stmts.commit, &[])
        }) {
            Ok(_) if conn.warnings.count() != warned => {
                // Success with a warning: a cancelled wait for the synchronous standbys
                // leaves the commit on this server alone, maybe (as for a transition's).
                let warning = conn.warnings.last();
                self.confirmed(conn).map(|()| Some(out)).map_err(|detail| {
                    unknown(format!(
                        "the server answered the COMMIT with success and the warning \
                             '{warning}'; {detail}"
                    ))
                })
            }
            Ok(_) => Ok(Some(out)),
            Err(e) if e.outcome_unknown() => Err(unknown(format!(
                "the reply to its COMMIT was lost: {}",
                e.into_error("commit a fenced section", Some(id))
            ))),
            Err(e) => Err(e.into_error("commit a fenced section", Some(id))),
        }
    }

    /// Whether the synchronous standbys confirmed what `conn`'s session committed (its WAL
    /// position now is at or past the commit record): see [`super::tx::judge_reread`].
    fn confirmed(&self, conn: &Conn) -> Result<(), String> {
        let inner = &self.inner;
        let wal = inner
            .exec(PgStep::Reread, conn, |c| {
                c.client.query_one(super::durable::WAL_POSITION, &[])
            })
            .map_err(|e| {
                format!(
                    "the WAL position could not be read: {}",
                    e.into_error("read the WAL position", None)
                )
            })?;
        // The section's own commit, on the server (its reply came): only its durability is
        // in question.
        match super::tx::judge_reread(inner, conn, &wal, true)? {
            true => Ok(()),
            false => Err("the server did not show the section's commit".to_owned()),
        }
    }

    /// Whether this instance holds `lease`'s generation (its liveness lock).
    fn holds_here(&self, lease: &Lease) -> bool {
        let entry = self.entry(&lease.session_id);
        let state = super::conn::lock(&entry.state);
        state.local.as_ref().is_some_and(|g| {
            g.local.token == lease.token && g.local.owner == lease.owner && g.conn.answers()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::controls_transaction;

    #[test]
    fn transaction_control_is_recognised() {
        for sql in [
            "COMMIT",
            "commit;",
            "  End",
            "ROLLBACK",
            "rollback and chain",
            "ABORT",
            "BEGIN",
            "start transaction",
            "PREPARE TRANSACTION 'x'",
            "-- done\nCOMMIT",
            "/* a */ /* b */ commit",
        ] {
            assert!(controls_transaction(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "ROLLBACK TO SAVEPOINT a",
            "rollback to a",
            "SAVEPOINT a",
            "RELEASE SAVEPOINT a",
            "PREPARE q AS SELECT 1",
            "SELECT 'COMMIT'",
            "UPDATE ending SET x = 1",
            "-- COMMIT\nSELECT 1",
            "",
        ] {
            assert!(!controls_transaction(sql), "{sql}");
        }
    }
}
