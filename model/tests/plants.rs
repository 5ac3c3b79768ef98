//! Mistakes planted in the library's own source, one at a time, each caught by the model
//! checker: the model runs the program, so a mistake in it fails `check`.
//!
//! Each plant copies the workspace's tracked files (as they are in the working tree) into a
//! scratch directory, replaces one exact piece of source text there (the test fails if the text
//! is not found exactly once, so a plant cannot silently stop applying), builds the model
//! checker and runs one configuration, which must fail with the named property violated.
//!
//! A build per plant takes about a minute on two cores, so the test is ignored by default:
//! `cargo test -p flocklease-model --release --test plants -- --ignored --nocapture`. Its
//! builds share `target/plants` (kept between runs).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use flocklease_model::line::IN_ORDER;
use flocklease_model::program::{self, AT_ONCE, DURABLE, FENCED, NAMED, ONE_HOLDER};
use flocklease_model::resource::{ANSWERS, BESIDE, EXACT, NEVER_BACK, NO_STALE_WRITE, RETURNS};
use flocklease_model::threads::{COUNTED, ONE_TURN, TAKEN, WOKEN};

/// One planted mistake.
struct Plant {
    /// What it is.
    name: &'static str,
    /// The file it is planted in, from the workspace's root.
    file: &'static str,
    /// The text replaced (exactly once).
    from: &'static str,
    /// The text put there.
    to: &'static str,
    /// The configuration that must catch it.
    config: &'static str,
    /// The properties of which at least one must be violated.
    caught_by: &'static [&'static str],
}

/// The fence's likeliest mistakes (src/fence.rs), and the mutants of it that passed the
/// other properties.
const PLANTS: &[Plant] = &[
    Plant {
        name: "write_file renames its target without checking its admission again",
        file: "src/fence.rs",
        from: "                    self.still_admits(token, lock)\n",
        to: "                    { let _ = lock; Ok(Ok(())) }\n",
        config: "resource-fence",
        caught_by: &[NO_STALE_WRITE],
    },
    Plant {
        name: "recording a token checks the lock's identity, not that the fence file is as read",
        file: "src/fence.rs",
        from: "            if now != read {\n",
        to: "            if false && now != read {\n",
        config: "resource-fence",
        caught_by: &[NEVER_BACK, NO_STALE_WRITE],
    },
    Plant {
        name: "the two checks before the fence file's rename in the other order",
        file: "src/fence.rs",
        from: "            let here = self.fs.still_at(lock, &self.lock_path)?;\n            let now = self.highest()?;\n",
        to: "            let now = self.highest()?;\n            let here = self.fs.still_at(lock, &self.lock_path)?;\n",
        config: "resource-fence",
        caught_by: &[NEVER_BACK, NO_STALE_WRITE],
    },
    Plant {
        name: "a refused token is let through (admitted, not recorded)",
        file: "src/fence.rs",
        from: "            FenceStep::Refuse { highest } => return Ok(Err(highest)),\n",
        to: "            FenceStep::Refuse { .. } => {}\n",
        config: "resource-fence",
        caught_by: &[EXACT, NO_STALE_WRITE],
    },
    Plant {
        name: "recording a token refuses when its lock is in place (the check's sense inverted)",
        file: "src/fence.rs",
        from: "                return Ok(Err(now));\n            }\n            if !here {\n",
        to: "                return Ok(Err(now));\n            }\n            if here {\n",
        config: "resource-fence",
        caught_by: &[ANSWERS],
    },
    Plant {
        name: "the token already recorded is refused (safe, and wrong: the holder's own second write)",
        file: "src/fence.rs",
        from: "        let previous = self.highest()?;\n",
        to: "        let previous = self.highest()?;\n        if previous == Some(token) {\n            return Ok(Err(token));\n        }\n",
        config: "resource-fence",
        caught_by: &[EXACT],
    },
    Plant {
        name: "a fence file's token of several digits read as having a leading zero",
        file: "src/fence.rs",
        from: "    if digits.len() > 1 && digits[0] == b'0' {\n",
        to: "    if digits.len() > 1 && digits[0] != b'0' {\n",
        config: "resource-fence",
        caught_by: &[ANSWERS],
    },
    Plant {
        name: "every path's directory read as the working directory (a bare name's rule for all)",
        file: "src/fence.rs",
        from: "    let dir = match path.parent() {\n        Some(p) if !p.as_os_str().is_empty() => p,\n",
        to: "    let dir = match path.parent() {\n        Some(p) if false => p,\n",
        config: "resource-fence",
        caught_by: &[BESIDE],
    },
    Plant {
        name: "the fence's lock not given back (only closing the descriptor would; a forked copy keeps it)",
        file: "src/fence.rs",
        from: "        let _ = self.fs.hook(FaultPoint::UnlockFence, &self.lock_path);\n        self.fs.unlock(lock);\n",
        to: "        let _ = lock;\n",
        config: "resource-fence",
        caught_by: &[RETURNS],
    },
];

