//! The resource-side fence (`flocklease::Fence`): admission order and persistence, the fenced
//! whole-file write, threads and processes admitting interleaved tokens, and what it refuses
//! (corrupt fence files, symbolic links, special files, unsafe directories, a stuck lock).

use crate::support;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use flocklease::fence::Stale;
use flocklease::{Admission, Error, Fence};
use support::{RoleChild, role, tell};

const ENTRY: &str = "fence::child_entry";

/// The admitter role: `FENCE LOG TOKEN...`. Says `ready`, waits for `go`, then admits each
/// token in turn through [`Fence::with`], appending an admitted token to LOG under the fence's
/// lock; says `refused T H` for each refusal, then `done`.
#[test]
fn child_entry() {
    let Some((_, args)) = role() else { return };
    let fence = Fence::open(&args[0]).unwrap();
    let log = Path::new(&args[1]);
    let tokens: Vec<u64> = args[2..].iter().map(|t| t.parse().unwrap()).collect();
    tell("ready");
    assert_eq!(support::hear().as_deref(), Some("go"));
    for token in tokens {
        match fence.with(token, || append(log, token)).unwrap() {
            Ok(()) => {}
            Err(Stale { token, highest }) => tell(&format!("refused {token} {highest}")),
        }
    }
    tell("done");
}

#[test]
fn lower_tokens_are_refused_equal_and_higher_admitted_and_the_highest_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.fence");
    let fence = Fence::open(&path).unwrap();
    assert_eq!(fence.highest().unwrap(), None);
    assert_eq!(
        fence.admit(5).unwrap(),
        Admission::Admitted { previous: None }
    );
    assert_eq!(
        fence.admit(5).unwrap(),
        Admission::Admitted { previous: Some(5) }
    );
    assert_eq!(fence.admit(4).unwrap(), Admission::Refused { highest: 5 });
    assert_eq!(
        fence.admit(9).unwrap(),
        Admission::Admitted { previous: Some(5) }
    );
    assert_eq!(fence.admit(5).unwrap(), Admission::Refused { highest: 9 });
    assert_eq!(fs::read_to_string(&path).unwrap(), "9\n");
    drop(fence);
    let again = Fence::open(&path).unwrap();
    assert_eq!(again.highest().unwrap(), Some(9));
    assert_eq!(again.admit(8).unwrap(), Admission::Refused { highest: 9 });
    assert_eq!(
        again.admit(u64::MAX).unwrap(),
        Admission::Admitted { previous: Some(9) }
    );
    assert_eq!(
        again.admit(0).unwrap(),
        Admission::Refused { highest: u64::MAX }
    );
    // The files are private, and nothing temporary is left.
    for p in [&path, &dir.path().join("r.fence.lock")] {
        let mode = fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", p.display());
    }
    assert_eq!(names(dir.path()), ["r.fence", "r.fence.lock"]);
}

#[test]
fn a_refused_write_leaves_the_target_untouched_and_an_admitted_one_replaces_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let fence = Fence::open(dir.path().join("out.fence")).unwrap();
    let target = dir.path().join("out.csv");
    assert!(
        fence
            .write_file(2, &target, b"first, long content\n")
            .unwrap()
            .is_admitted()
    );
    assert_eq!(fs::read(&target).unwrap(), b"first, long content\n");
    // A replaced file keeps its permission bits.
    fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
    let before = fs::metadata(&target).unwrap();
    assert_eq!(
        fence.write_file(1, &target, b"stale").unwrap(),
        Admission::Refused { highest: 2 }
    );
    let after = fs::metadata(&target).unwrap();
    assert_eq!(fs::read(&target).unwrap(), b"first, long content\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    // The same token writes again; the new content replaces the old whole (shorter: no tail
    // of the old content remains).
    assert_eq!(
        fence.write_file(2, &target, b"second\n").unwrap(),
        Admission::Admitted { previous: Some(2) }
    );
    assert_eq!(fs::read(&target).unwrap(), b"second\n");
    assert_eq!(
        fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        fence.write_file(3, &target, b"").unwrap(),
        Admission::Admitted { previous: Some(2) }
    );
    assert_eq!(fs::read(&target).unwrap(), b"");
    assert_eq!(fence.highest().unwrap(), Some(3));
    assert_eq!(
        names(dir.path()),
        ["out.csv", "out.fence", "out.fence.lock"]
    );
}

#[test]
fn the_token_is_recorded_before_the_guarded_code_runs_and_a_refusal_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let fence = Fence::open(&path).unwrap();
    let other = Fence::open(&path).unwrap();
    let seen = fence.with(7, || other.highest().unwrap()).unwrap();
    assert_eq!(seen, Ok(Some(7)));
    let mut ran = false;
    let refused = fence.with(6, || ran = true).unwrap();
    assert_eq!(
        refused,
        Err(Stale {
            token: 6,
            highest: 7
        })
    );
    assert!(!ran);
}

