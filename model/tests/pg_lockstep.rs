//! Lockstep with PostgreSQL, one statement at a time: the real `PgLease` against a throwaway
//! server and the model's PostgreSQL backend, driven by the same seeded random schedules.
//!
//! Each call runs on a `PgStepper`, the very `PgTx` and `driver::Run` a call runs, at statement
//! grain: the model's `Begin` is the call's first round trip (the row locked and read), its
//! `Commit(EnsureLive)` the re-lock on a fresh connection, its `Commit(Point)` the one
//! statement that takes the new generation's lock, updates the row and commits (releasing the
//! row lock), its `Cleanup` the unlock of a closed generation, and its `Unlock` the end of a
//! transaction that committed nothing. Another process's statements, a tick of the clock (one
//! `ManualClock` for every instance, one second per tick), a crash (the process's call and
//! instance dropped, its sessions ended on the server) and the server ending a holder's
//! liveness session (`pg_terminate_backend`, then the test waits until the holder is told:
//! the model's `LoseLiveness(p, ServerFirst)` then `NoticeLoss(p)`) come between any two of
//! them, and so does a commit statement the server refuses (the model's `Refuse(p)`, injected
//! by the fault hook at `PgStep::Commit`). The session ended may be that of a new generation
//! a call committed and has not adopted yet (its transaction's connection): the test then waits
//! until the call's connection has seen it end (`PgStepper::session_ended`) before its next
//! statement. Left to the checker: the other order of a liveness loss (the holder seeing its
//! connection break while the server's session lives on), a call's steps between a loss and
//! its holder seeing it (the test does both in one action), and the other injected faults.
//!
//! After every action the test compares the step each process takes next, each call's
//! answer, the row (owner, token, expiry) and, for every token, how many sessions hold its
//! advisory lock exclusively, with the model's state, and that no instance says the lease
//! store is gone (the walks never drop the table; the PostgreSQL backend answers with the
//! front's default, which this checks). A divergence fails with the schedule.
//! Without PostgreSQL the test skips, loudly; with `FLOCKLEASE_REQUIRE_PG=1` (CI) it fails
//! instead.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "../../tests/support/pg.rs"]
mod pg;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flocklease::driver::{CommitStep, Io, Step};
use flocklease::machine::{Event, FinalCheck, Outcome, Then};
use flocklease::pg::{PgFault, PgFaultHook, PgLease, PgStep, PgStepper};
use flocklease::{Clock, Error, Lease, ManualClock, SessionId, SessionLease};
use flocklease_model::report::SplitMix;
use flocklease_model::{Action, Cut, LeaseModel, Planted, Said, Scenario, State, at, ticks};
use stateright::Model;

/// How many seeded random walks.
const WALKS: u64 = 100;
/// The longest walk, in actions.
const WALK_LEN: usize = 60;

/// The model the walks follow: the `postgres` configuration's processes, of the injected
/// faults only commit statements the server refuses (two per walk), a longer TTL (a call takes several actions now, and a takeover of a holder whose liveness
/// ended must come before its lease expires), more ticks, tokens and liveness losses.
fn model() -> LeaseModel {
    LeaseModel {
        name: "pg-lockstep",
        ttl_ticks: 4,
        max_time: 8,
        max_token: 5,
        faults: 2,
        liveness_losses: 4,
        ..LeaseModel::named("postgres").expect("a named configuration")
    }
}

