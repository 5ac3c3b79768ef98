//! Lockstep: the model and the real adapter, one step at a time.
//!
//! Each model process is a real `FlockLease` instance over one temporary lease directory (its
//! own descriptors; a crash drops the instance), each call a `Stepper` that performs the very
//! I/O step the model's process takes, faults go through the adapter's fault seam, the clock
//! is a `ManualClock` one second per tick, and every other actor's action (the cleaner's
//! deletions and replacements, the observer's shared lock, the Go-style prober's create and
//! exclusive lock) is done on the real files. After every step the directory is compared
//! with the model's state — the record's bytes, which liveness files exist, what they are,
//! whether the record's tag is the file's, who can lock them, what stands at `<stem>.lock` —
//! and every call's answer with the model's.
//!
//! Schedules: the paths the checker finds (counterexamples of planted bugs replayed on the
//! correct model, and a witness of every `sometimes` scenario), then seeded random walks of
//! the model. A divergence fails with the schedule printed as a ready-to-paste regression test.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write as _;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use flocklease::driver::Step;
use flocklease::fault::FaultHook;
use flocklease::flock::Stepper;
use flocklease::machine::{Event, FinalCheck, Outcome, Then};
use flocklease::record::{self, LiveTag};
use flocklease::{Clock, Durability, FlockLease, ManualClock, Owner};
use flocklease_model::report::SplitMix;
use flocklease_model::{
    Action, Change, LeaseModel, LockAt, Locker, Plant, Planted, Said, State, Tamper, Target, What,
    at, report, session, ticks,
};
use stateright::{Checker, HasDiscoveries, Model};

/// How many seeded random walks (besides the checker's paths).
const WALKS: u64 = 10_000;
/// The longest random walk, in actions.
const WALK_LEN: usize = 40;
/// Tokens whose liveness files are compared.
const TOKENS: u64 = 6;

/// The longest a real step may take. Each is one system call or a few, none of which waits (a
/// lock held by another is the stepper's `Blocked`), so a step still under way after this is
/// stuck: the watchdog fails the test rather than let it hang (a read loop that retried every
/// error spun on a planted directory until the mutation run's timeout killed it).
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// The real steps under way, by the thread running them: when each began, and what it is.
static UNDER_WAY: Mutex<BTreeMap<String, (Instant, String)>> = Mutex::new(BTreeMap::new());

/// A real step under way, known to the watchdog until dropped.
struct UnderWay(String);

impl UnderWay {
    fn begin(what: String) -> UnderWay {
        static WATCHDOG: Once = Once::new();
        WATCHDOG.call_once(|| {
            std::thread::spawn(|| {
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    let under_way = UNDER_WAY.lock().unwrap_or_else(|e| e.into_inner());
                    for (thread, (since, what)) in under_way.iter() {
                        if since.elapsed() > STEP_LIMIT {
                            // Past the test harness's capture, which the exit would lose.
                            let _ = writeln!(
                                std::io::stderr(),
                                "{thread}: a real step ({what}) has not returned in \
                                 {STEP_LIMIT:?}: the adapter is stuck"
                            );
                            std::process::exit(1);
                        }
                    }
                }
            });
        });
        let thread = format!("{:?}", std::thread::current().id());
        UNDER_WAY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(thread.clone(), (Instant::now(), what));
        UnderWay(thread)
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        UNDER_WAY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.0);
    }
}

/// The configuration the walks explore: the default's bounds, every actor.
fn model() -> LeaseModel {
    LeaseModel {
        name: "lockstep",
        tamper: Tamper {
            moves: true,
            ..Tamper::ALL
        },
        cleaner: 2,
        observer: true,
        go_prober: true,
        // The adapter's fenced section has no step-by-step seam (yet): the checker's alone.
        fenced: false,
        ..LeaseModel::default()
    }
}

