//! `flocklease run` under chaos (issue 31): real `run` processes take turns on one id while a
//! nemesis SIGKILLs and SIGSTOPs `run`, its watchdog and the job at random moments, and a
//! cleaner deletes liveness files. Jobs write lines to one shared log, each line with one
//! `write(2)` in `O_APPEND` mode, so the log's order is the order the writes happened in. Some
//! jobs ignore SIGTERM, some close every inherited descriptor, some leave a child writing in
//! their process group, and some outlast the TTL when stopped. `run`'s stderr is a file, a pipe
//! whose reader is gone, a full pipe nobody reads, or a `stty tostop` terminal whose
//! foreground it is; the nemesis stops a watchdog alone for 5-15 s now and then.
//!
//! The checker reads the log: a job's lines must all come before the next job's first line (no
//! job runs beside a later grant, PROTOCOL §7), and tokens must increase from job to job. It
//! prints `N runs, M kills/stops, K overlaps`; K must be 0.
//!
//! The nemesis never touches both `run` and the watchdog of one run: that is the documented
//! exception (both stopped or killed, PROTOCOL §7). The job is always fair game.
//!
//! Knobs, for a longer hunt or for another binary (e.g. an older build, to see the checker
//! catch what this test is there to catch): `FLOCKLEASE_CHAOS_SECS` (default 20),
//! `FLOCKLEASE_CHAOS_SEED` (printed at every run), `FLOCKLEASE_CHAOS_BIN`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cli_support::{BIN, cmdline, fill_pipe, on_tostop_terminal};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const ID: &str = "chaos";
const TTL: &str = "500ms";
/// Concurrent `run -w` loops on the one id.
const RUNNERS: usize = 3;
/// How long after the chaos a `run` may take to end (its `-w 20s`, a grace period, a 15 s stop
/// of its watchdog) before it counts as hung.
const HUNG: Duration = Duration::from_secs(40);

/// The job: `bash -c JOB bash NONCE LINES IGNORE_TERM CLOSE_FDS CHILD`. It writes `LINES`
/// lines `TOKEN NONCE SEQ` to `$LOG`, 10 ms apart; with `CHILD`, a background child in its
/// group writes as many (`TOKEN NONCE.c SEQ`).
const JOB: &str = r#"
n=$1; lines=$2
[ "$3" = 1 ] && trap '' TERM
if [ "$4" = 1 ]; then
    for fd in /proc/$$/fd/*; do k=${fd##*/}; [ "$k" -gt 2 ] && eval "exec $k>&-"; done 2>/dev/null
fi
if [ "$5" = 1 ]; then
    ( i=0; while [ $i -lt $lines ]; do echo "$FLOCKLEASE_TOKEN $n.c $i" >> "$LOG"; i=$((i+1)); sleep 0.01; done ) &
fi
i=0; while [ $i -lt $lines ]; do echo "$FLOCKLEASE_TOKEN $n $i" >> "$LOG"; i=$((i+1)); sleep 0.01; done
wait
"#;

/// xorshift64*: a seeded generator, so a failing schedule's seed can be run again.
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
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Which of a run's two supervisors the nemesis has chosen to hit (at most one of them).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    Run,
    Watchdog,
}

/// A live `run` process, as the nemesis sees it.
struct Live {
    pid: i32,
    /// Fixed at the first hit on `run` or the watchdog.
    side: Option<Side>,
    /// `run` is in the foreground of a terminal: its job's processes are killed, never stopped
    /// (a job stopped while it holds the terminal stops `run` too, as Ctrl-Z does, and no shell
    /// here says `fg`: that would be `run` down by its own job control).
    tty: bool,
}

#[derive(Default)]
struct Shared {
    live: Mutex<Vec<Live>>,
    /// Exit statuses of the runs (code, or 128 + signal).
    exits: Mutex<BTreeMap<i32, u32>>,
    runs: AtomicU64,
    kills: AtomicU64,
    stops: AtomicU64,
    /// Stops of a watchdog alone for many TTLs.
    long_stops: AtomicU64,
    /// Runs whose stderr was a broken or a full pipe; runs on a `tostop` terminal.
    odd_stderr: AtomicU64,
    terminals: AtomicU64,
    deleted: AtomicU64,
    /// Runs that had not ended [`HUNG`] after the chaos.
    hung: AtomicU64,
}

