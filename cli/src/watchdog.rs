//! The watchdog: stops the job when `run` cannot (killed, stopped, hung), before the lease can
//! pass to anyone else.
//!
//! `run` starts `flocklease __watchdog` (its own binary, through `/proc/self/exe`, so an
//! upgrade that replaces the file does not matter) in a process group of its own, so that
//! signals sent to `run`'s group (`timeout`, a shell's job control) do not reach it. Its stdin
//! is one end of a `SOCK_SEQPACKET` socket pair; `run` holds every copy of the other end. Over
//! it the watchdog hears, one message each:
//!
//! - `live PATH` with a descriptor (`SCM_RIGHTS`): the generation's liveness file, locked, sent
//!   by the lease manager itself before it places the file at PATH — at the grant, and at every
//!   renew that restored a deleted file (`FlockLeaseBuilder::share_liveness`). The watchdog
//!   keeps the latest: the lease stays live while it runs, whatever `run` or the job does;
//! - `until NANOS`: the lease's expiry as `run` last confirmed it, on the boot-time clock
//!   (monotonic, counts a suspend, not moved by wall-clock steps), at the start and after
//!   every successful renew, from the renewer thread itself;
//! - the job's process group id, written by the job's own process before its command runs;
//! - `done`: the job is over; the watchdog exits (and gives up its liveness descriptor).
//!
//! End of file without `done` means `run` died. What to do is
//! [`flocklease::supervise::next`]'s answer, the rule the model checker runs: SIGKILL at the
//! hard deadline (the confirmed expiry less the margin) on every path; when `run` died, SIGKILL
//! at once unless the file at the generation's name is the one the watchdog keeps, else
//! SIGTERM and SIGKILL after the grace period or at the deadline, whichever comes first. When
//! the watchdog kills the job while `run` lives, it tells `run` (`killed`), which then exits 78.
//!
//! Why not only a parent-death signal (`PR_SET_PDEATHSIG`) on the command: it reaches the
//! command alone, not the processes it started; it fires when the *thread* that forked exits;
//! and it is cleared by executing a set-user-id program. The socket has none of these limits.

use std::fs::File;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use flocklease::supervise::{self, Act, Watch, WatchdogDo, Why};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, socketpair,
};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::unistd::Pid;

use crate::duration;
use crate::say::say;

/// How often the watchdog looks again while `run` is dead and the job is being stopped (the
/// job's processes are not its children, so nothing wakes it; each look reads `/proc` and
/// checks the liveness file).
const POLL: Duration = Duration::from_millis(20);

/// The arguments of the hidden `__watchdog` command.
#[derive(Args)]
pub struct WatchdogArgs {
    /// Time between SIGTERM and SIGKILL when `run` died.
    #[arg(long, value_parser = duration::parse)]
    grace: Duration,
    /// How long before the confirmed expiry the job is killed if no later one is confirmed.
    #[arg(long, value_parser = duration::parse, default_value = "0s")]
    margin: Duration,
}

/// Now on the boot-time clock, in nanoseconds: monotonic, counts a suspend, and wall-clock
/// steps do not move it.
pub fn boot_nanos() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// `run`'s end of the socket to its watchdog, before and after the watchdog is started.
pub struct Channel {
    /// `run`'s end (close-on-exec: neither the job nor the watchdog inherits it).
    ours: OwnedFd,
    /// The watchdog's end, until the watchdog is started with it.
    theirs: Option<OwnedFd>,
}

