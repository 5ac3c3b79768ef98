//! Connections: settings per role (transition or liveness), the "session ended" signal of each
//! connection, the check that each connection keeps one server session of its own, prepared
//! statements, and running one statement through the fault seam.

use std::collections::HashMap;
use std::future::Future;
use std::mem;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, SimpleQueryMessage, Statement};

use super::fault::{PgFault, PgStep};
use super::tls::Connector;
use crate::error::Error;
use crate::name::SessionId;

type Notify = Box<dyn FnOnce() + Send>;

/// Set once, when a connection's session ends (closed by us, by the server, or by the
/// network); runs the callbacks registered until then, once.
#[derive(Default)]
pub(super) struct Ended {
    flag: AtomicBool,
    waiters: Mutex<Vec<Notify>>,
}

impl Ended {
    fn fire(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let waiters = mem::take(&mut *lock(&self.waiters));
        for f in waiters {
            f();
        }
    }

    /// Whether the session has ended.
    pub(super) fn is_ended(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Calls `f` when the session ends; if it has, gives `f` back for the caller to call
    /// (once it holds none of its own locks: `f` may call into the lease manager).
    pub(super) fn subscribe(&self, f: Notify) -> Option<Notify> {
        let mut waiters = lock(&self.waiters);
        if self.is_ended() {
            Some(f)
        } else {
            waiters.push(f);
            None
        }
    }

    /// Forgets the callbacks (the generation they watch was given up on purpose).
    pub(super) fn clear(&self) {
        drop(mem::take(&mut *lock(&self.waiters)));
    }
}

/// The warnings a connection's server session sent (see [`Conn::warnings`]).
#[derive(Default)]
pub(crate) struct Warnings {
    count: AtomicU64,
    last: Mutex<String>,
}

impl Warnings {
    /// Counts `notice` if its severity is `WARNING` (notices of lower severity say nothing
    /// about a statement's outcome).
    pub(super) fn note(&self, notice: &tokio_postgres::error::DbError) {
        use tokio_postgres::error::Severity;
        let warning = match notice.parsed_severity() {
            Some(s) => s == Severity::Warning,
            None => notice.severity() == "WARNING",
        };
        if warning {
            let mut said = notice.message().to_owned();
            if let Some(detail) = notice.detail() {
                said.push_str(": ");
                said.push_str(detail);
            }
            *lock(&self.last) = said;
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many warnings came so far.
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// The last warning's message and detail, in the server's words.
    pub(super) fn last(&self) -> String {
        lock(&self.last).clone()
    }
}

/// The statements prepared on every connection (transition and liveness alike: one round trip
/// at connect, pipelined).
pub(super) struct Stmts {
    pub(super) begin: Statement,
    pub(super) commit: Statement,
    pub(super) rollback: Statement,
    pub(super) lock_row: Statement,
    pub(super) insert_row: Statement,
    pub(super) clock: Statement,
    pub(super) probe: Statement,
    pub(super) probe_row: Statement,
    pub(super) update: Statement,
    pub(super) wait_timeout: Statement,
    pub(super) wait: Statement,
    pub(super) lock_live: Statement,
    pub(super) commit_live: Statement,
    pub(super) unlock: Statement,
}

/// One connection with its backend pid and its end signal.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) pid: i32,
    /// Set once its server session was told to end (`pg_terminate_backend`): it is not told
    /// again, since the server may have given its pid to another session meanwhile.
    pub(super) terminated: AtomicBool,
    /// Set when its transactions turned out to run in another server session than its own
    /// (a transaction-mode pooler): never pooled, and its own session, which may serve other
    /// clients now, is never ended on its account.
    disowned: AtomicBool,
    pub(super) ended: Arc<Ended>,
    /// The warnings its server session sent, counted as they arrive: a `COMMIT` answered with
    /// success after a `WARNING` (a synchronous-replication wait cancelled by an operator's
    /// `pg_cancel_backend`) committed on this server alone, maybe.
    pub(super) warnings: Arc<Warnings>,
    pub(super) stmts: Stmts,
    /// The mark of its server session (see [`claim`]).
    pub(super) nonce: String,
    /// Set when a step's outcome is unknown: the connection must not be reused.
    poisoned: AtomicBool,
    /// Its entry among the instance's open connections, removed when it is dropped.
    _open: Registered,
    /// Since when it has been waiting in a pool (for closing idle connections).
    pub(super) idle_since: std::time::Instant,
    /// The longest wait for a reply that is not a lock wait's (see [`Role::reply_bound`]).
    pub(super) reply_bound: Duration,
    /// The task driving the connection (see [`Conn::close_now`]).
    task: tokio::task::AbortHandle,
    /// Whether it is a liveness connection (its pool, and its settings: see [`Configs`]).
    pub(super) liveness: bool,
}

/// The server sessions (backend pids) of one instance's open connections.
///
/// Two connections open at the same time never share a server session when they reach the
/// server directly or through a session-mode pooler: each has its own backend process. A
/// transaction-mode pooler runs each transaction on whichever server connection is idle, and
/// reusing the most recently released one first (PgBouncer's default) hands one server
/// session to every client that runs one statement after another. So a connection that
/// reports the pid of another open connection is refused.
#[derive(Default)]
pub(super) struct OpenSessions {
    /// Serial number → (backend pid, the connection's end signal).
    open: Mutex<HashMap<u64, (i32, Arc<Ended>)>>,
    next: AtomicU64,
}

impl OpenSessions {
    /// Records a new connection to `pid`, unless an open connection already reports `pid`.
    /// Connections whose session has ended are not compared: the server may give a dead
    /// backend's pid to a new one.
    fn register(self: &Arc<Self>, pid: i32, ended: &Arc<Ended>) -> Result<Registered, Fail> {
        let mut open = lock(&self.open);
        if open.values().any(|(p, e)| *p == pid && !e.is_ended()) {
            return Err(Fail::SessionNotKept(format!(
                "a new connection reported server session {pid}, which already serves another \
                 open connection of this instance"
            )));
        }
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        open.insert(serial, (pid, Arc::clone(ended)));
        Ok(Registered {
            sessions: Arc::clone(self),
            serial,
        })
    }
}

/// A connection's entry in [`OpenSessions`], removed on drop.
struct Registered {
    sessions: Arc<OpenSessions>,
    serial: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.sessions.open).remove(&self.serial);
    }
}

