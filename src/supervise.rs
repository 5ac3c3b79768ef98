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
}
