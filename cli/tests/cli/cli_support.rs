//! Helpers for the tests that drive the `flocklease` binary as a real process.
//!
//! Synchronisation is on files written by the jobs, process states in `/proc` and exit
//! statuses, each polled with a bound ([`GUARD`]); never on sleeps.

#![allow(dead_code, clippy::unwrap_used)]

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use flocklease::{Record, SessionId, record};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_flocklease");

/// The binary [`Scene::run`] starts: [`BIN`], or `FLOCKLEASE_TEST_BIN` (another build, e.g. an
/// older one, to see a test catch what it is there to catch).
pub fn bin() -> String {
    std::env::var("FLOCKLEASE_TEST_BIN").unwrap_or_else(|_| BIN.to_owned())
}
/// A guard against hangs only: no test waits this long when the code is right.
pub const GUARD: Duration = Duration::from_secs(30);

/// A temporary directory with a lease directory `leases` inside it (not created: `run`
/// creates it). Processes it started or learnt of are killed when it is dropped, so a failing
/// test leaves nothing running.
pub struct Scene {
    pub tmp: tempfile::TempDir,
    pub leases: PathBuf,
    /// (pid, start time) of processes to kill, with their process groups, on drop.
    tracked: RefCell<Vec<(i32, String)>>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        // Newest first: jobs before the runs that started them.
        for (pid, started) in self.tracked.borrow().iter().rev() {
            // Only the very process we saw: a recycled pid has another start time.
            if start_time(*pid).as_ref() == Some(started) {
                let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
        }
    }
}

impl Scene {
    pub fn new() -> Scene {
        let tmp = tempfile::tempdir().unwrap();
        let leases = tmp.path().join("leases");
        Scene {
            tmp,
            leases,
            tracked: RefCell::new(vec![]),
        }
    }

    /// Kills `pid` (and the group it leads, if any) when the scene is dropped, if it still runs.
    pub fn track(&self, pid: i32) {
        if let Some(started) = start_time(pid) {
            self.tracked.borrow_mut().push((pid, started));
        }
    }

    /// Spawns [`Scene::run`] and tracks the process.
    pub fn start(&self, id: &str, extra: &[&str], cmd: &[&str]) -> Child {
        let child = self.run(id, extra, cmd).spawn().unwrap();
        self.track(child.id() as i32);
        child
    }

    /// A path in the scene's directory (outside the lease directory).
    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// `flocklease run --dir LEASES --id ID EXTRA... -- CMD...`, output piped, with the
    /// default action for every signal `run` forwards (a test run started under `nohup`, or as
    /// a background job of a shell without job control, inherits SIGHUP, SIGINT and SIGQUIT
    /// ignored, which `run` and the job's shell would keep: its traps could never fire).
    #[allow(unsafe_code)]
    pub fn run(&self, id: &str, extra: &[&str], cmd: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(bin());
        // SAFETY: between fork and exec only `sigaction`, which is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                use nix::sys::signal::{SigHandler, signal};
                for sig in [
                    Signal::SIGHUP,
                    Signal::SIGINT,
                    Signal::SIGQUIT,
                    Signal::SIGTERM,
                    Signal::SIGUSR1,
                    Signal::SIGUSR2,
                    Signal::SIGWINCH,
                ] {
                    signal(sig, SigHandler::SigDfl)?;
                }
                Ok(())
            });
        }
        c.arg("run")
            .arg("--dir")
            .arg(&self.leases)
            .args(["--id", id])
            .args(extra)
            .arg("--")
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Writes an `sh` script and returns its path.
    pub fn script(&self, name: &str, body: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, body).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// Creates the file `name` (a go-ahead for a job).
    pub fn touch(&self, name: &str) {
        std::fs::write(self.path(name), "").unwrap();
    }

    /// Waits (bounded) until the job has written `name` (a line ending in a newline).
    pub fn wait_file(&self, name: &str) -> String {
        let path = self.path(name);
        wait_until(&format!("{} to be written", path.display()), || {
            std::fs::read_to_string(&path).is_ok_and(|s| s.ends_with('\n'))
        });
        std::fs::read_to_string(&path).unwrap()
    }

    /// The pid a job wrote to `name` (tracked).
    pub fn pid(&self, name: &str) -> i32 {
        let pid = self.wait_file(name).trim().parse().unwrap();
        self.track(pid);
        pid
    }

    /// A second `run` of `id`: `Some(token)` when granted, `None` when answered held (75).
    pub fn rival(&self, id: &str) -> Option<u64> {
        let out = self
            .run(id, &["-q"], &["sh", "-c", "echo $FLOCKLEASE_TOKEN"])
            .output()
            .unwrap();
        match out.status.code() {
            Some(0) => Some(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()),
            Some(75) => None,
            _ => panic!("rival run failed: {}", describe(&out)),
        }
    }

    /// The record of `id`.
    pub fn record(&self, id: &str) -> Record {
        record::decode(&std::fs::read(record_path(&self.leases, id)).unwrap()).unwrap()
    }
}

/// `<dir>/<stem>.lease.json`.
pub fn record_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{}.lease.json", SessionId::new(id).unwrap().stem()))
}

/// Polls `cond` every 5 ms until it holds; panics after [`GUARD`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < GUARD, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The start time of `pid` (field 22 of its stat), which tells it from a later process that
/// reuses its pid.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// Whether `pid` runs (a zombie counts as gone).
pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// Whether `pid` is stopped (state T).
pub fn pid_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") T "))
}

