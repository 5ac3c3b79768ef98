//! The supervision rule of `flocklease run` (PROTOCOL §7): what its watchdog does next.
//!
//! `run` holds the lease and renews it; its job runs in a process group of its own; the
//! watchdog, a process of its own, keeps a descriptor of the generation's liveness file and the
//! last expiry `run` confirmed, and stops the job when `run` cannot. This function is the
//! watchdog's whole judgement. The watchdog of the command line calls it with the boot-time
//! clock in nanoseconds; the model checker (`flocklease-model check --config run`) calls it
//! with ticks, between any two steps of `run`, the job, a cleaner and a rival, so a mistake
//! planted here fails the check.
//!
//! Time is a plain count of a monotonic clock that wall-clock steps do not move (the command
//! line uses `CLOCK_BOOTTIME`, which also counts a suspend); the unit is the caller's.

/// What the watchdog knows when it decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Watch {
    /// `run` is alive: its end of the channel is still open (end of file means it died).
    pub run_alive: bool,
    /// A process of the job's group still runs (zombies do not count).
    pub job_alive: bool,
    /// Now, on the monotonic clock.
    pub now: u64,
    /// The hard deadline: the last expiry `run` confirmed, less the margin. `None` until the
    /// first one arrives (`run` sends it before the job starts).
    pub deadline: Option<u64>,
    /// The file at the generation's liveness name is the one the watchdog holds a descriptor
    /// of (same device and inode), so the lease stays live while the watchdog runs. Always
    /// `false` without a liveness file (`run --pg`: the liveness is `run`'s connection).
    pub liveness_kept: bool,
    /// When the watchdog sent SIGTERM to the job after `run` died, if it did.
    pub term_at: Option<u64>,
    /// Time between SIGTERM and SIGKILL.
    pub grace: u64,
}

/// The watchdog's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// Nothing to do until this instant (or until something is heard, with `None`).
    Wait {
        /// The next instant at which the decision may change without news.
        until: Option<u64>,
    },
    /// SIGTERM (and SIGCONT) to the job's group: `run` died and the lease stays live for the
    /// grace period.
    Term,
    /// SIGKILL to the job's group, for this reason.
    Kill(Why),
    /// Nothing is left to supervise: `run` is gone and so is the job.
    Exit,
}

/// Why the watchdog kills the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Why {
    /// The hard deadline came with no later expiry confirmed: the lease could expire while
    /// the job runs (`run` stopped, hung or dead).
    Deadline,
    /// `run` died and the lease's liveness is not the watchdog's to keep (the file at the
    /// name is another, or there is none, or it is a connection that ended with `run`): a
    /// successor may be granted at once.
    LivenessGone,
    /// `run` died and the grace period is over.
    GraceOver,
}

/// The watchdog's next step, given what it knows.
///
/// The hard deadline holds on every path, the grace period included: a job is never left
/// running past the last confirmed expiry less the margin. When `run` dies, the job is killed
/// at once unless the watchdog itself keeps the lease live; otherwise it gets SIGTERM, and
/// SIGKILL at the end of the grace period or at the deadline, whichever comes first.
///
/// # Examples
///
/// ```
/// use flocklease::supervise::{Act, Watch, Why, next};
///
/// let mut w = Watch {
///     run_alive: false, job_alive: true, now: 100, deadline: Some(130),
///     liveness_kept: true, term_at: Some(95), grace: 50,
/// };
/// assert_eq!(next(&w), Act::Wait { until: Some(130) }); // the deadline before the grace's end
/// w.now = 130;
/// assert_eq!(next(&w), Act::Kill(Why::Deadline));
/// ```
pub fn next(w: &Watch) -> Act {
    if !w.job_alive {
        return if w.run_alive {
            Act::Wait { until: None }
        } else {
            Act::Exit
        };
    }
    if w.deadline.is_some_and(|d| w.now >= d) {
        return Act::Kill(Why::Deadline);
    }
    if w.run_alive {
        return Act::Wait { until: w.deadline };
    }
    if !w.liveness_kept {
        return Act::Kill(Why::LivenessGone);
    }
    match w.term_at {
        None if w.grace == 0 => Act::Kill(Why::GraceOver),
        None => Act::Term,
        Some(t) => {
            let end = t.saturating_add(w.grace);
            if w.now >= end {
                Act::Kill(Why::GraceOver)
            } else {
                Act::Wait {
                    until: Some(w.deadline.map_or(end, |d| d.min(end))),
                }
            }
        }
    }
}

