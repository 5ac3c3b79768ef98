//! Bad input gets a clear, typed error and touches nothing outside the lease directory.

use crate::support;

use std::fs;
use std::path::Path;

use flocklease::conformance::START;
use flocklease::error::InvalidInput;
use flocklease::{Error, ManualClock, Owner, SessionId};
use support::open_manual;

/// Every path under `root`, sorted.
fn tree(root: &Path) -> Vec<String> {
    let mut out = vec![];
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p.strip_prefix(root).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn hostile_ids_stay_inside_the_lease_directory() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("leases");
    fs::create_dir(&dir).unwrap();
    fs::write(root.path().join("passwd"), b"root:x:0:0").unwrap();
    let clock = ManualClock::new(START);
    let leases = open_manual(&dir, &clock);
    let before = tree(root.path());
    for raw in [
        "a/b",
        "../passwd",
        "../../etc/passwd",
        "..",
        ".",
        "/abs/path",
        "x/../../y",
        "héllo wörld",
        &"z".repeat(1024),
    ] {
        let id = SessionId::new(raw).unwrap();
        let lease = leases
            .acquire(&id, &Owner::new("o").unwrap())
            .unwrap()
            .lease()
            .unwrap();
        leases.release(&lease).unwrap();
        let stem = id.stem();
        assert!(
            !stem.contains('/') && !stem.contains('.') && stem.len() <= 57,
            "{stem}"
        );
    }
    // Only new files directly inside the lease directory.
    let after = tree(root.path());
    for p in after.iter().filter(|p| !before.contains(p)) {
        let rel = Path::new(p);
        assert_eq!(
            rel.parent(),
            Some(Path::new("leases")),
            "{p} outside the lease directory"
        );
        assert!(!root.path().join(p).is_dir(), "{p} is a new directory");
    }
    assert_eq!(fs::read(root.path().join("passwd")).unwrap(), b"root:x:0:0");
}

#[test]
fn invalid_ids_and_owners_are_typed_errors() {
    assert_eq!(
        SessionId::new("a\0b"),
        Err(InvalidInput::ControlCharacter {
            what: "session id",
            at: 1
        })
    );
    assert_eq!(
        SessionId::new("x".repeat(10_000)),
        Err(InvalidInput::TooLong {
            what: "session id",
            len: 10_000,
            max: 1024
        })
    );
    assert_eq!(
        SessionId::new(""),
        Err(InvalidInput::Empty { what: "session id" })
    );
    assert_eq!(Owner::new(""), Err(InvalidInput::Empty { what: "owner" }));
    assert!(matches!(
        Owner::new("line\nbreak"),
        Err(InvalidInput::ControlCharacter { .. })
    ));
    // They convert into the crate's error, with a readable message.
    let e: Error = Owner::new("").unwrap_err().into();
    assert_eq!(e.to_string(), "invalid input: owner is empty");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn errors_name_their_file_and_chain_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let leases = open_manual(dir.path(), &clock);
    let id = SessionId::new("s").unwrap();
    let record = dir.path().join(format!("{}.lease.json", id.stem()));
    fs::write(
        &record,
        b"{\"owner\":\"a\",\"token\":1.5,\"expiry\":\"2023-11-14T22:13:50Z\"}",
    )
    .unwrap();
    let err = leases.acquire(&id, &Owner::new("o").unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("corrupt lease record {}", record.display())),
        "{err}"
    );
    assert!(std::error::Error::source(&err).is_some());
    // A directory where the record should be is not a file.
    fs::remove_file(&record).unwrap();
    fs::create_dir(&record).unwrap();
    let err = leases.acquire(&id, &Owner::new("o").unwrap()).unwrap_err();
    assert!(matches!(err, Error::NotAFile { .. }), "{err}");
}
