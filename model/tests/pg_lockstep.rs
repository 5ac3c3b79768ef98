//! Lockstep with PostgreSQL, at the granularity of whole calls: the real `PgLease` against a
//! throwaway server and the model's PostgreSQL backend, driven by the same seeded random
//! schedules.
//!
//! What the server allows. `PgLease` has no step-by-step seam like the flock adapter's
//! `Stepper`, so a call is one action here, run to its end on both sides (the model takes the
//! call's I/O steps back to back, nothing in between). Between calls: the clock ticks (one
//! `ManualClock` for every instance, one second per tick); an instance crashes (dropped: its
//! sessions end; a new instance takes its place, and the process keeps only a copy of its
//! last lease to replay); the server ends the holder's liveness session
//! (`pg_terminate_backend` of the backend holding the generation's advisory lock), after
//! which the test waits until the holder is told (`on_liveness_lost`): the model's
//! `LoseLiveness(p, ServerFirst)` then `NoticeLoss(p)`. Left to the checker: the other order
//! (the holder seeing its connection break while the server's session lives on: no statement
//! does that from the server's side), a loss between a call's steps, and injected faults.
//!
//! After every action the test compares each call's answer, the row (owner, token, expiry)
//! and, for every token, how many sessions hold its advisory lock, with the model's state. A
//! divergence fails with the schedule. Without PostgreSQL the test skips, loudly; with
//! `FLOCKLEASE_REQUIRE_PG=1` (CI) it fails instead.

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

use flocklease::pg::PgLease;
use flocklease::{Error, Grant, Lease, ManualClock, SessionId, SessionLease};
use flocklease_model::report::SplitMix;
use flocklease_model::{
    Action, Cut, Kind, LeaseModel, LeaseView, Planted, Said, Scenario, State, at, ticks,
};
use stateright::Model;

/// How many seeded random walks.
const WALKS: u64 = 100;
/// The longest walk, in actions.
const WALK_LEN: usize = 30;

/// The model the walks follow: the `postgres` configuration's processes and TTL, no injected
/// faults, more ticks, tokens and liveness losses.
fn model() -> LeaseModel {
    LeaseModel {
        name: "pg-lockstep",
        max_time: 5,
        max_token: 5,
        faults: 0,
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
    let (mut actions, mut calls, mut kills) = (0, 0, 0);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in 0..WALKS {
        let done = walk(&m, &url, &admin, seed).unwrap_or_else(|report| panic!("{report}"));
        actions += done.len();
        for (a, scenario) in done {
            calls += usize::from(matches!(a, Action::Call(..)));
            kills += usize::from(matches!(a, Action::LoseLiveness(..)));
            let name = match scenario {
                Some(Scenario::RenewRelocked) => "renewed after a re-lock",
                Some(Scenario::TakeoverAfterLivenessLoss) => "taken over after a liveness loss",
                Some(Scenario::TakeoverAfterCrash) => "taken over after a crash",
                _ => continue,
            };
            *seen.entry(name).or_default() += 1;
        }
    }
    // Past the test harness's capture, so that `cargo test` (and CI's log) shows the count.
    let _ = writeln!(
        std::io::stderr(),
        "pg lockstep: {WALKS} random walks, {actions} actions compared ({calls} calls, {kills} \
         liveness sessions ended; {seen:?}), 0 divergences, {:.1?}",
        started.elapsed()
    );
    // The walks reach what they are for.
    assert_eq!(seen.len(), 3, "{seen:?}");
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

/// A seeded random walk of the model, run against the server call by call. Returns the
/// actions done, each with the model's scenario it completed.
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
                    | Action::Tick
                    | Action::Crash(_)
                    | Action::LoseLiveness(_, Cut::ServerFirst)
            )
        });
        if offered.is_empty() {
            break;
        }
        let a = offered[rng.below(offered.len())];
        done.push(a);
        s = real
            .apply(m, admin, &s, a)
            .map_err(|e| divergence(seed, &done, &e))?;
        scenarios.push(s.scenario);
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

