//! Waits that end by their deadline and leave nothing behind, probes and waiters that never
//! look like holders, and bounded state. Threads and descriptors are counted per process, so
//! the tests of this binary take turns.

#![allow(clippy::unwrap_used)]

mod support;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use flocklease::{Error, FlockLease, Grant};
use support::{id, open_real, owner};

static COUNTING: Mutex<()> = Mutex::new(());

fn counting() -> MutexGuard<'static, ()> {
    COUNTING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Threads of this process started by the library (its helper threads were all named
/// `flocklease-*`); libtest's own threads come and go with the other tests.
fn threads() -> usize {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("flocklease"))
        })
        .count()
}

/// Whether the thread of an async wait is blocked in `poll(2)` (or `ppoll`), as the kernel
/// reports its current system call.
fn waiting_thread_polls() -> bool {
    let polls: &[&str] = if cfg!(target_arch = "x86_64") {
        &["7", "271"]
    } else if cfg!(target_arch = "aarch64") {
        &["73"]
    } else {
        &[]
    };
    fs::read_dir("/proc/self/task").unwrap().flatten().any(|t| {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let call = fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let wchan = fs::read_to_string(t.path().join("wchan")).unwrap_or_default();
        comm.starts_with("flocklease-acqu")
            && (call
                .split_whitespace()
                .next()
                .is_some_and(|n| polls.contains(&n))
                || wchan.contains("poll"))
    })
}

fn descriptors() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Another process's transition on `sid`, stuck: its `<stem>.lock` held by this descriptor.
fn stuck_lock(dir: &std::path::Path, sid: &str) -> File {
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(format!("{}.lock", id(sid).stem())))
        .unwrap();
    f.lock().unwrap();
    f
}

/// A fault hook that says on the returned channel each time a waiting acquire opens the
/// holder's liveness file to wait on it (after an attempt answered held).
fn parking_signal() -> (flocklease::fault::FaultHook, std::sync::mpsc::Receiver<()>) {
    let (tx, parked) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, _| {
        if point == flocklease::fault::FaultPoint::OpenWait {
            let _ = tx.lock().unwrap().send(());
        }
        None
    });
    (hook, parked)
}

/// A holder of `s` (TTL 600 s) and its lease, and another instance whose waits say on the
/// receiver each time they open the holder's liveness file to wait on it.
type Parked = (
    tempfile::TempDir,
    std::sync::mpsc::Receiver<()>,
    FlockLease,
    flocklease::Lease,
    FlockLease,
);

fn parked_scene() -> Parked {
    let dir = tempfile::tempdir().unwrap();
    let (hook, parked) = parking_signal();
    let holder = open_real(dir.path(), Duration::from_secs(600));
    let lease = holder
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    let waiter = FlockLease::builder(dir.path()).faults(hook).open().unwrap();
    (dir, parked, holder, lease, waiter)
}

#[test]
fn a_stuck_transition_lock_leaks_no_thread_and_no_descriptor() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let stuck = stuck_lock(dir.path(), "s");
    let leases = FlockLease::builder(dir.path())
        .lock_timeout(Duration::from_millis(20))
        .open()
        .unwrap();
    let (t0, d0) = (threads(), descriptors());
    for _ in 0..100 {
        let err = leases.acquire(&id("s"), &owner("a")).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
    }
    // A waiting acquire on the stuck id ends in the same error, also without leftovers.
    let err = leases
        .acquire_wait(&id("s"), &owner("a"), Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
    let (t1, d1) = (threads(), descriptors());
    eprintln!("100 timed-out acquires: threads {t0} -> {t1}, descriptors {d0} -> {d1}");
    assert_eq!((t0, t1), (0, 0), "library threads left behind");
    assert!(d1 <= d0 + 1, "descriptors left behind: {d0} -> {d1}");
    drop(stuck);
    assert!(!leases.acquire(&id("s"), &owner("a")).unwrap().is_held());
}

#[test]
fn the_error_for_a_stuck_lock_names_the_lock_file_not_the_record() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let _stuck = stuck_lock(dir.path(), "s");
    let leases = FlockLease::builder(dir.path())
        .lock_timeout(Duration::from_millis(20))
        .open()
        .unwrap();
    let err = leases
        .acquire_wait(&id("s"), &owner("a"), Duration::from_secs(5))
        .unwrap_err();
    let lock = dir.path().join(format!("{}.lock", id("s").stem()));
    assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
    assert_eq!(err.path(), Some(lock.as_path()));
    assert!(err.to_string().contains(&*lock.to_string_lossy()), "{err}");
    assert!(!err.to_string().contains("lease.json"), "{err}");
}

