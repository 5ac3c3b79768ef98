//! `flocklease run` keeps its promise when it or its job is signalled or killed: while any
//! process of the job may still run, no other `run` is granted the lease before it expires.
//! Real processes throughout .

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cli_support::*;
use flocklease::Timestamp;
use nix::sys::signal::Signal;

/// The job for the forwarding test. The leader traps the signal, records it, and finishes
/// only when told; a member records the signal if it can trap it (a background job of a
/// non-interactive shell has SIGINT and SIGQUIT ignored and cannot trap them: it then ends
/// with the SIGTERM that `run` sends to what the command leaves behind); a stubborn member
/// ignores every stop signal and ends only when told.
const DRAINING_JOB: &str = r#"
ulimit -c 0
SIG=$1; D=$2
trap 'echo got > "$D/leader.$SIG"; until [ -e "$D/go.$SIG" ]; do sleep 0.01; done; exit 3' $SIG
sh -c 'trap "echo got > $1/member.$2; exit 0" $2; echo > $1/member-ready.$2; while :; do sleep 0.01; done' member "$D" "$SIG" &
sh -c 'trap "" TERM INT HUP QUIT; echo > $1/stubborn-ready.$2; until [ -e $1/done.$2 ]; do sleep 0.01; done' stubborn "$D" "$SIG" &
until [ -e "$D/member-ready.$SIG" ] && [ -e "$D/stubborn-ready.$SIG" ]; do sleep 0.01; done
echo $$ > "$D/leader-pid.$SIG"
while :; do sleep 0.01; done
"#;

#[test]
fn stop_signals_reach_the_whole_group_and_the_lease_is_kept_until_its_last_process_exits() {
    let s = Scene::new();
    let job = s.script("job.sh", DRAINING_JOB);
    let d = s.tmp.path().to_str().unwrap().to_owned();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        let name = &sig.as_str()[3..];
        let id = format!("drain-{name}");
        let file = |f: &str| format!("{f}.{name}");
        let mut run = s.start(&id, &["--grace", "60s"], &["sh", &job, name, &d]);
        let leader = s.pid(&file("leader-pid"));
        signal(run.id() as i32, sig);
        s.wait_file(&file("leader"));
        if matches!(sig, Signal::SIGTERM | Signal::SIGHUP) {
            s.wait_file(&file("member"));
        }
        assert_eq!(s.rival(&id), None, "{name}: granted while the job drains");
        s.touch(&file("go"));
        wait_until("the leader to exit", || !pid_alive(leader));
        // The command has exited; a process of its group still runs.
        assert_eq!(
            s.rival(&id),
            None,
            "{name}: granted while a job process runs"
        );
        assert!(
            run.try_wait().unwrap().is_none(),
            "{name}: run exited early"
        );
        s.touch(&file("done"));
        let status = wait_exit(&mut run);
        assert_eq!(status.code(), Some(3), "{name}: the command's own status");
        assert_eq!(s.rival(&id), Some(2), "{name}: released after the job");
    }
}

#[test]
fn after_the_grace_period_the_group_is_killed_and_run_exits_with_128_plus_the_signal() {
    let s = Scene::new();
    let script = format!(
        "trap '' TERM; sleep 600 & echo $! > {gc}; echo $$ > {pid}; wait",
        gc = s.path("gc").display(),
        pid = s.path("pid").display()
    );
    let run = s.start("grace", &["--grace", "200ms"], &["sh", "-c", &script]);
    let (gc, leader) = (s.pid("gc"), s.pid("pid"));
    signal(run.id() as i32, Signal::SIGTERM);
    let out = output_of(run);
    // Both ignore SIGTERM: only the SIGKILL after the grace period ends them.
    assert_eq!(out.status.code(), Some(128 + 9), "{}", describe(&out));
    assert!(
        !pid_alive(leader) && !pid_alive(gc),
        "a job process survived"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("killed it"));
    assert_eq!(s.rival("grace"), Some(2));
}

