//! Benchmarks: every figure is measured beside its floor in the same run and read as a ratio.
//!
//! `cargo bench --bench lease` runs everything (about two minutes) and prints markdown tables.
//! `cargo bench --bench lease -- quick` runs fewer rounds. `-- ops OP N DIR` runs one operation
//! N times (for `scripts/syscalls.sh`, which counts syscalls with strace).
//!
//! Hand-written rather than criterion: what matters here is ratios against floors measured in
//! the same process and run, child processes for contention and crash takeover, and allocation
//! counts — none of which criterion provides.

#![allow(clippy::unwrap_used, missing_docs)]
// The counting global allocator is the one unsafe impl in the project.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flocklease::{Durability, FlockLease, Grant, Lease, Owner, SessionId};

/// Counts allocations, to report allocations per operation.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwards to the system allocator with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TTL: Duration = Duration::from_secs(3600);

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["holder", dir] => return holder(Path::new(dir)),
        ["holder-many", dir, n] => return holder_many(Path::new(dir), n.parse().unwrap()),
        ["populate", dir, n] => return populate(Path::new(dir), n.parse().unwrap()),
        ["flock-holder", path] => return flock_holder(Path::new(path)),
        ["contender", dir, secs] => return contender(Path::new(dir), secs.parse().unwrap()),
        [role, dir, start, end] if role.contains(':') => {
            return contender_role(role, Path::new(dir), window(start, end));
        }
        ["ops", op, n, dir] => return ops(op, n.parse().unwrap(), Path::new(dir)),
        _ => {}
    }
    let quick = args.iter().any(|a| a == "quick");
    if args.iter().any(|a| a == "scaling") {
        let shm = scratch(Path::new("/dev/shm"));
        return scaling(shm.path(), if quick { 3 } else { 5 }, quick);
    }
    if args.iter().any(|a| a == "status") {
        let shm = scratch(Path::new("/dev/shm"));
        return status_scale(shm.path(), quick);
    }
    if args.iter().any(|a| a == "recovery") {
        let shm = scratch(Path::new("/dev/shm"));
        return recovery(shm.path(), quick);
    }
    if args.iter().any(|a| a == "fairness") {
        let shm = scratch(Path::new("/dev/shm"));
        return fairness(shm.path(), quick);
    }
    if args.iter().any(|a| a == "contention") {
        let shm = scratch(Path::new("/dev/shm"));
        return contention(shm.path(), quick);
    }
    if args.iter().any(|a| a == "takeover") {
        let shm = scratch(Path::new("/dev/shm"));
        return takeover(shm.path(), if quick { 30 } else { 200 });
    }
    let rounds = if quick { 3 } else { 5 };
    println!(
        "flocklease benchmarks: median of {rounds} rounds; ratios are against the floor measured in the same run\n"
    );
    let shm = scratch(Path::new("/dev/shm"));
    let disk = scratch(&std::env::temp_dir());
    for (label, dir) in [("tmpfs (/dev/shm)", &shm), ("disk (temp dir)", &disk)] {
        single_process(label, dir.path(), rounds, quick);
    }
    durable(disk.path(), rounds);
    scaling(shm.path(), rounds, quick);
    recovery(shm.path(), quick);
    status_scale(shm.path(), quick);
    contention(shm.path(), quick);
    fairness(shm.path(), quick);
    takeover(shm.path(), if quick { 30 } else { 200 });
}

fn scratch(parent: &Path) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("flocklease-bench")
        .tempdir_in(parent)
        .unwrap()
}

fn open(dir: &Path, durability: Durability) -> FlockLease {
    FlockLease::builder(dir)
        .ttl(TTL)
        .durability(durability)
        .open()
        .unwrap()
}

/// Median nanoseconds per operation of `f` run `n` times, over `rounds` rounds.
fn measure(rounds: usize, n: u64, mut f: impl FnMut(u64)) -> f64 {
    let mut per_op: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for i in 0..n {
                f(i);
            }
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    per_op.sort_by(f64::total_cmp);
    per_op[per_op.len() / 2]
}

fn allocs_per_op(n: u64, mut f: impl FnMut(u64)) -> f64 {
    let before = ALLOCS.load(Ordering::Relaxed);
    for i in 0..n {
        f(i);
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / n as f64
}

fn row(name: &str, ns: f64, floor_name: &str, floor: f64) {
    println!(
        "| {name} | {:.1} µs | {:.0}/s | {floor_name} | {:.1} µs | {:.2}× |",
        ns / 1000.0,
        1e9 / ns,
        floor / 1000.0,
        ns / floor
    );
}

fn header(title: &str) {
    println!("\n### {title}\n");
    println!("| operation | median | throughput | floor | floor median | ratio |");
    println!("| --- | --- | --- | --- | --- | --- |");
}

// ---- floors: the raw syscalls the algorithm cannot avoid ----

fn rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .unwrap()
}

/// open + flock + close.
fn floor_lock(dir: &Path) -> impl FnMut(u64) {
    let path = dir.join("floor.lock");
    move |_| {
        let f = rw(&path);
        f.try_lock().unwrap();
        drop(f);
    }
}