/// Callers queued on one id in one instance each wait for their own deadline: with a stuck
/// lock and a 100 ms bound, six callers are all answered by about 100 ms (they used to be
/// served one after the other, the sixth after 600 ms). The bound below is loose on purpose.
#[test]
fn callers_queued_on_one_id_each_keep_their_own_deadline() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let _stuck = stuck_lock(dir.path(), "s");
    let leases = FlockLease::builder(dir.path())
        .lock_timeout(Duration::from_millis(100))
        .open()
        .unwrap();
    let start = Instant::now();
    thread::scope(|s| {
        let callers: Vec<_> = (0..6)
            .map(|i| {
                let leases = &leases;
                s.spawn(move || leases.acquire(&id("s"), &owner(&format!("c{i}"))))
            })
            .collect();
        for c in callers {
            let err = c.join().unwrap().unwrap_err();
            assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        }
    });
    let all = start.elapsed();
    eprintln!("six queued callers answered after {all:?}");
    assert!(
        all < Duration::from_millis(350),
        "{all:?}: deadlines added up"
    );
}

/// A probe or a waiter looking at a crashed holder's liveness file in the same instant as an
/// acquire must not make it look alive. Probes and waiters take shared locks; here one is
/// held on the dead holder's file for the whole acquire.
#[test]
fn a_concurrent_probe_or_waiter_never_makes_a_crashed_holder_look_alive() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let crashed = open_real(dir.path(), Duration::from_secs(600));
    let old = crashed
        .acquire(&id("s"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    drop(crashed); // the holder's process dies: its liveness lock is gone
    let live = dir
        .path()
        .join(format!("{}.{}.live", id("s").stem(), old.token));
    let looking = File::open(&live).unwrap();
    looking.lock_shared().unwrap(); // another probe or waiter, right now
    let b = open_real(dir.path(), Duration::from_secs(600));
    let got = b.acquire(&id("s"), &owner("b")).unwrap();
    assert_eq!(
        got.lease().map(|l| l.token),
        Some(old.token + 1),
        "a probe made the crashed holder look alive"
    );
}

/// A waiter parked on a live holder holds no lock on the holder's file: another instance's
/// probe still sees exactly the holder, and the holder's release wakes the waiter.
#[test]
fn a_parked_waiter_holds_no_lock_and_wakes_on_release() {
    let _g = counting();
    let (dir, parked, holder, lease, waiter) = parked_scene();
    thread::scope(|s| {
        let waiting =
            s.spawn(|| waiter.acquire_wait(&id("s"), &owner("w"), Duration::from_secs(60)));
        parked.recv().unwrap();
        // It went into the wait (the first attempt answered held) and is still there.
        assert!(!waiting.is_finished());
        let live = dir
            .path()
            .join(format!("{}.{}.live", id("s").stem(), lease.token));
        let probe = File::open(&live).unwrap();
        assert!(
            probe.try_lock_shared().is_err(),
            "the holder's lock is exclusive"
        );
        drop(probe);
        let third = open_real(dir.path(), Duration::from_secs(600));
        assert!(third.acquire(&id("s"), &owner("c")).unwrap().is_held());
        holder.release(&lease).unwrap();
        let got = waiting.join().unwrap().unwrap().lease().unwrap();
        assert_eq!(got.token, lease.token + 1);
    });
}

/// The inotify marks of this process: (inode, mask) of each, from `/proc/self/fdinfo`.
fn marks() -> Vec<(u64, u32)> {
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v, 16).ok())
    };
    fs::read_dir("/proc/self/fdinfo")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.starts_with("inotify "))
        .filter_map(|l| Some((field(&l, "ino:")?, field(&l, "mask:")? as u32)))
        .collect()
}

