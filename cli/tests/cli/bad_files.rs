//! One story for every bad file: a FIFO, a directory, a symbolic link or another user's file
//! planted as an id's record or transition lock is reported with the same words by the
//! library (the error of an acquire), `flocklease status` (text and JSON, one id and the whole
//! directory) and `flocklease run`, with the remedy, and exit status 70 from both commands.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use crate::cli_support::*;
use flocklease::{Error, FlockLease, Owner, SessionId};

const ID: &str = "nightly";

/// `flocklease ARGS --dir DIR TAIL`, bounded by the guard.
fn cli(args: &[&str], dir: &Path, tail: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    flocklease(args.iter().chain(&["--dir", dir]).chain(tail))
}

#[derive(Clone, Copy, Debug)]
enum Plant {
    Fifo,
    Directory,
    Symlink,
    /// A regular file of another user (uid 65534) in a sticky world-writable directory.
    Foreign,
}

#[derive(Clone, Copy, Debug)]
enum Which {
    Record,
    Lock,
}

/// A lease directory in which `ID` was granted and released once (so its record and lock
/// exist), then the file `which` replaced by `plant`.
fn planted(plant: Plant, which: Which) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path()).unwrap();
    let id = SessionId::new(ID).unwrap();
    let lease = leases
        .acquire(&id, &Owner::new("first").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    flocklease::SessionLease::release(&leases, &lease).unwrap();
    drop(leases);
    let stem = id.stem();
    let path = match which {
        Which::Record => dir.path().join(format!("{stem}.lease.json")),
        Which::Lock => dir.path().join(format!("{stem}.lock")),
    };
    match plant {
        Plant::Fifo => {
            std::fs::remove_file(&path).unwrap();
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        }
        Plant::Directory => {
            std::fs::remove_file(&path).unwrap();
            std::fs::create_dir(&path).unwrap();
        }
        Plant::Symlink => {
            let target = dir.path().join("elsewhere");
            std::fs::rename(&path, &target).unwrap();
            std::os::unix::fs::symlink(&target, &path).unwrap();
        }
        Plant::Foreign => {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
            nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        }
    }
    dir
}

/// The library's word on the planted file: the error of an acquire by a new owner.
fn library_error(dir: &Path) -> Error {
    let leases = FlockLease::open(dir).unwrap();
    let id = SessionId::new(ID).unwrap();
    match leases.acquire(&id, &Owner::new("second").unwrap()) {
        Err(e) => e,
        Ok(grant) => panic!("granted over a planted file: {grant:?}"),
    }
}