#[test]
fn a_lost_lease_stops_every_process_of_the_job() {
    let s = Scene::new();
    let script = format!(
        "sleep 600 & echo $! > {gc}; echo $$ > {pid}; wait",
        gc = s.path("gc").display(),
        pid = s.path("pid").display()
    );
    let run = s.start(
        "lost",
        &["--ttl", "500ms", "--grace", "10s"],
        &["sh", "-c", &script],
    );
    let (gc, leader) = (s.pid("gc"), s.pid("pid"));
    let runner = run.id() as i32;
    stop_outside_transition(runner, &s.leases, "lost");
    // Suspended past its TTL: a rival takes over as soon as the lease expires.
    let mut taken = None;
    wait_until("the lease to expire", || {
        taken = s.rival("lost");
        taken.is_some()
    });
    assert_eq!(taken, Some(2));
    signal(runner, Signal::SIGCONT);
    let out = output_of(run);
    assert_eq!(out.status.code(), Some(76), "{}", describe(&out));
    // Reported as expired (the wall clock passed the expiry) or taken over (a renew was
    // refused), whichever the keep-alive notices first; the job was killed by the watchdog
    // before the expiry, while `run` was stopped.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("killed the job (process group"), "{err}");
    assert!(err.contains("; the job (process group"), "{err}");
    assert!(!pid_alive(leader), "the command survived the loss");
    assert!(!pid_alive(gc), "the grandchild survived the loss");
}

#[test]
fn kill_9_of_run_stops_its_job_through_the_watchdog_and_frees_the_lease_then() {
    let s = Scene::new();
    let script = format!(
        "sleep 600 & echo $! > {gc}; echo $$ > {pid}; wait",
        gc = s.path("gc").display(),
        pid = s.path("pid").display()
    );
    let mut run = s.start("nine", &["--ttl", "60s"], &["sh", "-c", &script]);
    let (gc, leader) = (s.pid("gc"), s.pid("pid"));
    let watchdog = watchdog_of(run.id() as i32);
    signal(run.id() as i32, Signal::SIGKILL);
    wait_exit(&mut run);
    wait_until("the job to be stopped and the watchdog to exit", || {
        !pid_alive(leader) && !pid_alive(gc) && !pid_alive(watchdog)
    });
    // Long before the 60 s expiry: the job's processes and the watchdog, the last holders of
    // the liveness lock, are gone.
    assert_eq!(s.rival("nine"), Some(2));
}

#[test]
fn after_kill_9_of_run_the_lease_stays_held_while_the_job_runs_and_the_job_dies_before_the_expiry()
{
    // Orphans of this test binary's processes come to it and it never reaps them, like a
    // container's pid 1 that does not reap: the job's zombie stays in its group. (Harmless to
    // the other tests: zombies count as gone for them.)
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let s = Scene::new();
    // The job ignores the watchdog's SIGTERM; the grace period's SIGKILL would come after 600 s.
    let script = format!(
        "trap '' TERM; echo $$ > {pid}; until [ -e {go} ]; do sleep 0.01; done",
        pid = s.path("pid").display(),
        go = s.path("go").display()
    );
    let mut run = s.start(
        "expiry",
        &["--ttl", "2s", "--grace", "600s"],
        &["sh", "-c", &script],
    );
    let leader = s.pid("pid");
    let watchdog = watchdog_of(run.id() as i32);
    signal(run.id() as i32, Signal::SIGKILL);
    wait_exit(&mut run);
    let expiry = s.record("expiry").expiry;
    assert_eq!(s.rival("expiry"), None, "granted while the job runs");
    // A rival with a 10 s TTL reports its grant's expiry: granted at that minus 10 s.
    let mut granted = None;
    wait_until("the lease to expire", || {
        let out = s
            .run(
                "expiry",
                &["-q", "--ttl", "10s"],
                &["sh", "-c", "echo $FLOCKLEASE_EXPIRY"],
            )
            .output()
            .unwrap();
        if out.status.code() == Some(0) {
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            granted = Some(Timestamp::parse_rfc3339(&text).unwrap());
        }
        granted.is_some()
    });
    let at = granted
        .unwrap()
        .checked_sub(Duration::from_secs(10))
        .unwrap();
    // Not before the hard deadline (the expiry less TTL/10): the job ignores SIGTERM, so it
    // died only then, and the watchdog kept the lease live until it had.
    let deadline = expiry.checked_sub(Duration::from_millis(200)).unwrap();
    assert!(
        at >= deadline,
        "granted at {at}, before the deadline {deadline}"
    );
    assert_eq!(s.record("expiry").token, 2);
    // The grace period (600 s) never outlasts the lease: the watchdog killed the job at the
    // hard deadline, before the expiry. It exits once the group is gone (zombies left to a
    // pid 1 that does not reap do not count).
    assert!(!pid_alive(leader), "the job outlived its lease");
    wait_until("the watchdog to exit", || !pid_alive(watchdog));
}

/// The watchdog process of `run`.
fn watchdog_of(runner: i32) -> i32 {
    children(runner)
        .into_iter()
        .find(|&p| cmdline(p).contains("__watchdog"))
        .expect("run has a watchdog child")
}

