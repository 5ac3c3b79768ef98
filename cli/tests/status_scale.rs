//! `flocklease status` streams: its memory does not grow with the number of ids in the
//! directory. One test in a binary of its own: it reads the peak memory of its children.

#![allow(clippy::unwrap_used)]

#[path = "cli/cli_support.rs"]
mod cli_support;

use std::path::Path;
use std::process::{Command, Stdio};

use cli_support::*;
use flocklease::{Durability, FlockLease, Owner, SessionId};
use nix::sys::resource::{UsageWho, getrusage};

fn populate(dir: &Path, n: usize) {
    let leases = FlockLease::builder(dir)
        .durability(Durability::NoSync)
        .open()
        .unwrap();
    let me = Owner::new("me").unwrap();
    for i in 0..n {
        let id = SessionId::new(format!("scale-{i}")).unwrap();
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    }
}

/// Runs `status --dir DIR ARGS` to its end; returns the number of lines it printed and the
/// peak resident size of the largest child so far, in KiB.
fn status(dir: &Path, args: &[&str]) -> (usize, i64) {
    // Into a file: a pipe nobody reads before the exit would fill.
    let out = tempfile::tempfile().unwrap();
    let child = Command::new(BIN)
        .arg("status")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = output_of(child);
    assert!(done.status.success(), "{}", describe(&done));
    let mut printed = vec![];
    std::io::Seek::rewind(&mut &out).unwrap();
    std::io::Read::read_to_end(&mut &out, &mut printed).unwrap();
    let lines = printed.iter().filter(|&&b| b == b'\n').count();
    (
        lines,
        getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss(),
    )
}

#[test]
fn status_memory_does_not_grow_with_the_number_of_ids() {
    let small = tempfile::tempdir().unwrap();
    let large = tempfile::tempdir().unwrap();
    populate(small.path(), 100);
    populate(large.path(), 20_000);
    status(small.path(), &[]);
    let (_, base) = status(small.path(), &["--json"]);
    let (lines, text) = status(large.path(), &[]);
    assert_eq!(lines, 20_001, "a header and one line per id");
    let (_, json) = status(large.path(), &["--json"]);
    // Holding 20 000 rows took about 14 MiB; streamed, the peak stays that of 100 ids.
    for (what, peak) in [("text", text), ("json", json)] {
        assert!(
            peak < base + 4 * 1024,
            "status {what} over 20 000 ids peaked at {peak} KiB, over 100 ids at {base} KiB"
        );
    }
}
