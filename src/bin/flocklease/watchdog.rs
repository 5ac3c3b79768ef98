//! The watchdog: stops the job when `run` itself dies (`kill -9`, the OOM killer).
//!
//! `run` starts `flocklease __watchdog` (its own binary, through `/proc/self/exe`, so an
//! upgrade that replaces the file does not matter) in a process group of its own, so that
//! signals sent to `run`'s group (`timeout`, a shell's job control) do not reach it. Its stdin
//! is a pipe whose only writer is `run`: `run` writes the job's process group id once the job
//! exists, and `done` once the job is over. End of file without `done` means `run` died: the
//! watchdog sends SIGTERM to the job's group and SIGKILL after the grace period, exactly as
//! `run` does when the lease is lost.
//!
//! Why not only a parent-death signal (`PR_SET_PDEATHSIG`) on the command: it reaches the
//! command alone, not the processes it started; it fires when the *thread* that forked exits;
//! and it is cleared by executing a set-user-id program. The pipe has none of these limits.
//! If the watchdog is killed too, the inherited liveness descriptor still keeps the lease live
//! while the job runs, until the expiry.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use nix::errno::Errno;
use nix::fcntl::OFlag;
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
}

/// `run`'s end of the pipe to its watchdog.
pub struct Watchdog {
    pipe: File,
}

impl Watchdog {
    /// Starts the watchdog process.
    pub fn spawn(grace: Duration) -> Result<Watchdog, String> {
        let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
            .map_err(|e| format!("cannot create the watchdog's pipe: {e}"))?;
        Command::new("/proc/self/exe")
            .arg0("flocklease")
            .arg("__watchdog")
            .arg("--grace")
            .arg(format!("{}.{:09}s", grace.as_secs(), grace.subsec_nanos()))
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog: {e}"))?;
        Ok(Watchdog {
            pipe: File::from(write),
        })
    }

    /// Tells the watchdog which process group to stop if `run` dies.
    pub fn arm(&mut self, pgid: Pid) {
        let _ = writeln!(self.pipe, "{pgid}");
    }

    /// Tells the watchdog that the job is over: it exits without doing anything.
    pub fn done(mut self) {
        let _ = writeln!(self.pipe, "done");
    }
}

/// The hidden `__watchdog` command.
pub fn main(args: &WatchdogArgs) -> u8 {
    // A signal mask is inherited across exec: `run` blocks the signals it waits for.
    let _ = SigSet::empty().thread_set_mask();
    let mut pgid = None;
    for line in BufReader::new(std::io::stdin().lock()).lines() {
        let Ok(line) = line else { break };
        if line == "done" {
            return 0;
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
