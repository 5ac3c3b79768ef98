//! The transaction: the primitive steps of one transition on the lease row and advisory locks,
//! done while the row is locked, for [`driver::run`](crate::driver::run).

use std::time::{Duration, Instant};

use super::Inner;
use super::conn::{self, Conn, Fail};
use super::durable;
use super::fault::PgStep;
use super::sqltime::SqlTime;
use crate::driver::{Begun, CommitStep, Grain, Transaction};
use crate::error::Error;
use crate::machine::{Cleanup, Liveness, Local, Plan};
use crate::name::SessionId;
use crate::record::Record;
use crate::timestamp::Timestamp;
use tokio_postgres::Row;

/// What this instance holds for one id.
#[derive(Default)]
pub struct IdState {
    pub(super) local: Option<LiveGen>,
    /// What the last acquire answered held waits for next (for `PgLease::acquire_wait`):
    /// the holder's generation and the wait, as of the instant the row was read.
    pub(super) waited: Option<(super::conn::HolderWait, std::time::Instant)>,
}

impl crate::front::Idle for IdState {
    fn idle(&self) -> bool {
        self.local.is_none()
    }
}

/// A generation this instance holds: its liveness connection keeps the session advisory lock
/// `(key, token mod 2^32)` for the generation's whole life.
pub(super) struct LiveGen {
    pub(super) local: Local,
    pub(super) key: i32,
    pub(super) conn: Conn,
}

/// The second advisory-lock key of generation `token`.
pub(super) fn gen_key(token: u64) -> i32 {
    // Wraps at 2^32 on purpose: two live generations 2^32 apart cannot coexist.
    token as u32 as i32
}

/// A new generation's liveness lock, planned and not yet adopted. It is taken by the commit
/// statement itself (see [`PgTx::commit`]), on the transaction's own connection: an acquire's
/// transaction runs on the idle liveness connection that is to hold its new generation. So the
/// lock is held before the commit, as the driver's schedule requires, without a round trip of
/// its own.
pub struct PendingLive;

/// Where a planned generation lock stands on the transaction's connection.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) enum LiveLock {
    /// None planned, or the commit statement found it busy.
    #[default]
    None,
    /// Planned: the commit statement will take it.
    Planned(u64),
    /// Taken by the commit statement: the transaction's session holds it.
    Held,
    /// The commit statement may have taken it (it failed, or its reply never came).
    Unknown,
}

/// What the commit statement answered, once its `COMMIT` succeeded.
enum Reply {
    /// The connection's statement ran in another server session than the one it marked (a
    /// pooler): nothing was tried, nothing committed.
    OtherSession,
    /// The row update ran: `lock` says whether the new generation's lock was granted (always
    /// with none planned; refused, the update changed nothing), `rows` how many rows it
    /// changed.
    Updated {
        /// The new generation's lock was granted (or none was planned).
        lock: bool,
        /// Rows the update changed (0: the row vanished).
        rows: u64,
    },
}

/// The transition's first round trip: the row locked and read, with the server's clock.
pub(super) struct First {
    /// The row's advisory key.
    pub(super) key: i32,
    pub(super) record: Option<Record>,
    /// The lease clock's time, read with the row locked.
    pub(super) now: crate::Timestamp,
    /// The speculative probe: `(generation key, free)`.
    pub(super) probed: Option<(i32, bool)>,
    /// When the row was read, on this host's monotonic clock.
    pub(super) read_at: Instant,
}

/// What one transition carries from step to step (a stepper keeps it between its calls).
#[derive(Default)]
pub(crate) struct TxData {
    /// The first round trip, once made: by the front when it waited for a holder first, else
    /// by [`Transaction::begin`].
    pub(super) first: Option<First>,
    /// What `begin` sends: the speculative probe (an acquire's), and the row lock's wait (else
    /// the session's `lock_timeout`).
    pub(super) ask: (Option<Option<i64>>, Option<Duration>),
    /// Whether the transaction is over (committed, or its commit resolved).
    pub(super) finished: bool,
    /// The new generation's lock on the connection, if one is planned.
    pub(super) live: LiveLock,
    /// The adopted generation, when the connection holds its lock: it is kept as the
    /// generation's liveness connection once the transaction is over.
    pub(super) adopt_here: Option<Local>,
    /// A fresh liveness connection holding the new generation, when the lock taken by a
    /// commit whose reply was lost had to be taken again (see [`PgTx::restore_live`]).
    pub(super) relocked: Option<Conn>,
}