impl Conn {
    /// Whether it may go back to a pool.
    pub(super) fn reusable(&self) -> bool {
        self.answers() && !self.is_disowned()
    }

    /// Whether it still takes statements whose outcome is known.
    pub(super) fn answers(&self) -> bool {
        !self.poisoned.load(Ordering::Relaxed) && !self.ended.is_ended() && !self.client.is_closed()
    }

    /// Marks it as not keeping its server session (see the field).
    pub(super) fn disown(&self) {
        self.disowned.store(true, Ordering::Relaxed);
    }

    /// Whether [`Conn::disown`] was called.
    pub(super) fn is_disowned(&self) -> bool {
        self.disowned.load(Ordering::Relaxed)
    }

    /// Marks it unusable.
    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::Relaxed);
    }

    /// Closes the socket now, even with replies outstanding (a dropped client keeps its
    /// connection open until the server has answered everything sent), and reports the
    /// session ended to whoever watches it.
    pub(super) fn close_now(self) {
        self.shut();
    }

    /// [`Conn::close_now`], keeping the handle (then useless: poisoned and ended).
    pub(super) fn shut(&self) {
        self.poison();
        self.task.abort();
        self.ended.fire();
    }
}

/// Whether an error the server sent in reply to a statement says the statement did not take
/// effect. Not when the error ended the session (severity `FATAL` or `PANIC`: an
/// administrator's `pg_terminate_backend`, a shutdown, a crash of another backend), nor for
/// SQLSTATE class 08 (connection exception) or class 57 (operator intervention) other than
/// `57014` (the statement was cancelled): those can arrive after a `COMMIT` took effect and
/// before its reply (issue 32.3).
pub(crate) fn answer_settles(severity: &str, sqlstate: &str) -> bool {
    let session_ended = matches!(severity, "FATAL" | "PANIC");
    let intervention = sqlstate.starts_with("57") && sqlstate != "57014";
    !(session_ended || intervention || sqlstate.starts_with("08"))
}

/// The error's severity, not localized (`V` field) when the server sent one.
fn severity(db: &tokio_postgres::error::DbError) -> &str {
    use tokio_postgres::error::Severity;
    match db.parsed_severity() {
        Some(Severity::Fatal) => "FATAL",
        Some(Severity::Panic) => "PANIC",
        Some(_) => "ERROR",
        None => db.severity(),
    }
}

/// Why a step failed.
#[derive(Debug)]
pub(super) enum Fail {
    /// The driver's error: the server's answer, or a connection failure.
    Db(tokio_postgres::Error),
    /// An injected lost reply.
    LostReply,
    /// The connection does not keep one server session of its own (what was seen).
    SessionNotKept(String),
    /// No reply within this bound: the server (or the network to it) is stuck.
    NoReply(Duration),
    /// Inside a current-thread async runtime, the thread to run the call on could not be
    /// started, or it panicked (see [`block`]).
    AsyncContext,
}

impl Fail {
    /// Whether the server answered "lock not available" (the row lock timed out).
    pub(super) fn is_lock_timeout(&self) -> bool {
        matches!(self, Fail::Db(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE))
    }

    /// Whether the server may have run the step: no answer came back, or the answer was the
    /// session's end rather than the statement's (see [`answer_settles`]).
    pub(super) fn outcome_unknown(&self) -> bool {
        match self {
            Fail::Db(e) => e
                .as_db_error()
                .is_none_or(|db| !answer_settles(severity(db), db.code().code())),
            Fail::LostReply | Fail::NoReply(_) => true,
            Fail::SessionNotKept(_) | Fail::AsyncContext => false,
        }
    }

