//! `flocklease run` never lets its job outlive the lease: with `run` alone SIGSTOPped (its job
//! runs on, in its own process group) past the TTL while a second `run -w` waits, the
//! watchdog — a process of its own, told every confirmed expiry — kills the first job before
//! the lease can expire, so the second job never starts while the first runs. The second job
//! itself records whether the first one was still running when it started. For the flock
//! backend and for `--pg`. Synchronisation on files the jobs write and on process states,
//! never on sleeps (the jobs' own loop pauses are their workload).

#![allow(clippy::unwrap_used)]

#[cfg(feature = "postgres")]
use crate::pg;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Waits (bounded: 20 s) until `cond` holds.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::yield_now();
    }
}

/// Runs the scenario with `where_` (`--dir D` or `--pg URL`).
fn never_overlaps(where_: &[&str], dir: &Path) {
    let log = dir.join("jobs.log");
    let a_pid = dir.join("a.pid");
    let job_a = format!(
        "echo $$ > {pid}; while :; do echo \"A $(date +%s%N)\" >> {log}; sleep 0.02; done",
        pid = a_pid.display(),
        log = log.display()
    );
    // The second job looks at the first one's state (`/proc/PID/stat`, third field) as it
    // starts: empty (gone) or Z (killed, not yet reaped by its stopped `run`) is fine.
    let job_b = format!(
        "st=$(cut -d' ' -f3 /proc/$(cat {pid})/stat 2>/dev/null); \
         echo \"B ${{st:-gone}} $(date +%s%N)\" >> {log}",
        pid = a_pid.display(),
        log = log.display()
    );
    let bin = env!("CARGO_BIN_EXE_flocklease");
    let a = Command::new(bin)
        .arg("run")
        .args(where_)
        .args(["--id", "job", "--ttl", "1s", "--", "sh", "-c", &job_a])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until("the first job to run", || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("A ")) && a_pid.exists()
    });
    let run_a = Pid::from_raw(a.id() as i32);
    kill(run_a, Signal::SIGSTOP).unwrap();
    let b = Command::new(bin)
        .arg("run")
        .args(where_)
        .args([
            "--id", "job", "--ttl", "1s", "-w", "15s", "--", "sh", "-c", &job_b,
        ])
        .output()
        .unwrap();
    kill(run_a, Signal::SIGCONT).unwrap();
    let a_out = a.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(b.status.success(), "the second run: {b:?}");
    let b_line = text
        .lines()
        .find(|l| l.starts_with("B "))
        .unwrap_or_else(|| panic!("the second job did not run: {text}"));
    let mut words = b_line.split(' ').skip(1);
    let (state, b_at) = (
        words.next().unwrap(),
        words.next().unwrap().parse::<u128>().unwrap(),
    );
    assert!(
        state == "gone" || state == "Z",
        "the first job was still running (state {state}) when the second started; first run \
         said: {}",
        String::from_utf8_lossy(&a_out.stderr)
    );
    let last_a = text
        .lines()
        .filter_map(|l| l.strip_prefix("A ")?.parse::<u128>().ok())
        .max()
        .unwrap();
    assert!(
        last_a < b_at,
        "the first job wrote after the second started"
    );
    eprintln!(
        "first job's last line {} ms before the second job started; the first run said: {}",
        (b_at - last_a) / 1_000_000,
        String::from_utf8_lossy(&a_out.stderr).trim()
    );
}

#[test]
fn a_stopped_run_s_job_is_killed_before_its_lease_can_expire() {
    let dir = tempfile::tempdir().unwrap();
    let leases = dir.path().join("leases");
    never_overlaps(&["--dir", leases.to_str().unwrap()], dir.path());
}

#[cfg(feature = "postgres")]
#[test]
fn a_stopped_run_pg_s_job_is_killed_before_its_lease_can_expire() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let dir = tempfile::tempdir().unwrap();
    never_overlaps(&["--pg", &url], dir.path());
}
