//! `FlockLease`-specific behaviour: the flock semantics it relies on, the hardening of
//! PROTOCOL §1.3, §2.2, §4 and §6, and the file layout. Conformance cases live in
//! `conformance.rs`.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs::{self, File, OpenOptions, TryLockError};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::fault::FaultPoint;
use flocklease::{Error, FlockLease, Grant, ManualClock, Record, record};
use support::{RoleChild, files_ending, hear, id, open_manual, open_real, owner, role, tell};

const ENTRY: &str = "child_entry";

/// Child roles. `hold DIR ID OWNER`: acquire, report, then obey `renew` / `release` lines until
/// stdin closes, and exit without releasing. `spawn-and-hold DIR ID OWNER`: acquire, start a
/// long-running program, report both, wait.
#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    let leases = open_real(Path::new(&args[0]), Duration::from_secs(60));
    let (sid, who) = (id(&args[1]), owner(&args[2]));
    let lease = match leases.acquire(&sid, &who).expect("child acquire") {
        Grant::Granted(l) => l,
        Grant::Held => {
            tell("held");
            return;
        }
    };
    match role.as_str() {
        "hold" => tell(&format!("token {}", lease.token)),
        "spawn-and-hold" => {
            // Deliberately not waited for: it must outlive this process.
            #[allow(clippy::zombie_processes)]
            let sleeper = std::process::Command::new("sleep")
                .arg("600")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("spawn sleep");
            tell(&format!("token {} pid {}", lease.token, sleeper.id()));
        }
        other => panic!("unknown role {other}"),
    }
    while let Some(cmd) = hear() {
        match cmd.as_str() {
            "renew" => match leases.renew(&lease).expect("child renew") {
                Grant::Granted(l) => tell(&format!("granted {}", l.token)),
                Grant::Held => tell("held"),
            },
            "" => {}
            "release" => {
                leases.release(&lease).expect("child release");
                tell("released");
            }
            other => panic!("unknown command {other}"),
        }
    }
}

fn live_path(dir: &Path, sid: &str, token: u64) -> std::path::PathBuf {
    dir.join(format!("{}.{token}.live", id(sid).stem()))
}

fn record_path(dir: &Path, sid: &str) -> std::path::PathBuf {
    dir.join(format!("{}.lease.json", id(sid).stem()))
}

fn lock_path(dir: &Path, sid: &str) -> std::path::PathBuf {
    dir.join(format!("{}.lock", id(sid).stem()))
}

fn read_record(dir: &Path, sid: &str) -> Record {
    record::decode(&fs::read(record_path(dir, sid)).expect("read record")).expect("decode")
}

/// Every regular `.live` file in `dir` can be locked: no generation lock was leaked.
fn assert_no_locked_live_file(dir: &Path) {
    for name in files_ending(dir, ".live") {
        let path = dir.join(&name);
        if fs::symlink_metadata(&path).unwrap().is_file() {
            let f = File::open(&path).unwrap();
            f.try_lock()
                .unwrap_or_else(|e| panic!("{name} is still locked: {e:?}"));
        }
    }
}

// ---- the flock(2) behaviour the design relies on ----

#[test]
fn flock_two_opens_in_one_process_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let a = File::create(&path).unwrap();
    let b = OpenOptions::new().read(true).open(&path).unwrap();
    a.try_lock().unwrap();
    assert!(matches!(b.try_lock(), Err(TryLockError::WouldBlock)));
    drop(a);
    b.try_lock()
        .expect("free once the first description is closed");
}

#[test]
fn flock_is_dropped_when_the_holder_process_dies() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut child = RoleChild::spawn(ENTRY, "hold", &[d, "s", "child"]);
    let line = child.line();
    assert_eq!(line, "token 1");
    let probe = File::open(live_path(dir.path(), "s", 1)).unwrap();
    assert!(matches!(probe.try_lock(), Err(TryLockError::WouldBlock)));
    let leases = open_real(dir.path(), Duration::from_secs(60));
    assert!(
        leases
            .acquire(&id("s"), &owner("parent"))
            .unwrap()
            .is_held()
    );
    child.kill();
    // The kernel drops the lock as it tears the process down (which may finish just after the
    // parent reaped it): a waiting acquire returns the moment it does, long before expiry.
    let lease = leases
        .acquire_wait(&id("s"), &owner("parent"), Duration::from_secs(10))
        .expect("takeover after SIGKILL")
        .lease()
        .expect("granted before the deadline");
    assert_eq!(lease.token, 2);
    assert!(
        !live_path(dir.path(), "s", 1).exists(),
        "the dead generation's file is swept"
    );
}