/// Temporary write + rename, optionally with fdatasync and a directory fsync.
fn floor_write(dir: &Path, sync: bool) -> impl FnMut(u64) {
    let (tmp, dst) = (dir.join("floor.tmp"), dir.join("floor.json"));
    let dirf = File::open(dir).unwrap();
    let bytes = br#"{"owner":"bench","token":1,"expiry":"2026-11-30T04:20:54.5Z"}"#;
    move |_| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .unwrap();
        f.write_all(bytes).unwrap();
        if sync {
            f.sync_data().unwrap();
        }
        drop(f);
        fs::rename(&tmp, &dst).unwrap();
        if sync {
            dirf.sync_all().unwrap();
        }
    }
}

/// The raw syscall sequences of the four operations, as `FlockLease` does them in the steady
/// state (cached lock descriptor): nothing but the system calls — no JSON, no machine, no
/// allocation of paths. These are the floors the operations are compared with.
struct RawSequences {
    lock: File,
    lock_path: std::path::PathBuf,
    rec: std::path::PathBuf,
    tmp: std::path::PathBuf,
    live: std::path::PathBuf,
    other_live: std::path::PathBuf,
    buf: Vec<u8>,
    _other_holder: File,
}

impl RawSequences {
    fn new(dir: &Path) -> RawSequences {
        let lock_path = dir.join("seq.lock");
        let rec = dir.join("seq.json");
        fs::write(
            &rec,
            br#"{"owner":"bench","token":1,"expiry":"2026-11-30T04:20:54.5Z"}"#,
        )
        .unwrap();
        let other_live = dir.join("seq-other.live");
        let holder = rw(&other_live);
        holder.try_lock().unwrap();
        RawSequences {
            lock: rw(&lock_path),
            lock_path,
            tmp: dir.join("seq.tmp"),
            live: dir.join("seq.live"),
            other_live,
            rec,
            buf: vec![0u8; 4096],
            _other_holder: holder,
        }
    }

    fn begin(&mut self) -> usize {
        self.lock.try_lock().unwrap();
        let _ = fs::symlink_metadata(&self.lock_path).unwrap();
        let mut f = File::open(&self.rec).unwrap();
        f.read(&mut self.buf).unwrap()
    }

    fn commit(&mut self, n: usize) {
        let mut t = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&self.tmp)
            .unwrap();
        t.write_all(&self.buf[..n]).unwrap();
        drop(t);
        fs::rename(&self.tmp, &self.rec).unwrap();
    }

    fn end(&mut self) {
        self.lock.unlock().unwrap();
    }

    /// Takeover: read, create+lock+fstat the new liveness file, commit.
    fn acquire(&mut self) -> File {
        let n = self.begin();
        let l = rw(&self.live);
        l.try_lock().unwrap();
        let _ = l.metadata().unwrap();
        self.commit(n);
        self.end();
        l
    }

    /// Release: read, commit the tombstone, unlink and close the liveness file.
    fn release(&mut self, live: File) {
        let n = self.begin();
        self.commit(n);
        fs::remove_file(&self.live).unwrap();
        drop(live);
        self.end();
    }

    /// Renew: read, lstat the liveness file, commit.
    fn renew(&mut self) {
        let n = self.begin();
        let _ = fs::symlink_metadata(&self.live);
        self.commit(n);
        self.end();
    }

    /// Held: read, open the holder's liveness file, fail to lock it, close.
    fn held(&mut self) {
        let _ = self.begin();
        let f = File::open(&self.other_live).unwrap();
        assert!(f.try_lock().is_err());
        drop(f);
        self.end();
    }
}

// ---- the library ----

fn ids(n: usize) -> Vec<SessionId> {
    (0..n)
        .map(|i| SessionId::new(format!("bench-{i}")).unwrap())
        .collect()
}

