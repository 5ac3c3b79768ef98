//! [`PgLease`]: the same lease across hosts, kept in PostgreSQL (feature `postgres`).
//!
//! The same [`machine`](crate::machine) decides every transition, through the same
//! [`driver::run`]; only the primitives change:
//!
//! | flock backend | PostgreSQL backend |
//! | --- | --- |
//! | `<stem>.lock` transition lock | the lease row, locked by `SELECT … FOR UPDATE` in a short transaction bounded by the server's `lock_timeout` |
//! | `<stem>.lease.json` record | the row `(id, key, owner, token, expiry)` (see [`schema`]); never deleted; committed by the transaction's `COMMIT` |
//! | `<stem>.<token>.live` liveness lock | the session advisory lock `(key, token mod 2^32)` held by a dedicated, unpooled, idle connection of the holder |
//! | liveness probe | `pg_try_advisory_xact_lock_shared` on a transition connection (never the holder's) |
//! | the host's clock | the server's `clock_timestamp()`, read after the row lock: one clock for every host |
//!
//! # One acquire
//!
//! On a transition connection (round trips: one, plus one per step taken):
//!
//! ```sql
//! BEGIN;                                                   -- pipelined with the next two
//! SELECT key, owner, token, expiry FROM flocklease_leases WHERE id = $1 FOR UPDATE;
//! SELECT clock_timestamp();
//! SELECT pg_try_advisory_xact_lock_shared($key, $token);   -- only if a live-looking holder
//! -- on a liveness connection: SELECT pg_try_advisory_lock($key, $token + 1), pg_backend_pid();
//! UPDATE flocklease_leases SET owner = $2, token = $3, expiry = $4 WHERE key = $1;
//! COMMIT;                                                  -- pipelined with the UPDATE
//! ```
//!
//! The first use of an id inserts its row first (`INSERT … ON CONFLICT DO NOTHING`).
//!
//! # What changes from the flock backend
//!
//! A flock liveness lock lasts exactly as long as its process. A session advisory lock lasts
//! as long as its *connection*, which can end while the holder runs: a network failure,
//! `pg_terminate_backend`, a server restart or failover, `idle_session_timeout`. A rival then
//! sees the generation dead and takes over before the expiry, while the old holder may still
//! believe it holds. So:
//!
//! - the holder is told at once: [`SessionLease::on_liveness_lost`] fires when the liveness
//!   connection ends, and a [`KeepAlive`](crate::KeepAlive) reports
//!   [`Loss::LivenessLost`](crate::Loss::LivenessLost) without waiting for its next renew;
//! - property 1 holds as "at most one holder whose liveness lock is intact, and it is the
//!   record's"; two processes may briefly both believe they hold, and **the token orders
//!   them**: fence the protected resource with it;
//! - a renew whose liveness connection ended locks its generation again on a new connection,
//!   only if the row still names it (then nobody took over);
//! - host death (no FIN reaches the server) is noticed by TCP keepalives and
//!   `tcp_user_timeout` set on both ends of each liveness connection to about a third of the
//!   TTL.
//!
//! Every other guarantee is unchanged: monotone tokens (the row is never deleted; durable
//! with the server's `synchronous_commit`), crash takeover at once, expiry as good as death,
//! harmless stale calls, renew after suspension, errors never reported after a commit (a
//! `COMMIT` whose reply is lost is resolved by re-reading the row).
//!
//! # Deployment requirements
//!
//! - PostgreSQL 14 or later, reached **directly or through a session-mode pooler**. A
//!   transaction-mode pooler breaks session advisory locks; it is refused
//!   ([`Error::SessionNotKept`]) when it hands a liveness statement another server session.
//! - Tokens survive a failover only with **synchronous replication**: with asynchronous
//!   replication the last token bump can be lost and a token issued twice.
//! - Each lease held costs one server connection for its lifetime and one lock-table entry
//!   (`max_locks_per_transaction × max_connections`).
//! - The two-`int4` advisory-lock key space is shared with the database's other users:
//!   do not take `(key, n)` locks with the keys of `flocklease_leases` elsewhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio_postgres::Row;

