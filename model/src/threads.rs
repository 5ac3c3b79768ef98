//! Threads of one instance (PROTOCOL §9.2): what the calls of one `FlockLease` hold of an id
//! while threads of its process call it at once, and a rival process that takes the id's
//! transition lock. Each step takes or gives back one thing, or waits for one (a futex
//! operation, a `flock(2)` attempt): the steps the adapter's calls take, in the library's own
//! orders — [`flocklease::flock::SECTION`] for a fenced section and
//! [`flocklease::driver::TRANSITION`] for a transition, which `FlockLease::fenced` and the
//! front's transitions run step by step.
//!
//! | actor | steps |
//! | --- | --- |
//! | thread 0 | a fenced section whose closure does nothing, calls `liveness_fd`, a transition (`renew`) or `acquire_wait` on the same instance |
//! | thread 1 | a transition, `liveness_fd`, `acquire_wait`, or a fenced section doing nothing, on the same instance, starting at any moment |
//! | rival | another process's transition or section: takes the transition lock when it is free, gives it back a tick later or more, up to `rival_takes` times (2 by default) |
//! | clock | moves one tick once no thread that has begun its call can take a step (a thread that runs is never starved by time; one that has not begun may begin at any tick) |
//!
//! Time passes only while threads wait (for the turn, the lock, the holder, or the clock
//! itself): a step, a check, a closure's own work and a transition's run take no time, so a
//! bound the model finds kept holds for calls whose own work is short against the lock
//! timeout, and a call blocked for good shows as one still under way past its bound.
//!
//! What each holds: the id's **turn** (`front::Gate`, waited for until the call's deadline,
//! not re-entrant; its state is the library's own [`GateState`], whose rules — one look: no
//! longer counted if it woke, take it if free, give up at the deadline, else park counted;
//! leave, and wake one if any is counted — each step runs, with the gate's condition variable
//! simulated: a parked thread steps again only once a leaving caller's `notify_one` woke it,
//! or at its deadline), the instance's **state** of the id (a mutex, waited for without a
//! deadline, not re-entrant), the **lock** `<stem>.lock` (a new descriptor per call: a call's own
//! section's lock excludes it; waited for until the call's deadline). `liveness_fd` takes the
//! state for an instant; `acquire_wait`'s look at what the instance holds reads a flag the
//! state keeps beside it (it takes nothing, never waits); a wait's wait for the holder takes
//! nothing.
//!
//! The properties of the turn itself, the rules of [`GateState`] judged: **at most one call has
//! the id's turn**; **the turn is taken exactly while a call has it** (a leave that does not
//! free it breaks it); **while the turn is free, every call waiting for it has been woken** (a
//! leaving caller that does not wake a waiter leaves it asleep to its deadline: planting
//! `leave`'s `waiting > 0` as `< 0` breaks it); **the turn counts as waiting exactly the calls
//! parked on it** (`woke`'s `-= 1` as `+= 1` breaks it).
//!
//! The property: **every call returns within its bound** — a transition and `liveness_fd`
//! within the lock timeout (`liveness_fd` may wait for another thread's call waiting for the
//! lock), `acquire_wait` within its timeout plus one lock timeout, a fenced section within the
//! lock timeout plus its closure's call's bound. A call blocked for good (a deadlock) passes
//! every bound. Planting the section that keeps the state across its closure (the mistake
//! issue 33 found: `liveness_fd` inside the section never returned) breaks it; so does a look
//! of `acquire_wait` that waits for the state (it then waits for another thread's wait for the
//! lock before its own attempt waits again: two lock timeouts past its timeout, which this
//! model found in the adapter), and so does a wait that attempts again after an attempt that
//! ended past its deadline.
//!
//! What is the adapter's own and what is written here: the section's and the transition's
//! orders are the library's ([`flocklease::flock::SECTION`], [`flocklease::driver::TRANSITION`],
//! which `FlockLease::fenced` and `FlockLease`'s transitions interpret step by step);
//! `liveness_fd`'s and `acquire_wait`'s shapes (a look at the state; a look, an attempt, the
//! deadline's check, a wait, a look and an attempt) are written here as the adapter's code has
//! them.

