//! Fencing under chaos, for both backends: worker processes loop acquire → write to a
//! resource → release, while a nemesis SIGKILLs them (and starts new ones) and SIGSTOPs them,
//! often for longer than the TTL. A checker reads the resource's history afterwards.
//!
//! - **Fenced** (`FlockLease::fenced`, `PgLease::fenced`): zero writes accepted from a
//!   superseded lease, whatever the nemesis did.
//! - **Unfenced control**: the same workload writing after a plain `KeepAlive::is_lost()`
//!   check: stopped holders resume and write after a successor's grant. Counted, and required
//!   to happen (so the checker can see what it is there to catch); a control that saw none in
//!   its first round is run again (at most three rounds).
//!
//! The resource: for flock, a history file every worker appends to (`O_APPEND`: one line per
//! `write(2)`, in order): `grant T` after each grant, `write T` for each accepted write,
//! `refused T` for a fenced write the lease no longer allowed. A write is stale when its token
//! is below a grant already in the history. For PostgreSQL, a table where each write also
//! records, in the same statement, the token the lease row names: stale when that is greater.
//! Counts are printed. The nemesis's pauses are its own workload, not synchronisation.

#![allow(clippy::unwrap_used)]

#[cfg(feature = "postgres")]
#[path = "support/pg.rs"]
mod pg;
mod support;

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flocklease::{FlockLease, Grant, KeepAlive, Owner};
use nix::sys::signal::{Signal, kill};
use support::{RoleChild, id, role};

const ENTRY: &str = "child_entry";
/// The workers' TTL: the nemesis stops them for up to 3 of these.
const TTL: Duration = Duration::from_millis(300);
/// How long the nemesis runs per configuration.
const CHAOS: Duration = Duration::from_secs(5);
const WORKERS: usize = 3;
/// The gap between a worker's `is_lost()` check (or its fenced call) and its write: the
/// window a stop hits.
const WINDOW: Duration = Duration::from_millis(20);

/// A worker: `flock DIR fenced|unfenced` or `pg URL fenced|unfenced`. Loops until killed.
#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    let fenced = args[1] == "fenced";
    let owner = Owner::unique();
    match role.as_str() {
        "flock" => flock_worker(&args[0], fenced, &owner),
        #[cfg(feature = "postgres")]
        "pg" => pg_worker(&args[0], fenced, &owner),
        other => panic!("unknown role {other}"),
    }
}

fn append(path: &std::path::Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .unwrap();
    // One write(2) per line: O_APPEND keeps lines whole and in order.
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

fn flock_worker(dir: &str, fenced: bool, owner: &Owner) {
    let dir = std::path::Path::new(dir);
    let history = dir.join("history");
    let leases = Arc::new(
        FlockLease::builder(dir.join("leases"))
            .ttl(TTL)
            .lock_timeout(Duration::from_secs(2))
            .open()
            .unwrap(),
    );
    loop {
        let Ok(Grant::Granted(lease)) = leases.acquire_wait(&id("job"), owner, TTL * 4) else {
            continue;
        };
        append(
            &history,
            &format!("grant {} {}", lease.token, std::process::id()),
        );
        let keep = KeepAlive::start(Arc::clone(&leases), lease.clone());
        for _ in 0..5 {
            if keep.is_lost() {
                break;
            }
            std::thread::sleep(WINDOW);
            let t = lease.token;
            if fenced {
                match leases.fenced(&lease, || append(&history, &format!("write {t}"))) {
                    Ok(Some(())) => {}
                    _ => append(&history, &format!("refused {t}")),
                }
            } else {
                append(&history, &format!("write {t}"));
            }
        }
        let _ = keep.release();
    }
}

#[cfg(feature = "postgres")]
fn pg_worker(url: &str, fenced: bool, owner: &Owner) {
    use flocklease::pg::PgLease;
    const INSERT: &str = "INSERT INTO history (kind, token, row_token) \
                          SELECT $1, $2, token FROM flocklease_leases WHERE id = 'job'";
    let leases = Arc::new(
        PgLease::builder(url)
            .ttl(TTL)
            .lock_timeout(Duration::from_secs(2))
            .connect()
            .unwrap(),
    );
    let admin = pg::Admin::connect(url);
    loop {
        let Ok(Grant::Granted(lease)) = leases.acquire_wait(&id("job"), owner, TTL * 4) else {
            continue;
        };
        let keep = KeepAlive::start(Arc::clone(&leases), lease.clone());
        for _ in 0..5 {
            if keep.is_lost() {
                break;
            }
            std::thread::sleep(WINDOW);
            let t = lease.token as i64;
            if fenced {
                let done = leases.fenced(&lease, |tx| tx.execute(INSERT, &[&"write", &t]));
                if !matches!(done, Ok(Some(_))) {
                    admin.execute(INSERT, &[&"refused", &t]);
                }
            } else {
                admin.execute(INSERT, &[&"write", &t]);
            }
        }
        let _ = keep.release();
    }
}

/// A small xorshift generator: the nemesis's choices, reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What the checker counted.
#[derive(Debug, Default)]
struct Counts {
    accepted: u64,
    stale_refused: u64,
    stale_accepted: u64,
    grants: u64,
}

/// Runs the nemesis over `WORKERS` workers of `role` with `args` for `CHAOS`; `holder` names
/// the pid of the latest holder, if known, which the nemesis stops more often.
fn nemesis(role: &str, args: &[&str], holder: impl Fn() -> Option<u32>, seed: u64) {
    let mut rng = Rng(seed | 1);
    let spawn = || RoleChild::spawn(ENTRY, role, args);
    let mut workers: Vec<RoleChild> = (0..WORKERS).map(|_| spawn()).collect();
    let end = Instant::now() + CHAOS;
    while Instant::now() < end {
        let pick = match holder() {
            Some(pid) if rng.below(2) == 0 => workers
                .iter()
                .position(|w| w.child.id() == pid)
                .unwrap_or(0),
            _ => rng.below(WORKERS as u64) as usize,
        };
        if rng.below(5) == 0 {
            // SIGKILL, and a new worker in its place.
            let old = std::mem::replace(&mut workers[pick], spawn());
            old.kill();
        } else {
            // SIGSTOP for 0.1 to 3 TTLs.
            let pid = workers[pick].pid();
            kill(pid, Signal::SIGSTOP).unwrap();
            std::thread::sleep(TTL / 3 * (1 + rng.below(9) as u32));
            kill(pid, Signal::SIGCONT).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20 + rng.below(80)));
    }
    for w in workers {
        w.kill();
    }
}