fn single_process(label: &str, dir: &Path, rounds: usize, quick: bool) {
    let n: u64 = if quick { 2_000 } else { 10_000 };
    let leases = open(dir, Durability::NoSync);
    let other = open(dir, Durability::NoSync);
    let me = Owner::new("bench").unwrap();
    let them = Owner::new("other").unwrap();
    let id = SessionId::new("bench").unwrap();
    let held_id = SessionId::new("held").unwrap();
    let _holder = other.acquire(&held_id, &them).unwrap().lease().unwrap();

    let f_lock = measure(rounds, n, floor_lock(dir));
    let f_write = measure(rounds, n, floor_write(dir, false));
    let mut raw = RawSequences::new(dir);
    let f_cycle = measure(rounds, n, |_| {
        let l = raw.acquire();
        raw.release(l);
    });
    let f_renew = measure(rounds, n, |_| raw.renew());
    let f_held = measure(rounds, n, |_| raw.held());
    let mut f_release_ns = vec![];
    for _ in 0..rounds {
        let mut total = Duration::ZERO;
        for _ in 0..n / 4 {
            let l = raw.acquire();
            let start = Instant::now();
            raw.release(l);
            total += start.elapsed();
        }
        f_release_ns.push(total.as_nanos() as f64 / (n / 4) as f64);
    }
    f_release_ns.sort_by(f64::total_cmp);
    let f_release = f_release_ns[f_release_ns.len() / 2];

    let cycle = |_| {
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    };
    let t_cycle = measure(rounds, n, cycle);
    let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
    let t_renew = measure(rounds, n, |_| {
        assert!(!leases.renew(&lease).unwrap().is_held());
    });
    let t_held = measure(rounds, n, |_| {
        assert!(leases.acquire(&held_id, &me).unwrap().is_held());
    });
    // An empty fenced section: the transition lock taken and the record checked, no commit.
    let t_fenced = measure(rounds, n, |_| {
        assert!(leases.fenced(&lease, || ()).unwrap().is_some());
    });
    leases.release(&lease).unwrap();
    // Release alone: acquire outside the timed region.
    let mut release_ns = vec![];
    for _ in 0..rounds {
        let mut total = Duration::ZERO;
        for _ in 0..n / 4 {
            let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
            let start = Instant::now();
            leases.release(&l).unwrap();
            total += start.elapsed();
        }
        release_ns.push(total.as_nanos() as f64 / (n / 4) as f64);
    }
    release_ns.sort_by(f64::total_cmp);
    let t_release = release_ns[release_ns.len() / 2];

    header(&format!("{label}, no fsync"));
    row(
        "acquire + release cycle",
        t_cycle,
        "its syscalls, raw",
        f_cycle,
    );
    row("renew", t_renew, "its syscalls, raw", f_renew);
    row("acquire answered held", t_held, "its syscalls, raw", f_held);
    row("release", t_release, "its syscalls, raw", f_release);
    row(
        "fenced section (empty)",
        t_fenced,
        "renew (a transition)",
        t_renew,
    );
    println!(
        "\nSmaller floors in the same run: open + flock + close {:.1} µs; temporary write + rename {:.1} µs.",
        f_lock / 1000.0,
        f_write / 1000.0
    );
    // No ratio against the Go package: a ratio must come from one run, and the Go package is
    // not run here. BENCHMARKS.md quotes its figures with their date and conditions.
    let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
    let a_renew = allocs_per_op(1000, |_| {
        assert!(!leases.renew(&lease).unwrap().is_held());
    });
    leases.release(&lease).unwrap();
    let a_cycle = allocs_per_op(1000, |_| {
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    });
    println!("Allocations: {a_cycle:.1} per acquire + release cycle, {a_renew:.1} per renew.");
}

fn durable(dir: &Path, rounds: usize) {
    let n = 200;
    let leases = open(dir, Durability::Full);
    let me = Owner::new("bench").unwrap();
    let id = SessionId::new("durable").unwrap();
    let f_sync = measure(rounds, n, floor_write(dir, true));
    let f_nosync_renew = measure(rounds, n, floor_write(dir, false));
    let f_sync_data = {
        let (tmp, dst) = (dir.join("floor2.tmp"), dir.join("floor2.json"));
        measure(rounds, n, move |_| {
            let mut f = File::create(&tmp).unwrap();
            f.write_all(b"{}").unwrap();
            f.sync_data().unwrap();
            drop(f);
            fs::rename(&tmp, &dst).unwrap();
        })
    };
    let t_cycle = measure(rounds, n, |_| {
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    });
    let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
    let t_renew = measure(rounds, n, |_| {
        assert!(!leases.renew(&lease).unwrap().is_held());
    });
    leases.release(&lease).unwrap();
    header("disk, durable (Durability::Full)");
    row(
        "acquire + release cycle",
        t_cycle,
        "2 × (write + fdatasync + rename + dir fsync)",
        2.0 * f_sync,
    );
    row("renew", t_renew, "write + fdatasync + rename", f_sync_data);
    let _ = f_nosync_renew;
}

