//! `flocklease run`'s supervision as a model (PROTOCOL §7): `run`, its watchdog, the job, a
//! cleaner and a rival `run`, each a process that acts between any two steps of the others.
//!
//! | actor | steps |
//! | --- | --- |
//! | `run` | SIGKILL to the job at its own deadline (the confirmed expiry less the margin: the same rule as the watchdog's) · renew: the record's expiry moves to now + TTL; if the file at the generation's liveness name is not the one `run` locked (a cleaner deleted it), the lease manager publishes a new one, locked, and sends it to the watchdog before placing it (`FlockLeaseBuilder::share_liveness`) · tell the watchdog the new expiry · on hearing the watchdog is gone, stop the job · die (`kill -9`: its descriptors close) · stop and continue |
//! | watchdog | hear end of file once `run` died · act as [`supervise::next`] says (SIGTERM, SIGKILL), with its own descriptor of the liveness file · die · stop and continue |
//! | job | close its inherited liveness descriptor (`closefrom`) · exit after SIGTERM, or ignore it |
//! | cleaner | delete the liveness file at its name |
//! | rival | granted the lease (a later generation) once the lease is free: expired by the clock, or its liveness file at the name is the generation's own and nobody holds its lock (a probe reads "dead") |
//!
//! Time advances one tick at a time; a running watchdog whose rule has something to do acts
//! before the clock moves on (its deadline is a timer; "running" excludes stopped and dead),
//! and so does a running `run` that heard its watchdog die (a thread waits for that end of
//! file; `run` then stops the job with SIGKILL at the watchdog's deadline at the latest, a
//! step abstracted here as the job's end). The margin is one tick before the expiry.
//!
//! The property: **no job runs while a later generation is granted**, unless `run` and the
//! watchdog were both down (stopped or dead) at some moment — the documented exception
//! (PROTOCOL §7, §11). Planting the grace path that forgets the expiry, a restore shared with
//! the watchdog only after it was placed, or the old design where only the job keeps the
//! liveness, each breaks it.

use std::fmt;

use flocklease::supervise::{self, Act, Watch};
use stateright::{Checker, Model, Property};

/// A supervising process's condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proc {
    /// Scheduled and acting.
    Running,
    /// Stopped (SIGSTOP, a debugger, a frozen cgroup): keeps its descriptors, does nothing.
    Stopped,
    /// Dead: its descriptors are closed.
    Dead,
}

/// A known mistake to plant, to see the checker catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunPlanted {
    /// After `run` died, the watchdog waits out the grace period without the expiry.
    GraceForgetsExpiry,
    /// A restored liveness file reaches the watchdog only with the next expiry, after it was
    /// placed (a send after the renew instead of before the publication).
    ShareAfterPlace,
    /// The old design: only the job keeps the liveness; the watchdog holds none and does not
    /// look at the file.
    JobKeepsLiveness,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct RunModel {
    /// The lease's TTL in ticks.
    pub ttl: u8,
    /// The grace period in ticks (longer than the TTL: the grace must not outlast it).
    pub grace: u8,
    /// The clock runs from 0 to this.
    pub max_time: u8,
    /// How many times the cleaner may delete the liveness file.
    pub cleaner: u8,
    /// A planted mistake.
    pub planted: Option<RunPlanted>,
}

impl Default for RunModel {
    fn default() -> Self {
        RunModel {
            ttl: 3,
            grace: 4,
            max_time: 5,
            cleaner: 1,
            planted: None,
        }
    }
}