use std::fmt;

use flocklease::driver::{GateState, Hold, HoldStep, TRANSITION, TurnLook};
use flocklease::flock::SECTION;
use stateright::{Model, Property};

use crate::harness::SmallModel;

/// The lock timeout, in ticks.
pub const LOCK_TIMEOUT: u8 = 2;
/// `acquire_wait`'s timeout, in ticks.
pub const WAIT_TIMEOUT: u8 = 1;

/// A call a thread makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// A fenced section whose closure makes this call (or nothing).
    Section(Option<Inner>),
    /// `acquire`, `renew` or `release`: one transition.
    Transition,
    /// `liveness_fd`.
    LivenessFd,
    /// `acquire_wait`: a look at what the instance holds, an attempt, the deadline's check,
    /// a wait for the holder (to the deadline at the latest), and the attempt after it.
    AcquireWait,
}

/// What a fenced section's closure calls on the same instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inner {
    /// A transition (a `renew`).
    Transition,
    /// `liveness_fd`.
    LivenessFd,
    /// `acquire_wait`.
    AcquireWait,
}

impl From<Inner> for Call {
    fn from(inner: Inner) -> Call {
        match inner {
            Inner::Transition => Call::Transition,
            Inner::LivenessFd => Call::LivenessFd,
            Inner::AcquireWait => Call::AcquireWait,
        }
    }
}

impl Call {
    /// The documented bound of the call, in ticks.
    fn bound(self) -> u8 {
        match self {
            Call::Transition | Call::LivenessFd => LOCK_TIMEOUT,
            Call::AcquireWait => WAIT_TIMEOUT + LOCK_TIMEOUT,
            Call::Section(inner) => LOCK_TIMEOUT + inner.map_or(0, |i| Call::from(i).bound()),
        }
    }
}

/// One step of a thread's program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// A call starts: its deadline is the lock timeout from now.
    Begin(Call),
    /// Takes what it names (waits while another has it; the turn and the lock until the
    /// call's deadline, then the call fails).
    Take(Hold),
    /// Gives back what it names.
    Give(Hold),
    /// `acquire_wait`'s look at what the instance holds: a flag the state keeps beside it,
    /// read without taking anything (never a wait).
    TryState,
    /// `acquire_wait`'s check of its deadline after an attempt: past it, the call returns.
    Deadline,
    /// `acquire_wait`'s wait for the holder: until its timeout, holding nothing.
    Wait,
    /// Work that holds nothing new (the check, a closure's own work).
    Work,
    /// A transition's run: its steps, the last of which gives the lock back (the driver ends
    /// every run by releasing it, `Io::Unlock`; the threads' lockstep found the model holding
    /// it to the transition's end).
    Run,
    /// The call returns.
    End,
}

/// The steps a thread takes for `call` (the adapter's orders, unplanted), for the threads'
/// lockstep.
pub fn ops(call: Call) -> Vec<Op> {
    let mut ops = Vec::new();
    program(call, &mut ops);
    ops
}

/// A thread's program for `call`.
fn program(call: Call, ops: &mut Vec<Op>) {
    ops.push(Op::Begin(call));
    match call {
        Call::Section(inner) => steps(&SECTION, inner, ops),
        Call::Transition => {
            for step in TRANSITION {
                ops.push(match step {
                    HoldStep::Take(h) => Op::Take(h),
                    HoldStep::Give(h) => Op::Give(h),
                    HoldStep::Check => Op::Work,
                    HoldStep::Run => Op::Run,
                });
            }
        }
        Call::LivenessFd => ops.extend([Op::Take(Hold::State), Op::Give(Hold::State)]),
        // The adapter's loop, its last turn unrolled: a look, an attempt, the deadline's
        // check; a wait, which ends at the deadline at the latest (a generation that ends
        // earlier only adds turns that start before the deadline); the look and the attempt
        // after it, which the deadline's check then ends. That last attempt, begun by the
        // deadline, is what may take one lock timeout past `timeout`.
        Call::AcquireWait => {
            ops.push(Op::TryState);
            program(Call::Transition, ops);
            ops.extend([Op::Deadline, Op::Wait, Op::TryState]);
            program(Call::Transition, ops);
        }
    }
    ops.push(Op::End);
}