fn seed() -> u64 {
    std::env::var("FLOCKLEASE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        })
}

fn chaos_time() -> Duration {
    let secs = std::env::var("FLOCKLEASE_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

fn binary() -> String {
    std::env::var("FLOCKLEASE_CHAOS_BIN").unwrap_or_else(|_| BIN.to_owned())
}

/// One runner: `run -w` after `run -w` until `until`, each with a job of random length and
/// kind.
fn runner(
    k: usize,
    seed: u64,
    until: Instant,
    dir: PathBuf,
    log: PathBuf,
    errs: PathBuf,
    shared: Arc<Shared>,
) {
    let mut rng = Rng(seed);
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let nonce = format!("{k}-{n}");
        let lines = (5 + rng.below(60)).to_string();
        let flag = |rng: &mut Rng, p| if rng.chance(p) { "1" } else { "0" };
        let (ignore, close, child) = (flag(&mut rng, 40), flag(&mut rng, 30), flag(&mut rng, 30));
        // A grace period shorter than the TTL, and one much longer (issue 31.1).
        let grace = if rng.chance(50) { "100ms" } else { "3s" };
        let mut cmd = Command::new(binary());
        cmd.arg("run")
            .arg("--dir")
            .arg(&dir)
            .args([
                "--id", ID, "--ttl", TTL, "--grace", grace, "-w", "20s", "-q",
            ])
            .args(["--", "bash", "-c", JOB, "bash", &nonce, &lines])
            .args([ignore, close, child])
            .env("LOG", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // Where `run` and its watchdog speak (PROTOCOL §7.1): a file, a pipe whose reader is
        // gone, a full pipe nobody reads, or a `tostop` terminal whose foreground it is.
        let mut tty = false;
        let _terminal = match rng.below(100) {
            0..60 => {
                let err = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&errs)
                    .unwrap();
                cmd.stderr(err);
                None
            }
            60..75 => {
                let (read, write) = nix::unistd::pipe().unwrap();
                drop(read);
                cmd.stderr(std::fs::File::from(write));
                shared.odd_stderr.fetch_add(1, Ordering::Relaxed);
                None
            }
            75..85 => {
                let (read, write) = nix::unistd::pipe().unwrap();
                fill_pipe(&write);
                cmd.stderr(std::fs::File::from(write));
                shared.odd_stderr.fetch_add(1, Ordering::Relaxed);
                Some(read)
            }
            _ => {
                shared.terminals.fetch_add(1, Ordering::Relaxed);
                tty = true;
                Some(on_tostop_terminal(&mut cmd))
            }
        };
        let mut run = cmd.spawn().unwrap();
        let pid = run.id() as i32;
        shared.runs.fetch_add(1, Ordering::Relaxed);
        shared.live.lock().unwrap().push(Live {
            pid,
            side: None,
            tty,
        });
        // Bounded: a `run` blocked on its stderr or its watchdog never ends by itself, and is
        // a failure of its own (counted, then killed with its job).
        let mut killed = false;
        let status = loop {
            if let Some(status) = run.try_wait().unwrap() {
                break status;
            }
            if !killed && Instant::now() > until + HUNG {
                killed = true;
                shared.hung.fetch_add(1, Ordering::Relaxed);
                for p in children(pid) {
                    let _ = kill(Pid::from_raw(-p), Signal::SIGKILL);
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
                let _ = run.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        shared.live.lock().unwrap().retain(|l| l.pid != pid);
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        *shared.exits.lock().unwrap().entry(code).or_default() += 1;
    }
}

/// The nemesis: every 20–150 ms, SIGKILL (a third of the time) or SIGSTOP (the rest, resumed
/// 50 ms–1.5 s later, often past the TTL) one process of a random live run: `run`, its watchdog,
/// or a process of the job's side.
fn nemesis(seed: u64, until: Instant, shared: Arc<Shared>) {
    let mut rng = Rng(seed);
    let mut stopped: Vec<(i32, Instant)> = vec![];
    let resume = |stopped: &mut Vec<(i32, Instant)>, all: bool| {
        let now = Instant::now();
        stopped.retain(|&(pid, due)| {
            if all || due <= now {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
                false
            } else {
                true
            }
        });
    };
    while Instant::now() < until {
        std::thread::sleep(rng.millis(20, 150));
        resume(&mut stopped, false);
        let mut live = shared.live.lock().unwrap();
        if live.is_empty() {
            continue;
        }
        let i = rng.below(live.len() as u64) as usize;
        let run = live[i].pid;
        let kids = children(run);
        let (dogs, job): (Vec<i32>, Vec<i32>) = kids
            .into_iter()
            .partition(|&p| cmdline(p).contains("__watchdog"));
        let target = match rng.below(3) {
            0 if live[i].side != Some(Side::Watchdog) => {
                live[i].side = Some(Side::Run);
                run
            }
            1 if live[i].side != Some(Side::Run) && !dogs.is_empty() => {
                live[i].side = Some(Side::Watchdog);
                dogs[0]
            }
            _ if !job.is_empty() => job[rng.below(job.len() as u64) as usize],
            _ => continue,
        };
        let no_stop = live[i].tty && job.contains(&target);
        drop(live);
        if no_stop || rng.chance(33) {
            if kill(Pid::from_raw(target), Signal::SIGKILL).is_ok() {
                shared.kills.fetch_add(1, Ordering::Relaxed);
            }
        } else if kill(Pid::from_raw(target), Signal::SIGSTOP).is_ok() {
            shared.stops.fetch_add(1, Ordering::Relaxed);
            // A watchdog alone, now and then, for many TTLs (a debugger, a frozen cgroup):
            // `run` must not block on it, and must stop the job itself.
            let long = target != run && !job.contains(&target) && rng.chance(30);
            let stop = if long {
                shared.long_stops.fetch_add(1, Ordering::Relaxed);
                rng.millis(5_000, 15_000)
            } else {
                rng.millis(50, 1500)
            };
            stopped.push((target, Instant::now() + stop));
        }
    }
    resume(&mut stopped, true);
}

/// The children of `pid`, none once it is gone (the runner reaps it before it leaves the list).
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return vec![];
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// The cleaner: every 100–400 ms, deletes one liveness file of the lease directory (an
/// age-based tmp cleaner, or an operator).
fn cleaner(seed: u64, until: Instant, dir: PathBuf, shared: Arc<Shared>) {
    let mut rng = Rng(seed);
    while Instant::now() < until {
        std::thread::sleep(rng.millis(100, 400));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let live: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "live"))
            .collect();
        if live.is_empty() {
            continue;
        }
        let victim = &live[rng.below(live.len() as u64) as usize];
        if std::fs::remove_file(victim).is_ok() {
            shared.deleted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What the log says.
#[derive(Debug, Default)]
struct Verdict {
    /// Jobs that wrote at least one line.
    jobs: usize,
    /// Jobs whose first line comes before an earlier-started job's last line.
    overlaps: Vec<String>,
    /// Jobs whose token is not above the previous job's.
    tokens: Vec<String>,
}

/// Reads the log: each line is `TOKEN NONCE SEQ`; a job is a nonce (its child's `NONCE.c`
/// counts as the job).
fn check(log: &Path) -> Verdict {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    // nonce -> (token, first line, last line)
    let mut jobs: HashMap<String, (u64, usize, usize)> = HashMap::new();
    for (at, line) in text.lines().enumerate() {
        let mut f = line.split_whitespace();
        let (Some(token), Some(nonce)) = (f.next(), f.next()) else {
            panic!("malformed log line {at}: {line:?}");
        };
        let token: u64 = token.parse().unwrap();
        let nonce = nonce.trim_end_matches(".c").to_owned();
        let e = jobs.entry(nonce.clone()).or_insert((token, at, at));
        assert_eq!(e.0, token, "job {nonce} saw two tokens");
        e.2 = at;
    }
    let mut order: Vec<(String, (u64, usize, usize))> = jobs.into_iter().collect();
    order.sort_by_key(|(_, (_, first, _))| *first);
    let mut v = Verdict {
        jobs: order.len(),
        ..Verdict::default()
    };
    let mut latest: Option<(&str, u64, usize)> = None; // the job with the latest last line so far
    let mut prev_token = 0;
    for (nonce, (token, first, last)) in &order {
        if let Some((other, other_token, other_last)) = latest
            && other_last > *first
        {
            v.overlaps.push(format!(
                "job {nonce} (token {token}) started at line {first}; job {other} (token \
                 {other_token}) wrote on until line {other_last}"
            ));
        }
        if *token <= prev_token {
            v.tokens.push(format!(
                "job {nonce} has token {token} after token {prev_token}"
            ));
        }
        prev_token = prev_token.max(*token);
        if latest.is_none_or(|(_, _, l)| *last > l) {
            latest = Some((nonce, *token, *last));
        }
    }
    v
}

#[test]
fn the_job_never_runs_beside_a_later_grant_under_chaos() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("leases");
    let log = tmp.path().join("log");
    let errs = tmp.path().join("stderr");
    let seed = seed();
    let time = chaos_time();
    println!(
        "seed {seed} (FLOCKLEASE_CHAOS_SEED), {} s, binary {}",
        time.as_secs(),
        binary()
    );
    let until = Instant::now() + time;
    let shared = Arc::new(Shared::default());
    let mut threads = vec![];
    for k in 0..RUNNERS {
        let (d, l, e, s) = (dir.clone(), log.clone(), errs.clone(), shared.clone());
        let seed = seed.wrapping_add(k as u64 + 1);
        threads.push(std::thread::spawn(move || {
            runner(k, seed, until, d, l, e, s)
        }));
    }
    {
        let s = shared.clone();
        threads.push(std::thread::spawn(move || nemesis(seed ^ 0x9e37, until, s)));
        let (d, s) = (dir.clone(), shared.clone());
        threads.push(std::thread::spawn(move || {
            cleaner(seed ^ 0x7f4a, until, d, s)
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let v = check(&log);
    let runs = shared.runs.load(Ordering::Relaxed);
    let kills = shared.kills.load(Ordering::Relaxed);
    let stops = shared.stops.load(Ordering::Relaxed);
    println!(
        "{runs} runs, {} kills/stops, {} overlaps",
        kills + stops,
        v.overlaps.len()
    );
    println!(
        "  {} jobs wrote, {kills} kills, {stops} stops ({} of a watchdog for 5-15 s), {} \
         liveness files deleted, {} runs with a broken or full stderr, {} on a tostop \
         terminal, run exit statuses {:?}",
        v.jobs,
        shared.long_stops.load(Ordering::Relaxed),
        shared.deleted.load(Ordering::Relaxed),
        shared.odd_stderr.load(Ordering::Relaxed),
        shared.terminals.load(Ordering::Relaxed),
        shared.exits.lock().unwrap()
    );
    for o in v.overlaps.iter().chain(&v.tokens).take(20) {
        println!("  {o}");
    }
    let hung = shared.hung.load(Ordering::Relaxed);
    assert!(
        v.overlaps.is_empty() && v.tokens.is_empty() && hung == 0,
        "{} overlaps, {} token faults, {hung} hung runs (seed {seed}); run's stderr:\n{}",
        v.overlaps.len(),
        v.tokens.len(),
        std::fs::read_to_string(&errs).unwrap_or_default()
    );
    // The chaos must have happened, or a zero proves nothing.
    assert!(
        v.jobs >= 10 && kills >= 5 && stops >= 10,
        "too little chaos: {v:?}"
    );
}

#[test]
fn the_checker_sees_an_overlap_and_a_repeated_token() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("log");
    std::fs::write(&log, "1 a 0\n1 a 1\n2 b 0\n2 b 1\n3 c 0\n2 b.c 2\n3 c 1\n").unwrap();
    let v = check(&log);
    assert_eq!(v.jobs, 3);
    assert_eq!(v.overlaps.len(), 1, "{v:?}");
    assert!(v.overlaps[0].starts_with("job c"), "{v:?}");
    assert!(v.tokens.is_empty(), "{v:?}");
    std::fs::write(&log, "1 a 0\n2 b 0\n2 c 0\n").unwrap();
    let v = check(&log);
    assert!(v.overlaps.is_empty(), "{v:?}");
    assert_eq!(v.tokens.len(), 1, "{v:?}");
}