/// The margin before the expiry, in ticks.
const MARGIN: u8 = 1;

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunState {
    /// The clock.
    pub now: u8,
    /// The record's expiry.
    pub expiry: u8,
    /// `run`.
    pub run: Proc,
    /// The liveness file `run`'s lease manager holds locked (none once dead).
    pub run_live: Option<u8>,
    /// The last renew's expiry has been told to the watchdog.
    pub run_told: bool,
    /// `run` may still be stopped once.
    pub run_stops: u8,
    /// The watchdog.
    pub wd: Proc,
    /// The watchdog may still be stopped once.
    pub wd_stops: u8,
    /// The watchdog has heard end of file (`run` died).
    pub wd_eof: bool,
    /// The last expiry the watchdog was told.
    pub wd_expiry: Option<u8>,
    /// The liveness file the watchdog holds a descriptor of.
    pub wd_live: Option<u8>,
    /// When the watchdog sent SIGTERM.
    pub wd_term_at: Option<u8>,
    /// The job runs.
    pub job: bool,
    /// The liveness file the job's inherited descriptor refers to (none once closed).
    pub job_live: Option<u8>,
    /// The job got SIGTERM.
    pub job_termed: bool,
    /// The file at the generation's liveness name (an inode number), if any.
    pub name: Option<u8>,
    /// The next inode number.
    pub next_inode: u8,
    /// Deletions the cleaner has left.
    pub cleaner_left: u8,
    /// A later generation was granted to a rival.
    pub rival: bool,
    /// Ghost: `run` and the watchdog were both down (stopped or dead) at some moment.
    pub both_down: bool,
    /// Ghost: the watchdog killed the job.
    pub wd_killed: bool,
}

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunAction {
    /// The clock moves on.
    Tick,
    /// `run` renews (restoring a deleted liveness file).
    Renew,
    /// `run` tells the watchdog the renewed expiry (and, planted, the restored file).
    Tell,
    /// `run` hears that the watchdog is gone and stops the job.
    StopJobWatchdogGone,
    /// `run` kills the job at its own deadline (the renew came too late).
    RunKillAtDeadline,
    /// `run` is killed.
    RunDie,
    /// `run` is stopped.
    RunStop,
    /// `run` is continued.
    RunCont,
    /// The watchdog hears end of file.
    WdEof,
    /// The watchdog sends SIGTERM.
    WdTerm,
    /// The watchdog sends SIGKILL.
    WdKill,
    /// The watchdog is killed.
    WdDie,
    /// The watchdog is stopped.
    WdStop,
    /// The watchdog is continued.
    WdCont,
    /// The job closes its inherited descriptors.
    JobClose,
    /// The job exits after SIGTERM.
    JobExit,
    /// The cleaner deletes the liveness file.
    Clean,
    /// A rival is granted the lease.
    RivalGranted,
}

impl RunModel {
    /// The watchdog's view, as the real watchdog builds it.
    pub fn watch(&self, s: &RunState) -> Watch {
        let forget = self.planted == Some(RunPlanted::GraceForgetsExpiry) && s.wd_eof;
        let liveness_kept = if self.planted == Some(RunPlanted::JobKeepsLiveness) {
            true
        } else {
            s.wd_live.is_some() && s.wd_live == s.name
        };
        Watch {
            run_alive: !s.wd_eof,
            job_alive: s.job,
            now: u64::from(s.now),
            deadline: s
                .wd_expiry
                .filter(|_| !forget)
                .map(|e| u64::from(e.saturating_sub(MARGIN))),
            liveness_kept,
            term_at: s.wd_term_at.map(u64::from),
            grace: u64::from(self.grace),
        }
    }

    /// `run`'s own view for its deadline: alive, with the expiry its renews confirmed.
    pub fn run_watch(&self, s: &RunState) -> Watch {
        Watch {
            run_alive: true,
            job_alive: s.job,
            now: u64::from(s.now),
            deadline: Some(u64::from(s.expiry.saturating_sub(MARGIN))),
            liveness_kept: true,
            term_at: None,
            grace: u64::from(self.grace),
        }
    }

    /// What the running watchdog does next, as a step of the model (if anything).
    fn wd_step(&self, s: &RunState) -> Option<RunAction> {
        if s.wd != Proc::Running {
            return None;
        }
        if s.run == Proc::Dead && !s.wd_eof {
            return Some(RunAction::WdEof);
        }
        match supervise::next(&self.watch(s)) {
            Act::Term => Some(RunAction::WdTerm),
            Act::Kill(_) => Some(RunAction::WdKill),
            Act::Wait { .. } | Act::Exit => None,
        }
    }

    /// Whether a probe reads the generation dead: the file at the name is its own and no live
    /// process holds its lock.
    fn free_by_liveness(s: &RunState) -> bool {
        let Some(file) = s.name else {
            // No file: unknown, the expiry decides.
            return false;
        };
        let held = (s.run != Proc::Dead && s.run_live == Some(file))
            || (s.wd != Proc::Dead && s.wd_live == Some(file))
            || (s.job && s.job_live == Some(file));
        !held
    }