    /// The caller's error.
    pub(super) fn into_error(self, op: &'static str, id: Option<&SessionId>) -> Error {
        let source: Box<dyn std::error::Error + Send + Sync> = match self {
            Fail::Db(e) => match pooler_symptom(&e) {
                Some(detail) => return Error::SessionNotKept { detail },
                None => Box::new(e),
            },
            Fail::AsyncContext => return Error::AsyncContext,
            Fail::LostReply => "injected fault: the reply was lost".into(),
            Fail::NoReply(bound) => format!(
                "no reply from the server within {} ms (stuck, or unreachable); the connection \
                 was given up",
                bound.as_millis()
            )
            .into(),
            Fail::SessionNotKept(detail) => return Error::SessionNotKept { detail },
        };
        Error::Database {
            op,
            id: id.cloned(),
            source,
        }
    }
}

/// What an error says about the connection's server session, when it is the mark of a
/// pooler that does not keep one session per client: a statement prepared on this connection
/// is unknown to the server session that got the next message (or one prepared by another
/// client is there already), or a protocol violation, which the driver never commits: a
/// pooler's refusal (PgBouncer's statement mode refuses every transaction block). The
/// server's or pooler's own message is kept.
pub(super) fn pooler_symptom(e: &tokio_postgres::Error) -> Option<String> {
    let Some(db) = e.as_db_error() else {
        // A reply row that does not fit its statement (a column missing, or of another
        // type), or a reply message the protocol does not allow at that point: the reply of
        // another client's statement, mixed in by the pooler.
        let text = e.to_string();
        return (text.starts_with("error retrieving column")
            || text.starts_with("error deserializing column")
            || text == "unexpected message from server")
            .then(|| mismatch_detail(e));
    };
    let code = db.code();
    if code == &SqlState::INVALID_SQL_STATEMENT_NAME || code == &SqlState::DUPLICATE_PSTATEMENT {
        Some(format!(
            "a statement prepared on this connection met another server session, or a used \
             one (a session-mode pooler needs server_reset_query = DISCARD ALL): \"{}\"",
            db.message()
        ))
    } else if code == &SqlState::PROTOCOL_VIOLATION && db.message().contains("pooling mode") {
        // PgBouncer's refusal of a transaction in statement mode; its other protocol errors
        // (timeouts, a crashed server connection) are no sign of the mode.
        Some(format!("refused in between: \"{}\"", db.message()))
    } else {
        None
    }
}

/// What a reply row that does not fit its statement says: see [`mismatch`].
fn mismatch_detail(e: &tokio_postgres::Error) -> String {
    format!(
        "a reply did not fit its statement ({e}): a pooler ran another client's statement of \
         the same name, or mixed replies"
    )
}

/// The error for a reply row that does not fit its statement (a column missing, or of
/// another type), read with `try_get`: never a panic, and the cause is the connection's
/// session, as for [`pooler_symptom`].
pub(super) fn mismatch(e: tokio_postgres::Error) -> Error {
    Error::SessionNotKept {
        detail: mismatch_detail(&e),
    }
}

/// Runs `f` on `rt`, giving up after `bound`: a server that stops answering (a stopped or
/// stuck backend, a network that drops everything while TCP keepalives are still answered by
/// the peer's kernel) never blocks a caller for longer.
pub(super) fn within<T: Send>(
    rt: &Runtime,
    bound: Duration,
    f: impl Future<Output = T> + Send,
) -> Result<T, Fail> {
    // The timer is made inside the runtime, whose time driver it needs.
    block(rt, async { tokio::time::timeout(bound, f).await })?.map_err(|_| Fail::NoReply(bound))
}

/// The private runtime, shut down without waiting when it is dropped from inside an async
/// runtime (where a blocking shutdown would panic).
pub(super) struct Rt(Option<Runtime>);

impl Rt {
    pub(super) fn new(rt: Runtime) -> Rt {
        Rt(Some(rt))
    }
}

impl std::ops::Deref for Rt {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("taken only on drop")
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            // Its connections' tasks stop; their sockets close, and the server ends their
            // sessions (and unlocks what they held).
            rt.shutdown_background();
        }
    }
}

