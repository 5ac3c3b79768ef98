//! Crash-loop soak: worker processes loop acquire → critical section → renew → release on a
//! few ids while a supervisor SIGKILLs and SIGSTOPs them at random. A fenced resource and an
//! offline check of the event log prove that no two processes were inside a critical section of
//! one id at once while both their leases were unexpired, and that tokens never repeat.
//!
//! Not deterministic by nature (real signals, real time): the schedule is seeded and printed, and
//! the checks are invariants that hold on every schedule. `FLOCKLEASE_SOAK_SECS` sets the
//! duration (default 20).

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flocklease::Grant;
use nix::sys::signal::{Signal, kill};
use support::{RoleChild, id, owner, role};

const ENTRY: &str = "child_entry";
const TTL: Duration = Duration::from_millis(300);
const IDS: [&str; 2] = ["soak-a", "soak-b"];
const WORKERS: usize = 4;

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128
}

/// A tiny deterministic generator (xorshift64*), so schedules are replayable from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Appends one line atomically (a single `write` on an `O_APPEND` file).
fn log(file: &mut File, line: String) {
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// The worker role: `DIR LOG SEED`. Loops until killed.
#[test]
fn child_entry() {
    let Some((_, args)) = role() else { return };
    let (dir, log_path) = (Path::new(&args[0]), Path::new(&args[1]));
    let mut rng = Rng(args[2].parse::<u64>().unwrap() | 1);
    let mut out = OpenOptions::new().append(true).open(log_path).unwrap();
    // A short bound on the transition lock: workers stopped inside a transition (SIGSTOP at a
    // random instant) leave it stuck, and the others must time out without leaking anything.
    let leases = flocklease::FlockLease::builder(dir)
        .ttl(TTL)
        .durability(flocklease::Durability::NoSync)
        .lock_timeout(Duration::from_millis(50))
        .open()
        .unwrap();
    let pid = std::process::id();
    let me = owner(&format!("w{pid}"));
    support::tell("ready");
    for round in 0u64.. {
        if round % 16 == 0 {
            let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
            let threads = std::fs::read_dir("/proc/self/task").unwrap().count();
            log(&mut out, format!("D {fds} {pid} {threads}"));
        }
        let name = IDS[rng.below(IDS.len() as u64) as usize];
        let lease = match leases.acquire(&id(name), &me) {
            Ok(Grant::Granted(l)) => l,
            Err(flocklease::Error::LockTimeout { .. }) => {
                log(&mut out, format!("T {pid}"));
                continue;
            }
            Err(e) => panic!("{e}"),
            Ok(Grant::Held) => {
                std::thread::sleep(Duration::from_millis(1)); // pacing, not synchronisation
                continue;
            }
        };
        let (t, e) = (lease.token, lease.expiry.unix_nanos());
        log(&mut out, format!("G {name} {t} {e} {} {pid}", now_ns()));
        if !resource_enter(dir, name, t, e) {
            release(&leases, &lease, &mut out, pid);
            continue;
        }
        log(&mut out, format!("E {name} {t} {e} {} {pid}", now_ns()));
        std::thread::sleep(Duration::from_micros(rng.below(2000)));
        let renewed = loop {
            match leases.renew(&lease) {
                Err(flocklease::Error::LockTimeout { .. }) => log(&mut out, format!("T {pid}")),
                other => break other.unwrap(),
            }
        };
        match renewed {
            Grant::Granted(l) => {
                log(
                    &mut out,
                    format!("R {name} {t} {} {} {pid}", l.expiry.unix_nanos(), now_ns()),
                );
                std::thread::sleep(Duration::from_micros(rng.below(2000)));
            }
            Grant::Held => log(&mut out, format!("L {name} {t} {} {pid}", now_ns())),
        }
        log(&mut out, format!("X {name} {t} {} {pid}", now_ns()));
        release(&leases, &lease, &mut out, pid);
        log(&mut out, format!("Q {name} {t} {} {pid}", now_ns()));
    }
}

/// Releases, retrying while another worker stopped inside a transition keeps the lock.
fn release(leases: &flocklease::FlockLease, lease: &flocklease::Lease, out: &mut File, pid: u32) {
    loop {
        match leases.release(lease) {
            Err(flocklease::Error::LockTimeout { .. }) => log(out, format!("T {pid}")),
            other => return other.unwrap(),
        }
    }
}

/// The fenced resource: remembers the highest token it accepted per id (under its own lock).
/// A lower or equal token is refused; if its lease is still unexpired, that is a violation
/// (someone else got a token at least as high while this lease was live).
fn resource_enter(dir: &Path, name: &str, token: u64, expiry: i128) -> bool {
    let path = dir.join(format!("resource-{name}"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap();
    file.lock().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let highest: u64 = text.trim().parse().unwrap_or(0);
    let accepted = token > highest;
    let pid = std::process::id();
    let mut log_file = OpenOptions::new()
        .append(true)
        .open(dir.join("events.log"))
        .unwrap();
    if accepted {
        std::fs::write(&path, token.to_string()).unwrap();
    } else if now_ns() < expiry {
        log(
            &mut log_file,
            format!("V {name} {token} {} {pid}", now_ns()),
        );
    } else {
        log(
            &mut log_file,
            format!("F {name} {token} {} {pid}", now_ns()),
        );
    }
    accepted
}

struct Worker {
    child: RoleChild,
    stopped_until: Option<Instant>,
}

fn spawn_worker(dir: &str, log: &str, seed: u64) -> Worker {
    let mut child = RoleChild::spawn(ENTRY, "worker", &[dir, log, &seed.to_string()]);
    assert_eq!(child.line(), "ready");
    Worker {
        child,
        stopped_until: None,
    }
}

#[test]
fn crash_loop_soak() {
    if role().is_some() {
        return;
    }
    let secs: u64 = std::env::var("FLOCKLEASE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("FLOCKLEASE_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ns() as u64);
    eprintln!("soak: {secs}s, seed {seed} (FLOCKLEASE_SOAK_SEED to replay the schedule)");
    let mut rng = Rng(seed | 1);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().to_owned();
    let log_path = tmp.path().join("events.log");
    File::create(&log_path).unwrap();
    let log_str = log_path.to_str().unwrap().to_owned();
    let mut supervisor_log = OpenOptions::new().append(true).open(&log_path).unwrap();

    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|_| spawn_worker(&dir, &log_str, rng.next()))
        .collect();
    let (mut kills, mut stops) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10 + rng.below(50))); // the chaos schedule
        for w in workers.iter_mut() {
            if w.stopped_until.is_some_and(|t| Instant::now() >= t) {
                kill(w.child.pid(), Signal::SIGCONT).unwrap();
                w.stopped_until = None;
            }
        }
        let i = rng.below(WORKERS as u64) as usize;
        if workers[i].stopped_until.is_some() {
            continue;
        }
        if rng.below(10) < 3 {
            let pid = workers[i].child.pid();
            log(&mut supervisor_log, format!("K {pid} {}", now_ns()));
            let old = std::mem::replace(&mut workers[i], spawn_worker(&dir, &log_str, rng.next()));
            old.child.kill();
            kills += 1;
        } else {
            let pause = Duration::from_millis(rng.below(2 * TTL.as_millis() as u64));
            kill(workers[i].child.pid(), Signal::SIGSTOP).unwrap();
            workers[i].stopped_until = Some(Instant::now() + pause);
            stops += 1;
        }
    }
    for w in workers {
        let pid = w.child.pid();
        log(&mut supervisor_log, format!("K {pid} {}", now_ns()));
        let _ = kill(pid, Signal::SIGCONT);
        w.child.kill();
    }
    let report = analyse(&std::fs::read_to_string(&log_path).unwrap(), now_ns());
    let live = support::files_ending(tmp.path(), ".live").len();
    let temps = support::files_ending(tmp.path(), ".tmp").len();
    eprintln!(
        "soak: {} transitions ({} grants, {} renews, {} releases), {kills} SIGKILLs, {stops} SIGSTOPs, \
         {} critical sections, {} fenced stale entries, {} violations; {} transition-lock \
         timeouts behind stopped workers; fds per worker {:?}, at most {} threads per worker; \
         {live} .live and {temps} temporary files left",
        report.grants + report.renews + report.releases,
        report.grants,
        report.renews,
        report.releases,
        report.sections,
        report.fenced,
        report.violations.len(),
        report.lock_timeouts,
        report.fd_range,
        report.max_threads,
    );
    assert!(
        report.violations.is_empty(),
        "violations: {:#?}",
        report.violations
    );
    assert!(
        report.sections > 50,
        "the soak did too little work to mean anything"
    );
    assert!(kills > 0 && stops > 0);
    // A worker keeps one transition-lock descriptor per id it has used (a bounded cache) and
    // one liveness descriptor while it holds a lease; a leak would grow with every round.
    let (lo, hi) = report.fd_range;
    assert!(hi - lo <= IDS.len() + 1, "descriptors leak: {lo}..{hi}");
    // Waits start no thread: a worker is its main thread (libtest's runner adds one).
    assert!(
        report.max_threads <= 2,
        "{} threads in a worker",
        report.max_threads
    );
    // Each id keeps at most the current generation's file plus those of holders killed inside
    // the last takeover window; never one per crash.
    assert!(live <= IDS.len() * 3, "{live} .live files left");
    assert!(temps <= IDS.len(), "{temps} temporary files left");
}

