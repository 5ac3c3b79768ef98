//! Waiting acquires line up (PROTOCOL §4.6): when the lease is free, the waiter that has waited
//! longest tries first; a holder that releases and asks again lines up behind the waiters; a
//! stopped first waiter holds the others up for a moment only; a planted `<stem>.queue` costs
//! the order, never the call.
//!
//! Each waiter is a child process that says `waiting` once it holds its place in the line (its
//! fault hook speaks when the wait opens the holder's liveness file, which comes after the
//! place is taken), so the parent orders the waiters by what they say, never by sleeps.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::{FlockLease, Grant};
use nix::sys::signal::{Signal, kill};
use support::{RoleChild, hear, id, open_real, owner, role, tell, wait_stopped};

const ENTRY: &str = "child_entry";

/// The tests of this binary take turns: each judges an order that a waiter slower than the
/// hand-off grace (50 ms, a machine loaded by the other tests' children) could upset.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}
/// A child's wait gives up after this long and says `held`: a broken line fails the test by
/// then instead of hanging it.
const CHILD_WAIT: Duration = Duration::from_secs(10);

#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    assert_eq!(role, "waiter");
    let dir = Path::new(&args[0]);
    let said = Arc::new(AtomicBool::new(false));
    let hook: FaultHook = {
        let said = Arc::clone(&said);
        Arc::new(move |point, _| {
            if point == FaultPoint::OpenWait && !said.swap(true, Ordering::SeqCst) {
                tell("waiting");
            }
            None
        })
    };
    let leases = FlockLease::builder(dir)
        .ttl(Duration::from_secs(600))
        .faults(hook)
        .open()
        .unwrap();
    match leases.acquire_wait(&id("s"), &owner(&args[1]), CHILD_WAIT) {
        Ok(Grant::Granted(lease)) => {
            tell(&format!("granted {}", lease.token));
            assert_eq!(hear().as_deref(), Some("release"));
            leases.release(&lease).unwrap();
            tell("released");
        }
        Ok(Grant::Held) => tell("held"),
        Err(e) => tell(&format!("error {e}")),
    }
}

/// A waiter child for `name`, once it holds its place in the line.
fn waiter(dir: &Path, name: &str) -> RoleChild {
    let mut w = RoleChild::spawn(ENTRY, "waiter", &[dir.to_str().unwrap(), name]);
    assert_eq!(w.line(), "waiting");
    w
}

/// A lease directory, a lease manager over it and the lease of `s` it holds (TTL 600 s).
fn held() -> (tempfile::TempDir, FlockLease, flocklease::Lease) {
    let dir = tempfile::tempdir().unwrap();
    let a = open_real(dir.path(), Duration::from_secs(600));
    let first = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    (dir, a, first)
}

/// The line's file of `s` in `dir`.
fn queue_file(dir: &Path) -> std::path::PathBuf {
    dir.join(format!("{}.queue", id("s").stem()))
}

/// Whether any place in the line of `s` is held (a lock on any byte of its file).
fn someone_in_line(dir: &Path) -> bool {
    use nix::fcntl::{FcntlArg, fcntl};
    let Ok(file) = std::fs::File::open(queue_file(dir)) else {
        return false;
    };
    let mut probe = nix::libc::flock {
        l_type: nix::libc::F_WRLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    fcntl(&file, FcntlArg::F_OFD_GETLK(&mut probe)).unwrap();
    i32::from(probe.l_type) != nix::libc::F_UNLCK
}

/// Tells `w` to release its grant and waits until it has.
fn release(w: &mut RoleChild) {
    w.say("release");
    assert_eq!(w.line(), "released");
}

#[test]
fn a_holder_that_releases_and_asks_again_lines_up_behind_the_waiter() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let mut w = waiter(dir.path(), "w");
    std::thread::scope(|s| {
        a.release(&first).unwrap();
        // At once, as a loop of acquire_wait, work, release does: before the waiter has even
        // woken up. Without the line this call would take the lease back.
        let again = s.spawn(|| a.acquire_wait(&id("s"), &owner("a"), CHILD_WAIT));
        assert_eq!(w.line(), format!("granted {}", first.token + 1));
        release(&mut w);
        let again = again.join().unwrap().unwrap().lease().unwrap();
        assert_eq!(again.token, first.token + 2, "the waiter was served first");
    });
    w.finish();
}