#[test]
fn pg_lockstep_with_the_real_adapter() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let m = model();
    let started = std::time::Instant::now();
    let (mut actions, mut calls, mut steps, mut kills, mut refused) = (0, 0, 0, 0, 0);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in 0..WALKS {
        let done = walk(&m, &url, &admin, seed).unwrap_or_else(|report| panic!("{report}"));
        actions += done.len();
        for (a, scenario) in done {
            calls += usize::from(matches!(a, Action::Call(..)));
            steps += usize::from(matches!(
                a,
                Action::Call(..) | Action::Step(..) | Action::Refuse(_)
            ));
            kills += usize::from(matches!(a, Action::LoseLiveness(..)));
            refused += usize::from(matches!(a, Action::Refuse(_)));
            let name = match scenario {
                Some(Scenario::RenewRelocked) => "renewed after a re-lock",
                Some(Scenario::TakeoverAfterLivenessLoss) => "taken over after a liveness loss",
                Some(Scenario::TakeoverAfterCrash) => "taken over after a crash",
                Some(Scenario::ReturnedAfterRenew) => "expired before its return, renewed",
                Some(Scenario::LostBeforeAdopt) => "liveness ended before its call adopted it",
                _ => continue,
            };
            *seen.entry(name).or_default() += 1;
        }
    }
    // Past the test harness's capture, so that `cargo test` (and CI's log) shows the count.
    let _ = writeln!(
        std::io::stderr(),
        "pg lockstep: {WALKS} random walks, {actions} actions compared ({calls} calls, {steps} \
         statements, {refused} of them refused by the server, {kills} liveness sessions ended; \
         {seen:?}), 0 divergences, {:.1?}",
        started.elapsed()
    );
    // The walks reach what they are for.
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert!(refused > 0, "no commit statement was refused");
}

/// The walks can fail: against a model whose renew trusts the row without locking the
/// generation again, the server's lock table differs after the first renew that re-locks.
#[test]
fn a_model_without_the_relock_diverges() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let m = LeaseModel {
        planted: Some(Planted::RenewWithoutRelock),
        ..model()
    };
    let diverged = (0..WALKS).find_map(|seed| walk(&m, &url, &admin, seed).err());
    let report = diverged.expect("no walk diverged from the planted model");
    assert!(report.contains("the server differs"), "{report}");
}

/// The walks compare statement by statement: against a model whose acquire probes the holder
/// at a step of its own instead of in its first statement, the answers differ once a holder
/// dies between the two (a comparison of whole calls could not tell them apart).
#[test]
fn a_model_with_a_late_probe_diverges() {
    let Some(server) = pg::server() else { return };
    let db = server.fresh_db();
    let url = server.url(&db);
    let admin = server.admin(&db);
    let m = LeaseModel {
        planted: Some(Planted::LateProbe),
        ..model()
    };
    let diverged = (0..WALKS).find_map(|seed| walk(&m, &url, &admin, seed).err());
    let report = diverged.expect("no walk diverged from the planted model");
    assert!(report.contains("next statement"), "{report}");
}

/// A seeded random walk of the model, run against the server statement by statement. Returns
/// the actions done, each with the model's scenario it completed.
type Done = Vec<(Action, Option<Scenario>)>;

fn walk(m: &LeaseModel, url: &str, admin: &pg::Admin, seed: u64) -> Result<Done, String> {
    let mut rng = SplitMix::new(seed);
    let id = SessionId::new(format!("walk{seed}")).unwrap();
    let mut real = Real::new(m, url, id);
    let mut s = m.initial();
    let mut done: Vec<Action> = vec![];
    let mut scenarios = vec![];
    for _ in 0..WALK_LEN {
        let mut offered = vec![];
        m.actions(&s, &mut offered);
        offered.retain(|a| {
            matches!(
                a,
                Action::Call(..)
                    | Action::Step(..)
                    | Action::Tick
                    | Action::Crash(_)
                    | Action::Refuse(_)
                    | Action::LoseLiveness(_, Cut::ServerFirst)
            )
        });
        // A crash is offered to every process at every moment: drawn as often as the rest, it
        // would end most calls half-way and most lost holders before a rival takes over.
        let weighted: Vec<Action> = offered
            .iter()
            .flat_map(|a| {
                let weight = if matches!(a, Action::Crash(_) | Action::Refuse(_)) {
                    1
                } else {
                    4
                };
                std::iter::repeat_n(*a, weight)
            })
            .collect();
        let Some(&a) = weighted.get(rng.below(weighted.len().max(1))) else {
            break;
        };
        done.push(a);
        // (The model's scenario of such a loss is gone once the holder has seen it, which
        // this harness does in the same action.)
        let before_adopt =
            matches!(a, Action::LoseLiveness(p, _) if pending_token(&s, p).is_some());
        s = real
            .apply(m, admin, &s, a)
            .map_err(|e| divergence(seed, &done, &e))?;
        scenarios.push(if before_adopt {
            Some(Scenario::LostBeforeAdopt)
        } else {
            s.scenario
        });
    }
    Ok(done.into_iter().zip(scenarios).collect())
}