fn seed() -> u64 {
    std::env::var("FLOCKLEASE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn flock_round(fenced: bool, seed: u64) -> Counts {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    let mode = if fenced { "fenced" } else { "unfenced" };
    let holder = || {
        let text = std::fs::read_to_string(&history).ok()?;
        let last = text.lines().rev().find(|l| l.starts_with("grant "))?;
        last.split(' ').nth(2)?.parse().ok()
    };
    nemesis("flock", &[dir.path().to_str().unwrap(), mode], holder, seed);
    // Every worker is dead: the history is complete.
    let mut c = Counts::default();
    let mut granted = 0;
    for line in std::fs::read_to_string(&history).unwrap().lines() {
        let mut w = line.split(' ');
        let (kind, token) = (w.next().unwrap(), w.next().unwrap().parse::<u64>().unwrap());
        match kind {
            "grant" => {
                c.grants += 1;
                granted = granted.max(token);
            }
            "write" if token < granted => c.stale_accepted += 1,
            "write" => c.accepted += 1,
            "refused" => c.stale_refused += 1,
            other => panic!("unexpected history line {other}"),
        }
    }
    c
}

/// Runs `round` (fenced, then unfenced up to three times), prints the counts, checks them.
fn check(backend: &str, round: impl Fn(bool, u64) -> Counts) {
    let seed = seed();
    let fenced = round(true, seed);
    // Written to stderr directly, past libtest's capture: the counts show in CI's log.
    let _ = writeln!(
        std::io::stderr(),
        "chaos {backend} fenced (seed {seed}): {} writes accepted, {} stale writes refused, {} \
         stale writes accepted, {} grants",
        fenced.accepted,
        fenced.stale_refused,
        fenced.stale_accepted,
        fenced.grants
    );
    assert!(
        fenced.accepted > 0,
        "the workload wrote nothing: {fenced:?}"
    );
    assert_eq!(
        fenced.stale_accepted, 0,
        "a superseded lease wrote: {fenced:?}"
    );
    let mut control = Counts::default();
    for attempt in 1..=3 {
        control = round(false, seed.wrapping_add(attempt));
        let _ = writeln!(
            std::io::stderr(),
            "chaos {backend} unfenced control, round {attempt}: {} writes accepted, {} stale \
             writes accepted, {} grants",
            control.accepted,
            control.stale_accepted,
            control.grants
        );
        if control.stale_accepted > 0 {
            break;
        }
    }
    assert!(
        control.stale_accepted > 0,
        "the unfenced control never wrote stale in three rounds: the nemesis does not reach \
         the window this test is about ({control:?})"
    );
}

#[test]
fn flock_fenced_writes_are_never_stale_under_kill_and_stop() {
    check("flock", flock_round);
}

#[cfg(feature = "postgres")]
fn pg_round(fenced: bool, seed: u64) -> Counts {
    let server = pg::server().unwrap();
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    // The lease table, then the resource.
    drop(flocklease::pg::PgLease::connect(&url).unwrap());
    admin.execute(
        "CREATE TABLE history (seq bigserial, kind text, token int8, row_token int8)",
        &[],
    );
    let mode = if fenced { "fenced" } else { "unfenced" };
    nemesis("pg", &[&url, mode], || None, seed);
    let row = |sql: &str| admin.query(sql, &[])[0].get::<_, i64>(0) as u64;
    Counts {
        accepted: row("SELECT count(*) FROM history WHERE kind = 'write' AND row_token = token"),
        stale_refused: row("SELECT count(*) FROM history WHERE kind = 'refused'"),
        stale_accepted: row(
            "SELECT count(*) FROM history WHERE kind = 'write' AND row_token > token",
        ),
        grants: row("SELECT coalesce(max(token), 0) FROM flocklease_leases"),
    }
}

#[cfg(feature = "postgres")]
#[test]
fn pg_fenced_writes_are_never_stale_under_kill_and_stop() {
    if pg::server().is_none() {
        return;
    }
    check("postgresql", pg_round);
}
