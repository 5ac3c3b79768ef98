//! Helpers shared by the integration tests: lease worlds and child processes in a role.
//!
//! A child is this same test binary re-run with `FLOCKLEASE_ROLE` set, filtered to the
//! `child_entry` test, which dispatches to the role. Children talk to the parent with lines
//! starting `@@ ` on stdout (libtest prints its own lines there too) and wait on stdin, so the
//! parent synchronises on what a child says, never on sleeps.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use flocklease::{Durability, FlockLease, ManualClock, Owner, SessionId};

/// The environment variable naming a child's role.
pub const ROLE: &str = "FLOCKLEASE_ROLE";

/// A child process running one role.
pub struct RoleChild {
    pub child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl RoleChild {
    /// Starts this test binary as a child in `role`, with `args` in `FLOCKLEASE_ARGS`.
    pub fn spawn(entry: &str, role: &str, args: &[&str]) -> RoleChild {
        let exe = std::env::current_exe().expect("current exe");
        RoleChild::try_spawn(&exe, entry, role, args, |_| {}).expect("spawn child")
    }

    /// Like [`RoleChild::spawn`], as user `uid` and group `gid` (the caller must be root).
    ///
    /// The child runs a copy of this test binary in a directory every user can enter: the
    /// checkout may lie under a private directory (`mktemp -d` is 0700) that the other user
    /// cannot traverse. The copy is removed as soon as the child has started (`spawn` returns
    /// after the exec), so no test binary is left behind in the temporary directory.
    pub fn spawn_as(entry: &str, role: &str, args: &[&str], uid: u32, gid: u32) -> RoleChild {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::Builder::new()
            .prefix("flocklease-test-exe-")
            .tempdir()
            .expect("create the copy's directory");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.path().join("test-binary");
        let exe = std::env::current_exe().expect("current exe");
        // A hard link where it can be (no written copy, so no descriptor open for writing that
        // a concurrent fork could hold: exec would fail with ETXTBSY); a copy across file
        // systems, whose exec is retried while another test's fork still holds it.
        let linked = std::fs::hard_link(&exe, &copy).is_ok();
        if !linked {
            std::fs::copy(&exe, &copy).expect("copy the test binary");
            std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut tries = 0;
        let child = loop {
            match RoleChild::try_spawn(&copy, entry, role, args, |c| {
                // Its working directory too: the checkout may be closed to the other user.
                c.uid(uid).gid(gid).current_dir("/");
            }) {
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                other => break other.expect("spawn child"),
            }
        };
        dir.close().expect("remove the copy of the test binary");
        child
    }

    /// Like [`RoleChild::spawn`], started through `wrapper` (a program and its arguments that
    /// exec the rest of the command line in place, e.g. `unshare --net --`).
    pub fn spawn_wrapped(wrapper: &[&str], entry: &str, role: &str, args: &[&str]) -> RoleChild {
        let exe = std::env::current_exe().expect("current exe");
        RoleChild::try_spawn(Path::new(wrapper[0]), entry, role, args, |c| {
            c.args(&wrapper[1..]).arg(exe);
        })
        .expect("spawn child")
    }

    fn try_spawn(
        exe: &Path,
        entry: &str,
        role: &str,
        args: &[&str],
        f: impl FnOnce(&mut Command),
    ) -> std::io::Result<RoleChild> {
        let mut cmd = Command::new(exe);
        f(&mut cmd);
        let mut child = cmd
            .args([entry, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("FLOCKLEASE_ARGS", args.join("\u{1f}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("child stdout"));
        Ok(RoleChild {
            child,
            stdin,
            stdout,
        })
    }

    /// The next protocol line from the child (without the `@@ ` prefix).
    pub fn line(&mut self) -> String {
        loop {
            let mut s = String::new();
            let n = self.stdout.read_line(&mut s).expect("read child stdout");
            assert!(n > 0, "child closed stdout before saying anything more");
            // libtest may have printed "test child_entry ... " on the same line.
            if let Some(at) = s.find("@@ ") {
                return s[at + 3..].trim_end().to_owned();
            }
        }
    }

    /// Sends one line to the child.
    pub fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("child stdin open");
        writeln!(stdin, "{line}").expect("write child stdin");
        stdin.flush().expect("flush child stdin");
    }

    /// The child's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("kill child");
        self.child.wait().expect("reap child");
    }

    /// Closes the child's stdin and waits for it to exit successfully.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait child");
        assert!(status.success(), "child failed: {status}");
    }
}

impl Drop for RoleChild {
    fn drop(&mut self) {
        // Never leave a child behind when a test fails.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a child: the role and its arguments, if this process is one.
pub fn role() -> Option<(String, Vec<String>)> {
    let role = std::env::var(ROLE).ok()?;
    let args = std::env::var("FLOCKLEASE_ARGS").unwrap_or_default();
    let args = if args.is_empty() {
        vec![]
    } else {
        args.split('\u{1f}').map(str::to_owned).collect()
    };
    Some((role, args))
}

/// In a child: says a protocol line to the parent.
pub fn tell(line: &str) {
    println!("@@ {line}");
    std::io::stdout().flush().expect("flush stdout");
}

/// In a child: reads one line from the parent (None at end of input).
pub fn hear() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s.trim_end().to_owned()),
    }
}

/// A lease manager over `dir` with the system clock and the given TTL (no fsync: speed).
pub fn open_real(dir: &Path, ttl: Duration) -> FlockLease {
    FlockLease::builder(dir)
        .ttl(ttl)
        .durability(Durability::NoSync)
        .open()
        .expect("open lease dir")
}

/// A lease manager over `dir` with a manual clock.
pub fn open_manual(dir: &Path, clock: &ManualClock) -> FlockLease {
    FlockLease::builder(dir)
        .clock(Arc::new(clock.clone()))
        .ttl(Duration::from_secs(30))
        .open()
        .expect("open lease dir")
}

pub fn id(s: &str) -> SessionId {
    SessionId::new(s).expect("valid id")
}

pub fn owner(s: &str) -> Owner {
    Owner::new(s).expect("valid owner")
}

/// Names in `dir` ending with `suffix`.
pub fn files_ending(dir: &Path, suffix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(suffix))
        .collect();
    v.sort();
    v
}

/// A wall clock shared between processes through a file holding unix nanoseconds: the parent
/// moves time for every child at once, so "past the TTL" needs no sleeping.
#[derive(Debug, Clone)]
pub struct FileClock {
    path: std::path::PathBuf,
}

impl FileClock {
    /// A clock kept in `path`, starting at `start`.
    pub fn create(path: &Path, start: flocklease::Timestamp) -> FileClock {
        let c = FileClock {
            path: path.to_owned(),
        };
        c.set(start);
        c
    }