#[test]
fn liveness_lock_is_not_inherited_by_spawned_programs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let mut child = RoleChild::spawn(ENTRY, "spawn-and-hold", &[d, "s", "child"]);
    let line = child.line();
    let sleeper: i32 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    child.kill();
    let leases = open_real(dir.path(), Duration::from_secs(60));
    let got = leases.acquire_wait(&id("s"), &owner("parent"), Duration::from_secs(10));
    // Whatever the outcome, do not leave the sleeper behind.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleeper),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_eq!(
        got.ok().and_then(Grant::lease).map(|l| l.token),
        Some(2),
        "the grandchild kept the lock"
    );
}

// ---- PROTOCOL §1.3, §2.2, §4, §6: hardening ----

#[test]
fn corrupt_record_is_a_typed_error_that_writes_nothing_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let leases = open_manual(dir.path(), &clock);
    for bad in [
        &b""[..],
        b"null",
        b"{\"owner\":\"a\",\"token\":-1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
        b"{\"owner\":\"a\",\"token\":1}",
        b"{\"owner\":\"a\",\"token\":1,\"expiry\":\"soon\"}",
    ] {
        fs::write(record_path(dir.path(), "s"), bad).unwrap();
        let err = leases.acquire(&id("s"), &owner("a")).unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        assert_eq!(err.path(), Some(record_path(dir.path(), "s").as_path()));
        assert!(err.to_string().contains(".lease.json"), "{err}");
        assert_eq!(fs::read(record_path(dir.path(), "s")).unwrap(), bad);
        assert!(files_ending(dir.path(), ".live").is_empty());
        assert!(files_ending(dir.path(), ".tmp").is_empty());
        // The stable lock was released.
        let lock = File::open(lock_path(dir.path(), "s")).unwrap();
        lock.try_lock().expect("stable lock leaked");
    }
    let mut big =
        b"{\"owner\":\"a\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\",\"x\":\"".to_vec();
    big.resize(record::MAX_RECORD_BYTES + 10, b'x');
    fs::write(record_path(dir.path(), "s"), &big).unwrap();
    assert!(matches!(
        leases.acquire(&id("s"), &owner("a")),
        Err(Error::Corrupt { .. })
    ));
}

#[test]
fn replaced_stable_lock_file_is_detected_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = lock_path(dir.path(), "s");
    // (done, the replacement file locked by "another transition")
    let replacement: Arc<Mutex<(bool, Option<File>)>> = Arc::default();
    let hook_slot = Arc::clone(&replacement);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, p| {
        let mut slot = hook_slot.lock().unwrap();
        if point == FaultPoint::LockStable && !slot.0 {
            // Between open and lock, an operator replaces the lock file and another
            // transition locks the new one.
            fs::remove_file(p).unwrap();
            let f = File::create(p).unwrap();
            f.try_lock().unwrap();
            *slot = (true, Some(f));
        }
        None
    });
    let leases = FlockLease::builder(dir.path())
        .faults(hook)
        .lock_timeout(Duration::from_millis(200))
        .open()
        .unwrap();
    // Without the inode check this would lock the unlinked file and run concurrently.
    let err = leases.acquire(&id("s"), &owner("a")).unwrap_err();
    assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
    assert_eq!(err.path(), Some(path.as_path()));
    assert!(!record_path(dir.path(), "s").exists());
    // Once the other transition is done, the new file is used.
    replacement.lock().unwrap().1.take();
    assert!(
        leases
            .acquire(&id("s"), &owner("a"))
            .unwrap()
            .lease()
            .is_some()
    );
}

#[test]
fn a_lock_file_deleted_between_its_open_and_its_lock_is_opened_again_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = lock_path(dir.path(), "s");
    let deleted = Arc::new(Mutex::new(false));
    let hook_deleted = Arc::clone(&deleted);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, p| {
        let mut deleted = hook_deleted.lock().unwrap();
        if point == FaultPoint::LockStable && !*deleted {
            // A tmp cleaner deletes the lock file the transition has just opened.
            fs::remove_file(p).unwrap();
            *deleted = true;
        }
        None
    });
    let leases = FlockLease::builder(dir.path()).faults(hook).open().unwrap();
    // The attempt locks the deleted file, sees it is not the one at the path, and the front's
    // begin-or-wait loop tries again at once: a new lock file, taken well within the deadline.
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(lease.token, 1);
    assert!(*deleted.lock().unwrap() && path.exists());
}