impl Channel {
    /// A connected socket pair: messages keep their bounds, descriptors travel with them.
    pub fn new() -> Result<Channel, String> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| format!("cannot create the watchdog's socket: {e}"))?;
        Ok(Channel {
            ours,
            theirs: Some(theirs),
        })
    }

    /// A copy of `run`'s end, for the lease manager to send liveness files over
    /// (`FlockLeaseBuilder::share_liveness`).
    pub fn sharer(&self) -> Option<OwnedFd> {
        self.ours.try_clone().ok()
    }

    /// Starts the watchdog process: `grace` as in [`WatchdogArgs`], and the job killed
    /// `margin` before the confirmed expiry unless a renew moved it (see [`Deadlines`]).
    #[allow(unsafe_code)]
    pub fn spawn(mut self, grace: Duration, margin: Duration) -> Result<Watchdog, String> {
        let theirs = self
            .theirs
            .take()
            .ok_or("the watchdog was started already")?;
        let secs = |d: Duration| format!("{}.{:09}s", d.as_secs(), d.subsec_nanos());
        let mut command = Command::new("/proc/self/exe");
        // The watchdog is deaf to a unit's SIGTERM (and the rest, see `ignore_signals`) from
        // its first instruction: ignored dispositions survive exec. Set only in its `main`,
        // they left the runtime's start and the parsing of its arguments open to a stop of
        // the unit, which killed it and made `run` exit 79 (found by the process lockstep).
        // SAFETY: between fork and exec only sigaction, which is async-signal-safe; no
        // allocation.
        unsafe {
            command.pre_exec(|| {
                ignore_signals();
                Ok(())
            });
        }
        command
            .arg0("flocklease")
            .arg("__watchdog")
            .arg("--grace")
            .arg(secs(grace))
            .arg("--margin")
            .arg(secs(margin))
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog: {e}"))?;
        Ok(Watchdog {
            pipe: File::from(self.ours),
            said_done: Default::default(),
        })
    }
}

/// `run`'s end of the socket to its running watchdog.
pub struct Watchdog {
    pipe: File,
    /// `done` was sent.
    said_done: std::sync::atomic::AtomicBool,
}

/// What `run` hears from its watchdog.
pub enum Heard {
    /// The watchdog killed the job at its deadline (`run` did not confirm a renew in time).
    Killed,
    /// The watchdog is gone (killed): nothing stops the job if `run` dies now.
    Gone,
    /// The watchdog read the deadline `until NANOS` (and every one before it).
    Deadline(u64),
}

impl Watchdog {
    /// The socket's descriptor, for the job's pre-exec step to tell its own group (see
    /// `job::Job::spawn`): the watchdog knows it before the command runs.
    pub fn raw_fd(&self) -> RawFd {
        self.pipe.as_raw_fd()
    }

    /// Tells the watchdog which process group to stop (it knows already from the job's own
    /// pre-exec step; never blocks).
    pub fn arm(&mut self, pgid: Pid) {
        let _ = send_now(self.pipe.as_fd(), format!("{pgid}\n").as_bytes());
    }

    /// A second writer, for the expiries (see [`Deadlines::attach`]).
    pub fn writer(&self) -> Option<File> {
        self.pipe.try_clone().ok()
    }

    /// Calls `heard` with what the watchdog says, on a thread of its own, until it is gone.
    pub fn listen(&self, heard: impl Fn(Heard) + Send + 'static) {
        let Ok(socket) = self.pipe.try_clone() else {
            return;
        };
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match nix::unistd::read(&socket, &mut buf) {
                    Ok(0) => return heard(Heard::Gone),
                    Ok(n) if &buf[..n] == b"killed" => heard(Heard::Killed),
                    Ok(n) if buf[..n].starts_with(b"heard ") => {
                        if let Some(at) = std::str::from_utf8(&buf[6..n])
                            .ok()
                            .and_then(|s| s.parse().ok())
                        {
                            heard(Heard::Deadline(at));
                        }
                    }
                    Ok(_) | Err(Errno::EINTR) => {}
                    // A watchdog that dies with messages it has not read yet (a deadline, a
                    // liveness file) resets the connection: that too is its end.
                    Err(_) => return heard(Heard::Gone),
                }
            }
        });
    }

    /// Tells the watchdog that the job is over: it exits without doing anything (once; later
    /// calls do nothing). Whatever it said before reading this (`killed`) reaches the listener
    /// before the end of file that its exit makes.
    pub fn done(&self) {
        if !self
            .said_done
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            // A watchdog that does not read gets no `done`: `run`'s exit ends its socket,
            // which it reads as `run`'s end, with the job already over.
            let _ = send_now(self.pipe.as_fd(), b"done");
        }
    }
}

