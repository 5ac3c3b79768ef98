//! The job of `run`: the command in its own process group, and everything started in it.
//!
//! - The command leads a new process group; signals for the job go to the whole group.
//! - `run` is a child subreaper, so processes of the job orphaned by their parent become its
//!   children and are reaped by it (also where pid 1 does not reap, as in some containers):
//!   the group is empty only once every member has been reaped.
//! - The command inherits the lease generation's liveness descriptor (see
//!   [`FlockLease::liveness_fd`](flocklease::FlockLease::liveness_fd)), so while any process of
//!   the job keeps it, the lease stays live until its expiry even if `run` is killed.
//! - When `run` is the foreground of a terminal, the job's group gets the terminal (so it can
//!   read it and gets Ctrl-C directly) and `run` takes it back when the command exits or is
//!   stopped (Ctrl-Z), as a shell does.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgrp, getpid, setpgid, tcgetpgrp, tcsetpgrp};

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Exit {
    /// The conventional shell status: the code, or 128 + the signal number.
    pub fn status(self) -> u8 {
        match self {
            Exit::Code(c) => u8::try_from(c & 0xff).unwrap_or(1),
            Exit::Signal(s) => u8::try_from(128 + s).unwrap_or(255),
        }
    }
}

/// A running job: its process group, led by the command.
pub struct Job {
    leader: Pid,
    /// How the command ended, once it has.
    pub exit: Option<Exit>,
    terminal: Option<Terminal>,
}

/// Makes this process a child subreaper: orphaned descendants are re-parented to it.
pub fn become_subreaper() -> Result<(), String> {
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("cannot become a child subreaper: {e}"))
}

/// A terminal `run` is in the foreground of, reached through one of its standard streams.
#[derive(Clone, Copy)]
pub enum Terminal {
    /// Standard input.
    Stdin,
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl Terminal {
    /// The first standard stream that is a terminal whose foreground process group is ours.
    pub fn foreground() -> Option<Terminal> {
        let me = getpgrp();
        [Terminal::Stdin, Terminal::Stdout, Terminal::Stderr]
            .into_iter()
            .find(|t| t.foreground_group() == Ok(me))
    }

    fn raw(self) -> RawFd {
        match self {
            Terminal::Stdin => io::stdin().as_raw_fd(),
            Terminal::Stdout => io::stdout().as_raw_fd(),
            Terminal::Stderr => io::stderr().as_raw_fd(),
        }
    }

    fn foreground_group(self) -> nix::Result<Pid> {
        match self {
            Terminal::Stdin => tcgetpgrp(io::stdin().as_fd()),
            Terminal::Stdout => tcgetpgrp(io::stdout().as_fd()),
            Terminal::Stderr => tcgetpgrp(io::stderr().as_fd()),
        }
    }

    fn give_to(self, pgrp: Pid) {
        // SIGTTOU is blocked, so this works from a background group too.
        let _ = match self {
            Terminal::Stdin => tcsetpgrp(io::stdin().as_fd(), pgrp),
            Terminal::Stdout => tcsetpgrp(io::stdout().as_fd(), pgrp),
            Terminal::Stderr => tcsetpgrp(io::stderr().as_fd(), pgrp),
        };
    }
}

impl Job {
    /// Spawns `cmd` as the leader of a new process group, with `live` inherited (its
    /// close-on-exec flag cleared in the child only), the signal mask cleared, and `terminal`
    /// handed to the new group.
    ///
    /// # Errors
    ///
    /// The spawn's error: `NotFound` when the program does not exist, `PermissionDenied` (or
    /// another) when it cannot be executed.
    pub fn spawn(
        cmd: &mut Command,
        live: Option<&OwnedFd>,
        terminal: Option<Terminal>,
        arm: Option<RawFd>,
    ) -> io::Result<Job> {
        let live = live.map(AsRawFd::as_raw_fd);
        let tty = terminal.map(Terminal::raw);
        cmd.process_group(0);
        in_child_before_exec(cmd, live, tty, arm);
        let child = cmd.spawn()?;
        let leader = Pid::from_raw(i32::try_from(child.id()).map_err(io::Error::other)?);
        // `spawn` returns once the child has exec'd, so its pre-exec steps are done. The
        // `Child` handle is dropped without waiting: reaping is done here, by pid.
        drop(child);
        Ok(Job {
            leader,
            exit: None,
            terminal,
        })
    }

    /// The process group id (the command's pid).
    pub fn pgid(&self) -> Pid {
        self.leader
    }