/// One transition's transaction on `conn`.
pub struct PgTx<'a> {
    pub(super) inner: &'a Inner,
    pub(super) id: &'a SessionId,
    pub(super) conn: &'a mut Conn,
    pub(super) state: &'a mut IdState,
    pub(super) d: &'a mut TxData,
}

impl PgTx<'_> {
    /// The row's advisory key (read by the first round trip).
    fn key(&self) -> i32 {
        self.d.first.as_ref().map_or(0, |f| f.key)
    }

    /// After a `COMMIT` whose reply never came: re-reads the row under its lock on another
    /// connection and says whether it holds `record` durably (then the commit happened). The
    /// session that sent the `COMMIT` must be gone first, or the re-read would wait for its row
    /// lock: if it broke, the server ends it; if it only stopped answering (`stuck`), it is
    /// ended here, and the outcome stays unknown unless the server confirms that. A record
    /// found on the server counts only once the synchronous standbys that must confirm commits
    /// have confirmed the WAL position read with it ([`durable::verdict`]): ending a session
    /// that waits for them keeps its commit on this server alone. They are asked again until
    /// the reply bound; then the outcome is unknown.
    fn committed_anyway(&self, record: &Record, stuck: bool) -> Result<bool, Error> {
        let unknown = |detail: String| Error::CommitUnknown {
            id: self.id.clone(),
            detail,
        };
        if stuck && !self.inner.terminate(self.conn) {
            return Err(unknown(format!(
                "the server did not answer, and its session {} could not be confirmed ended",
                self.conn.pid
            )));
        }
        let conn = self
            .inner
            .tx_conn(Some(self.id))
            .map_err(|e| unknown(format!("no connection to re-read the row: {e}")))?;
        let id = self.id;
        let read = self.inner.exec(PgStep::Reread, &conn, |c| async move {
            c.client.execute(&c.stmts.begin, &[]).await?;
            let row = c
                .client
                .query_opt(&c.stmts.lock_row, &[&id.as_str()])
                .await?;
            let wal = c.client.query_one(durable::WAL_POSITION, &[]).await?;
            c.client.execute(&c.stmts.rollback, &[]).await?;
            Ok((row, wal))
        });
        let (row, wal) = match read {
            Ok(read) => read,
            Err(e) => {
                // A commit may have happened: never reported as contention or a plain failure.
                let detail = format!(
                    "the re-read of the row failed: {}",
                    e.into_error("re-read the row", Some(self.id))
                );
                self.inner.end_tx(conn, false);
                return Err(unknown(detail));
            }
        };
        let ours = match row {
            Some(row) => super::row_record(self.id, &row)?.1.as_ref() == Some(record),
            None => false,
        };
        let judged = judge_reread(self.inner, &conn, &wal, ours);
        self.inner.give_back(conn);
        judged.map_err(unknown)
    }

    /// After a commit whose reply never came but which did commit `record`, generation
    /// `token`: its lock, taken by that commit statement, is in a session whose connection was
    /// given up. Ends that session, then locks the generation again on a fresh liveness
    /// connection, under the row lock and only if the row still holds `record` (between the
    /// two, the generation looks dead and a rival may take over). If that fails, the
    /// generation is adopted with its connection closed: its holder is told of the loss at
    /// once, and its next renew locks it again if nobody took over
    /// (`PgTx::ensure_live`).
    fn restore_live(&mut self, record: &Record, token: u64) {
        // Whether or not the server confirms the end (the session may be gone already), the
        // lock attempt below says whether the old session still holds the generation.
        self.inner.terminate(self.conn);
        self.d.relocked = self
            .inner
            .relock_if_named(self.id, self.key(), record, token);
        if self.d.relocked.is_none() {
            self.conn.shut();
        }
    }
}

