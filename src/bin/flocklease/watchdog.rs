//! The watchdog: stops the job when `run` itself dies (`kill -9`, the OOM killer).
//!
//! `run` starts `flocklease __watchdog` (its own binary, through `/proc/self/exe`, so an
//! upgrade that replaces the file does not matter) in a process group of its own, so that
//! signals sent to `run`'s group (`timeout`, a shell's job control) do not reach it. Its stdin
//! is a pipe whose only writer is `run`: `run` writes the job's process group id once the job
//! exists, `until NANOS` with the lease's expiry (this host's wall clock) at the start and after
//! every successful renew, and `done` once the job is over. End of file without `done` means
//! `run` died: the watchdog sends SIGTERM to the job's group and SIGKILL after the grace
//! period, exactly as `run` does when the lease is lost (with `--pg`, SIGKILL at once: the
//! lease went with `run`'s connection). And should the expiry, less a margin, come without a
//! newer `until` — `run` stopped, hung or never scheduled — the watchdog kills the job's group
//! (SIGKILL) before the lease can be lost: a job never outlives its lease.
//!
//! Why not only a parent-death signal (`PR_SET_PDEATHSIG`) on the command: it reaches the
//! command alone, not the processes it started; it fires when the *thread* that forked exits;
//! and it is cleared by executing a set-user-id program. The pipe has none of these limits.
//! If the watchdog is killed too, the inherited liveness descriptor still keeps the lease live
//! while the job runs, until the expiry.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::unistd::Pid;

use crate::duration;

/// How often the watchdog checks whether the job's group is gone during the grace period (the
/// job's processes are not its children, so nothing wakes it; each check reads `/proc`).
const POLL: Duration = Duration::from_millis(20);

/// The arguments of the hidden `__watchdog` command.
#[derive(Args)]
pub struct WatchdogArgs {
    /// Time between SIGTERM and SIGKILL; zero: SIGKILL at once (the job holds no liveness
    /// of its own, so the lease is free the moment `run` dies).
    #[arg(long, value_parser = duration::parse)]
    grace: Duration,
    /// How long before the lease's expiry the job is killed if `run` confirmed no renew.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    margin: Duration,
}

/// `run`'s end of the pipe to its watchdog.
pub struct Watchdog {
    pipe: File,
}

impl Watchdog {
    /// Starts the watchdog process: `grace` as in [`WatchdogArgs`], and the job killed
    /// `margin` before the lease's expiry unless a renew moved it (see [`Deadlines`]).
    pub fn spawn(grace: Duration, margin: Duration) -> Result<Watchdog, String> {
        let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| format!("cannot create the watchdog's pipe: {e}"))?;
        let secs = |d: Duration| format!("{}.{:09}s", d.as_secs(), d.subsec_nanos());
        Command::new("/proc/self/exe")
            .arg0("flocklease")
            .arg("__watchdog")
            .arg("--grace")
            .arg(secs(grace))
            .arg("--margin")
            .arg(secs(margin))
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog: {e}"))?;
        Ok(Watchdog {
            pipe: File::from(write),
        })
    }

    /// The pipe's descriptor, for the job's pre-exec step to tell its own group (see
    /// `job::Job::spawn`): the watchdog knows it before the command runs.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.pipe)
    }

    /// Tells the watchdog which process group to stop if `run` dies.
    pub fn arm(&mut self, pgid: Pid) {
        let _ = writeln!(self.pipe, "{pgid}");
    }

    /// A second writer of the pipe, for the expiries (see [`Deadlines::attach`]).
    pub fn writer(&self) -> Option<File> {
        self.pipe.try_clone().ok()
    }

    /// Tells the watchdog that the job is over: it exits without doing anything.
    pub fn done(mut self) {
        let _ = writeln!(self.pipe, "done");
    }
}

/// The lease's expiry as `run` last confirmed it, told to the watchdog: a line
/// `until UNIX_NANOS` (this host's wall clock) after each successful renew, written by the
/// renewer thread itself. If `run` stops renewing — stopped, hung, descheduled — the
/// watchdog, in a process of its own, kills the job before that instant.
#[derive(Clone, Default)]
pub struct Deadlines(Arc<Mutex<(Option<File>, Option<i128>)>>);

impl Deadlines {
    /// Records a new deadline (and tells the watchdog, once attached).
    pub fn note(&self, unix_nanos: i128) {
        let mut d = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        d.1 = Some(unix_nanos);
        if let Some(pipe) = d.0.as_mut() {
            // One short line: written whole (below PIPE_BUF).
            let _ = writeln!(pipe, "until {unix_nanos}");
        }
    }