/// A wait marks the holder's liveness file with inotify, never the lease directory: a mark
/// that reports a directory's entries makes the kernel flag every entry of the directory each
/// time it is added (milliseconds at 100 000 ids, under a lock every creation in the directory
/// needs), so every wait would cost the size of the directory. And marks do not pile up: each
/// wait removes its instance's earlier mark, here on files that stay (each expired holder keeps
/// its descriptor), so after five waits on five generations at most one mark per kept instance
/// remains.
#[test]
fn a_wait_marks_the_holders_file_not_the_directory_and_marks_do_not_pile_up() {
    const IN_CLOSE_WRITE: u32 = 0x8;
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let dir_ino = fs::metadata(dir.path()).unwrap().ino();
    let (hook, parked) = parking_signal();
    let waiter = FlockLease::builder(dir.path()).faults(hook).open().unwrap();
    // Holders whose leases expire while they keep their generations (and descriptors).
    let mut stale = vec![];
    for _ in 0..5 {
        let holder = open_real(dir.path(), Duration::from_millis(200));
        let lease = holder
            .acquire(&id("s"), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        let live = dir
            .path()
            .join(format!("{}.{}.live", id("s").stem(), lease.token));
        let live_ino = fs::metadata(&live).unwrap().ino();
        thread::scope(|s| {
            let waiting =
                s.spawn(|| waiter.acquire_wait(&id("s"), &owner("w"), Duration::from_secs(60)));
            parked.recv().unwrap();
            let bound = Instant::now() + Duration::from_secs(10);
            while !marks()
                .iter()
                .any(|&(ino, mask)| ino == live_ino && mask & IN_CLOSE_WRITE != 0)
            {
                assert!(
                    Instant::now() < bound,
                    "the wait never marked the holder's file"
                );
                thread::yield_now();
            }
            assert!(
                marks().iter().all(|&(ino, _)| ino != dir_ino),
                "the wait marked the lease directory: {:?}",
                marks()
            );
            // It ends at the expiry, with the holder alive and its file still there.
            let got = waiting.join().unwrap().unwrap().lease().unwrap();
            assert_eq!(got.token, lease.token + 1);
            waiter.release(&got).unwrap();
        });
        stale.push((holder, lease));
    }
    let left = marks();
    assert!(left.len() <= 2, "marks piled up over waits: {left:?}");
}

/// Dropping an async wait parked on a live holder ends its thread at once, with the holder
/// doing nothing, and the abandoned wait never takes the lease afterwards.
#[test]
fn a_dropped_async_wait_ends_its_thread_at_once_and_takes_nothing() {
    let _g = counting();
    let (dir, parked, holder, lease, waiter) = parked_scene();
    let waiter = Arc::new(waiter);
    let t0 = threads();
    let wait = waiter.acquire_wait_async(&id("s"), &owner("w"), Duration::from_secs(600));
    // Its first attempt answered held and it went into the wait: blocked in `poll` on its
    // inotify instance.
    parked.recv().unwrap();
    assert_eq!(threads(), t0 + 1);
    let bound = Instant::now() + Duration::from_secs(10);
    while !waiting_thread_polls() {
        assert!(Instant::now() < bound, "the wait never blocked in poll");
        thread::yield_now();
    }
    drop(wait);
    // "At once": well within the wait's periodic look at the lock (every second), which
    // would end it too, a little later, if the drop did not wake it.
    let bound = Instant::now() + Duration::from_millis(500);
    while threads() > t0 {
        assert!(
            Instant::now() < bound,
            "the abandoned wait's thread still waits for the holder"
        );
        thread::yield_now();
    }
    assert!(parked.try_recv().is_err(), "it made another attempt");
    holder.release(&lease).unwrap();
    let next = open_real(dir.path(), Duration::from_secs(600))
        .acquire(&id("s"), &owner("c"))
        .unwrap();
    assert_eq!(next.lease().unwrap().token, lease.token + 1);
}

#[test]
fn a_parked_waiter_sleeps_through_other_ids_and_wakes_on_its_holder() {
    // The wait watches the holder's liveness file only: the other ids'
    // transitions must not end it (each end would be another attempt and another open of the
    // holder's liveness file), and the holder's own release must.
    let _g = counting();
    let (dir, parked, holder, lease, waiter) = parked_scene();
    let busy = open_real(dir.path(), Duration::from_secs(600));
    thread::scope(|s| {
        let waiting =
            s.spawn(|| waiter.acquire_wait(&id("s"), &owner("w"), Duration::from_secs(60)));
        parked.recv().unwrap();
        for _ in 0..50 {
            let other = busy
                .acquire(&id("t"), &owner("b"))
                .unwrap()
                .lease()
                .unwrap();
            assert!(!busy.renew(&other).unwrap().is_held());
            busy.release(&other).unwrap();
        }
        assert!(!waiting.is_finished());
        assert!(
            parked.try_recv().is_err(),
            "another id's transitions ended the wait"
        );
        holder.release(&lease).unwrap();
        let got = waiting.join().unwrap().unwrap().lease().unwrap();
        assert_eq!(got.token, lease.token + 1);
    });
}

#[test]
fn per_id_state_stays_bounded_and_held_leases_survive_pruning() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let leases = open_real(dir.path(), Duration::from_secs(600));
    let kept = leases
        .acquire(&id("kept"), &owner("a"))
        .unwrap()
        .lease()
        .unwrap();
    for i in 0..2500 {
        let l = leases
            .acquire(&id(&format!("id-{i}")), &owner("a"))
            .unwrap()
            .lease()
            .unwrap();
        leases.release(&l).unwrap();
    }
    let tracked = leases.tracked_ids();
    eprintln!("2501 ids used, {tracked} tracked");
    assert!(tracked < 2048, "{tracked} ids tracked");
    // The held generation was not pruned: it renews with its token, and others are refused.
    let renewed = leases.renew(&kept).unwrap().lease().unwrap();
    assert_eq!(renewed.token, kept.token);
    let other = open_real(dir.path(), Duration::from_secs(600));
    assert!(other.acquire(&id("kept"), &owner("b")).unwrap().is_held());
}

#[test]
fn huge_timeouts_mean_no_limit_instead_of_a_panic() {
    let _g = counting();
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::builder(dir.path())
        .lock_timeout(Duration::MAX)
        .open()
        .unwrap();
    let first = leases
        .acquire_wait(&id("s"), &owner("a"), Duration::MAX)
        .unwrap()
        .lease()
        .unwrap();
    let other = open_real(dir.path(), Duration::from_secs(600));
    thread::scope(|s| {
        let waiting = s.spawn(|| other.acquire_wait(&id("s"), &owner("b"), Duration::MAX));
        leases.release(&first).unwrap();
        assert!(matches!(waiting.join().unwrap(), Ok(Grant::Granted(_))));
    });
}