#[test]
fn lockstep_with_the_real_adapter() {
    let m = model();
    let mut schedules: Vec<Vec<(Action, u8)>> = vec![];
    // The checker's paths: a planted bug's counterexample (replayed on the correct model as
    // far as it is a valid schedule there), and a witness of every scenario.
    let started = std::time::Instant::now();
    let planted = LeaseModel {
        planted: Some(Planted::CreateThenLock),
        max_token: 1,
        cleaner: 1,
        tamper: Tamper::DELETE_LIVE,
        observer: false,
        go_prober: false,
        host_crash: false,
        ..m.clone()
    };
    for name in [flocklease_model::props::names::ONE_HOLDER] {
        if let Some(path) = report::shortest(&planted, name) {
            schedules.push(path.into_actions().into_iter().map(|a| (a, 0)).collect());
        }
    }
    let small = LeaseModel {
        max_token: 1,
        cleaner: 1,
        ..m.clone()
    };
    let sometimes: std::collections::BTreeSet<&'static str> = small
        .properties()
        .iter()
        .filter(|p| p.expectation == stateright::Expectation::Sometimes)
        .map(|p| p.name)
        .collect();
    let checker = small
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AllOf(sometimes))
        .spawn_bfs()
        .join();
    for (_, path) in checker.discoveries() {
        schedules.push(path.into_actions().into_iter().map(|a| (a, 0)).collect());
    }
    let from_checker = schedules.len();
    eprintln!(
        "the checker's paths: {from_checker} in {:?}",
        started.elapsed()
    );
    let (mut steps, mut divergences) = (0usize, 0usize);
    for schedule in &schedules {
        match replay(&m, schedule, false) {
            Ok(n) => steps += n,
            Err(report) => {
                divergences += 1;
                eprintln!("{report}");
            }
        }
    }
    let (walked, diverged) = walks(&m, WALKS);
    steps += walked;
    divergences += diverged;
    let n = schedules.len() + WALKS as usize;
    // Written to the process's stderr directly, past the test harness's capture, so that
    // `cargo test` (and CI's log) shows the count.
    let _ = writeln!(
        std::io::stderr(),
        "lockstep: {n} schedules ({from_checker} from the checker, {WALKS} random walks), \
         {steps} steps compared, {divergences} divergences"
    );
    assert_eq!(divergences, 0, "the model and the real adapter diverged");
}

/// How many seeded random walks with records without a tag.
const GO_WALKS: u64 = 3_000;

/// Records without a tag, the Go package's (`--config go-records`): every process writes its
/// records as the Go package does (the real instances through a test-only switch of the
/// adapter's, `FlockLeaseBuilder::untagged_records`), so a probe takes any regular file at the
/// generation's name for its own and lets the lock decide (`machine::own_liveness` with no
/// tag); the cleaner plants FIFOs and directories there, moves the file aside and back,
/// deletes it. Seeded random walks, compared after every step as above.
#[test]
fn lockstep_with_records_without_a_tag() {
    let m = LeaseModel {
        name: "lockstep, go-records",
        untagged: true,
        ..model()
    };
    let (steps, divergences) = walks(&m, GO_WALKS);
    let _ = writeln!(
        std::io::stderr(),
        "lockstep, records without a tag: {GO_WALKS} random walks, {steps} steps compared, \
         {divergences} divergences"
    );
    assert_eq!(divergences, 0, "the model and the real adapter diverged");
}