    /// Starts telling the watchdog through `pipe`, with the latest deadline at once.
    pub fn attach(&self, pipe: File) {
        let mut d = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        d.0 = Some(pipe);
        if let (Some(at), Some(pipe)) = (d.1, d.0.as_mut()) {
            let _ = writeln!(pipe, "until {at}");
        }
    }

    /// Stops telling the watchdog (before it is told `done`).
    pub fn detach(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0 = None;
    }
}

/// This host's wall clock, in nanoseconds since the epoch.
fn wall_nanos() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The hidden `__watchdog` command.
pub fn main(args: &WatchdogArgs) -> u8 {
    // A signal mask is inherited across exec: `run` blocks the signals it waits for.
    let _ = SigSet::empty().thread_set_mask();
    let mut pgid = None;
    // The job is killed at this wall-clock instant unless a renew moves it.
    let mut kill_at: Option<i128> = None;
    let margin = args.margin.as_nanos() as i128;
    let mut input = BufReader::new(std::io::stdin().lock());
    loop {
        if input.buffer().is_empty() {
            let wait = match (kill_at, pgid) {
                (Some(at), Some(_)) => {
                    let left = at - wall_nanos();
                    if left <= 0 {
                        Some(0)
                    } else {
                        // Looked at again at least every second: the wall clock may jump
                        // (a suspend), the monotonic one a poll waits on does not follow.
                        Some((left / 1_000_000).clamp(1, 1000) as u16)
                    }
                }
                _ => None,
            };
            let stdin = std::io::stdin();
            let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
            let timeout = wait.map_or(PollTimeout::NONE, PollTimeout::from);
            match poll(&mut fds, timeout) {
                Ok(0) => {
                    if let (Some(at), Some(group)) = (kill_at, pgid)
                        && wall_nanos() >= at
                    {
                        kill_at = None;
                        if group_alive(group) {
                            eprintln!(
                                "flocklease: no renew of the lease confirmed before its expiry \
                                 (run stopped or hung?); killing the job (process group \
                                 {group}) before the lease can be lost"
                            );
                            let _ = killpg(group, Signal::SIGKILL);
                        }
                    }
                    continue;
                }
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        let mut line = String::new();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let line = line.trim_end();
        if line == "done" {
            return 0;
        }
        if let Some(at) = line.strip_prefix("until ") {
            kill_at = at.parse::<i128>().ok().map(|at| at - margin);
            continue;
        }
        pgid = line
            .parse::<i32>()
            .ok()
            .filter(|&p| p > 1)
            .map(Pid::from_raw);
    }
    let Some(pgid) = pgid else { return 0 };
    if !group_alive(pgid) {
        return 0;
    }
    if args.grace.is_zero() {
        // The job runs with the lease free: no time for a graceful stop.
        eprintln!(
            "flocklease: run died and the lease with it; killing its job (process group {pgid})"
        );
        let _ = killpg(pgid, Signal::SIGKILL);
        return 0;
    }
    eprintln!("flocklease: run died; stopping its job (process group {pgid})");
    let _ = killpg(pgid, Signal::SIGTERM);
    let deadline = Instant::now() + args.grace;
    while Instant::now() < deadline {
        if !group_alive(pgid) {
            return 0;
        }
        std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    if group_alive(pgid) {
        eprintln!(
            "flocklease: job (process group {pgid}) still running after the grace period; killing it"
        );
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    0
}

/// Whether a process of the group still runs. Zombies do not count: once `run` is dead, the
/// job's processes are re-parented to pid 1 (or another subreaper), which may never reap them
/// (some containers), and `kill(2)` still finds a group of zombies.
fn group_alive(pgid: Pid) -> bool {
    if matches!(kill(Pid::from_raw(-pgid.as_raw()), None), Err(Errno::ESRCH)) {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|entry| {
        let stat = entry.path().join("stat");
        std::fs::read_to_string(stat).is_ok_and(|stat| runs_in_group(&stat, pgid.as_raw()))
    })
}

/// From a `/proc/PID/stat` line: whether the process is in group `pgid` and not a zombie.
fn runs_in_group(stat: &str, pgid: i32) -> bool {
    // `PID (COMM) STATE PPID PGRP ...`; COMM may contain anything, so split at the last ')'.
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next();
    let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
    group == Some(pgid) && !matches!(state, Some("Z" | "X"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zombies_and_other_groups_do_not_count() {
        assert!(runs_in_group("42 (sh) S 1 42 42 0 -1", 42));
        assert!(runs_in_group("43 (a) b) (c) R 42 42 42 0 -1", 42));
        assert!(!runs_in_group("44 (sleep) Z 1 42 42 0 -1", 42));
        assert!(!runs_in_group("45 (sh) S 1 7 7 0 -1", 42));
        assert!(!runs_in_group("garbage", 42));
    }
}
