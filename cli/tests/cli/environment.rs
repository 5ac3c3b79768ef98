//! `run` and its watchdog in the environment they live in (PROTOCOL §7.1): a watchdog stopped
//! alone, a terminal with `stty tostop`, a stderr that is broken or full, and a stop that
//! sends SIGTERM to every process of a unit at once. In each, the job must never run beside
//! the next holder while `run` or its watchdog is up, and an ordinary stop keeps the job's
//! status.
//!
//! Each job appends the time to `ticks` every 10 ms; a rival `run -w` records when its own
//! job starts; no tick of the first job may come at or after it.

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::OwnedFd;

use crate::cli_support::*;
use nix::sys::signal::Signal;

/// `run` is stopped (as a shell's Ctrl-Z or a debugger would) with its stderr as `stderr`
/// sets it: the watchdog must kill the job before the lease can pass to a rival.
fn stopped_run_with(id: &str, stderr: impl FnOnce(&mut std::process::Command)) {
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let mut cmd = s.run(id, &["--ttl", "1s"], &["bash", "-c", &script]);
    stderr(&mut cmd);
    let mut run = cmd.spawn().unwrap();
    s.track(run.id() as i32);
    s.pid("pid");
    s.wait_file("ticks");
    let dog = watchdog_of(run.id() as i32);
    s.track(dog);
    stop_outside_transition(run.id() as i32, &s.leases, id);
    let start = rival_start(&s, id, "20s");
    assert_eq!(
        ticks_after(&s, start),
        0,
        "the job ran beside the next holder (watchdog stopped: {})",
        pid_stopped(dog)
    );
    signal(run.id() as i32, Signal::SIGCONT);
    // Resumed, `run` finds its lease taken over.
    assert_eq!(wait_exit(&mut run).code(), Some(76));
}

#[test]
fn a_watchdog_stopped_alone_is_a_watchdog_gone() {
    // Issue 45.1: the watchdog stopped while `run` renews. `run` never blocks on its socket,
    // and one that reads no deadline for longer than the TTL cannot stop the job if `run`
    // dies: `run` stops the job while it holds the lease and exits 79.
    let s = Scene::new();
    let script = ticking_job(&s, false);
    let run = s.start(
        "deaf",
        &["--ttl", "500ms", "--grace", "100ms"],
        &["bash", "-c", &script],
    );
    s.pid("pid");
    let dog = watchdog_of(run.id() as i32);
    s.track(dog);
    signal(dog, Signal::SIGSTOP);
    // Before: the socket filled after about 93 TTLs, `run` blocked, and this rival was
    // granted beside the job.
    let start = rival_start(&s, "deaf", "70s");
    assert_eq!(
        ticks_after(&s, start),
        0,
        "the job ran beside the next holder"
    );
    signal(dog, Signal::SIGCONT);
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(79), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stopped listening"),
        "{}",
        describe(&out)
    );
}