    /// Checks the configuration exhaustively.
    pub fn checker(self) -> impl Checker<RunModel> {
        self.checker_builder().spawn_bfs().join()
    }

    fn checker_builder(self) -> stateright::CheckerBuilder<RunModel> {
        <RunModel as Model>::checker(self)
    }
}

/// The property's name.
pub const NO_OVERLAP: &str =
    "no job runs while a later generation is granted (unless run and the watchdog were both down)";

impl Model for RunModel {
    type State = RunState;
    type Action = RunAction;

    fn init_states(&self) -> Vec<RunState> {
        // Granted at 0 with liveness file 1, which run's lease manager locked and sent to the
        // watchdog; the job inherited a copy; the watchdog knows the expiry.
        vec![RunState {
            now: 0,
            expiry: self.ttl,
            run: Proc::Running,
            run_live: Some(1),
            run_told: true,
            run_stops: 1,
            wd: Proc::Running,
            wd_stops: 1,
            wd_eof: false,
            wd_expiry: Some(self.ttl),
            wd_live: (self.planted != Some(RunPlanted::JobKeepsLiveness)).then_some(1),
            wd_term_at: None,
            job: true,
            job_live: Some(1),
            job_termed: false,
            name: Some(1),
            next_inode: 2,
            cleaner_left: self.cleaner,
            rival: false,
            both_down: false,
            wd_killed: false,
        }]
    }

    fn actions(&self, s: &RunState, actions: &mut Vec<RunAction>) {
        let wd_due = self.wd_step(s);
        // `run` hears the watchdog's end of file at once (a thread waits on it) and stops the
        // job, SIGKILL at the deadline at the latest, as the watchdog would.
        let run_due = s.run == Proc::Running && s.wd == Proc::Dead && s.job;
        // `run`'s own main loop applies the same rule to its own confirmed expiry: its
        // deadline is a timer too.
        let run_deadline =
            s.run == Proc::Running && matches!(supervise::next(&self.run_watch(s)), Act::Kill(_));
        if s.now < self.max_time && wd_due.is_none() && !run_due && !run_deadline {
            actions.push(RunAction::Tick);
        }
        if run_deadline {
            actions.push(RunAction::RunKillAtDeadline);
        }
        if let Some(a) = wd_due {
            actions.push(a);
        }
        match s.run {
            Proc::Running => {
                if !s.rival {
                    actions.push(RunAction::Renew);
                }
                if !s.run_told {
                    actions.push(RunAction::Tell);
                }
                if run_due {
                    actions.push(RunAction::StopJobWatchdogGone);
                }
                if s.run_stops > 0 {
                    actions.push(RunAction::RunStop);
                }
                actions.push(RunAction::RunDie);
            }
            Proc::Stopped => {
                actions.push(RunAction::RunCont);
                actions.push(RunAction::RunDie);
            }
            Proc::Dead => {}
        }
        match s.wd {
            Proc::Running => {
                if s.wd_stops > 0 {
                    actions.push(RunAction::WdStop);
                }
                actions.push(RunAction::WdDie);
            }
            Proc::Stopped => {
                actions.push(RunAction::WdCont);
                actions.push(RunAction::WdDie);
            }
            Proc::Dead => {}
        }
        if s.job {
            if s.job_live.is_some() {
                actions.push(RunAction::JobClose);
            }
            if s.job_termed {
                actions.push(RunAction::JobExit);
            }
        }
        if s.cleaner_left > 0 && s.name.is_some() {
            actions.push(RunAction::Clean);
        }
        if !s.rival && (s.now >= s.expiry || Self::free_by_liveness(s)) {
            actions.push(RunAction::RivalGranted);
        }
    }

