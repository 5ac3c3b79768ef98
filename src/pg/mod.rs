//! [`PgLease`]: the same lease across hosts, kept in PostgreSQL (feature `postgres`).
//!
//! The same transition machine decides every transition, through the same interpreter as
//! the flock backend (docs/PROTOCOL.md §8); only the primitives change:
//!
//! | flock backend | PostgreSQL backend |
//! | --- | --- |
//! | `<stem>.lock` transition lock | the lease row, locked by `SELECT … FOR UPDATE` in a short transaction bounded by the server's `lock_timeout` |
//! | `<stem>.lease.json` record | the row `(id, key, owner, token, expiry)` (see [`schema`]); never deleted; committed by the transaction's `COMMIT` |
//! | `<stem>.<token>.live` liveness lock | the session advisory lock `(key, token mod 2^32)` held by a dedicated, unpooled, idle connection of the holder (normally the one that ran the acquire's transaction; it runs nothing else while it holds the lock) |
//! | liveness probe | `pg_try_advisory_xact_lock_shared` in the transition's transaction (never on the holder's connection) |
//! | the host's clock | the server's `clock_timestamp()`, read after the row lock: one clock for every host |
//!
//! # One acquire
//!
//! On an idle liveness connection, which keeps the new generation's lock afterwards (two
//! round trips):
//!
//! ```sql
//! BEGIN;                                                   -- pipelined with the next three
//! SELECT key, owner, token, expiry FROM flocklease_leases WHERE id = $1 FOR UPDATE;
//! SELECT clock_timestamp(), pg_backend_pid(), <mark is $nonce>, transaction_timestamp();
//! SELECT pg_try_advisory_xact_lock_shared(key, token) …;   -- speculative probe of the holder
//! -- the machine decides; a takeover:
//! WITH mine AS MATERIALIZED (SELECT <mark is $nonce> AS ours),
//!      live AS MATERIALIZED (SELECT CASE WHEN ours THEN pg_try_advisory_lock($key, $token + 1)
//!                            ELSE false END AS got, ours FROM mine),
//!      upd AS (UPDATE flocklease_leases SET owner = …, token = $token + 1, expiry = …
//!              FROM live WHERE key = $key AND live.got RETURNING 1)
//! SELECT got, (SELECT count(*) FROM upd), ours FROM live;
//! COMMIT;                                                  -- pipelined with the statement
//! ```
//!
//! The generation is locked before the commit, in the same server session, and the row is
//! updated only if that lock was granted. The first use of an id inserts its row first
//! (`INSERT … ON CONFLICT DO NOTHING`). A renew or a release runs the same first round trip on
//! a transition connection, then `UPDATE` + `COMMIT`; a release then unlocks the generation
//! on its liveness connection.
//!
//! A waiting acquire ([`PgLease::acquire_wait`]) told "held" sends its next attempt's first
//! round trip behind a wait in the server for the holder's generation
//! (`pg_advisory_xact_lock_shared`, in a transaction of its own bounded by `lock_timeout`):
//! the row is locked the moment the holder's session ends, with no round trip between.
//!
//! # What changes from the flock backend
//!
//! A flock liveness lock lasts exactly as long as its process. A session advisory lock lasts
//! as long as its *connection*, which can end while the holder runs: a network failure,
//! `pg_terminate_backend`, a server restart or failover, `idle_session_timeout`. A rival then
//! sees the generation dead and takes over before the expiry, while the old holder may still
//! believe it holds. So:
//!
//! - the holder is told at once: [`SessionLease::on_liveness_lost`](crate::SessionLease::on_liveness_lost) fires when the liveness
//!   connection ends, and a [`KeepAlive`](crate::KeepAlive) reports
//!   [`Loss::LivenessLost`](crate::Loss::LivenessLost) without waiting for its next renew;
//! - property 1 holds as "at most one holder whose liveness lock is intact, and it is the
//!   record's"; two processes may briefly both believe they hold, and **the token orders
//!   them**: fence the protected resource with it;
//! - a renew whose liveness connection ended locks its generation again on a new connection,
//!   only if the row still names it (then nobody took over);
//! - host death (no FIN reaches the server) is noticed by TCP keepalives and
//!   `tcp_user_timeout` set on both ends of each liveness connection to about a third of the
//!   TTL;
//! - a server that stops answering while its kernel still acknowledges every packet (a
//!   stopped or stuck backend) never blocks a call for long: every round trip and connect is
//!   given up after the row lock's `lock_timeout` plus a third of the TTL (at least 1 s), and
//!   a wait for a holder after its own length plus that. The call then fails with
//!   [`Error::Database`] ("no reply from the server"), or [`Error::CommitUnknown`] when it was
//!   the commit and its outcome cannot be settled; after a statement, the connection's server
//!   session is told to end (`pg_terminate_backend`): a stopped backend keeps what it holds
//!   until it runs again.
//!
//! Every other guarantee is unchanged: monotone tokens (the row is never deleted; durable
//! with the server's `synchronous_commit`), crash takeover at once, expiry as good as death,
//! harmless stale calls, renew after suspension, errors never reported after a commit (a
//! `COMMIT` whose reply is lost is resolved by re-reading the row; when that cannot be done,
//! [`Error::CommitUnknown`] says the outcome is unknown rather than failed).
//!
//! # Deployment requirements
//!
//! - PostgreSQL 14 or later, reached **directly or through a session-mode pooler**. A
//!   transaction- or statement-mode pooler breaks session advisory locks; it is refused
//!   ([`Error::SessionNotKept`], never a grant):
//!   - **the session proof, per statement**: when a connection is opened, one statement
//!     marks its server session with a random value (the setting `flocklease.session`), and
//!     only if that session holds no advisory lock (a fresh session, or one reset by a
//!     session-mode pooler, holds none; a session that does is another connection's). Every
//!     statement that takes, keeps or gives up a lock checks the mark *in itself*: the
//!     transaction's first round trip (row lock, clock, probes), the commit that takes a new
//!     generation's lock, the re-lock, the unlock; the nonce travels as a bind parameter,
//!     never in a prepared statement's text (statement names repeat across processes). So
//!     each advisory lock a session holds was taken by the connection whose mark it bears:
//!     no lock is kept in another client's session, and no answer read in one (a probe, the
//!     row) is used. The row lock, the probe and a waiter's wait may run there before the
//!     check refuses the transaction; what they took ends with its rollback;
//!   - early, at connect ([`PgLeaseBuilder::connect`] included): a connection's two
//!     consecutive statements must run in the same, marked session, and no two of an
//!     instance's open connections may report the same server session;
//!   - the pooler's own refusals (PgBouncer's statement mode refuses every transaction) and
//!     prepared statements met in another session are reported the same way, with the
//!     pooler's or server's message;
//!   - what remains: an acquire all of whose statements ran in the session its connection
//!     marked is granted through a transaction-mode pooler, and its liveness lock then lasts
//!     as long as the pooler's server connection, which the pooler may close (its idle or
//!     lifetime limits) unseen by the holder. Its next renew fails with
//!     [`Error::SessionNotKept`], which [`KeepAlive`](crate::KeepAlive) reports as
//!     [`Loss::LivenessLost`](crate::Loss::LivenessLost); until then a rival may hold it too,
//!     with a greater token. Do not run leases through such a pooler.
//! - A session-mode pooler must reset server connections between clients with `DISCARD ALL`
//!   (PgBouncer's default `server_reset_query`): it drops a departed client's advisory locks
//!   and mark. Without it, a crashed holder's lock stays with the pooled server connection
//!   until the expiry (no crash takeover at once), and that connection is refused to new
//!   clients.
//! - Every server session the library opens is ended by the server if its client goes
//!   silent: in an open transaction after `min(lock_timeout, TTL/3)`, at least 1 s
//!   (`idle_in_transaction_session_timeout`; a shorter one set by the operator is kept), so a
//!   stopped, hung or vanished client never holds the lease row for longer; otherwise by
//!   TCP keepalives and `tcp_user_timeout` within about a third of the TTL.
//! - The library's server-side settings per connection (`lock_timeout`, the idle bounds
//!   above, no idle-session or statement timeout on liveness connections, TCP keepalives)
//!   are sent as `SET` statements once a connection
//!   passed its checks, not as the startup parameter `options` (which PgBouncer refuses, or
//!   drops when told to ignore it), so they hold through a session-mode pooler. Behind a
//!   pooler the server-side TCP settings apply to the pooler's link, not to the holder's: a
//!   dead holder host is noticed by the pooler's own `tcp_keepalive*` settings (set them
//!   below the TTL), else only at the expiry.
//! - Tokens survive a failover only with **synchronous replication**, and only to the standby
//!   that has every acknowledged commit (the synchronous one; under `ANY n`, the most
//!   advanced): with asynchronous replication, or another standby promoted, the last token
//!   bump can be lost and a token issued twice. The README's deployment table says which
//!   standby may be promoted and what never to do.
//! - Each lease held costs one server connection for its lifetime and one lock-table entry
//!   (`max_locks_per_transaction × max_connections`).
//! - Across a network, use TLS (feature `postgres-tls`): `PgLeaseBuilder::tls` with a
//!   `PgTls`, or `sslmode=require` in the connection string for the system's roots. The
//!   server's certificate and name are always verified; a server without TLS is refused.
//! - The two-`int4` advisory-lock key space is shared with the database's other users:
//!   do not take `(key, n)` locks with the keys of `flocklease_leases` elsewhere.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::driver;
use crate::error::Error;
use crate::lease::{DEFAULT_TTL, Grant, Lease};
use crate::machine::{Event, Outcome};
use crate::name::{Owner, SessionId};
use crate::record::Record;
use crate::timestamp::Timestamp;

