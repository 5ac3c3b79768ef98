//! The run model's schedules, for the process lockstep of `flocklease run`
//! (`cli/tests/cli/lockstep.rs`): which environment steps the real harness takes, in which
//! order, and what the model says may come of them.
//!
//! A [`Schedule`] is the environment's part of a run of [`RunModel`]: what `run`'s stderr is,
//! whether the job exits on SIGTERM or ignores it, and a short sequence of environment steps
//! (stop, continue or kill `run` or the watchdog, the command's exit leaving a grandchild, the
//! unit's SIGTERM to every process). [`outcomes`] runs the model under the schedule —
//! every interleaving of `run`, the watchdog, the job and the rival that the model allows,
//! with the schedule's steps as the only environment — and collects what each run came to: was
//! the job still running when a rival was granted, and how did `run` end. The real processes
//! must come to one of those.
//!
//! The harness and the model take a step at the same moments: the first at once (tick 0),
//! each later one as soon as the previous one **settled** — a rival was granted, or `run` ended
//! and the job's group is gone, or [`SETTLE`] ticks passed (the one wait on time itself: a
//! lease's expiry, a deaf watchdog's TTL, a grace period). The job and the rival do not dawdle either: a job that exits on
//! SIGTERM exits before the clock moves on, a rival is granted as soon as the lease is free
//! (the real one waits in `acquire_wait`), and a running `run` renews once a tick and tells
//! its watchdog (the real one renews every third of the TTL).

use std::collections::HashSet;

use flocklease::supervise::Exit;
use stateright::Model;

use crate::run::{Proc, RunAction, RunModel, RunState, Stderr};

/// The environment steps a schedule is made of, each with a real counterpart.
pub const STEPS: [RunAction; 8] = [
    RunAction::RunStop,
    RunAction::RunCont,
    RunAction::RunDie,
    RunAction::WdStop,
    RunAction::WdCont,
    RunAction::WdDie,
    RunAction::CmdExit,
    RunAction::UnitStop,
];

/// Ticks after a step at which the next is taken even if nothing settled.
pub const SETTLE: u8 = 6;

/// The configuration the schedules run in: every environment actor that has a real
/// counterpart in the harness (no cleaner, and a job that keeps its descriptors: those two are
/// left to the model check), a TTL of 3 ticks, a grace period of 2, and a clock long enough
/// for every step [`SETTLE`] ticks apart to play out.
pub fn model() -> RunModel {
    RunModel {
        ttl: 3,
        grace: 2,
        max_time: 16,
        cleaner: 0,
        socket: 1,
        stderr: vec![Stderr::Fine, Stderr::Full, Stderr::Broken, Stderr::Tostop],
        unit_stop: true,
        leftovers: true,
        job_closes: false,
        kills: true,
        watchdog_stops: 1,
        planted: None,
    }
}

/// The environment's part of a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// `run`'s and the watchdog's stderr.
    pub stderr: Stderr,
    /// The job exits (status 0) on SIGTERM; else it ignores it.
    pub job_exits: bool,
    /// The environment's steps, from [`STEPS`], in order.
    pub steps: Vec<RunAction>,
}

/// How `run` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ending {
    /// It exited with this status.
    Exit(Exit),
    /// It was killed, or died without an exit status (a panic's unwinding, planted).
    Died,
}

/// What a run of a schedule came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outcome {
    /// A rival was granted the lease while a process of the job still ran.
    pub overlap: bool,
    /// How `run` ended.
    pub ending: Ending,
}

/// Every outcome the model allows for `schedule` in `model`, or `None` when the schedule does
/// not settle: no run of the model takes every step and ends (`run` exited or dead, the job's
/// group gone) within the clock, or some run that took every step never ends (`run` and the
/// watchdog both down with the job running, `run` left stopped). Only schedules that settle
/// are compared with the real processes: what the model says of the others is "not yet".
pub fn outcomes(model: &RunModel, schedule: &Schedule) -> Option<Vec<Outcome>> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut todo: Vec<Node> = model
        .init_states()
        .into_iter()
        .filter(|s| s.stderr == schedule.stderr)
        .map(|state| Node {
            state,
            next: 0,
            last_step: 0,
            overlap: false,
        })
        .collect();
    while let Some(node) = todo.pop() {
        if !seen.insert(node.clone()) {
            continue;
        }
        let s = &node.state;
        let overlap = node.overlap || (s.job && s.rival);
        if node.next == schedule.steps.len() && ended(s) {
            let outcome = Outcome {
                overlap,
                ending: s.run_exit.map_or(Ending::Died, Ending::Exit),
            };
            if !found.contains(&outcome) {
                found.push(outcome);
            }
            continue;
        }
        let actions = allowed(model, schedule, &node);
        if actions.is_empty() && node.next == schedule.steps.len() {
            // Every step taken, and it never ends.
            return None;
        }
        for action in actions {
            let Some(state) = model.next_state(s, action) else {
                continue;
            };
            let stepped = schedule.steps.get(node.next) == Some(&action);
            todo.push(Node {
                next: node.next + usize::from(stepped),
                last_step: if stepped { s.now } else { node.last_step },
                overlap: overlap || (state.job && state.rival),
                state,
            });
        }
    }
    (!found.is_empty()).then_some(found)
}