/// Waits (bounded) for `child` to exit; kills it and panics after [`GUARD`].
pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > GUARD {
            let _ = child.kill();
            panic!("process {} did not exit", child.id());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs the binary with `args` to its end (stdin closed, output captured), bounded by
/// [`GUARD`] (a hang fails the test).
pub fn flocklease<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    output_of(child)
}

/// Like [`wait_exit`], with the captured output.
pub fn output_of(mut child: Child) -> Output {
    wait_exit(&mut child);
    child.wait_with_output().unwrap()
}

/// Stops `run` (pid `runner`) at an instant when it is not inside a transition on `id`: a stop
/// inside one would leave the id's transition lock stuck and every rival would time out
/// instead of seeing the lease. After each stop the test checks the lock; if it is taken, the
/// runner resumes until the lock is free and is stopped again (bounded by [`GUARD`]).
pub fn stop_outside_transition(runner: i32, leases: &Path, id: &str) {
    let lock = leases.join(format!("{}.lock", SessionId::new(id).unwrap().stem()));
    let start = Instant::now();
    loop {
        signal(runner, Signal::SIGSTOP);
        wait_until("the runner to stop", || pid_stopped(runner));
        let file = std::fs::File::open(&lock).unwrap();
        match file.try_lock() {
            Ok(()) => return, // dropping the file unlocks it again
            Err(_) => {
                // Stopped inside a renew: let it finish that one.
                signal(runner, Signal::SIGCONT);
                wait_until("the transition to end", || file.try_lock().is_ok());
                drop(file);
            }
        }
        assert!(
            start.elapsed() < GUARD,
            "never stopped outside a transition"
        );
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap();
}

/// Status and both streams, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The children of `pid` (over all its threads).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = vec![];
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path().join("children");
        if let Ok(s) = std::fs::read_to_string(path) {
            out.extend(s.split_whitespace().map(|p| p.parse::<i32>().unwrap()));
        }
    }
    out
}

/// The command line of `pid`, arguments joined by spaces.
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// The pid of `run`'s watchdog (its child running `__watchdog`), once it runs.
pub fn watchdog_of(run: i32) -> i32 {
    let mut dog = None;
    wait_until("the watchdog to start", || {
        dog = children(run)
            .into_iter()
            .find(|&p| cmdline(p).contains("__watchdog"));
        dog.is_some()
    });
    dog.unwrap()
}

/// A pseudo-terminal with `stty tostop` set, as a shell's terminal: `cmd` runs as the leader
/// of a new session whose controlling terminal it is, in its foreground, with stdin, stdout
/// and stderr on it. What the terminal shows is read (and kept) by a thread, so that it never
/// fills. Returns the master side, which hangs the terminal up when dropped.
#[allow(unsafe_code)]
pub fn on_tostop_terminal(cmd: &mut Command) -> std::os::fd::OwnedFd {
    use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(None, None).unwrap();
    let mut attrs = tcgetattr(&pty.slave).unwrap();
    attrs.local_flags.insert(LocalFlags::TOSTOP);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &attrs).unwrap();
    let slave = std::fs::File::from(pty.slave);
    cmd.stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    // SAFETY: between fork and exec only setsid and ioctl, both async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let reader = std::fs::File::from(pty.master.try_clone().unwrap());
    std::thread::spawn(move || {
        use std::io::Read;
        let mut sink = [0u8; 4096];
        let mut reader = reader;
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    pty.master
}

/// Writes into the pipe `write` until it is full (a reader that never reads), leaving its mode
/// blocking.
pub fn fill_pipe(write: &std::os::fd::OwnedFd) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    use std::os::fd::AsFd;
    fcntl(write.as_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).unwrap();
    while nix::unistd::write(write, &[b'x'; 4096]).is_ok() {}
    while nix::unistd::write(write, b"x").is_ok() {}
    fcntl(write.as_fd(), FcntlArg::F_SETFL(OFlag::empty())).unwrap();
}

/// A job that ignores SIGTERM, writes its pid to `pid` and appends the time to `ticks` every
/// 10 ms, forever; with `close`, it first closes every inherited descriptor above 2 (as
/// `closefrom`, daemons and sandboxes do).
pub fn ticking_job(s: &Scene, close: bool) -> String {
    let closing = if close {
        "for fd in /proc/$$/fd/*; do n=${fd##*/}; [ \"$n\" -gt 2 ] && eval \"exec $n>&-\"; done 2>/dev/null; "
    } else {
        ""
    };
    format!(
        "trap '' TERM; {closing}echo $$ > {pid}; while :; do date +%s%N >> {ticks}; sleep 0.01; done",
        pid = s.path("pid").display(),
        ticks = s.path("ticks").display()
    )
}

/// A rival `run -w WAIT` of `id`, to its end; the wall-clock time its job started.
pub fn rival_start(s: &Scene, id: &str, wait: &str) -> u128 {
    let start = s.path("rival-start");
    let script = format!("date +%s%N > {}", start.display());
    let out = s
        .run(id, &["-q", "-w", wait], &["bash", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "rival: {}", describe(&out));
    std::fs::read_to_string(&start)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The first job's lines at or after `at`.
pub fn ticks_after(s: &Scene, at: u128) -> usize {
    std::fs::read_to_string(s.path("ticks"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<u128>().ok())
        .filter(|&t| t >= at)
        .count()
}