mod conn;
mod durable;
mod fault;
mod fenced;
mod pool;
mod round;
pub mod schema;
mod sessions;
mod sqltime;
#[cfg(feature = "fault-injection")]
mod step;
mod tls;
mod tx;

use crate::front::{self, Backend, Entry, Leases};
use conn::{Configs, Conn, HolderWait, OpenSessions, lock};
use fault::Faults;
#[cfg(feature = "fault-injection")]
pub use fault::PgFaultHook;
#[cfg(feature = "fault-injection")]
pub use step::PgStepper;
// Test seams: public for the fault-injection hook's signature, not shown on the docs.
#[doc(hidden)]
pub use fault::{PgFault, PgStep};
pub use fenced::PgFenced;
/// The TLS configuration [`PgTls::from_rustls`] takes: `rustls::ClientConfig` of the rustls
/// version this crate is built with (depend on the same `rustls` to build one).
#[cfg(feature = "postgres-tls")]
pub type RustlsClientConfig = rustls::ClientConfig;
pub use sessions::PgSession;
#[cfg(feature = "postgres-tls")]
pub use tls::PgTls;
/// The statement parameter and result row types of [`PgFenced`] (from `tokio-postgres`).
pub use tokio_postgres::{Row, types::ToSql};
use tx::{IdState, PgTx, TxData};