fn divergence(seed: u64, done: &[Action], what: &str) -> String {
    let mut out = format!(
        "DIVERGENCE in walk {seed} after {} actions: {what}\nschedule:\n",
        done.len()
    );
    for a in done {
        let _ = writeln!(out, "    {a:?}");
    }
    out
}

/// The new generation process `p`'s call committed and has not adopted yet, if any (the
/// transaction's connection holds its lock).
fn pending_token(s: &State, p: usize) -> Option<u64> {
    s.procs[p]
        .call
        .as_ref()
        .filter(|c| c.ghost.renamed)
        .and_then(|c| c.run.pending())
        .map(|l| l.token)
}

/// The real side: one id on the server, one `PgLease` instance per model process.
struct Real {
    url: String,
    id: SessionId,
    clock: ManualClock,
    ttl: Duration,
    insts: Vec<PgLease>,
    /// Each process's call under way.
    calls: Vec<Option<PgStepper>>,
    /// The renews the front's final expiry check made in each process's call.
    checks: Vec<FinalCheck>,
    /// Per process: the server refuses its next commit statement (an injected error).
    refuse: Vec<Arc<AtomicBool>>,
}

impl Real {
    fn new(m: &LeaseModel, url: &str, id: SessionId) -> Real {
        let mut real = Real {
            url: url.to_owned(),
            id,
            clock: ManualClock::new(at(0)),
            ttl: Duration::from_secs(u64::from(m.ttl_ticks)),
            insts: vec![],
            calls: vec![],
            checks: vec![FinalCheck::default(); m.procs],
            refuse: (0..m.procs).map(|_| Arc::default()).collect(),
        };
        for p in 0..m.procs {
            let inst = real.instance(p);
            real.insts.push(inst);
            real.calls.push(None);
        }
        real
    }

    fn instance(&self, p: usize) -> PgLease {
        let refuse = Arc::clone(&self.refuse[p]);
        let hook: PgFaultHook = Arc::new(move |step, _pid| {
            (step == PgStep::Commit && refuse.swap(false, Ordering::SeqCst))
                .then_some(PgFault::Fail)
        });
        PgLease::builder(&self.url)
            .faults(hook)
            .clock(Arc::new(self.clock.clone()))
            .ttl(self.ttl)
            // No pooled connection closes behind the schedule's back.
            .idle_timeout(None)
            // No statement of a walk waits for the row lock: a wait is a disagreement about
            // who holds it, answered `LockTimeout` soon.
            .lock_timeout(Duration::from_secs(1))
            .connect()
            .unwrap()
    }