impl Transaction for PgTx<'_> {
    type Pending = PendingLive;

    fn grain(&self) -> Grain {
        Grain::Statement
    }

    fn begin(&mut self) -> Result<Begun, Error> {
        // The row lock, the record and the server's clock: one round trip, unless the front
        // made it already (it waited for a holder first).
        if self.d.first.is_none() {
            let (probe, left) = self.d.ask;
            let first = self
                .inner
                .first_round(self.id, self.conn, probe, None, left)?;
            self.d.first = Some(first);
        }
        let first = self
            .d
            .first
            .as_ref()
            .expect("the first round trip was made");
        Ok(Begun {
            now: first.now,
            record: first.record.clone(),
            local: self.state.local.as_ref().map(|g| g.local.clone()),
        })
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        // A shared try-lock, released at the end of the transaction: the holder's exclusive
        // session lock excludes it; another probe or a waiter (shared too) does not, so a
        // probe never makes a dead holder look alive to anyone else. It runs in the transition's
        // transaction, never on a connection holding a generation (advisory locks are
        // re-entrant): an acquire's runs on a pooled liveness connection, which holds none.
        let (key, gk) = (self.key(), gen_key(token));
        let free = match self.d.first.as_ref().and_then(|f| f.probed) {
            // Probed in the first round trip, under the row lock (the row is unchanged since).
            Some((probed, free)) if probed == gk => free,
            _ => self
                .inner
                .exec(PgStep::Probe, self.conn, |c| async move {
                    c.client.query_one(&c.stmts.probe, &[&key, &gk]).await
                })
                .map_err(|e| e.into_error("probe the holder's liveness lock", Some(self.id)))?
                .try_get::<_, bool>(0)
                .map_err(super::conn::mismatch)?,
        };
        Ok(if free { Liveness::Dead } else { Liveness::Live })
    }

    fn commit_step(&mut self, step: CommitStep, plan: &Plan) -> Result<Option<PendingLive>, Error> {
        let live = plan.new_generation().map(|g| g.token);
        match (step, &plan.commit) {
            (CommitStep::EnsureLive, _) => {
                self.ensure_live(plan.prepared_token().expect("a planned generation"))?;
                Ok(None)
            }
            (CommitStep::Point, Some(record)) => {
                self.commit(record, live)?;
                Ok(live.map(|_| PendingLive))
            }
            _ => unreachable!("a commit step the statement grain does not list"),
        }
    }

    fn undo(&mut self, _pending: Option<PendingLive>) {
        if matches!(self.d.live, LiveLock::Held | LiveLock::Unknown) {
            // The transaction's session may hold it: the connection is ended, not pooled, at
            // the end of the transition, and the lock with it.
            self.conn.poison();
        }
        self.d.live = LiveLock::None;
    }

    fn cleanup(&mut self, step: &Cleanup) {
        // Advisory locks leave no file behind, and a dead session's vanish with it: closing a
        // generation is the one cleanup.
        if let Cleanup::CloseLocal { token } = *step {
            self.close_local(token);
        }
    }

    fn adopt(&mut self, _pending: PendingLive, local: Local) {
        match self.d.relocked.take() {
            Some(conn) => {
                self.state.local = Some(LiveGen {
                    local,
                    key: self.key(),
                    conn,
                });
            }
            // The transaction's connection holds it (or held it, when its commit's reply was
            // lost and it could not be taken again).
            None => self.d.adopt_here = Some(local),
        }
        self.d.live = LiveLock::None;
    }
}

