//! A throwaway PgBouncer in front of the test binary's throwaway PostgreSQL server
//! (`support/pg.rs`), one per test, so each test picks its own pool mode.
//!
//! The pooler is the system's `pgbouncer`, configured in a private temporary directory: a free
//! loopback port, no Unix socket, `auth_type = any` (every client logs in to the server as
//! `postgres`, which the server trusts), the requested `pool_mode`. It runs as the `postgres`
//! user when we are root (PgBouncer refuses root) under a tiny `sh` watchdog whose stdin is a
//! pipe from this process: when the guard is dropped, or the test binary exits or is killed,
//! the pipe closes and the watchdog kills the pooler by its pid (SIGKILL: a throwaway pooler
//! has nothing to flush; the kernel closes its server connections and the server ends those
//! sessions), then removes the directory. Readiness is the pooler's "process up" log line,
//! then an admin-console connection, polled with a bound; never a sleep.
//!
//! Without a `pgbouncer` binary the tests skip, saying so loudly on the terminal (past
//! libtest's output capture) — unless `FLOCKLEASE_REQUIRE_PG=1` (CI), which makes them fail.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::pg::{PgServer, REQUIRE};

/// A binary to use instead of the one found on `PATH` or in `/usr/sbin`.
pub const BIN_VAR: &str = "FLOCKLEASE_PGBOUNCER";

/// How long the pooler may take to start.
const START_BOUND: Duration = Duration::from_secs(30);

/// PgBouncer's `pool_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's lifetime.
    Session,
    /// A server connection per transaction: consecutive transactions of one client may run
    /// on different server connections, and one server connection serves many clients.
    Transaction,
    /// A server connection per statement; multi-statement transactions are refused.
    Statement,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// How to configure the pooler.
#[derive(Clone, Debug)]
pub struct Options {
    /// `pool_mode`.
    pub pool_mode: PoolMode,
    /// `server_round_robin`: `false` reuses the most recently released idle server
    /// connection first (LIFO, PgBouncer's default), `true` the least recently released one.
    pub round_robin: bool,
    /// `default_pool_size`: server connections per (database, user) pair; at least 2.
    pub pool_size: u32,
    /// `server_reset_query`: `true` keeps PgBouncer's default (`DISCARD ALL`); `false` sets
    /// it empty, so a server session goes to the next client as the last one left it.
    pub reset: bool,
}

impl Options {
    /// `pool_mode`, LIFO reuse, and room for every connection a test opens.
    pub fn new(pool_mode: PoolMode) -> Options {
        Options {
            pool_mode,
            round_robin: false,
            pool_size: 20,
            reset: true,
        }
    }
}

/// A running pooler; killed (by its pid) when dropped.
pub struct PgBouncer {
    /// Its loopback port.
    pub port: u16,
    /// The pooler's pid.
    pub pid: i32,
    /// Its version line (`SHOW VERSION` on the admin console).
    pub version: String,
    watchdog: Mutex<(Child, Option<ChildStdin>)>,
    log: Arc<Mutex<String>>,
}

impl PgBouncer {
    /// Starts a pooler in front of `server` with `options`. `None` (after a loud notice)
    /// when PgBouncer is not installed and not required.
    pub fn start(server: &PgServer, options: &Options) -> Option<PgBouncer> {
        let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
        let Some(bin) = find_bin() else {
            assert!(
                !required,
                "{REQUIRE}=1 but no pgbouncer binary was found (on PATH, in /usr/sbin, or \
                 ${BIN_VAR}); install the `pgbouncer` package"
            );
            skip_notice();
            return None;
        };
        assert!(
            options.pool_size >= 2,
            "default_pool_size must be at least 2"
        );
        let dir = tempfile::Builder::new()
            .prefix("flocklease-pgbouncer-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(&ini, config(server, port, options)).expect("write pgbouncer.ini");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("pgbouncer-watchdog")
            .arg(&bin)
            .arg(&dir)
            .arg(&ini)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if nix::unistd::geteuid().is_root() {
            use std::os::unix::process::CommandExt;
            let user = nix::unistd::User::from_name("postgres")
                .expect("getpwnam")
                .expect("a `postgres` user (PgBouncer refuses to run as root)");
            for path in [&dir, &ini] {
                nix::unistd::chown(path, Some(user.uid), Some(user.gid))
                    .expect("chown the pooler's files");
            }
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let mut child = cmd.spawn().expect("start the pooler's watchdog");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        // Drains the pooler's log for its whole life (a full pipe would block it), reporting
        // the pid line and the "process up" line.
        let keep = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if let Some(pid) = line.strip_prefix("@@pid ") {
                    let _ = tx.send(Ok(pid.trim().parse::<i32>().expect("pid")));
                    continue;
                }
                if line.contains("process up") {
                    let _ = tx.send(Err(true));
                }
                let mut log = keep.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
            let _ = tx.send(Err(false));
        });
        let mut bouncer = PgBouncer {
            port,
            pid: 0,
            version: String::new(),
            watchdog: Mutex::new((child, stdin)),
            log,
        };
        // The pid line (the watchdog's) and the "process up" line (the pooler's) share one
        // pipe from two processes, so they come in either order.
        let (mut pid, mut up) = (None, false);
        while pid.is_none() || !up {
            match rx.recv_timeout(START_BOUND) {
                Ok(Ok(p)) => pid = Some(p),
                Ok(Err(true)) => up = true,
                other => panic!(
                    "the pooler did not start (pid {pid:?}, up {up}: {other:?}):\n{}",
                    bouncer.log()
                ),
            }
        }
        bouncer.pid = pid.unwrap_or_default();
        bouncer.version = bouncer.console_ready();
        Some(bouncer)
    }

