//! Actors outside any call that touch the lease directory — a tmp cleaner, an operator, a
//! waiter's or `status`'s probe, another program — never make a live holder look dead, and
//! never let two transitions commit at once. Real files, real locks; each holder is an
//! instance kept alive in this process (its descriptors open), each rival another instance.

use crate::support;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime};

use flocklease::conformance::START;
use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::{Error, FlockLease, Grant, ManualClock, status};
use support::{id, open_manual, owner};

fn live_path(dir: &Path, token: u64) -> PathBuf {
    dir.join(format!("{}.{token}.live", id("s").stem()))
}

fn lock_path(dir: &Path) -> PathBuf {
    dir.join(format!("{}.lock", id("s").stem()))
}

/// An instance whose step `point` fails at its first occurrence once `armed` is set.
fn faulty(
    dir: &Path,
    clock: &ManualClock,
    point: FaultPoint,
    armed: Arc<AtomicBool>,
) -> FlockLease {
    let hook: FaultHook = Arc::new(move |p, _| {
        (p == point && armed.swap(false, Ordering::SeqCst))
            .then(|| std::io::Error::other("injected fault"))
    });
    FlockLease::builder(dir)
        .clock(Arc::new(clock.clone()))
        .ttl(Duration::from_secs(30))
        .faults(hook)
        .open()
        .unwrap()
}

fn state_of(dir: &Path, clock: &ManualClock) -> &'static str {
    use flocklease::Clock;
    status::session(dir, &id("s"), clock.now())
        .unwrap()
        .unwrap()
        .state
}

/// Scenario 1: a renew restoring a deleted liveness file fails at any step of the restore.
/// Nothing unlocked may be left at the generation's name, or the next acquire by another
/// owner reads the holder as dead while it runs with an unexpired lease.
#[test]
fn a_failed_restore_of_a_deleted_liveness_file_never_makes_the_holder_look_dead() {
    for point in [
        FaultPoint::OpenLive,
        FaultPoint::WriteLive,
        FaultPoint::LockLive,
        FaultPoint::StatNewLive,
        FaultPoint::PublishLive,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let armed = Arc::new(AtomicBool::new(false));
        let a = faulty(dir.path(), &clock, point, Arc::clone(&armed));
        let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
        // A tmp cleaner deletes the holder's liveness file; the holder's renew restores it, and
        // the restore fails.
        fs::remove_file(live_path(dir.path(), 1)).unwrap();
        armed.store(true, Ordering::SeqCst);
        let err = a.renew(&lease).unwrap_err();
        assert!(
            err.to_string().contains("injected fault"),
            "{point:?}: {err}"
        );
        // The holder runs, its lease unexpired: nobody else may be granted it.
        let b = open_manual(dir.path(), &clock);
        assert_eq!(
            b.acquire(&id("s"), &owner("b")).unwrap(),
            Grant::Held,
            "{point:?}: granted while the holder runs"
        );
        assert_ne!(state_of(dir.path(), &clock), "dead", "{point:?}");
        // No leftover of the failed publish.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(names.is_empty(), "{point:?}: {names:?}");
        // The next renew restores it, and the holder is seen live again.
        assert!(!a.renew(&lease).unwrap().is_held(), "{point:?}");
        assert_eq!(state_of(dir.path(), &clock), "live", "{point:?}");
        assert_eq!(b.acquire(&id("s"), &owner("b")).unwrap(), Grant::Held);
    }
}

/// Scenario 1 without any fault: a prober (a waiter, `status`) takes shared locks on the
/// liveness file while the holder restores it again and again. A restore that created the
/// file before locking it could find its own fresh file share-locked and leave it unlocked.
#[test]
fn restores_racing_shared_probes_never_leave_the_generation_unlocked() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, path) = (Arc::clone(&stop), live_path(dir.path(), 1));
        std::thread::spawn(move || {
            let mut probes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(f) = File::open(&path)
                    && f.try_lock_shared().is_ok()
                {
                    probes += 1;
                }
            }
            probes
        })
    };
    let b = open_manual(dir.path(), &clock);
    for round in 0..3000 {
        let _ = fs::remove_file(live_path(dir.path(), 1));
        // The renew may fail (the probe held the fresh file); it must never leave it unlocked.
        let _ = a.renew(&lease);
        assert_eq!(
            b.acquire(&id("s"), &owner("b")).unwrap(),
            Grant::Held,
            "round {round}: granted while the holder runs"
        );
    }
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
}

