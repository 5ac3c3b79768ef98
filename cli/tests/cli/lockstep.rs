//! The real `run`, its watchdog and its job in lockstep with the run model (issue 49,
//! `flocklease_model::run_schedules`): every schedule of up to two environment steps that
//! settles in the model is played on real processes, and what they came to — was the job
//! still running when a rival was granted, how `run` ended — must be one of the outcomes the
//! model allows for that schedule.
//!
//! The model's steps on real processes (a tick is a third of the 1 s TTL; the grace period is
//! two ticks):
//!
//! | model | real |
//! | --- | --- |
//! | stderr `Fine`, `Full`, `Broken`, `Tostop` | a pipe that is read; a pipe filled and never read; a pipe whose reader is closed; a pseudo-terminal with `stty tostop`, `run` its session's leader |
//! | `RunStop`, `RunCont`, `RunDie` | SIGSTOP (outside a transition on the id), SIGCONT, SIGKILL to `run` |
//! | `WdStop` | SIGSTOP to the watchdog, then its socket filled to the last byte through a copy of `run`'s end (`pidfd_getfd`): the model's socket holds one deadline, the kernel's some hundreds |
//! | `WdCont`, `WdDie` | SIGCONT, SIGKILL to the watchdog |
//! | `CmdExit` | the command exits 0, leaving its background child in the group |
//! | `UnitStop` | SIGTERM to the watchdog (and, if it does not ignore it, its death awaited), to the job's group, to `run` |
//! | `JobExit` / no `JobExit` | the job and its child trap SIGTERM with `exit 0` / ignore it |
//! | `RivalGranted` | `FlockLease::acquire_wait` in the harness; at its grant, whether a process of the job's group runs (zombies do not count) |
//!
//! Each step is taken as the model takes it: the first at once, each later one once the
//! previous settled (a rival granted, or `run` ended and the job's group gone, or
//! `SETTLE` ticks passed). After the last, the harness waits (bounded) for `run` to end and the
//! job's group to be gone. `FLOCKLEASE_LOCKSTEP=TEXT` plays only the schedules whose
//! description contains TEXT (to see which catch a mistake planted in the production code).

#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flocklease::supervise::Exit;
use flocklease::{Durability, FlockLease, Owner, SessionId};
use flocklease_model::run::{RunAction, Stderr};
use flocklease_model::run_schedules::{self, Ending, Outcome, SETTLE, Schedule};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cli_support::*;

/// A tick of the model: a third of the TTL.
const TICK: Duration = Duration::from_millis(333);
/// Schedules played at once.
const WORKERS: usize = 2;

#[test]
fn the_real_run_follows_its_model_schedule_by_schedule() {
    let started = Instant::now();
    let model = run_schedules::model();
    let filter = std::env::var("FLOCKLEASE_LOCKSTEP").unwrap_or_default();
    let chosen: Vec<(Schedule, Vec<Outcome>)> = run_schedules::schedules(&model, 2)
        .into_iter()
        .filter(|(s, _)| describe_schedule(s).contains(&filter))
        .collect();
    let modelled = started.elapsed();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(vec![]);
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((schedule, _)) = chosen.get(i) else {
                        return;
                    };
                    let t = Instant::now();
                    let real = play(schedule, i);
                    results.lock().unwrap().push((i, real, t.elapsed()));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let mut report = String::new();
    let mut divergences = 0;
    for (i, real, took) in &results {
        let (schedule, allowed) = &chosen[*i];
        let verdict = match real {
            Ok(real) if allowed.contains(&real.outcome) => "ok".to_owned(),
            Ok(_) => {
                divergences += 1;
                "DIVERGES".to_owned()
            }
            Err(e) => {
                divergences += 1;
                format!("DIVERGES: {e}")
            }
        };
        report += &format!(
            "{:<44} model {:<40} real {:<22} {:>5} ms  {verdict}\n",
            describe_schedule(schedule),
            allowed
                .iter()
                .map(describe_outcome)
                .collect::<Vec<_>>()
                .join(" | "),
            real.as_ref()
                .map_or_else(|_| "-".to_owned(), |r| describe_outcome(&r.outcome)),
            took.as_millis(),
        );
        if let Ok(real) = real
            && !allowed.contains(&real.outcome)
        {
            report += &format!("    run's stderr: {:?}\n", real.stderr);
        }
    }
    println!(
        "{report}{} schedules ({} modelled in {} ms), {divergences} divergences, {} s",
        chosen.len(),
        chosen.len(),
        modelled.as_millis(),
        started.elapsed().as_secs()
    );
    assert!(!chosen.is_empty(), "no schedule matches {filter:?}");
    assert_eq!(
        divergences, 0,
        "the real processes left the model:\n{report}"
    );
}