/// The lease's expiry as `run` last confirmed it, told to the watchdog: a message
/// `until BOOT_NANOS` after each successful renew, written by the renewer thread itself. If
/// `run` stops renewing — stopped, hung, descheduled — the watchdog, in a process of its own,
/// kills the job before that instant.
///
/// A write never blocks and is made with no lock held (only the latest deadline matters, and
/// the watchdog reads every message waiting when it wakes). The watchdog answers each batch of
/// deadlines it read with `heard NANOS`; a deadline it has not read for longer than the TTL,
/// or a socket too full to take one, means it does not listen ([`Deadlines::deaf`]): it could
/// not stop the job if `run` died, so `run` stops the job itself (PROTOCOL §7.1).
#[derive(Clone, Default)]
pub struct Deadlines(Arc<DeadlineState>);

#[derive(Default)]
struct DeadlineState {
    /// The socket to the watchdog, once attached; cloned out of the lock before each write.
    pipe: Mutex<Option<Arc<File>>>,
    /// The latest confirmed deadline, and the earliest deadline sent that the watchdog has not
    /// said it read (the latest value sent, the instant the first unread one was sent).
    told: Mutex<Told>,
    /// A write found the socket full.
    full: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Told {
    latest: Option<u64>,
    unheard: Option<(u64, u64)>,
}

impl Deadlines {
    /// Records a new deadline (and tells the watchdog, once attached).
    pub fn note(&self, boot_nanos: u64) {
        self.told().latest = Some(boot_nanos);
        self.send(boot_nanos);
    }

    /// Starts telling the watchdog through `pipe`, with the latest deadline at once.
    pub fn attach(&self, pipe: File) {
        *self.0.pipe.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(pipe));
        if let Some(at) = self.latest() {
            self.send(at);
        }
    }

    /// The latest confirmed expiry, on the boot-time clock.
    pub fn latest(&self) -> Option<u64> {
        self.told().latest
    }