/// Scenario 2: the holder's liveness file replaced by a FIFO, a directory or a fresh regular
/// file (empty, or with other contents), holder alive, lease unexpired.
#[test]
fn a_replaced_liveness_file_is_unknown_never_dead() {
    for plant in ["fifo", "directory", "empty file", "other file"] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let a = open_manual(dir.path(), &clock);
        let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
        let path = live_path(dir.path(), 1);
        fs::remove_file(&path).unwrap();
        match plant {
            "fifo" => nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap(),
            "directory" => fs::create_dir(&path).unwrap(),
            "empty file" => drop(File::create(&path).unwrap()),
            _ => fs::write(&path, b"0123456789abcdef").unwrap(),
        }
        let b = open_manual(dir.path(), &clock);
        assert_eq!(
            b.acquire(&id("s"), &owner("b")).unwrap(),
            Grant::Held,
            "{plant}: granted while the holder runs"
        );
        // status tells the same story, with the reason.
        let st = status::session(dir.path(), &id("s"), {
            use flocklease::Clock;
            clock.now()
        })
        .unwrap()
        .unwrap();
        assert_eq!(st.state, "unknown", "{plant}");
        assert!(!st.acquirable, "{plant}");
        assert!(st.error.is_some(), "{plant}: no reason given");
        // A waiting acquire does not mistake the planted file for a released lock.
        let waited = b
            .acquire_wait(&id("s"), &owner("b"), Duration::from_millis(30))
            .unwrap();
        assert_eq!(waited, Grant::Held, "{plant}");
        // The holder's renew puts its own file back (a directory is not removed: the renew
        // fails and names it), and the lease stays the holder's either way.
        match (plant, a.renew(&lease)) {
            ("directory", Err(Error::NotAFile { .. })) => {}
            (_, Ok(Grant::Granted(_))) => assert_eq!(state_of(dir.path(), &clock), "live"),
            (_, other) => panic!("{plant}: renew answered {other:?}"),
        }
        assert_eq!(b.acquire(&id("s"), &owner("b")).unwrap(), Grant::Held);
        // At the expiry the rival takes over, as with a deleted file.
        clock.advance(Duration::from_secs(30));
        let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
        assert_eq!(taken.token, 2, "{plant}");
    }
}

/// Issue 33.1: the holder's own liveness file moved aside (or hard-linked aside and
/// removed) after a renew, the next renew restores the generation's file, and the original
/// inode is put back at its name, unlocked. It must not read as the generation's own file (it
/// did: it carried the tag the record names, so a rival was granted token 2 while the holder
/// ran, 29 s from its expiry): the restore publishes a fresh tag, which the renew commits.
#[test]
fn the_holders_own_liveness_file_moved_back_never_reads_dead() {
    for how in ["rename", "hard link"] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let a = open_manual(dir.path(), &clock);
        let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
        let lease = a.renew(&lease).unwrap().lease().unwrap();
        let path = live_path(dir.path(), 1);
        let aside = dir.path().join("aside");
        match how {
            "rename" => fs::rename(&path, &aside).unwrap(),
            _ => {
                fs::hard_link(&path, &aside).unwrap();
                fs::remove_file(&path).unwrap();
            }
        }
        // The renew restores the generation's file (a new one, locked).
        let lease = a.renew(&lease).unwrap().lease().expect("renewed");
        clock.advance(Duration::from_secs(1));
        // The original inode comes back over the restored one; the holder's lock is on the
        // restored inode, so nothing at the name is locked now.
        fs::rename(&aside, &path).unwrap();
        let b = open_manual(dir.path(), &clock);
        assert_eq!(
            b.acquire(&id("s"), &owner("b")).unwrap(),
            Grant::Held,
            "{how}: a rival was granted while the holder runs with {lease:?}"
        );
        assert_eq!(state_of(dir.path(), &clock), "unknown", "{how}");
        // The holder's next renew puts its own file back and the lease reads live again.
        let lease = a.renew(&lease).unwrap().lease().expect("renewed");
        assert_eq!(state_of(dir.path(), &clock), "live", "{how}");
        assert_eq!(b.acquire(&id("s"), &owner("b")).unwrap(), Grant::Held);
        a.release(&lease).unwrap();
    }
}