    /// Opens an existing clock file.
    pub fn open(path: &Path) -> FileClock {
        FileClock {
            path: path.to_owned(),
        }
    }

    /// Sets the time for every process (atomically: temp file + rename).
    pub fn set(&self, t: flocklease::Timestamp) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, t.unix_nanos().to_string()).expect("write clock");
        std::fs::rename(&tmp, &self.path).expect("rename clock");
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        use flocklease::Clock;
        self.set(self.now().checked_add(d).expect("in range"));
    }
}

impl flocklease::Clock for FileClock {
    fn now(&self) -> flocklease::Timestamp {
        let text = std::fs::read_to_string(&self.path).expect("read clock");
        let nanos: i128 = text.trim().parse().expect("clock holds nanoseconds");
        flocklease::Timestamp::from_unix_nanos(nanos).expect("clock in range")
    }
}

/// A lease manager over `dir` whose clock is the file `clock`.
pub fn open_with_file_clock(dir: &Path, clock: &Path, ttl: Duration) -> FlockLease {
    FlockLease::builder(dir)
        .clock(Arc::new(FileClock::open(clock)))
        .ttl(ttl)
        .durability(Durability::NoSync)
        .open()
        .expect("open lease dir")
}

/// Waits until process `pid` has stopped (SIGSTOP delivered), without sleeping.
pub fn wait_stopped(pid: nix::unistd::Pid) {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    match waitpid(pid, Some(WaitPidFlag::WUNTRACED)).expect("waitpid") {
        WaitStatus::Stopped(..) => {}
        other => panic!("expected the child to stop, got {other:?}"),
    }
}