    fn next_state(&self, last: &RunState, action: RunAction) -> Option<RunState> {
        let mut s = last.clone();
        match action {
            RunAction::Tick => s.now += 1,
            RunAction::Renew => {
                s.expiry = s.now + self.ttl;
                s.run_told = false;
                if s.name != s.run_live {
                    // Published again, locked; shared with the watchdog before it is placed.
                    let file = s.next_inode;
                    s.next_inode += 1;
                    s.run_live = Some(file);
                    s.name = Some(file);
                    let shared_first = !matches!(
                        self.planted,
                        Some(RunPlanted::ShareAfterPlace | RunPlanted::JobKeepsLiveness)
                    );
                    if s.wd != Proc::Dead && shared_first {
                        s.wd_live = Some(file);
                    }
                }
            }
            RunAction::Tell => {
                s.run_told = true;
                if s.wd != Proc::Dead {
                    s.wd_expiry = Some(s.expiry);
                    if self.planted == Some(RunPlanted::ShareAfterPlace) {
                        s.wd_live = s.run_live;
                    }
                }
            }
            RunAction::StopJobWatchdogGone
            | RunAction::RunKillAtDeadline
            | RunAction::WdKill
            | RunAction::JobExit => {
                s.job = false;
                s.job_live = None;
                s.wd_killed |= action == RunAction::WdKill;
            }
            RunAction::RunDie => {
                s.run = Proc::Dead;
                s.run_live = None;
            }
            RunAction::RunStop => {
                s.run = Proc::Stopped;
                s.run_stops -= 1;
            }
            RunAction::RunCont => s.run = Proc::Running,
            RunAction::WdEof => s.wd_eof = true,
            RunAction::WdTerm => {
                s.wd_term_at = Some(s.now);
                s.job_termed = true;
            }
            RunAction::WdDie => {
                s.wd = Proc::Dead;
                s.wd_live = None;
            }
            RunAction::WdStop => {
                s.wd = Proc::Stopped;
                s.wd_stops -= 1;
            }
            RunAction::WdCont => s.wd = Proc::Running,
            RunAction::JobClose => s.job_live = None,
            RunAction::Clean => {
                s.name = None;
                s.cleaner_left -= 1;
            }
            RunAction::RivalGranted => s.rival = true,
        }
        if s.run != Proc::Running && s.wd != Proc::Running {
            s.both_down = true;
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_OVERLAP, |_, s: &RunState| {
                !(s.job && s.rival) || s.both_down
            }),
            Property::sometimes("the watchdog kills the job", |_, s: &RunState| s.wd_killed),
            Property::sometimes(
                "a rival is granted after the job, with run and the watchdog never both down",
                |_, s: &RunState| s.rival && !s.both_down,
            ),
        ]
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = |p: Proc| match p {
            Proc::Running => "running",
            Proc::Stopped => "stopped",
            Proc::Dead => "dead",
        };
        let file = |f: Option<u8>| f.map_or("-".to_owned(), |i| format!("#{i}"));
        write!(
            f,
            "t={} expiry={} | run {} holds {} | watchdog {} holds {} told {}{} | job {} holds {} | at the name {}{}",
            self.now,
            self.expiry,
            p(self.run),
            file(self.run_live),
            p(self.wd),
            file(self.wd_live),
            self.wd_expiry.map_or("-".to_owned(), |e| e.to_string()),
            if self.wd_eof { ", heard run die" } else { "" },
            if self.job { "running" } else { "gone" },
            file(self.job_live),
            file(self.name),
            if self.rival { " | RIVAL GRANTED" } else { "" }
        )
    }
}

/// Checks `model` ([`crate::report::check_small`]). Returns whether everything held.
pub fn check(model: RunModel, out: &mut impl std::io::Write) -> std::io::Result<bool> {
    let header = format!(
        "run supervision (PROTOCOL §7): run, watchdog, job, cleaner, rival; TTL {} ticks, grace {}, margin {MARGIN}, clock to {}{}",
        model.ttl,
        model.grace,
        model.max_time,
        model
            .planted
            .map_or(String::new(), |p| format!("; planted {p:?}"))
    );
    crate::report::check_small(
        model,
        &header,
        "the job still runs while a rival holds a later generation, and run and the watchdog \
         were never both down",
        out,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_holds_with_a_pinned_state_count() {
        let checker = RunModel::default().checker();
        // Pinned: a change to the actors or the rule that moves it must say why.
        assert_eq!(checker.unique_state_count(), 68_276);
        assert!(checker.discovery(NO_OVERLAP).is_none());
    }

    #[test]
    fn a_planted_bug_fails_the_check() {
        for planted in [
            RunPlanted::GraceForgetsExpiry,
            RunPlanted::ShareAfterPlace,
            RunPlanted::JobKeepsLiveness,
        ] {
            let model = RunModel {
                planted: Some(planted),
                ..RunModel::default()
            };
            let checker = model.checker();
            assert!(
                checker.discovery(NO_OVERLAP).is_some(),
                "{planted:?} passed the check"
            );
        }
    }
}
