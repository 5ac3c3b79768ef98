//! `flocklease mend` (issue 50): an id whose record no call can use is repaired by a command,
//! not by hand-written JSON, and the token is never lost: the released record it writes has
//! the highest token the directory shows, under the id's transition lock; a live holder is
//! never mended over.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::cli_support::*;
use flocklease::{FlockLease, Owner, Record, SessionId};

const ID: &str = "nightly";

fn id() -> SessionId {
    SessionId::new(ID).unwrap()
}

fn record_path(dir: &Path) -> PathBuf {
    dir.join(format!("{}.lease.json", id().stem()))
}

/// `flocklease mend --dir DIR --id nightly`.
fn mend(dir: &Path) -> Output {
    flocklease(["mend", "--dir", dir.to_str().unwrap(), "--id", ID])
}

/// The id granted and released `cycles` times (its record a tombstone of token `cycles`).
fn granted(dir: &Path, cycles: u64) -> FlockLease {
    let leases = FlockLease::open(dir).unwrap();
    for _ in 0..cycles {
        let lease = leases
            .acquire(&id(), &Owner::new("first").unwrap())
            .unwrap()
            .lease()
            .unwrap();
        leases.release(&lease).unwrap();
    }
    leases
}

/// The record replaced by a FIFO.
fn fifo_over_record(dir: &Path) {
    let record = record_path(dir);
    std::fs::remove_file(&record).unwrap();
    nix::unistd::mkfifo(&record, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

fn read_record(dir: &Path) -> Record {
    flocklease::record::decode(&std::fs::read(record_path(dir)).unwrap()).unwrap()
}

#[test]
fn a_fifo_record_is_mended_with_the_highest_token_of_the_generations_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let leases = granted(dir, 2);
    fifo_over_record(dir);
    // A generation's file left by a holder that died (unlocked): its name is the highest
    // token handed out, above the record's 2.
    std::fs::write(dir.join(format!("{}.7.live", id().stem())), b"").unwrap();
    assert!(leases.acquire(&id(), &Owner::new("b").unwrap()).is_err());

    let out = mend(dir);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("a FIFO") && said.contains("token 7"),
        "{said}"
    );
    let rec = read_record(dir);
    assert!(rec.is_tombstone() && rec.token == 7, "{rec:?}");
    // No temporary file left behind.
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // The next holder gets a greater token than any handed out.
    let next = leases
        .acquire(&id(), &Owner::new("b").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(next.token, 8);
}

/// A release deletes its generation's file: after one, only the operator knows the token
/// (`--at-least`). An empty directory at the record's name is removed and replaced.
#[test]
fn a_directory_at_the_records_name_is_mended_with_the_token_the_operator_gives() {
    use std::os::unix::fs::FileTypeExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let leases = granted(dir, 3);
    let record = record_path(dir);
    std::fs::remove_file(&record).unwrap();
    std::fs::create_dir(&record).unwrap();
    let dir_s = dir.to_str().unwrap();
    let out = flocklease(["mend", "--dir", dir_s, "--id", ID, "--at-least", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("a directory"),
        "{}",
        describe(&out)
    );
    let next = leases
        .acquire(&id(), &Owner::new("b").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(next.token, 4);
    leases.release(&next).unwrap();
    // Without evidence or --at-least, nothing is written (a guess would hand out token 1
    // again): the command asks for --at-least.
    fifo_over_record(dir);
    let out = mend(dir);
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--at-least"),
        "{}",
        describe(&out)
    );
    assert!(
        std::fs::symlink_metadata(record_path(dir))
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO was replaced"
    );
    // Told, it writes the released record with that token.
    let out = flocklease(["mend", "--dir", dir_s, "--id", ID, "--at-least", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(read_record(dir).token, 4);
}

#[test]
fn a_live_holder_is_never_mended_over() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let leases = granted(dir, 1);
    let held = leases
        .acquire(&id(), &Owner::new("holder").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    fifo_over_record(dir);
    let out = mend(dir);
    assert_eq!(out.status.code(), Some(75), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("a holder lives"), "{said}");
    // Nothing written: the FIFO is still there.
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::symlink_metadata(record_path(dir))
        .unwrap()
        .file_type();
    assert!(kind.is_fifo(), "{kind:?}");
    drop(held);
}

#[test]
fn a_sound_record_is_left_as_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _leases = granted(dir, 2);
    let before = std::fs::read(record_path(dir)).unwrap();
    let out = mend(dir);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to mend"),
        "{}",
        describe(&out)
    );
    assert_eq!(std::fs::read(record_path(dir)).unwrap(), before);
}

/// The mend waits for the id's transition lock: while another process holds `<stem>.lock`
/// (here the test itself, as a transition would), nothing is written; once it is let go, the
/// mend goes on. (The "nothing yet" half is a look after 300 ms: a mend that skipped the lock
/// would have written within it.)
#[test]
fn the_mend_runs_under_the_transition_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _leases = granted(dir, 2);
    fifo_over_record(dir);
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join(format!("{}.lock", id().stem())))
        .unwrap();
    lock.lock().unwrap();
    let child = std::process::Command::new(bin())
        .args(["mend", "--dir", dir.to_str().unwrap(), "--id", ID])
        .args(["--at-least", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(record_path(dir))
            .unwrap()
            .file_type()
            .is_fifo(),
        "mended while the transition lock was held"
    );
    lock.unlock().unwrap();
    let out = output_of(child);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(read_record(dir).token, 2);
}