/// Runs `f` to completion on the private runtime `rt`, from any thread.
///
/// Called from a task of a multi-thread async runtime (the caller's, or the private one's
/// own thread), the wait is announced to that runtime first (`block_in_place`): it moves the
/// worker's other tasks to another thread, so the caller's executor is not blocked. Inside a
/// current-thread runtime's context (its own thread, or a `spawn_blocking` thread of it),
/// where neither `block_on` nor `block_in_place` may be called, the future runs on a thread
/// of its own while this one waits: on the runtime's own thread that blocks its other tasks
/// for the call's round trips (as any blocking call would; use `spawn_blocking` there).
/// Never a panic.
pub(super) fn block<F>(rt: &Runtime, f: F) -> Result<F::Output, Fail>
where
    F: Future + Send,
    F::Output: Send,
{
    match tokio::runtime::Handle::try_current() {
        Err(_) => Ok(rt.block_on(f)),
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            Ok(tokio::task::block_in_place(|| rt.block_on(f)))
        }
        Ok(_) => std::thread::scope(|s| {
            std::thread::Builder::new()
                .name("flocklease-pg-call".into())
                .spawn_scoped(s, || rt.block_on(f))
                .map_err(|_| Fail::AsyncContext)?
                .join()
                .map_err(|_| Fail::AsyncContext)
        }),
    }
}

impl super::Inner {
    /// Runs the future `f` (a statement on `conn`) as step `step`, through the fault seam,
    /// within the connection's reply bound (see [`within`]; on expiry the connection is
    /// poisoned, its outcome unknown).
    pub(super) fn exec<'c, T, F>(
        &self,
        step: PgStep,
        conn: &'c Conn,
        f: impl FnOnce(&'c Conn) -> F,
    ) -> Result<T, Fail>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>> + Send,
        T: Send,
    {
        self.exec_within(step, conn, conn.reply_bound, f)
    }

    /// [`Inner::exec`](super::Inner::exec) with a longer bound than the connection's (a wait
    /// for a holder ahead of the statement).
    pub(super) fn exec_within<'c, T, F>(
        &self,
        step: PgStep,
        conn: &'c Conn,
        bound: Duration,
        f: impl FnOnce(&'c Conn) -> F,
    ) -> Result<T, Fail>
    where
        F: Future<Output = Result<T, tokio_postgres::Error>> + Send,
        T: Send,
    {
        if let Some(fault) = self.faults.check(step, conn.pid) {
            return Err(inject(&self.rt, fault, conn, f));
        }
        let out = within(&self.rt, bound, f(conn)).and_then(|r| r.map_err(Fail::Db));
        if let Err(e) = &out
            && e.outcome_unknown()
        {
            conn.poison();
        }
        out
    }
}

/// Makes the statement `f` on `conn` fail as `fault` says, and returns the failure: the server
/// answers an error (`SELECT 1/0` is sent instead), or it runs `f` and the reply is lost (the
/// connection is poisoned).
pub(super) fn inject<'c, T, F>(
    rt: &Runtime,
    fault: PgFault,
    conn: &'c Conn,
    f: impl FnOnce(&'c Conn) -> F,
) -> Fail
where
    F: Future<Output = Result<T, tokio_postgres::Error>> + Send,
    T: Send,
{
    match fault {
        PgFault::Fail => match block(rt, conn.client.simple_query("SELECT 1/0")) {
            Ok(Err(e)) => Fail::Db(e),
            Ok(Ok(_)) => Fail::LostReply,
            Err(fail) => fail,
        },
        PgFault::LoseReply => {
            let _ = block(rt, f(conn));
            conn.poison();
            Fail::LostReply
        }
    }
}

/// A wait for the end of a holder's generation `(key, token)`, at most `wait` long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HolderWait {
    pub(super) key: i32,
    pub(super) token: u64,
    pub(super) wait: Duration,
}

/// What the first round trip of a transition reads.
pub(super) struct FirstRead {
    /// The lease row, if any.
    pub(super) row: Option<tokio_postgres::Row>,
    /// `clock_timestamp()` after the row lock.
    pub(super) clock: tokio_postgres::Row,
    /// `transaction_timestamp()`: when the transaction's `BEGIN` arrived, before the row
    /// lock (after the wait for a holder, if any).
    pub(super) arrived: super::sqltime::SqlTime,
    /// The recorded generation's liveness, probed under the row lock: `(token mod 2^32 as
    /// the key's int4, free)`.
    pub(super) probe: Option<(i32, bool)>,
}