/// The line's rule (src/line.rs), caught by the line of waiting acquires (`line`).
const LINE_PLANTS: &[Plant] = &[
    Plant {
        name: "a waiter's look always lets it try (no order at all)",
        file: "src/line.rs",
        from: "        if self.turn(&mut held) {\n            return true;\n        }\n        yielded.seen(token);\n",
        to: "        if true {\n            return true;\n        }\n        yielded.seen(token);\n",
        config: "line",
        caught_by: &[IN_ORDER],
    },
    Plant {
        name: "a new count forgets the pass-over only to byte 1 (the file's first places passed)",
        file: "src/line.rs",
        from: "            self.after = -1;\n        }\n        if !yielded.grace_over(now) {\n",
        to: "            self.after = 1;\n        }\n        if !yielded.grace_over(now) {\n",
        config: "line",
        caught_by: &[IN_ORDER],
    },
];

/// The front's turn (src/front.rs `GateState`), caught by the threads of one instance
/// (`threads`), which run its rules.
const TURN_PLANTS: &[Plant] = &[
    Plant {
        name: "leaving the turn wakes nobody (a waiter sleeps to its deadline)",
        file: "src/front.rs",
        from: "        self.waiting > 0\n",
        to: "        self.waiting < 0\n",
        config: "threads",
        caught_by: &[WOKEN],
    },
    Plant {
        name: "a waiter that woke is counted again rather than no longer",
        file: "src/front.rs",
        from: "        self.waiting -= 1;\n",
        to: "        self.waiting += 1;\n",
        config: "threads",
        caught_by: &[COUNTED],
    },
    Plant {
        name: "the turn taken even when another call has it",
        file: "src/front.rs",
        from: "        let free = !self.busy;\n",
        to: "        let free = true;\n",
        config: "threads",
        caught_by: &[ONE_TURN],
    },
    Plant {
        name: "leaving the turn does not free it",
        file: "src/front.rs",
        from: "    pub fn leave(&mut self) -> bool {\n        self.busy = false;\n",
        to: "    pub fn leave(&mut self) -> bool {\n",
        config: "threads",
        caught_by: &[TAKEN],
    },
];

