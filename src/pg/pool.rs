//! Connection pools of a [`PgLease`](super::PgLease): idle transition and liveness
//! connections, locking and unlocking a generation's liveness lock, and ending a session
//! whose locks are unknown.

use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

use super::conn::{self, Conn, Fail, lock, within};
use super::fault::PgStep;
use super::tx::gen_key;
use super::{Inner, row_record};
use crate::error::Error;
use crate::name::SessionId;
use crate::record::Record;

/// Idle connections kept per role (transition, liveness) between calls.
const POOL_MAX: usize = 4;

impl Inner {
    /// An idle transition connection, or a new one. Idle connections whose session ended
    /// meanwhile (server restart, `pg_terminate_backend`, an idle timeout) are dropped.
    pub(super) fn tx_conn(&self, id: Option<&SessionId>) -> Result<Conn, Error> {
        self.pooled(&self.tx_pool, &self.configs.transition)
            .map_err(|e| e.into_error("connect", id))
    }

    /// Keeps a sound connection for later, in its role's pool (a liveness connection holds no
    /// lock any more when it comes back; its watchers are forgotten). Ends the session of one
    /// whose last outcome is unknown (it may still hold the row lock, a probe's lock or a
    /// generation's lock), so that nothing it held outlives the call.
    pub(super) fn give_back(&self, mut conn: Conn) {
        conn.ended.clear();
        if conn.is_disowned() {
            conn.close_now();
            return;
        }
        if !conn.reusable() {
            if !conn.ended.is_ended() {
                self.discard(conn);
            }
            return;
        }
        conn.idle_since = Instant::now();
        let mut pool = lock(if conn.liveness {
            &self.live_pool
        } else {
            &self.tx_pool
        });
        if pool.len() < POOL_MAX {
            pool.push(conn);
        }
    }

    /// An idle liveness connection (holding no lock), or a new one.
    pub(super) fn live_conn(&self, id: &SessionId) -> Result<Conn, Error> {
        self.pooled(&self.live_pool, &self.configs.liveness)
            .map_err(|e| e.into_error("connect a liveness connection", Some(id)))
    }

    /// The most recently used idle connection of `pool` whose session is still open, or a new
    /// one of `role`.
    fn pooled(&self, pool: &Mutex<Vec<Conn>>, role: &conn::Role) -> Result<Conn, Fail> {
        match pop_sound(pool) {
            Some(conn) => Ok(conn),
            None => conn::connect(&self.rt, &self.configs.connector, role, &self.open),
        }
    }

    /// Ends a connection whose locks are unknown, and makes sure the server has ended its
    /// session (so its locks are gone) before returning, as far as it can.
    pub(super) fn discard(&self, conn: Conn) {
        let told = conn.terminated.load(std::sync::atomic::Ordering::Relaxed);
        let pid = conn.pid;
        conn.close_now();
        if !told {
            self.terminate_session(pid);
        }
    }