/// A schedule the checker found once, replayed on the correct model and the real adapter:
/// paste a divergence report's schedule here to keep it.
#[test]
fn regressions() {
    use Action::*;
    use Change::*;
    use Plant::*;
    use Target::*;
    use flocklease::driver::CommitStep::*;
    use flocklease::driver::Io::{Adopt, Begin, Commit, Probe, Unlock};
    use flocklease_model::Kind::*;
    let m = model();
    // Process 0 acquired the lease: every step of its fresh acquire.
    let acquired = vec![
        (Call(0, Acquire), 0),
        (Step(0, Begin), 0),
        (Step(0, Commit(LockLive)), 0),
        (Step(0, Commit(WriteTemp)), 0),
        (Step(0, Commit(SyncTemp)), 0),
        (Step(0, Commit(Point)), 0),
        (Step(0, Commit(SyncDir)), 0),
        (Step(0, Adopt), 0),
        (Step(0, Unlock), 0),
    ];
    for schedule in [
        // A deleted liveness file restored by a renew: until the renew commits, the new file
        // carries a fresh tag the record does not name yet (the model said "the record's").
        [
            acquired.clone(),
            vec![
                (Tamper(Live, Delete), 0),
                (Call(0, Renew), 0),
                (Step(0, Begin), 0),
                (Step(0, Commit(EnsureLive)), 0),
                (Step(0, Commit(WriteTemp)), 0),
                (Step(0, Commit(SyncTemp)), 0),
                (Step(0, Commit(Point)), 0),
            ],
        ]
        .concat(),
        // The holder's liveness file moved aside, the renew restoring it and committing its
        // fresh tag, the original put back: it reads as not the generation's own (a restore
        // that reused the record's tag let it read dead, and the rival took over).
        [
            acquired.clone(),
            vec![
                (Tamper(Live, MoveAside), 0),
                (Call(0, Renew), 0),
                (Step(0, Begin), 0),
                (Step(0, Commit(EnsureLive)), 0),
                (Step(0, Commit(WriteTemp)), 0),
                (Step(0, Commit(SyncTemp)), 0),
                (Step(0, Commit(Point)), 0),
                (Step(0, Unlock), 0),
                (Tamper(Live, PutBack), 0),
                (Call(1, Acquire), 0),
                (Step(1, Begin), 0),
                (Step(1, Probe { token: 1 }), 0),
                (Step(1, Unlock), 0),
            ],
        ]
        .concat(),
        // The record replaced between a renew's read and its commit: the commit refuses,
        // since the record is no longer the file the transition read, whatever its lock's
        // identity (a commit that checked the lock alone renamed over it).
        [
            acquired.clone(),
            vec![
                (Call(0, Renew), 0),
                (Step(0, Begin), 0),
                (Step(0, Commit(EnsureLive)), 0),
                (Step(0, Commit(WriteTemp)), 0),
                (Step(0, Commit(SyncTemp)), 0),
                (Tamper(Record, Replace(Plain)), 0),
                (Step(0, Commit(Point)), 0),
                (Call(1, Acquire), 0),
            ],
        ]
        .concat(),
        // The planted create-then-lock restore's counterexample, as far as it is a schedule
        // of the correct adapter: the restore fails (at its lock, the second fault point of
        // the step), the rival is answered held.
        [
            acquired.clone(),
            vec![
                (Tamper(Live, Delete), 0),
                (Call(0, Renew), 0),
                (Step(0, Begin), 0),
                (Fail(0, Commit(EnsureLive)), 1),
                (Call(1, Acquire), 0),
                (Step(1, Begin), 0),
                (Step(1, Probe { token: 1 }), 0),
                (Step(1, Unlock), 0),
            ],
        ]
        .concat(),
        // A liveness file replaced by a directory: the renew cannot publish over it; a FIFO
        // at the lock's name fails the next call.
        [
            acquired.clone(),
            vec![
                (Tamper(Live, Replace(Dir)), 0),
                (ObserverLock, 0),
                (Call(0, Renew), 0),
                (Step(0, Begin), 0),
                (Step(0, Commit(EnsureLive)), 0),
                (ObserverUnlock, 0),
                (Tamper(Lock, Replace(Fifo)), 0),
                (Call(1, Acquire), 0),
            ],
        ]
        .concat(),
    ] {
        replay(&m, &schedule, true).unwrap_or_else(|r| panic!("{r}"));
    }
}

/// Seeds `0..n` walked ([`walk`]) until the first divergence, which is printed. Returns the
/// steps compared and the divergences (0 or 1).
fn walks(m: &LeaseModel, n: u64) -> (usize, usize) {
    let mut steps = 0;
    for seed in 0..n {
        match walk(m, seed) {
            Ok(k) => steps += k,
            Err(report) => {
                eprintln!("{report}");
                return (steps, 1);
            }
        }
    }
    (steps, 0)
}

/// A seeded random walk of the model, run in lockstep. Returns the steps compared.
fn walk(m: &LeaseModel, seed: u64) -> Result<usize, String> {
    let mut rng = SplitMix::new(seed);
    let mut real = Real::new(m);
    let mut s = m.initial();
    let mut done = vec![];
    for _ in 0..WALK_LEN {
        let mut actions = vec![];
        m.actions(&s, &mut actions);
        // A power loss cannot be done to real files here.
        actions.retain(|a| !matches!(a, Action::HostCrash | Action::LoseLiveness(..)));
        let mut next = None;
        while !actions.is_empty() {
            let a = actions.swap_remove(rng.below(actions.len()));
            if m.next_state(&s, a).is_some() {
                next = Some(a);
                break;
            }
        }
        let Some(a) = next else { break };
        // Which fault point of the step fails, counted from the first.
        let k = u8::try_from(rng.below(3)).unwrap_or(0);
        done.push((a, k));
        s = real
            .apply(m, &s, a, k)
            .map_err(|e| divergence(&done, &format!("seed {seed}: {e}")))?;
    }
    Ok(done.len())
}