    /// Sends `sig` to every process of the group; a group already gone is not an error.
    pub fn signal(&self, sig: Signal) {
        let _ = killpg(self.leader, sig);
    }

    /// Whether any process (a zombie not yet reaped included) is still in the group.
    pub fn group_alive(&self) -> bool {
        // The id cannot name another group while any member, zombies included, exists. Orphans
        // of the job are our children (subreaper) and stay zombies until `reap`, which runs
        // just before this check; once it answers ESRCH, `run` never signals the id again. (A
        // member reaped by a parent that left the group could free the id up to one poll
        // before we notice; reusing it needs the pid counter to wrap in that time.)
        !matches!(
            kill(Pid::from_raw(-self.leader.as_raw()), None),
            Err(Errno::ESRCH)
        )
    }

    /// Reaps every child that has exited (the command, orphans re-parented to us, the
    /// watchdog) and records the command's end. Returns `true` if the command was stopped
    /// (Ctrl-Z) while it held the terminal.
    pub fn reap(&mut self) -> bool {
        let mut stopped = false;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == self.leader => {
                    self.exit = Some(Exit::Code(code));
                    self.reclaim_terminal();
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == self.leader => {
                    self.exit = Some(Exit::Signal(sig as i32));
                    self.reclaim_terminal();
                }
                Ok(WaitStatus::Stopped(pid, _)) if pid == self.leader => {
                    stopped |= self.terminal.is_some();
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return stopped,
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => return stopped,
            }
        }
    }

    /// The command was stopped from the terminal: take the terminal back and stop `run` too,
    /// so the shell sees the job stopped. When continued (`fg`), give the terminal back if we
    /// have it again, and continue the group.
    pub fn suspend(&self) {
        let Some(tty) = self.terminal else { return };
        let me = getpgrp();
        tty.give_to(me);
        // SIGSTOP cannot be caught or blocked; `kill` returns once we are continued.
        let _ = kill(getpid(), Signal::SIGSTOP);
        if tty.foreground_group() == Ok(me) {
            tty.give_to(self.leader);
        }
        self.signal(Signal::SIGCONT);
    }

    /// Gives the terminal back to `run`'s group if the job's group has it.
    fn reclaim_terminal(&self) {
        if let Some(tty) = self.terminal
            && tty.foreground_group() == Ok(self.leader)
        {
            tty.give_to(getpgrp());
        }
    }
}

/// `pid` and a newline as ASCII digits, in a stack buffer: no allocation (see
/// [`in_child_before_exec`]).
fn pid_line(pid: i32) -> ([u8; 16], usize) {
    let mut digits = [0u8; 16];
    let mut n = pid.unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut out = [0u8; 16];
    let len = digits.len() - i;
    out[..len].copy_from_slice(&digits[i..]);
    out[len] = b'\n';
    (out, len + 1)
}

/// Prepares the child between `fork` and `exec`: its own process group, the watchdog told the
/// group, the terminal, the inherited liveness descriptor, an empty signal mask (the parent
/// blocks the signals it waits for, and a mask is inherited across `exec`).
#[allow(unsafe_code)]
fn in_child_before_exec(
    cmd: &mut Command,
    live: Option<RawFd>,
    tty: Option<RawFd>,
    arm: Option<RawFd>,
) {
    // SAFETY: the closure runs in the forked child of a multi-threaded process, where only
    // async-signal-safe functions may be called. It calls only setpgid, getpid, tcsetpgrp
    // (an ioctl), fcntl, write and pthread_sigmask through nix's thin wrappers, which neither
    // allocate nor take locks; errors are built from the raw errno without allocating, and the
    // pid line in a stack buffer. `live`, `tty` and `arm` are descriptors open in the parent,
    // hence in the child (`arm` is close-on-exec: the command never sees it).
    unsafe {
        cmd.pre_exec(move || {
            setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            if let Some(fd) = arm {
                // The watchdog learns the job's group before the command runs at all, so a
                // `run` killed right after the start still has its job stopped.
                let (buf, len) = pid_line(getpid().as_raw());
                let _ = nix::unistd::write(BorrowedFd::borrow_raw(fd), &buf[..len]);
            }
            if let Some(fd) = tty {
                // SIGTTOU is still blocked (inherited), so a background group may do this.
                let _ = tcsetpgrp(BorrowedFd::borrow_raw(fd), getpid());
            }
            if let Some(fd) = live {
                nix::fcntl::fcntl(
                    BorrowedFd::borrow_raw(fd),
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            }
            SigSet::empty().thread_set_mask()?;
            Ok(())
        });
    }
}