use crate::clock::{Clock, SystemClock};
use crate::driver;
use crate::error::Error;
use crate::lease::{DEFAULT_TTL, Grant, Lease, SessionLease};
use crate::machine::{Event, Outcome};
use crate::name::{Owner, SessionId};
use crate::record::Record;
use crate::timestamp::Timestamp;

mod conn;
mod fault;
pub mod schema;
mod sessions;
mod sqltime;
mod tx;

use conn::{Configs, Conn, Fail, exec, lock};
use fault::Faults;
#[cfg(feature = "fault-injection")]
pub use fault::PgFaultHook;
pub use fault::{PgFault, PgStep};
pub use sessions::PgSession;
use sqltime::{SqlTime, truncate_to_micros};
use tx::{IdState, PgTx, gen_key};

/// The default bound on waiting for a lease row locked by another transition: 5 seconds.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle connections kept per role (transition, liveness) between calls.
const POOL_MAX: usize = 4;

/// The per-id state map is pruned of idle ids when it grows past this size.
const PRUNE_AT: usize = 1024;

/// Lease manager over a PostgreSQL database shared by cooperating processes on any number of
/// hosts. See the [module documentation](self) for what differs from
/// [`FlockLease`](crate::FlockLease).
///
/// Each instance is one "lease-manager instance": it keeps one liveness connection per
/// generation it holds. Dropping it unlocks them all (as a crash would, but at once).
///
/// # Examples
///
/// ```no_run
/// use flocklease::pg::PgLease;
/// use flocklease::{Owner, SessionId, SessionLease};
///
/// # fn main() -> Result<(), flocklease::Error> {
/// let leases = PgLease::connect("host=db.internal user=jobs dbname=jobs")?;
/// let id = SessionId::new("nightly")?;
/// if let Some(lease) = leases.acquire(&id, &Owner::new("host-a")?)?.lease() {
///     println!("token {}", lease.token); // fence writes with it
///     leases.release(&lease)?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct PgLease {
    inner: Inner,
}

/// Options for [`PgLease`]; start from [`PgLease::builder`].
#[must_use]
pub struct PgLeaseBuilder {
    url: String,
    ttl: Duration,
    lock_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    local_clock: Arc<dyn Clock>,
    faults: Faults,
}

impl PgLease {
    /// Connects with the default options: TTL 30 s, the server's clock, a 5 s bound on row
    /// lock waits.
    ///
    /// # Errors
    ///
    /// See [`PgLeaseBuilder::connect`].
    pub fn connect(url: &str) -> Result<PgLease, Error> {
        PgLease::builder(url).connect()
    }

    /// A builder for the database at `url`: a libpq-style connection string
    /// (`host=… port=… user=… dbname=…`) or URL (`postgresql://user@host/db`).
    pub fn builder(url: &str) -> PgLeaseBuilder {
        PgLeaseBuilder {
            url: url.to_owned(),
            ttl: DEFAULT_TTL,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            clock: None,
            local_clock: Arc::new(SystemClock),
            faults: Faults::default(),
        }
    }

    /// The lease time-to-live.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The clock lease expiries are in: this host's clock corrected by its offset from the
    /// server's, as measured at the last transition (or the clock given to
    /// [`PgLeaseBuilder::clock`]). Give it to [`KeepAlive`](crate::KeepAlive) so a host with a
    /// skewed clock does not think its lease expired early or late.
    pub fn clock(&self) -> Arc<dyn Clock> {
        match &self.inner.clock {
            Some(c) => Arc::clone(c),
            None => Arc::new(ServerClock {
                local: Arc::clone(&self.inner.local_clock),
                offset_nanos: Arc::clone(&self.inner.offset_nanos),
            }),
        }
    }