/// Replays `schedule` (stopping where the model does not offer the next action, unless
/// `strict`). Returns the steps compared.
fn replay(m: &LeaseModel, schedule: &[(Action, u8)], strict: bool) -> Result<usize, String> {
    let mut real = Real::new(m);
    let mut s = m.initial();
    let mut done = vec![];
    for &(a, k) in schedule {
        if matches!(a, Action::HostCrash | Action::LoseLiveness(..)) {
            break;
        }
        let mut offered = vec![];
        m.actions(&s, &mut offered);
        if !offered.contains(&a) || m.next_state(&s, a).is_none() {
            if strict {
                return Err(divergence(
                    &done,
                    &format!("the model does not offer {a:?}"),
                ));
            }
            break;
        }
        done.push((a, k));
        s = real.apply(m, &s, a, k).map_err(|e| divergence(&done, &e))?;
    }
    Ok(done.len())
}

fn divergence(done: &[(Action, u8)], what: &str) -> String {
    let mut out = format!(
        "DIVERGENCE after {} actions: {what}\nregression test (paste into `regressions`):\n        vec![\n",
        done.len()
    );
    for (a, k) in done {
        let _ = writeln!(out, "            ({a:?}, {k}),");
    }
    out.push_str("        ],\n");
    out
}

/// The real side: one lease directory, one instance per model process.
struct Real {
    dir: tempfile::TempDir,
    clock: ManualClock,
    ttl: Duration,
    insts: Vec<FlockLease>,
    /// Per process: fail the fault point this many points into the step (-1: none).
    armed: Vec<Arc<AtomicIsize>>,
    fired: Vec<Arc<AtomicBool>>,
    calls: Vec<Option<Stepper>>,
    /// Per process: its owner, and its call's final expiry check.
    owners: Vec<Owner>,
    checks: Vec<FinalCheck>,
    /// A step's answer kept while the caller decides what the model did.
    last_done: Vec<Option<Option<Result<Outcome, flocklease::Error>>>>,
    observer: Option<File>,
    go: Option<File>,
    /// Where the cleaner moves files aside (outside the lease directory).
    aside: tempfile::TempDir,
    /// The instances write records without a tag (the Go package's).
    untagged: bool,
}

impl Real {
    fn new(m: &LeaseModel) -> Real {
        let mut real = Real {
            dir: tempfile::tempdir().unwrap(),
            clock: ManualClock::new(at(0)),
            ttl: Duration::from_secs(u64::from(m.ttl_ticks)),
            insts: vec![],
            armed: vec![],
            fired: vec![],
            calls: vec![],
            owners: (0..m.procs).map(|p| m.owner(p)).collect(),
            checks: vec![FinalCheck::default(); m.procs],
            last_done: vec![],
            observer: None,
            go: None,
            aside: tempfile::tempdir().unwrap(),
            untagged: m.untagged,
        };
        for _ in 0..m.procs {
            real.armed.push(Arc::new(AtomicIsize::new(-1)));
            real.fired.push(Arc::default());
            real.calls.push(None);
            real.last_done.push(None);
        }
        for p in 0..m.procs {
            let inst = real.instance(p);
            real.insts.push(inst);
        }
        real
    }

    fn instance(&self, p: usize) -> FlockLease {
        let (armed, fired) = (Arc::clone(&self.armed[p]), Arc::clone(&self.fired[p]));
        let hook: FaultHook = Arc::new(move |_, _| {
            let k = armed.load(Ordering::SeqCst);
            if k > 0 {
                armed.store(k - 1, Ordering::SeqCst);
            }
            (k == 0).then(|| {
                armed.store(-1, Ordering::SeqCst);
                fired.store(true, Ordering::SeqCst);
                std::io::Error::other("injected")
            })
        });
        FlockLease::builder(self.dir.path())
            .clock(Arc::new(self.clock.clone()))
            .ttl(self.ttl)
            .durability(Durability::Full)
            .faults(hook)
            .untagged_records(self.untagged)
            .open()
            .unwrap()
    }