#[test]
fn a_missing_liveness_file_is_not_proof_of_death_and_probing_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    let b = open_manual(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    drop(a); // the holder is gone ...
    fs::remove_file(live_path(dir.path(), "s", 1)).unwrap(); // ... and so is its file
    assert!(b.acquire(&id("s"), &owner("b")).unwrap().is_held());
    assert!(
        files_ending(dir.path(), ".live").is_empty(),
        "the probe created a file"
    );
    clock.set(lease.expiry);
    let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert_eq!(taken.token, 2);
}

#[test]
fn renew_restores_its_deleted_liveness_file() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    let b = open_manual(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    fs::remove_file(live_path(dir.path(), "s", 1)).unwrap();
    let lease = a.renew(&lease).unwrap().lease().expect("renew");
    assert!(live_path(dir.path(), "s", 1).exists(), "not restored");
    // The restored file is locked by the holder: probing it says live.
    let probe = File::open(live_path(dir.path(), "s", 1)).unwrap();
    assert!(matches!(probe.try_lock(), Err(TryLockError::WouldBlock)));
    drop(probe);
    assert!(b.acquire(&id("s"), &owner("b")).unwrap().is_held());
    // And it is still the holder's: when the holder goes, takeover is immediate.
    drop(a);
    let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert!(taken.token > lease.token);
}

#[test]
fn symlinks_are_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("victim");
    fs::write(&target, b"precious").unwrap();
    let clock = ManualClock::new(START);
    let paths: [fn(&Path) -> std::path::PathBuf; 3] = [
        |d| record_path(d, "s"),
        |d| lock_path(d, "s"),
        |d| live_path(d, "s", 1),
    ];
    for path_in in paths {
        let dir = tempfile::tempdir().unwrap();
        let path = path_in(dir.path());
        symlink(&target, &path).unwrap();
        let leases = open_manual(dir.path(), &clock);
        let err = leases.acquire(&id("s"), &owner("a")).unwrap_err();
        assert!(matches!(err, Error::Symlink { .. }), "{path:?}: {err}");
        assert_eq!(err.path(), Some(path.as_path()));
        assert!(err.to_string().contains("symbolic link"));
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        // Nothing committed: the record is absent or still the planted link.
        let rec = fs::symlink_metadata(record_path(dir.path(), "s"));
        assert!(rec.map(|m| m.file_type().is_symlink()).unwrap_or(true));
        assert_no_locked_live_file(dir.path());
    }
    // The temporary record file too: each transition creates its own under a name of its
    // own, exclusively, so a link (or any file) planted at the name older versions used is
    // never followed or reused (it stays until a takeover's sweep removes it).
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir
        .path()
        .join(format!("{}.lease.json.tmp", id("t").stem()));
    for planted in ["link", "file"] {
        // The previous round's plant stays at the name (writing through it would follow it).
        let _ = fs::remove_file(&tmp);
        match planted {
            "link" => symlink(&target, &tmp).unwrap(),
            _ => fs::write(&tmp, b"{\"owner\":\"evil\",\"token\":99").unwrap(),
        }
        let leases = open_manual(dir.path(), &clock);
        let l = leases
            .acquire(&id("t"), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        assert_eq!(read_record(dir.path(), "t").owner, "a", "{planted}");
        assert_eq!(read_record(dir.path(), "t").token, l.token);
        leases.release(&l).unwrap();
    }
}