    /// Stops telling the watchdog (before it is told `done`).
    pub fn detach(&self) {
        *self.0.pipe.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The watchdog said it read every deadline up to `at`.
    pub fn heard(&self, at: u64) {
        let mut told = self.told();
        if told.unheard.is_some_and(|(sent, _)| at >= sent) {
            told.unheard = None;
        }
    }

    /// Whether the watchdog does not listen at `now`: its socket was full, or a deadline sent
    /// longer than `ttl` ago is still unread.
    pub fn deaf(&self, now: u64, ttl: u64) -> bool {
        self.0.full.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .told()
                .unheard
                .is_some_and(|(_, since)| now.saturating_sub(since) > ttl)
    }

    /// When [`Deadlines::deaf`] turns true without news, if a deadline is unread.
    pub fn deaf_at(&self, ttl: u64) -> Option<u64> {
        self.told()
            .unheard
            .map(|(_, since)| since.saturating_add(ttl).saturating_add(1))
    }

    fn told(&self) -> std::sync::MutexGuard<'_, Told> {
        self.0.told.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn send(&self, at: u64) {
        let pipe = self
            .0
            .pipe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(pipe) = pipe else { return };
        let sent_at = boot_nanos();
        match send_now(pipe.as_fd(), format!("until {at}").as_bytes()) {
            Ok(()) => {
                let mut told = self.told();
                let since = told.unheard.map_or(sent_at, |(_, since)| since);
                told.unheard = Some((at, since));
            }
            Err(Errno::EAGAIN) => self.0.full.store(true, std::sync::atomic::Ordering::SeqCst),
            // The watchdog is gone: its listener says so.
            Err(_) => {}
        }
    }
}

/// Sends one message on the watchdog's socket without blocking (whatever the descriptor's
/// mode) and without `SIGPIPE`.
fn send_now(socket: std::os::fd::BorrowedFd<'_>, message: &[u8]) -> Result<(), Errno> {
    nix::sys::socket::send(
        socket.as_raw_fd(),
        message,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
    )
    .map(|_| ())
}

/// What the watchdog has heard and done.
struct State {
    run_alive: bool,
    pgid: Option<Pid>,
    deadline: Option<u64>,
    live: Option<(OwnedFd, PathBuf)>,
    term_at: Option<u64>,
    done: bool,
}

/// The hidden `__watchdog` command.
pub fn main(args: &WatchdogArgs) -> u8 {
    // Ignored before they are unblocked (already since exec, see `Channel::spawn`): a signal
    // mask is inherited across exec, and `run` blocks the signals it waits for.
    ignore_signals();
    let _ = SigSet::empty().thread_set_mask();
    let margin = u64::try_from(args.margin.as_nanos()).unwrap_or(u64::MAX);
    let grace = u64::try_from(args.grace.as_nanos()).unwrap_or(u64::MAX);
    // Stdin is the socket `run` gave us.
    let socket = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(s) => s,
        Err(_) => return 0,
    };
    let timer = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC).ok();
    let mut st = State {
        run_alive: true,
        pgid: None,
        deadline: None,
        live: None,
        term_at: None,
        done: false,
    };
    // The last act told of (each is said once).
    let mut told: Option<Act> = None;
    loop {
        let now = boot_nanos();
        let watch = Watch {
            run_alive: st.run_alive,
            job_alive: st.pgid.is_some_and(group_alive),
            now,
            deadline: st.deadline.map(|d| d.saturating_sub(margin)),
            liveness_kept: st.live.as_ref().is_some_and(|(fd, path)| kept(fd, path)),
            term_at: st.term_at,
            grace,
        };
        let mut wait = None;
        match supervise::next(&watch) {
            Act::Exit => return 0,
            // `next` answers Term and Kill only for a job it knows to be alive.
            Act::Term | Act::Kill(_) if st.pgid.is_none() => {}
            act @ (Act::Term | Act::Kill(_)) => {
                let group = st.pgid.unwrap_or_else(|| unreachable!());
                // Signals, then words (crate::say: never blocks, never fails).
                let first = told != Some(act);
                told = Some(act);
                for step in supervise::performed(act) {
                    match step {
                        WatchdogDo::Term => {
                            let _ = killpg(group, Signal::SIGTERM);
                        }
                        WatchdogDo::Cont => {
                            let _ = killpg(group, Signal::SIGCONT);
                        }
                        WatchdogDo::Kill => {
                            let _ = killpg(group, Signal::SIGKILL);
                        }
                        WatchdogDo::TellRun if first && st.run_alive => {
                            let _ = send_now(socket.as_fd(), b"killed");
                        }
                        WatchdogDo::Say if first => say_why(act, group),
                        WatchdogDo::TellRun | WatchdogDo::Say => {}
                    }
                }
                if act == Act::Term {
                    st.term_at = Some(now);
                    continue;
                }
                // The kill is delivered; look again shortly (the group empties soon after).
                wait = Some(POLL);
            }
            Act::Wait { until } => {
                if let (Some(at), Some(timer)) = (until, timer.as_ref()) {
                    let at = TimeSpec::from_duration(Duration::from_nanos(at));
                    let _ = timer.set(
                        Expiration::OneShot(at),
                        TimerSetTimeFlags::TFD_TIMER_ABSTIME,
                    );
                }
                if !st.run_alive {
                    // The job is being stopped: its group and the liveness file are looked
                    // at again shortly.
                    wait = Some(POLL);
                } else if until.is_some() && timer.is_none() {
                    wait = Some(Duration::from_millis(10));
                }
            }
        }
        if !st.run_alive {
            // Nothing more can be heard.
            std::thread::sleep(wait.unwrap_or(POLL));
            continue;
        }
        let timeout = wait.map_or(PollTimeout::NONE, |w| {
            PollTimeout::try_from(w).unwrap_or(PollTimeout::MAX)
        });
        let mut fds = vec![PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        if let Some(timer) = timer.as_ref() {
            fds.push(PollFd::new(timer.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => st.run_alive = false,
        }
        if let Some(timer) = timer.as_ref() {
            let _ = timer.unset();
        }
        let read = hear(&socket, &mut st);
        if st.done {
            return 0;
        }
        if let Some(at) = read {
            // `run` learns that its deadlines are read (a watchdog that does not read them
            // cannot stop the job: `run` then does, see `Deadlines::deaf`).
            let _ = send_now(socket.as_fd(), format!("heard {at}").as_bytes());
        }
    }
}

/// Says why the watchdog did `act` to the job's `group` (after it did it).
fn say_why(act: Act, group: Pid) {
    let why = match act {
        Act::Term => {
            return say!("flocklease: run died; stopping its job (process group {group})");
        }
        Act::Kill(Why::Deadline) => {
            "no renew of the lease confirmed before its expiry (run stopped, hung or dead)"
        }
        Act::Kill(Why::LivenessGone) => {
            "run died and the lease's liveness is not kept (its file was deleted or replaced, \
             or it was run's connection)"
        }
        Act::Kill(Why::GraceOver) => "run died and the grace period is over",
        Act::Wait { .. } | Act::Exit => return,
    };
    say!("flocklease: {why}; killed the job (process group {group})");
}

/// Reads every message waiting on `socket` (without blocking) into `st`; returns the last
/// deadline read, if any.
fn hear(socket: &OwnedFd, st: &mut State) -> Option<u64> {
    let mut read = None;
    loop {
        let mut buf = vec![0u8; 8192];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let (len, fds) = match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                if let Ok(cmsgs) = msg.cmsgs() {
                    for cmsg in cmsgs {
                        if let ControlMessageOwned::ScmRights(raw) = cmsg {
                            fds.extend(raw.into_iter().map(owned));
                        }
                    }
                }
                (msg.bytes, fds)
            }
            Err(Errno::EAGAIN) => return read,
            Err(Errno::EINTR) => continue,
            Err(_) => {
                st.run_alive = false;
                return read;
            }
        };
        if len == 0 && fds.is_empty() {
            // End of file: every copy of `run`'s end is closed.
            st.run_alive = false;
            return read;
        }
        let text = &buf[..len];
        if let Some(path) = text.strip_prefix(b"live ") {
            if let Some(fd) = fds.into_iter().next() {
                st.live = Some((fd, PathBuf::from(std::ffi::OsStr::from_bytes(path))));
            }
        } else if let Some(at) = text.strip_prefix(b"until ") {
            if let Some(at) = std::str::from_utf8(at).ok().and_then(|s| s.parse().ok()) {
                st.deadline = Some(at);
                read = Some(at);
            }
        } else if text == b"done" {
            st.done = true;
            return read;
        } else if let Some(pid) = std::str::from_utf8(text)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|&p| p > 1)
        {
            st.pgid = Some(Pid::from_raw(pid));
        }
    }
}