/// The real side: one id on the server, one `PgLease` instance per model process.
struct Real {
    url: String,
    id: SessionId,
    clock: ManualClock,
    ttl: Duration,
    insts: Vec<PgLease>,
}

impl Real {
    fn new(m: &LeaseModel, url: &str, id: SessionId) -> Real {
        let mut real = Real {
            url: url.to_owned(),
            id,
            clock: ManualClock::new(at(0)),
            ttl: Duration::from_secs(u64::from(m.ttl_ticks)),
            insts: vec![],
        };
        for _ in 0..m.procs {
            let inst = real.instance();
            real.insts.push(inst);
        }
        real
    }

    fn instance(&self) -> PgLease {
        PgLease::builder(&self.url)
            .clock(Arc::new(self.clock.clone()))
            .ttl(self.ttl)
            // No pooled connection closes behind the schedule's back.
            .idle_timeout(None)
            .connect()
            .unwrap()
    }

    fn lease(&self, m: &LeaseModel, p: usize, v: LeaseView) -> Lease {
        Lease {
            session_id: self.id.clone(),
            owner: m.owner(p),
            token: v.token,
            expiry: at(v.expiry),
        }
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
                let n = whole_call(m, s, p, kind)?;
                let view = match kind {
                    Kind::Acquire => None,
                    Kind::Renew | Kind::Release => s.procs[p].lease,
                    Kind::RenewStale | Kind::ReleaseStale => s.procs[p].stale,
                };
                let lease = view.map(|v| self.lease(m, p, v));
                let inst = &self.insts[p];
                let (said, detail) = match (kind, lease) {
                    (Kind::Acquire, _) => granted(inst.acquire(&self.id, &m.owner(p))),
                    (Kind::Renew | Kind::RenewStale, Some(l)) => granted(inst.renew(&l)),
                    (Kind::Release | Kind::ReleaseStale, Some(l)) => match inst.release(&l) {
                        Ok(()) => (Said::Released, String::new()),
                        Err(e) => (Said::Failed, e.to_string()),
                    },
                    _ => return Err(format!("the model offers {kind:?} without a lease")),
                };
                let predicted = n.procs[p].last.map(|(_, said)| said);
                if predicted != Some(said) {
                    return Err(format!(
                        "p{p} {}: the adapter answered {said:?} {detail}, the model {predicted:?}",
                        kind.label()
                    ));
                }
                n
            }
            Action::Tick => {
                self.clock.advance(Duration::from_secs(1));
                m.next_state(s, a).ok_or("the model cannot tick")?
            }
            Action::Crash(p) => {
                // Dropping the instance ends its sessions, as a crash does.
                let fresh = self.instance();
                drop(std::mem::replace(&mut self.insts[p], fresh));
                m.next_state(s, a).ok_or("the model cannot crash")?
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
        Ok(n)
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
                 AND granted AND objsubid = 2 AND classid = $1::int8::oid \
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

/// The model's process `p` calls `kind` and takes every step of the call, nothing between.
fn whole_call(m: &LeaseModel, s: &State, p: usize, kind: Kind) -> Result<State, String> {
    let mut n = m
        .next_state(s, Action::Call(p, kind))
        .ok_or("the model cannot start the call")?;
    while let Some(io) = n.procs[p].call.as_ref().and_then(|c| c.run.peek()) {
        n = m
            .next_state(&n, Action::Step(p, io))
            .ok_or_else(|| format!("the model's p{p} cannot take {io:?}"))?;
    }
    Ok(n)
}

fn granted(r: Result<Grant, Error>) -> (Said, String) {
    match r {
        Ok(Grant::Granted(l)) => (Said::Granted(l.token, ticks(l.expiry)), String::new()),
        Ok(Grant::Held) => (Said::Held, String::new()),
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