/// How long before the confirmed expiry the watchdog kills a job whose `run` confirmed no
/// later one: a tenth of the TTL, at least 50 ms and at most 1 s. It covers the kill's own
/// delivery and the watchdog being scheduled late; `run` renews every third of the TTL, so a
/// renew may be late by more than half the TTL before a healthy job is killed.
pub fn margin(ttl: std::time::Duration) -> std::time::Duration {
    (ttl / 10).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    )
}

/// One thing the watchdog does, in the order [`performed`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchdogDo {
    /// SIGTERM to the job's group.
    Term,
    /// SIGCONT to the job's group (so that stopped members act on the SIGTERM).
    Cont,
    /// SIGKILL to the job's group.
    Kill,
    /// Tell `run` it killed the job at the deadline (`killed`), if `run` lives; never
    /// blocking.
    TellRun,
    /// Tell the user why (queued, never blocking).
    Say,
}

/// What the watchdog does for `act`, in order: **every signal before the words** (PROTOCOL
/// §7.1), so that a stderr that blocks, fails or stops its writer never keeps a signal from
/// going. The watchdog's loop and the model checker's watchdog perform this list; a `Say` or a
/// `TellRun` after the first for the same reason is the loop's to skip.
///
/// # Examples
///
/// ```
/// use flocklease::supervise::{Act, WatchdogDo, Why, performed};
///
/// assert_eq!(
///     performed(Act::Kill(Why::Deadline)),
///     &[WatchdogDo::Kill, WatchdogDo::TellRun, WatchdogDo::Say]
/// );
/// ```
pub fn performed(act: Act) -> &'static [WatchdogDo] {
    match act {
        Act::Term => &[WatchdogDo::Term, WatchdogDo::Cont, WatchdogDo::Say],
        Act::Kill(Why::Deadline) => &[WatchdogDo::Kill, WatchdogDo::TellRun, WatchdogDo::Say],
        Act::Kill(_) => &[WatchdogDo::Kill, WatchdogDo::Say],
        Act::Wait { .. } | Act::Exit => &[],
    }
}

/// `run`'s own side of the supervision (PROTOCOL §7): what its main loop does with what it
/// saw. The loop reaps, reads its events and the clock, feeds each here as a [`Seen`], and
/// performs the [`Do`]s in the order given — every signal before the message that tells of
/// it, so a stderr that blocks or fails never delays an act. The exit status's priority is
/// [`RunSide::status`], in one place.
///
/// Time is the caller's monotonic count, as for [`next`]; `deadline` is the hard deadline
/// (the last confirmed expiry less the margin) when the call is made.
///
/// # Examples
///
/// ```
/// use flocklease::supervise::{Do, Exit, RunSide, Said, Seen};
///
/// let mut run = RunSide::new(50);
/// // The watchdog stopped listening: the job is stopped while `run` holds the lease.
/// assert_eq!(
///     run.step(Seen::WatchdogGone, 10, Some(1_000)),
///     vec![Do::Term, Do::Say(Said::WatchdogGone)]
/// );
/// // The job ends on SIGTERM with status 0; its group is empty.
/// run.step(Seen::Exited { status: 0, by_sigkill: false }, 20, Some(1_000));
/// assert_eq!(run.step(Seen::GroupGone, 20, Some(1_000)), vec![Do::Exit(Exit::WatchdogGone)]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunSide {
    grace: u64,
    /// The command's exit status, once reaped.
    exit: Option<u8>,
    /// The command was ended by SIGKILL.
    exit_by_sigkill: bool,
    /// Why `run` began to stop the job, first reason only.
    stopping: Option<Stop>,
    /// When SIGKILL goes to the group, once stopping began.
    kill_at: Option<u64>,
    /// SIGKILL was sent by `run`.
    killed: bool,
    /// The lease was lost.
    lost: bool,
    /// The job was killed at the hard deadline, by `run` or by its watchdog.
    deadline_killed: bool,
    /// The watchdog was asked whether it killed the job.
    asked: bool,
    /// What the command left in its group got SIGTERM.
    leftovers_termed: bool,
    /// The watchdog said it killed the job.
    watchdog_killed: bool,
}

/// Why `run` began to stop its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    /// A forwarded SIGTERM or SIGINT: an ordinary stop.
    Signal,
    /// The command exited, leaving processes in its group.
    Leftovers,
    /// The lease was lost.
    Lost,
    /// The watchdog died or stopped listening: nothing would stop the job if `run` died now.
    WatchdogGone,
}

