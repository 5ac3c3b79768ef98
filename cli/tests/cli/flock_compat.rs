//! `flocklease run` side by side with util-linux `flock(1)` on the same argument lists, for
//! every row of the README's flock table: which runs happen and the exit codes (flock's
//! conflict code is 1, ours 75 unless `-E` says otherwise). Holders are held open on a pipe
//! and synchronised on their first output line, never on sleeps.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_flocklease");

/// The system's flock(1), or `None` (skip, loudly) without one.
fn flock_bin() -> Option<PathBuf> {
    let found = ["/usr/bin/flock", "/bin/flock"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        let _ = std::io::stderr()
            .write_all(b"\n*** the flock(1) comparison DID NOT RUN: no flock binary ***\n");
    }
    found
}

struct Side {
    flock: PathBuf,
    dir: tempfile::TempDir,
}

impl Side {
    fn new() -> Option<Side> {
        Some(Side {
            flock: flock_bin()?,
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn lock_file(&self) -> PathBuf {
        self.dir.path().join("job.lock")
    }

    fn lease_dir(&self) -> PathBuf {
        self.dir.path().join("leases")
    }

    /// `flock OPTS FILE CMD...` and `flocklease run --dir D --id job OPTS -- CMD...`.
    fn both(&self, opts: &[&str], cmd: &[&str]) -> (Output, Output) {
        (self.flock(opts, cmd), self.ours(opts, cmd))
    }

    fn flock(&self, opts: &[&str], cmd: &[&str]) -> Output {
        Command::new(&self.flock)
            .args(opts)
            .arg(self.lock_file())
            .args(cmd)
            .output()
            .unwrap()
    }

    fn ours(&self, opts: &[&str], cmd: &[&str]) -> Output {
        Command::new(BIN)
            .args(["run", "--dir"])
            .arg(self.lease_dir())
            .args(["--id", "job"])
            .args(opts)
            .arg("--")
            .args(cmd)
            .output()
            .unwrap()
    }

    /// A command that creates `<dir>/ran-<side>` (which side ran it is told apart).
    fn touch(&self, side: &str) -> (PathBuf, Vec<String>) {
        let marker = self.dir.path().join(format!("ran-{side}"));
        let cmd = ["sh", "-c", "touch \"$0\"", marker.to_str().unwrap()]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        (marker, cmd)
    }

    /// `both` with a marker command per side: the exit codes, and whether each side ran it.
    fn both_touch(&self, opts: &[&str]) -> ((i32, bool), (i32, bool)) {
        let (fm, fc) = self.touch("flock");
        let (rm, rc) = self.touch("run");
        let fc: Vec<&str> = fc.iter().map(String::as_str).collect();
        let rc: Vec<&str> = rc.iter().map(String::as_str).collect();
        let f = self.flock(opts, &fc);
        let r = self.ours(opts, &rc);
        let result = ((code(&f), fm.exists()), (code(&r), rm.exists()));
        let _ = std::fs::remove_file(fm);
        let _ = std::fs::remove_file(rm);
        result
    }

    /// Holds both the lock file (flock) and the lease (run) until the returned guard drops.
    fn hold(&self) -> Holders {
        let spawn = |mut c: Command| {
            let mut child = c
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line.trim(), "held");
            child
        };
        let script = "echo held; read _";
        let mut f = Command::new(&self.flock);
        f.arg(self.lock_file()).args(["sh", "-c", script]);
        let mut r = Command::new(BIN);
        r.args(["run", "--dir"])
            .arg(self.lease_dir())
            .args(["--id", "job", "--", "sh", "-c", script]);
        Holders(vec![spawn(f), spawn(r)])
    }
}

struct Holders(Vec<Child>);

impl Drop for Holders {
    fn drop(&mut self) {
        for c in &mut self.0 {
            drop(c.stdin.take());
            let _ = c.wait();
        }
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_row_of_the_flock_table_side_by_side() {
    let Some(s) = Side::new() else { return };
    // `flock FILE CMD ARGS...`: the command runs, its status is the exit status.
    let (f, r) = s.both(&[], &["sh", "-c", "echo ran; exit 3"]);
    assert_eq!((code(&f), out(&f)), (3, "ran\n".into()));
    assert_eq!((code(&r), out(&r)), (3, "ran\n".into()), "{r:?}");
    // `-c CMD`: sh -c.
    let lock = s.lock_file();
    let flock_c = Command::new(&s.flock)
        .arg(&lock)
        .args(["-c", "echo $((40 + 2))"])
        .output()
        .unwrap();
    let run_c = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(s.lease_dir())
        .args(["--id", "job", "-c", "echo $((40 + 2))"])
        .output()
        .unwrap();
    assert_eq!(out(&flock_c), "42\n");
    assert_eq!(out(&run_c), "42\n", "{run_c:?}");
    // `-x`: accepted, exclusive as always.
    let (f, r) = s.both(&["-x"], &["true"]);
    assert_eq!((code(&f), code(&r)), (0, 0), "{r:?}");
    let held = s.hold();
    // `-n` (and `--nb`, `--nonblock`) while held: the command does not run; flock exits 1,
    // run 75.
    for n in ["-n", "--nb", "--nonblock"] {
        assert_eq!(s.both_touch(&[n]), ((1, false), (75, false)), "{n}");
    }
    // `-E N`: the conflict code, for both.
    assert_eq!(s.both_touch(&["-n", "-E", "9"]), ((9, false), (9, false)));
    // `-w SECS` held for the whole wait: the conflict code, nothing ran.
    for w in [["-w", "0.2"], ["--wait", "0.2"], ["--timeout", "0.2"]] {
        assert_eq!(s.both_touch(&w), ((1, false), (75, false)), "{w:?}");
    }
    // No message on a conflict from flock; one from `run`, unless `-q`.
    let (f, r, q) = (
        s.flock(&["-n"], &["true"]),
        s.ours(&["-n"], &["true"]),
        s.ours(&["-n", "-q"], &["true"]),
    );
    assert!(f.stderr.is_empty(), "{f:?}");
    assert!(!r.stderr.is_empty(), "{r:?}");
    assert!(q.stderr.is_empty(), "{q:?}");
    drop(held);
    // `-w` once the holder is gone: both run.
    let (f, r) = s.both(&["-w", "5"], &["true"]);
    assert_eq!((code(&f), code(&r)), (0, 0), "{r:?}");
}

#[test]
fn what_flock_does_and_a_lease_cannot_is_refused_and_nothing_runs() {
    let Some(s) = Side::new() else { return };
    for opt in [
        "-s",
        "--shared",
        "-u",
        "--unlock",
        "-o",
        "--close",
        "-F",
        "--no-fork",
    ] {
        let (_, run) = s.both_touch(&[opt]);
        assert_eq!(run, (64, false), "{opt}: refused, and nothing ran");
        let err = String::from_utf8_lossy(&s.ours(&[opt], &["true"]).stderr).into_owned();
        assert!(err.contains("does not support"), "{opt}: {err}");
    }
}

#[test]
fn an_unknown_option_is_bad_usage_for_both_and_never_run_as_the_command() {
    let Some(s) = Side::new() else { return };
    for typo in ["--quite", "-Z"] {
        assert_eq!(s.both_touch(&[typo]), ((64, false), (64, false)), "{typo}");
    }
    // The closest valid option is suggested.
    let r = s.ours(&["--quite"], &["true"]);
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("--quiet"),
        "{r:?}"
    );
    let (marker, touch) = s.touch("run");
    // An unknown option first: still an option, not the command.
    let first = Command::new(BIN)
        .args(["run", "--quite", "--dir"])
        .arg(s.lease_dir())
        .args(["--id", "job", "--"])
        .args(&touch)
        .output()
        .unwrap();
    assert_eq!(code(&first), 64, "{first:?}");
    assert!(!marker.exists());
    // `-n -w T` together: refused, saying why (flock lets the later one win).
    let (_, run) = s.both_touch(&["-n", "-w", "1"]);
    assert_eq!(run, (64, false));
    let r = s.ours(&["-n", "-w", "1"], &["true"]);
    assert!(String::from_utf8_lossy(&r.stderr).contains("cannot be used with"));
}

#[test]
fn an_empty_id_is_bad_usage_and_flocklease_dir_is_the_default_directory() {
    let Some(s) = Side::new() else { return };
    let empty = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(s.lease_dir())
        .args(["--id", "", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&empty), 64, "{empty:?}");
    let from_env = Command::new(BIN)
        .args([
            "run",
            "--id",
            "job",
            "--",
            "sh",
            "-c",
            "echo $FLOCKLEASE_DIR",
        ])
        .env("FLOCKLEASE_DIR", s.lease_dir())
        .output()
        .unwrap();
    assert_eq!(code(&from_env), 0, "{from_env:?}");
    assert_eq!(out(&from_env).trim(), s.lease_dir().to_str().unwrap());
    // Neither --dir nor FLOCKLEASE_DIR: the default directory (root: /run/lock/flocklease;
    // other users: $XDG_RUNTIME_DIR/flocklease, here a temporary directory of this test's).
    let runtime = tempfile::tempdir().unwrap();
    let expected = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/lock/flocklease")
    } else {
        runtime.path().join("flocklease")
    };
    let existed = expected.exists();
    let id = format!("default-dir-test-{}", std::process::id());
    let default = Command::new(BIN)
        .args(["run", "--id", &id, "--", "sh", "-c", "echo $FLOCKLEASE_DIR"])
        .env_remove("FLOCKLEASE_DIR")
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    // `status` finds the lease there from nothing but the id.
    let status = Command::new(BIN)
        .args(["status", "--id", &id])
        .env_remove("FLOCKLEASE_DIR")
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    // Leave nothing behind outside this test's directories: this id's files, and the
    // directory if this test made it.
    let stem = flocklease::SessionId::new(id.as_str())
        .unwrap()
        .stem()
        .to_owned();
    for entry in std::fs::read_dir(&expected).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&stem) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if !existed {
        let _ = std::fs::remove_dir(&expected);
    }
    assert_eq!(code(&default), 0, "{default:?}");
    assert_eq!(out(&default).trim(), expected.to_str().unwrap());
    assert_eq!(code(&status), 1, "released: free; {status:?}");
    assert!(out(&status).contains("released"), "{status:?}");
    // Root's default lies in /run/lock, where every user may create names: a directory
    // another user made there first is refused, never trusted.
    if nix::unistd::geteuid().is_root() && !expected.exists() {
        std::fs::create_dir(&expected).unwrap();
        std::os::unix::fs::chown(&expected, Some(65534), None).unwrap();
        let squatted = Command::new(BIN)
            .args(["run", "--id", &id, "--", "true"])
            .env_remove("FLOCKLEASE_DIR")
            .output()
            .unwrap();
        // (Had it run, it would have left this id's files there.)
        for entry in std::fs::read_dir(&expected).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        let _ = std::fs::remove_dir(&expected);
        assert_eq!(code(&squatted), 70, "{squatted:?}");
        let err = String::from_utf8_lossy(&squatted.stderr);
        assert!(err.contains("owned by uid 65534"), "{err}");
    }
}