/// The same, when the renew that restored the file fails after the restore (here at its
/// temporary record): the record still names the old file's tag, so the holder keeps that
/// file locked until a record naming the new tag is committed. Put back at its name, the old
/// file then still reads as the live holder's (with the old file's descriptor closed at the
/// restore, a rival was granted token 2 beside the live holder). Found by the model checker
/// with a cleaner that moves files aside and back.
#[test]
fn the_holders_file_put_back_after_a_failed_restore_still_reads_live() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let armed = Arc::new(AtomicBool::new(false));
    let a = faulty(
        dir.path(),
        &clock,
        FaultPoint::WriteTemp,
        Arc::clone(&armed),
    );
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let path = live_path(dir.path(), 1);
    let aside = dir.path().join("aside");
    fs::rename(&path, &aside).unwrap();
    armed.store(true, Ordering::SeqCst);
    assert!(
        a.renew(&lease).is_err(),
        "the renew fails after its restore"
    );
    fs::rename(&aside, &path).unwrap();
    let b = open_manual(dir.path(), &clock);
    assert_eq!(
        b.acquire(&id("s"), &owner("b")).unwrap(),
        Grant::Held,
        "a rival was granted while the holder runs"
    );
    assert_eq!(state_of(dir.path(), &clock), "live");
    // The next renew finds another file at the name than its own and restores again.
    let lease = a.renew(&lease).unwrap().lease().expect("renewed");
    assert_eq!(b.acquire(&id("s"), &owner("b")).unwrap(), Grant::Held);
    a.release(&lease).unwrap();
}

/// Issue 33.2, ABA on `<stem>.lock`: while transition A holds the lock (its record read, its
/// commit ahead), the lock is hard-linked aside and its name removed; B runs a whole acquire
/// and release on a fresh lock; the original inode is put back. A's check of the lock's
/// identity passes; it must still not commit (it committed the token B had been granted):
/// the record is no longer the one A read.
#[test]
fn a_lock_put_back_after_another_transition_never_lets_a_stale_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    // A tombstone of token 1 to start from.
    let first = open_manual(dir.path(), &clock);
    let lease = first
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    first.release(&lease).unwrap();
    let b = Arc::new(open_manual(dir.path(), &clock));
    let armed = Arc::new(AtomicBool::new(true));
    let granted_b = Arc::new(Mutex::new(None));
    let hook: FaultHook = {
        let (armed, b, granted_b) = (Arc::clone(&armed), Arc::clone(&b), Arc::clone(&granted_b));
        let dir = dir.path().to_owned();
        Arc::new(move |p, _| {
            if p == FaultPoint::ReadRecord && armed.swap(false, Ordering::SeqCst) {
                let lock = lock_path(&dir);
                let aside = dir.join("lock-aside");
                fs::hard_link(&lock, &aside).unwrap();
                fs::remove_file(&lock).unwrap();
                let got = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
                b.release(&got).unwrap();
                *granted_b.lock().unwrap() = Some(got.token);
                fs::rename(&aside, &lock).unwrap();
            }
            None
        })
    };
    let a = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(Duration::from_secs(30))
        .faults(hook)
        .open()
        .unwrap();
    let answer = a.acquire(&id("s"), &owner("a"));
    let b_token = granted_b
        .lock()
        .unwrap()
        .expect("B ran inside A's transition");
    assert_eq!(b_token, 2);
    match answer {
        Err(Error::LockReplaced { .. }) => {}
        other => panic!("A answered {other:?} after B was granted token {b_token}"),
    }
    // The next acquire goes on from B's token.
    let next = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    assert_eq!(next.token, 3);
}

/// The rival's acquire, run on a thread of its own.
type Rival = std::thread::JoinHandle<Result<Grant, Error>>;

