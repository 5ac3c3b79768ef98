//! `flocklease run --pg` and `status --pg` against a throwaway PostgreSQL server: the job runs
//! with the token in its environment, a second `run` is refused while a holder lives, the
//! lease is released when the job ends, and `status --pg` lists the table.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use crate::pg;

use std::process::Command;

use flocklease::pg::PgLease;
use flocklease::{Owner, SessionId};

fn flocklease(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flocklease"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn run_and_status_go_cluster_wide() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let out = flocklease(&[
        "run",
        "--pg",
        &url,
        "--id",
        "nightly",
        "--",
        "sh",
        "-c",
        "echo token=$FLOCKLEASE_TOKEN",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "token=1");
    let admin = server.admin(&db);
    assert_eq!(
        admin.row("nightly").unwrap().0,
        "",
        "released after the job"
    );
    // Another host holds it: refused with the conflict status, the job never runs.
    let other = PgLease::connect(&url).unwrap();
    let lease = other
        .acquire(
            &SessionId::new("nightly").unwrap(),
            &Owner::new("host-b").unwrap(),
        )
        .unwrap()
        .lease()
        .unwrap();
    let out = flocklease(&[
        "run", "--pg", &url, "--id", "nightly", "--", "sh", "-c", "echo ran",
    ]);
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(out.stdout.is_empty());
    // Who holds it, as for a directory (issue 50: it said only "another owner").
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "held by host-b (token {}, expires in ",
            lease.token
        )),
        "{said}"
    );
    let out = flocklease(&["status", "--pg", &url]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("nightly") && text.contains("host-b") && text.contains("held"),
        "{text}"
    );
    assert_eq!(
        flocklease(&["status", "--pg", &url, "--id", "nightly", "-q"])
            .status
            .code(),
        Some(0)
    );
    other.release(&lease).unwrap();
    assert_eq!(
        flocklease(&["status", "--pg", &url, "--id", "nightly", "-q"])
            .status
            .code(),
        Some(1)
    );
    let out = flocklease(&[
        "run",
        "--pg",
        &url,
        "--id",
        "nightly",
        "--",
        "sh",
        "-c",
        "echo token=$FLOCKLEASE_TOKEN",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "token=3");
}

/// Rows edited by hand into something unusable (an id that is no session id, an infinite
/// expiry) are listed as `corrupt` with the reason, beside the sound rows, and `status --id`
/// on one exits 70: never a failed listing, never "free".
#[test]
fn status_lists_rows_edited_by_hand_as_corrupt_and_the_rest_as_usual() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let leases = PgLease::connect(&url).unwrap();
    let _held = leases
        .acquire(
            &SessionId::new("sound").unwrap(),
            &Owner::new("host-a").unwrap(),
        )
        .unwrap()
        .lease()
        .unwrap();
    server.admin(&db).query(
        "INSERT INTO flocklease_leases (id, owner, token, expiry) VALUES \
         ('', 'x', 1, now()), ('forever', 'x', 1, 'infinity'), ('last', 'x', -1, now())",
        &[],
    );
    let rows = leases.sessions(None).unwrap();
    let state = |id: &str| {
        let r = rows.iter().find(|r| r.id == id).unwrap();
        (
            r.state(),
            r.problem.clone().unwrap_or_default(),
            r.is_held(),
        )
    };
    assert_eq!(state("sound"), ("held", String::new(), true));
    let (s, why, held) = state("forever");
    assert_eq!((s, held), ("corrupt", false));
    assert!(why.contains("infinite"), "{why}");
    assert_eq!(state("").0, "corrupt");
    // Expired at the last token (u64::MAX, stored as -1): every acquire fails.
    assert_eq!(state("last"), ("exhausted", String::new(), false));
    let out = flocklease(&["status", "--pg", &url, "--id", "last"]);
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    let out = flocklease(&["status", "--pg", &url]);
    // Every row listed; the listing's status says rows are broken (as for a directory).
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("corrupt (") && text.contains("held"),
        "{text}"
    );
    // Expiries to the second, as in a directory's table (issue 50: microseconds).
    let sound = text.lines().find(|l| l.starts_with("sound")).unwrap();
    assert!(
        sound
            .split_whitespace()
            .nth(3)
            .is_some_and(|e| !e.contains('.') && e.ends_with('Z')),
        "{sound}"
    );
    let out = flocklease(&["status", "--pg", &url, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let forever = json
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "forever")
        .unwrap();
    assert_eq!(forever["state"], "corrupt");
    assert!(forever["error"].as_str().unwrap().contains("infinite"));
    let out = flocklease(&["status", "--pg", &url, "--id", "forever"]);
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("infinite"));
}