#[derive(Default, Debug)]
struct Report {
    grants: u64,
    renews: u64,
    releases: u64,
    sections: u64,
    fenced: u64,
    violations: Vec<String>,
    fd_range: (usize, usize),
    max_threads: usize,
    lock_timeouts: u64,
}

#[derive(Debug, Clone)]
struct Section {
    pid: u32,
    token: u64,
    enter: i128,
    end: i128,
    /// (from, expiry) — the lease's expiry from each instant on.
    expiries: Vec<(i128, i128)>,
}

impl Section {
    fn expiry_at(&self, t: i128) -> i128 {
        self.expiries
            .iter()
            .filter(|(from, _)| *from <= t)
            .map(|(_, e)| *e)
            .next_back()
            .unwrap_or(self.expiries[0].1)
    }
}

fn analyse(log: &str, end: i128) -> Report {
    let mut r = Report::default();
    let mut granted: HashMap<&str, HashSet<u64>> = HashMap::new();
    let mut kill_at: HashMap<u32, i128> = HashMap::new();
    let mut open: HashMap<u32, Section> = HashMap::new();
    let mut done: BTreeMap<&str, Vec<Section>> = BTreeMap::new();
    let mut open_id: HashMap<u32, &str> = HashMap::new();
    let mut fds: HashMap<u32, (usize, usize)> = HashMap::new();
    for line in log.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| w.get(i).and_then(|s| s.parse::<i128>().ok());
        match w.as_slice() {
            ["G", name, tok, ..] => {
                r.grants += 1;
                let t: u64 = tok.parse().unwrap();
                if !granted.entry(name).or_default().insert(t) {
                    r.violations
                        .push(format!("token {t} of {name} granted twice"));
                }
            }
            ["E", name, tok, ..] if w.len() == 6 => {
                let pid = n(5).unwrap() as u32;
                open.insert(
                    pid,
                    Section {
                        pid,
                        token: tok.parse().unwrap(),
                        enter: n(4).unwrap(),
                        end,
                        expiries: vec![(n(4).unwrap(), n(3).unwrap())],
                    },
                );
                open_id.insert(pid, name);
            }
            ["R", ..] if w.len() == 6 => {
                r.renews += 1;
                if let Some(s) = open.get_mut(&(n(5).unwrap() as u32)) {
                    s.expiries.push((n(4).unwrap(), n(3).unwrap()));
                }
            }
            ["X", ..] if w.len() == 5 => {
                let pid = n(4).unwrap() as u32;
                if let (Some(mut s), Some(name)) = (open.remove(&pid), open_id.remove(&pid)) {
                    s.end = n(3).unwrap();
                    done.entry(name).or_default().push(s);
                }
            }
            ["Q", ..] => r.releases += 1,
            ["F", ..] => r.fenced += 1,
            ["V", name, tok, ..] => r.violations.push(format!(
                "resource saw token {tok} of {name} again while its lease was live"
            )),
            ["D", count, pid, threads] => {
                let (c, p): (usize, u32) = (count.parse().unwrap(), pid.parse().unwrap());
                let e = fds.entry(p).or_insert((c, c));
                *e = (e.0.min(c), e.1.max(c));
                r.max_threads = r.max_threads.max(threads.parse().unwrap());
            }
            ["T", _] => r.lock_timeouts += 1,
            ["K", pid, at] => {
                kill_at.insert(pid.parse().unwrap(), at.parse().unwrap());
            }
            _ => {} // a line cut by SIGKILL
        }
    }
    // Sections still open ended when their process was killed.
    for (pid, mut s) in open {
        s.end = kill_at.get(&pid).copied().unwrap_or(end);
        if let Some(name) = open_id.get(&pid) {
            done.entry(name).or_default().push(s);
        }
    }
    for (name, sections) in &done {
        r.sections += sections.len() as u64;
        for (i, a) in sections.iter().enumerate() {
            for b in &sections[i + 1..] {
                if a.pid == b.pid {
                    continue;
                }
                let start = a.enter.max(b.enter);
                if start >= a.end.min(b.end) {
                    continue;
                }
                if a.expiry_at(start) > start && b.expiry_at(start) > start {
                    r.violations.push(format!(
                        "{name}: pid {} (token {}) and pid {} (token {}) inside at once, both unexpired",
                        a.pid, a.token, b.pid, b.token
                    ));
                }
            }
        }
    }
    // Lowest and highest descriptor count of the worker whose count varied most.
    r.fd_range = fds
        .values()
        .copied()
        .max_by_key(|(lo, hi)| hi - lo)
        .unwrap_or((0, 0));
    r
}