fn check(plant: Plant, which: Which) {
    let dir = planted(plant, which);
    let dir = dir.path();
    let error = library_error(dir);
    match (plant, &error) {
        (Plant::Fifo | Plant::Directory, Error::NotAFile { .. })
        | (Plant::Symlink, Error::Symlink { .. })
        | (Plant::Foreign, Error::ForeignOwner { .. }) => {}
        _ => panic!("{plant:?} {which:?}: the library said {error:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("; "),
        "{plant:?} {which:?}: no remedy in {text:?}"
    );

    // status --id, JSON: the same error, the record's fields null when it cannot be read.
    let out = cli(&["status"], dir, &["--id", ID, "--json"]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &rows[0];
    assert_eq!(row["state"], "unreadable", "{plant:?} {which:?}: {row}");
    assert_eq!(row["acquirable"], false, "{row}");
    assert_eq!(row["error"], text.as_str(), "{plant:?} {which:?}");
    match which {
        Which::Record => {
            for key in ["owner", "token", "expiry"] {
                assert!(
                    row[key].is_null(),
                    "{plant:?}: {key} of an unreadable record: {row}"
                );
            }
        }
        // The record itself reads well: what it says is shown.
        Which::Lock => assert_eq!(row["token"], 1, "{row}"),
    }
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("flocklease: {text}\n"),
        "{plant:?} {which:?}: status --id's message"
    );

    // status, the whole directory, text and JSON (its status: a record is broken).
    let out = cli(&["status"], dir, &["--json"]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == ID || r["stem"] == SessionId::new(ID).unwrap().stem())
        .unwrap_or_else(|| panic!("{plant:?} {which:?}: no row in {rows}"));
    assert_eq!(
        row["error"],
        text.as_str(),
        "{plant:?} {which:?}: the listing's row"
    );
    let out = cli(&["status"], dir, &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    // The row says it is broken; the error itself follows the table, whole.
    assert!(
        table.contains("unreadable (see below)") && table.contains(&format!(": {text}")),
        "{plant:?} {which:?}: the table does not show the error:\n{table}"
    );
    assert!(!table.contains("free to acquire"), "{table}");

    // run: the same message, exit 70, the command never run.
    let marker = dir.join("ran");
    let out = cli(
        &["run"],
        dir,
        &["--id", ID, "--", "touch", marker.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("flocklease: {text}\n"),
        "{plant:?} {which:?}: run's message"
    );
    assert!(!marker.exists(), "the command ran");
}

/// Whether this test runs as root, which giving a file to another user needs; CI runs the
/// tests as root (`FLOCKLEASE_REQUIRE_ROOT`), so there a test never skips.
fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("FLOCKLEASE_REQUIRE_ROOT").is_none(),
        "CI must run this test as root"
    );
    eprintln!("skipped: not root, cannot give a file to another user");
    false
}

#[test]
fn a_planted_fifo_is_one_story() {
    check(Plant::Fifo, Which::Record);
    check(Plant::Fifo, Which::Lock);
}

#[test]
fn a_planted_directory_is_one_story() {
    check(Plant::Directory, Which::Record);
    check(Plant::Directory, Which::Lock);
}

#[test]
fn a_planted_symlink_is_one_story() {
    check(Plant::Symlink, Which::Record);
    check(Plant::Symlink, Which::Lock);
}

#[test]
fn another_users_file_in_a_shared_directory_is_one_story() {
    if !root() {
        return;
    }
    check(Plant::Foreign, Which::Record);
    check(Plant::Foreign, Which::Lock);
}

#[test]
fn status_reads_another_users_files_when_told_to_trust_them() {
    // Issue 50: root read a user's row in a shared directory as unreadable, with no way to
    // say otherwise; `run` had --trust-foreign-owners, `status` not.
    if !root() {
        return;
    }
    for which in [Which::Record, Which::Lock] {
        let tmp = planted(Plant::Foreign, which);
        let dir = tmp.path();
        let refused = cli(&["status"], dir, &["--id", ID]);
        assert_eq!(refused.status.code(), Some(70), "{}", describe(&refused));
        let trusted = cli(&["status", "--trust-foreign-owners"], dir, &["--id", ID]);
        // Released once: free.
        assert_eq!(
            trusted.status.code(),
            Some(1),
            "{which:?}: {}",
            describe(&trusted)
        );
        let listed = cli(&["status", "--trust-foreign-owners"], dir, &[]);
        assert_eq!(
            listed.status.code(),
            Some(0),
            "{which:?}: {}",
            describe(&listed)
        );
    }
}

#[test]
fn a_missing_parent_is_an_error_for_the_library_and_run_alike() {
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo").join("leases");
    let error = FlockLease::open(&typo).unwrap_err().to_string();
    assert!(error.contains("does not exist"), "{error}");
    assert!(
        !dir.path().join("typo").exists(),
        "the library created the parent"
    );
    let out = cli(&["run"], &typo, &["--id", ID, "--", "true"]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("flocklease: {error}\n")
    );
    // The last component alone is created, mode 0700.
    let leases = dir.path().join("leases");
    FlockLease::open(&leases).unwrap();
    let mode = std::fs::metadata(&leases).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

/// The id `nightly` in `dir` acquired and released once by `me`, and the path of its next
/// generation's liveness file (`<stem>.2.live`).
fn released_once(dir: &Path) -> (FlockLease, SessionId, Owner, std::path::PathBuf) {
    let leases = FlockLease::open(dir).unwrap();
    let id = SessionId::new("nightly").unwrap();
    let me = Owner::new("me").unwrap();
    let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
    leases.release(&lease).unwrap();
    let next = dir.join(format!("{}.2.live", id.stem()));
    (leases, id, me, next)
}

/// Issue 33.6: a directory at the *next* generation's liveness name makes every acquire fail,
/// and `status` said "free" (released, free to acquire). It says `blocked` now, naming the
/// file, and `flocklease status --id` exits 70 with that message, as for any broken id.
#[test]
fn a_directory_at_the_next_generations_name_is_reported_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let (leases, id, me, next) = released_once(dir.path());
    std::fs::create_dir(&next).unwrap();
    // The truth status must tell: no acquire can succeed. PROTOCOL §6.6 says so (issue 50:
    // the refusal stays, since a takeover can publish its generation nowhere else and the
    // library removes no directory it did not make), and the error says what to remove and
    // why, not only "not a regular file".
    let refused = FlockLease::open(dir.path())
        .unwrap()
        .acquire(&id, &me)
        .unwrap_err();
    assert!(matches!(refused, Error::NotAFile { .. }), "{refused:?}");
    let said = refused.to_string();
    for words in [".2.live", "every acquire of the id fails", "rmdir"] {
        assert!(said.contains(words), "{words:?} not in {said:?}");
    }
    let row = flocklease::status::session(dir.path(), &id, flocklease::Timestamp::now())
        .unwrap()
        .unwrap();
    assert_eq!(row.state, "blocked", "{row:?}");
    assert!(!row.acquirable && row.is_broken(), "{row:?}");
    assert!(
        row.error.as_deref().is_some_and(|e| e.contains(".2.live")),
        "{row:?}"
    );
    let out = cli(&["status", "--id", "nightly"], dir.path(), &[]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    // Removed, the id is free again.
    std::fs::remove_dir(&next).unwrap();
    assert!(leases.acquire(&id, &me).unwrap().lease().is_some());
}

/// Issue 33.6, the other half: another user's file at the next generation's liveness name in a
/// shared (sticky, world-writable) directory. `status` judges it as the kernel will for the
/// user it runs as: root may replace it, so the takeover succeeds and `status` does not say
/// `blocked` (it did, for root too, before); a user who may not is told `blocked` (not run
/// here: CI runs as root).
#[test]
fn another_users_file_at_the_next_generations_name_is_judged_as_the_kernel_will() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (_leases, id, me, next) = released_once(dir.path());
    std::fs::write(&next, b"").unwrap();
    nix::unistd::chown(&next, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
    let row = flocklease::status::session(dir.path(), &id, flocklease::Timestamp::now())
        .unwrap()
        .unwrap();
    assert!(row.acquirable && row.state == "released", "{row:?}");
    // What status promised: root's takeover replaces the file.
    let acquired = FlockLease::open(dir.path()).unwrap().acquire(&id, &me);
    assert!(
        matches!(acquired, Ok(flocklease::Grant::Granted(_))),
        "{acquired:?}"
    );
}

/// Issue 50: in a shared sticky directory, a user who gave `--trust-foreign-owners` was told to
/// give it, when the cause was the kernel refusing root's 0600 file. The message says it is the
/// kernel's refusal, that the option cannot lift it, and what to do instead. Run as root, which
/// creates the files, then as uid 65534 (`nobody`) in the same directory.
#[test]
fn a_kernel_refusal_in_a_shared_directory_is_not_blamed_on_a_missing_option() {
    use std::os::unix::process::CommandExt;
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The user must reach the shared directory: its parent readable by all.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = cli(&["run"], &shared, &["--id", ID, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // The binary where the user can reach it, as tests/support's children do: the checkout
    // may lie under a directory only root can enter (a clone in `mktemp -d`). A hard link
    // where it can be (no descriptor open for writing that another test's fork could hold).
    let exe = tmp.path().join("flocklease");
    if std::fs::hard_link(bin(), &exe).is_err() {
        std::fs::copy(bin(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for trust in [true, false] {
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["run", "--dir", shared.to_str().unwrap(), "--id", ID]);
        if trust {
            cmd.arg("--trust-foreign-owners");
        }
        let out = cmd
            .args(["--", "true"])
            .uid(65534)
            .gid(65534)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
        let said = String::from_utf8_lossy(&out.stderr);
        for words in [
            "the kernel refused",
            "uid 0",
            "cannot lift this",
            "group directory",
        ] {
            assert!(
                said.contains(words),
                "trust {trust}: {words:?} not in {said:?}"
            );
        }
        // Not the advice to give the option (the words of a refusal by the library's rule).
        assert!(!said.contains("trust the directory's users"), "{said}");
    }
}