impl PgTx<'_> {
    /// A fault injected at [`PgStep::LockLive`]: the commit statement's lock failing (an
    /// error from the server, or the lock taken and its reply lost).
    fn check_lock_live(&mut self, token: u64) -> Result<(), Error> {
        let (key, gk) = (self.key(), gen_key(token));
        if let Some(fault) = self.inner.faults.check(PgStep::LockLive, self.conn.pid) {
            let fail = conn::inject(&self.inner.rt, fault, self.conn, |c| async move {
                c.client
                    .query_one(&c.stmts.lock_live, &[&key, &gk, &c.nonce])
                    .await
            });
            return Err(fail.into_error("lock the generation's liveness lock", Some(self.id)));
        }
        Ok(())
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        let key = self.key();
        let Some(generation) = self.state.local.as_mut() else {
            return Ok(());
        };
        if generation.local.token != token || generation.conn.reusable() {
            return Ok(());
        }
        // The liveness connection ended while the holder ran. The record still names this
        // generation (the machine checked), so nobody took over: lock it again on a fresh
        // connection. If the old session still holds it (not yet ended on the server), this
        // fails and a later renew retries.
        let conn = self.inner.lock_generation(self.id, key, token)?;
        generation.conn = conn;
        Ok(())
    }

    /// The commit point: the new generation's lock (when `live` names one), the UPDATE and
    /// the COMMIT, pipelined in one round trip; an unknown outcome resolved by a re-read.
    fn commit(&mut self, record: &Record, live: Option<u64>) -> Result<(), Error> {
        if let Some(token) = live {
            self.d.live = LiveLock::Planned(token);
            self.check_lock_live(token)?;
        }
        let token = record.token as i64; // the u64's bits (see the schema)
        let expiry = SqlTime::from_timestamp(record.expiry);
        let key = self.key();
        // Counted before the round trip: a warning that arrives with the COMMIT's reply is
        // counted before the reply is handed over (see `tls::drive`).
        let warned = self.conn.warnings.count();
        // UPDATE (with the new generation's lock, if planned) and COMMIT pipelined: one round
        // trip. If the UPDATE fails, the server turns the COMMIT into a rollback, and the
        // UPDATE's error is the one reported. With a lock, the statement updates the row only
        // if the lock was granted; then the transaction commits nothing else.
        let done = self.inner.exec(PgStep::Commit, self.conn, |c| async move {
            match live {
                None => {
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                        [&key, &record.owner, &token, &expiry];
                    let (updated, committed) = tokio::join!(
                        c.client.execute(&c.stmts.update, &params),
                        c.client.execute(&c.stmts.commit, &[]),
                    );
                    let rows = updated?;
                    committed?;
                    Ok(Reply::Updated { lock: true, rows })
                }
                Some(t) => {
                    let gk = gen_key(t);
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
                        [&key, &record.owner, &token, &expiry, &gk, &c.nonce];
                    let (updated, committed) = tokio::join!(
                        c.client.query_one(&c.stmts.commit_live, &params),
                        c.client.execute(&c.stmts.commit, &[]),
                    );
                    let row = updated?;
                    committed?;
                    if !row.try_get::<_, bool>(2)? {
                        return Ok(Reply::OtherSession);
                    }
                    Ok(Reply::Updated {
                        lock: row.try_get::<_, bool>(0)?,
                        rows: row.try_get::<_, i64>(1)? as u64,
                    })
                }
            }
        });
        match done {
            Ok(Reply::OtherSession) => {
                // Committed nothing (the row update depended on the lock); the connection's
                // own session may serve other clients: closed, never ended on its account.
                self.d.finished = true;
                self.d.live = LiveLock::None;
                self.conn.disown();
                Err(Error::SessionNotKept {
                    detail: format!(
                        "the generation's lock was to be taken in another server session than \
                         session {}, which this connection marked",
                        self.conn.pid
                    ),
                })
            }
            Ok(Reply::Updated { lock: got, rows }) => {
                self.d.finished = true;
                if let Some(t) = live {
                    self.d.live = if got { LiveLock::Held } else { LiveLock::None };
                    if !got {
                        // Held by a session of an earlier, failed takeover (still ending), or
                        // taken by hand: nothing was committed.
                        return Err(Error::AdvisoryLockBusy {
                            id: self.id.clone(),
                            token: t,
                        });
                    }
                }
                if rows == 0 {
                    return Err(Error::CorruptRow {
                        id: self.id.clone(),
                        reason: "the locked row vanished (deleted by hand?)".into(),
                    });
                }
                if self.conn.warnings.count() != warned {
                    // A success that came with a warning: PostgreSQL answers a COMMIT whose
                    // wait for the synchronous standbys was cancelled (`pg_cancel_backend`)
                    // with success, and the commit may be on this server alone. The same
                    // check as for a lost reply: the standbys must confirm it.
                    return self.confirmed_after_warning(record);
                }
                Ok(())
            }
            Err(e) if e.outcome_unknown() => {
                // The connection broke, or the server stopped answering, during COMMIT: it may
                // have committed. Report an error only if the row does not hold what we
                // committed.
                self.d.finished = true;
                if live.is_some() {
                    self.d.live = LiveLock::Unknown;
                }
                let stuck = matches!(e, Fail::NoReply(_));
                if self.committed_anyway(record, stuck)? {
                    if let Some(t) = live {
                        self.restore_live(record, t);
                    }
                    Ok(())
                } else {
                    Err(e.into_error("commit", Some(self.id)))
                }
            }
            Err(e) => {
                if live.is_some() {
                    // The server answered an error, possibly after the lock was granted (a
                    // session lock outlives its transaction's rollback).
                    self.d.live = LiveLock::Unknown;
                }
                Err(e.into_error("commit", Some(self.id)))
            }
        }
    }

    /// After a `COMMIT` answered with success and a warning: the commit happened on this
    /// server (its row lock is released), and counts once the synchronous standbys that must
    /// confirm it have ([`PgTx::committed_anyway`], whose re-read needs no session ended);
    /// else [`Error::CommitUnknown`], the server's warning in its detail.
    fn confirmed_after_warning(&mut self, record: &Record) -> Result<(), Error> {
        let warning = self.conn.warnings.last();
        let said = |detail: &str| {
            format!(
                "the server answered the COMMIT with success and the warning '{warning}'; {detail}"
            )
        };
        match self.committed_anyway(record, false) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::CommitUnknown {
                id: self.id.clone(),
                detail: said("the row no longer holds what it committed"),
            }),
            Err(Error::CommitUnknown { id, detail }) => Err(Error::CommitUnknown {
                id,
                detail: said(&detail),
            }),
            Err(e) => Err(e),
        }
    }

    fn close_local(&mut self, token: u64) {
        if self
            .state
            .local
            .as_ref()
            .is_some_and(|g| g.local.token == token)
            && let Some(generation) = self.state.local.take()
        {
            generation.conn.ended.clear();
            self.inner
                .unlock_and_pool(generation.conn, generation.key, token);
        }
    }
}