    /// Acquires the lease of `id` for `owner`, waiting up to `timeout` while another owner
    /// holds it.
    ///
    /// The wait blocks in `pg_advisory_xact_lock_shared` on the holder's generation, bounded
    /// by the server's `lock_timeout` at the earlier of the holder's expiry and `timeout`: it
    /// ends the moment the holder releases or its session ends, with no polling interval. The
    /// shared lock never makes a dead holder look alive to a probe (probes are shared too).
    /// Returns [`Grant::Held`] when `timeout` passes with the lease still held.
    ///
    /// # Errors
    ///
    /// Any error of [`SessionLease::acquire`].
    pub fn acquire_wait(
        &self,
        id: &SessionId,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Grant, Error> {
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if let Grant::Granted(lease) = self.acquire(id, owner)? {
                return Ok(Grant::Granted(lease));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(Grant::Held);
            }
            self.inner.wait_for_holder(id, left)?;
        }
    }

    fn transition(&self, id: &SessionId, event: Event) -> Result<Outcome, Error> {
        let inner = &self.inner;
        let entry = inner.id_state(id);
        // In-process serialization of one id; across processes the row lock does it.
        let mut state = lock(&entry);
        let mut conn = inner.tx_conn(Some(id))?;
        // An acquire may need a probe: send it speculatively in the first round trip, except
        // for the generation this instance holds (which it may have to lock again).
        let probe = matches!(event, Event::Acquire { .. })
            .then(|| state.local.as_ref().map(|g| g.local.token as i64));
        let (key, record, server_now, probed) = match inner.begin(id, &conn, probe) {
            Ok(read) => read,
            Err(e) => {
                inner.end_tx(conn, false);
                return Err(e);
            }
        };
        let now = match &inner.clock {
            Some(c) => truncate_to_micros(c.now()),
            None => {
                let local = inner.local_clock.now().unix_nanos();
                let offset =
                    (server_now.unix_nanos() - local).clamp(i64::MIN.into(), i64::MAX.into());
                inner.offset_nanos.store(offset as i64, Ordering::Relaxed);
                server_now
            }
        };
        let mut tx = PgTx {
            inner,
            id,
            conn: &mut conn,
            key,
            record,
            probed,
            state: &mut state,
            finished: false,
        };
        let outcome = driver::run(&mut tx, id, now, inner.ttl, event);
        let finished = tx.finished;
        inner.end_tx(conn, finished);
        outcome
    }
}

impl SessionLease for PgLease {
    fn acquire(&self, id: &SessionId, owner: &Owner) -> Result<Grant, Error> {
        let event = Event::Acquire {
            owner: owner.clone(),
        };
        Ok(driver::grant(self.transition(id, event)?, id, owner))
    }

    fn renew(&self, lease: &Lease) -> Result<Grant, Error> {
        let event = Event::Renew {
            owner: lease.owner.clone(),
            token: lease.token,
        };
        let outcome = self.transition(&lease.session_id, event)?;
        Ok(driver::grant(outcome, &lease.session_id, &lease.owner))
    }

    fn release(&self, lease: &Lease) -> Result<(), Error> {
        let event = Event::Release {
            owner: lease.owner.clone(),
            token: lease.token,
        };
        self.transition(&lease.session_id, event).map(drop)
    }

    /// Calls `notify` when the liveness connection of `lease`'s generation ends (at once if
    /// it has, or if this instance does not hold the generation).
    fn on_liveness_lost(&self, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        let entry = self.inner.id_state(&lease.session_id);
        let state = lock(&entry);
        match &state.local {
            Some(g) if g.local.token == lease.token && g.local.owner == lease.owner => {
                // Under the id's lock: the connection cannot be given up meanwhile.
                g.conn.ended.subscribe(notify);
            }
            _ => {
                drop(state);
                // Not held here: there is no liveness lock to lose, which is a loss already.
                notify();
            }
        }
    }
}

impl Drop for PgLease {
    /// Unlocks every liveness lock this instance holds (as the server would after a crash,
    /// but before returning), then closes every connection.
    fn drop(&mut self) {
        let inner = &self.inner;
        let ids: Vec<_> = lock(&inner.ids).map.values().cloned().collect();
        for entry in ids {
            if let Some(generation) = lock(&entry).local.take() {
                generation.conn.ended.clear();
                let unlock = generation
                    .conn
                    .client
                    .simple_query("SELECT pg_advisory_unlock_all()");
                let _ = inner
                    .rt
                    .block_on(async { tokio::time::timeout(Duration::from_secs(2), unlock).await });
            }
        }
    }
}