/// The default bound on waiting for a lease row locked by another transition: 5 seconds.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a waiting acquire whose row lock was granted tries for the id's in-process lock
/// (see `PgLease::after_wait`) before it starts over.
const IN_PROCESS_HANDOFF: Duration = Duration::from_millis(2);

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
pub type PgLease = Leases<Inner>;

/// Options for [`PgLease`]; start from [`PgLease::builder`].
#[must_use]
pub struct PgLeaseBuilder {
    url: String,
    ttl: Duration,
    lock_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    local_clock: Arc<dyn Clock>,
    faults: Faults,
    tls: Option<tls::PgTlsChoice>,
    idle_timeout: Option<Duration>,
}

/// How long a pooled connection may stay idle by default before it is closed: 30 seconds
/// (longer than the default renew interval, 10 s, so a kept-alive lease does not reconnect
/// for every renew).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

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
            local_clock: Arc::new(BootClock),
            faults: Faults::default(),
            tls: None,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }

    /// The lease time-to-live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The clock lease expiries are in: the server's clock as last read, plus the time
    /// elapsed since on this host's boot-time clock (or the clock given to
    /// [`PgLeaseBuilder::clock`]); a step of this host's wall clock does not move it. The
    /// reading is taken at each transition as the server's clock when the transaction's
    /// `BEGIN` arrived (`transaction_timestamp()`, read before the row lock), against this
    /// host's clock just before it was sent: never behind the server's
    /// clock (ahead by at most the one-way latency, and by any pause of this process between
    /// the two), so a lease never looks valid here after the server sees it expired.
    /// [`KeepAlive`](crate::KeepAlive) uses it by default ([`SessionLease::clock`](crate::SessionLease::clock)).
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.clock)
    }

    /// Acquires the lease of `id` for `owner`, waiting up to `timeout` while another owner
    /// holds it.
    ///
    /// The wait blocks in `pg_advisory_xact_lock_shared` on the holder's generation, bounded
    /// by the server's `lock_timeout` at the earlier of the holder's expiry and `timeout`: it
    /// ends the moment the holder releases or its session ends, with no polling interval, and
    /// the next attempt's row lock follows in the server without a round trip (its statements
    /// are pipelined behind the wait). The shared lock never makes a dead holder look alive to
    /// a probe (probes are shared too). While it waits, this instance's other calls on `id`
    /// go on. Returns [`Grant::Held`] when `timeout` passes with the lease still held.
    ///
    /// # Errors
    ///
    /// Any error of [`SessionLease::acquire`](crate::SessionLease::acquire).
    pub fn acquire_wait(
        &self,
        id: &SessionId,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Grant, Error> {
        let deadline = front::deadline_after(timeout);
        let mut wait = None;
        loop {
            let event = Event::Acquire {
                owner: owner.clone(),
            };
            let (outcome, next) = self.transition(id, event, wait.take())?;
            if matches!(outcome, Outcome::Granted { .. }) {
                return front::checked(self, id, owner, Ok(outcome));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Ok(Grant::Held);
            }
            // The next attempt waits for the holder first, in its own first round trip.
            wait = next.map(|(w, read_at): (HolderWait, Instant)| HolderWait {
                wait: w
                    .wait
                    .saturating_sub(read_at.elapsed())
                    .min(left.unwrap_or(Duration::MAX)),
                ..w
            });
        }
    }

    /// Runs one transition of `id`, after waiting for a holder's end if `wait` says so (an
    /// acquire only). Returns the outcome, and for an acquire answered [`Outcome::Held`], the
    /// wait for that holder (as of the instant the row was read).
    fn transition(
        &self,
        id: &SessionId,
        event: Event,
        wait: Option<HolderWait>,
    ) -> Result<(Outcome, Waited), Error> {
        if let Some(wait) = wait.filter(|_| matches!(event, Event::Acquire { .. }))
            && let Some(done) = self.after_wait(id, &event, wait)?
        {
            return done;
        }
        front::transition_then(self, id, event, |state| state.waited.take())
    }

    /// An acquire's transition behind a wait for the holder: the wait and the first round
    /// trip go out before the id's turn is taken, so this instance's other calls on the id
    /// (a renew of the lease another thread holds) go on meanwhile. The turn is only tried
    /// once the row is locked, for a moment (waiting for it longer could deadlock with a call
    /// that holds it and waits for the row; a call that released the lease holds it until its
    /// unlock's reply). `None` when it stays busy, or the instance's generation changed
    /// meanwhile: the transaction is rolled back and the caller runs the transition in order
    /// ([`front::transition`]).
    #[allow(clippy::type_complexity)]
    fn after_wait(
        &self,
        id: &SessionId,
        event: &Event,
        wait: HolderWait,
    ) -> Result<Option<Result<(Outcome, Waited), Error>>, Error> {
        let inner = &self.inner;
        let entry = self.entry(id);
        let local_of = |s: &IdState| s.local.as_ref().map(|g| g.local.token as i64);
        let local = {
            let started = Instant::now();
            let bound = started.checked_add(inner.lock_timeout);
            let _turn = self.turn(id, &entry, bound, started)?;
            local_of(&lock(&entry.state))
        };
        let conn = inner.live_conn(id)?;
        let first = match inner.first_round(id, &conn, Some(local), Some(wait), None) {
            Ok(first) => first,
            Err(e) => {
                inner.end_tx(conn, false);
                return Err(e);
            }
        };
        let Some(_turn) = entry.gate.enter(front::deadline_after(IN_PROCESS_HANDOFF)) else {
            inner.end_tx(conn, false);
            return Ok(None);
        };
        let mut state = lock(&entry.state);
        if local_of(&state) != local {
            drop(state);
            inner.end_tx(conn, false);
            return Ok(None);
        }
        let mut held = PgHeld {
            conn,
            data: TxData {
                first: Some(first),
                ..TxData::default()
            },
            acquire: true,
        };
        #[cfg(feature = "tracing")]
        let noted = crate::trace::Noted::new(id, event, self.ttl);
        let (outcome, _read) = driver::run(
            &mut Inner::tx(self, id, &entry, &mut state, &mut held),
            id,
            self.ttl,
            event.clone(),
        );
        #[cfg(feature = "tracing")]
        noted.done(_read.as_ref(), &outcome);
        Inner::unlock(self, &entry, &mut state, held, &outcome);
        let waited = state.waited.take();
        Ok(Some(outcome.map(|o| (o, waited))))
    }
}