/// `run --pg` SIGKILLed: its connection ends, so the lease is free at once; the job must not
/// go on running with the lease free for the grace period (30 s here), nor even see a SIGTERM:
/// the watchdog kills its group at once. The job ignores SIGTERM and notes it, so a grace
/// period would show (and the wait below, bounded to 10 s, would time out).
#[test]
fn run_pg_killed_takes_its_job_down_at_once() {
    use std::io::{BufRead, BufReader};
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("job.log");
    let script = format!(
        "trap 'echo term >> {log}' TERM; echo $$; while :; do sleep 0.05; done",
        log = log.display()
    );
    let mut run = Command::new(env!("CARGO_BIN_EXE_flocklease"))
        .args([
            "run", "--pg", &url, "--id", "killed", "--grace", "30s", "--", "sh", "-c", &script,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(run.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let job: i32 = first.trim().parse().unwrap();
    let alive = || {
        std::path::Path::new(&format!("/proc/{job}")).exists()
            && !std::fs::read_to_string(format!("/proc/{job}/stat"))
                .unwrap_or_default()
                .contains(") Z ")
    };
    assert!(alive());
    run.kill().unwrap();
    run.wait().unwrap();
    pg::until("the job of the killed run to be gone", || !alive());
    assert!(
        !log.exists(),
        "the job was given a grace period: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // And the lease is free for the next run.
    let out = flocklease(&["run", "--pg", &url, "--id", "killed", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
}

/// Issue 51: `run --pg -w` exited 70 at the first connection error of a failover, although
/// the lease was free on the new primary. A waiter keeps waiting, reconnecting, until its
/// deadline: here a holder on the primary, a waiter given both servers
/// (`target_session_attrs=read-write`), then the primary crashes and its synchronous standby
/// is promoted; the waiter runs its job there, with a greater token, well within its wait.
#[test]
fn a_waiter_waits_through_a_failover_and_runs_its_job_on_the_new_primary() {
    use crate::cluster::Node;
    use std::time::{Duration, Instant};
    let Some(primary) = Node::primary(&["synchronous_standby_names=s1", "fsync=off"]) else {
        return;
    };
    let standby = primary.standby("s1");
    primary.sync_walsender("s1");
    let both = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
         target_session_attrs=read-write",
        primary.port, standby.port
    );
    let holder = PgLease::builder(&primary.url())
        .ttl(Duration::from_secs(60))
        .connect()
        .unwrap();
    let held = holder
        .acquire(&SessionId::new("job").unwrap(), &Owner::new("old").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    let waiter = Command::new(env!("CARGO_BIN_EXE_flocklease"))
        .args([
            "run",
            "--pg",
            &both,
            "--id",
            "job",
            "-w",
            "60s",
            "--",
            "sh",
            "-c",
            "echo token=$FLOCKLEASE_TOKEN",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let admin = primary.admin();
    pg::until("the waiter to wait for the holder", || {
        !admin
            .query(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND wait_event = 'advisory'",
                &[],
            )
            .is_empty()
    });
    drop(admin);
    let crashed = Instant::now();
    primary.crash();
    standby.promote();
    let out = waiter.wait_with_output().unwrap();
    let took = crashed.elapsed();
    eprintln!("the waiter's job ran and it exited {took:?} after the crash");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("token={}", held.token + 1),
        "{out:?}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
    // On the new primary: granted there, and released after the job.
    let row = standby.admin().row("job").unwrap();
    assert_eq!((row.0.as_str(), row.1), ("", held.token as i64 + 1));
    drop(holder);
}