impl std::fmt::Debug for PgLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLease")
            .field("ttl", &self.inner.ttl)
            .field("lock_timeout", &self.inner.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl PgLeaseBuilder {
    /// The lease time-to-live (default 30 s; zero means the default). Truncated to whole
    /// microseconds, the precision of `timestamptz`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        let ttl = if ttl.is_zero() { DEFAULT_TTL } else { ttl };
        self.ttl = Duration::from_micros(ttl.as_micros().try_into().unwrap_or(u64::MAX))
            .max(Duration::from_micros(1));
        self
    }

    /// How long a transition waits for a lease row locked by another transition before
    /// [`Error::RowLockTimeout`] (default 5 s); enforced by the server (`lock_timeout`).
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Decides with `clock` instead of the server's `clock_timestamp()`: for tests and
    /// simulations, where every instance must share it. In production leave the server's
    /// clock, so hosts with skewed clocks agree on expiry.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// This host's clock (default [`SystemClock`]), from which [`PgLease::clock`] estimates
    /// the server's; never used to decide a transition.
    pub fn local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.local_clock = clock;
        self
    }

    /// Makes chosen statements fail, for tests. See [`PgStep`].
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, hook: PgFaultHook) -> Self {
        self.faults = Faults::new(hook);
        self
    }

    /// Starts the private runtime (one thread), creates the lease tables if missing and
    /// checks their version.
    ///
    /// # Errors
    ///
    /// - [`Error::Database`] when the connection string is invalid, the server cannot be
    ///   reached or the tables cannot be created;
    /// - [`Error::SchemaVersion`] when they were created by an incompatible version.
    pub fn connect(self) -> Result<PgLease, Error> {
        let db = |op| {
            move |e: Box<dyn std::error::Error + Send + Sync>| Error::Database {
                op,
                id: None,
                source: e,
            }
        };
        let base: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| db("parse the connection string")(Box::new(e)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("flocklease-pg")
            .enable_all()
            .build()
            .map_err(|e| db("start the runtime")(Box::new(e)))?;
        schema::ensure(&rt, &base)?;
        let configs = Configs::new(&base, self.lock_timeout, self.ttl);
        // One liveness connection up front: the first acquire does not wait for a connect,
        // and its descriptor is this instance's lowest, so when the process dies the kernel
        // closes it first and the server hears of the crash before anything else.
        let first_live = conn::connect(&rt, &configs.liveness)
            .map_err(|e| e.into_error("connect a liveness connection", None))?;
        Ok(PgLease {
            inner: Inner {
                rt,
                configs,
                ttl: self.ttl,
                lock_timeout: self.lock_timeout,
                clock: self.clock,
                local_clock: self.local_clock,
                offset_nanos: Arc::default(),
                faults: self.faults,
                tx_pool: Mutex::default(),
                live_pool: Mutex::new(vec![first_live]),
                ids: Mutex::new(Ids {
                    map: HashMap::new(),
                    prune_at: PRUNE_AT,
                }),
            },
        })
    }
}

/// The server's clock as seen from this host: the local clock plus the last measured offset.
#[derive(Debug)]
struct ServerClock {
    local: Arc<dyn Clock>,
    offset_nanos: Arc<AtomicI64>,
}

impl Clock for ServerClock {
    fn now(&self) -> Timestamp {
        let nanos =
            self.local.now().unix_nanos() + i128::from(self.offset_nanos.load(Ordering::Relaxed));
        Timestamp::from_unix_nanos(nanos).unwrap_or(Timestamp::MAX)
    }
}

struct Ids {
    map: HashMap<SessionId, Arc<Mutex<IdState>>>,
    prune_at: usize,
}

/// Everything but the public face, so the transaction can borrow it.
pub(crate) struct Inner {
    rt: Runtime,
    configs: Configs,
    ttl: Duration,
    lock_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    local_clock: Arc<dyn Clock>,
    offset_nanos: Arc<AtomicI64>,
    faults: Faults,
    tx_pool: Mutex<Vec<Conn>>,
    live_pool: Mutex<Vec<Conn>>,
    ids: Mutex<Ids>,
}