/// The first round trip of a transition, pipelined: `BEGIN`, the row locked and read, the
/// server's clock, and — for an acquire — a speculative probe of the recorded generation
/// (the server runs them in order, so both come after the lock).
///
/// The probe is a shared try-lock held until the transaction ends. It saves a round trip
/// when the machine asks for it (an acquire over a live-looking holder) and harms no one when
/// it does not: shared locks exclude only a holder's exclusive lock, and a generation is
/// locked exclusively only under its row lock — by this very transaction only when it
/// restores this instance's own generation, which is why the probe skips `local_token`.
///
/// A waiting acquire sends its wait for the holder ahead of all that, in a transaction of its
/// own (`pg_advisory_xact_lock_shared` on the holder's generation, bounded by a local
/// `lock_timeout`, then `ROLLBACK`): the server locks the row the moment the holder is gone,
/// with no round trip between. The wait running out is no error: the read that follows says
/// where the lease stands.
pub(super) async fn lock_and_read(
    c: &Conn,
    id: &str,
    probe: Option<Option<i64>>,
    wait: Option<HolderWait>,
    lock_left: Option<Duration>,
) -> Result<FirstRead, tokio_postgres::Error> {
    let left = lock_left.map(|d| format!("{}ms", d.as_millis().clamp(1, i32::MAX as u128)));
    let left_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&left];
    let shorten = async {
        match &left {
            // For this transaction only: the caller waited for its turn already.
            Some(_) => c
                .client
                .query_one(&c.stmts.wait_timeout, &left_params)
                .await
                .map(drop),
            None => Ok(()),
        }
    };
    let wait = wait.map(|w| {
        let ms = format!("{}ms", w.wait.as_millis().clamp(1, i32::MAX as u128));
        (w.key, super::tx::gen_key(w.token), ms)
    });
    let waited = async {
        let Some((key, gk, ms)) = &wait else {
            return Ok(());
        };
        let p1: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [ms];
        let p2: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [key, gk];
        let (begin, timeout_set, lock, rollback) = tokio::join!(
            c.client.execute(&c.stmts.begin, &[]),
            c.client.query_one(&c.stmts.wait_timeout, &p1),
            c.client.execute(&c.stmts.wait, &p2),
            c.client.execute(&c.stmts.rollback, &[]),
        );
        begin?;
        timeout_set?;
        if let Err(e) = lock
            && e.code() != Some(&SqlState::LOCK_NOT_AVAILABLE)
        {
            return Err(e);
        }
        rollback.map(drop)
    };
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
    let local = probe.flatten();
    let probe_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &local];
    let speculate = async {
        match probe {
            Some(_) => c.client.query_opt(&c.stmts.probe_row, &probe_params).await,
            None => Ok(None),
        }
    };
    let mark: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&c.nonce];
    let (waited, begin, shortened, row, clock, probe) = tokio::join!(
        waited,
        c.client.execute(&c.stmts.begin, &[]),
        shorten,
        c.client.query_opt(&c.stmts.lock_row, &params),
        c.client.query_one(&c.stmts.clock, &mark),
        speculate,
    );
    // The first failure in statement order is the cause (the later ones only say "aborted").
    waited?;
    begin?;
    shortened?;
    let row = row?;
    let clock = clock?;
    let arrived = clock.try_get(3)?;
    let probe = match probe? {
        Some(r) => Some((r.try_get(0)?, r.try_get(1)?)),
        None => None,
    };
    Ok(FirstRead {
        row,
        clock,
        arrived,
        probe,
    })
}

/// Connects with `config` on `rt`, checks that the connection keeps one server session of its
/// own, and prepares the statements.
///
/// The check costs no round trip of its own (two, as before: the first pid read, then the
/// second with every statement's preparation): the session's pid is read twice, in two
/// consecutive transactions with nothing of ours between them, and must be the same both
/// times and differ from every other open connection's of the instance (`open`). A
/// transaction-mode pooler fails the first comparison when it moves a client to another idle
/// server connection for its next transaction (PgBouncer's `server_round_robin`), and the
/// second when it keeps giving the same one to every client (its default). Either way, or if
/// the statements cannot be prepared, the connection is closed (dropped) before returning.
pub(super) fn connect(
    rt: &Runtime,
    connector: &Connector,
    role: &Role,
    open: &Arc<OpenSessions>,
) -> Result<Conn, Fail> {
    let conn = connect_unset(rt, connector, role, open)?;
    apply(rt, &conn, role)?;
    Ok(conn)
}

/// Applies `role`'s server-side settings to `conn` (one round trip). Only after the checks
/// of [`connect_unset`] passed: through a transaction-mode pooler, settings sent earlier would
/// stay on a server connection the pooler hands to other clients.
pub(super) fn apply(rt: &Runtime, conn: &Conn, role: &Role) -> Result<(), Fail> {
    within(
        rt,
        role.reply_bound,
        conn.client.simple_query(&role.settings),
    )?
    .map(drop)
    .map_err(Fail::Db)
}

