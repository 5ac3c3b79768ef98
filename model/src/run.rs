//! `flocklease run`'s supervision as a model (PROTOCOL §7): `run`, its watchdog, the job, a
//! cleaner, a rival `run` and the environment, each a process that acts between any two steps
//! of the others. `run` and the watchdog are the production machines — `run` feeds
//! [`supervise::RunSide`] what it saw and performs its answers one per step; the watchdog asks
//! [`supervise::next`] and performs [`supervise::performed`]'s list one per step — so a
//! mistake in either fails the check.
//!
//! | actor | steps |
//! | --- | --- |
//! | `run` | feed its machine one thing it saw (the command's end, the group's end, the loss, the unit's SIGTERM, the watchdog's word, its end or deafness, the deadline or the grace period's end) · perform the machine's next output (forward, SIGTERM, SIGKILL, ask the watchdog, say, exit) · renew: the record's expiry moves to now + TTL; a deleted liveness file is published again, locked, and sent to the watchdog before it is placed · send the renewed deadline to the watchdog's socket (bounded: a full socket, or a deadline unread for longer than the TTL, is a deaf watchdog) · die (`kill -9`) · stop and continue |
//! | watchdog | read the deadlines waiting (and answer `heard`) · hear end of file once `run` died · perform what [`supervise::next`] says, step by step as [`supervise::performed`] lists it · die · stop and continue |
//! | job | close its inherited liveness descriptor · the command exits, leaving a grandchild in the group · exit after SIGTERM (status 0), or ignore it |
//! | cleaner | delete the liveness file at its name |
//! | rival | granted the lease (a later generation) once it is free: expired, released, or its liveness file at the name unlocked |
//! | environment | stderr is a file, a full pipe, a broken pipe or a `tostop` terminal (one per initial state) · the unit's stop: SIGTERM to `run`, the watchdog and the job at once |
//!
//! Time advances one tick at a time; a running `run` or watchdog with something to do acts
//! before the clock moves on (their waits are timers and events). A process blocked in a
//! write is not down: it is ours, stuck.
//!
//! The properties: **no job runs while a later generation is granted**, unless `run` and the
//! watchdog were both down (stopped or dead) at some moment — the documented exception
//! (PROTOCOL §7, §11); and **on an ordinary stop** (the unit's SIGTERM with nothing else
//! going wrong) **`run` exits with the job's status**, never 79. Each planted mistake
//! ([`RunPlanted`]) breaks one of them.

use std::fmt;

use flocklease::supervise::{self, Act, Do, Exit, RunSide, Seen, Watch, WatchdogDo};
use stateright::{Model, Property};

use crate::harness::SmallModel;

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

/// What `run`'s and the watchdog's stderr is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stderr {
    /// A file, or a pipe that is read: a write returns.
    Fine,
    /// A pipe nobody reads, full: a write blocks.
    Full,
    /// A pipe whose reader is gone, or a hung-up terminal: a write fails.
    Broken,
    /// A terminal with `stty tostop`, `run` in its foreground: a write from the watchdog's
    /// background group stops it (SIGTTOU) unless it ignores the signal.
    Tostop,
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
    /// The watchdog prints its message before it signals, writing to stderr itself (a full
    /// pipe blocks it, a `tostop` terminal stops it).
    SayBeforeSignal,
    /// `run` writes a deadline to a full socket with a blocking write under the deadlines'
    /// lock, which its main loop needs too: it blocks until the watchdog reads.
    BlockingDeadlineWrite,
    /// A failed write panics: `run`'s unwinding releases the lease, the watchdog dies.
    PanicOnFailedWrite,
    /// The watchdog exits on the unit's SIGTERM.
    WatchdogExitsOnTerm,
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
    /// How many deadlines the watchdog's socket holds unread.
    pub socket: u8,
    /// The stderrs to start from (one initial state each).
    pub stderr: Vec<Stderr>,
    /// The unit may be stopped (SIGTERM to every process at once).
    pub unit_stop: bool,
    /// The command may exit leaving a grandchild in its group.
    pub leftovers: bool,
    /// The job may close its inherited descriptors.
    pub job_closes: bool,
    /// `run` and the watchdog may be killed (else only stopped and continued).
    pub kills: bool,
    /// The watchdog may be stopped alone (and continued) this many times.
    pub watchdog_stops: u8,
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
            socket: 1,
            stderr: vec![Stderr::Fine],
            unit_stop: false,
            leftovers: false,
            job_closes: true,
            kills: true,
            watchdog_stops: 1,
            planted: None,
        }
    }
}