/// The adapter's `schedule` as ops, the closure (or run) making `inner`.
fn steps(schedule: &[HoldStep], inner: Option<Inner>, ops: &mut Vec<Op>) {
    for step in schedule {
        match step {
            HoldStep::Take(h) => ops.push(Op::Take(*h)),
            HoldStep::Give(h) => ops.push(Op::Give(*h)),
            HoldStep::Check => ops.push(Op::Work),
            HoldStep::Run => match inner {
                Some(i) => program(i.into(), ops),
                None => ops.push(Op::Work),
            },
        }
    }
}

/// A known mistake to plant, to see the checker catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadsPlanted {
    /// The section gives the state back after its closure (issue 33's finding).
    StateAcrossClosure,
    /// `acquire_wait`'s look at what the instance holds waits for the state (the adapter
    /// before this model found it).
    LookWaits,
    /// `acquire_wait` does not check its deadline after an attempt: it waits and attempts
    /// again after one that ended past it (two lock timeouts past `timeout`).
    WaitPastDeadline,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct ThreadsModel {
    /// The clock runs from 0 to this many ticks.
    pub max_time: u8,
    /// How many times the rival may take the lock.
    pub rival_takes: u8,
    /// A planted mistake.
    pub planted: Option<ThreadsPlanted>,
}

impl Default for ThreadsModel {
    fn default() -> Self {
        ThreadsModel {
            max_time: 9,
            rival_takes: 2,
            planted: None,
        }
    }
}

/// Who holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// A call of this thread (its frame at this depth).
    Thread(usize, usize),
    /// The rival process.
    Rival,
}

/// A call under way on a thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The call.
    pub call: Call,
    /// When it started.
    pub started: u8,
    /// What it took and has not given back.
    pub holds: Vec<Hold>,
}

