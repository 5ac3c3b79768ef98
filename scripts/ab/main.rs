//! Same-run A/B of this tree (`new`) against an earlier revision (`old`), built by
//! `scripts/ab.sh`: acquire + release (cycle), renew, and an acquire answered "held", without
//! fsync, in the directory given (tmpfs or a disk's file system), the two sides interleaved
//! round by round so that both see the same machine. Prints, per operation, the medians of
//! wall time and of on-CPU time (the process's CPU time, every thread, user and system:
//! `CLOCK_PROCESS_CPUTIME_ID`) and their ratios.
//!
//! Usage: `flocklease-ab [DIR] [ROUNDS] [N]` (default `/dev/shm`, 9 rounds of 10 000), or
//! `flocklease-ab ops new|old cycle|renew|held N DIR`: one side's operation N times after a
//! warm-up, to count its system calls under `strace -f -c` (N operations minus none).

use std::path::{Path, PathBuf};
use std::time::Instant;

fn dir(parent: &Path, name: &str) -> PathBuf {
    let p = parent.join(format!("flocklease-ab-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The process's CPU time (every thread), in nanoseconds.
fn cpu_nanos() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// Nanoseconds per call of `f`, `n` calls: (wall, on-CPU).
fn time(n: u32, mut f: impl FnMut()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_nanos());
    for _ in 0..n {
        f();
    }
    let cpu = cpu_nanos() - c;
    (
        t.elapsed().as_nanos() as f64 / f64::from(n),
        cpu / f64::from(n),
    )
}

/// Wall and on-CPU samples of one operation on one side.
#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Samples {
    fn push(&mut self, (wall, cpu): (f64, f64)) {
        self.wall.push(wall);
        self.cpu.push(cpu);
    }
}

/// One side's operation `n` times (for `strace -f -c`), in a directory of its own under `dir`.
macro_rules! ops {
    ($side:ident, $op:expr, $n:expr, $dir:expr) => {{
        #[allow(unused_imports)]
        use $side::SessionLease as _;
        let d = dir($dir, stringify!($side));
        let open = || {
            $side::FlockLease::builder(&d)
                .durability($side::Durability::NoSync)
                .open()
                .unwrap()
        };
        let (a, holder) = (open(), open());
        let (id, me) = (
            $side::SessionId::new("ops").unwrap(),
            $side::Owner::new("me").unwrap(),
        );
        let held = $side::SessionId::new("ops-held").unwrap();
        let _held = holder
            .acquire(&held, &$side::Owner::new("other").unwrap())
            .unwrap()
            .lease()
            .unwrap();
        let l = a.acquire(&id, &me).unwrap().lease().unwrap();
        a.release(&l).unwrap();
        assert!(a.acquire(&held, &me).unwrap().is_held());
        match $op {
            "cycle" => {
                for _ in 0..$n {
                    let l = a.acquire(&id, &me).unwrap().lease().unwrap();
                    a.release(&l).unwrap();
                }
            }
            "renew" => {
                let l = a.acquire(&id, &me).unwrap().lease().unwrap();
                for _ in 0..$n {
                    assert!(!a.renew(&l).unwrap().is_held());
                }
            }
            "held" => {
                for _ in 0..$n {
                    assert!(a.acquire(&held, &me).unwrap().is_held());
                }
            }
            other => panic!("unknown operation {other}"),
        }
        let _ = std::fs::remove_dir_all(&d);
    }};
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, ops, side, op, n, parent] = &args[..]
        && ops == "ops"
    {
        let n: u32 = n.parse().expect("N");
        let parent = Path::new(parent);
        match side.as_str() {
            "new" => ops!(new, op.as_str(), n, parent),
            "old" => ops!(old, op.as_str(), n, parent),
            other => panic!("unknown side {other}"),
        }
        return;
    }
    let parent = PathBuf::from(args.get(1).map_or("/dev/shm", String::as_str));
    let rounds: usize = args.get(2).map_or(9, |r| r.parse().expect("ROUNDS"));
    let n: u32 = args.get(3).map_or(10_000, |r| r.parse().expect("N"));
    let (dn, dold) = (dir(&parent, "new"), dir(&parent, "old"));
    let a = new::FlockLease::builder(&dn)
        .durability(new::Durability::NoSync)
        .open()
        .unwrap();
    let b = old::FlockLease::builder(&dold)
        .durability(old::Durability::NoSync)
        .open()
        .unwrap();
    // A second instance of each side, to hold the id while the first is answered "held".
    let a2 = new::FlockLease::builder(&dn)
        .durability(new::Durability::NoSync)
        .open()
        .unwrap();
    let b2 = old::FlockLease::builder(&dold)
        .durability(old::Durability::NoSync)
        .open()
        .unwrap();
    let (ia, oa, ha) = (
        new::SessionId::new("ab").unwrap(),
        new::Owner::new("me").unwrap(),
        new::SessionId::new("ab-held").unwrap(),
    );
    let (ib, ob, hb) = (
        old::SessionId::new("ab").unwrap(),
        old::Owner::new("me").unwrap(),
        old::SessionId::new("ab-held").unwrap(),
    );
    let other_a = new::Owner::new("other").unwrap();
    let other_b = old::Owner::new("other").unwrap();
    let mut rows = vec![];
    {
        // One revision or the other may have these methods inherent as well.
        #[allow(unused_imports)]
        use new::SessionLease as _;
        #[allow(unused_imports)]
        use old::SessionLease as _;
        let (mut ca, mut cb, mut ra, mut rb, mut ka, mut kb) = Default::default();
        let (ca, cb, ra, rb, ka, kb): (
            &mut Samples,
            &mut Samples,
            &mut Samples,
            &mut Samples,
            &mut Samples,
            &mut Samples,
        ) = (&mut ca, &mut cb, &mut ra, &mut rb, &mut ka, &mut kb);
        let la = a.acquire(&ia, &oa).unwrap().lease().unwrap();
        let lb = b.acquire(&ib, &ob).unwrap().lease().unwrap();
        a.release(&la).unwrap();
        b.release(&lb).unwrap();
        for _ in 0..rounds {
            ca.push(time(n, || {
                let l = a.acquire(&ia, &oa).unwrap().lease().unwrap();
                a.release(&l).unwrap();
            }));
            cb.push(time(n, || {
                let l = b.acquire(&ib, &ob).unwrap().lease().unwrap();
                b.release(&l).unwrap();
            }));
        }
        let la = a.acquire(&ia, &oa).unwrap().lease().unwrap();
        let lb = b.acquire(&ib, &ob).unwrap().lease().unwrap();
        for _ in 0..rounds {
            ra.push(time(n, || assert!(!a.renew(&la).unwrap().is_held())));
            rb.push(time(n, || assert!(!b.renew(&lb).unwrap().is_held())));
        }
        let _held_a = a2.acquire(&ha, &other_a).unwrap().lease().unwrap();
        let _held_b = b2.acquire(&hb, &other_b).unwrap().lease().unwrap();
        for _ in 0..rounds {
            ka.push(time(n, || assert!(a.acquire(&ha, &oa).unwrap().is_held())));
            kb.push(time(n, || assert!(b.acquire(&hb, &ob).unwrap().is_held())));
        }
        for (op, new, old) in [
            ("acquire + release", ca, cb),
            ("renew", ra, rb),
            ("acquire answered held", ka, kb),
        ] {
            let take = |s: &mut Samples| {
                (
                    median(std::mem::take(&mut s.wall)),
                    median(std::mem::take(&mut s.cpu)),
                )
            };
            rows.push((op, take(new), take(old)));
        }
    }
    println!(
        "| operation | on-CPU, this tree | on-CPU, old | on-CPU ratio | wall, this tree | wall, old | wall ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (op, (nw, nc), (ow, oc)) in rows {
        println!(
            "| {op} | {:.2} µs | {:.2} µs | {:.3}× | {:.2} µs | {:.2} µs | {:.3}× |",
            nc / 1e3,
            oc / 1e3,
            nc / oc,
            nw / 1e3,
            ow / 1e3,
            nw / ow
        );
    }
    let _ = std::fs::remove_dir_all(dn);
    let _ = std::fs::remove_dir_all(dold);
}