impl RunModel {
    /// The environment's configuration: every stderr, the unit's stop, a command that leaves a
    /// grandchild, `run` stopped; no kills, no watchdog stopped alone (its full socket), no
    /// cleaner and no job that closes its descriptors — the default configuration has those —
    /// to keep the state space small.
    pub fn environment() -> RunModel {
        RunModel {
            cleaner: 0,
            stderr: vec![Stderr::Fine, Stderr::Full, Stderr::Broken, Stderr::Tostop],
            unit_stop: true,
            leftovers: true,
            job_closes: false,
            kills: false,
            watchdog_stops: 0,
            ttl: 2,
            grace: 2,
            max_time: 4,
            ..RunModel::default()
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
    /// `run`'s machine.
    pub side: RunSide,
    /// What `run`'s machine said to do that `run` has not done yet, first first.
    pub run_out: Vec<Do>,
    /// What `run` has fed its machine already.
    pub fed: Fed,
    /// `run` is blocked in a write (planted: the deadline's, under the lock its loop needs).
    pub run_blocked: bool,
    /// `run`'s exit status, once it exited.
    pub run_exit: Option<Exit>,
    /// The liveness file `run`'s lease manager holds locked (none once dead).
    pub run_live: Option<u8>,
    /// The last renew's expiry has been sent to the watchdog.
    pub run_told: bool,
    /// `run` may still be stopped once.
    pub run_stops: u8,
    /// `run` renewed during this tick (it renews every third of the TTL: at most once a tick).
    pub renewed: bool,
    /// The lease was released (by `run`'s exit, or by a panic's unwinding).
    pub released: bool,
    /// Deadlines in the watchdog's socket, unread, and the latest of them.
    pub socket: u8,
    /// The latest deadline in the socket.
    pub socket_expiry: Option<u8>,
    /// When the oldest unread deadline was sent.
    pub unheard_since: Option<u8>,
    /// A send found the socket full.
    pub socket_full: bool,
    /// The watchdog.
    pub wd: Proc,
    /// What the watchdog is doing, step by step ([`supervise::performed`]), first first.
    pub wd_out: Vec<WatchdogDo>,
    /// The watchdog is blocked in a write, or stopped by its own write (SIGTTOU).
    pub wd_blocked: bool,
    /// The watchdog may still be stopped once.
    pub wd_stops: u8,
    /// The watchdog has heard end of file (`run` died).
    pub wd_eof: bool,
    /// The last expiry the watchdog read.
    pub wd_expiry: Option<u8>,
    /// The liveness file the watchdog holds a descriptor of.
    pub wd_live: Option<u8>,
    /// When the watchdog sent SIGTERM.
    pub wd_term_at: Option<u8>,
    /// The watchdog told `run` it killed the job; `run` has not heard it yet.
    pub wd_said_killed: bool,
    /// A process of the job's group runs.
    pub job: bool,
    /// The command itself (the group's leader) runs.
    pub job_cmd: bool,
    /// The command's exit status as `run` reports it, and whether SIGKILL ended it.
    pub job_status: (u8, bool),
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
    /// `run`'s and the watchdog's stderr.
    pub stderr: Stderr,
    /// The unit was stopped (SIGTERM to every process); `run` has not seen its signal yet.
    pub unit_stop: Option<bool>,
    /// A later generation was granted to a rival.
    pub rival: bool,
    /// Ghost: `run` and the watchdog were both down (stopped or dead) at some moment.
    pub both_down: bool,
    /// Ghost: the watchdog killed the job.
    pub wd_killed: bool,
    /// Ghost: a process was stopped or killed, or a file deleted or closed, by someone else.
    pub disturbed: bool,
}

/// What `run` has fed its machine (each once, but the group's end, which follows the
/// watchdog's answer again).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fed {
    /// The command's end.
    pub exited: bool,
    /// The group's end.
    pub gone: bool,
    /// The loss.
    pub lost: bool,
    /// The watchdog's end or deafness.
    pub watchdog: bool,
}

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunAction {
    /// The clock moves on.
    Tick,
    /// `run` feeds its machine what it saw.
    RunSees(Seen),
    /// `run` performs its machine's next output.
    RunDoes,
    /// `run` renews (restoring a deleted liveness file).
    Renew,
    /// `run` sends the watchdog the renewed deadline (and, planted, the restored file).
    Tell,
    /// `run` is killed.
    RunDie,
    /// `run` is stopped.
    RunStop,
    /// `run` is continued.
    RunCont,
    /// The watchdog reads the deadlines waiting.
    WdHear,
    /// The watchdog hears end of file.
    WdEof,
    /// The watchdog performs its next step (deciding, if it has none).
    WdDoes,
    /// The watchdog is killed.
    WdDie,
    /// The watchdog is stopped.
    WdStop,
    /// The watchdog is continued.
    WdCont,
    /// The job closes its inherited descriptors.
    JobClose,
    /// The command exits, leaving a grandchild in the group.
    CmdExit,
    /// The job exits after SIGTERM (status 0).
    JobExit,
    /// The cleaner deletes the liveness file.
    Clean,
    /// The unit is stopped: SIGTERM to `run`, the watchdog and the job at once.
    UnitStop,
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

    /// `run`'s hard deadline: the expiry its renews confirmed, less the margin.
    fn run_deadline(s: &RunState) -> Option<u64> {
        Some(u64::from(s.expiry.saturating_sub(MARGIN)))
    }

    /// What `run` saw and has not fed its machine yet (any order: the real loop's inputs race).
    fn run_news(&self, s: &RunState) -> Vec<Seen> {
        let mut news = vec![];
        if !s.job_cmd && !s.fed.exited {
            let (status, by_sigkill) = s.job_status;
            news.push(Seen::Exited { status, by_sigkill });
        }
        if s.rival && !s.fed.lost {
            news.push(Seen::Lost);
        }
        let deaf = s.socket_full
            || s.unheard_since
                .is_some_and(|t| s.now.saturating_sub(t) > self.ttl);
        if deaf && !s.fed.watchdog {
            news.push(Seen::WatchdogGone);
        }
        // The events of its channel (a signal, the watchdog's word or its end) in the order
        // they were sent: here, whichever the model lets come first.
        let mut events = vec![];
        if s.unit_stop == Some(true) {
            events.push(Seen::Signal { stops: true });
        }
        if s.wd_said_killed {
            events.push(Seen::WatchdogKilled);
        }
        if s.wd == Proc::Dead && !s.fed.watchdog {
            events.push(Seen::WatchdogGone);
        }
        news.extend(events);
        if s.fed.exited && !s.job && !s.fed.gone {
            news.push(Seen::GroupGone);
        }
        // A look at the clock that would act: the deadline, the grace period's end, what the
        // command left behind.
        if !s
            .side
            .clone()
            .step(Seen::Tick, u64::from(s.now), Self::run_deadline(s))
            .is_empty()
        {
            news.push(Seen::Tick);
        }
        news
    }

    /// `run` acts: running, not blocked, not exited.
    fn run_acts(s: &RunState) -> bool {
        s.run == Proc::Running && !s.run_blocked && s.run_exit.is_none()
    }

    /// The watchdog acts: running and not blocked.
    fn wd_acts(s: &RunState) -> bool {
        s.wd == Proc::Running && !s.wd_blocked
    }

    /// Whether the watchdog has something to do now (one [`RunAction::WdDoes`], a read, the
    /// end of file).
    fn wd_due(&self, s: &RunState) -> Option<RunAction> {
        if !Self::wd_acts(s) {
            return None;
        }
        if !s.wd_out.is_empty() {
            return Some(RunAction::WdDoes);
        }
        if s.socket > 0 {
            return Some(RunAction::WdHear);
        }
        if s.run == Proc::Dead && !s.wd_eof {
            return Some(RunAction::WdEof);
        }
        match supervise::next(&self.watch(s)) {
            Act::Term | Act::Kill(_) => Some(RunAction::WdDoes),
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

    /// A write of `run` or the watchdog to stderr, as production makes it (queued: it never
    /// blocks or fails) or as a plant makes it. Returns (blocked, dies).
    fn write(&self, s: &RunState, direct: bool, background: bool) -> (bool, bool) {
        let panics = self.planted == Some(RunPlanted::PanicOnFailedWrite);
        match s.stderr {
            Stderr::Broken if panics => (false, true),
            Stderr::Full if direct => (true, false),
            // SIGTTOU stops a background writer that does not ignore it; it is our own stop.
            Stderr::Tostop if direct && background => (true, false),
            _ => (false, false),
        }
    }

    /// The job's group ends, by `by`.
    fn job_ends(s: &mut RunState, status: (u8, bool)) {
        if s.job_cmd {
            s.job_status = status;
        }
        s.job = false;
        s.job_cmd = false;
        s.job_live = None;
    }
}

/// The property's name.
pub const NO_OVERLAP: &str =
    "no job runs while a later generation is granted (unless run and the watchdog were both down)";

/// The second property's name.
pub const ORDINARY_STOP: &str =
    "on an ordinary stop (the unit's SIGTERM, nothing else going wrong) run never exits 79";

impl Model for RunModel {
    type State = RunState;
    type Action = RunAction;

    fn init_states(&self) -> Vec<RunState> {
        // Granted at 0 with liveness file 1, which run's lease manager locked and sent to the
        // watchdog; the job inherited a copy; the watchdog knows the expiry.
        self.stderr
            .iter()
            .map(|&stderr| RunState {
                now: 0,
                expiry: self.ttl,
                run: Proc::Running,
                side: RunSide::new(u64::from(self.grace)),
                run_out: vec![],
                fed: Fed::default(),
                run_blocked: false,
                run_exit: None,
                run_live: Some(1),
                run_told: true,
                run_stops: 1,
                renewed: true,
                released: false,
                socket: 0,
                socket_expiry: None,
                unheard_since: None,
                socket_full: false,
                wd: Proc::Running,
                wd_out: vec![],
                wd_blocked: false,
                wd_stops: self.watchdog_stops,
                wd_eof: false,
                wd_expiry: Some(self.ttl),
                wd_live: (self.planted != Some(RunPlanted::JobKeepsLiveness)).then_some(1),
                wd_term_at: None,
                wd_said_killed: false,
                job: true,
                job_cmd: true,
                job_status: (0, false),
                job_live: Some(1),
                job_termed: false,
                name: Some(1),
                next_inode: 2,
                cleaner_left: self.cleaner,
                stderr,
                unit_stop: None,
                rival: false,
                both_down: false,
                wd_killed: false,
                disturbed: false,
            })
            .collect()
    }

    fn actions(&self, s: &RunState, actions: &mut Vec<RunAction>) {
        let wd_due = self.wd_due(s);
        let news = if Self::run_acts(s) {
            self.run_news(s)
        } else {
            vec![]
        };
        let run_due = Self::run_acts(s) && (!s.run_out.is_empty() || !news.is_empty());
        if s.now < self.max_time && wd_due.is_none() && !run_due {
            actions.push(RunAction::Tick);
        }
        if let Some(a) = wd_due {
            actions.push(a);
        }
        if Self::run_acts(s) {
            if s.run_out.is_empty() {
                // In the real loop's order: what arrived is what the model's interleaving
                // decides, not the order the loop reads it in.
                // With the unit's stop, its SIGTERM and the watchdog's end race: any first.
                let first = if self.unit_stop { news.len() } else { 1 };
                actions.extend(news.into_iter().take(first).map(RunAction::RunSees));
            } else {
                actions.push(RunAction::RunDoes);
            }
            if !s.rival && s.job && !s.renewed {
                actions.push(RunAction::Renew);
            }
            if !s.run_told {
                actions.push(RunAction::Tell);
            }
        }
        match s.run {
            Proc::Running if s.run_exit.is_none() => {
                if s.run_stops > 0 {
                    actions.push(RunAction::RunStop);
                }
            }
            Proc::Stopped => actions.push(RunAction::RunCont),
            Proc::Running | Proc::Dead => {}
        }
        if self.kills && s.run != Proc::Dead && s.run_exit.is_none() {
            actions.push(RunAction::RunDie);
        }
        match s.wd {
            Proc::Running if s.wd_stops > 0 => actions.push(RunAction::WdStop),
            Proc::Stopped => actions.push(RunAction::WdCont),
            Proc::Running | Proc::Dead => {}
        }
        if self.kills && s.wd != Proc::Dead {
            actions.push(RunAction::WdDie);
        }
        if s.job {
            if self.job_closes && s.job_live.is_some() {
                actions.push(RunAction::JobClose);
            }
            if self.leftovers && s.job_cmd && !s.job_termed {
                actions.push(RunAction::CmdExit);
            }
            if s.job_termed {
                actions.push(RunAction::JobExit);
            }
        }
        if s.cleaner_left > 0 && s.name.is_some() {
            actions.push(RunAction::Clean);
        }
        if self.unit_stop && s.unit_stop.is_none() && s.run != Proc::Dead && s.run_exit.is_none() {
            actions.push(RunAction::UnitStop);
        }
        if !s.rival && (s.now >= s.expiry || s.released || Self::free_by_liveness(s)) {
            actions.push(RunAction::RivalGranted);
        }
    }

    fn next_state(&self, last: &RunState, action: RunAction) -> Option<RunState> {
        let mut s = last.clone();
        match action {
            RunAction::Tick => {
                s.now += 1;
                s.renewed = false;
            }
            RunAction::RunSees(seen) => {
                match seen {
                    Seen::Exited { .. } => s.fed.exited = true,
                    Seen::GroupGone => s.fed.gone = true,
                    Seen::Lost => s.fed.lost = true,
                    Seen::WatchdogGone => s.fed.watchdog = true,
                    Seen::Signal { .. } => s.unit_stop = Some(false),
                    Seen::WatchdogKilled => s.wd_said_killed = false,
                    Seen::Tick => {}
                }
                s.run_out = s.side.step(seen, u64::from(s.now), Self::run_deadline(&s));
            }
            RunAction::RunDoes => {
                let act = s.run_out.remove(0);
                match act {
                    Do::Forward | Do::Term => {
                        if s.job {
                            s.job_termed = true;
                        }
                    }
                    Do::Kill => {
                        if s.job {
                            Self::job_ends(&mut s, (137, true));
                        }
                    }
                    // The real `run` waits (bounded) for the watchdog's word; the group's end
                    // is then seen again.
                    Do::AskWatchdog => s.fed.gone = false,
                    Do::Say(_) => {
                        let (blocked, dies) = self.write(&s, false, false);
                        s.run_blocked = blocked;
                        if dies {
                            // The unwinding drops the keep-alive, which releases the lease.
                            s.run = Proc::Dead;
                            s.run_live = None;
                            s.released = true;
                            s.run_out.clear();
                        }
                    }
                    Do::Exit(exit) => {
                        s.run_exit = Some(exit);
                        s.run = Proc::Dead;
                        s.run_live = None;
                        s.released = true;
                        s.run_out.clear();
                    }
                }
            }
            RunAction::Renew => {
                s.renewed = true;
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
                if s.wd == Proc::Dead {
                    s.run_told = true;
                } else if Self::wd_acts(&s) && s.socket == 0 {
                    // A running watchdog polls its socket: it reads the deadline (and answers
                    // `heard`) before anything else can happen to it.
                    s.run_told = true;
                    s.wd_expiry = Some(s.expiry);
                    if self.planted == Some(RunPlanted::ShareAfterPlace) {
                        s.wd_live = s.run_live;
                    }
                } else if s.socket < self.socket {
                    s.run_told = true;
                    s.socket += 1;
                    s.socket_expiry = Some(s.expiry);
                    s.unheard_since.get_or_insert(s.now);
                    if self.planted == Some(RunPlanted::ShareAfterPlace) {
                        s.wd_live = s.run_live;
                    }
                } else if self.planted == Some(RunPlanted::BlockingDeadlineWrite) {
                    // Blocked under the lock its loop needs, until the watchdog reads.
                    s.run_blocked = true;
                } else {
                    // Never blocking: the full socket is a deaf watchdog.
                    s.run_told = true;
                    s.socket_full = true;
                }
            }
            RunAction::RunDie => {
                s.run = Proc::Dead;
                s.run_live = None;
                s.disturbed = true;
            }
            RunAction::RunStop => {
                s.run = Proc::Stopped;
                s.run_stops -= 1;
                s.disturbed = true;
            }
            RunAction::RunCont => s.run = Proc::Running,
            RunAction::WdHear => {
                s.wd_expiry = s.socket_expiry.or(s.wd_expiry);
                s.socket = 0;
                s.unheard_since = None;
                if s.run_blocked && self.planted == Some(RunPlanted::BlockingDeadlineWrite) {
                    // The blocked write goes through now.
                    s.run_blocked = false;
                }
            }
            RunAction::WdEof => s.wd_eof = true,
            RunAction::WdDoes => {
                if s.wd_out.is_empty() {
                    let act = supervise::next(&self.watch(&s));
                    if act == Act::Term {
                        s.wd_term_at = Some(s.now);
                    }
                    s.wd_out = supervise::performed(act).to_vec();
                    if self.planted == Some(RunPlanted::SayBeforeSignal) {
                        s.wd_out.retain(|d| *d != WatchdogDo::Say);
                        s.wd_out.insert(0, WatchdogDo::Say);
                    }
                }
                match s.wd_out.remove(0) {
                    WatchdogDo::Term => {
                        if s.job {
                            s.job_termed = true;
                        }
                    }
                    WatchdogDo::Cont => {}
                    WatchdogDo::Kill => {
                        if s.job {
                            Self::job_ends(&mut s, (137, true));
                            s.wd_killed = true;
                        }
                    }
                    WatchdogDo::TellRun => s.wd_said_killed = !s.wd_eof,
                    WatchdogDo::Say => {
                        let direct = self.planted == Some(RunPlanted::SayBeforeSignal);
                        let (blocked, dies) = self.write(&s, direct, true);
                        s.wd_blocked = blocked;
                        if dies {
                            s.wd = Proc::Dead;
                            s.wd_live = None;
                        }
                    }
                }
            }
            RunAction::WdDie => {
                s.wd = Proc::Dead;
                s.wd_live = None;
                s.disturbed = true;
            }
            RunAction::WdStop => {
                s.wd = Proc::Stopped;
                s.wd_stops -= 1;
                s.disturbed = true;
            }
            RunAction::WdCont => s.wd = Proc::Running,
            RunAction::JobClose => {
                s.job_live = None;
                s.disturbed = true;
            }
            RunAction::CmdExit => {
                s.job_cmd = false;
                s.job_status = (0, false);
            }
            RunAction::JobExit => Self::job_ends(&mut s, (0, false)),
            RunAction::Clean => {
                s.name = None;
                s.cleaner_left -= 1;
                s.disturbed = true;
            }
            RunAction::UnitStop => {
                s.unit_stop = Some(true);
                if s.job {
                    s.job_termed = true;
                }
                if self.planted == Some(RunPlanted::WatchdogExitsOnTerm) && s.wd != Proc::Dead {
                    s.wd = Proc::Dead;
                    s.wd_live = None;
                }
            }
            RunAction::RivalGranted => s.rival = true,
        }
        if s.run != Proc::Running && s.wd != Proc::Running {
            s.both_down = true;
        }
        // The ghost only the unit's stop reads.
        s.disturbed &= self.unit_stop;
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(NO_OVERLAP, |_, s: &RunState| {
                !(s.job && s.rival) || s.both_down
            }),
            Property::always(ORDINARY_STOP, |_, s: &RunState| {
                s.unit_stop.is_none() || s.disturbed || s.run_exit != Some(Exit::WatchdogGone)
            }),
            Property::sometimes("the watchdog kills the job", |_, s: &RunState| s.wd_killed),
            Property::sometimes(
                "a rival is granted after the job, with run and the watchdog never both down",
                |_, s: &RunState| s.rival && !s.both_down,
            ),
        ];
        if self.watchdog_stops > 0 {
            properties.push(Property::sometimes(
                "a deaf watchdog makes run stop the job",
                |_, s: &RunState| s.run_exit == Some(Exit::WatchdogGone) && s.wd != Proc::Dead,
            ));
        }
        if self.unit_stop {
            properties.push(Property::sometimes(
                "an ordinary stop ends with the job's status",
                |_, s: &RunState| {
                    s.unit_stop.is_some() && !s.disturbed && s.run_exit == Some(Exit::Job(0))
                },
            ));
        }
        properties
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

impl SmallModel for RunModel {
    type Planted = RunPlanted;
    const CONFIG: &'static str = "run";
    const TITLE: &'static str = "run's supervision";
    const PLANTED: &'static [(&'static str, RunPlanted)] = &[
        ("grace-forgets-expiry", RunPlanted::GraceForgetsExpiry),
        ("share-after-place", RunPlanted::ShareAfterPlace),
        ("job-keeps-liveness", RunPlanted::JobKeepsLiveness),
        ("blocking-deadline-write", RunPlanted::BlockingDeadlineWrite),
        ("say-before-signal", RunPlanted::SayBeforeSignal),
        ("panic-on-failed-write", RunPlanted::PanicOnFailedWrite),
        ("watchdog-exits-on-term", RunPlanted::WatchdogExitsOnTerm),
    ];
    const BREAKS: &'static str = "the job still runs while a rival holds a later generation, and \
         run and the watchdog were never both down; or an ordinary stop ended with 79";

    fn planted_mut(&mut self) -> Option<&mut Option<RunPlanted>> {
        Some(&mut self.planted)
    }

    /// The environment's mistakes show in its configuration.
    fn shown_in(planted: RunPlanted) -> Option<Self> {
        use RunPlanted::*;
        matches!(
            planted,
            SayBeforeSignal | PanicOnFailedWrite | WatchdogExitsOnTerm
        )
        .then(RunModel::environment)
    }

    fn header(&self) -> String {
        format!(
            "run supervision (PROTOCOL §7): run (supervise::RunSide), watchdog (supervise::next, \
             performed), job, cleaner {}, rival; stderr {:?}{}{}; TTL {} ticks, grace {}, margin \
             {MARGIN}, clock to {}",
            self.cleaner,
            self.stderr,
            if self.unit_stop {
                ", the unit's stop"
            } else {
                ""
            },
            if self.leftovers { ", leftovers" } else { "" },
            self.ttl,
            self.grace,
            self.max_time,
        )
    }

    /// This configuration and, unless a mistake is planted (whose own configuration this is),
    /// the environment's ([`RunModel::environment`]).
    fn configurations(self) -> Vec<Self> {
        match self.planted {
            Some(_) => vec![self],
            None => vec![self, RunModel::environment()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness;

    #[test]
    fn the_default_configuration_holds_with_a_pinned_state_count() {
        // Pinned: a change to the actors or the rules that moves it must say why (68 276
        // before `run` ran its own machine and the watchdog's socket and steps were actors).
        harness::assert_holds(RunModel::default(), 3_438_922);
    }

    #[test]
    fn the_environment_holds_with_a_pinned_state_count() {
        harness::assert_holds(RunModel::environment(), 915_080);
    }

    /// Each in the configuration it shows in (the environment's mistakes in its own).
    #[test]
    fn a_planted_bug_fails_the_check() {
        for (planted, property) in [
            (RunPlanted::GraceForgetsExpiry, NO_OVERLAP),
            (RunPlanted::ShareAfterPlace, NO_OVERLAP),
            (RunPlanted::JobKeepsLiveness, NO_OVERLAP),
            (RunPlanted::BlockingDeadlineWrite, NO_OVERLAP),
            (RunPlanted::SayBeforeSignal, NO_OVERLAP),
            (RunPlanted::PanicOnFailedWrite, NO_OVERLAP),
            (RunPlanted::WatchdogExitsOnTerm, ORDINARY_STOP),
        ] {
            harness::assert_caught::<RunModel>(planted, property);
        }
    }
}