/// Issue 33.3: the fence's lock deleted while `write_file(7, …)` holds it, between its
/// admission and its target's rename; `write_file(8, …)` then takes a new lock, admits 8 and
/// writes. Token 7's write must not land over it (it did: the target ended up written by the
/// stale token): the write checks its admission again at the target's commit.
#[test]
fn a_write_whose_lock_was_deleted_never_lands_after_a_greater_admission() {
    use flocklease::fault::{FaultHook, FaultPoint};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let target = dir.path().join("report");
    let lock = dir.path().join("f.lock");
    let armed = Arc::new(AtomicBool::new(true));
    let hook: FaultHook = {
        let (armed, path, target, lock) = (
            Arc::clone(&armed),
            path.clone(),
            target.clone(),
            lock.clone(),
        );
        Arc::new(move |point, at| {
            if point == FaultPoint::Rename && at == target && armed.swap(false, Ordering::SeqCst) {
                fs::remove_file(&lock).unwrap();
                let newer = Fence::open(&path).unwrap();
                assert!(newer.write_file(8, &target, b"8\n").unwrap().is_admitted());
            }
            None
        })
    };
    let fence = Fence::builder(&path).faults(hook).open().unwrap();
    let answer = fence.write_file(7, &target, b"7\n").unwrap();
    assert!(!armed.load(Ordering::SeqCst), "the newer write ran");
    assert_eq!(answer, Admission::Refused { highest: 8 });
    assert_eq!(fs::read(&target).unwrap(), b"8\n");
    assert_eq!(fence.highest().unwrap(), Some(8));
    // Nothing of token 7's write is left behind.
    let left: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A guarded write's temporary file stands beside its target, in the target's own directory
/// (not the fence's, not the working directory): the rename that publishes it stays within one
/// directory of one file system, and that directory is the one fsynced after it.
#[test]
fn a_guarded_writes_temporary_file_stands_beside_its_target() {
    use flocklease::fault::{FaultHook, FaultPoint};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    let target = out.join("report.csv");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let hook: FaultHook = {
        let (seen, out, target) = (Arc::clone(&seen), out.clone(), target.clone());
        Arc::new(move |point, at| {
            if point == FaultPoint::CommitTarget && at == target {
                *seen.lock().unwrap() = names(&out);
            }
            None
        })
    };
    let fence = Fence::builder(dir.path().join("f"))
        .faults(hook)
        .open()
        .unwrap();
    assert!(
        fence
            .write_file(4, &target, b"a,b\n")
            .unwrap()
            .is_admitted()
    );
    let beside = seen.lock().unwrap().clone();
    assert!(
        beside.len() == 1 && beside[0].starts_with(".report.csv.") && beside[0].ends_with(".tmp"),
        "just before the rename the target's directory held {beside:?}"
    );
    assert_eq!(names(&out), ["report.csv"]);
}

/// Found by the model's resource fence (`flocklease-model check --config resource-fence`): the
/// fence's lock moved aside while `admit(1)` holds it (read the fence file, about to record
/// 1); `admit(2)` locks a new file and records 2; the original lock is put back at its name.
/// The first call's check of its lock's identity passes (the same inode) and it recorded 1
/// over 2: the fence went back, and a stale write with token 1 would be admitted again. The
/// store now also checks that the fence file still holds what the call decided on.
#[test]
fn a_lock_moved_aside_and_put_back_never_takes_the_fence_back() {
    use flocklease::fault::{FaultHook, FaultPoint};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let lock = dir.path().join("f.lock");
    let aside = dir.path().join("elsewhere");
    let armed = Arc::new(AtomicBool::new(true));
    let hook: FaultHook = {
        let (armed, path, lock, aside) = (
            Arc::clone(&armed),
            path.clone(),
            lock.clone(),
            aside.clone(),
        );
        Arc::new(move |point, _| {
            if point == FaultPoint::CreateTemp && armed.swap(false, Ordering::SeqCst) {
                fs::rename(&lock, &aside).unwrap();
                let newer = Fence::open(&path).unwrap();
                assert_eq!(
                    newer.admit(2).unwrap(),
                    Admission::Admitted { previous: None }
                );
                fs::rename(&aside, &lock).unwrap();
            }
            None
        })
    };
    let fence = Fence::builder(&path).faults(hook).open().unwrap();
    let answer = fence.admit(1).unwrap();
    assert!(!armed.load(Ordering::SeqCst), "the newer admission ran");
    assert_eq!(answer, Admission::Refused { highest: 2 });
    assert_eq!(fence.highest().unwrap(), Some(2));
    assert_eq!(fence.admit(1).unwrap(), Admission::Refused { highest: 2 });
    let left: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A fence's lock older than an hour is touched when locked, so cleaners that age files by
/// their modification time never choose a lock in use.
#[test]
fn an_old_fence_lock_is_touched_when_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let fence = Fence::open(&path).unwrap();
    let lock = dir.path().join("f.lock");
    let old = std::time::SystemTime::now() - Duration::from_secs(2 * 86_400);
    fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert!(fence.admit(1).unwrap().is_admitted());
    let age = fs::metadata(&lock)
        .unwrap()
        .modified()
        .unwrap()
        .elapsed()
        .unwrap_or_default();
    assert!(age < Duration::from_secs(3600), "the lock is {age:?} old");
}

#[test]
fn threads_admitting_interleaved_tokens_never_admit_one_below_an_earlier_admission() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.fence");
    let shared = Fence::open(&path).unwrap();
    let log = Mutex::new(Vec::new());
    let refusals = Mutex::new(Vec::new());
    const THREADS: u64 = 4;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (shared, log, refusals, path) = (&shared, &log, &refusals, &path);
            s.spawn(move || {
                // Half the threads share one `Fence`, the others open their own.
                let own;
                let fence = if t % 2 == 0 {
                    shared
                } else {
                    own = Fence::open(path).unwrap();
                    &own
                };
                for token in tokens_of(t, THREADS) {
                    let done = fence.with(token, || log.lock().unwrap().push(token));
                    if let Err(stale) = done.unwrap() {
                        refusals.lock().unwrap().push(stale);
                    }
                }
            });
        }
    });
    check_history(
        &log.into_inner().unwrap(),
        &refusals.into_inner().unwrap(),
        shared.highest().unwrap(),
        THREADS,
    );
}