#[test]
fn a_short_stop_of_the_watchdog_leaves_the_job_running() {
    // A watchdog stopped for less than the TTL (here: one renew) is still a watchdog.
    let s = Scene::new();
    let script = format!(
        "echo $$ > {pid}; while [ ! -e {go} ]; do sleep 0.01; done",
        pid = s.path("pid").display(),
        go = s.path("go").display()
    );
    let run = s.start("short", &["--ttl", "3s"], &["sh", "-c", &script]);
    s.pid("pid");
    let dog = watchdog_of(run.id() as i32);
    s.track(dog);
    let before = s.record("short").expiry;
    signal(dog, Signal::SIGSTOP);
    wait_until("a renew while the watchdog is stopped", || {
        s.record("short").expiry != before
    });
    signal(dog, Signal::SIGCONT);
    s.touch("go");
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn on_a_tostop_terminal_the_watchdog_kills_before_the_lease_passes() {
    // Issue 45.2: `run` in a shell's foreground on a `stty tostop` terminal, stopped. The
    // watchdog, a background process group writing to that terminal, was stopped by SIGTTOU
    // when it said why it was about to kill.
    let mut master = None;
    stopped_run_with("tty", |cmd| master = Some(on_tostop_terminal(cmd)));
}

#[test]
fn a_broken_stderr_never_keeps_the_watchdog_from_killing() {
    // Issue 45.3: stderr a pipe whose reader is gone (`run ... 2>&1 | head`): the watchdog
    // panicked on EPIPE before it signalled the job.
    stopped_run_with("epipe", |cmd| {
        let (read, write) = nix::unistd::pipe().unwrap();
        drop(read);
        cmd.stderr(File::from(write));
    });
}

#[test]
fn a_full_stderr_never_keeps_the_watchdog_from_killing() {
    // Issue 45.3: stderr a pipe nobody reads, full: the watchdog's message blocked before it
    // signalled the job.
    let mut keep: Option<OwnedFd> = None;
    stopped_run_with("full", |cmd| {
        let (read, write) = nix::unistd::pipe().unwrap();
        fill_pipe(&write);
        keep = Some(read);
        cmd.stderr(File::from(write));
    });
}

#[test]
fn run_with_a_broken_stderr_stops_the_leftovers_before_it_releases() {
    // Issue 45.3: `run`'s own message ("stopping what it left running") panicked on EPIPE,
    // and its unwinding released the lease while the command's leftovers ran.
    let s = Scene::new();
    let script = format!(
        "( trap '' TERM; echo $BASHPID > {pid}; while :; do date +%s%N >> {ticks}; sleep 0.01; \
         done ) & while [ ! -s {pid} ]; do sleep 0.01; done; exit 0",
        pid = s.path("pid").display(),
        ticks = s.path("ticks").display()
    );
    let mut cmd = s.run("leftovers", &["--grace", "300ms"], &["bash", "-c", &script]);
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    cmd.stderr(File::from(write));
    let run = cmd.spawn().unwrap();
    s.track(run.id() as i32);
    s.pid("pid");
    let mut run = run;
    let start = rival_start(&s, "leftovers", "20s");
    assert_eq!(
        ticks_after(&s, start),
        0,
        "the leftovers ran beside the next holder"
    );
    // Not its output: leftovers that outlive a `run` that failed would keep its pipe open.
    assert_eq!(wait_exit(&mut run).code(), Some(0));
}

#[test]
fn sigterm_to_every_process_of_the_unit_is_an_ordinary_stop() {
    // Issue 45.4: systemd's KillMode=control-group sends SIGTERM to every process of the unit
    // at once, the watchdog included; `run` exited 79 ("the watchdog died") on every stop.
    // The job exits 0 on SIGTERM, and so does `run`.
    let s = Scene::new();
    let script = format!(
        "trap 'exit 0' TERM; echo $$ > {pid}; while :; do sleep 0.01; done",
        pid = s.path("pid").display()
    );
    let run = s.start("unit", &[], &["bash", "-c", &script]);
    let job = s.pid("pid");
    let dog = watchdog_of(run.id() as i32);
    s.track(dog);
    // The watchdog first: the order that made `run` see it gone before the job ended.
    signal(dog, Signal::SIGTERM);
    signal(-job, Signal::SIGTERM);
    signal(run.id() as i32, Signal::SIGTERM);
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    wait_until("the watchdog to end with run", || !pid_alive(dog));
}

#[test]
fn a_lease_directory_removed_and_recreated_stops_the_job_at_once() {
    // Issue 50: a user's crontab on `$XDG_RUNTIME_DIR/flocklease`, which logind removes at the
    // last logout: the holder learns it within a clock check (a second), not at its next renew
    // (20 s away here), and stops its job. What remains: a rival on the new directory starts
    // at token 1 (README, PROTOCOL §11).
    let s = Scene::new();
    let script = format!(
        "echo $$ > {pid}; while :; do sleep 0.01; done",
        pid = s.path("pid").display()
    );
    let run = s.start("gone", &["--ttl", "60s"], &["sh", "-c", &script]);
    let job = s.pid("pid");
    std::fs::remove_dir_all(&s.leases).unwrap();
    std::fs::create_dir(&s.leases).unwrap();
    let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pid_alive(job) {
        assert!(
            std::time::Instant::now() < by,
            "the job still runs 10 s after its lease directory was replaced"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was replaced"),
        "{}",
        describe(&out)
    );
    assert_eq!(s.rival("gone"), Some(1));
}

#[test]
fn the_watchdog_ignores_a_units_sigterm_from_its_start() {
    // Found by the process lockstep (issue 49): the watchdog set its signals to ignored in its
    // own `main`, after the runtime's start and the parsing of its arguments; a unit's SIGTERM
    // in between killed it, and `run` exited 79 on an ordinary stop. Ignored before exec, they
    // are ignored as soon as the watchdog runs as one.
    let s = Scene::new();
    let mut run = s.start("early", &[], &["sleep", "60"]);
    let dog = watchdog_of(run.id() as i32);
    s.track(dog);
    let status = std::fs::read_to_string(format!("/proc/{dog}/status")).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGTTOU,
        Signal::SIGPIPE,
    ] {
        assert_ne!(
            ignored & (1 << (sig as i32 - 1)),
            0,
            "{sig} not ignored yet"
        );
    }
    run.kill().unwrap();
    run.wait().unwrap();
}