#[test]
fn directory_and_file_modes() {
    let parent = tempfile::tempdir().unwrap();
    // Only the last component is created (a missing parent is an error: cli/tests/cli/bad_files.rs).
    let dir = parent.path().join("leases");
    let clock = ManualClock::new(START);
    let leases = open_manual(&dir, &clock);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    let _ = leases.acquire(&id("s"), &owner("a")).unwrap();
    for p in [
        record_path(&dir, "s"),
        lock_path(&dir, "s"),
        live_path(&dir, "s", 1),
    ] {
        assert_eq!(mode(&p), 0o600, "{p:?}");
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = FlockLease::open(&dir).unwrap_err();
    assert!(
        matches!(err, Error::WorldWritable { mode: 0o777, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("writable by every user"), "{err}");
    assert!(err.to_string().contains("private subdirectory"), "{err}");
    let file = parent.path().join("plain");
    fs::write(&file, b"").unwrap();
    assert!(matches!(
        FlockLease::open(&file),
        Err(Error::NotADirectory { .. })
    ));
}

#[test]
fn orphans_of_crashed_generations_are_swept_by_the_takers_next_transition() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    drop(a);
    // Leftovers of earlier crashes: an old generation's file and a temporary record.
    let stem = id("s").stem().to_owned();
    fs::write(dir.path().join(format!("{stem}.0.live")), b"").unwrap();
    fs::write(dir.path().join(format!("{stem}.lease.json.tmp")), b"{").unwrap();
    // Another id's files are not touched.
    let other = id("other").stem().to_owned();
    fs::write(dir.path().join(format!("{other}.1.live")), b"").unwrap();
    let b = open_manual(dir.path(), &clock);
    let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert_eq!(taken.token, lease.token + 1);
    // The takeover removes the dead generation's file at once; it does not list the
    // directory (its own temporary record has a name of its own), so the older leftovers are
    // still there...
    assert_eq!(
        files_ending(dir.path(), ".live"),
        vec![
            format!("{other}.1.live"),
            format!("{stem}.0.live"),
            format!("{stem}.2.live")
        ]
    );
    assert_eq!(
        files_ending(dir.path(), ".tmp"),
        vec![format!("{stem}.lease.json.tmp")]
    );
    // ...until the taker's next transition on the id, which sweeps it, and a temporary record
    // left meanwhile (a crash in the middle of some transition) too. That transition commits
    // nothing here (another owner is answered held), so no write of its own replaces the
    // temporary record: the listing removes it.
    fs::write(dir.path().join(format!("{stem}.lease.json.tmp")), b"{").unwrap();
    assert!(b.acquire(&id("s"), &owner("x")).unwrap().is_held());
    assert!(files_ending(dir.path(), ".tmp").is_empty());
    assert_eq!(
        files_ending(dir.path(), ".live"),
        vec![format!("{other}.1.live"), format!("{stem}.2.live")]
    );
}

#[test]
fn the_deferred_sweep_never_removes_a_generation_the_record_names_after_tokens_went_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    drop(
        open_manual(dir.path(), &clock)
            .acquire(&id("s"), &owner("a"))
            .unwrap(),
    );
    // A crash takeover leaves the listing below token 2 to the taker's next transition.
    let b = open_manual(dir.path(), &clock);
    let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert_eq!(taken.token, 2);
    // Tokens go back: the record is deleted by hand, and another process starts over at 1.
    fs::remove_file(record_path(dir.path(), "s")).unwrap();
    let c = open_manual(dir.path(), &clock);
    let fresh = c.acquire(&id("s"), &owner("c")).unwrap().lease().unwrap();
    assert_eq!(fresh.token, 1);
    // The taker's next transition runs the listing, capped by the record it reads: the new
    // generation 1, below the takeover's 2, keeps its liveness file and stays alive to others.
    assert!(b.renew(&taken).unwrap().is_held());
    assert!(live_path(dir.path(), "s", 1).exists());
    let d = open_manual(dir.path(), &clock);
    assert!(d.acquire(&id("s"), &owner("d")).unwrap().is_held());
    assert_eq!(read_record(dir.path(), "s").token, 1);
}

#[test]
fn a_stuck_transition_times_out_and_does_not_delay_other_ids() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    // The caller on x says when it is waiting for x's lock; its bound is long, so it can only
    // finish once the stuck transition ends.
    let (tx, waiting) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, path| {
        if point == FaultPoint::LockStable && path.to_string_lossy().contains("/x-") {
            let _ = tx.lock().unwrap().send(());
        }
        None
    });
    let leases = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .lock_timeout(Duration::from_secs(600))
        .faults(hook)
        .open()
        .unwrap();
    // Another "process" is stuck inside a transition on id x.
    let stuck = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(lock_path(dir.path(), "x"))
        .unwrap();
    stuck.lock().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| leases.acquire(&id("x"), &owner("a")));
        waiting.recv().unwrap();
        // Meanwhile id y goes through whole cycles, while the caller on x is still blocked.
        for _ in 0..20 {
            let l = leases
                .acquire(&id("y"), &owner("a"))
                .unwrap()
                .lease()
                .unwrap();
            leases.release(&l).unwrap();
        }
        assert!(
            !waiter.is_finished(),
            "the caller on x returned while x was stuck"
        );
        // A caller with a short bound ends in the typed error naming x's lock file.
        let short = FlockLease::builder(dir.path())
            .clock(Arc::new(clock.clone()))
            .lock_timeout(Duration::from_millis(50))
            .open()
            .unwrap();
        let err = short.acquire(&id("x"), &owner("b")).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        assert_eq!(err.path(), Some(lock_path(dir.path(), "x").as_path()));
        assert!(err.to_string().contains("transition lock"), "{err}");
        drop(stuck);
        assert!(!waiter.join().unwrap().unwrap().is_held());
    });
}