/// One thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Thread {
    /// Its program.
    pub ops: Vec<Op>,
    /// The next op (`ops.len()`: done).
    pub pc: usize,
    /// Its calls under way, outermost first.
    pub frames: Vec<Frame>,
    /// A call of it failed (timed out).
    pub failed: bool,
    /// (Thread 1 only.) The clock moved while it waited for the turn, the state or the lock
    /// held by the section's thread (thread 0). Kept after it returned.
    pub waited: bool,
    /// It waits for the turn on the gate's condition variable (counted by [`GateState::park`]).
    pub parked: bool,
    /// A caller leaving the turn woke it (the condition variable's `notify_one`).
    pub woken: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ThreadsState {
    /// The clock, in ticks.
    pub now: u8,
    /// The threads.
    pub threads: Vec<Thread>,
    /// Who has the id's turn (a thread, its frame): a ghost beside the gate's own state.
    pub turn: Option<(usize, usize)>,
    /// The id's turn as the front's gate keeps it under its mutex: the library's own
    /// [`GateState`], whose rules each step that takes, waits for or leaves the turn runs.
    pub gate: GateState,
    /// Ghost: the gate let a call take the turn another call had.
    pub two_turns: bool,
    /// Who has the instance's state of the id.
    pub state: Option<(usize, usize)>,
    /// Who holds the transition lock.
    pub lock: Option<Holder>,
    /// Since when the rival holds the lock.
    pub rival_since: Option<u8>,
    /// Takes the rival has left.
    pub rival_left: u8,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadsAction {
    /// Thread `t` takes its next step.
    Step(usize),
    /// Thread `t`'s call gives up its wait at its deadline.
    TimeOut(usize),
    /// The rival takes the lock.
    RivalTakes,
    /// The rival gives the lock back.
    RivalGives,
    /// The clock moves one tick.
    Tick,
}

/// The property's name.
pub const WITHIN_BOUND: &str = "every call of a thread returns within its bound";
/// The turn has one holder.
pub const ONE_TURN: &str = "at most one call has the id's turn";
/// The gate says the turn is taken exactly while a call has it.
pub const TAKEN: &str = "the turn is taken exactly while a call has it";
/// Leaving the turn wakes a waiter.
pub const WOKEN: &str = "while the turn is free, every call waiting for it has been woken";
/// The gate counts its waiters.
pub const COUNTED: &str = "the turn counts as waiting exactly the calls parked on it";
/// Reachability: a call inside a fenced section returned.
pub const INSIDE_RETURNED: &str = "a call inside a fenced section returned";
/// Reachability: another thread's call that took time returned while a section ran.
pub const WAITED_FOR_SECTION: &str =
    "a call of another thread returned while a fenced section was under way";

impl ThreadsModel {
    /// A thread's program for `call`, as planted.
    fn thread_ops(&self, call: Call) -> Vec<Op> {
        let mut ops = Vec::new();
        program(call, &mut ops);
        if self.planted == Some(ThreadsPlanted::LookWaits) {
            ops = ops
                .into_iter()
                .flat_map(|op| match op {
                    Op::TryState => vec![Op::Take(Hold::State), Op::Give(Hold::State)],
                    op => vec![op],
                })
                .collect();
        }
        if self.planted == Some(ThreadsPlanted::WaitPastDeadline) {
            ops.retain(|op| *op != Op::Deadline);
        }
        if self.planted == Some(ThreadsPlanted::StateAcrossClosure)
            && let Some(give) = ops.iter().position(|o| *o == Op::Give(Hold::State))
            && let Call::Section(_) = call
        {
            // Moves the section's first give-back of the state to just before its lock's.
            let op = ops.remove(give);
            let lock = ops
                .iter()
                .rposition(|o| *o == Op::Give(Hold::Lock))
                .unwrap_or(ops.len());
            ops.insert(lock, op);
        }
        ops
    }

    /// Whether thread `t` can take its next step now (not waiting for something another has).
    fn can_step(s: &ThreadsState, t: usize) -> bool {
        let th = &s.threads[t];
        let Some(op) = th.ops.get(th.pc) else {
            return false;
        };
        match op {
            // A look at the turn under the gate's mutex: at once, or once woken (or at the
            // call's deadline) after it parked.
            Op::Take(Hold::Turn) => {
                !th.parked || th.woken || th.frames.last().is_some_and(|f| Self::past(s, f))
            }
            Op::Take(Hold::State) => s.state.is_none(),
            Op::Take(Hold::Lock) => s.lock.is_none(),
            Op::Wait => {
                let started = th.frames.last().map_or(0, |f| f.started);
                s.now >= started + WAIT_TIMEOUT
            }
            Op::Begin(_)
            | Op::Give(_)
            | Op::TryState
            | Op::Deadline
            | Op::Work
            | Op::Run
            | Op::End => true,
        }
    }

    /// Whether the call of frame `f` is at or past its deadline.
    fn past(s: &ThreadsState, f: &Frame) -> bool {
        s.now >= f.started + LOCK_TIMEOUT
    }

    /// Whether thread `t` waits for the lock past its call's deadline (the turn's wait ends at
    /// its deadline by a step of its own: [`ThreadsModel::enter`]).
    fn can_time_out(s: &ThreadsState, t: usize) -> bool {
        let th = &s.threads[t];
        let waiting =
            matches!(th.ops.get(th.pc), Some(Op::Take(Hold::Lock))) && !Self::can_step(s, t);
        waiting && th.frames.last().is_some_and(|f| Self::past(s, f))
    }

    /// One pass of `Gate::enter`'s loop under the gate's mutex, by thread `t`'s call (frame
    /// `depth`): the library's own look ([`GateState::look`]), by a caller that parked and
    /// woke (woken, or at its deadline) or one that has not waited yet.
    fn enter(s: &mut ThreadsState, t: usize, depth: usize) {
        let parked = std::mem::take(&mut s.threads[t].parked);
        s.threads[t].woken = false;
        let past = Self::past(s, &s.threads[t].frames[depth]);
        match s.gate.look(parked, || past) {
            TurnLook::Taken => {
                s.two_turns |= s.turn.is_some();
                s.turn = Some((t, depth));
                s.threads[t].frames[depth].holds.push(Hold::Turn);
                s.threads[t].pc += 1;
            }
            TurnLook::TimedOut => Self::time_out(s, t),
            TurnLook::Park => s.threads[t].parked = true,
        }
    }

    /// The turn is left (`Turn`'s drop): the gate's rule says whether to wake a waiting
    /// caller, and `notify_one` wakes one parked thread, if any.
    fn leave_turn(s: &mut ThreadsState) {
        s.turn = None;
        if s.gate.leave()
            && let Some(th) = s.threads.iter_mut().find(|th| th.parked && !th.woken)
        {
            th.woken = true;
        }
    }

    /// Whether a call of a thread has run past its bound.
    fn late(s: &ThreadsState) -> bool {
        s.threads
            .iter()
            .any(|th| th.frames.iter().any(|f| s.now > f.started + f.call.bound()))
    }

    /// Frame `depth` of thread `t` gives back `h`, if it holds it.
    fn give(s: &mut ThreadsState, t: usize, depth: usize, h: Hold) {
        let holds = &mut s.threads[t].frames[depth].holds;
        if holds.contains(&h) {
            holds.retain(|x| *x != h);
            match h {
                Hold::Turn => Self::leave_turn(s),
                Hold::State => s.state = None,
                Hold::Lock => s.lock = None,
            }
        }
    }

    /// Gives back what frame `depth` of thread `t` holds.
    fn give_back(s: &mut ThreadsState, t: usize, depth: usize) {
        for h in std::mem::take(&mut s.threads[t].frames[depth].holds) {
            match h {
                Hold::Turn => Self::leave_turn(s),
                Hold::State => s.state = None,
                Hold::Lock => s.lock = None,
            }
        }
    }

    fn step(s: &mut ThreadsState, t: usize) {
        let op = s.threads[t].ops[s.threads[t].pc];
        let depth = s.threads[t].frames.len().saturating_sub(1);
        match op {
            Op::Begin(call) => {
                s.threads[t].frames.push(Frame {
                    call,
                    started: s.now,
                    holds: Vec::new(),
                });
            }
            Op::Take(Hold::Turn) => return Self::enter(s, t, depth),
            Op::Take(Hold::State) => {
                s.state = Some((t, depth));
                s.threads[t].frames[depth].holds.push(Hold::State);
            }
            Op::Take(Hold::Lock) => {
                s.lock = Some(Holder::Thread(t, depth));
                s.threads[t].frames[depth].holds.push(Hold::Lock);
            }
            Op::Give(h) => Self::give(s, t, depth, h),
            Op::Run => Self::give(s, t, depth, Hold::Lock),
            Op::Deadline => {
                let started = s.threads[t].frames[depth].started;
                if s.now >= started + WAIT_TIMEOUT {
                    // Past it: on to the call's end (taken next).
                    s.threads[t].pc = Self::end_of_call(&s.threads[t]) - 1;
                }
            }
            Op::TryState | Op::Wait | Op::Work => {}
            Op::End => {
                Self::give_back(s, t, depth);
                s.threads[t].frames.pop();
            }
        }
        s.threads[t].pc += 1;
    }

    /// Where the `End` is of the call thread `th` is in (the innermost under way at its next op).
    fn end_of_call(th: &Thread) -> usize {
        let mut open = 0usize;
        let mut pc = th.pc;
        while pc < th.ops.len() {
            match th.ops[pc] {
                Op::Begin(_) => open += 1,
                Op::End if open == 0 => break,
                Op::End => open -= 1,
                _ => {}
            }
            pc += 1;
        }
        pc
    }

    /// Thread `t`'s call fails at its deadline: it gives back what it holds and returns its
    /// error; so does an `acquire_wait` around it (the error is its too), but not a section
    /// (the closure gets the error and goes on).
    fn time_out(s: &mut ThreadsState, t: usize) {
        loop {
            let depth = s.threads[t].frames.len() - 1;
            Self::give_back(s, t, depth);
            // Past this call's end.
            let th = &mut s.threads[t];
            th.pc = Self::end_of_call(th) + 1;
            th.frames.pop();
            th.failed = true;
            match th.frames.last() {
                Some(f) if f.call == Call::AcquireWait => continue,
                _ => break,
            }
        }
    }
}

impl Model for ThreadsModel {
    type State = ThreadsState;
    type Action = ThreadsAction;

    fn init_states(&self) -> Vec<ThreadsState> {
        let inner = [
            None,
            Some(Inner::LivenessFd),
            Some(Inner::Transition),
            Some(Inner::AcquireWait),
        ];
        let other = [
            Call::Transition,
            Call::LivenessFd,
            Call::AcquireWait,
            Call::Section(None),
        ];
        let thread = |ops| Thread {
            ops,
            pc: 0,
            frames: Vec::new(),
            failed: false,
            waited: false,
            parked: false,
            woken: false,
        };
        let mut states = Vec::new();
        for i in inner {
            for o in other {
                states.push(ThreadsState {
                    now: 0,
                    threads: vec![
                        thread(self.thread_ops(Call::Section(i))),
                        thread(self.thread_ops(o)),
                    ],
                    turn: None,
                    gate: GateState::default(),
                    two_turns: false,
                    state: None,
                    lock: None,
                    rival_since: None,
                    rival_left: self.rival_takes,
                });
            }
        }
        states
    }

    fn actions(&self, s: &ThreadsState, actions: &mut Vec<ThreadsAction>) {
        // Whether a thread that has begun its call can take a step: the clock waits for it. A
        // thread that has not begun may begin at any tick.
        let mut any = false;
        for t in 0..s.threads.len() {
            let begun = s.threads[t].pc > 0;
            if Self::can_step(s, t) {
                actions.push(ThreadsAction::Step(t));
                any |= begun;
            } else if Self::can_time_out(s, t) {
                actions.push(ThreadsAction::TimeOut(t));
                any |= begun;
            }
        }
        if s.lock.is_none() && s.rival_left > 0 {
            actions.push(ThreadsAction::RivalTakes);
        }
        if s.rival_since.is_some_and(|since| s.now > since) {
            actions.push(ThreadsAction::RivalGives);
        }
        if !any && s.now < self.max_time {
            actions.push(ThreadsAction::Tick);
        }
    }

    fn next_state(&self, last: &ThreadsState, action: ThreadsAction) -> Option<ThreadsState> {
        let mut s = last.clone();
        match action {
            ThreadsAction::Step(t) => Self::step(&mut s, t),
            ThreadsAction::TimeOut(t) => Self::time_out(&mut s, t),
            ThreadsAction::RivalTakes => {
                s.lock = Some(Holder::Rival);
                s.rival_since = Some(s.now);
                s.rival_left -= 1;
            }
            ThreadsAction::RivalGives => {
                s.lock = None;
                s.rival_since = None;
            }
            ThreadsAction::Tick => {
                // Thread 1 waits through this tick for what thread 0 holds.
                let other = &s.threads[1];
                let on_section = match other.ops.get(other.pc) {
                    Some(Op::Take(Hold::Turn)) => s.turn.is_some_and(|(t, _)| t == 0),
                    Some(Op::Take(Hold::State)) => s.state.is_some_and(|(t, _)| t == 0),
                    Some(Op::Take(Hold::Lock)) => matches!(s.lock, Some(Holder::Thread(0, _))),
                    _ => false,
                };
                s.threads[1].waited |= on_section;
                s.now += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(WITHIN_BOUND, |_, s: &ThreadsState| !ThreadsModel::late(s)),
            Property::always(ONE_TURN, |_, s: &ThreadsState| !s.two_turns),
            Property::always(TAKEN, |_, s: &ThreadsState| {
                s.gate.busy() == s.turn.is_some()
            }),
            Property::always(WOKEN, |_, s: &ThreadsState| {
                s.gate.busy() || !s.threads.iter().any(|th| th.parked && !th.woken)
            }),
            Property::always(COUNTED, |_, s: &ThreadsState| {
                s.gate.waiting() == s.threads.iter().filter(|th| th.parked).count()
            }),
            Property::sometimes(INSIDE_RETURNED, |_, s: &ThreadsState| {
                let th = &s.threads[0];
                th.frames.len() == 1
                    && matches!(th.frames[0].call, Call::Section(Some(_)))
                    && th.ops[..th.pc].contains(&Op::End)
            }),
            Property::sometimes(WAITED_FOR_SECTION, |_, s: &ThreadsState| {
                // The other call waited for what the section's thread held, and returned, the
                // section still under way.
                let (section, other) = (&s.threads[0], &s.threads[1]);
                other.pc == other.ops.len() && !section.frames.is_empty() && other.waited
            }),
        ]
    }
}

impl fmt::Display for ThreadsState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}", self.now)?;
        let who = |h: Option<(usize, usize)>| h.map_or("-".to_owned(), |(t, _)| format!("t{t}"));
        write!(f, " turn {} state {}", who(self.turn), who(self.state))?;
        match self.lock {
            None => write!(f, " lock -")?,
            Some(Holder::Rival) => write!(f, " lock rival")?,
            Some(Holder::Thread(t, _)) => write!(f, " lock t{t}")?,
        }
        for (t, th) in self.threads.iter().enumerate() {
            write!(f, " | t{t} ")?;
            let calls: Vec<String> = th
                .frames
                .iter()
                .map(|fr| format!("{:?}", fr.call))
                .collect();
            match th.ops.get(th.pc) {
                None if th.failed => write!(f, "returned (a call failed)")?,
                None => write!(f, "returned")?,
                Some(op) => write!(f, "in {} next {op:?}", calls.join(" > "))?,
            }
        }
        Ok(())
    }
}