#[test]
fn waiters_are_served_in_the_order_they_came() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let mut ws: Vec<RoleChild> = ["w1", "w2", "w3", "w4"]
        .iter()
        .map(|n| waiter(dir.path(), n))
        .collect();
    a.release(&first).unwrap();
    // All four wake at the release; each grant must go to the next in line. A child served
    // out of turn keeps the lease until told, so the expected one times out and says `held`.
    for (k, w) in ws.iter_mut().enumerate() {
        assert_eq!(
            w.line(),
            format!("granted {}", first.token + 1 + k as u64),
            "waiter {} out of turn",
            k + 1
        );
        release(w);
    }
    for w in ws {
        w.finish();
    }
    assert!(!someone_in_line(dir.path()), "a place was left behind");
}

#[test]
fn a_stopped_first_waiter_holds_the_others_up_only_for_a_moment() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let mut w1 = waiter(dir.path(), "w1");
    let mut w2 = waiter(dir.path(), "w2");
    let mut w3 = waiter(dir.path(), "w3");
    kill(w1.pid(), Signal::SIGSTOP).unwrap();
    wait_stopped(w1.pid());
    a.release(&first).unwrap();
    // w1 keeps its place (its process lives) but cannot take the lease: w2 does, after the
    // hand-off grace, and then w3, in their order (each passes w1 over on its own).
    assert_eq!(w2.line(), format!("granted {}", first.token + 1));
    release(&mut w2);
    assert_eq!(w3.line(), format!("granted {}", first.token + 2));
    release(&mut w3);
    kill(w1.pid(), Signal::SIGCONT).unwrap();
    assert_eq!(w1.line(), format!("granted {}", first.token + 3));
    release(&mut w1);
    for w in [w1, w2, w3] {
        w.finish();
    }
}

#[test]
fn a_holder_asking_again_while_others_wait_is_answered_at_once() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let mut w = waiter(dir.path(), "w");
    // The holder's own owner asking again is a refresh (re-entrant), not a place in the line
    // behind w: the lease is its own.
    let again = a.acquire_wait(&id("s"), &owner("a"), CHILD_WAIT).unwrap();
    assert_eq!(again.lease().unwrap().token, first.token);
    a.release(&first).unwrap();
    assert_eq!(w.line(), format!("granted {}", first.token + 1));
    release(&mut w);
    w.finish();
}

#[test]
fn a_grown_line_file_is_emptied_by_the_last_waiter_out_and_holed_while_others_wait() {
    use std::os::unix::fs::MetadataExt;
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    // A file grown by many waits (more than the 64 KiB the line lets it grow to).
    std::fs::write(queue_file(dir.path()), vec![b'.'; 200 * 1024]).unwrap();
    let mut w1 = waiter(dir.path(), "w1");
    let mut w2 = waiter(dir.path(), "w2");
    a.release(&first).unwrap();
    assert_eq!(w1.line(), format!("granted {}", first.token + 1));
    // w1 left the line while w2 waits: the offsets stay, the blocks before the end go.
    let meta = std::fs::metadata(queue_file(dir.path())).unwrap();
    assert!(
        meta.len() > 200 * 1024,
        "the file keeps its length: {}",
        meta.len()
    );
    assert!(
        meta.blocks() * 512 <= 16 * 1024,
        "{} bytes still allocated",
        meta.blocks() * 512
    );
    release(&mut w1);
    assert_eq!(w2.line(), format!("granted {}", first.token + 2));
    // w2 was the last one out: the file is empty again.
    assert_eq!(std::fs::metadata(queue_file(dir.path())).unwrap().len(), 0);
    release(&mut w2);
    w1.finish();
    w2.finish();
}

