//! `flocklease fence` driven as a real process : the token from
//! `run`'s environment or `--token`, the fenced write of standard input, exit statuses and
//! messages.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::cli_support::*;

/// `flocklease fence ARGS...` with `stdin` as its input and no FLOCKLEASE_TOKEN of ours.
fn fence(args: &[&str], stdin: &[u8]) -> Output {
    fence_in(std::path::Path::new("."), args, stdin)
}

/// [`fence`] run in the directory `dir`.
fn fence_in(dir: &std::path::Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .arg("fence")
        .args(args)
        .current_dir(dir)
        .env_remove("FLOCKLEASE_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A refused invocation may exit before it reads its input: a broken pipe is its answer.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_job_of_run_fences_its_output_with_the_token_run_gives_it() {
    let s = Scene::new();
    std::fs::create_dir(&s.leases).unwrap();
    let (f, target) = (s.path("report.fence"), s.path("report.csv"));
    let job = format!(
        "printf 'run %s\\n' $FLOCKLEASE_TOKEN | {BIN} fence --fence {} --write {}",
        f.display(),
        target.display()
    );
    for token in 1..=2 {
        let out = s.run("nightly", &[], &["sh", "-c", &job]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            format!("run {token}\n")
        );
        assert_eq!(std::fs::read_to_string(&f).unwrap(), format!("{token}\n"));
    }
    // The holder of token 1, resumed after its successor wrote: refused, output dropped.
    let out = fence(
        &[
            "--fence",
            f.to_str().unwrap(),
            "--token",
            "1",
            "--write",
            target.to_str().unwrap(),
        ],
        b"stale\n",
    );
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    let said = stderr(&out);
    let (first, why) = said.split_once('\n').unwrap();
    assert_eq!(
        first,
        format!(
            "flocklease: token 1 refused: the fence {} has admitted 2",
            f.display()
        )
    );
    // Why an honest holder may meet it for good (issue 50).
    assert!(why.contains("lease directory was reset"), "{said}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "run 2\n");
}

/// A fence file and a target named relative to the working directory, as a job started in
/// its own directory names them (`--fence report.fence --write report.csv`): the fence's
/// directory and the target's are the working directory, and nothing else is left there.
#[test]
fn bare_names_are_files_of_the_working_directory() {
    let s = Scene::new();
    let dir = s.path("job");
    std::fs::create_dir(&dir).unwrap();
    for token in ["3", "3", "4"] {
        let args = [
            "--fence",
            "report.fence",
            "--token",
            token,
            "--write",
            "report.csv",
        ];
        let out = fence_in(&dir, &args, token.as_bytes());
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        assert_eq!(
            std::fs::read_to_string(dir.join("report.csv")).unwrap(),
            token
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["report.csv", "report.fence", "report.fence.lock"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("report.fence")).unwrap(),
        "4\n"
    );
}

#[test]
fn without_write_the_token_is_admitted_only_and_a_stale_one_exits_77() {
    let s = Scene::new();
    let f = s.path("f");
    let f = f.to_str().unwrap();
    let out = fence(&["--fence", f, "--token", "5"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(std::fs::read_to_string(f).unwrap(), "5\n");
    assert!(out.stderr.is_empty() && out.stdout.is_empty());
    let out = fence(&["--fence", f, "--token", "5"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = fence(&["--fence", f, "--token", "4"], b"");
    assert_eq!(out.status.code(), Some(77), "{}", describe(&out));
    assert!(stderr(&out).contains("token 4 refused"), "{}", stderr(&out));
    // FLOCKLEASE_TOKEN is the default.
    let out = Command::new(BIN)
        .args(["fence", "--fence", f])
        .env("FLOCKLEASE_TOKEN", "8")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(std::fs::read_to_string(f).unwrap(), "8\n");
}

#[test]
fn no_token_or_a_malformed_one_is_bad_usage_and_touches_nothing() {
    let s = Scene::new();
    let (f, target) = (s.path("f"), s.path("out"));
    let (f, target) = (f.to_str().unwrap(), target.to_str().unwrap());
    let out = fence(&["--fence", f, "--write", target], b"data");
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
    assert!(stderr(&out).contains("no token"), "{}", stderr(&out));
    let out = Command::new(BIN)
        .args(["fence", "--fence", f])
        .env("FLOCKLEASE_TOKEN", "12x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
    assert!(stderr(&out).contains("\"12x\""), "{}", stderr(&out));
    for bad in ["-1", "x", ""] {
        let out = fence(&["--fence", f, "--token", bad], b"");
        assert_eq!(out.status.code(), Some(64), "{bad:?}: {}", describe(&out));
    }
    let out = fence(
        &["--fence", f, "--token", "1", "--lock-timeout", "soon"],
        b"",
    );
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
    assert!(!std::path::Path::new(f).exists() && !std::path::Path::new(target).exists());
}

#[test]
fn errors_exit_70_with_the_file_named_and_write_nothing() {
    let s = Scene::new();
    let (f, target) = (s.path("f"), s.path("out"));
    std::fs::write(&f, "not a token\n").unwrap();
    let args = [
        "--fence",
        f.to_str().unwrap(),
        "--token",
        "3",
        "--write",
        target.to_str().unwrap(),
    ];
    let out = fence(&args, b"data");
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("flocklease: corrupt fence file {}: ", f.display())),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "not a token\n");
    assert!(!target.exists());
    // A missing directory is named, not created.
    let missing = s.path("missing");
    let out = fence(
        &[
            "--fence",
            missing.join("f").to_str().unwrap(),
            "--token",
            "1",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    assert!(
        stderr(&out).contains(missing.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    assert!(!missing.exists());
}

#[test]
fn help_documents_the_exit_statuses() {
    let out = Command::new(BIN)
        .args(["fence", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("77"), "{help}");
    assert!(help.contains("FLOCKLEASE_TOKEN"), "{help}");
}