/// Like [`connect`], without applying the role's server-side settings yet (see [`apply`]).
pub(super) fn connect_unset(
    rt: &Runtime,
    connector: &Connector,
    role: &Role,
    open: &Arc<OpenSessions>,
) -> Result<Conn, Fail> {
    within(rt, role.reply_bound, async {
        let warnings = Arc::new(Warnings::default());
        let (client, connection) = connector
            .connect(&role.config, Arc::clone(&warnings))
            .await
            .map_err(Fail::Db)?;
        let ended = Arc::new(Ended::default());
        let signal = Arc::clone(&ended);
        let task = tokio::spawn(async move {
            // Resolves when the session ends, for whatever reason (the server's 57P01, EOF,
            // a TCP timeout, or the client dropped).
            let _ = connection.await;
            signal.fire();
        })
        .abort_handle();
        let nonce = fresh_nonce();
        let first = claim(&client, &nonce).await?;
        // The second read is polled first, so it is sent ahead of the preparations: the next
        // transaction of this client after the claim.
        let (again, stmts) = tokio::join!(owner_of(&client), prepare(&client, &role.table));
        let (again, mark) = again?;
        if again != first || mark.as_deref() != Some(nonce.as_str()) {
            return Err(Fail::SessionNotKept(format!(
                "one connection's consecutive statements ran in server sessions {first} and \
                 {again}, the second {} this connection's mark",
                if mark.as_deref() == Some(nonce.as_str()) {
                    "with"
                } else {
                    "without"
                }
            )));
        }
        // Compared before the preparations' outcome: a pooler that mixes sessions may have
        // failed them too, and this is the cause.
        let registered = open.register(first, &ended)?;
        Ok(Conn {
            pid: first,
            terminated: AtomicBool::new(false),
            disowned: AtomicBool::new(false),
            client,
            ended,
            warnings,
            stmts: stmts.map_err(Fail::Db)?,
            nonce,
            poisoned: AtomicBool::new(false),
            _open: registered,
            idle_since: std::time::Instant::now(),
            reply_bound: role.reply_bound,
            task,
            liveness: role.liveness,
        })
    })?
}

/// The server-side setting that marks a server session as one connection's own.
pub(super) const MARK: &str = "flocklease.session";

/// A fresh random mark (32 hex digits) for a new connection's server session.
fn fresh_nonce() -> String {
    use crate::flock::live::fresh_tag;
    format!("{:016x}{:016x}", fresh_tag().0, fresh_tag().0)
}

/// An SQL boolean expression: whether the statement runs in the server session marked with
/// the nonce `mark` stands for (see [`claim`]): a bind parameter (`$3`) in a prepared
/// statement, never the nonce's text, since statement names repeat across processes (a
/// pooler that lets one client's Bind reach another client's session would run that client's
/// statement text, its nonce included), but a Bind's parameters are the sender's. Put in
/// every statement that takes, keeps or gives up a lock the session is to hold: the proof and
/// the lock are one statement, so no pooler can put a statement of this connection in another
/// client's session unseen.
pub(super) fn ours(mark: &str) -> String {
    format!("coalesce(current_setting('{MARK}', true) = {mark}::text, false)")
}

/// Marks the connection's server session as its own, by the simple protocol (one message,
/// which any pooler runs in one server session, and no statement left prepared): sets
/// [`MARK`] to `nonce` for the session, unless the session holds advisory locks, which can
/// only be another connection's (a fresh session, or one reset by a session-mode pooler, holds
/// none). Returns the session's pid.
///
/// With every lock statement proving the mark ([`ours`]), this makes "each advisory lock a
/// session holds was taken by the connection whose mark the session bears" an invariant: a
/// mark changes only in a session that holds no advisory lock, and a lock is taken only in a
/// session bearing the taker's mark. Through a transaction- or statement-mode pooler, a
/// statement that lands in another session than the one this connection marked is refused,
/// whoever's session it is.
async fn claim(c: &Client, nonce: &str) -> Result<i32, Fail> {
    let sql = format!(
        "SELECT pg_backend_pid(), CASE WHEN NOT EXISTS (SELECT 1 FROM pg_locks \
         WHERE pid = pg_backend_pid() AND locktype = 'advisory') \
         THEN set_config('{MARK}', '{nonce}', false) END"
    );
    let reply = c.simple_query(&sql).await.map_err(Fail::Db)?;
    let row = reply
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .ok_or_else(|| Fail::SessionNotKept("the session's mark could not be read".into()))?;
    let pid: i32 = row
        .try_get(0)
        .ok()
        .flatten()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Fail::SessionNotKept("pg_backend_pid() returned no pid".into()))?;
    if row.try_get(1).ok().flatten() != Some(nonce) {
        return Err(Fail::SessionNotKept(format!(
            "a new connection was given server session {pid}, which holds another \
             connection's advisory locks: a pooler handed over a used server session without \
             resetting it (a session-mode pooler needs server_reset_query = DISCARD ALL, \
             PgBouncer's default)"
        )));
    }
    Ok(pid)
}

/// The server session's pid and its [`MARK`], by the simple protocol.
async fn owner_of(c: &Client) -> Result<(i32, Option<String>), Fail> {
    let sql = format!("SELECT pg_backend_pid(), current_setting('{MARK}', true)");
    let reply = c.simple_query(&sql).await.map_err(Fail::Db)?;
    reply
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some((
                row.try_get(0).ok()??.parse().ok()?,
                row.try_get(1).ok()?.map(str::to_owned),
            )),
            _ => None,
        })
        .ok_or_else(|| Fail::SessionNotKept("pg_backend_pid() returned no pid".into()))
}