#[test]
fn a_killed_waiter_gives_up_its_place() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let w1 = waiter(dir.path(), "w1");
    let mut w2 = waiter(dir.path(), "w2");
    w1.kill();
    a.release(&first).unwrap();
    assert_eq!(w2.line(), format!("granted {}", first.token + 1));
    release(&mut w2);
    w2.finish();
    // The line is empty again: a new caller tries at once and is granted.
    let again = a.acquire_wait(&id("s"), &owner("a"), CHILD_WAIT).unwrap();
    assert_eq!(again.lease().unwrap().token, first.token + 2);
}

#[test]
fn a_planted_queue_file_costs_the_order_never_the_call() {
    let _turn = one_at_a_time();
    use std::os::unix::fs::symlink;
    for plant in ["symlink", "fifo", "directory"] {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::NamedTempFile::new().unwrap();
        let queue = dir.path().join(format!("{}.queue", id("s").stem()));
        match plant {
            "symlink" => symlink(outside.path(), &queue).unwrap(),
            "fifo" => nix::unistd::mkfifo(&queue, nix::sys::stat::Mode::S_IRWXU).unwrap(),
            _ => std::fs::create_dir(&queue).unwrap(),
        }
        let a = open_real(dir.path(), Duration::from_secs(600));
        let b = open_real(dir.path(), Duration::from_secs(600));
        let first = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
        // Contention is still an answer, and a release still ends the wait.
        let held = b
            .acquire_wait(&id("s"), &owner("b"), Duration::from_millis(20))
            .unwrap();
        assert_eq!(held, Grant::Held, "{plant}");
        std::thread::scope(|s| {
            let waiting = s.spawn(|| b.acquire_wait(&id("s"), &owner("b"), CHILD_WAIT));
            a.release(&first).unwrap();
            let got = waiting.join().unwrap().unwrap().lease().unwrap();
            assert_eq!(got.token, first.token + 1, "{plant}");
        });
        // Nothing was written through the link.
        assert_eq!(std::fs::read(outside.path()).unwrap(), b"", "{plant}");
    }
}

/// An OFD write lock on `len` bytes from `start` of `file` (0: to the end and beyond).
fn ofd_lock(file: &std::fs::File, start: i64, len: i64) {
    use nix::fcntl::{FcntlArg, fcntl};
    let range = nix::libc::flock {
        l_type: nix::libc::F_WRLCK as i16,
        l_whence: nix::libc::SEEK_SET as i16,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    fcntl(file, FcntlArg::F_OFD_SETLK(&range)).unwrap();
}

/// Issue 33.4: places ahead that never take their turn, as another program or stopped
/// waiters leave them: `places` locks of `span` bytes each, one description each, at the start
/// of the line's file. Returns the descriptions (the locks last as long as they do).
fn planted_places(dir: &Path, places: usize, span: i64) -> Vec<std::fs::File> {
    use std::io::Write;
    let path = queue_file(dir);
    (0..places)
        .map(|i| {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(&vec![b'.'; span as usize]).unwrap();
            ofd_lock(&f, i as i64 * span, span);
            f
        })
        .collect()
}

/// A lock spanning several bytes at the start of the line (no waiter's place) held every
/// waiter forever on a free lease (each pass-over moved one byte, and the lock still started
/// before): the line passes over a lock's whole span, and the waiter is granted.
#[test]
fn a_lock_spanning_several_bytes_holds_no_waiter_forever() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let _planted = planted_places(dir.path(), 1, 8);
    let b = open_real(dir.path(), Duration::from_secs(600));
    std::thread::scope(|s| {
        let waiting = s.spawn(|| b.acquire_wait(&id("s"), &owner("b"), CHILD_WAIT));
        a.release(&first).unwrap();
        let got = waiting.join().unwrap().unwrap();
        assert_eq!(
            got.lease().map(|l| l.token),
            Some(first.token + 1),
            "the waiter was not granted a free lease"
        );
    });
}

