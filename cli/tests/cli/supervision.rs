//! `flocklease run`: the job never runs beside a later grant, whoever dies (PROTOCOL §7), with
//! real processes. Each job appends its wall-clock time to a file every 10 ms; a rival `run`
//! records when its own job starts; the check is that no line of the first job comes after
//! it. The rule these tests exercise is the one the model checks (`flocklease-model check
//! --config run`).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use crate::cli_support::*;
use flocklease::SessionId;
use nix::sys::signal::Signal;

/// `<stem>.1.live`: the first generation's liveness file.
fn first_live(leases: &Path, id: &str) -> std::path::PathBuf {
    leases.join(format!("{}.1.live", SessionId::new(id).unwrap().stem()))
}

fn ino(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

#[test]
fn run_killed_the_grace_period_never_outlasts_the_lease() {
    // Issue 31.1: a grace period longer than the lease's time left.
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let mut run = s.start(
        "grace",
        &["--ttl", "2s", "--grace", "6s"],
        &["bash", "-c", &script],
    );
    let leader = s.pid("pid");
    s.wait_file("ticks");
    signal(run.id() as i32, Signal::SIGKILL);
    wait_exit(&mut run);
    let start = rival_start(&s, "grace", "25s");
    assert_eq!(
        ticks_after(&s, start),
        0,
        "the first job ran on after the rival was granted"
    );
    assert!(!pid_alive(leader), "the job outlived its lease");
}

#[test]
fn run_killed_after_a_renew_restored_its_liveness_file_the_lease_stays_held() {
    // Issue 31.2: a cleaner deletes the liveness file; run's renew publishes it again (a new
    // file); the job's inherited descriptor locks the old one. The watchdog got the new one
    // from the lease manager before it was placed.
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let run = s.start(
        "restored",
        &["--ttl", "3s", "--grace", "600s"],
        &["bash", "-c", &script],
    );
    let leader = s.pid("pid");
    s.wait_file("ticks");
    let live = first_live(&s.leases, "restored");
    let old = ino(&live).expect("the liveness file");
    std::fs::remove_file(&live).unwrap();
    wait_until("the renew to restore the liveness file", || {
        ino(&live).is_some_and(|i| i != old)
    });
    kill_run_then_held_until_the_job_is_gone(&s, "restored", run, leader);
}

#[test]
fn run_killed_while_its_job_closed_its_descriptors_the_lease_stays_held() {
    // Issue 31.3: the job closes the liveness descriptor it inherited.
    let s = Scene::new();
    let script = ticking_job(&s, true);
    let run = s.start(
        "closed",
        &["--ttl", "3s", "--grace", "600s"],
        &["bash", "-c", &script],
    );
    let leader = s.pid("pid");
    s.wait_file("ticks");
    kill_run_then_held_until_the_job_is_gone(&s, "closed", run, leader);
}

/// SIGKILLs `run`; a rival is answered held at once, and a waiting rival's job starts only
/// after the last line of `run`'s job (`leader`), which is dead by then.
fn kill_run_then_held_until_the_job_is_gone(
    s: &Scene,
    id: &str,
    mut run: std::process::Child,
    leader: i32,
) {
    signal(run.id() as i32, Signal::SIGKILL);
    wait_exit(&mut run);
    assert_eq!(s.rival(id), None, "granted at once while the job runs");
    let start = rival_start(s, id, "25s");
    assert_eq!(
        ticks_after(s, start),
        0,
        "the first job ran beside the rival"
    );
    assert!(!pid_alive(leader));
}

#[test]
fn a_killed_watchdog_is_noticed_and_the_job_stopped_while_the_lease_is_held() {
    // Issue 31.4: the watchdog killed alone; `run` stops the job (exit 79) rather than go on
    // without anyone to stop it should `run` die too.
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let run = s.start(
        "nowatchdog",
        &["--ttl", "60s", "--grace", "100ms"],
        &["bash", "-c", &script],
    );
    let leader = s.pid("pid");
    let watchdog = children(run.id() as i32)
        .into_iter()
        .find(|&p| cmdline(p).contains("__watchdog"))
        .expect("run has a watchdog child");
    signal(watchdog, Signal::SIGKILL);
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the watchdog died"),
        "{}",
        describe(&out)
    );
    assert!(!pid_alive(leader));
    assert_eq!(s.rival("nowatchdog"), Some(2));
}

#[test]
fn a_deadline_kill_exits_78_and_comes_before_the_expiry() {
    // Issue 31.4: `run` stopped past its deadline; the watchdog kills the job before the
    // confirmed expiry. Nobody took the lease over, so it was never lost: `run`, resumed,
    // exits with the deadline's own status, not 137 and not "lost" (76).
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let run = s.start("deadline", &["--ttl", "1s"], &["bash", "-c", &script]);
    let leader = s.pid("pid");
    s.wait_file("ticks");
    stop_outside_transition(run.id() as i32, &s.leases, "deadline");
    let expiry = s.record("deadline").expiry;
    wait_until("the watchdog to kill the job", || !pid_alive(leader));
    signal(run.id() as i32, Signal::SIGCONT);
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(78), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the watchdog killed the job"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        ticks_after(&s, expiry.unix_nanos() as u128),
        0,
        "the job wrote at or after the confirmed expiry"
    );
}
