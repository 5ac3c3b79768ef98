//! A throwaway PostgreSQL server for the PostgreSQL tests, one per test binary, and a small
//! synchronous admin client.
//!
//! The server is the system's binaries: `initdb` into a temporary directory, a private socket
//! directory and a free loopback port, `fsync=off`, run as the `postgres` user when we are
//! root. It runs under a tiny `sh` watchdog whose stdin is a pipe from this process: when the
//! test binary exits — normally, by a panic, or killed — the pipe closes and the watchdog stops
//! the server by its pid (SIGINT: fast shutdown), then removes the directory. Readiness is the
//! server's own "ready to accept connections" line, never a sleep.
//!
//! Without PostgreSQL binaries the tests skip, saying so loudly on the terminal (past
//! libtest's output capture) — unless `FLOCKLEASE_REQUIRE_PG=1` (CI), which makes them fail.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use flocklease::pg::PgLease;
use flocklease::{Lease, Owner, SessionId};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Row};

/// Waits (bounded: 10 s) until `cond` holds, typically a condition on the server's state read
/// with SQL.
pub fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::yield_now();
    }
}

/// Connects to `url` with the defaults and acquires `id` for `owner`, which must be free.
pub fn acquire_free(url: &str, id: &str, owner: &str) -> (PgLease, Lease) {
    let leases = PgLease::connect(url).unwrap();
    let lease = leases
        .acquire(&SessionId::new(id).unwrap(), &Owner::new(owner).unwrap())
        .unwrap()
        .lease()
        .expect("free");
    (leases, lease)
}

/// Set to `1` to make the PostgreSQL tests fail instead of skipping without a server.
pub const REQUIRE: &str = "FLOCKLEASE_REQUIRE_PG";

/// The running server of this test binary.
pub struct PgServer {
    pub port: u16,
    pub dir: PathBuf,
    /// The postmaster's pid.
    pub pid: i32,
    watchdog: Mutex<(Child, Option<ChildStdin>)>,
    schemas: AtomicUsize,
}

/// The server, started on first use; `None` (after a loud notice) when PostgreSQL is not
/// installed and not required.
pub fn server() -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    SERVER.get_or_init(|| start(None)).as_ref()
}

/// Like [`server`], listening also on `addr` and trusting clients from `cidr` (a test's
/// private network, e.g. a veth pair into another network namespace). One per test binary:
/// a binary uses either this or [`server`].
pub fn server_also_on(addr: &str, cidr: &str) -> Option<&'static PgServer> {
    static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
    SERVER.get_or_init(|| start(Some((addr, cidr)))).as_ref()
}

impl PgServer {
    /// A connection string for database `db` as user `postgres`, over TCP on loopback (a
    /// dropped client is a FIN, as across hosts).
    pub fn url(&self, db: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            self.port
        )
    }

    /// A fresh, empty database, so each test has its own lease table and advisory-lock space
    /// (advisory locks are per database; schemas would share them).
    pub fn fresh_db(&self) -> String {
        let n = self.schemas.fetch_add(1, Ordering::Relaxed);
        let name = format!("t{n}");
        self.admin("postgres")
            .execute(&format!("CREATE DATABASE {name}"), &[]);
        name
    }

    /// A new admin connection to database `db`.
    pub fn admin(&self, db: &str) -> Admin {
        Admin::connect(&self.url(db))
    }
}

/// A synchronous admin connection (its own small runtime).
pub struct Admin {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl Admin {
    pub fn connect(url: &str) -> Admin {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
            tokio::spawn(conn);
            client
        });
        Admin { rt, client }
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        let fut = self.client.query(sql, params);
        // A current-thread runtime drives the connection task while it blocks on the query.
        self.rt
            .block_on(fut)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Waits (bounded, see [`until`]) until server session `pid` has ended.
    pub fn until_ended(&self, pid: i32) {
        until("a server session to end", || {
            self.query(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )[0]
            .get::<_, i64>(0)
                == 0
        });
    }

    pub fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> u64 {
        self.rt
            .block_on(self.client.execute(sql, params))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Ends backend `pid` and waits (server-side, up to 5 s) until it is gone.
    pub fn terminate(&self, pid: i32) {
        let rows = self.query("SELECT pg_terminate_backend($1, 5000)", &[&pid]);
        assert!(rows[0].get::<_, bool>(0), "backend {pid} did not end");
    }

    /// The pids of sessions holding a granted session-level advisory lock `(key, token)`.
    pub fn advisory_holders(&self, key: i32, token: u32) -> Vec<i32> {
        self.query(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = 2",
            &[&i64::from(key), &i64::from(token)],
        )
        .iter()
        .map(|r| r.get(0))
        .collect()
    }

    /// How many advisory locks are granted in this database.
    pub fn advisory_locks(&self) -> i64 {
        self.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )[0]
        .get(0)
    }

    /// The advisory key of `id`'s row.
    pub fn key(&self, id: &str) -> i32 {
        self.query("SELECT key FROM flocklease_leases WHERE id = $1", &[&id])[0].get(0)
    }