#[test]
fn with_run_and_its_watchdog_both_killed_the_inherited_descriptor_keeps_the_lease_live() {
    let s = Scene::new();
    let script = format!(
        "echo $$ > {pid}; until [ -e {go} ]; do sleep 0.01; done",
        pid = s.path("pid").display(),
        go = s.path("go").display()
    );
    let mut run = s.start("fd", &["--ttl", "60s"], &["sh", "-c", &script]);
    let runner = run.id() as i32;
    let leader = s.pid("pid");
    let watchdog = watchdog_of(runner);
    signal(watchdog, Signal::SIGKILL);
    signal(runner, Signal::SIGKILL);
    wait_exit(&mut run);
    assert!(pid_alive(leader), "nothing should have stopped the job");
    assert_eq!(s.rival("fd"), None, "granted while the job runs");
    s.touch("go");
    wait_until("the job to finish", || !pid_alive(leader));
    // The job was the last holder: the lease is free at once, long before its expiry.
    assert_eq!(s.rival("fd"), Some(2));
}

/// The job gets the terminal: it can read it (a background group would be stopped by
/// SIGTTIN), and Ctrl-Z stops it and `run`, as a shell expects of a foreground job.
#[test]
fn an_interactive_job_reads_the_terminal_and_ctrl_z_suspends_run() {
    let s = Scene::new();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let script = format!(
        "echo $$ > {pid}; read a; echo \"got $a\"; read b; echo \"got $b\"",
        pid = s.path("pid").display()
    );
    // `setsid --ctty` makes the pty the controlling terminal; run is then its foreground.
    let mut child = std::process::Command::new("setsid")
        .args(["--ctty", "--wait", BIN, "run", "--dir"])
        .arg(&s.leases)
        .args(["--id", "tty", "--", "sh", "-c", &script])
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    s.track(child.id() as i32);
    let mut master = std::fs::File::from(pty.master);
    let seen = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (mut master, seen) = (master.try_clone().unwrap(), Arc::clone(&seen));
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            // Ends with EIO once every slave descriptor is closed.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let saw = |text: &str| {
        let seen = Arc::clone(&seen);
        let text = text.to_owned();
        move || seen.lock().unwrap().contains(&text)
    };
    let leader = s.pid("pid");
    master.write_all(b"hello\n").unwrap();
    wait_until("the job to read the terminal", saw("got hello"));
    // Ctrl-Z while the job reads: the job stops, then run stops itself.
    master.write_all(&[0x1a]).unwrap();
    let runner = child.id() as i32;
    wait_until("run to stop", || pid_stopped(runner));
    assert!(pid_stopped(leader));
    // `fg`: continued, run gives the terminal back to the job and continues it.
    signal(runner, Signal::SIGCONT);
    wait_until("the job to continue", || !pid_stopped(leader));
    master.write_all(b"again\n").unwrap();
    wait_until("the job to read again", saw("got again"));
    let status = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0), "{}", seen.lock().unwrap());
    drop(master);
    reader.join().unwrap();
}

/// Signals that ask a job for something other than stopping (a reload, a thread dump, a log
/// reopen, a resized terminal) reach its group, and a job that survives them keeps running:
/// with a grace period of zero, a signal taken for a stop would have killed it at once.
#[test]
fn other_signals_are_forwarded_and_start_no_grace_period() {
    let s = Scene::new();
    let names = ["HUP", "QUIT", "USR1", "USR2", "WINCH"];
    let mut script = String::from("D=$1\n");
    for n in names {
        script.push_str(&format!("trap 'echo > \"$D/got.{n}\"' {n}\n"));
    }
    script
        .push_str("echo $$ > \"$D/pid\"\nuntil [ -e \"$D/done\" ]; do sleep 0.01; done\nexit 7\n");
    let job = s.script("others.sh", &script);
    let d = s.tmp.path().to_str().unwrap().to_owned();
    let mut run = s.start("others", &["--grace", "0"], &["sh", &job, &d]);
    let leader = s.pid("pid");
    for (n, sig) in names.iter().zip([
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
    ]) {
        signal(run.id() as i32, sig);
        s.wait_file(&format!("got.{n}"));
        assert!(pid_alive(leader), "{n} stopped the job");
        assert_eq!(s.rival("others"), None, "{n}: granted while the job runs");
    }
    s.touch("done");
    assert_eq!(wait_exit(&mut run).code(), Some(7));
    assert_eq!(s.rival("others"), Some(2));
}