/// What the real processes came to.
struct Real {
    outcome: Outcome,
    /// `run`'s and the watchdog's stderr, when it was a pipe that is read.
    stderr: String,
}

/// Plays `schedule` on real processes.
fn play(schedule: &Schedule, n: usize) -> Result<Real, String> {
    let s = Scene::new();
    let id = format!("lockstep-{n}");
    let trap = if schedule.job_exits {
        "trap 'exit 0' TERM"
    } else {
        "trap '' TERM"
    };
    let script = format!(
        "exec 2>/dev/null; {trap}; echo $$ > {pid}; ( {trap}; while :; do sleep 0.02; done ) & \
         while [ ! -e {exit} ]; do sleep 0.01; done; exit 0",
        pid = s.path("pid").display(),
        exit = s.path("exit").display()
    );
    let mut cmd = s.run(
        &id,
        &["--ttl", "1s", "--grace", "667ms", "--durability", "nosync"],
        &["bash", "-c", &script],
    );
    cmd.stdout(Stdio::null());
    // What keeps the stderr as the schedule wants it until the end.
    let mut keep: Vec<OwnedFd> = vec![];
    let mut read_end = None;
    match schedule.stderr {
        Stderr::Fine => {
            let (read, write) = nix::unistd::pipe().unwrap();
            read_end = Some(read);
            cmd.stderr(File::from(write));
        }
        Stderr::Full => {
            let (read, write) = nix::unistd::pipe().unwrap();
            fill_pipe(&write);
            keep.push(read);
            cmd.stderr(File::from(write));
        }
        Stderr::Broken => {
            let (read, write) = nix::unistd::pipe().unwrap();
            drop(read);
            cmd.stderr(File::from(write));
        }
        Stderr::Tostop => keep.push(on_tostop_terminal(&mut cmd)),
    }
    let mut run = cmd.spawn().unwrap();
    drop(cmd);
    let stderr = read_end.map(|read| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = File::from(read).read_to_string(&mut text);
            let _ = tx.send(text);
        });
        rx
    });
    let outcome = drive(schedule, (&s, &id), &mut run);
    // Whatever came of it, nothing of this schedule is left running (the scene kills the job
    // and the watchdog).
    let _ = run.kill();
    let _ = run.wait();
    let stderr = stderr
        .and_then(|rx| rx.recv_timeout(Duration::from_secs(1)).ok())
        .unwrap_or_default();
    Ok(Real {
        outcome: outcome?,
        stderr,
    })
}