    /// Ends `conn`'s server session (see [`Inner::terminate_session`]), once: after that, the
    /// server may give its pid to another session.
    pub(super) fn terminate(&self, conn: &Conn) -> bool {
        if conn
            .terminated
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return false;
        }
        self.terminate_session(conn.pid)
    }

    /// Ends server session `pid` (`pg_terminate_backend`) from another connection, and says
    /// whether the server confirmed it gone: it waits for the session's exit up to half the
    /// reply bound (at most 2 s). A stopped or stuck backend exits only once it runs again, so
    /// `false` then: whatever it holds is still held.
    pub(super) fn terminate_session(&self, pid: i32) -> bool {
        let Ok(admin) = self.tx_conn(None) else {
            return false;
        };
        let wait_ms = i64::try_from((admin.reply_bound / 2).as_millis())
            .unwrap_or(i64::MAX)
            .min(2000);
        // Not through the fault seam: the hook's steps are the transition's.
        let done = within(&self.rt, admin.reply_bound, async {
            let sql = "SELECT pg_terminate_backend($1::int4, $2::int8)";
            let row = admin.client.query_one(sql, &[&pid, &wait_ms]).await?;
            row.try_get::<_, bool>(0)
        })
        .and_then(|r| r.map_err(Fail::Db));
        match done {
            Ok(gone) => {
                self.give_back(admin);
                gone
            }
            Err(_) => {
                // Not given back: discarding it would end another session the same way, and
                // the server that did not answer this one would not answer that either.
                admin.close_now();
                false
            }
        }
    }

    /// Locks generation `(key, token)` again on a liveness connection and returns it (a renew
    /// whose liveness connection ended; step [`PgStep::RelockLive`]).
    pub(super) fn lock_generation(
        &self,
        id: &SessionId,
        key: i32,
        token: u64,
    ) -> Result<Conn, Error> {
        let conn = self.live_conn(id)?;
        let gk = gen_key(token);
        let got = self.exec(PgStep::RelockLive, &conn, |c| async move {
            c.client
                .query_one(&c.stmts.lock_live, &[&key, &gk, &c.nonce])
                .await
        });
        let row = match got {
            Ok(row) => row,
            Err(e) => {
                let unknown = e.outcome_unknown();
                // The lock may have been granted without our knowing: end that session.
                if unknown {
                    self.discard(conn);
                } else {
                    self.give_back(conn);
                }
                return Err(e.into_error("lock the generation's liveness lock", Some(id)));
            }
        };
        self.keep_if_locked(conn, id, token, &row)
    }

    /// Interprets the reply `(locked, pid)` of the statement that locked generation `token`
    /// on `conn` (outside any transaction, or in one that is over): `conn` if it holds the
    /// lock in its own server session; otherwise the connection goes back (or is disowned,
    /// when the lock was tried in another session) and the error says why.
    fn keep_if_locked(
        &self,
        conn: Conn,
        id: &SessionId,
        token: u64,
        row: &tokio_postgres::Row,
    ) -> Result<Conn, Error> {
        let (locked, pid): (Option<bool>, i32) = (
            row.try_get(0).map_err(super::conn::mismatch)?,
            row.try_get(1).map_err(super::conn::mismatch)?,
        );
        let Some(locked) = locked.filter(|_| pid == conn.pid) else {
            // Not tried (the statement ran in a session without this connection's mark), or,
            // should a mark ever be met elsewhere, taken in another session: that session is
            // ended then, or the lock would stay with a session the pooler hands to others.
            let opened = conn.pid;
            self.disowned(conn, (locked == Some(true)).then_some(pid));
            return Err(Error::SessionNotKept {
                detail: format!(
                    "the liveness lock was to be taken in server session {pid}, the \
                     connection opened and marked session {opened}"
                ),
            });
        };
        if !locked {
            self.give_back(conn);
            return Err(Error::AdvisoryLockBusy {
                id: id.clone(),
                token,
            });
        }
        Ok(conn)
    }

    /// Locks generation `(key, token)` again on a fresh liveness connection and returns it,
    /// under the row lock and only if the row of `id` still holds `record` (nobody took over
    /// since the commit that created the generation). `None` if the row changed, the lock is
    /// busy, or a step failed; nothing is held then.
    pub(super) fn relock_if_named(
        &self,
        id: &SessionId,
        key: i32,
        record: &Record,
        token: u64,
    ) -> Option<Conn> {
        let conn = self.live_conn(id).ok()?;
        let idp = id.as_str();
        let read = self.exec(PgStep::RelockLive, &conn, |c| async move {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&idp];
            let (begun, row) = tokio::join!(
                c.client.execute(&c.stmts.begin, &[]),
                c.client.query_opt(&c.stmts.lock_row, &params),
            );
            begun?;
            row
        });
        let named = match &read {
            Ok(Some(row)) => row_record(id, row).is_ok_and(|(_, r)| r.as_ref() == Some(record)),
            _ => false,
        };
        if !named {
            self.end_tx(conn, false);
            return None;
        }
        let gk = gen_key(token);
        let got = self.exec(PgStep::RelockLive, &conn, |c| async move {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&key, &gk, &c.nonce];
            let (got, committed) = tokio::join!(
                c.client.query_one(&c.stmts.lock_live, &params),
                c.client.execute(&c.stmts.commit, &[]),
            );
            committed?;
            got
        });
        match got {
            Ok(row) => self.keep_if_locked(conn, id, token, &row).ok(),
            Err(_) => {
                // It may hold the lock: ended, not pooled.
                conn.poison();
                self.end_tx(conn, true);
                None
            }
        }
    }

    /// Closes a connection whose statements ran in server session `seen` instead of its own
    /// (a transaction-mode pooler), without ending its own session, which may serve other
    /// clients now. If a generation's lock was taken in `locked_in`, that session is ended:
    /// the lock would otherwise stay with a server connection the pooler hands to others.
    fn disowned(&self, conn: Conn, locked_in: Option<i32>) {
        conn.disown();
        self.give_back(conn);
        if let Some(pid) = locked_in {
            self.terminate_session(pid);
        }
    }

    /// Unlocks generation `(key, token)` on `conn` and keeps the connection if that worked;
    /// otherwise ends its session so that the lock cannot outlive this call.
    pub(super) fn unlock_and_pool(&self, conn: Conn, key: i32, token: u64) {
        let gk = gen_key(token);
        let done = self.exec(PgStep::Unlock, &conn, |c| async move {
            c.client
                .query_one(&c.stmts.unlock, &[&key, &gk, &c.nonce])
                .await
        });
        match done.and_then(|row| {
            row.try_get::<_, Option<bool>>(0)
                .map_err(super::conn::Fail::Db)
        }) {
            Ok(Some(true)) => self.give_back(conn),
            Ok(None) => {
                // Another server session than the one holding the lock: never unlocked or
                // ended there (it may serve other clients).
                conn.disown();
                self.give_back(conn);
            }
            _ => self.discard(conn),
        }
    }
}

/// The most recently used idle connection whose session is still open.
fn pop_sound(pool: &std::sync::Mutex<Vec<Conn>>) -> Option<Conn> {
    let mut pool = lock(pool);
    while let Some(conn) = pool.pop() {
        if conn.reusable() {
            return Some(conn);
        }
    }
    None
}

/// Closes pooled connections idle for `idle_timeout` or longer, checking twice per timeout,
/// until the pools are gone (the lease manager dropped). Runs on the private runtime.
///
/// An idle holder then keeps one server session per held lease (its liveness connection)
/// instead of also its transition connections: fewer server connections across a fleet.
pub(super) async fn close_idle(pools: [Weak<Mutex<Vec<Conn>>>; 2], idle_timeout: Duration) {
    let every = (idle_timeout / 2).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        for pool in &pools {
            let Some(pool) = pool.upgrade() else { return };
            let stale: Vec<Conn> = {
                let mut idle = lock(&pool);
                let (stale, keep): (Vec<Conn>, Vec<Conn>) = idle
                    .drain(..)
                    .partition(|c| c.idle_since.elapsed() >= idle_timeout);
                *idle = keep;
                stale
            };
            // Dropped outside the pool's lock: each ends its session.
            drop(stale);
        }
    }
}