/// Every schedule of up to `longest` steps, for each stderr and both jobs, that settles, with
/// its outcomes, in a fixed order.
pub fn schedules(model: &RunModel, longest: usize) -> Vec<(Schedule, Vec<Outcome>)> {
    let mut sequences: Vec<Vec<RunAction>> = vec![vec![]];
    let mut all = Vec::new();
    for _ in 0..longest {
        sequences = sequences
            .iter()
            .flat_map(|seq| {
                STEPS.iter().map(move |&step| {
                    let mut longer = seq.clone();
                    longer.push(step);
                    longer
                })
            })
            .collect();
        all.extend(sequences.iter().cloned());
    }
    let mut out = Vec::new();
    for &stderr in &model.stderr {
        for job_exits in [true, false] {
            for steps in &all {
                let schedule = Schedule {
                    stderr,
                    job_exits,
                    steps: steps.clone(),
                };
                if let Some(outcomes) = outcomes(model, &schedule) {
                    out.push((schedule, outcomes));
                }
            }
        }
    }
    out
}

/// A state of the model under a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Node {
    state: RunState,
    /// The schedule's next step.
    next: usize,
    /// When the last step was taken.
    last_step: u8,
    /// Ghost: a rival was granted while the job ran.
    overlap: bool,
}

/// `run` ended and the job's group is gone.
fn ended(s: &RunState) -> bool {
    (s.run_exit.is_some() || s.run == Proc::Dead) && !s.job
}

/// The watchdog has exited: `run` exited (telling it `done`), or it heard `run` die and the
/// job's group is gone. The model keeps it as a process that does nothing more; a real step
/// cannot reach it. A stopped watchdog exits too when `run` does: its process group is
/// orphaned then, and the kernel sends it SIGHUP (ignored) and SIGCONT.
fn watchdog_exited(s: &RunState) -> bool {
    s.run_exit.is_some() || (s.wd == Proc::Running && s.wd_eof && !s.job)
}

/// The model's actions that the schedule allows at `node`: every step of `run`, the watchdog
/// and the rival; the job's exit on SIGTERM if it exits on it; the schedule's next step once
/// the previous one settled, before the clock moves on, as are a due exit of the job, a due
/// grant, and `run`'s renew and its word to the watchdog (once a tick, as the real renewer's
/// every third of the TTL).
fn allowed(model: &RunModel, schedule: &Schedule, node: &Node) -> Vec<RunAction> {
    let s = &node.state;
    let mut actions = Vec::new();
    model.actions(s, &mut actions);
    let step = schedule.steps.get(node.next).copied().filter(|&step| {
        let settled = if node.next == 0 {
            s.now == 0
        } else {
            ended(s) || s.rival || s.now >= node.last_step.saturating_add(SETTLE)
        };
        let on_exited_watchdog = matches!(
            step,
            RunAction::WdStop | RunAction::WdCont | RunAction::WdDie
        ) && watchdog_exited(s);
        settled && !on_exited_watchdog && actions.contains(&step)
    });
    let job_due = schedule.job_exits && actions.contains(&RunAction::JobExit);
    let rival_due = actions.contains(&RunAction::RivalGranted);
    // The real renewer renews every third of the TTL, a tick, and tells the watchdog at once.
    let renew_due = actions.contains(&RunAction::Renew) || actions.contains(&RunAction::Tell);
    actions.retain(|&a| match a {
        RunAction::Tick => step.is_none() && !job_due && !rival_due && !renew_due,
        RunAction::JobExit => schedule.job_exits,
        RunAction::RivalGranted => true,
        a if is_environment(a) => Some(a) == step,
        _ => true,
    });
    actions
}

/// Whether `a` is the environment's (not a step of `run`, the watchdog, the job's answer to
/// SIGTERM, the rival or the clock).
pub fn is_environment(a: RunAction) -> bool {
    matches!(
        a,
        RunAction::RunStop
            | RunAction::RunCont
            | RunAction::RunDie
            | RunAction::WdStop
            | RunAction::WdCont
            | RunAction::WdDie
            | RunAction::JobClose
            | RunAction::CmdExit
            | RunAction::Clean
            | RunAction::UnitStop
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(stderr: Stderr, job_exits: bool, steps: &[RunAction]) -> Schedule {
        Schedule {
            stderr,
            job_exits,
            steps: steps.to_vec(),
        }
    }

    #[test]
    fn an_ordinary_stop_ends_with_the_jobs_status() {
        let out = outcomes(
            &model(),
            &schedule(Stderr::Fine, true, &[RunAction::UnitStop]),
        );
        assert_eq!(
            out,
            Some(vec![Outcome {
                overlap: false,
                ending: Ending::Exit(Exit::Job(0))
            }])
        );
    }

    #[test]
    fn a_stopped_run_has_its_job_killed_before_the_rival_is_granted() {
        let out = outcomes(
            &model(),
            &schedule(
                Stderr::Full,
                false,
                &[RunAction::RunStop, RunAction::RunCont],
            ),
        )
        .unwrap();
        assert!(out.iter().all(|o| !o.overlap), "{out:?}");
    }

    #[test]
    fn a_schedule_that_leaves_run_stopped_does_not_settle() {
        let out = outcomes(
            &model(),
            &schedule(Stderr::Fine, true, &[RunAction::RunStop]),
        );
        assert_eq!(out, None);
    }

    #[test]
    fn the_planted_mistakes_change_some_schedules_outcomes() {
        use crate::run::RunPlanted;
        let fine = model();
        let all = schedules(&fine, 2);
        for planted in [
            RunPlanted::SayBeforeSignal,
            RunPlanted::PanicOnFailedWrite,
            RunPlanted::WatchdogExitsOnTerm,
            RunPlanted::BlockingDeadlineWrite,
        ] {
            let bad = RunModel {
                planted: Some(planted),
                ..model()
            };
            let caught = all.iter().any(|(sch, good)| {
                outcomes(&bad, sch).is_none_or(|o| o.iter().any(|o| !good.contains(o)))
            });
            assert!(caught, "{planted:?} changes no schedule's outcomes");
        }
    }
}