/// What `run`'s loop saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    /// The command (the group's leader) was reaped: the status `run` would exit with for it
    /// (its code, or 128 + the signal), and whether SIGKILL ended it.
    Exited {
        /// The exit status for it.
        status: u8,
        /// SIGKILL ended it.
        by_sigkill: bool,
    },
    /// No process of the job's group is left (after [`Seen::Exited`]). The loop feeds, after
    /// each reap, `GroupGone` if the group is empty and [`Seen::Tick`] otherwise.
    GroupGone,
    /// The lease was lost (the keep-alive said so).
    Lost,
    /// A signal to forward to the job; `stops`: it asks the job to stop (SIGTERM, SIGINT),
    /// so the grace period starts.
    Signal {
        /// It asks the job to stop.
        stops: bool,
    },
    /// The watchdog said it killed the job at the hard deadline.
    WatchdogKilled,
    /// The watchdog is gone (its socket ended) or does not listen (it has read no deadline
    /// for longer than the TTL, or its socket is full).
    WatchdogGone,
    /// Time passed (also the look after every event).
    Tick,
}

/// What `run`'s loop does next, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Do {
    /// Forward the signal just seen to the job's group.
    Forward,
    /// SIGTERM, then SIGCONT, to the group.
    Term,
    /// SIGKILL to the group.
    Kill,
    /// Ask the watchdog whether it killed the job (bounded), and feed the answer back
    /// ([`Seen::WatchdogKilled`], then [`Seen::GroupGone`] again).
    AskWatchdog,
    /// Tell the user (queued, never blocking).
    Say(Said),
    /// Release the lease and exit with this status.
    Exit(Exit),
}

/// A message of `run`'s, for the loop to word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Said {
    /// The lease was lost; the job is being stopped (or, if it is over, was stopped).
    Lost,
    /// The command exited; what it left in its group is being stopped.
    Leftovers,
    /// No renew confirmed before the hard deadline: `run` killed the job.
    DeadlineKill,
    /// The watchdog killed the job at the hard deadline.
    WatchdogKilled,
    /// The grace period ended: the job was killed.
    GraceOver,
    /// The watchdog died or stopped listening: the job is being stopped.
    WatchdogGone,
}

/// `run`'s exit status, by cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Exit {
    /// The job's own status.
    Job(u8),
    /// The lease was lost.
    Lost,
    /// The job was killed at the hard deadline.
    Deadline,
    /// The job was stopped because the watchdog died or stopped listening.
    WatchdogGone,
}

impl RunSide {
    /// A job just started, with `grace` between SIGTERM and SIGKILL.
    pub fn new(grace: u64) -> RunSide {
        RunSide {
            grace,
            exit: None,
            exit_by_sigkill: false,
            stopping: None,
            kill_at: None,
            killed: false,
            lost: false,
            deadline_killed: false,
            asked: false,
            leftovers_termed: false,
            watchdog_killed: false,
        }
    }

    /// What to do about `seen` at `now`, with the hard deadline `deadline`.
    pub fn step(&mut self, seen: Seen, now: u64, deadline: Option<u64>) -> Vec<Do> {
        let mut out = Vec::new();
        match seen {
            Seen::Exited { status, by_sigkill } => {
                self.exit = Some(status);
                self.exit_by_sigkill = by_sigkill;
            }
            Seen::GroupGone => {
                if self.exit_by_sigkill && !self.watchdog_killed && !self.lost && !self.asked {
                    // Killed by SIGKILL: the watchdog may have done it at its deadline (before
                    // `run`'s own kill, if `run` was stopped), and its word may still be on
                    // the way (the job's end can overtake it).
                    self.asked = true;
                    return vec![Do::AskWatchdog];
                }
                return vec![Do::Exit(self.status())];
            }
            Seen::Lost => {
                if !self.lost {
                    self.lost = true;
                    self.stop(Stop::Lost, now, &mut out);
                    out.push(Do::Say(Said::Lost));
                }
            }
            Seen::Signal { stops } => {
                out.push(Do::Forward);
                if stops {
                    self.stopping.get_or_insert(Stop::Signal);
                    self.start_grace(now);
                }
            }
            Seen::WatchdogKilled => {
                self.deadline_killed = true;
                if !self.watchdog_killed {
                    self.watchdog_killed = true;
                    out.push(Do::Say(Said::WatchdogKilled));
                }
            }
            Seen::WatchdogGone => {
                // Only a stop that has not begun is the watchdog's doing: an ordinary stop
                // (the unit's SIGTERM to every process at once) keeps the job's status.
                if self.stopping.is_none() {
                    self.stop(Stop::WatchdogGone, now, &mut out);
                    out.push(Do::Say(Said::WatchdogGone));
                }
            }
            Seen::Tick => {
                if self.exit.is_some() && !self.leftovers_termed {
                    // What the command left behind (background jobs of a script ignore SIGINT
                    // and SIGQUIT, so a forwarded signal may not have ended them) gets
                    // SIGTERM; the message only when this begins the stop.
                    self.leftovers_termed = true;
                    out.push(Do::Term);
                    if self.stopping.is_none() {
                        out.push(Do::Say(Said::Leftovers));
                    }
                    self.stopping.get_or_insert(Stop::Leftovers);
                    self.start_grace(now);
                }
            }
        }
        if !self.deadline_killed && deadline.is_some_and(|d| now >= d) {
            // `run` applies the hard deadline too: a renewer late while this loop runs never
            // leaves the job running past the lease.
            self.deadline_killed = true;
            self.killed = true;
            out.extend([Do::Kill, Do::Say(Said::DeadlineKill)]);
        }
        if !self.killed && self.kill_at.is_some_and(|k| now >= k) {
            self.killed = true;
            out.extend([Do::Kill, Do::Say(Said::GraceOver)]);
        }
        out
    }