/// The flock adapter's (src/flock/tx.rs, src/flock/live.rs) and the front's lock loop
/// (src/front.rs), caught by the configuration that runs them (`flock-program`).
const FLOCK_PLANTS: &[Plant] = &[
    Plant {
        name: "the commit check passes whatever stands at the lock's path",
        file: "src/flock/tx.rs",
        from: ".map_err(|_| Error::LockReplaced { path: lock.clone() })",
        to: ".map_err(|_| Error::LockReplaced { path: lock.clone() }).or(Ok(()))",
        config: "flock-program",
        caught_by: &[ONE_HOLDER, NAMED, FENCED],
    },
    Plant {
        name: "the probe calls the generation's file dead without trying its lock",
        file: "src/flock/tx.rs",
        from: "Ok(live::probe(found, &path, |f| self.dir.holder_gone(f))?.liveness)",
        to: "Ok(live::probe(found, &path, |_| Ok(true))?.liveness)",
        config: "flock-program",
        caught_by: &[ONE_HOLDER, NAMED, FENCED],
    },
    Plant {
        name: "a renew never publishes its generation's file again once it is gone",
        file: "src/flock/tx.rs",
        from: "            Ok(_) => {}
            Err(e) => return Err(Error::io(\"stat\", &path, e)),",
        to: "            Ok(_) => return Ok(()),
            Err(e) => return Err(Error::io(\"stat\", &path, e)),",
        config: "flock-program",
        caught_by: &[AT_ONCE],
    },
    Plant {
        name: "a takeover's sweep deletes the new generation's file, not the dead one's",
        file: "src/flock/tx.rs",
        from: "        if let Some(dead) = below.checked_sub(1) {",
        to: "        if let Some(dead) = Some(below) {",
        config: "flock-program",
        caught_by: &[AT_ONCE],
    },
    Plant {
        name: "the listing sweeps the generation at its bound too",
        file: "src/flock/tx.rs",
        from: "live_token(rest).is_some_and(|t| t < below)",
        to: "live_token(rest).is_some_and(|t| t <= below)",
        config: "flock-program",
        caught_by: &[AT_ONCE],
    },
    Plant {
        name: "a commit skips the directory's fsync after the rename",
        file: "src/flock/tx.rs",
        from: "        self.dir.sync_dir().map_err",
        to: "        Ok::<(), io::Error>(()).map_err",
        config: "flock-program",
        caught_by: &[DURABLE],
    },
    Plant {
        name: "a commit skips the temporary record's fsync before the rename",
        file: "src/flock/tx.rs",
        from: "self.dir.sync(tmp).map_err(|e| Error::io(\"fsync\", path, e))",
        to: "{ let _ = tmp; Ok(()) }",
        config: "flock-program",
        caught_by: &[DURABLE],
    },
    Plant {
        name: "the front's lock loop gives up when the file it locked is not at the path",
        file: "src/front.rs",
        from: "        if deadline.is_some_and(|d| Instant::now() >= d) {",
        to: "        if deadline.is_some_and(|d| Instant::now() >= d) || true {",
        config: "flock-program",
        caught_by: &[program::ANSWERS],
    },
    Plant {
        name: "the registry prunes an entry in use (keeps only one both shared and in use)",
        file: "src/front.rs",
        from: "    shared || !idle\n",
        to: "    shared && !idle\n",
        config: "flock-program",
        caught_by: &[program::PRUNED],
    },
    Plant {
        name: "a slot is never idle (the registry never prunes the id: memory grows with ids)",
        file: "src/flock/tx.rs",
        from: "        self.local.is_none() && !self.owes_sweep()\n",
        to: "        false\n",
        config: "flock-program",
        caught_by: &[program::PRUNED],
    },
    Plant {
        name: "a probe's judgement calls a held file dead",
        file: "src/flock/live.rs",
        from: "(if gone { Liveness::Dead } else { Liveness::Live }, None)",
        to: "(Liveness::Dead, None)",
        config: "flock-program",
        caught_by: &[ONE_HOLDER, NAMED, FENCED],
    },
    Plant {
        name: "a release keeps its generation's liveness file open (and locked)",
        file: "src/flock/tx.rs",
        from: ".is_some_and(|g| g.local.token == token)",
        to: ".is_some_and(|g| g.local.token != token)",
        config: "flock-program",
        caught_by: &[program::GIVEN_BACK],
    },
    Plant {
        name: "a transition's end never unlocks the transition lock (its descriptor is kept)",
        file: "src/flock/tx.rs",
        from: "self.st.unlocked = self.dir.unlock(self.stable).is_ok();",
        to: "self.st.unlocked = true;",
        config: "flock-program",
        caught_by: &[program::GIVEN_BACK, program::PROGRESS],
    },
    Plant {
        name: "the held flag read the wrong way round",
        file: "src/flock/tx.rs",
        from: ".is_some_and(|expiry| !machine::is_expired(expiry, now)),",
        to: ".is_some_and(|expiry| machine::is_expired(expiry, now)),",
        config: "flock-program",
        caught_by: &[program::HELD_FLAG],
    },
    Plant {
        name: "a failed commit's undo does nothing (its temporary record stays)",
        file: "src/flock/tx.rs",
        from: "    fn undo(&mut self, pending: Option<PendingLive<D::File>>) {\n",
        to: "    fn undo(&mut self, pending: Option<PendingLive<D::File>>) {\n        if true { return; }\n",
        config: "flock-program",
        caught_by: &[program::NO_LEFTOVER],
    },
    Plant {
        name: "a failed step before the temporary record's write leaves the file behind",
        file: "src/flock/tx.rs",
        from: "        self.st.temp = Some((tmp, path));\n        written\n",
        to: "        if written.is_ok() { self.st.temp = Some((tmp, path)); }\n        written\n",
        config: "flock-program",
        caught_by: &[program::NO_LEFTOVER],
    },
];

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Copies the workspace's tracked files to `to`.
fn copy_workspace(to: &Path) {
    let root = root();
    let listed = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .unwrap();
    assert!(listed.status.success(), "git ls-files failed");
    for name in listed.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = Path::new(std::str::from_utf8(name).unwrap());
        let from = root.join(name);
        if !from.is_file() {
            continue; // deleted in the working tree
        }
        let dest = to.join(name);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&from, &dest).unwrap();
    }
}

/// Builds the model checker in `tree` and runs `check --config config`: whether it passed,
/// and its output.
fn check(tree: &Path, config: &str) -> (bool, String) {
    let target = root().join("target").join("plants");
    let built = Command::new(env!("CARGO"))
        .current_dir(tree)
        .env("CARGO_TARGET_DIR", &target)
        // Incremental: a plant changes one function, and a release build of the library from
        // scratch was most of each plant's time.
        .env("CARGO_PROFILE_RELEASE_INCREMENTAL", "true")
        .args(["build", "--quiet", "--release", "--locked"])
        .args(["-p", "flocklease-model", "--bin", "flocklease-model"])
        .status()
        .unwrap();
    assert!(built.success(), "the planted tree does not build");
    let out = Command::new(target.join("release").join("flocklease-model"))
        .args(["check", "--config", config])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The verdict line of property `name` in `check`'s output.
fn violated(output: &str, name: &str) -> bool {
    output
        .lines()
        .any(|l| l.contains(name) && l.contains("VIOLATED"))
}

#[test]
#[ignore = "a build per plant: run with --ignored"]
fn every_planted_mistake_fails_check() {
    let scratch = tempfile::tempdir().unwrap();
    let tree = scratch.path().join("tree");
    copy_workspace(&tree);
    // The tree as it is passes first: a check that fails anyway would prove nothing.
    for config in ["resource-fence", "line", "threads", "flock-program"] {
        let (ok, out) = check(&tree, config);
        assert!(ok, "the unplanted tree fails {config}:\n{out}");
    }
    for plant in PLANTS
        .iter()
        .chain(LINE_PLANTS)
        .chain(TURN_PLANTS)
        .chain(FLOCK_PLANTS)
    {
        let file = tree.join(plant.file);
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            text.matches(plant.from).count(),
            1,
            "{}: the planted text is not found exactly once in {}",
            plant.name,
            plant.file
        );
        std::fs::write(&file, text.replacen(plant.from, plant.to, 1)).unwrap();
        let (ok, out) = check(&tree, plant.config);
        std::fs::write(&file, &text).unwrap();
        let caught: Vec<&str> = plant
            .caught_by
            .iter()
            .copied()
            .filter(|p| violated(&out, p))
            .collect();
        eprintln!("{}: caught by {caught:?}", plant.name);
        assert!(
            !ok && !caught.is_empty(),
            "{} passed `check --config {}`:\n{out}",
            plant.name,
            plant.config
        );
    }
}