    /// The record of `id` as `(owner, token, expiry in unix microseconds)`, if any row.
    pub fn row(&self, id: &str) -> Option<(String, i64, i64)> {
        self.query(
            "SELECT owner, token, (extract(epoch from expiry) * 1000000)::int8 \
             FROM flocklease_leases WHERE id = $1",
            &[&id],
        )
        .first()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
    }

    /// How many sessions wait for an advisory lock in this database (blocked waiters).
    pub fn advisory_waiters(&self) -> i64 {
        self.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )[0]
        .get(0)
    }
}

fn skip_notice() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        // Straight to the terminal: libtest captures only the print macros.
        let _ = std::io::stderr().write_all(
            b"\n\n*** PostgreSQL NOT FOUND: the PostgreSQL tests DID NOT RUN (install the \
              `postgresql` package, or set FLOCKLEASE_PG_BIN; CI sets FLOCKLEASE_REQUIRE_PG=1) ***\n\n",
        );
    });
}

pub fn find_bin() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("FLOCKLEASE_PG_BIN") {
        // Set: that directory or nothing (which is how to try a machine without PostgreSQL).
        let dir = PathBuf::from(dir);
        return dir.join("initdb").exists().then_some(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(dir) = versions.pop() {
        return Some(dir);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|d| d.join("initdb").exists() && d.join("postgres").exists())
}

fn start(extra: Option<(&str, &str)>) -> Option<PgServer> {
    let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
    let Some(bin) = find_bin() else {
        assert!(
            !required,
            "{REQUIRE}=1 but no PostgreSQL binaries (initdb) were found"
        );
        skip_notice();
        return None;
    };
    let dir = tempfile::Builder::new()
        .prefix("flocklease-pg-")
        .tempdir()
        .expect("tempdir")
        .keep();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(WATCHDOG)
        .arg("watchdog")
        .arg(&bin)
        .arg(&dir)
        .arg(port.to_string())
        .arg(extra.map_or("", |(addr, _)| addr))
        .arg(extra.map_or(String::new(), |(_, cidr)| {
            format!("host all all {cidr} trust")
        }))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        let user = nix::unistd::User::from_name("postgres")
            .expect("getpwnam")
            .expect("a `postgres` user (PostgreSQL refuses to run as root)");
        nix::unistd::chown(&dir, Some(user.uid), Some(user.gid)).expect("chown the server dir");
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    let mut child = cmd.spawn().expect("start the server watchdog");
    if nix::unistd::geteuid().is_root() {
        // The watchdog, as `postgres`, empties the server's directory when it ends; removing
        // the directory itself takes write permission on TMPDIR, which a root-owned,
        // non-sticky TMPDIR does not give it. A root process waits for the watchdog's end
        // (`tail --pid`) and removes the emptied directory.
        let _ = Command::new("sh")
            .arg("-c")
            .arg("tail --pid=\"$1\" -f /dev/null; rmdir \"$2\" 2>/dev/null; true")
            .arg("cleanup")
            .arg(child.id().to_string())
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
    let stdin = child.stdin.take();
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (tx, rx) = mpsc::channel();
    // Drains the server's log for the whole run (a full pipe would block it), reporting the
    // pid line and readiness.
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if let Some(pid) = line.strip_prefix("@@pid ") {
                let _ = tx.send(Ok(pid.trim().parse::<i32>().expect("pid")));
            } else if line.contains("ready to accept connections") {
                let _ = tx.send(Err(true));
            } else {
                log.push_str(&line);
                log.push('\n');
            }
        }
        let _ = tx.send(Err(false));
        if std::env::var_os("FLOCKLEASE_PG_LOG").is_some() {
            eprintln!("{log}");
        }
    });
    let bound = Duration::from_secs(60);
    let pid = match rx.recv_timeout(bound) {
        Ok(Ok(pid)) => pid,
        other => panic!("the server did not start ({other:?}); see the watchdog's stderr"),
    };
    match rx.recv_timeout(bound) {
        Ok(Err(true)) => {}
        other => panic!("the server did not become ready ({other:?})"),
    }
    Some(PgServer {
        port,
        dir,
        pid,
        watchdog: Mutex::new((child, stdin)),
        schemas: AtomicUsize::new(0),
    })
}

/// `$1` bin dir, `$2` data dir, `$3` port, `$4` another listen address or empty, `$5` a
/// `pg_hba.conf` line to add or empty. Stops the server when stdin closes.
const WATCHDOG: &str = r#"
set -e
bin=$1; dir=$2; port=$3
"$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
[ -z "$5" ] || echo "$5" >>"$dir/data/pg_hba.conf"
"$bin/postgres" -D "$dir/data" -c listen_addresses="127.0.0.1${4:+,$4}" -p "$port" -k "$dir" \
  -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=600 \
  -c log_line_prefix= 2>&1 &
pid=$!
echo "@@pid $pid"
read _ || true
kill -INT "$pid" 2>/dev/null || true
wait "$pid" || true
rm -rf "$dir"
"#;

/// Path of the server's socket directory (for tests that want a Unix socket).
pub fn socket_dir(s: &PgServer) -> &Path {
    &s.dir
}