impl Inner {
    fn id_state(&self, id: &SessionId) -> Arc<Mutex<IdState>> {
        let mut ids = lock(&self.ids);
        if let Some(entry) = ids.map.get(id) {
            return Arc::clone(entry);
        }
        if ids.map.len() >= ids.prune_at {
            ids.map.retain(|_, e| {
                Arc::strong_count(e) > 1 || e.try_lock().map_or(true, |s| s.local.is_some())
            });
            ids.prune_at = (ids.map.len() * 2).max(PRUNE_AT);
        }
        let entry = Arc::new(Mutex::new(IdState::default()));
        ids.map.insert(id.clone(), Arc::clone(&entry));
        entry
    }

    /// An idle transition connection, or a new one.
    fn tx_conn(&self, id: Option<&SessionId>) -> Result<Conn, Error> {
        if let Some(conn) = lock(&self.tx_pool).pop() {
            return Ok(conn);
        }
        conn::connect(&self.rt, &self.configs.transition).map_err(|e| e.into_error("connect", id))
    }

    /// Keeps a sound transition connection for later; ends the session of one whose last
    /// outcome is unknown (it may still hold the row lock or a probe's lock), so that nothing
    /// it held outlives the call.
    fn give_back_tx(&self, conn: Conn) {
        if !conn.reusable() {
            if !conn.ended.is_ended() {
                self.discard(conn);
            }
            return;
        }
        let mut pool = lock(&self.tx_pool);
        if pool.len() < POOL_MAX {
            pool.push(conn);
        }
    }

    fn live_conn(&self, id: &SessionId) -> Result<Conn, Error> {
        if let Some(conn) = lock(&self.live_pool).pop() {
            return Ok(conn);
        }
        conn::connect(&self.rt, &self.configs.liveness)
            .map_err(|e| e.into_error("connect a liveness connection", Some(id)))
    }

    fn give_back_live(&self, conn: Conn) {
        conn.ended.clear();
        let mut pool = lock(&self.live_pool);
        if conn.reusable() && pool.len() < POOL_MAX {
            pool.push(conn);
        }
    }

    /// Ends a connection whose locks are unknown, and makes sure the server has ended its
    /// session (so its locks are gone) before returning, as far as it can.
    fn discard(&self, conn: Conn) {
        let pid = conn.pid;
        drop(conn);
        if let Ok(admin) = self.tx_conn(None) {
            let done = exec(
                &self.rt,
                &Faults::default(),
                PgStep::Unlock,
                &admin,
                |c| async move {
                    c.client
                        .execute("SELECT pg_terminate_backend($1::int4, 2000)", &[&pid])
                        .await
                },
            );
            if done.is_ok() {
                self.give_back_tx(admin);
            }
        }
    }

    /// Locks generation `(key, token)` on a liveness connection and returns it.
    fn lock_generation(
        &self,
        id: &SessionId,
        key: i32,
        token: u64,
        step: PgStep,
    ) -> Result<Conn, Error> {
        let conn = self.live_conn(id)?;
        let gk = gen_key(token);
        let got = exec(&self.rt, &self.faults, step, &conn, |c| async move {
            c.client.query_one(&c.stmts.lock_live, &[&key, &gk]).await
        });
        let row = match got {
            Ok(row) => row,
            Err(e) => {
                let unknown = e.outcome_unknown();
                // The lock may have been granted without our knowing: end that session.
                if unknown {
                    self.discard(conn);
                } else {
                    self.give_back_live(conn);
                }
                return Err(e.into_error("lock the generation's liveness lock", Some(id)));
            }
        };
        let (locked, pid): (bool, i32) = (row.get(0), row.get(1));
        if pid != conn.pid {
            let opened = conn.pid;
            self.discard(conn);
            return Err(Error::SessionNotKept {
                detail: format!(
                    "the liveness lock was taken in server session {pid}, the connection \
                     opened in session {opened}"
                ),
            });
        }
        if !locked {
            self.give_back_live(conn);
            return Err(Error::AdvisoryLockBusy {
                id: id.clone(),
                token,
            });
        }
        Ok(conn)
    }