#[test]
fn forty_cycles_leave_no_liveness_file_behind() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let leases = open_manual(dir.path(), &clock);
    for i in 1..=40 {
        let l = leases
            .acquire(&id("s"), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        assert_eq!(l.token, i);
        leases.release(&l).unwrap();
    }
    assert!(files_ending(dir.path(), ".live").is_empty());
    assert!(files_ending(dir.path(), ".tmp").is_empty());
    assert_eq!(read_record(dir.path(), "s").token, 40);
}

#[test]
fn racing_instances_get_exactly_one_grant() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..30 {
        let sid = format!("race-{round}");
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let handles: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let (dir, barrier, sid) =
                    (dir.path().to_owned(), Arc::clone(&barrier), sid.clone());
                thread::spawn(move || {
                    let leases = open_real(&dir, Duration::from_secs(60));
                    barrier.wait();
                    let got = leases.acquire(&id(&sid), &owner(who)).unwrap();
                    (got, leases)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let wins = results.iter().filter(|(g, _)| !g.is_held()).count();
        assert_eq!(wins, 1, "round {round}");
    }
}

#[test]
fn the_record_is_go_compatible_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let leases = open_manual(dir.path(), &clock);
    let l = leases
        .acquire(&id("conf-lease-fresh"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    // The Go package's three keys, in its order and format, then the tag of the generation's
    // liveness file (a key the Go package ignores), which that file carries.
    let bytes = fs::read_to_string(
        dir.path()
            .join("conf-lease-fresh-25bfc77ba4eaaad1.lease.json"),
    )
    .unwrap();
    let tag = bytes
        .strip_prefix(r#"{"owner":"a","token":1,"expiry":"2023-11-14T22:13:50Z","live":""#)
        .and_then(|rest| rest.strip_suffix(r#""}"#))
        .unwrap_or_else(|| panic!("{bytes}"));
    assert!(
        tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
        "{bytes}"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("conf-lease-fresh-25bfc77ba4eaaad1.1.live")).unwrap(),
        tag
    );
    assert!(
        dir.path()
            .join("conf-lease-fresh-25bfc77ba4eaaad1.1.live")
            .exists()
    );
    assert!(
        dir.path()
            .join("conf-lease-fresh-25bfc77ba4eaaad1.lock")
            .exists()
    );
    // A record written by the Go package, with an offset and reordered keys, is understood.
    fs::write(
        dir.path()
            .join("conf-lease-fresh-25bfc77ba4eaaad1.lease.json"),
        r#"{"expiry":"2023-11-14T23:13:50+01:00","token":1,"owner":"a"}"#,
    )
    .unwrap();
    let renewed = leases.renew(&l).unwrap().lease().expect("same generation");
    assert_eq!(renewed.token, 1);
}

#[test]
fn flock_lease_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<FlockLease>();
    check::<flocklease::MemLease>();
}

#[test]
fn calls_on_one_id_from_one_instance_are_serialized() {
    let dir = tempfile::tempdir().unwrap();
    let leases = Arc::new(open_real(dir.path(), Duration::from_secs(60)));
    for round in 0..20 {
        let sid = format!("shared-{round}");
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let (leases, barrier, sid) =
                    (Arc::clone(&leases), Arc::clone(&barrier), sid.clone());
                thread::spawn(move || {
                    barrier.wait();
                    leases.acquire(&id(&sid), &owner(&format!("t{i}"))).unwrap()
                })
            })
            .collect();
        let grants: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            grants.iter().filter(|g| !g.is_held()).count(),
            1,
            "round {round}"
        );
        assert_eq!(read_record(dir.path(), &sid).token, 1);
    }
}