async fn prepare(c: &Client, t: &str) -> Result<Stmts, tokio_postgres::Error> {
    // The nonce is each statement's last parameter (see `ours`).
    let (ours1, ours3, ours6) = (ours("$1"), ours("$3"), ours("$6"));
    let lock_row = format!("SELECT key, owner, token, expiry FROM {t} WHERE id = $1 FOR UPDATE");
    let insert_row = format!(
        "INSERT INTO {t} (id, owner, token, expiry) VALUES ($1, '', 0, 'epoch') \
         ON CONFLICT (id) DO NOTHING"
    );
    // `(token << 32) >> 32`: the token's low 32 bits as a signed int4 (`gen_key`).
    let probe_row = format!(
        "SELECT ((token << 32) >> 32)::int4, \
         pg_try_advisory_xact_lock_shared(key, ((token << 32) >> 32)::int4) \
         FROM {t} WHERE id = $1 AND token IS DISTINCT FROM $2::int8"
    );
    let update = format!("UPDATE {t} SET owner = $2, token = $3, expiry = $4 WHERE key = $1");
    // An acquire's commit on the liveness connection that is to hold the new generation: the
    // generation's session lock is tried first (the CTE is evaluated once), and the row is
    // updated only if it was granted. Returns whether it was, and the rows updated.
    // The lock is tried only in this connection's own server session (see `claim`); the
    // third column says whether it was that session.
    let commit_live = format!(
        "WITH mine AS MATERIALIZED (SELECT {ours6} AS ours), \
         live AS MATERIALIZED (SELECT CASE WHEN ours THEN \
         pg_try_advisory_lock($1::int4, $5::int4) ELSE false END AS got, ours FROM mine), \
         upd AS (UPDATE {t} SET owner = $2, token = $3, expiry = $4 FROM live \
         WHERE key = $1 AND live.got RETURNING 1) \
         SELECT got, (SELECT count(*) FROM upd), ours FROM live"
    );
    // The clock after the row lock, the transaction's server session, whether it is this
    // connection's, and the clock when the transaction's `BEGIN` arrived (before the lock).
    let clock =
        format!("SELECT clock_timestamp(), pg_backend_pid(), {ours1}, transaction_timestamp()");
    // NULL when the statement ran in another server session than this connection's.
    let lock_live = format!(
        "SELECT CASE WHEN {ours3} THEN pg_try_advisory_lock($1::int4, $2::int4) END, \
         pg_backend_pid()"
    );
    let unlock =
        format!("SELECT CASE WHEN {ours3} THEN pg_advisory_unlock($1::int4, $2::int4) END");
    // One pipeline: a single round trip.
    macro_rules! pipelined {
        ($($name:ident: $sql:expr),+) => {{
            let ($($name,)+) = tokio::try_join!($(c.prepare($sql)),+)?;
            Ok(Stmts { $($name),+ })
        }};
    }
    pipelined!(
        begin: "BEGIN",
        commit: "COMMIT",
        rollback: "ROLLBACK",
        lock_row: &lock_row,
        insert_row: &insert_row,
        clock: &clock,
        probe: "SELECT pg_try_advisory_xact_lock_shared($1::int4, $2::int4)",
        probe_row: &probe_row,
        update: &update,
        wait_timeout: "SELECT set_config('lock_timeout', $1, true)",
        wait: "SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)",
        lock_live: &lock_live,
        commit_live: &commit_live,
        unlock: &unlock
    )
}

/// The connection settings of each role, derived from the caller's.
#[derive(Clone)]
pub(super) struct Configs {
    /// Plain text or TLS, for every connection.
    pub(super) connector: Connector,
    /// Transition connections: the row lock is bounded by the server's `lock_timeout`.
    pub(super) transition: Role,
    /// Liveness connections: never ended for idleness; host death noticed well within the TTL
    /// by TCP keepalives and `tcp_user_timeout`, on both ends. An acquire's transaction runs
    /// on the one that is to hold its new generation, so they bound the row lock the same way.
    pub(super) liveness: Role,
}

/// How one role's connections are opened.
#[derive(Clone)]
pub(super) struct Role {
    /// The client side: the caller's connection string, with TCP settings.
    pub(super) config: Config,
    /// The server side, as `SET` statements sent once the connection passed its checks (not
    /// as the startup parameter `options`, which PgBouncer refuses or, told to ignore it,
    /// drops silently).
    pub(super) settings: String,
    /// How long a round trip (or a connect) may go unanswered before the connection is given
    /// up: the row lock's `lock_timeout` plus a third of the TTL (at least 1 s), the time the
    /// TCP settings give a dead network. Waits for a holder add their own length.
    pub(super) reply_bound: Duration,
    /// Whether its connections are liveness connections.
    pub(super) liveness: bool,
    /// The lease table's schema-qualified name ([`super::schema::ensure`]).
    pub(super) table: Arc<str>,
}

