//! The `flocklease run` command driven as a real process : the
//! environment, exit statuses, flock(1)-style options, durations, the lease directory and
//! error messages. Signals and kills are in `cli_signals.rs`, `status` in `cli_status.rs`.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::cli_support::*;
use flocklease::{FlockLease, Owner, Record, SessionId, Timestamp, record};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn command_gets_the_lease_in_its_environment_and_its_exit_status_passes_through() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    // A relative --dir: FLOCKLEASE_DIR is still absolute.
    let out = Command::new(BIN)
        .current_dir(s.tmp.path())
        .args([
            "run", "--dir", "leases", "--id", "job", "--owner", "cron", "--",
        ])
        .args([
            "sh",
            "-c",
            "echo $FLOCKLEASE_TOKEN $FLOCKLEASE_ID $FLOCKLEASE_OWNER $FLOCKLEASE_DIR; exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let dir = std::fs::canonicalize(&s.leases).unwrap();
    assert_eq!(stdout(&out), format!("1 job cron {}\n", dir.display()));
    // Released afterwards: the next run gets the next token.
    assert_eq!(s.rival("job"), Some(2));
}

#[test]
fn two_racing_runs_one_runs_one_is_told_held() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    let marker = s.path("ran");
    let script = format!("echo x >> {}; sleep 1", marker.display());
    let a = s.start("job", &[], &["sh", "-c", &script]);
    let b = s.start("job", &[], &["sh", "-c", &script]);
    let codes = [output_of(a).status.code(), output_of(b).status.code()];
    let mut sorted = codes;
    sorted.sort();
    assert_eq!(sorted, [Some(0), Some(75)], "{codes:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "x\n");
}

#[test]
fn held_is_answered_like_flock_with_conflict_exit_code_and_quiet() {
    let s = Scene::new();
    let leases = FlockLease::open(&s.leases).unwrap();
    let id = SessionId::new("nightly").unwrap();
    let held = leases
        .acquire(&id, &Owner::new("web-1:42").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    let out = s.run("nightly", &[], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.contains("nightly is held by web-1:42 (token 1, expires in "),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // -n is the default, accepted for familiarity.
    let out = s.run("nightly", &["-n"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let out = s.run("nightly", &["-E", "9"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", describe(&out));
    let out = s
        .run("nightly", &["-q", "--conflict-exit-code", "0"], &["true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(out.stderr.is_empty(), "-q printed {}", stderr(&out));
    // The command never ran, and the lease is untouched.
    assert_eq!(s.record("nightly").token, 1);
    assert_eq!(s.record("nightly").owner, "web-1:42");
    leases.release(&held).unwrap();
}

#[test]
fn wait_returns_held_at_its_deadline_and_the_lease_as_soon_as_the_holder_releases() {
    let s = Scene::new();
    let leases = FlockLease::open(&s.leases).unwrap();
    let id = SessionId::new("w").unwrap();
    let held = leases
        .acquire(&id, &Owner::new("holder").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    let start = Instant::now();
    let out = s.run("w", &["-w", "300ms"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(
        stderr(&out).contains("after waiting 300 ms"),
        "{}",
        stderr(&out)
    );
    let waiter = s.start(
        "w",
        &["--wait", "1m"],
        &["sh", "-c", "echo $FLOCKLEASE_TOKEN"],
    );
    leases.release(&held).unwrap();
    let out = output_of(waiter);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(stdout(&out), "2\n");
}

#[test]
fn a_stuck_transition_lock_is_an_error_naming_the_lock_file_never_held() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    let lock_path = s
        .leases
        .join(format!("{}.lock", SessionId::new("stuck").unwrap().stem()));
    let lock = std::fs::File::create(&lock_path).unwrap();
    lock.lock().unwrap();
    // The library gives up on the transition lock after 5 s, before this wait ends.
    let out = s.run("stuck", &["-w", "30s"], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let err = stderr(&out);
    assert!(err.contains(&lock_path.display().to_string()), "{err}");
    assert!(!err.contains("held"), "{err}");
}

#[test]
fn dash_c_runs_the_command_through_sh() {
    let s = Scene::new();
    let out = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(&s.leases)
        .args([
            "--id",
            "c",
            "-c",
            "echo token $FLOCKLEASE_TOKEN | tr a-z A-Z; exit 4",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", describe(&out));
    assert_eq!(stdout(&out), "TOKEN 1\n");
    // Not both -c and a command; not neither.
    for args in [&["-c", "true", "--", "true"][..], &[]] {
        let out = Command::new(BIN)
            .args(["run", "--dir"])
            .arg(&s.leases)
            .args(["--id", "c"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", describe(&out));
    }
}

#[test]
fn a_command_that_cannot_run_exits_126_or_127_and_the_lease_is_released() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    let not_exec = s.path("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let missing = s.path("no-such-program");
    let cases = [
        (missing.to_str().unwrap(), 127),
        ("no-such-program-on-path-either", 127),
        (not_exec.to_str().unwrap(), 126),
        (s.tmp.path().to_str().unwrap(), 126),
    ];
    for (i, (program, code)) in cases.iter().enumerate() {
        let out = s.run("x", &[], &[program, "arg"]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(*code),
            "{program}: {}",
            describe(&out)
        );
        let err = stderr(&out);
        assert!(err.contains(&format!("cannot run {program}")), "{err}");
        // Released: the next grant is the next token.
        assert_eq!(s.record("x").token, i as u64 + 1);
        assert!(s.record("x").is_tombstone(), "{program}: not released");
    }
}

#[test]
fn durations_take_fractions_and_compounds_and_bad_ones_are_usage_errors() {
    let s = Scene::new();
    let bad = [
        ("--ttl", "0"),
        ("--ttl", "0s"),
        ("--ttl", "-1s"),
        ("--ttl", "99999999999999999999s"),
        ("--ttl", "50ms"),
        ("--ttl", "30x"),
        ("-w", "-1"),
        ("-w", "1.5.s"),
        ("--grace", "2s30m"),
        ("--grace", ""),
        ("-E", "256"),
        ("-E", "-1"),
        ("--durability", "maybe"),
    ];
    for (opt, value) in bad {
        let out = s.run("d", &[opt, value], &["true"]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(64),
            "{opt} {value}: {}",
            describe(&out)
        );
        assert!(
            stderr(&out).contains(&format!("'{value}'")),
            "{opt} {value}: {}",
            stderr(&out)
        );
    }
    assert!(
        !s.leases.exists(),
        "a refused invocation touched the lease directory"
    );
    let before = Timestamp::from_system_time(SystemTime::now()).unwrap();
    let out = s
        .run(
            "d",
            &[
                "--ttl",
                "2m30s",
                "-w",
                "1.5s",
                "--grace",
                "250ms",
                "--durability",
                "nosync",
            ],
            &["sh", "-c", "echo $FLOCKLEASE_EXPIRY"],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let expiry = Timestamp::parse_rfc3339(stdout(&out).trim()).unwrap();
    let ttl = expiry.saturating_duration_since(before);
    assert!(
        ttl >= Duration::from_secs(150) && ttl < Duration::from_secs(160),
        "{ttl:?}"
    );
}

#[test]
fn only_the_last_component_of_the_lease_directory_is_created() {
    let s = Scene::new();
    let deep = s.path("typo/leases");
    let out = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(&deep)
        .args(["--id", "x", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&deep.display().to_string()), "{err}");
    assert!(err.contains(&s.path("typo").display().to_string()), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!s.path("typo").exists(), "the missing parent was created");
    // The last component alone is created, private.
    let out = s.run("x", &[], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let mode = std::fs::metadata(&s.leases).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn errors_are_one_clear_line_without_debug_formatting() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    // A record at the last token: the next grant would wrap.
    let last = Record {
        owner: String::new(),
        token: u64::MAX,
        expiry: Timestamp::from_unix_secs(1_000_000_000).unwrap(),
    };
    std::fs::write(record_path(&s.leases, "full up"), record::encode(&last)).unwrap();
    let out = s.run("full up", &[], &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("session full up is exhausted"), "{err}");
    assert!(!err.contains("SessionId") && !err.contains('"'), "{err}");
    // An invalid id is refused before anything is created.
    let out = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(s.path("never"))
        .args(["--id", "", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // An empty one is bad usage (flock's exit code for it), before anything is created.
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
    assert!(
        stderr(&out).starts_with("error: invalid value '' for '--id <ID>': session id is empty\n"),
        "{}",
        describe(&out)
    );
    assert!(!s.path("never").exists());
    for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(!out.stdout.is_empty());
    }
}

/// `flocklease man` and `flocklease completions SHELL` print a manual page and completion
/// scripts generated from the argument definitions (so an option added to `run` appears in
/// both).
#[test]
fn the_man_page_and_the_completion_scripts_come_from_the_arguments() {
    let run = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    let top = run(&["man"]);
    assert_eq!(top.status.code(), Some(0), "{top:?}");
    let page = stdout(&top);
    assert!(page.contains(".TH flocklease 1"), "{page}");
    for command in ["run", "status", "fence"] {
        assert!(page.contains(&format!("flocklease\\-{command}")) || page.contains(command));
    }
    let run_page = stdout(&run(&["man", "run"]));
    assert!(run_page.contains(".TH flocklease-run 1"), "{run_page}");
    // The version is in the header, and no -V is listed that `run` would refuse.
    assert!(
        run_page.contains(&format!("flocklease {}", env!("CARGO_PKG_VERSION"))),
        "{run_page}"
    );
    assert!(!run_page.contains("\\-\\-version"), "{run_page}");
    assert_eq!(run(&["run", "-V"]).status.code(), Some(64));
    for section in ["EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"] {
        assert!(
            run_page.contains(&format!(".SH \"{section}\"")),
            "{section}:\n{run_page}"
        );
    }
    assert!(run_page.contains("trust\\-foreign\\-owners"), "{run_page}");
    let unknown = run(&["man", "nope"]);
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
    let bash = stdout(&run(&["completions", "bash"]));
    assert!(bash.contains("_flocklease()") && bash.contains("--trust-foreign-owners"));
    let zsh = stdout(&run(&["completions", "zsh"]));
    assert!(zsh.contains("#compdef flocklease"));
    let fish = stdout(&run(&["completions", "fish"]));
    assert!(fish.contains("complete -c flocklease"));
    // The internal watchdog (started by `run` only) is offered nowhere.
    for text in [&bash, &zsh, &fish, &page] {
        assert!(!text.contains("__watchdog"), "{text}");
    }
    // Nor are flock(1)'s options that `run` refuses (issue 50); `--dir` completes directories
    // and what follows `--` is a command.
    for text in [&bash, &zsh, &fish] {
        for refused in ["--shared", "--unlock", "--close", "--no-fork"] {
            assert!(!text.contains(refused), "{refused} offered:\n{text}");
        }
    }
    assert!(zsh.contains(":DIR:_files -/"), "{zsh}");
    assert!(zsh.contains(":_cmdambivalent"), "{zsh}");
    // Every exit status and the TTL's minimum, in --help and the manual page.
    let help = stdout(&run(&["run", "--help"]));
    for text in [&help, &run_page] {
        for said in ["78 when", "79 when", "at least 500ms"] {
            assert!(text.contains(said), "{said} missing:\n{text}");
        }
    }
}

/// flock(1)'s habits get a hint, as bad usage (64): `flocklease FILE COMMAND` says how the
/// path splits into a directory and an id; `run … 9` (flock's descriptor form) is refused
/// instead of running a command named `9`; an id with a control character is bad usage like
/// an empty one.
#[test]
fn flock_habits_get_a_hint_and_bad_ids_are_usage_errors() {
    let s = Scene::new();
    let out = Command::new(BIN)
        .args(["/var/lock/nightly", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        stderr(&out).contains("flocklease run --dir /var/lock --id nightly -- COMMAND"),
        "{out:?}"
    );
    // The same hint after flock's options, and after `run` (issue 50: bare clap errors).
    for form in [
        &["-n", "-w", "5", "/var/lock/nightly", "-c", "true"][..],
        &["run", "/var/lock/nightly", "true"],
    ] {
        let out = Command::new(BIN).args(form).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{form:?}: {out:?}");
        assert!(
            stderr(&out).contains("flocklease run --dir /var/lock --id nightly -- COMMAND"),
            "{form:?}: {out:?}"
        );
    }
    let fd = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(&s.leases)
        .args(["--id", "x", "9"])
        .output()
        .unwrap();
    assert_eq!(fd.status.code(), Some(64), "{fd:?}");
    assert!(stderr(&fd).contains("exec flocklease run"), "{fd:?}");
    assert!(!s.leases.exists(), "nothing was run");
    let control = Command::new(BIN)
        .args(["run", "--dir"])
        .arg(&s.leases)
        .args(["--id", "a\tb", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(control.status.code(), Some(64), "{control:?}");
    assert!(
        stderr(&control).contains("control character"),
        "{control:?}"
    );
    // An escape sequence in an id is shown escaped, never sent raw to a terminal (issue 50).
    let escape = Command::new(BIN)
        .args(["run", "--id", "a\u{1b}[31mb", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(escape.status.code(), Some(64), "{escape:?}");
    assert!(!stderr(&escape).contains('\u{1b}'), "{escape:?}");
    assert!(stderr(&escape).contains("a\\u{1b}[31mb"), "{escape:?}");
    // flock(1)'s --verbose gets words, not a suggestion to run a command named --verbose.
    let verbose = Command::new(BIN)
        .args(["run", "--verbose", "--id", "x", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(verbose.status.code(), Some(64), "{verbose:?}");
    assert!(stderr(&verbose).contains("has no --verbose"), "{verbose:?}");
}

/// `run --file-mode 660` (a directory shared by a group): every file it creates gets the mode
/// whatever the umask — the lock, the record and the id's sidecar, which `status` of the
/// group's other users reads (it was created 0600 whatever the option).
#[test]
fn file_mode_applies_to_every_file_run_creates_the_id_sidecar_included() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scene::new();
    let out = Command::new(BIN)
        .current_dir(s.tmp.path())
        .args([
            "run",
            "--dir",
            "leases",
            "--id",
            "shared",
            "--file-mode",
            "660",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let mut seen = 0;
    for entry in std::fs::read_dir(&s.leases).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        let mode = entry.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660, "{name}: {mode:o}");
        seen += usize::from(name.ends_with(".id") || name.ends_with(".lock"));
    }
    assert_eq!(seen, 2, "the lock and the sidecar");
}