    fn stem(&self) -> String {
        session().stem().to_owned()
    }

    fn live(&self, t: u64) -> PathBuf {
        self.dir.path().join(format!("{}.{t}.live", self.stem()))
    }

    fn lock_path(&self) -> PathBuf {
        self.dir.path().join(format!("{}.lock", self.stem()))
    }

    fn record_path(&self) -> PathBuf {
        self.dir.path().join(format!("{}.lease.json", self.stem()))
    }

    /// Does action `a` on the real side and in the model (from `s`), and compares; returns
    /// the model's next state. A failing step fails the real step's `k`-th fault point; if
    /// the real step has fewer, it succeeded, and so does the model's.
    fn apply(&mut self, m: &LeaseModel, s: &State, a: Action, k: u8) -> Result<State, String> {
        let _watched = UnderWay::begin(format!("{a:?}"));
        let mut n = m
            .next_state(s, a)
            .ok_or_else(|| format!("the model cannot take {a:?}"))?;
        match a {
            Action::Call(p, kind) => {
                let event = m.call_event(s, p, kind);
                self.calls[p] = Some(self.insts[p].stepper(&session(), event));
                self.checks[p] = FinalCheck::default();
                self.step(p, &n, None)?;
            }
            Action::Step(p, _) => {
                self.step(p, &n, None)?;
            }
            Action::Fail(p, io) => {
                if !self.step(p, &n, Some(k))? {
                    n = m
                        .next_state(s, Action::Step(p, io))
                        .ok_or("the model cannot take the step without its fault")?;
                    let answer = self.last_done[p].take();
                    self.check_answer(p, &n, answer)?;
                }
            }
            Action::Crash(p) => {
                self.calls[p] = None;
                let fresh = self.instance(p);
                // The old instance's descriptors close: what the kernel does at a crash.
                drop(std::mem::replace(&mut self.insts[p], fresh));
            }
            Action::Tick => self.clock.advance(Duration::from_secs(1)),
            Action::Tamper(target, change) => self.tamper(s, target, change),
            Action::ObserverLock => {
                let t = s.held_token().unwrap();
                let f = open_probe(&self.live(t)).unwrap();
                f.try_lock_shared()
                    .map_err(|e| format!("the observer's shared lock failed: {e:?}"))?;
                self.observer = Some(f);
            }
            Action::ObserverUnlock => self.observer = None,
            Action::GoCreate => {
                let t = s.held_token().unwrap();
                // The Go package opens with O_CREATE; the file is created empty.
                drop(
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(false)
                        .open(self.live(t))
                        .unwrap(),
                );
            }
            Action::GoLock => {
                let t = s.held_token().unwrap();
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .custom_flags(nix::libc::O_NONBLOCK)
                    .open(self.live(t))
                    .unwrap();
                f.try_lock()
                    .map_err(|e| format!("the Go-style prober's lock failed: {e:?}"))?;
                self.go = Some(f);
            }
            Action::GoUnlock => self.go = None,
            Action::HostCrash
            | Action::LoseLiveness(..)
            | Action::NoticeLoss(_)
            | Action::SessionEnds(_)
            | Action::Relock(_)
            | Action::StandbyConfirms
            | Action::SecondStandbyConfirms
            | Action::Refuse(_)
            | Action::FailCaughtUp(_)
            | Action::Failover
            | Action::FailoverToSecond
            | Action::Fence(_)
            | Action::FenceStep(..) => unreachable!("not run in lockstep"),
        }
        let (real, model) = (self.view(&n), model_view(&n));
        if real != model {
            return Err(format!(
                "after {a:?} the directory differs\n  real:  {real:?}\n  model: {model:?}\n  \
                 model state: {n:?}"
            ));
        }
        Ok(n)
    }