/// A PostgreSQL transition's lock, begun: the connection whose first statement (the run's
/// begin) locks the row, and what the run carries from step to step.
pub struct PgHeld {
    conn: Conn,
    data: TxData,
    acquire: bool,
}

/// The wait for the holder an acquire was answered held by, as of the instant the row was
/// read (for [`PgLease::acquire_wait`]'s next attempt).
type Waited = Option<(HolderWait, Instant)>;

impl Backend for Inner {
    type State = IdState;
    type Lock = PgHeld;
    type Tx<'a> = PgTx<'a>;

    fn state(&self, _id: &SessionId) -> IdState {
        IdState::default()
    }

    /// The transition's connection (an acquire's: an idle liveness connection, which keeps
    /// the new generation's lock if one is taken) and what its first statement asks: the
    /// speculative probe, and the row lock's wait — what is left of the caller's bound if its
    /// turn took a noticeable part of it (else the session's own `lock_timeout`); nothing
    /// left: not begun. The row lock itself is the run's first step, in the server.
    fn lock(
        l: &PgLease,
        id: &SessionId,
        state: &mut IdState,
        event: &Event,
        deadline: Option<Instant>,
    ) -> Result<Option<PgHeld>, Error> {
        let left = deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .filter(|left| l.lock_timeout.saturating_sub(*left) >= Duration::from_millis(1));
        if left == Some(Duration::ZERO) {
            return Ok(None);
        }
        let acquire = matches!(event, Event::Acquire { .. });
        let (conn, probe) = l.inner.run_conn(id, acquire, state)?;
        let data = TxData {
            ask: (probe, left),
            ..TxData::default()
        };
        Ok(Some(PgHeld {
            conn,
            data,
            acquire,
        }))
    }