#[test]
fn a_waiting_acquire_wakes_on_release_and_on_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let a = open_real(dir.path(), Duration::from_secs(60));
    // The waiter says when it starts waiting for the holder (after an attempt answered held).
    let (tx, waiting) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, _| {
        if point == FaultPoint::OpenWait {
            let _ = tx.lock().unwrap().send(());
        }
        None
    });
    let b = FlockLease::builder(dir.path())
        .ttl(Duration::from_secs(60))
        .durability(flocklease::Durability::NoSync)
        .faults(hook)
        .open()
        .unwrap();
    let first = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| b.acquire_wait(&id("s"), &owner("b"), Duration::from_secs(20)));
        waiting.recv().unwrap();
        assert!(!waiter.is_finished());
        a.release(&first).unwrap();
        let got = waiter.join().unwrap().unwrap().lease().unwrap();
        assert_eq!(got.token, first.token + 1);
    });
    // A holder that stays alive but stops renewing is waited out until its expiry.
    let short = open_real(dir.path(), Duration::from_millis(150));
    let held = short
        .acquire(&id("t"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let got = b
        .acquire_wait(&id("t"), &owner("b"), Duration::from_secs(20))
        .unwrap()
        .lease()
        .unwrap();
    assert_eq!(got.token, held.token + 1);
    // The waiter had to wait: it went into the wait at least once more.
    assert!(waiting.try_recv().is_ok(), "granted without waiting");
}

#[test]
fn descriptors_stay_bounded_with_many_ids() {
    let dir = tempfile::tempdir().unwrap();
    let leases = open_real(dir.path(), Duration::from_secs(60));
    let fds = || fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    for i in 0..768 {
        let l = leases
            .acquire(&id(&format!("many-{i}")), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        leases.release(&l).unwrap();
    }
    // The instance keeps up to 64 ids' `<stem>.lock` descriptors between transitions; other
    // tests in this binary run concurrently and open files too: allow 64 more.
    let after = fds();
    assert!(after <= before + 64 + 64, "{before} -> {after} descriptors");
    drop(leases);
    assert!(
        fds() <= before + 64,
        "descriptors not closed with the instance"
    );
}

/// A fenced section whose closure forks (a daemonizing helper, without exec) leaves a copy of
/// every descriptor in the child, the transition lock's included. The section gives the lock
/// up by an explicit unlock, not only by closing its descriptor: the holder's next renew and a
/// rival's acquire still get the lock while the child lives.
#[test]
#[allow(unsafe_code)]
fn a_fenced_section_that_forks_does_not_leave_the_transition_lock_taken() {
    use nix::sys::wait::waitpid;
    use nix::unistd::{ForkResult, fork, pipe, read};
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::builder(dir.path())
        .lock_timeout(Duration::from_millis(300))
        .open()
        .unwrap();
    let lease = leases
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let (r, w) = pipe().unwrap();
    let child = leases
        .fenced(&lease, || {
            // SAFETY: the child only reads from a pipe and exits, both async-signal-safe.
            match unsafe { fork() }.unwrap() {
                ForkResult::Child => {
                    // Its own copy of the write end closed, so the parent's close ends it.
                    let _ = nix::unistd::close(w.as_raw_fd());
                    let mut byte = [0u8; 1];
                    let _ = read(&r, &mut byte);
                    unsafe { nix::libc::_exit(0) }
                }
                ForkResult::Parent { child } => child,
            }
        })
        .unwrap()
        .expect("the section ran");
    // The child lives on, holding copies of the descriptors.
    let renewed = leases.renew(&lease);
    let rival = FlockLease::builder(dir.path())
        .lock_timeout(Duration::from_millis(300))
        .open()
        .unwrap()
        .acquire(&id("s"), &owner("b"));
    drop(w);
    waitpid(child, None).unwrap();
    assert!(matches!(renewed, Ok(Grant::Granted(_))), "{renewed:?}");
    assert!(matches!(rival, Ok(Grant::Held)), "{rival:?}");
}