    /// A connection string for database `db` through the pooler, over TCP on loopback.
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// What the pooler logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Runs `sql` on the admin console (simple protocol only) and returns the rows' cells.
    pub fn console(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        console_query(self.port, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// How many server connections the pooler keeps (`SHOW SERVERS`), in any state.
    pub fn server_connections(&self) -> usize {
        self.console("SHOW SERVERS").len()
    }

    /// Makes the pooler open `n` server connections to database `db`: `n` clients each hold
    /// a transaction open at once (so none can share a server connection), then end them.
    /// Returns the server sessions' pids, all distinct. In transaction mode the server
    /// connections then stay in the pool, idle.
    pub fn open_server_connections(&self, db: &str, n: usize) -> Vec<i32> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let url = self.url(db);
        let pids = rt.block_on(async {
            let mut clients = Vec::new();
            let mut pids = Vec::new();
            for _ in 0..n {
                let (client, conn) = tokio_postgres::connect(&url, NoTls)
                    .await
                    .expect("connect through the pooler");
                tokio::spawn(conn);
                // One simple-protocol message: it ends inside the transaction, so the pooler
                // keeps this client's server connection until the COMMIT below.
                let rows = client
                    .simple_query("BEGIN; SELECT pg_backend_pid()")
                    .await
                    .expect("BEGIN through the pooler");
                pids.push(first_cell(&rows).parse::<i32>().expect("pid"));
                clients.push(client);
            }
            for client in &clients {
                client.simple_query("COMMIT").await.expect("COMMIT");
            }
            pids
        });
        let mut distinct = pids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            n,
            "open transactions shared a server session: {pids:?}"
        );
        pids
    }

    /// Polls the admin console until it answers (bounded); returns `SHOW VERSION`.
    fn console_ready(&self) -> String {
        let deadline = Instant::now() + START_BOUND;
        loop {
            match console_query(self.port, "SHOW VERSION") {
                Ok(rows) => {
                    return rows
                        .first()
                        .and_then(|r| r.first().cloned().flatten())
                        .unwrap_or_default();
                }
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "the pooler's console did not answer: {e}\n{}",
                    self.log()
                ),
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let mut watchdog = self.watchdog.lock().unwrap_or_else(|e| e.into_inner());
        // Closing the pipe makes the watchdog kill the pooler by its pid and wait for it.
        drop(watchdog.1.take());
        let _ = watchdog.0.wait();
        if std::env::var_os("FLOCKLEASE_PG_LOG").is_some() {
            eprintln!("{}", self.log());
        }
    }
}

/// The pooler's configuration: every database of `server`, logged in as `postgres`.
fn config(server: &PgServer, port: u16, o: &Options) -> String {
    format!(
        "[databases]\n\
         * = host=127.0.0.1 port={server_port} user=postgres\n\
         [pgbouncer]\n\
         listen_addr = 127.0.0.1\n\
         listen_port = {port}\n\
         unix_socket_dir =\n\
         auth_type = any\n\
         admin_users = postgres\n\
         pool_mode = {mode}\n\
         default_pool_size = {size}\n\
         max_client_conn = 200\n\
         server_round_robin = {rr}\n\
         ignore_startup_parameters = extra_float_digits\n\
         server_login_retry = 1\n\
         {reset}",
        server_port = server.port,
        mode = o.pool_mode.name(),
        size = o.pool_size,
        rr = u8::from(o.round_robin),
        reset = if o.reset {
            ""
        } else {
            "server_reset_query =\n"
        },
    )
}

/// One admin-console query on its own connection and runtime.
fn console_query(port: u16, sql: &str) -> Result<Vec<Vec<Option<String>>>, tokio_postgres::Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let url = format!("host=127.0.0.1 port={port} user=postgres dbname=pgbouncer");
        let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
        let task = tokio::spawn(conn);
        let msgs = client.simple_query(sql).await;
        drop(client);
        let _ = task.await;
        Ok(msgs?
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
                }
                _ => None,
            })
            .collect())
    })
}

/// The first cell of the first row of a simple query's answer.
fn first_cell(messages: &[tokio_postgres::SimpleQueryMessage]) -> String {
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a row")
}

fn find_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_VAR) {
        // Set: that binary or nothing (which is how to try a machine without PgBouncer).
        let bin = PathBuf::from(bin);
        return bin.exists().then_some(bin);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join("pgbouncer"))
        .find(|p| p.exists())
}

fn skip_notice() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        // Straight to the terminal: libtest captures only the print macros.
        let _ = std::io::stderr().write_all(
            b"\n\n*** PgBouncer NOT FOUND: the pooler tests DID NOT RUN (install the \
              `pgbouncer` package, or set FLOCKLEASE_PGBOUNCER; CI sets \
              FLOCKLEASE_REQUIRE_PG=1) ***\n\n",
        );
    });
}

/// `$1` binary, `$2` private directory, `$3` config file. Kills the pooler when stdin closes.
const WATCHDOG: &str = r#"
bin=$1; dir=$2; ini=$3
"$bin" "$ini" 2>&1 &
pid=$!
echo "@@pid $pid"
read _ || true
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
rm -rf "$dir"
"#;