#[test]
fn processes_admitting_interleaved_tokens_never_admit_one_below_an_earlier_admission() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.fence");
    let log = dir.path().join("admitted.log");
    const PROCS: u64 = 3;
    let mut children: Vec<RoleChild> = (0..PROCS)
        .map(|p| {
            let tokens: Vec<String> = tokens_of(p, PROCS).map(|t| t.to_string()).collect();
            let mut args = vec![path.to_str().unwrap(), log.to_str().unwrap()];
            args.extend(tokens.iter().map(String::as_str));
            RoleChild::spawn(ENTRY, "admitter", &args)
        })
        .collect();
    for c in &mut children {
        assert_eq!(c.line(), "ready");
    }
    for c in &mut children {
        c.say("go");
    }
    let mut refusals = Vec::new();
    for mut c in children {
        loop {
            let line = c.line();
            if line == "done" {
                break;
            }
            let words: Vec<u64> = line
                .strip_prefix("refused ")
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .split(' ')
                .map(|w| w.parse().unwrap())
                .collect();
            refusals.push(Stale {
                token: words[0],
                highest: words[1],
            });
        }
        c.finish();
    }
    let admitted: Vec<u64> = fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let highest = Fence::open(&path).unwrap().highest().unwrap();
    check_history(&admitted, &refusals, highest, PROCS);
}

#[test]
fn a_corrupt_fence_file_is_an_error_and_is_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.fence");
    let target = dir.path().join("c.out");
    let fence = Fence::open(&path).unwrap();
    assert!(fence.admit(3).unwrap().is_admitted());
    for bad in [&b"garbage"[..], b"7", b"-1\n", b"07\n", b"7\n8\n", b"\n"] {
        fs::write(&path, bad).unwrap();
        let corrupt = |r: Result<Admission, Error>| match r {
            Err(e @ Error::Corrupt { .. }) => {
                assert_eq!(e.path(), Some(path.as_path()));
                assert!(e.to_string().starts_with("corrupt fence file "), "{e}");
            }
            other => panic!("{bad:?}: {other:?}"),
        };
        corrupt(fence.admit(9));
        corrupt(fence.write_file(9, &target, b"x"));
        corrupt(Fence::open(&path).map(|_| Admission::Refused { highest: 0 }));
        assert!(matches!(fence.highest(), Err(Error::Corrupt { .. })));
        assert!(matches!(fence.with(9, || ()), Err(Error::Corrupt { .. })));
        assert_eq!(fs::read(&path).unwrap(), bad, "the fence file was changed");
        assert!(!target.exists(), "{bad:?}: the target was written");
    }
    // An operator's repair is read as it says.
    fs::write(&path, "12\n").unwrap();
    assert_eq!(fence.admit(11).unwrap(), Admission::Refused { highest: 12 });
}

