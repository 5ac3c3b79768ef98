//! Throwaway PostgreSQL servers of a test's own, for crashes and failovers: a single server
//! with chosen settings, or a primary with a synchronous standby made by `pg_basebackup`, both
//! on loopback, run with `pg_ctl` (as the `postgres` user when we are root). A [`Node`] is
//! stopped (immediately) and its directory removed when dropped.
//!
//! Needs `support/pg.rs` as module `pg` beside it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::pg::{Admin, REQUIRE, find_bin, until};

/// One server: its data directory, port and binaries.
pub struct Node {
    bin: PathBuf,
    /// The temporary directory: `data/`, the socket and the log.
    dir: PathBuf,
    pub port: u16,
    /// `-c` settings the server starts with.
    settings: Vec<String>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A command run as the `postgres` user when we are root (PostgreSQL refuses root).
fn as_postgres(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        let user = nix::unistd::User::from_name("postgres")
            .expect("getpwnam")
            .expect("a `postgres` user (PostgreSQL refuses to run as root)");
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    cmd
}

fn checked(what: &str, out: std::io::Result<Output>) {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tempdir() -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix("flocklease-cluster-")
        .tempdir()
        .expect("tempdir")
        .keep();
    if nix::unistd::geteuid().is_root() {
        let user = nix::unistd::User::from_name("postgres")
            .expect("getpwnam")
            .expect("a `postgres` user");
        nix::unistd::chown(&dir, Some(user.uid), Some(user.gid)).expect("chown");
    }
    dir
}

impl Node {
    /// A new server (`initdb`) with `settings` (`name=value`), started; `None` when there are
    /// no PostgreSQL binaries and they are not required.
    pub fn primary(settings: &[&str]) -> Option<Node> {
        let Some(bin) = find_bin() else {
            assert!(
                !std::env::var(REQUIRE).is_ok_and(|v| v == "1"),
                "{REQUIRE}=1 but no PostgreSQL binaries (initdb) were found"
            );
            return None;
        };
        let dir = tempdir();
        checked(
            "initdb",
            as_postgres(&bin.join("initdb"))
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(dir.join("data"))
                .output(),
        );
        let node = Node {
            bin,
            dir,
            port: free_port(),
            settings: settings.iter().map(|s| s.to_string()).collect(),
        };
        node.start();
        Some(node)
    }

    /// A streaming standby of `self` (`pg_basebackup`), connecting as `application_name`
    /// `name`, started.
    pub fn standby(&self, name: &str) -> Node {
        let dir = tempdir();
        checked(
            "pg_basebackup",
            as_postgres(&self.bin.join("pg_basebackup"))
                .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream", "-R"])
                .arg("--no-sync")
                .arg("-p")
                .arg(self.port.to_string())
                .arg("-D")
                .arg(dir.join("data"))
                .output(),
        );
        let conf = dir.join("data/postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.auto.conf");
        text.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={name}'\n",
            self.port
        ));
        std::fs::write(&conf, text).expect("write postgresql.auto.conf");
        let node = Node {
            bin: self.bin.clone(),
            dir,
            port: free_port(),
            settings: vec![],
        };
        node.start();
        node
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = as_postgres(&self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(self.dir.join("data"));
        cmd
    }

    /// Starts the server and waits until it accepts connections.
    pub fn start(&self) {
        let mut opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=100",
            self.port,
            self.dir.display()
        );
        for s in &self.settings {
            opts.push_str(&format!(" -c {s}"));
        }
        checked(
            "pg_ctl start",
            self.pg_ctl()
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "-t", "60", "-o", &opts, "start"])
                .output(),
        );
    }

    /// Stops the server at once (`immediate`: no checkpoint, every session ended, what was
    /// not written yet lost — a crash as far as the data goes).
    pub fn crash(&self) {
        checked(
            "pg_ctl stop -m immediate",
            self.pg_ctl()
                .args(["-w", "-t", "60", "-m", "immediate", "stop"])
                .output(),
        );
    }

    /// Promotes a standby and waits until it accepts writes.
    pub fn promote(&self) {
        checked(
            "pg_ctl promote",
            self.pg_ctl().args(["-w", "-t", "60", "promote"]).output(),
        );
    }

    /// A connection string for database `postgres` over TCP.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    pub fn admin(&self) -> Admin {
        Admin::connect(&self.url())
    }

    /// The pid of the walsender serving standby `name` (on the primary), once it streams
    /// synchronously.
    pub fn sync_walsender(&self, name: &str) -> i32 {
        let admin = self.admin();
        let mut pid = 0;
        until("the standby to stream synchronously", || {
            let rows = admin.query(
                "SELECT pid FROM pg_stat_replication WHERE application_name = $1 \
                 AND sync_state = 'sync' AND state = 'streaming'",
                &[&name],
            );
            if let Some(r) = rows.first() {
                pid = r.get(0);
            }
            pid != 0
        });
        pid
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["-w", "-t", "30", "-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long a test waits for the servers at most (a bound, never a synchronisation).
pub const BOUND: Duration = Duration::from_secs(60);