/// Twenty places ahead that never take their turn (stopped waiters) cost a wait one hand-off
/// grace and a short one per further place, not the whole grace each (twenty times 50 ms): a
/// wait bounded by 600 ms is granted (it answered held).
#[test]
fn stopped_waiters_ahead_cost_one_grace_not_one_each() {
    let _turn = one_at_a_time();
    let (dir, a, first) = held();
    let _planted = planted_places(dir.path(), 20, 1);
    let b = open_real(dir.path(), Duration::from_secs(600));
    std::thread::scope(|s| {
        let waiting = s.spawn(|| b.acquire_wait(&id("s"), &owner("b"), Duration::from_millis(600)));
        a.release(&first).unwrap();
        let got = waiting.join().unwrap().unwrap();
        assert_eq!(
            got.lease().map(|l| l.token),
            Some(first.token + 1),
            "the waiter was not granted past twenty stopped places within 600 ms"
        );
    });
}

/// A waiter on the holder's own instance keeps its place in the line while the holder's
/// release is still under way on another thread of that instance: whether the instance holds
/// the id went down with the release's commit, before its cleanup deletes the liveness file
/// (which wakes the waiters) and closes the generation. (Looks that read it from the state,
/// busy during the release, or from the generation, not closed yet, tried at once, waited for
/// the release's turn and could take the lease ahead of the first in the line.) Here `b`
/// (another process) is first in the line, `c` (a thread of the holder's instance, another
/// owner) second; the release pauses between the deletion and the close; `c` must go back to
/// waiting (it reads the record) while the release is paused, and `b` is granted next.
#[test]
fn a_waiter_of_the_holders_instance_keeps_its_place_while_the_release_runs() {
    use std::sync::{Mutex, mpsc};
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let named = |name: &str| std::thread::current().name() == Some(name);
    // The release, in its cleanup, deletes its liveness file (here, in its hook: the deletion
    // wakes the waiters) and pauses until let go, its generation not closed yet and its state
    // held; `c` reports its wait, and its look at the record once the release has paused.
    let (paused_tx, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (c_waits_tx, c_waits) = mpsc::channel();
    let (c_reads_tx, c_reads) = mpsc::channel();
    let pause = Mutex::new(Some((paused_tx, go)));
    let is_paused = Arc::new(AtomicBool::new(false));
    let (c_waits_tx, c_reads_tx) = (Mutex::new(c_waits_tx), Mutex::new(c_reads_tx));
    let hook: FaultHook = {
        let is_paused = Arc::clone(&is_paused);
        Arc::new(move |point, path| {
            if point == FaultPoint::Unlink
                && named("release")
                && let Some((paused, go)) = pause.lock().unwrap().take()
            {
                std::fs::remove_file(path).unwrap();
                is_paused.store(true, Ordering::SeqCst);
                paused.send(()).unwrap();
                let _ = go.recv();
            }
            if named("c") {
                if point == FaultPoint::OpenWait {
                    let _ = c_waits_tx.lock().unwrap().send(());
                }
                if point == FaultPoint::OpenRecord && is_paused.load(Ordering::SeqCst) {
                    let _ = c_reads_tx.lock().unwrap().send(());
                }
            }
            None
        })
    };
    let a = FlockLease::builder(dir.path())
        .ttl(Duration::from_secs(600))
        .faults(hook)
        .open()
        .unwrap();
    let first = a.acquire(&id("s"), &owner("a")).unwrap().lease().unwrap();
    let mut b = waiter(dir.path(), "b");
    std::thread::scope(|s| {
        let c = std::thread::Builder::new()
            .name("c".into())
            .spawn_scoped(s, || {
                a.acquire_wait(&id("s"), &owner("c"), Duration::from_secs(3))
            })
            .unwrap();
        c_waits.recv_timeout(CHILD_WAIT).unwrap();
        let release = std::thread::Builder::new()
            .name("release".into())
            .spawn_scoped(s, || a.release(&first))
            .unwrap();
        paused.recv_timeout(CHILD_WAIT).unwrap();
        let went_back = c_reads.recv_timeout(CHILD_WAIT).is_ok();
        go_tx.send(()).unwrap();
        release.join().unwrap().unwrap();
        assert!(
            went_back,
            "c did not go back to waiting while the release ran: it took the busy state for a turn"
        );
        assert_eq!(b.line(), format!("granted {}", first.token + 1));
        let got = c.join().unwrap().unwrap();
        assert!(matches!(got, Grant::Held), "c: {got:?}");
    });
    release(&mut b);
    b.finish();
}

/// A holder's own `acquire_wait` while another thread's acquire of the same instance has
/// committed its generation and not adopted it yet (here: a takeover of an expired lease,
/// paused at its directory sync) is a refresh tried at once, never a place in the line
/// behind the other waiters: whether the instance holds the id goes up with the commit, not
/// with the adoption. Here `h` held the lease and expired, `b` waits in the line, `a` takes
/// over and, from another thread, asks again.
#[test]
fn a_holders_wait_between_its_commit_and_its_adoption_is_a_refresh() {
    use flocklease::{ManualClock, Timestamp};
    use std::sync::{Mutex, mpsc};
    let _turn = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
    let ttl = Duration::from_secs(600);
    let named = |name: &str| std::thread::current().name() == Some(name);
    let open = |hook: FaultHook| {
        FlockLease::builder(dir.path())
            .clock(Arc::new(clock.clone()))
            .ttl(ttl)
            .faults(hook)
            .open()
            .unwrap()
    };
    // `b` tells when it waits in the line; `a`'s takeover pauses at its directory sync until
    // let go, and `a`'s second call tells if it takes a place in the line.
    let (b_waits_tx, b_waits) = mpsc::channel();
    let b_waits_tx = Mutex::new(Some(b_waits_tx));
    let b = open(Arc::new(move |point, _| {
        if point == FaultPoint::OpenWait
            && let Some(tx) = b_waits_tx.lock().unwrap().take()
        {
            let _ = tx.send(());
        }
        None
    }));
    let (paused_tx, paused) = mpsc::channel();
    let (go_tx, go) = mpsc::channel::<()>();
    let (joined_tx, joined) = mpsc::channel();
    let pause = Mutex::new(Some((paused_tx, go)));
    let joined_tx = Mutex::new(joined_tx);
    let a = open(Arc::new(move |point, _| {
        if point == FaultPoint::SyncDir
            && named("takeover")
            && let Some((paused, go)) = pause.lock().unwrap().take()
        {
            paused.send(()).unwrap();
            let _ = go.recv();
        }
        if point == FaultPoint::OpenQueue && named("again") {
            let _ = joined_tx.lock().unwrap().send(());
        }
        None
    }));
    let h = open(Arc::new(|_, _| None));
    let first = h.acquire(&id("s"), &owner("h")).unwrap().lease().unwrap();
    std::thread::scope(|s| {
        let waiter = s.spawn(|| b.acquire_wait(&id("s"), &owner("b"), CHILD_WAIT));
        b_waits.recv_timeout(CHILD_WAIT).unwrap();
        clock.advance(ttl + Duration::from_secs(1));
        let takeover = std::thread::Builder::new()
            .name("takeover".into())
            .spawn_scoped(s, || a.acquire(&id("s"), &owner("a")))
            .unwrap();
        paused.recv_timeout(CHILD_WAIT).unwrap();
        let again = std::thread::Builder::new()
            .name("again".into())
            .spawn_scoped(s, || {
                a.acquire_wait(&id("s"), &owner("a"), Duration::from_secs(1))
            })
            .unwrap();
        // Fixed: the second call waits for the takeover's turn and never looks at the line.
        // The mistake takes a place as soon as its thread runs (reported here).
        let lined_up = joined.recv_timeout(Duration::from_secs(2)).is_ok();
        go_tx.send(()).unwrap();
        let taken = takeover
            .join()
            .unwrap()
            .unwrap()
            .lease()
            .expect("taken over");
        assert_eq!(taken.token, first.token + 1);
        let got = again.join().unwrap();
        assert!(
            !lined_up,
            "the holder's own wait took a place in the line: {got:?}"
        );
        let refreshed = got.unwrap().lease().expect("a refresh");
        assert_eq!(refreshed.token, taken.token, "a refresh keeps the token");
        // The waiter gets the lease once the holder lets go and `h` (whose generation it
        // watches) is gone.
        a.release(&refreshed).unwrap();
        drop(h);
        let next = waiter.join().unwrap().unwrap().lease().expect("granted");
        assert_eq!(next.token, taken.token + 1);
    });
}