fn scaling(dir: &Path, rounds: usize, quick: bool) {
    println!("\n### latency against the number of ids (tmpfs, no fsync)\n");
    println!(
        "Every id has its files in the directory; renews go to 1 000 of them held at once (each \
         held lease keeps one descriptor open). Ids are visited in a scattered order."
    );
    println!();
    println!(
        "| ids | cycle median | ratio to 10 ids | renew median | ratio to 10 ids | floor: open+flock+lstat+read of the id's files | ratio to 10 ids |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let me = Owner::new("bench").unwrap();
    let counts: &[usize] = if quick {
        &[10, 1_000, 20_000]
    } else {
        &[10, 1_000, 100_000]
    };
    let mut base = (0.0, 0.0, 0.0);
    let mut takeovers = vec![];
    for &count in counts {
        let sub = dir.join(format!("scale-{count}"));
        let leases = open(&sub, Durability::NoSync);
        let all = ids(count);
        for id in &all {
            let l = leases.acquire(id, &me).unwrap().lease().unwrap();
            leases.release(&l).unwrap();
        }
        let n = 10_000u64;
        let t_cycle = measure(rounds, n, |i| {
            let id = &all[(i as usize * 7919) % count];
            let l = leases.acquire(id, &me).unwrap().lease().unwrap();
            leases.release(&l).unwrap();
        });
        let held: Vec<Lease> = (0..count.min(1_000))
            .map(|i| {
                let id = &all[(i * 7919) % count];
                leases.acquire(id, &me).unwrap().lease().unwrap()
            })
            .collect();
        let t_renew = measure(rounds, n, |i| {
            assert!(
                !leases
                    .renew(&held[(i as usize * 31) % held.len()])
                    .unwrap()
                    .is_held()
            );
        });
        // The floor: what any transition must touch of the id's files, in the same order.
        let files: Vec<_> = all
            .iter()
            .map(|id| {
                (
                    sub.join(format!("{}.lock", id.stem())),
                    sub.join(format!("{}.lease.json", id.stem())),
                )
            })
            .collect();
        let mut buf = vec![0u8; 4096];
        let t_floor = measure(rounds, n, |i| {
            let (lock, rec) = &files[(i as usize * 7919) % count];
            let f = rw(lock);
            f.try_lock().unwrap();
            let _ = fs::symlink_metadata(lock).unwrap();
            let n = File::open(rec).unwrap().read(&mut buf).unwrap();
            assert!(n > 0);
        });
        if count == counts[0] {
            base = (t_cycle, t_renew, t_floor);
        }
        println!(
            "| {count} | {:.1} µs | {:.2}× | {:.1} µs | {:.2}× | {:.1} µs | {:.2}× |",
            t_cycle / 1000.0,
            t_cycle / base.0,
            t_renew / 1000.0,
            t_renew / base.1,
            t_floor / 1000.0,
            t_floor / base.2
        );
        drop(held);
        drop(leases);
        takeovers.push((count, takeovers_in(&sub, if quick { 5 } else { 20 })));
        let _ = fs::remove_dir_all(&sub);
    }
    println!(
        "\nCrash takeover (SIGKILL of a holder → `acquire_wait` holds) in the same directories, \
         median of {} runs:\n",
        if quick { 5 } else { 20 }
    );
    println!(
        "| ids | waiting takeover | ratio to 10 ids | takeover by `acquire` (holder reaped) | ratio | `acquire_wait` of 1 ms, held | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let first = takeovers[0].1;
    for &(count, (w, p, s)) in &takeovers {
        println!(
            "| {count} | {w:.0} µs | {:.2}× | {p:.0} µs | {:.2}× | {s:.0} µs | {:.2}× |",
            w / first.0,
            p / first.1,
            s / first.2
        );
    }
}

/// Medians over `runs` crash takeovers of the id `takeover` in `dir`, in µs: (1) from the SIGKILL
/// of a holder process to a waiting acquire's grant; (2) an `acquire` right after the holder was
/// reaped (the takeover alone, no wait: the first one's floor); (3) one `acquire_wait` of 1 ms
/// on the held lease, answered held (a wait's own cost beside its 1 ms). Each grant is released
/// again.
fn takeovers_in(dir: &Path, runs: usize) -> (f64, f64, f64) {
    let leases = open(dir, Durability::NoSync);
    let id = SessionId::new("takeover").unwrap();
    let me = Owner::new("waiter").unwrap();
    let (mut waited, mut plain, mut short) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let (mut child, token) = spawn_child(&["holder", dir.to_str().unwrap()]);
        let live = dir.join(format!("{}.{}.live", id.stem(), token.trim()));
        let t0 = Instant::now();
        let got = leases
            .acquire_wait(&id, &me, Duration::from_millis(1))
            .unwrap();
        short.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        assert!(got.is_held());
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let l = leases
                    .acquire_wait(&id, &me, Duration::from_secs(30))
                    .unwrap()
                    .lease()
                    .unwrap();
                (Instant::now(), l)
            });
            wait_watched(&live);
            let t0 = Instant::now();
            child.kill().unwrap();
            let (t1, l) = waiter.join().unwrap();
            waited.push((t1 - t0).as_nanos() as f64 / 1000.0);
            leases.release(&l).unwrap();
        });
        child.wait().unwrap();
        let (mut child, _) = spawn_child(&["holder", dir.to_str().unwrap()]);
        child.kill().unwrap();
        child.wait().unwrap();
        let t0 = Instant::now();
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        plain.push(t0.elapsed().as_nanos() as f64 / 1000.0);
        leases.release(&l).unwrap();
    }
    (
        percentile(&mut waited, 0.5),
        percentile(&mut plain, 0.5),
        percentile(&mut short, 0.5),
    )
}