/// Makes the watchdog deaf to every signal but SIGKILL and SIGSTOP: a terminal's job control
/// (`SIGTTOU` on a write to a `tostop` terminal, `SIGTTIN`), a hang-up, and a stop that reaches
/// every process of a unit at once (systemd's `KillMode=control-group` sends SIGTERM to all)
/// must not end or stop it while it may still have to stop the job. It ends when `run`'s end
/// of the socket does and the job is over (PROTOCOL §7.1).
#[allow(unsafe_code)]
fn ignore_signals() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    for sig in crate::signals::FORWARDED.into_iter().chain([
        Signal::SIGTTOU,
        Signal::SIGTTIN,
        Signal::SIGPIPE,
    ]) {
        // SAFETY: SIG_IGN installs no handler; no code runs on delivery.
        let _ = unsafe { sigaction(sig, &ignore) };
    }
}

/// Takes ownership of a descriptor the kernel installed in this process (`SCM_RIGHTS`).
#[allow(unsafe_code)]
fn owned(raw: RawFd) -> OwnedFd {
    // SAFETY: `raw` was just received with SCM_RIGHTS: a new descriptor of this process that
    // nothing else refers to.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// Whether the file at `path` is the one `fd` refers to (same device and inode): the lease's
/// liveness then stays with this process's descriptor.
fn kept(fd: &OwnedFd, path: &std::path::Path) -> bool {
    let Ok(held) = fd.try_clone().map(File::from).and_then(|f| f.metadata()) else {
        return false;
    };
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino()))
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

    #[test]
    fn the_liveness_file_is_kept_only_while_it_is_the_one_at_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.1.live");
        std::fs::write(&path, b"x").unwrap();
        let fd: OwnedFd = File::open(&path).unwrap().into();
        assert!(kept(&fd, &path));
        std::fs::remove_file(&path).unwrap();
        assert!(!kept(&fd, &path));
        std::fs::write(&path, b"x").unwrap();
        assert!(
            !kept(&fd, &path),
            "a new file at the name is not the one held"
        );
    }
}