    /// Does `a` on the server and in the model (from `s`), and compares; returns the model's
    /// next state.
    fn apply(
        &mut self,
        m: &LeaseModel,
        admin: &pg::Admin,
        s: &State,
        a: Action,
    ) -> Result<State, String> {
        let n = match a {
            Action::Call(p, kind) => {
                let n = m
                    .next_state(s, a)
                    .ok_or("the model cannot start the call")?;
                let event = m.call_event(s, p, kind);
                self.calls[p] = Some(self.insts[p].stepper(&self.id, event));
                self.checks[p] = FinalCheck::default();
                self.step(m, p, &n)?;
                n
            }
            Action::Step(p, io) => {
                let next = self.calls[p].as_ref().and_then(PgStepper::peek);
                if next != Some(io) {
                    return Err(format!(
                        "p{p}'s next statement: the adapter's {next:?}, the model's {io:?}"
                    ));
                }
                let n = m
                    .next_state(s, a)
                    .ok_or_else(|| format!("the model's p{p} cannot take {io:?}"))?;
                self.step(m, p, &n)?;
                n
            }
            Action::Refuse(p) => {
                let next = self.calls[p].as_ref().and_then(PgStepper::peek);
                if next != Some(Io::Commit(CommitStep::Point)) {
                    return Err(format!(
                        "p{p}'s next statement: the adapter's {next:?}, the model's its commit"
                    ));
                }
                let n = m
                    .next_state(s, a)
                    .ok_or_else(|| format!("the model's p{p} cannot be refused"))?;
                self.refuse[p].store(true, Ordering::SeqCst);
                self.step(m, p, &n)?;
                if self.refuse[p].swap(false, Ordering::SeqCst) {
                    return Err(format!("p{p}'s commit statement was never sent"));
                }
                n
            }
            Action::Tick => {
                self.clock.advance(Duration::from_secs(1));
                m.next_state(s, a).ok_or("the model cannot tick")?
            }
            Action::Crash(p) => {
                // The call's connection closed (the server then ends its session, with the
                // row lock and any advisory lock it took), then the instance dropped (which
                // ends its sessions), as a crash does.
                if let Some(call) = self.calls[p].take() {
                    let pid = call.session_pid();
                    drop(call);
                    if let Some(pid) = pid {
                        admin.until_ended(pid);
                    }
                }
                let fresh = self.instance(p);
                drop(std::mem::replace(&mut self.insts[p], fresh));
                m.next_state(s, a).ok_or("the model cannot crash")?
            }
            Action::LoseLiveness(p, Cut::ServerFirst) if pending_token(s, p).is_some() => {
                // The new generation a call committed and has not adopted: the transaction's
                // connection holds its lock, and the call sees its session end there.
                let token = pending_token(s, p).expect("checked");
                let key = admin.key(self.id.as_str());
                let holders = admin.advisory_holders(key, gen_key(token));
                let [pid] = holders[..] else {
                    return Err(format!(
                        "generation {token} (committed, not adopted) is held by sessions \
                         {holders:?}, the model says p{p}'s"
                    ));
                };
                let call = self.calls[p].as_ref().ok_or("no call under way")?;
                if call.session_pid() != Some(pid) {
                    return Err(format!(
                        "generation {token} is held by session {pid}, not by p{p}'s call's \
                         connection ({:?})",
                        call.session_pid()
                    ));
                }
                if call.session_ended() {
                    return Err(format!(
                        "p{p}'s call's connection ended before its session did"
                    ));
                }
                admin.terminate(pid);
                admin.until_ended(pid);
                pg::until("the call's connection to see its session end", || {
                    call.session_ended()
                });
                let n = m.next_state(s, a).ok_or("the model cannot lose liveness")?;
                m.next_state(&n, Action::NoticeLoss(p))
                    .ok_or("the model cannot notice the loss")?
            }
            Action::LoseLiveness(p, Cut::ServerFirst) => {
                let local = s.procs[p].local.clone().ok_or("no local generation")?;
                let key = admin.key(self.id.as_str());
                let holders = admin.advisory_holders(key, gen_key(local.token));
                let [pid] = holders[..] else {
                    return Err(format!(
                        "generation {} is held by sessions {holders:?}, the model says p{p}'s",
                        local.token
                    ));
                };
                let told = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&told);
                let lease = Lease {
                    session_id: self.id.clone(),
                    owner: local.owner.clone(),
                    token: local.token,
                    expiry: at(0),
                };
                self.insts[p]
                    .on_liveness_lost(&lease, Box::new(move || flag.store(true, Ordering::SeqCst)));
                if told.load(Ordering::SeqCst) {
                    return Err(format!(
                        "p{p} was told of a loss before its session {pid} ended"
                    ));
                }
                admin.terminate(pid);
                pg::until("the holder to be told its liveness session ended", || {
                    told.load(Ordering::SeqCst)
                });
                let n = m.next_state(s, a).ok_or("the model cannot lose liveness")?;
                m.next_state(&n, Action::NoticeLoss(p))
                    .ok_or("the model cannot notice the loss")?
            }
            other => return Err(format!("{other:?} is not run against the server")),
        };
        let (real, model) = (self.view(admin), model_view(&n));
        if real != model {
            return Err(format!(
                "after {a:?} the server differs\n  real:  {real:?}\n  model: {model:?}\n  \
                 model state: {n:?}"
            ));
        }
        // The walks never drop the table: no instance may say the lease store is gone (a
        // keep-alive would end its leases on that word; the backend answers with the front's
        // default).
        for (p, inst) in self.insts.iter().enumerate() {
            if let Some(why) = inst.store_gone() {
                return Err(format!("after {a:?} p{p} says the store is gone: {why:?}"));
            }
        }
        Ok(n)
    }

    /// Process `p`'s call takes its next statement; compares where it stands with the model's
    /// `n` (still under way, or over with the same answer).
    fn step(&mut self, m: &LeaseModel, p: usize, n: &State) -> Result<(), String> {
        let call = self.calls[p].as_mut().ok_or("no call under way")?;
        let step = call.next(&self.insts[p]);
        let model = n.procs[p].call.as_ref().map(|c| c.run.peek());
        match step {
            Step::Continue if model.is_some() => Ok(()),
            Step::Continue => Err(format!("p{p}'s call goes on; the model's is over")),
            Step::Blocked => Err(format!("p{p}'s statement waited for the row lock")),
            Step::Done(result) => {
                self.calls[p] = None;
                // The front's final expiry check, as a call makes it: a grant already expired
                // on the instance's clock is renewed first (the call goes on), or lost.
                let result = match self.checks[p].next(result, || self.clock.now()) {
                    Then::Return(answer) => answer,
                    Then::Renew { token } => {
                        let event = Event::Renew {
                            owner: m.owner(p),
                            token,
                        };
                        self.calls[p] = Some(self.insts[p].stepper(&self.id, event));
                        return match model {
                            Some(_) => Ok(()),
                            None => Err(format!(
                                "p{p}'s grant expired before its return and is renewed; the \
                                 model's call is over"
                            )),
                        };
                    }
                };
                let (said, detail) = said(result);
                let predicted = n.procs[p].last.map(|(_, said)| said);
                if model.is_some() || predicted != Some(said) {
                    return Err(format!(
                        "p{p}'s call answered {said:?} {detail}; the model {predicted:?}, \
                         under way: {}",
                        model.is_some()
                    ));
                }
                Ok(())
            }
        }
    }

    /// The row and the advisory locks of the id, as the server has them.
    fn view(&self, admin: &pg::Admin) -> View {
        let row = admin.row(self.id.as_str());
        let record = row
            .as_ref()
            // The placeholder row inserted to have a row to lock: no record yet.
            .filter(|(owner, token, _)| !(owner.is_empty() && *token == 0))
            .map(|(owner, token, micros)| (owner.clone(), *token as u64, *micros));
        let mut locks = BTreeMap::new();
        if row.is_some() {
            let key = admin.key(self.id.as_str());
            for r in admin.query(
                "SELECT objid::int8, count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND granted AND mode = 'ExclusiveLock' AND objsubid = 2 AND classid = $1::int8::oid \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 GROUP BY objid",
                &[&i64::from(key)],
            ) {
                locks.insert(r.get::<_, i64>(0) as u64, r.get::<_, i64>(1));
            }
        }
        View { record, locks }
    }
}

