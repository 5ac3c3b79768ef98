//! The `flocklease` command, driven as a real process (built with `--features cli`).

#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flocklease::{FlockLease, Owner, Record, SessionId, Timestamp, record};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_flocklease");
/// A guard against hangs only.
const GUARD: Duration = Duration::from_secs(20);

fn run(dir: &Path, extra: &[&str], cmd: &[&str]) -> Child {
    Command::new(BIN)
        .arg("run")
        .arg("--dir")
        .arg(dir)
        .args(["--id", "job"])
        .args(extra)
        .arg("--")
        .args(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) until `path` exists with content, returning it.
fn wait_for_file(path: &Path) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        assert!(start.elapsed() < GUARD, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pid_alive(pid: i32) -> bool {
    // A zombie counts as gone: its state in /proc is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[test]
fn command_gets_the_lease_in_its_environment_and_its_exit_status_passes_through() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &["--owner", "cron"],
        &[
            "sh",
            "-c",
            "echo $FLOCKLEASE_TOKEN $FLOCKLEASE_ID $FLOCKLEASE_OWNER; exit 3",
        ],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1 job cron\n");
    // Released afterwards: the next run gets the next token.
    let out = run(dir.path(), &[], &["sh", "-c", "echo $FLOCKLEASE_TOKEN"])
        .wait_with_output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2\n");
}

#[test]
fn two_racing_runs_one_runs_one_is_told_held() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let script = format!("echo x >> {}; sleep 1", marker.display());
    let a = run(dir.path(), &[], &["sh", "-c", &script]);
    let b = run(dir.path(), &[], &["sh", "-c", &script]);
    let codes = [
        a.wait_with_output().unwrap().status.code(),
        b.wait_with_output().unwrap().status.code(),
    ];
    let mut sorted = codes;
    sorted.sort();
    assert_eq!(sorted, [Some(0), Some(75)], "{codes:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n");
}

#[test]
fn a_sigkilled_competitor_is_replaced_at_once_and_the_new_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("first.pid");
    let script = format!("echo $$ > {}; exec sleep 600", pidfile.display());
    let mut first = run(dir.path(), &["--ttl", "60s"], &["sh", "-c", &script]);
    let sleeper: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    kill(Pid::from_raw(first.id() as i32), Signal::SIGKILL).unwrap();
    first.wait().unwrap();
    // The orphaned command still runs but holds no lock: a new run gets the lease at once,
    // long before the 60 s TTL.
    assert!(pid_alive(sleeper));
    // `--wait` blocks on the dead holder's lock, which the kernel drops as it tears the
    // process down: the run starts then, not after the TTL.
    let out = run(
        dir.path(),
        &["--wait", "10s"],
        &["sh", "-c", "echo $FLOCKLEASE_TOKEN"],
    )
    .wait_with_output()
    .unwrap();
    let _ = kill(Pid::from_raw(sleeper), Signal::SIGKILL);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2\n");
}

#[test]
fn a_run_whose_lease_is_taken_over_stops_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("cmd.pid");
    let script = format!("echo $$ > {}; exec sleep 600", pidfile.display());
    let child = run(
        dir.path(),
        &["--ttl", "300ms", "--grace", "2s"],
        &["sh", "-c", &script],
    );
    let cmd: i32 = wait_for_file(&pidfile).trim().parse().unwrap();
    let runner = Pid::from_raw(child.id() as i32);
    kill(runner, Signal::SIGSTOP).unwrap();
    // Suspended past its TTL: a competitor takes over as soon as the lease expires.
    let leases = FlockLease::open(dir.path()).unwrap();
    let start = Instant::now();
    let taken = loop {
        if let Some(l) = leases
            .acquire(
                &SessionId::new("job").unwrap(),
                &Owner::new("rival").unwrap(),
            )
            .unwrap()
            .lease()
        {
            break l;
        }
        assert!(start.elapsed() < GUARD, "the lease never expired");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(taken.token, 2);
    kill(runner, Signal::SIGCONT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(76),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("taken over"));
    assert!(!pid_alive(cmd), "the command survived the loss");
    // The rival still holds it.
    let rec = record::decode(
        &std::fs::read(dir.path().join(format!(
            "{}.lease.json",
            SessionId::new("job").unwrap().stem()
        )))
        .unwrap(),
    )
    .unwrap();
    assert_eq!((rec.owner.as_str(), rec.token), ("rival", 2));
}

#[test]
fn status_reports_each_state_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let leases = FlockLease::open(d).unwrap();
    let o = Owner::new("me").unwrap();
    // live: held by this process.
    let live = leases
        .acquire(&SessionId::new("live").unwrap(), &o)
        .unwrap()
        .lease()
        .unwrap();
    // released.
    let rel = leases
        .acquire(&SessionId::new("released").unwrap(), &o)
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&rel).unwrap();
    // dead: granted by an instance that is gone.
    {
        let other = FlockLease::open(d).unwrap();
        let _ = other.acquire(&SessionId::new("dead").unwrap(), &o).unwrap();
    }
    // expired, and corrupt.
    let past = Record {
        owner: "old".into(),
        token: 9,
        expiry: Timestamp::from_unix_secs(1_000_000_000).unwrap(),
    };
    std::fs::write(
        d.join(format!(
            "{}.lease.json",
            SessionId::new("expired").unwrap().stem()
        )),
        record::encode(&past),
    )
    .unwrap();
    std::fs::write(
        d.join(format!(
            "{}.lease.json",
            SessionId::new("corrupt").unwrap().stem()
        )),
        b"{",
    )
    .unwrap();

    let out = Command::new(BIN)
        .args(["status", "--json", "--dir"])
        .arg(d)
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let state = |id: &str| {
        let stem = SessionId::new(id).unwrap().stem().to_owned();
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["stem"] == stem.as_str())
            .unwrap()
            .clone();
        (
            row["state"].as_str().unwrap().to_owned(),
            row["acquirable"].as_bool().unwrap(),
        )
    };
    assert_eq!(state("live"), ("live".into(), false));
    assert_eq!(state("released"), ("released".into(), true));
    assert_eq!(state("dead"), ("dead".into(), true));
    assert_eq!(state("expired"), ("expired".into(), true));
    assert_eq!(state("corrupt").0, "corrupt");
    assert_eq!(rows.as_array().unwrap().len(), 5);

    let out = Command::new(BIN)
        .args(["status", "--id", "live", "--dir"])
        .arg(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains(SessionId::new("live").unwrap().stem()) && text.contains(" live"),
        "{text}"
    );
    assert!(text.contains(&live.token.to_string()));
}

#[test]
fn errors_are_one_clear_line_and_help_exists() {
    let out = Command::new(BIN)
        .args([
            "run",
            "--dir",
            "/proc/nope/leases",
            "--id",
            "x",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/proc/nope/leases"), "{err}");
    for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(!out.stdout.is_empty());
    }
}