#[test]
fn symbolic_links_and_special_files_are_refused_and_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    fs::write(&elsewhere, "1\n").unwrap();
    let link = dir.path().join("l.fence");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    assert!(matches!(Fence::open(&link), Err(Error::Symlink { path }) if path == link));
    // A link at the lock's path.
    let path = dir.path().join("k.fence");
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("k.fence.lock")).unwrap();
    assert!(matches!(Fence::open(&path), Err(Error::Symlink { .. })));
    // A link planted at the fence file after it was opened.
    let path = dir.path().join("m.fence");
    let fence = Fence::open(&path).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    assert!(matches!(fence.admit(5), Err(Error::Symlink { .. })));
    assert_eq!(fs::read_to_string(&elsewhere).unwrap(), "1\n");
    // A FIFO or a directory at the fence file's path is not read as "no token" (nor waited on).
    let fifo = dir.path().join("q.fence");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert!(matches!(Fence::open(&fifo), Err(Error::NotAFile { .. })));
    fs::create_dir(dir.path().join("d.fence")).unwrap();
    assert!(matches!(
        Fence::open(dir.path().join("d.fence")),
        Err(Error::NotAFile { .. })
    ));
    // A target that is a link or a directory is refused, and the link's target is untouched.
    let fence = Fence::open(dir.path().join("w.fence")).unwrap();
    let target = dir.path().join("out");
    std::os::unix::fs::symlink(&elsewhere, &target).unwrap();
    assert!(matches!(
        fence.write_file(1, &target, b"x"),
        Err(Error::Symlink { path }) if path == target
    ));
    assert_eq!(fs::read_to_string(&elsewhere).unwrap(), "1\n");
    assert!(matches!(
        fence.write_file(1, dir.path(), b"x"),
        Err(Error::NotAFile { .. })
    ));
    // No path at all.
    assert!(matches!(Fence::open("/"), Err(Error::NotAFile { .. })));
}

#[test]
fn unsafe_or_missing_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        Fence::open(open.join("f")),
        Err(Error::WorldWritable { .. })
    ));
    // A sticky world-writable directory (like /tmp) is accepted.
    fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(
        Fence::open(open.join("f"))
            .unwrap()
            .admit(1)
            .unwrap()
            .is_admitted()
    );
    // A missing directory is an error naming it, and is not created.
    let missing = dir.path().join("missing");
    let e = Fence::open(missing.join("f")).unwrap_err();
    assert_eq!(e.path(), Some(missing.as_path()));
    assert!(!missing.exists());
}

#[test]
fn a_lock_held_for_the_whole_lock_timeout_is_an_error_not_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.fence");
    let fence = Fence::builder(&path)
        .lock_timeout(Duration::from_millis(50))
        .open()
        .unwrap();
    assert!(fence.admit(1).unwrap().is_admitted());
    // Another open file description holds the lock (a stuck writer).
    let stuck = fs::File::open(dir.path().join("s.fence.lock")).unwrap();
    stuck.lock().unwrap();
    match fence.admit(2) {
        Err(Error::LockTimeout {
            lock: flocklease::LockOf::File(path),
            waited,
        }) => {
            assert_eq!(path, dir.path().join("s.fence.lock"));
            assert!(waited >= Duration::from_millis(50));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fence.highest().unwrap(), Some(1));
    drop(stuck);
    assert!(fence.admit(2).unwrap().is_admitted());
}

/// The tokens of admitter `i` of `n`: ascending (one lease after another), each twice (a
/// lease writes more than once), interleaved with the other admitters' (`i`, `i + n`, ...).
fn tokens_of(i: u64, n: u64) -> impl Iterator<Item = u64> {
    (0..60u64).flat_map(move |k| [1 + i + k * n; 2])
}

/// Checks a history of admissions (in the order they ran under the lock) and refusals: no
/// admission below an earlier one; every refusal names a greater token that was admitted;
/// the fence keeps the greatest admitted; every token was answered. (How the admitters
/// interleave is up to the scheduler; the checks hold for every interleaving.)
fn check_history(admitted: &[u64], refusals: &[Stale], highest: Option<u64>, n: u64) {
    for (i, pair) in admitted.windows(2).enumerate() {
        assert!(
            pair[0] <= pair[1],
            "token {} admitted after {} (admissions {}..: {:?})",
            pair[1],
            pair[0],
            i.saturating_sub(4),
            &admitted[i.saturating_sub(4)..(i + 6).min(admitted.len())]
        );
    }
    for r in refusals {
        assert!(r.highest > r.token, "{r:?}");
        assert!(
            admitted.contains(&r.highest),
            "{r:?} names a token never admitted"
        );
    }
    assert_eq!(highest, admitted.iter().copied().max());
    let total: usize = (0..n).map(|i| tokens_of(i, n).count()).sum();
    assert_eq!(admitted.len() + refusals.len(), total);
}

fn append(log: &Path, token: u64) {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    writeln!(f, "{token}").unwrap();
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}