/// Takes `schedule`'s steps on the running `run` of `id`, then waits (bounded) for it to end.
fn drive(schedule: &Schedule, (s, id): (&Scene, &str), run: &mut Child) -> Result<Outcome, String> {
    let run_pid = run.id() as i32;
    s.track(run_pid);
    let job = s.pid("pid");
    let dog = watchdog_of(run_pid);
    s.track(dog);
    let (rival, _rival) = rival(s, id, job);
    let mut granted: Option<bool> = None;
    let mut exited: Option<ExitStatus> = None;
    for (i, &step) in schedule.steps.iter().enumerate() {
        if i > 0 {
            let from = Instant::now();
            while from.elapsed() < TICK * u32::from(SETTLE) {
                poll(&rival, &mut granted, run, &mut exited);
                if granted.is_some() || (exited.is_some() && !group_runs(job)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        take(step, (s, id), (run_pid, dog, job))
            .map_err(|e| format!("step {step:?} could not be taken: {e}"))?;
    }
    // The model's clock ends 16 ticks after the start; a little more for a loaded machine.
    let by = Instant::now() + TICK * 16 + Duration::from_secs(5);
    loop {
        poll(&rival, &mut granted, run, &mut exited);
        if exited.is_some() && !group_runs(job) {
            break;
        }
        if Instant::now() > by {
            return Err(format!(
                "run {} and the job {} after the model's clock (a rival granted: {})",
                if exited.is_some() {
                    "ended"
                } else {
                    "still runs"
                },
                if group_runs(job) {
                    "still runs"
                } else {
                    "ended"
                },
                match granted {
                    None => "no",
                    Some(true) => "yes, while the job ran",
                    Some(false) => "yes, after the job",
                }
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = exited.unwrap_or_else(|| unreachable!());
    let ending = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(76), _) => Ending::Exit(Exit::Lost),
        (Some(78), _) => Ending::Exit(Exit::Deadline),
        (Some(79), _) => Ending::Exit(Exit::WatchdogGone),
        (Some(code), _) => Ending::Exit(Exit::Job(u8::try_from(code).unwrap())),
        (None, Some(9)) => Ending::Died,
        (None, sig) => return Err(format!("run ended by signal {sig:?}")),
    };
    Ok(Outcome {
        // Not granted yet: the job's group is gone, so a later grant overlaps nothing.
        overlap: granted.unwrap_or(false),
        ending,
    })
}

/// Takes one step of the environment on the real processes.
fn take(
    step: RunAction,
    (s, id): (&Scene, &str),
    (run, dog, job): (i32, i32, i32),
) -> Result<(), String> {
    match step {
        RunAction::RunStop => stop_outside_transition_if_alive(run, s, id),
        RunAction::RunCont => send(run, Signal::SIGCONT),
        RunAction::RunDie => send(run, Signal::SIGKILL),
        RunAction::WdStop => {
            send(dog, Signal::SIGSTOP)?;
            wait_until("the watchdog to stop", || {
                pid_stopped(dog) || !pid_alive(dog)
            });
            fill_socket(run)
        }
        RunAction::WdCont => send(dog, Signal::SIGCONT),
        RunAction::WdDie => send(dog, Signal::SIGKILL),
        RunAction::CmdExit => {
            s.touch("exit");
            Ok(())
        }
        RunAction::UnitStop => {
            // The watchdog first: the order in which its end can reach `run` before `run`'s
            // own SIGTERM does. A watchdog that does not ignore SIGTERM is let die first.
            let ignores = ignores_sigterm(dog);
            let _ = send(dog, Signal::SIGTERM);
            if !ignores && !pid_stopped(dog) {
                let by = Instant::now() + Duration::from_secs(2);
                while pid_alive(dog) && Instant::now() < by {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            // To whichever is still there: a watchdog that died of it may have ended the rest.
            let _ = send(-job, Signal::SIGTERM);
            let _ = send(run, Signal::SIGTERM);
            Ok(())
        }
        other => Err(format!("{other:?} has no real counterpart here")),
    }
}

/// Sends `sig` to `pid`; a process already gone (or a zombie) is an error.
fn send(pid: i32, sig: Signal) -> Result<(), String> {
    if pid > 0 && !pid_alive(pid) {
        return Err(format!("process {pid} is gone"));
    }
    kill(Pid::from_raw(pid), sig).map_err(|e| format!("kill {pid}: {e}"))
}

/// [`stop_outside_transition`] for a `run` that may end meanwhile.
fn stop_outside_transition_if_alive(run: i32, s: &Scene, id: &str) -> Result<(), String> {
    let lock = s
        .leases
        .join(format!("{}.lock", SessionId::new(id).unwrap().stem()));
    let by = Instant::now() + GUARD;
    while Instant::now() < by {
        send(run, Signal::SIGSTOP)?;
        while !pid_stopped(run) {
            if !pid_alive(run) {
                return Err("run ended".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let file = File::open(&lock).map_err(|e| e.to_string())?;
        if file.try_lock().is_ok() {
            return Ok(());
        }
        // Stopped inside a renew: let it finish that one.
        send(run, Signal::SIGCONT)?;
        wait_until("the transition to end", || file.try_lock().is_ok());
    }
    Err("never stopped outside a transition".into())
}

/// The harness's rival: waits for the lease in a thread of its own (`acquire_wait` in slices
/// of 50 ms, so that it can be called off) and, the moment it is granted, says whether a
/// process of the job's group still runs. It holds the lease until the guard is dropped, which
/// ends the thread before the scene's directory is removed (a wait left behind would create it
/// again and take the lease there).
fn rival(s: &Scene, id: &str, job: i32) -> (Receiver<bool>, Rival) {
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let leases = FlockLease::builder(&s.leases)
        .ttl(Duration::from_secs(60))
        .durability(Durability::NoSync)
        .open()
        .unwrap();
    let id = SessionId::new(id).unwrap();
    let stopped = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        let owner = Owner::new("rival").unwrap();
        while !stopped.load(Ordering::SeqCst) {
            if let Ok(grant) = leases.acquire_wait(&id, &owner, Duration::from_millis(50))
                && grant.lease().is_some()
            {
                let _ = tx.send(group_runs(job));
                while !stopped.load(Ordering::SeqCst) {
                    std::thread::park();
                }
            }
        }
    });
    (
        rx,
        Rival {
            stop,
            thread: Some(thread),
        },
    )
}

/// Calls the rival off when dropped.
struct Rival {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Rival {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// Notes the rival's grant and `run`'s exit, if they came.
fn poll(
    rival: &Receiver<bool>,
    granted: &mut Option<bool>,
    run: &mut Child,
    exited: &mut Option<ExitStatus>,
) {
    if granted.is_none() {
        *granted = rival.try_recv().ok();
    }
    if exited.is_none() {
        *exited = run.try_wait().unwrap();
    }
}

/// Whether a process of group `pgid` runs (zombies do not count), as the watchdog judges it.
fn group_runs(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
            group == Some(pgid) && !matches!(state, Some("Z" | "X"))
        })
    })
}

/// Whether `pid` ignores SIGTERM (its `SigIgn` mask).
fn ignores_sigterm(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (Signal::SIGTERM as i32 - 1)) != 0)
}

/// Fills the watchdog's socket through a copy of `run`'s end of it, so that `run`'s next
/// deadline finds it full.
#[allow(unsafe_code)]
fn fill_socket(run: i32) -> Result<(), String> {
    use nix::libc;
    use nix::sys::socket::{MsgFlags, SockType, getsockopt, send, sockopt};
    // SAFETY: a system call on integers; the descriptor it returns is owned at once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, run, 0) };
    if pidfd < 0 {
        return Err(format!("pidfd_open: {}", Errno::last()));
    }
    // SAFETY: a new descriptor of this process that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let mut filled = false;
    for entry in std::fs::read_dir(format!("/proc/{run}/fd")).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: as above; pidfd_getfd returns a new descriptor of this process.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) };
        if fd < 0 {
            continue;
        }
        // SAFETY: as above.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        if getsockopt(&fd.as_fd(), sockopt::SockType) != Ok(SockType::SeqPacket) {
            continue;
        }
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        while send(fd.as_raw_fd(), &[b'x'; 4096], flags).is_ok() {}
        while send(fd.as_raw_fd(), b"x", flags).is_ok() {}
        filled = true;
    }
    filled
        .then_some(())
        .ok_or_else(|| "run has no socket to its watchdog".to_owned())
}

fn describe_schedule(s: &Schedule) -> String {
    let steps: Vec<String> = s.steps.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "{:?} job-{} {}",
        s.stderr,
        if s.job_exits { "exits" } else { "ignores" },
        steps.join(",")
    )
}

fn describe_outcome(o: &Outcome) -> String {
    let ending = match o.ending {
        Ending::Exit(Exit::Job(c)) => format!("exit {c}"),
        Ending::Exit(Exit::Lost) => "exit 76 (lost)".into(),
        Ending::Exit(Exit::Deadline) => "exit 78 (deadline)".into(),
        Ending::Exit(Exit::WatchdogGone) => "exit 79 (watchdog)".into(),
        Ending::Died => "killed".into(),
    };
    format!("{}{ending}", if o.overlap { "OVERLAP " } else { "" })
}