    fn tx<'a>(
        l: &'a PgLease,
        id: &'a SessionId,
        _entry: &'a Entry<IdState>,
        state: &'a mut IdState,
        held: &'a mut PgHeld,
    ) -> PgTx<'a> {
        PgTx {
            inner: &l.inner,
            id,
            conn: &mut held.conn,
            state,
            d: &mut held.data,
        }
    }

    /// Ends the run ([`Inner::end_run`]); what a waiting acquire answered held waits for
    /// next is kept in the state for it (`IdState::waited`): the machine says (the record as
    /// read).
    fn unlock(
        l: &PgLease,
        _entry: &Entry<IdState>,
        state: &mut IdState,
        held: PgHeld,
        outcome: &Result<Outcome, Error>,
    ) {
        state.waited = match (outcome, &held.data.first) {
            (Ok(Outcome::Held), Some(first)) if held.acquire => {
                first.record.as_ref().and_then(|r| {
                    crate::machine::wait_for(r, first.now).map(|w| {
                        let wait = HolderWait {
                            key: first.key,
                            token: w.token,
                            wait: w.until_expiry,
                        };
                        (wait, first.read_at)
                    })
                })
            }
            _ => None,
        };
        l.inner.end_run(state, held.conn, held.data);
    }

    /// Calls `notify` when the liveness connection of `lease`'s generation ends (at once if
    /// it has, or if this instance does not hold the generation).
    fn on_liveness_lost(l: &PgLease, lease: &Lease, notify: Box<dyn FnOnce() + Send>) {
        let entry = l.entry(&lease.session_id);
        let state = lock(&entry.state);
        match &state.local {
            Some(g) if g.local.token == lease.token && g.local.owner == lease.owner => {
                // Under the id's lock: the connection cannot be given up meanwhile.
                if let Some(notify) = g.conn.ended.subscribe(notify) {
                    // Ended already: told at once, once the id's lock is free again.
                    drop(state);
                    notify();
                }
            }
            _ => {
                drop(state);
                // Not held here: there is no liveness lock to lose, which is a loss already.
                notify();
            }
        }
    }

    /// Unlocks every liveness lock this instance holds (as the server would after a crash,
    /// but before returning), then (as the instance's fields drop) closes every connection.
    fn close(l: &mut PgLease) {
        for entry in l.ids.entries() {
            if let Some(generation) = lock(&entry.state).local.take() {
                generation.conn.ended.clear();
                // Only in the connection's own server session (see `conn::ours`).
                let sql = format!(
                    "SELECT CASE WHEN {} THEN pg_advisory_unlock_all() END",
                    conn::ours(&format!("'{}'", generation.conn.nonce))
                );
                let unlock = generation.conn.client.simple_query(&sql);
                let _ = conn::within(&l.inner.rt, Duration::from_secs(2), unlock);
            }
        }
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLease")
            .field("lock_timeout", &self.lock_timeout)
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
    /// [`Error::LockTimeout`] (default 5 s); enforced by the server (`lock_timeout`). A
    /// reply that has not come a third of the TTL (at least 1 s) after that is given up on (see
    /// the [module documentation](self)).
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

    /// This host's clock from which [`PgLease::clock`] estimates the server's: only the time
    /// elapsed between its readings counts. The default is the boot-time clock (monotonic,
    /// counts a suspend), so a step of this host's wall clock moves no estimate; never used
    /// to decide a transition.
    pub fn local_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.local_clock = clock;
        self
    }

    /// Encrypts every connection with TLS and verifies the server's certificate (feature
    /// `postgres-tls`); the connection string's `sslmode` is raised to `require`: a server
    /// without TLS is refused. Without this, `sslmode=require` in the connection string
    /// means TLS with [`PgTls::system_roots`], and any other `sslmode` plain text.
    #[cfg(feature = "postgres-tls")]
    pub fn tls(mut self, tls: PgTls) -> Self {
        self.tls = Some(tls::PgTlsChoice(tls));
        self
    }

    /// Closes pooled connections (transition connections, and liveness connections holding no
    /// lock) idle for this long (default [`DEFAULT_IDLE_TIMEOUT`]); `None` keeps them open.
    /// A holder idle for longer then keeps only one server session per held lease (fewer
    /// connections across a fleet). The next transition after an idle spell opens a
    /// connection again (a few round trips, more with TLS).
    pub fn idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle_timeout = idle.map(|d| d.max(Duration::from_millis(1)));
        self
    }

    /// Makes chosen statements fail, for tests. See [`PgStep`].
    #[cfg(feature = "fault-injection")]
    pub fn faults(mut self, hook: PgFaultHook) -> Self {
        self.faults = Faults::new(hook);
        self
    }

    /// Starts the private runtime (one thread), creates the lease tables if missing and
    /// checks their version, then opens a liveness and a transition connection (for the first
    /// acquire, and the first renew or release).
    ///
    /// # Errors
    ///
    /// - [`Error::Database`] when the connection string is invalid, the server cannot be
    ///   reached or the tables cannot be created;
    /// - [`Error::SchemaVersion`] when they were created by an incompatible version;
    /// - [`Error::SessionNotKept`] when the connections do not keep server sessions of their
    ///   own (a transaction-mode pooler; see the [module documentation](self)).
    pub fn connect(self) -> Result<PgLease, Error> {
        let db = |op| {
            move |e: Box<dyn std::error::Error + Send + Sync>| Error::Database {
                op,
                id: None,
                source: e,
            }
        };
        let mut base: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e: tokio_postgres::Error| db("parse the connection string")(Box::new(e)))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("flocklease-pg")
            .enable_all()
            .build()
            .map(conn::Rt::new)
            .map_err(|e| db("start the runtime")(Box::new(e)))?;
        let connector = tls::Connector::choose(self.tls.as_ref(), &mut base)?;
        // The bound of a transition connection's round trip (see `conn::Role::reply_bound`).
        let bound = Configs::new(connector.clone(), &base, self.lock_timeout, self.ttl, "")
            .transition
            .reply_bound;
        let table = schema::ensure(&rt, &connector, &base, bound)?;
        let configs = Configs::new(connector, &base, self.lock_timeout, self.ttl, &table);
        let open = Arc::new(OpenSessions::default());
        // One liveness connection up front, so the first acquire does not wait for a connect
        // (closed like any pooled connection after the idle timeout).
        let first_live = conn::connect_unset(&rt, &configs.connector, &configs.liveness, &open)
            .map_err(|e| e.into_error("connect a liveness connection", None))?;
        // And one transition connection, opened while the liveness one is open: through a
        // transaction-mode pooler both would report the same server session, so such a pooler
        // is refused here rather than at the first transition (see `conn::OpenSessions`).
        let first_tx = conn::connect(&rt, &configs.connector, &configs.transition, &open)
            .map_err(|e| e.into_error("connect", None))?;
        // Only now, with both checks passed, the liveness connection's settings.
        conn::apply(&rt, &first_live, &configs.liveness)
            .map_err(|e| e.into_error("connect a liveness connection", None))?;
        let tx_pool = Arc::new(Mutex::new(vec![first_tx]));
        let live_pool = Arc::new(Mutex::new(vec![first_live]));
        if let Some(idle) = self.idle_timeout {
            rt.spawn(pool::close_idle(
                [Arc::downgrade(&tx_pool), Arc::downgrade(&live_pool)],
                idle,
            ));
        }
        // Until a transition measures the server's clock, the estimate is this host's wall
        // clock.
        let offset =
            crate::clock::SystemClock.now().unix_nanos() - self.local_clock.now().unix_nanos();
        let offset_nanos = Arc::new(AtomicI64::new(
            offset.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
        ));
        let clock: Arc<dyn Clock> = match &self.clock {
            Some(c) => Arc::clone(c),
            None => Arc::new(ServerClock {
                local: Arc::clone(&self.local_clock),
                offset_nanos: Arc::clone(&offset_nanos),
            }),
        };
        let inner = Inner {
            rt,
            configs,
            lock_timeout: self.lock_timeout,
            clock: self.clock,
            local_clock: self.local_clock,
            offset_nanos,
            faults: self.faults,
            tx_pool,
            live_pool,
            open,
        };
        Ok(Leases::with(inner, self.ttl, self.lock_timeout, clock))
    }
}