/// Scenario 3: `<stem>.lock` deleted while a transition holds it. A second transition then
/// locks a new `.lock` and runs beside the first; the first must not commit over it, nor the
/// two share a temporary file (the first would rename the second's record into place).
#[test]
fn a_transition_whose_lock_was_deleted_never_commits() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let (b_wrote_tx, b_wrote_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // The rival pauses just before its commit, its temporary record written, until told to go.
    let b_hook: FaultHook = {
        let (b_wrote_tx, go_rx) = (Mutex::new(b_wrote_tx), Mutex::new(go_rx));
        Arc::new(move |point, _| {
            if point == FaultPoint::Rename {
                b_wrote_tx.lock().unwrap().send(()).unwrap();
                go_rx.lock().unwrap().recv().unwrap();
            }
            None
        })
    };
    let b = Arc::new(
        FlockLease::builder(dir.path())
            .clock(Arc::new(clock.clone()))
            .ttl(Duration::from_secs(30))
            .faults(b_hook)
            .open()
            .unwrap(),
    );
    let rival: Arc<Mutex<Option<Rival>>> = Arc::default();
    let armed = Arc::new(AtomicBool::new(false));
    // The holder: once its temporary record is written, a tmp cleaner deletes the lock and the
    // rival runs up to its own commit.
    let a_hook: FaultHook = {
        let (rival, armed, b) = (Arc::clone(&rival), Arc::clone(&armed), Arc::clone(&b));
        let (lock, b_wrote_rx) = (lock_path(dir.path()), Mutex::new(b_wrote_rx));
        Arc::new(move |point, _| {
            if point == FaultPoint::SyncTemp && armed.swap(false, Ordering::SeqCst) {
                fs::remove_file(&lock).unwrap();
                let b = Arc::clone(&b);
                *rival.lock().unwrap() =
                    Some(std::thread::spawn(move || b.acquire(&id("s"), &owner("b"))));
                b_wrote_rx.lock().unwrap().recv().unwrap();
            }
            None
        })
    };
    let a = FlockLease::builder(dir.path())
        .clock(Arc::new(clock.clone()))
        .ttl(Duration::from_secs(30))
        .faults(a_hook)
        .open()
        .unwrap();
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    // Expired: the holder may reclaim it by a renew, and anyone may take it over.
    clock.advance(Duration::from_secs(31));
    armed.store(true, Ordering::SeqCst);
    let renewed = a.renew(&lease);
    go_tx.send(()).unwrap();
    let taken = rival.lock().unwrap().take().unwrap().join().unwrap();
    let rec = flocklease::record::decode(
        &fs::read(dir.path().join(format!("{}.lease.json", id("s").stem()))).unwrap(),
    )
    .unwrap();
    // The holder's renew did not commit: the rival's takeover did, and only it was granted.
    assert!(
        matches!(renewed, Err(Error::LockReplaced { .. })),
        "renew answered {renewed:?} with the record at {rec:?}"
    );
    let taken = taken.unwrap().lease().expect("the rival's takeover");
    assert_eq!(taken.token, 2);
    assert_eq!((rec.owner.as_str(), rec.token), ("b", 2));
    // The renew failed without losing anything it had: it answers lost next time, as the
    // record says.
    assert!(a.renew(&lease).unwrap().is_held());
}

/// A lock untouched for days (what tmp cleaners age by) is touched when a transition takes it.
#[test]
fn an_old_transition_lock_is_touched_when_locked() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    let lease = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let days_ago = SystemTime::now() - Duration::from_secs(10 * 86_400);
    File::options()
        .write(true)
        .open(lock_path(dir.path()))
        .unwrap()
        .set_modified(days_ago)
        .unwrap();
    let before = fs::metadata(lock_path(dir.path())).unwrap().mtime();
    assert!(!a.renew(&lease).unwrap().is_held());
    let after = fs::metadata(lock_path(dir.path())).unwrap().mtime();
    assert!(after > before + 86_400, "{before} -> {after}");
}

/// A record moved back (restored from a backup) under a live holder of the next generation:
/// the takeover it invites would publish over that holder's file. The publish refuses.
#[test]
fn a_takeover_never_replaces_a_live_holders_file() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let a = open_manual(dir.path(), &clock);
    a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let record = dir.path().join(format!("{}.lease.json", id("s").stem()));
    let backup = fs::read(&record).unwrap();
    clock.advance(Duration::from_secs(31));
    let b = open_manual(dir.path(), &clock);
    let taken = b.acquire(&id("s"), &owner("b")).unwrap().lease().unwrap();
    assert_eq!(taken.token, 2);
    // The old record (token 1, expired) comes back.
    fs::write(&record, backup).unwrap();
    let c = open_manual(dir.path(), &clock);
    let err = c.acquire(&id("s"), &owner("c")).unwrap_err();
    assert!(matches!(err, Error::LiveLockBusy { .. }), "{err}");
    // The holder of token 2 keeps its file, locked.
    let f = File::open(live_path(dir.path(), 2)).unwrap();
    assert!(
        f.try_lock_shared().is_err(),
        "the holder's file was replaced"
    );
    // Nothing was committed: the restored record stands.
    let rec = flocklease::record::decode(&fs::read(&record).unwrap()).unwrap();
    assert_eq!(rec.token, 1);
}