impl Configs {
    pub(super) fn new(
        connector: Connector,
        base: &Config,
        lock_timeout: Duration,
        ttl: Duration,
        table: &str,
    ) -> Configs {
        let table: Arc<str> = Arc::from(table);
        // Host death must be noticed before the TTL runs out: a third of it, at least 1 s
        // apart per probe (TCP's granularity).
        let idle = (ttl / 6).max(Duration::from_secs(1));
        let interval = (ttl / 12).max(Duration::from_secs(1));
        let user_timeout = (ttl / 3).max(Duration::from_secs(1));
        let lock_ms = lock_timeout.as_millis().clamp(1, i32::MAX as u128);
        let reply_bound = lock_timeout.saturating_add(user_timeout);
        // Both roles: TCP keepalives and a user timeout on this end.
        let with_tcp = || {
            let mut c = base.clone();
            c.keepalives(true)
                .keepalives_idle(idle)
                .keepalives_interval(interval)
                .keepalives_retries(2)
                .tcp_user_timeout(user_timeout);
            c
        };
        let mut transition = with_tcp();
        // A statement sent into a dead network fails within the user timeout instead of
        // TCP's ~15 minutes of retransmissions (a row-lock wait is not affected: the server
        // acknowledges the statement before it waits), and a pooled connection whose peer
        // vanished is found dead by keepalives.
        let mut liveness = with_tcp();
        if base.get_application_name().is_none() {
            transition.application_name("flocklease");
            liveness.application_name("flocklease-liveness");
        }
        // The server side of both roles: TCP keepalives and a user timeout, so a session whose
        // client host vanished is ended by the server (and what it holds released) within a
        // third of the TTL; and an open transaction left idle is ended after
        // `idle_in_transaction` (a client stopped, hung, or gone silent in the middle of a
        // transition, holding the row lock). And `synchronous_commit` at least `on`, so a
        // commit is flushed, and confirmed by the synchronous standbys the server names,
        // before its reply (a server whose default is `off` would lose grants in a crash:
        // `durable`).
        let tcp = format!(
            "SET tcp_keepalives_idle = {}; SET tcp_keepalives_interval = {}; \
             SET tcp_keepalives_count = 2; SET tcp_user_timeout = {}; {}; {}",
            idle.as_secs(),
            interval.as_secs(),
            user_timeout.as_millis(),
            idle_in_transaction_setting(lock_timeout, ttl),
            super::durable::synchronous_commit_setting(),
        );
        Configs {
            connector,
            transition: Role {
                config: transition,
                settings: format!("SET lock_timeout = {lock_ms}; {tcp}"),
                reply_bound,
                liveness: false,
                table: Arc::clone(&table),
            },
            liveness: Role {
                config: liveness,
                settings: format!(
                    "SET lock_timeout = {lock_ms}; SET idle_session_timeout = 0; \
                     SET statement_timeout = 0; {tcp}"
                ),
                reply_bound,
                liveness: true,
                table,
            },
        }
    }
}

/// How long the server keeps a session whose client went silent: the statement that sets
/// `idle_in_transaction_session_timeout` of every session the library opens, unless the
/// session has a shorter one already (the database's or role's own setting, which is never
/// loosened). The row lock of a transition whose client stopped answering between two of its
/// round trips is held at most this long. The lock timeout, at most a third of the TTL, at
/// least 1 s: a rival queued behind such a transition is given the row within its own lock
/// timeout, and the lease's holder (renewing every third of the TTL) within its next renew. A
/// transition of ours waits for no one between its round trips, so it never comes near this.
fn idle_in_transaction_setting(lock_timeout: Duration, ttl: Duration) -> String {
    let idle_in_transaction = lock_timeout.min(ttl / 3).max(Duration::from_secs(1));
    let ms = idle_in_transaction.as_millis().clamp(1, i32::MAX as u128);
    format!(
        "SELECT set_config('idle_in_transaction_session_timeout', \
         (CASE WHEN s = 0 OR s > {ms} THEN {ms} ELSE s END)::text, false) \
         FROM (SELECT (extract(epoch FROM \
         current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::int8 \
         AS s) AS current"
    )
}

pub(super) use crate::front::lock;

#[cfg(test)]
mod tests {
    use super::answer_settles;

    #[test]
    fn only_a_statement_error_settles_the_outcome() {
        // The statement failed: nothing it did stays.
        for code in ["40001", "55P03", "23505", "57014", "42P01"] {
            assert!(answer_settles("ERROR", code), "{code}");
        }
        // The session ended, perhaps after the COMMIT took effect.
        assert!(!answer_settles("FATAL", "57P01"));
        assert!(!answer_settles("FATAL", "57P02"));
        assert!(!answer_settles("FATAL", "XX000"));
        assert!(!answer_settles("PANIC", "XX000"));
        assert!(!answer_settles("ERROR", "57P01"));
        assert!(!answer_settles("ERROR", "08006"));
    }
}