/// A run's result as the model shows a call's answer.
fn said(r: Result<Outcome, Error>) -> (Said, String) {
    match r {
        Ok(Outcome::Granted { token, expiry }) => {
            (Said::Granted(token, ticks(expiry)), String::new())
        }
        Ok(Outcome::Held) => (Said::Held, String::new()),
        Ok(Outcome::Released) => (Said::Released, String::new()),
        Err(e) => (Said::Failed, e.to_string()),
    }
}

/// The second advisory-lock key of generation `token` (the adapter's: the token mod 2^32).
fn gen_key(token: u64) -> u32 {
    token as u32
}

/// The model's row and advisory locks.
fn model_view(n: &State) -> View {
    View {
        record: n.record.as_ref().map(|r| {
            let micros = i64::try_from(r.expiry.unix_nanos() / 1000).unwrap();
            (r.owner.clone(), r.token, micros)
        }),
        locks: n
            .live
            .iter()
            .filter(|(_, f)| f.holder.is_some())
            .map(|(t, _)| (*t, 1))
            .collect(),
    }
}

/// What is compared after every action.
#[derive(Debug, PartialEq, Eq)]
struct View {
    /// The row's record: owner, token, expiry in unix microseconds.
    record: Option<(String, u64, i64)>,
    /// Sessions holding each generation's advisory lock.
    locks: BTreeMap<u64, i64>,
}