/// What a re-read after a commit whose reply never came proves (or, for a fenced section's
/// commit whose reply came, whether it is durable), as [`durable::verdict`] judges it:
/// `Ok(false)` when the row did not hold our record (`ours`: nothing was committed),
/// `Ok(true)` once the synchronous standbys that must confirm commits (as
/// `synchronous_standby_names` = `names` says) have confirmed WAL position `lsn`, both read
/// from `wal` (a row of [`durable::WAL_POSITION`]), asking on `conn` until its reply bound.
/// `Err` says why a commit found on the server is not known durable.
pub(super) fn judge_reread(
    inner: &Inner,
    conn: &Conn,
    wal: &Row,
    ours: bool,
) -> Result<bool, String> {
    let names: &str = &wal.try_get::<_, String>(0).unwrap_or_default();
    let lsn: &str = &wal.try_get::<_, String>(1).unwrap_or_default();
    let required = durable::standbys_required(names);
    let by = Instant::now() + conn.reply_bound;
    loop {
        let (read, confirmed) = if ours {
            let confirmed = if required == Some(0) {
                0
            } else {
                inner
                    .exec(PgStep::Reread, conn, |c| async move {
                        c.client
                            .query_one(durable::CONFIRMED_STANDBYS, &[&lsn])
                            .await
                            .map(|r| r.try_get::<_, i64>(0).unwrap_or(0))
                    })
                    .unwrap_or(0)
            };
            let confirmed = u32::try_from(confirmed).unwrap_or(u32::MAX);
            let read = durable::Reread::Ours {
                required,
                confirmed,
            };
            (read, confirmed)
        } else {
            (durable::Reread::NotOurs, 0)
        };
        match durable::verdict(read) {
            durable::Verdict::NotCommitted => return Ok(false),
            durable::Verdict::Committed => return Ok(true),
            durable::Verdict::NotYetDurable => {}
        }
        if Instant::now() >= by {
            return Err(format!(
                "the commit is on the server, but {} synchronous standby(s) of \
                 synchronous_standby_names = '{names}' had to confirm it (WAL {lsn}) and \
                 {confirmed} did within {} ms: a failover may lose it (the role needs \
                 pg_monitor to see the standbys' positions)",
                required.map_or("an unknown number of".to_owned(), |n| n.to_string()),
                conn.reply_bound.as_millis()
            ));
        }
        // Polling the server: nothing signals a standby's confirmation to this client.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The record a row holds, and the row's advisory key.
pub(super) fn record_of(
    id: &SessionId,
    owner: String,
    token: i64,
    expiry: SqlTime,
) -> Result<Option<Record>, Error> {
    let token = token as u64; // the u64's bits (see the schema)
    if token == 0 && owner.is_empty() {
        // The placeholder inserted to have a row to lock: no record yet.
        return Ok(None);
    }
    let expiry: Timestamp = expiry.to_timestamp().ok_or_else(|| Error::CorruptRow {
        id: id.clone(),
        reason: "expiry is infinite or outside the years 0001-9999".into(),
    })?;
    Ok(Some(Record {
        owner,
        token,
        expiry,
    }))
}