/// This host's boot-time clock (`CLOCK_BOOTTIME`: monotonic, counts a suspend, not moved by
/// a step of the wall clock), as a [`Timestamp`] that many nanoseconds after the epoch. The
/// default local clock of [`PgLease`]: only differences of its readings are used (the
/// server's clock is estimated as its last reading plus the time elapsed here since), so a
/// wall-clock step on this host moves no estimate (issue 32.4).
#[derive(Debug, Default, Clone, Copy)]
struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Timestamp {
        let nanos = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
            i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
        });
        Timestamp::from_unix_nanos(nanos).unwrap_or(Timestamp::MAX)
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

/// Everything but the public face, so the transaction can borrow it.
pub struct Inner {
    rt: conn::Rt,
    configs: Configs,
    /// The front's lock timeout, for the statements' own bounds.
    lock_timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    local_clock: Arc<dyn Clock>,
    offset_nanos: Arc<AtomicI64>,
    faults: Faults,
    tx_pool: Arc<Mutex<Vec<Conn>>>,
    live_pool: Arc<Mutex<Vec<Conn>>>,
    /// The server sessions of every open connection, each a different one.
    open: Arc<OpenSessions>,
}

impl Inner {
    /// Records the server's clock offset from this host's: `arrived`, the server's clock when
    /// a round trip's first message arrived, minus `sent`, this host's clock just before it
    /// was sent (see [`PgLease::clock`]). Not after a wait for a holder ahead of the round
    /// trip, which would add the wait's length; the call measured it in its first attempt.
    fn measured(&self, arrived: Timestamp, sent: Timestamp) {
        let offset =
            (arrived.unix_nanos() - sent.unix_nanos()).clamp(i64::MIN.into(), i64::MAX.into());
        self.offset_nanos.store(offset as i64, Ordering::Relaxed);
    }