    /// Performs process `p`'s next step (failing its `fail`-th fault point, if given) and
    /// compares its answer with the model's. Returns whether the fault fired (true without
    /// one); when it did not, the answer is compared by the caller with the fault-free step's.
    fn step(&mut self, p: usize, n: &State, fail: Option<u8>) -> Result<bool, String> {
        self.fired[p].store(false, Ordering::SeqCst);
        self.armed[p].store(fail.map_or(-1, isize::from), Ordering::SeqCst);
        let stepper = self.calls[p].as_mut().ok_or("no call under way")?;
        let step = stepper.next(&self.insts[p]);
        self.armed[p].store(-1, Ordering::SeqCst);
        let fired = fail.is_none() || self.fired[p].load(Ordering::SeqCst);
        let answer = match step {
            Step::Blocked => {
                return Err(format!(
                    "p{p}: the real step is blocked, the model's is not"
                ));
            }
            Step::Continue => None,
            Step::Done(result) => {
                self.calls[p] = None;
                self.at_return(p, result)
            }
        };
        if !fired {
            self.last_done[p] = Some(answer);
            return Ok(false);
        }
        self.check_answer(p, n, Some(answer))?;
        Ok(true)
    }

    /// The front's final expiry check on the run's answer, as a call makes it
    /// (`machine::FinalCheck` on the instance's clock): the answer, or `None` when the call goes
    /// on with a renew of the grant (a stepper of its own, whose steps the model takes too).
    fn at_return(
        &mut self,
        p: usize,
        result: Result<Outcome, flocklease::Error>,
    ) -> Option<Result<Outcome, flocklease::Error>> {
        match self.checks[p].next(result, || self.clock.now()) {
            Then::Return(answer) => Some(answer),
            Then::Renew { token } => {
                let owner = self.owners[p].clone();
                let event = Event::Renew { owner, token };
                self.calls[p] = Some(self.insts[p].stepper(&session(), event));
                None
            }
        }
    }

    /// Compares what process `p`'s real step answered (`None`: nothing recorded) with the
    /// model's process after it.
    fn check_answer(
        &mut self,
        p: usize,
        n: &State,
        answer: Option<Option<Result<Outcome, flocklease::Error>>>,
    ) -> Result<(), String> {
        let answer = answer.ok_or("no real answer recorded")?;
        let model_done = n.procs[p].call.is_none();
        match answer {
            None if model_done => Err(format!(
                "p{p}: the model's call ended ({:?}), the real one goes on",
                n.procs[p].last
            )),
            None => Ok(()),
            Some(result) if !model_done => Err(format!(
                "p{p}: the real call ended ({result:?}), the model's goes on"
            )),
            Some(result) => {
                let said = match &result {
                    Ok(Outcome::Granted { token, expiry }) => Said::Granted(*token, ticks(*expiry)),
                    Ok(Outcome::Held) => Said::Held,
                    Ok(Outcome::Released) => Said::Released,
                    Err(_) => Said::Failed,
                };
                let model_said = n.procs[p].last.map(|(_, said)| said);
                if model_said == Some(said) {
                    Ok(())
                } else {
                    Err(format!(
                        "p{p}: the real call answered {result:?}, the model's {model_said:?}"
                    ))
                }
            }
        }
    }

    fn tamper(&mut self, s: &State, target: Target, change: Change) {
        let aside = self.aside.path().join("moved");
        match (target, change) {
            (Target::Live, Change::MoveAside) => {
                fs::rename(self.live(s.held_token().unwrap()), &aside).unwrap();
                return;
            }
            (Target::Live, Change::PutBack) => {
                fs::rename(&aside, self.live(s.aside_live.unwrap().0)).unwrap();
                return;
            }
            (Target::Lock, Change::MoveAside) => {
                fs::rename(self.lock_path(), &aside).unwrap();
                return;
            }
            (Target::Lock, Change::PutBack) => {
                fs::rename(&aside, self.lock_path()).unwrap();
                return;
            }
            _ => {}
        }
        let path = match target {
            Target::Live => self.live(s.held_token().unwrap()),
            Target::Lock => self.lock_path(),
            Target::Record => self.record_path(),
            Target::Temp(p) => {
                let stepper = self.calls[p].as_ref().unwrap();
                stepper.temp_path().unwrap().to_owned()
            }
        };
        clear(&path);
        if let Change::Replace(plant) = change {
            match plant {
                Plant::Plain => fs::write(&path, b"").unwrap(),
                Plant::Fifo => {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
                }
                Plant::Dir => fs::create_dir(&path).unwrap(),
            }
            // A record replaced by a regular file that is not a record.
            if target == Target::Record && plant == Plant::Plain {
                fs::write(&path, b"not a record").unwrap();
            }
        }
    }