impl SmallModel for ThreadsModel {
    type Planted = ThreadsPlanted;
    const CONFIG: &'static str = "threads";
    const TITLE: &'static str = "one instance's threads";
    const PLANTED: &'static [(&'static str, ThreadsPlanted)] = &[
        ("state-across-closure", ThreadsPlanted::StateAcrossClosure),
        ("look-waits", ThreadsPlanted::LookWaits),
        ("wait-past-deadline", ThreadsPlanted::WaitPastDeadline),
    ];
    const BREAKS: &'static str = "a call of a thread is still under way past its bound";

    fn planted_mut(&mut self) -> Option<&mut Option<ThreadsPlanted>> {
        Some(&mut self.planted)
    }

    fn header(&self) -> String {
        format!(
            "threads of one instance (PROTOCOL §9.2): a fenced section and another thread's call, \
             a rival process on the lock; lock timeout {LOCK_TIMEOUT} ticks, acquire_wait's \
             {WAIT_TIMEOUT}, clock to {}",
            self.max_time,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness;

    #[test]
    fn the_default_configuration_holds() {
        // Pinned: a change to the actors or the orders that moves it must say why.
        // 9 480 with the lock held to the transition's end; 9 552 since the run gives it back
        // at its last step, as the adapter's does (the threads' lockstep found it); 219 026
        // since a thread may begin at any tick (the clock used to wait for every thread to
        // begin, so every call started at tick 0: a review found it); 253 324 since
        // `acquire_wait` checks its deadline after its attempt, waits, and attempts again (it
        // ended after one attempt and the wait: the attempt that takes it past `timeout` was
        // not in the model); 271 299 since the other thread keeps whether it waited through a
        // tick for what the section's thread held, for the reachability of a call that waited
        // for a section (it held trivially once a thread could begin after a tick: a review
        // found it); 308 166 since the turn is the front's own `GateState` with its waiters
        // parked and woken (a caller waiting for the turn parks in a step of its own, and wakes
        // by a step of its own).
        harness::assert_holds(ThreadsModel::default(), 308_166);
    }

    #[test]
    fn a_planted_mistake_fails_the_check() {
        for planted in [
            ThreadsPlanted::StateAcrossClosure,
            ThreadsPlanted::LookWaits,
            ThreadsPlanted::WaitPastDeadline,
        ] {
            harness::assert_caught::<ThreadsModel>(planted, WITHIN_BOUND);
        }
    }
}