    /// Unlocks generation `(key, token)` on `conn` and keeps the connection if that worked;
    /// otherwise ends its session so that the lock cannot outlive this call.
    fn unlock_and_pool(&self, conn: Conn, key: i32, token: u64) {
        let gk = gen_key(token);
        let done = exec(
            &self.rt,
            &self.faults,
            PgStep::Unlock,
            &conn,
            |c| async move { c.client.query_one(&c.stmts.unlock, &[&key, &gk]).await },
        );
        match done {
            Ok(row) if row.get::<_, bool>(0) => self.give_back_live(conn),
            _ => self.discard(conn),
        }
    }

    /// The transition's first round trip: `BEGIN`, the row locked and read, the server's
    /// clock read after the lock. Inserts the row first if missing.
    #[allow(clippy::type_complexity)]
    fn begin(
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
    fn end_tx(&self, conn: Conn, finished: bool) {
        if !finished && conn.reusable() {
            let rolled_back = self
                .rt
                .block_on(conn.client.execute(&conn.stmts.rollback, &[]))
                .is_ok();
            if !rolled_back {
                conn.poison();
            }
        }
        self.give_back_tx(conn);
    }

    /// Waits until the holder of `id`'s recorded generation is gone, its expiry passes, or
    /// `left` runs out (whichever first); returns at once if nobody seems to hold it.
    fn wait_for_holder(&self, id: &SessionId, left: Option<Duration>) -> Result<(), Error> {
        let conn = self.tx_conn(Some(id))?;
        let db = |e: tokio_postgres::Error| Fail::Db(e).into_error("wait for the holder", Some(id));
        let peek_sql = format!(
            "SELECT key, owner, token, expiry FROM {} WHERE id = $1",
            schema::TABLE
        );
        let idp = id.as_str();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&idp];
        let peek = self.rt.block_on(async {
            tokio::try_join!(
                conn.client.execute(&conn.stmts.begin, &[]),
                conn.client.query_opt(&peek_sql, &params),
                conn.client.query_one(&conn.stmts.clock, &[]),
            )
        });
        let mut finished = false;
        let result = match peek {
            Err(e) => Err(db(e)),
            Ok((_, None, _)) => Ok(()),
            Ok((_, Some(row), clock)) => {
                let (key, record) = row_record(id, &row)?;
                let now = clock.get::<_, SqlTime>(0).to_timestamp();
                match (record, now) {
                    (Some(r), Some(now)) if !r.is_tombstone() && now < r.expiry => {
                        let to_expiry = r.expiry.saturating_duration_since(now);
                        let wait = left.map_or(to_expiry, |l| l.min(to_expiry));
                        let ms = format!("{}ms", wait.as_millis().clamp(1, i32::MAX as u128));
                        let gk = gen_key(r.token);
                        let p1: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ms];
                        let p2: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&key, &gk];
                        // The ROLLBACK is pipelined too: it ends the wait's transaction (and
                        // drops its shared lock) as soon as the wait returns.
                        let waited = self.rt.block_on(async {
                            tokio::join!(
                                conn.client.query_one(&conn.stmts.wait_timeout, &p1),
                                conn.client.execute(&conn.stmts.wait, &p2),
                                conn.client.execute(&conn.stmts.rollback, &[]),
                            )
                        });
                        finished = waited.2.is_ok();
                        match (waited.0, waited.1) {
                            (Ok(_), Ok(_)) => Ok(()),
                            (Err(e), _) | (_, Err(e)) => {
                                if Fail::Db(e).is_lock_timeout() {
                                    Ok(())
                                } else {
                                    Err(Error::Database {
                                        op: "wait for the holder",
                                        id: Some(id.clone()),
                                        source: "the wait failed".into(),
                                    })
                                }
                            }
                        }
                    }
                    _ => Ok(()),
                }
            }
        };
        self.end_tx(conn, finished);
        result
    }
}

/// The advisory key and record of a lease row `(key, owner, token, expiry)`.
fn row_record(id: &SessionId, row: &Row) -> Result<(i32, Option<Record>), Error> {
    let key: i32 = row.get(0);
    Ok((key, tx::record_of(id, row.get(1), row.get(2), row.get(3))?))
}