    /// The connection a transition on `id` runs on, and the speculative probe its first round
    /// trip sends. An acquire runs on an idle liveness connection, which keeps the new
    /// generation's lock if one is taken (the lock goes with the commit statement, see
    /// `PgTx::commit`), and probes the generation the row names, unless this instance holds it
    /// (it may have to lock it again).
    fn run_conn(
        &self,
        id: &SessionId,
        acquire: bool,
        state: &IdState,
    ) -> Result<(Conn, Option<Option<i64>>), Error> {
        if acquire {
            let local = state.local.as_ref().map(|g| g.local.token as i64);
            Ok((self.live_conn(id)?, Some(local)))
        } else {
            Ok((self.tx_conn(Some(id))?, None))
        }
    }
}

/// The advisory key and record of a lease row `(key, owner, token, expiry)`.
fn row_record(id: &SessionId, row: &Row) -> Result<(i32, Option<Record>), Error> {
    let col = conn::mismatch;
    let key: i32 = row.try_get(0).map_err(col)?;
    let record = tx::record_of(
        id,
        row.try_get(1).map_err(col)?,
        row.try_get(2).map_err(col)?,
        row.try_get(3).map_err(col)?,
    )?;
    Ok((key, record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn boot_nanos() -> i128 {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).unwrap();
        i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
    }

    #[test]
    fn the_default_local_clock_is_the_boot_time_clock() {
        let before = boot_nanos();
        let read = BootClock.now().unix_nanos();
        let after = boot_nanos();
        assert!(
            before <= read && read <= after,
            "{before} <= {read} <= {after}"
        );
    }

    #[test]
    fn the_server_estimate_moves_only_with_the_local_clock_elapsed() {
        let local = Arc::new(ManualClock::new(Timestamp::from_unix_secs(100).unwrap()));
        let offset_nanos = Arc::new(AtomicI64::new(0));
        let server = ServerClock {
            local: Arc::clone(&local) as Arc<dyn Clock>,
            offset_nanos: Arc::clone(&offset_nanos),
        };
        // Measured: the server read 1_700_000_000 s when the local clock read 100 s.
        let arrived = Timestamp::from_unix_secs(1_700_000_000).unwrap();
        offset_nanos.store(
            (arrived.unix_nanos() - local.now().unix_nanos()) as i64,
            Ordering::Relaxed,
        );
        assert_eq!(server.now(), arrived);
        local.advance(Duration::from_secs(7));
        assert_eq!(
            server.now(),
            Timestamp::from_unix_secs(1_700_000_007).unwrap()
        );
    }
}