fn contention(dir: &Path, quick: bool) {
    println!(
        "\n### contended acquire on one id (tmpfs, no fsync; each grant is released at once)\n"
    );
    println!("| processes | grants/s | per process: min – max | fairness (min/max) |");
    println!("| --- | --- | --- | --- |");
    let secs = if quick { 1 } else { 2 };
    let exe = std::env::current_exe().unwrap();
    for procs in [2, 4, 8] {
        let sub = dir.join(format!("contend-{procs}"));
        fs::create_dir_all(&sub).unwrap();
        fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let children: Vec<_> = (0..procs)
            .map(|_| {
                Command::new(&exe)
                    .args(["contender", sub.to_str().unwrap(), &secs.to_string()])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let grants: Vec<u64> = children
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            })
            .collect();
        let total: u64 = grants.iter().sum();
        let (min, max) = (*grants.iter().min().unwrap(), *grants.iter().max().unwrap());
        println!(
            "| {procs} | {:.0} | {min} – {max} | {:.2} |",
            total as f64 / secs as f64,
            min as f64 / max.max(1) as f64
        );
    }
}

/// Child: acquire + release in a loop for `secs`, print the number of grants.
fn contender(dir: &Path, secs: u64) {
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new(format!("p{}", std::process::id())).unwrap();
    let id = SessionId::new("contended").unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut grants = 0u64;
    while Instant::now() < end {
        if let Some(l) = leases.acquire(&id, &me).unwrap().lease() {
            grants += 1;
            leases.release(&l).unwrap();
        }
    }
    println!("{grants}");
}

/// Waiting acquires on one id: processes looping `acquire_wait` → release, with the line of
/// waiters (PROTOCOL §4.6) and, as the baseline in the same run, without it (a directory
/// planted at `<stem>.queue` turns the line off for every process, which is how a wait behaved
/// before there was one). Then waiters beside Go-style pollers: `acquire`, and when held, sleep
/// 1 ms and try again, the loop of a caller of a package without a waiting acquire.
fn fairness(dir: &Path, quick: bool) {
    let secs = if quick { 1 } else { 3 };
    println!("\n### waiting acquires on one id (tmpfs, no fsync; {secs} s per row)\n");
    println!(
        "| processes | grant held | line | grants/s | per process: min – mean – max | min/mean | min/max |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (procs, hold) in [(2, 0), (4, 0), (8, 0), (2, 200), (8, 200)] {
        for line in [true, false] {
            let role = format!("waiter:{hold}");
            let roles = vec![role.as_str(); procs];
            let grants = contend(
                dir,
                &format!("fair-{procs}-{hold}-{line}"),
                &roles,
                line,
                secs,
            );
            let g: Vec<u64> = grants.iter().map(|(_, n, _)| *n).collect();
            let (min, max, mean) = spread(&g);
            println!(
                "| {procs} | {} | {} | {:.0} | {min} – {mean:.0} – {max} | {:.2} | {:.2} |",
                if hold == 0 {
                    "released at once".to_owned()
                } else {
                    format!("{hold} µs")
                },
                if line { "on" } else { "off (baseline)" },
                g.iter().sum::<u64>() as f64 / secs as f64,
                min as f64 / mean.max(1.0),
                min as f64 / max.max(1) as f64
            );
        }
    }
    println!(
        "\n### 4 waiting acquires beside 4 Go-style contenders on one id (tmpfs, no fsync; each grant held 200 µs; {secs} s per row)\n"
    );
    println!(
        "| contenders | line | waiters: min – mean – max | contenders: min – mean – max | waiters' share | longest without a grant: waiter / contender |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (kind, label) in [
        ("ticker", "tick: 1 ms sleep after every attempt"),
        (
            "poller",
            "poll: 1 ms sleep when held, again at once after a release",
        ),
    ] {
        for line in [true, false] {
            let other = format!("{kind}:200");
            let mut roles = vec!["waiter:200"; 4];
            roles.extend([other.as_str(); 4]);
            let grants = contend(dir, &format!("mixed-{kind}-{line}"), &roles, line, secs);
            let pick = |waiters: bool| -> Vec<u64> {
                grants
                    .iter()
                    .filter(|(r, _, _)| r.starts_with("waiter") == waiters)
                    .map(|(_, n, _)| *n)
                    .collect()
            };
            let longest = |waiters: bool| {
                grants
                    .iter()
                    .filter(|(r, _, _)| r.starts_with("waiter") == waiters)
                    .map(|(_, _, ms)| *ms)
                    .max()
                    .unwrap()
            };
            let (w, p) = (pick(true), pick(false));
            let (wmin, wmax, wmean) = spread(&w);
            let (pmin, pmax, pmean) = spread(&p);
            let (ws, ps) = (w.iter().sum::<u64>(), p.iter().sum::<u64>());
            println!(
                "| {label} | {} | {wmin} – {wmean:.0} – {wmax} | {pmin} – {pmean:.0} – {pmax} | {:.0} % | {} ms / {} ms |",
                if line { "on" } else { "off (baseline)" },
                ws as f64 * 100.0 / (ws + ps).max(1) as f64,
                longest(true),
                longest(false)
            );
        }
    }
}

/// Min, max and mean of `g`.
fn spread(g: &[u64]) -> (u64, u64, f64) {
    let min = *g.iter().min().unwrap();
    let max = *g.iter().max().unwrap();
    (min, max, g.iter().sum::<u64>() as f64 / g.len() as f64)
}