    /// The next instant at which [`RunSide::step`] with [`Seen::Tick`] may act without news
    /// (the hard deadline, the grace period's end).
    pub fn wake_at(&self, deadline: Option<u64>) -> Option<u64> {
        let grace_end = self.kill_at.filter(|_| !self.killed);
        let hard = deadline.filter(|_| !self.deadline_killed);
        grace_end.into_iter().chain(hard).min()
    }

    /// The command has exited (its group may still have processes).
    pub fn command_exited(&self) -> bool {
        self.exit.is_some()
    }

    /// `run`'s exit status, once the job is over: a lost lease first, then a kill at the
    /// deadline, then a stop the watchdog's end caused, else the job's own status.
    pub fn status(&self) -> Exit {
        if self.lost {
            Exit::Lost
        } else if self.deadline_killed {
            Exit::Deadline
        } else if self.stopping == Some(Stop::WatchdogGone) {
            Exit::WatchdogGone
        } else {
            Exit::Job(self.exit.unwrap_or(0))
        }
    }

    fn stop(&mut self, why: Stop, now: u64, out: &mut Vec<Do>) {
        self.stopping.get_or_insert(why);
        out.push(Do::Term);
        self.start_grace(now);
    }

    fn start_grace(&mut self, now: u64) {
        let at = now.saturating_add(self.grace);
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> Watch {
        Watch {
            run_alive: true,
            job_alive: true,
            now: 0,
            deadline: Some(100),
            liveness_kept: true,
            term_at: None,
            grace: 30,
        }
    }

    #[test]
    fn while_run_lives_only_the_deadline_counts() {
        let w = watch();
        assert_eq!(next(&w), Act::Wait { until: Some(100) });
        assert_eq!(
            next(&Watch {
                liveness_kept: false,
                ..w
            }),
            Act::Wait { until: Some(100) }
        );
        assert_eq!(next(&Watch { now: 100, ..w }), Act::Kill(Why::Deadline));
    }

    #[test]
    fn run_dead_with_the_liveness_kept_gets_term_then_kill_bounded_by_the_deadline() {
        let dead = Watch {
            run_alive: false,
            now: 10,
            ..watch()
        };
        assert_eq!(next(&dead), Act::Term);
        let termed = Watch {
            term_at: Some(10),
            ..dead
        };
        assert_eq!(next(&termed), Act::Wait { until: Some(40) });
        assert_eq!(
            next(&Watch { now: 40, ..termed }),
            Act::Kill(Why::GraceOver)
        );
        // A grace period longer than the lease's time left ends at the deadline.
        let late = Watch {
            now: 90,
            term_at: Some(90),
            ..termed
        };
        assert_eq!(next(&late), Act::Wait { until: Some(100) });
        assert_eq!(next(&Watch { now: 100, ..late }), Act::Kill(Why::Deadline));
    }

    #[test]
    fn run_dead_without_the_liveness_kills_at_once() {
        let w = Watch {
            run_alive: false,
            liveness_kept: false,
            ..watch()
        };
        assert_eq!(next(&w), Act::Kill(Why::LivenessGone));
        assert_eq!(next(&Watch { grace: 0, ..w }), Act::Kill(Why::LivenessGone));
        assert_eq!(
            next(&Watch {
                liveness_kept: true,
                grace: 0,
                ..w
            }),
            Act::Kill(Why::GraceOver)
        );
    }

    #[test]
    fn nothing_left_to_supervise() {
        let gone = Watch {
            job_alive: false,
            ..watch()
        };
        assert_eq!(next(&gone), Act::Wait { until: None });
        assert_eq!(
            next(&Watch {
                run_alive: false,
                ..gone
            }),
            Act::Exit
        );
    }

    #[test]
    fn the_margin_leaves_a_late_renew_most_of_the_lease() {
        use std::time::Duration;
        assert_eq!(
            margin(Duration::from_millis(100)),
            Duration::from_millis(50)
        );
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(30)), Duration::from_secs(1));
    }

    fn exits(run: &mut RunSide, status: u8, now: u64) -> Vec<Do> {
        run.step(
            Seen::Exited {
                status,
                by_sigkill: false,
            },
            now,
            None,
        );
        run.step(Seen::GroupGone, now, None)
    }

    #[test]
    fn an_ordinary_stop_keeps_the_jobs_status_even_if_the_watchdog_goes_too() {
        // The unit's SIGTERM to every process at once: the watchdog's end after the stop
        // began is not the stop's cause.
        let mut run = RunSide::new(50);
        assert_eq!(
            run.step(Seen::Signal { stops: true }, 0, None),
            vec![Do::Forward]
        );
        assert_eq!(run.step(Seen::WatchdogGone, 1, None), vec![]);
        assert_eq!(exits(&mut run, 0, 2), vec![Do::Exit(Exit::Job(0))]);
    }

    #[test]
    fn a_watchdog_gone_first_stops_the_job_and_is_the_status() {
        let mut run = RunSide::new(50);
        assert_eq!(
            run.step(Seen::WatchdogGone, 0, None),
            vec![Do::Term, Do::Say(Said::WatchdogGone)]
        );
        assert_eq!(
            run.step(Seen::Tick, 50, None),
            vec![Do::Kill, Do::Say(Said::GraceOver)]
        );
        assert_eq!(exits(&mut run, 137, 51), vec![Do::Exit(Exit::WatchdogGone)]);
    }

    #[test]
    fn the_status_priority_is_lost_then_deadline_then_watchdog_then_the_job() {
        let mut run = RunSide::new(50);
        run.step(Seen::WatchdogGone, 0, Some(100));
        assert_eq!(
            run.step(Seen::Tick, 100, Some(100)),
            vec![Do::Kill, Do::Say(Said::DeadlineKill)]
        );
        assert_eq!(run.status(), Exit::Deadline);
        run.step(Seen::Lost, 101, Some(100));
        assert_eq!(run.status(), Exit::Lost);
    }

    #[test]
    fn signals_are_sent_before_their_words() {
        let mut run = RunSide::new(50);
        let acts = run.step(Seen::Lost, 0, None);
        assert_eq!(acts, vec![Do::Term, Do::Say(Said::Lost)]);
        let mut run = RunSide::new(50);
        run.step(
            Seen::Exited {
                status: 0,
                by_sigkill: false,
            },
            0,
            None,
        );
        assert_eq!(
            run.step(Seen::Tick, 0, None),
            vec![Do::Term, Do::Say(Said::Leftovers)]
        );
    }

    #[test]
    fn a_job_killed_by_someone_else_asks_the_watchdog_once() {
        let mut run = RunSide::new(50);
        run.step(
            Seen::Exited {
                status: 137,
                by_sigkill: true,
            },
            0,
            Some(100),
        );
        assert_eq!(
            run.step(Seen::GroupGone, 0, Some(100)),
            vec![Do::AskWatchdog]
        );
        assert_eq!(
            run.step(Seen::WatchdogKilled, 0, Some(100)),
            vec![Do::Say(Said::WatchdogKilled)]
        );
        assert_eq!(
            run.step(Seen::GroupGone, 0, Some(100)),
            vec![Do::Exit(Exit::Deadline)]
        );
        // Without the watchdog's word: the job's own status.
        let mut run = RunSide::new(50);
        run.step(
            Seen::Exited {
                status: 137,
                by_sigkill: true,
            },
            0,
            None,
        );
        assert_eq!(run.step(Seen::GroupGone, 0, None), vec![Do::AskWatchdog]);
        assert_eq!(
            run.step(Seen::GroupGone, 0, None),
            vec![Do::Exit(Exit::Job(137))]
        );
    }
}
