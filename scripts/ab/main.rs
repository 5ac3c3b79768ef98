//! Same-run A/B of this tree (`new`) against an earlier revision (`old`), built by
//! `scripts/ab.sh`: cycle (acquire + release) and renew on tmpfs without fsync, the two
//! interleaved round by round so that both see the same machine. Prints medians and ratios.

use std::path::PathBuf;
use std::time::Instant;

const ROUNDS: usize = 9;
const N: u32 = 10_000;

fn dir(name: &str) -> PathBuf {
    let p = PathBuf::from(format!("/dev/shm/flocklease-ab-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`, `N` calls.
fn time(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..N {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(N)
}

fn main() {
    let (dn, dold) = (dir("new"), dir("old"));
    let a = new::FlockLease::builder(&dn)
        .durability(new::Durability::NoSync)
        .open()
        .unwrap();
    let b = old::FlockLease::builder(&dold)
        .durability(old::Durability::NoSync)
        .open()
        .unwrap();
    let (ia, oa) = (
        new::SessionId::new("ab").unwrap(),
        new::Owner::new("me").unwrap(),
    );
    let (ib, ob) = (
        old::SessionId::new("ab").unwrap(),
        old::Owner::new("me").unwrap(),
    );
    let mut rows = vec![];
    {
        // One revision or the other may have these methods inherent as well.
        #[allow(unused_imports)]
        use new::SessionLease as _;
        #[allow(unused_imports)]
        use old::SessionLease as _;
        let (mut ca, mut cb, mut ra, mut rb) = (vec![], vec![], vec![], vec![]);
        for _ in 0..ROUNDS {
            ca.push(time(|| {
                let l = a.acquire(&ia, &oa).unwrap().lease().unwrap();
                a.release(&l).unwrap();
            }));
            cb.push(time(|| {
                let l = b.acquire(&ib, &ob).unwrap().lease().unwrap();
                b.release(&l).unwrap();
            }));
        }
        let la = a.acquire(&ia, &oa).unwrap().lease().unwrap();
        let lb = b.acquire(&ib, &ob).unwrap().lease().unwrap();
        for _ in 0..ROUNDS {
            ra.push(time(|| assert!(!a.renew(&la).unwrap().is_held())));
            rb.push(time(|| assert!(!b.renew(&lb).unwrap().is_held())));
        }
        rows.push(("cycle", median(ca), median(cb)));
        rows.push(("renew", median(ra), median(rb)));
    }
    println!("| operation | this tree | the old revision | ratio |");
    println!("| --- | --- | --- | --- |");
    for (op, n, o) in rows {
        println!(
            "| {op} | {:.2} µs | {:.2} µs | {:.3}× |",
            n / 1e3,
            o / 1e3,
            n / o
        );
    }
    let _ = std::fs::remove_dir_all(dn);
    let _ = std::fs::remove_dir_all(dold);
}