/// Runs one child per role on one id in a fresh directory `name` until the same instant, and
/// returns each child's role, grants, and longest stretch without a grant (ms).
fn contend<'r>(
    dir: &Path,
    name: &str,
    roles: &[&'r str],
    line: bool,
    secs: u64,
) -> Vec<(&'r str, u64, u64)> {
    let sub = dir.join(name);
    fs::create_dir_all(&sub).unwrap();
    fs::set_permissions(&sub, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    if !line {
        let stem = SessionId::new("contended").unwrap().stem().to_owned();
        fs::create_dir(sub.join(format!("{stem}.queue"))).unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    // Every child starts and stops at the same instants, whenever its process started.
    let start = unix_ms() + 300;
    let end = start + secs * 1000;
    let children: Vec<_> = roles
        .iter()
        .map(|role| {
            Command::new(&exe)
                .args([
                    role,
                    sub.to_str().unwrap(),
                    &start.to_string(),
                    &end.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    roles
        .iter()
        .zip(children)
        .map(|(role, c)| {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let mut fields = text.split_whitespace().map(|f| f.parse().unwrap());
            (*role, fields.next().unwrap(), fields.next().unwrap())
        })
        .collect()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A child's window, from its arguments (Unix milliseconds): sleeps until its start, and
/// returns a check that is true once its end has passed.
fn window(start: &str, end: &str) -> impl Fn() -> bool + use<> {
    let (start, end): (u64, u64) = (start.parse().unwrap(), end.parse().unwrap());
    std::thread::sleep(Duration::from_millis(start.saturating_sub(unix_ms())));
    move || unix_ms() >= end
}

/// Child: one contender of [`fairness`], `<kind>:<hold µs>`, for its window; prints the number
/// of grants. Each grant is held `hold` µs (slept), then released. `waiter`: `acquire_wait`
/// again at once. `poller`: a Go-style loop, `acquire`, and 1 ms of sleep whenever it is held
/// (again at once after its own release). `ticker`: `acquire`, and 1 ms of sleep after every
/// attempt.
fn contender_role(role: &str, dir: &Path, over: impl Fn() -> bool) {
    let (kind, hold) = role.split_once(':').unwrap();
    let hold = Duration::from_micros(hold.parse().unwrap());
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new(format!("{kind}{}", std::process::id())).unwrap();
    let id = SessionId::new("contended").unwrap();
    let mut grants = 0u64;
    // The longest stretch without a grant (from the window's start, between grants, and to its
    // end): what "starved" would mean.
    let (mut last, mut longest) = (Instant::now(), Duration::ZERO);
    while !over() {
        let got = match kind {
            "waiter" => leases.acquire_wait(&id, &me, Duration::from_millis(100)),
            _ => leases.acquire(&id, &me),
        }
        .unwrap();
        if let Grant::Granted(l) = &got {
            grants += 1;
            longest = longest.max(last.elapsed());
            last = Instant::now();
            if !hold.is_zero() {
                std::thread::sleep(hold);
            }
            leases.release(l).unwrap();
        }
        if kind == "ticker" || (kind == "poller" && got.is_held()) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    longest = longest.max(last.elapsed());
    println!("{grants} {}", longest.as_millis());
}

/// Child: hold a lease, say so, wait to be killed.
fn holder(dir: &Path) {
    let leases = open(dir, Durability::NoSync);
    let id = SessionId::new("takeover").unwrap();
    let l = leases
        .acquire(&id, &Owner::new("holder").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    println!("{}", l.token);
    let _ = std::io::stdin().read(&mut [0u8]);
}

/// `status::scan_each` over a directory of many released ids, against the floor of reading
/// every record once (list, open, read, close).
fn status_scale(dir: &Path, quick: bool) {
    let n = if quick { 20_000 } else { 100_000 };
    let sub = dir.join("status");
    let _ = fs::remove_dir_all(&sub);
    populate(&sub, n);
    println!("\n### status over {n} ids (tmpfs)\n");
    let now = flocklease::Timestamp::from_unix_secs(2_000_000_000).unwrap();
    let mut scans = vec![];
    let mut floors = vec![];
    let mut buf = vec![0u8; 4096];
    for _ in 0..3 {
        let t = Instant::now();
        let mut rows = 0;
        flocklease::status::scan_each(&sub, now, |_| rows += 1).unwrap();
        assert_eq!(rows, n);
        scans.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut read = 0;
        for e in fs::read_dir(&sub).unwrap() {
            let path = e.unwrap().path();
            if path.to_str().unwrap().ends_with(".lease.json") {
                read += File::open(&path).unwrap().read(&mut buf).unwrap().min(1);
            }
        }
        assert_eq!(read, n);
        floors.push(t.elapsed().as_secs_f64());
    }
    let (scan, floor) = (percentile(&mut scans, 0.5), percentile(&mut floors, 0.5));
    println!("| what | median of 3 | ratio to the floor |");
    println!("| --- | --- | --- |");
    println!(
        "| `status::scan_each` (what `flocklease status` prints from) | {scan:.3} s | {:.2}× |",
        scan / floor
    );
    println!(
        "| floor: list the directory, open + read + close each record | {floor:.3} s | 1.00× |"
    );
    let _ = fs::remove_dir_all(&sub);
}

/// `populate DIR N`: N ids granted and released in DIR (for measuring `flocklease status`).
fn populate(dir: &Path, n: usize) {
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new("bench").unwrap();
    for id in ids(n) {
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    }
}

/// Child: hold the leases `dead-0` .. `dead-{n-1}`, say so, wait to be killed.
fn holder_many(dir: &Path, n: usize) {
    raise_descriptor_limit();
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new("holder").unwrap();
    let held: Vec<Lease> = (0..n)
        .map(|i| {
            let id = SessionId::new(format!("dead-{i}")).unwrap();
            leases.acquire(&id, &me).unwrap().lease().unwrap()
        })
        .collect();
    println!("{}", held.len());
    let _ = std::io::stdin().read(&mut [0u8]);
}

/// Each held lease keeps one descriptor: lift the soft limit to the hard one.
fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// Crash recovery: a process holding `dead` ids among `background` released ones is
/// SIGKILLed, and this process takes over and renews every one of them (what a survivor does
/// after a crash). Returns the total and the median per id (takeover + renew), in ns.
fn recover(dir: &Path, background: usize, dead: usize) -> (f64, f64) {
    let _ = fs::remove_dir_all(dir);
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new("bench").unwrap();
    for id in ids(background) {
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    }
    drop(leases);
    let (mut child, line) = spawn_child(&["holder-many", dir.to_str().unwrap(), &dead.to_string()]);
    assert_eq!(line.trim(), dead.to_string());
    child.kill().unwrap();
    child.wait().unwrap();
    let leases = open(dir, Durability::NoSync);
    let dead_ids: Vec<SessionId> = (0..dead)
        .map(|i| SessionId::new(format!("dead-{i}")).unwrap())
        .collect();
    let mut each = Vec::with_capacity(dead);
    let mut held = Vec::with_capacity(dead);
    let start = Instant::now();
    for id in &dead_ids {
        let t = Instant::now();
        let l = leases.acquire(id, &me).unwrap().lease().unwrap();
        assert_eq!(l.token, 2, "a crash takeover");
        held.push(leases.renew(&l).unwrap().lease().unwrap());
        each.push(t.elapsed().as_nanos() as f64);
    }
    let total = start.elapsed().as_nanos() as f64;
    drop(held);
    drop(leases);
    let _ = fs::remove_dir_all(dir);
    (total, percentile(&mut each, 0.5))
}

fn recovery(dir: &Path, quick: bool) {
    raise_descriptor_limit();
    let (background, dead) = if quick {
        (20_000, 2_000)
    } else {
        (100_000, 10_000)
    };
    println!(
        "\n### crash recovery: taking over and renewing every id of a killed process (tmpfs, no fsync)\n"
    );
    println!(
        "A process holding the ids `dead-*` is SIGKILLed; this process takes over and renews each. \
         The baseline: 10 dead ids in a directory of 10, the same run (median of 20 recoveries)."
    );
    println!();
    let sub = dir.join("recovery");
    let mut base_each = vec![];
    let mut base_total = vec![];
    for _ in 0..20 {
        let (total, each) = recover(&sub, 0, 10);
        base_total.push(total / 10.0);
        base_each.push(each);
    }
    let per_id = percentile(&mut base_total, 0.5);
    let base_median = percentile(&mut base_each, 0.5);
    let (total, median) = recover(&sub, background, dead);
    println!(
        "| directory | dead ids | total | per id (mean) | per id (median) | ratio to the 10-id directory |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| 10 ids | 10 | {:.2} ms | {:.1} µs | {:.1} µs | 1.00× |",
        per_id * 10.0 / 1e6,
        per_id / 1e3,
        base_median / 1e3
    );
    println!(
        "| {} ids | {dead} | {:.2} s | {:.1} µs | {:.1} µs | total {:.2}× of {dead} × the 10-id mean; median {:.2}× |",
        background + dead,
        total / 1e9,
        total / dead as f64 / 1e3,
        median / 1e3,
        total / (dead as f64 * per_id),
        median / base_median
    );
}

/// Child: hold a bare flock on `path`, say so, wait to be killed.
fn flock_holder(path: &Path) {
    let f = rw(path);
    f.lock().unwrap();
    println!("locked");
    let _ = std::io::stdin().read(&mut [0u8]);
}

/// Waits (bounded) until `/proc/locks` shows a blocked flock request on `path`'s inode: the
/// waiter is parked in the kernel, so the kill is measured from a comparable starting line.
fn wait_blocked(path: &Path) {
    let ino = fs::metadata(path).map(|m| m.ino()).unwrap_or(0);
    let needle = format!(":{ino} ");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let locks = fs::read_to_string("/proc/locks").unwrap();
        if locks
            .lines()
            .any(|l| l.contains("-> FLOCK") && l.contains(&needle))
        {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the waiter never blocked on {}", path.display());
}

/// Waits (bounded) until this process's inotify watch on the lease directory reports closes
/// of its entries: the waiting acquire is parked, so the kill is measured from a comparable
/// starting line.
/// Returns once an inotify instance of this process watches the closes of the file at `path`
/// (the waiter is parked on the holder's liveness file), or of its directory's entries (how
/// waits watched before 2026-12-02: kept so that this bench runs on older code for A/B runs).
fn wait_watched(path: &Path) {
    let start = Instant::now();
    let ino = fs::metadata(path).unwrap().ino();
    let dir_ino = fs::metadata(path.parent().unwrap()).unwrap().ino();
    let needles = [format!(" ino:{ino:x} "), format!(" ino:{dir_ino:x} ")];
    while start.elapsed() < Duration::from_secs(5) {
        let waiting = fs::read_dir("/proc/self/fdinfo")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::read_to_string(e.path()).ok())
            .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .any(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("mask:"))
                    .and_then(|m| u32::from_str_radix(m, 16).ok())
                    .is_some_and(|m| m & 0x8 != 0) // IN_CLOSE_WRITE
            });
        if waiting {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the waiter never watched {}", path.display());
}

fn spawn_child(args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn takeover(dir: &Path, runs: usize) {
    let mut lease_us = vec![];
    let mut floor_us = vec![];
    for run in 0..runs {
        // Floor: a bare blocking flock waiter on a file the killed process held.
        let path = dir.join(format!("floor-{run}.lock"));
        let (mut child, _) = spawn_child(&["flock-holder", path.to_str().unwrap()]);
        let (tx, rx) = std::sync::mpsc::channel();
        let p2 = path.clone();
        let waiter = std::thread::spawn(move || {
            let f = rw(&p2);
            f.lock().unwrap();
            tx.send(Instant::now()).unwrap();
        });
        wait_blocked(&path);
        let t0 = Instant::now();
        child.kill().unwrap();
        let t1 = rx.recv().unwrap();
        floor_us.push((t1 - t0).as_nanos() as f64 / 1000.0);
        waiter.join().unwrap();
        child.wait().unwrap();

        // The lease: a waiting acquire, woken by the holder's death.
        let sub = dir.join(format!("takeover-{run}"));
        let (mut child, token) = spawn_child(&["holder", sub.to_str().unwrap()]);
        let leases = open(&sub, Durability::NoSync);
        let id = SessionId::new("takeover").unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let l = leases
                    .acquire_wait(&id, &Owner::new("waiter").unwrap(), Duration::from_secs(30))
                    .unwrap()
                    .lease()
                    .unwrap();
                (Instant::now(), l.token)
            });
            wait_watched(&sub.join(format!("{}.{}.live", id.stem(), token.trim())));
            let t0 = Instant::now();
            child.kill().unwrap();
            let (t1, token) = waiter.join().unwrap();
            assert_eq!(token, 2);
            lease_us.push((t1 - t0).as_nanos() as f64 / 1000.0);
        });
        child.wait().unwrap();
        let _ = fs::remove_dir_all(&sub);
    }
    let (lm, lp) = (
        percentile(&mut lease_us, 0.5),
        percentile(&mut lease_us, 0.99),
    );
    let (fm, fp) = (
        percentile(&mut floor_us, 0.5),
        percentile(&mut floor_us, 0.99),
    );
    println!(
        "\n### crash takeover latency: SIGKILL of the holder → waiter holds the lease ({runs} runs)\n"
    );
    println!("| waiter | median | p99 |");
    println!("| --- | --- | --- |");
    println!("| `acquire_wait` (the lease) | {lm:.0} µs | {lp:.0} µs |");
    println!("| bare blocking `flock` (floor) | {fm:.0} µs | {fp:.0} µs |");
    println!("| difference | {:.0} µs | {:.0} µs |", lm - fm, lp - fp);
}

/// `ops OP N DIR`: run one operation (`cycle`, `renew`, `held`) N times after one warm-up, for
/// syscall counting.
fn ops(op: &str, n: u64, dir: &Path) {
    let leases = open(dir, Durability::NoSync);
    let me = Owner::new("bench").unwrap();
    let id = SessionId::new("ops").unwrap();
    let warm = leases.acquire(&id, &me).unwrap().lease().unwrap();
    leases.release(&warm).unwrap();
    eprintln!("-- start --");
    match op {
        "cycle" => {
            for _ in 0..n {
                let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
                leases.release(&l).unwrap();
            }
        }
        "renew" => {
            let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
            for _ in 0..n {
                assert!(!leases.renew(&l).unwrap().is_held());
            }
        }
        "held" => {
            // Another instance holds the id: every acquire is answered "held" (after its probe).
            let holder = open(dir, Durability::NoSync);
            let other = Owner::new("holder").unwrap();
            let _held = holder.acquire(&id, &other).unwrap().lease().unwrap();
            for _ in 0..n {
                assert!(leases.acquire(&id, &me).unwrap().is_held());
            }
        }
        other => panic!("unknown op {other}"),
    }
}