    fn view(&self, n: &State) -> View {
        let (record, tag) = match fs::symlink_metadata(self.record_path()) {
            Err(_) => (Rec::Missing, None),
            Ok(meta) if meta.is_dir() => (Rec::Bad(Plant::Dir), None),
            Ok(meta) if meta.file_type().is_fifo() => (Rec::Bad(Plant::Fifo), None),
            Ok(_) => match record::decode_tagged(&fs::read(self.record_path()).unwrap()) {
                Ok((r, tag)) => (
                    Rec::Good {
                        owner: r.owner,
                        token: r.token,
                        expiry: ticks(r.expiry),
                        tagged: tag.is_some(),
                    },
                    tag,
                ),
                Err(_) => (Rec::Bad(Plant::Plain), None),
            },
        };
        let lock = match fs::symlink_metadata(self.lock_path()) {
            Err(_) => LockView::Missing,
            Ok(meta) if meta.is_file() => LockView::File,
            Ok(_) => LockView::NotAFile,
        };
        let record_token = match &record {
            Rec::Good { token, owner, .. } if !owner.is_empty() => Some(*token),
            _ => None,
        };
        let _ = n;
        let mut live = BTreeMap::new();
        for t in 0..TOKENS {
            let path = self.live(t);
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let kind = if meta.is_dir() {
                LiveKind::Dir
            } else if meta.file_type().is_fifo() {
                LiveKind::Fifo
            } else {
                let content = fs::read(&path).unwrap();
                match LiveTag::parse(&content) {
                    Some(found) => LiveKind::Tagged {
                        records: record_token == Some(t) && tag == Some(found),
                    },
                    None => LiveKind::Plain,
                }
            };
            let locked = open_probe(&path)
                .is_ok_and(|f| matches!(f.try_lock_shared(), Err(TryLockError::WouldBlock)));
            live.insert(t, (kind, locked));
        }
        View { record, lock, live }
    }
}

fn model_view(n: &State) -> View {
    let record = match (&n.record, n.record_bad) {
        (_, Some(plant)) => Rec::Bad(plant),
        (None, None) => Rec::Missing,
        (Some(r), None) => Rec::Good {
            owner: r.owner.clone(),
            token: r.token,
            expiry: ticks(r.expiry),
            tagged: n.record_tag.is_some(),
        },
    };
    let lock = match n.lock_at {
        LockAt::Missing => LockView::Missing,
        LockAt::File(_) => LockView::File,
        LockAt::NotAFile => LockView::NotAFile,
    };
    let record_token = n.held_token().filter(|_| n.record_bad.is_none());
    let live = n
        .live
        .iter()
        .filter(|(t, _)| **t < TOKENS)
        .map(|(t, f)| {
            let kind = match f.what {
                What::Own(q) => LiveKind::Tagged {
                    records: record_token == Some(*t)
                        && n.record_tag == Some(q)
                        && !f.restored
                        && !f.old,
                },
                What::Plain => LiveKind::Plain,
                What::Fifo => LiveKind::Fifo,
                What::Dir => LiveKind::Dir,
            };
            let locked = matches!(f.holder, Some(Locker::Proc(_) | Locker::Go));
            (*t, (kind, locked))
        })
        .collect();
    View { record, lock, live }
}

/// What the comparison looks at.
#[derive(Debug, PartialEq, Eq)]
struct View {
    record: Rec,
    lock: LockView,
    /// Liveness files by token: what they are, and whether an exclusive lock is held on them.
    live: BTreeMap<u64, (LiveKind, bool)>,
}

#[derive(Debug, PartialEq, Eq)]
enum Rec {
    Missing,
    Bad(Plant),
    Good {
        owner: String,
        token: u64,
        expiry: u8,
        tagged: bool,
    },
}

#[derive(Debug, PartialEq, Eq)]
enum LockView {
    Missing,
    File,
    NotAFile,
}

#[derive(Debug, PartialEq, Eq)]
enum LiveKind {
    /// A regular file carrying a tag; `records`: the tag the record names, for the record's
    /// generation.
    Tagged {
        records: bool,
    },
    Plain,
    Fifo,
    Dir,
}

/// Opens a liveness file as a probe does (read-only, no link followed, never blocking).
fn open_probe(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
}

/// Removes whatever stands at `path` (the cleaner's plants are empty directories).
fn clear(path: &Path) {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir(path).unwrap(),
        Ok(_) => fs::remove_file(path).unwrap(),
        Err(_) => {}
    }
}
