//! The fenced section (PROTOCOL §9) and its property (PROTOCOL §10.11): a holder's write to the
//! protected resource, made so that no successor can be granted while it is made.
//!
//! A process that believes it holds a lease may run a fenced section with it, one model step
//! at a time, between any two steps of anyone else:
//!
//! | backend | steps (one system call or one server statement each) |
//! | --- | --- |
//! | flock | lock `<stem>.lock` exclusively (open, lock, check it is the file at the path: as a transition's) · read the record and the clock, and ask the machine · the caller's write, accepted by the resource · unlock |
//! | PostgreSQL | `SELECT … FOR SHARE` of the row with the server's clock, and ask the machine · the caller's statements, in the transaction · re-check the expiry on the server's clock · `COMMIT`, which accepts the write (or `ROLLBACK`) |
//!
//! The check is the adapters' own: [`machine::fence_holds`] on the record read, the lease, the
//! clock and whether the generation is held here (flock: the process keeps its liveness lock;
//! PostgreSQL: and its liveness connection answers, which it does not once the process has
//! seen it end). PostgreSQL's re-check asks it again with the same record at the clock's new
//! reading. A refused section skips the write and only unlocks (or rolls back).
//!
//! A takeover needs the lock the section holds (flock: the same exclusive lock; PostgreSQL:
//! `FOR UPDATE` of the row, which waits for `FOR SHARE`), so none can commit during the section.
//! The property is judged at the moment the resource accepts a write, against the model's
//! ground truth: the token of the last new generation committed ([`State::max_committed`])
//! must be the writer's token. Planted variants ([`Planted::UnfencedWrite`], the control;
//! [`Planted::FenceCheckBeforeLock`]; [`Planted::FenceUnlockBeforeWrite`]) only reorder or
//! drop these steps.

use flocklease::Record;
use flocklease::machine;

use crate::props::{self, names};
use crate::tx::{Ghost, ModelTx};
use crate::{Backend, LeaseModel, Planted, Scenario, State, at};

/// One step of a fenced section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceIo {
    /// The control ([`Planted::UnfencedWrite`]): the process's own check that its lease has
    /// not expired by the clock (as `KeepAlive::is_lost()`): no lock, no read.
    LocalCheck,
    /// Take the lock: flock, `<stem>.lock` exclusively; PostgreSQL, the row `FOR SHARE`.
    Lock,
    /// Read the record and the clock, and ask the machine.
    Read,
    /// PostgreSQL: the row `FOR SHARE` and the server's clock in one statement, and the
    /// machine's check.
    LockRead,
    /// The caller's write to the protected resource.
    Write,
    /// PostgreSQL: the re-check, on the server's clock, that the lease is unexpired.
    Recheck,
    /// Unlock: flock, `<stem>.lock`; PostgreSQL, `COMMIT` (a write made in the transaction
    /// is accepted now) or `ROLLBACK` after a refusal.
    Unlock,
}

/// A fenced section under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The token of the lease it runs with.
    pub token: u64,
    /// How many steps of its [`schedule`] are behind it.
    pub done: u8,
    /// The step it takes next (the schedule's at `done`, kept for display).
    pub next: FenceIo,
    /// Whether the check admitted the write (until the check: `true`).
    pub admitted: bool,
    /// PostgreSQL: the write was made in the transaction and awaits its `COMMIT`.
    pub pending: bool,
    /// The expiry (in ticks) of the record the check read and admitted (for PostgreSQL's
    /// re-check; the lock keeps the record as it was, so this never tells states apart).
    pub expiry: u8,
}

/// The steps of a fenced section on `backend`, with the bug `planted` if it is one of the
/// fenced section's.
pub fn schedule(backend: Backend, planted: Option<Planted>) -> &'static [FenceIo] {
    use FenceIo::*;
    match (backend, planted) {
        (_, Some(Planted::UnfencedWrite)) => &[LocalCheck, Write],
        (Backend::Flock, Some(Planted::FenceCheckBeforeLock)) => &[Read, Lock, Write, Unlock],
        (Backend::Flock, Some(Planted::FenceUnlockBeforeWrite)) => &[Lock, Read, Unlock, Write],
        (Backend::Flock, _) => &[Lock, Read, Write, Unlock],
        // A plain SELECT checked, then the row locked and not checked again.
        (Backend::Postgres, Some(Planted::FenceCheckBeforeLock)) => {
            &[Read, Lock, Write, Recheck, Unlock]
        }
        // The caller's statements on another connection, after the fenced transaction.
        (Backend::Postgres, Some(Planted::FenceUnlockBeforeWrite)) => {
            &[LockRead, Recheck, Unlock, Write]
        }
        (Backend::Postgres, _) => &[LockRead, Write, Recheck, Unlock],
    }
}

impl State {
    /// Whether process `p` may take the transition lock (an exclusive lock): nobody else
    /// holds it, nor (PostgreSQL) the row `FOR SHARE`.
    pub fn lock_free_for(&self, p: usize) -> bool {
        self.lock_holder().is_none_or(|q| q == p)
            && self
                .procs
                .iter()
                .enumerate()
                .all(|(q, proc)| q == p || !proc.share)
    }
}

impl LeaseModel {
    /// The fenced-section actions of process `p`: start one with its lease, or take the next
    /// step of the one under way (a lock step only when the lock can be had).
    pub(crate) fn fence_actions(
        &self,
        s: &State,
        p: usize,
        beyond: bool,
        actions: &mut Vec<crate::Action>,
    ) {
        if !self.fenced {
            return;
        }
        let proc = &s.procs[p];
        let sched = schedule(self.backend, self.planted);
        match proc.fence {
            Some(f) => {
                let io = sched[usize::from(f.done)];
                if self.can_fence_step(s, p, io) {
                    actions.push(crate::Action::FenceStep(p, io));
                }
            }
            None => {
                if !beyond
                    && proc.call.is_none()
                    && proc.lease.is_some()
                    && self.can_fence_step(s, p, sched[0])
                {
                    actions.push(crate::Action::Fence(p));
                }
            }
        }
    }

    fn can_fence_step(&self, s: &State, p: usize, io: FenceIo) -> bool {
        match (io, self.backend) {
            (FenceIo::Lock | FenceIo::LockRead, Backend::Flock) => s.lock_free_for(p),
            // `FOR SHARE` waits only for a `FOR UPDATE`.
            (FenceIo::Lock | FenceIo::LockRead, Backend::Postgres) => {
                s.lock_holder().is_none_or(|q| q == p)
            }
            _ => true,
        }
    }

    /// Process `p` starts a fenced section with its lease and takes its first step.
    pub(crate) fn fence_start(&self, last: &State, p: usize) -> Option<State> {
        let token = last.procs[p].lease?.token;
        let mut s = last.clone();
        s.procs[p].fence = Some(Fence {
            token,
            done: 0,
            next: schedule(self.backend, self.planted)[0],
            admitted: true,
            pending: false,
            expiry: 0,
        });
        self.fence_step(&s, p)
    }

    /// Process `p` takes the next step of its fenced section.
    pub(crate) fn fence_step(&self, last: &State, p: usize) -> Option<State> {
        let mut s = last.clone();
        s.scenario = None;
        let mut f = s.procs[p].fence?;
        let sched = schedule(self.backend, self.planted);
        let io = sched[usize::from(f.done)];
        f.done += 1;
        match io {
            FenceIo::LocalCheck => {
                f.admitted = s.procs[p].lease.is_some_and(|l| {
                    l.token == f.token && !machine::is_expired(at(l.expiry), at(s.now))
                });
            }
            FenceIo::Lock => {
                if !self.fence_lock(&mut s, p)? {
                    f.admitted = false;
                }
            }
            FenceIo::Read => self.fence_check(&mut s, p, &mut f),
            FenceIo::LockRead => {
                if self.fence_lock(&mut s, p)? {
                    self.fence_check(&mut s, p, &mut f);
                } else {
                    f.admitted = false;
                }
            }
            FenceIo::Write => {
                if self.backend == Backend::Postgres && s.procs[p].share {
                    f.pending = true;
                } else {
                    accept(&mut s, f.token);
                }
            }
            FenceIo::Recheck => {
                // The adapter's: the same check on the record read at the start, held here as
                // it was then (it admitted), at the clock's new reading.
                let read = Record {
                    owner: self.owner(p).as_str().to_owned(),
                    token: f.token,
                    expiry: at(f.expiry),
                };
                let still =
                    machine::fence_holds(Some(&read), &self.owner(p), f.token, true, at(s.now));
                if !still {
                    f.admitted = false;
                    f.pending = false;
                    s.scenario = Some(Scenario::FenceRecheckRefused);
                }
            }
            FenceIo::Unlock => {
                if s.procs[p].share {
                    // COMMIT: the write made in the transaction is accepted now.
                    s.procs[p].share = false;
                    if f.pending && f.admitted {
                        accept(&mut s, f.token);
                    }
                    f.pending = false;
                } else {
                    s.procs[p].stable = None;
                }
            }
        }
        // A refused section skips what is left but its unlock.
        let holds = |s: &State| s.procs[p].share || s.procs[p].stable.is_some();
        while let Some(&next) = sched.get(usize::from(f.done)) {
            let skip = match next {
                FenceIo::Unlock => !holds(&s),
                _ => !f.admitted,
            };
            if !skip {
                break;
            }
            f.done += 1;
        }
        s.procs[p].fence = sched
            .get(usize::from(f.done))
            .map(|&next| Fence { next, ..f });
        Some(s)
    }

    /// Takes the section's lock: whether it was taken (a planted file at `<stem>.lock` makes
    /// the section fail); `None` when it would wait.
    fn fence_lock(&self, s: &mut State, p: usize) -> Option<bool> {
        if self.backend == Backend::Postgres {
            s.procs[p].share = true;
            return Some(true);
        }
        // The very step a transition takes: open, lock, check the file is the one at the path.
        let mut tx = ModelTx {
            state: s,
            p,
            fault: false,
            refuse: false,
            fired: false,
            durable: self.durable,
            backend: self.backend,
            untagged: self.untagged,
            standbys: self.standbys,
            caught_up: false,
            planted: self.planted,
            speculate: false,
            ghost: Ghost::default(),
        };
        use flocklease::driver::Transaction;
        match tx.lock() {
            Ok(true) => Some(true),
            Ok(false) => None,
            Err(_) => Some(false),
        }
    }

    /// Reads the record and the clock and asks the machine ([`machine::fence_holds`]).
    fn fence_check(&self, s: &mut State, p: usize, f: &mut Fence) {
        // A planted file at the record's name: the read fails, nothing is written.
        let record = s.record.as_ref().filter(|_| s.record_bad.is_none());
        let owner = self.owner(p);
        let proc = &s.procs[p];
        let local = proc
            .local
            .as_ref()
            .is_some_and(|l| l.token == f.token && l.owner == owner);
        // PostgreSQL: the adapter counts the generation held only while its liveness
        // connection answers, which it does not once the process has seen it end.
        let answers = self.backend == Backend::Flock || !proc.loss.is_some_and(|l| l.noticed);
        let ok = machine::fence_holds(record, &owner, f.token, local && answers, at(s.now));
        f.admitted = ok;
        if ok {
            f.expiry = record.map_or(0, |r| crate::ticks(r.expiry));
        }
        if !ok && record.is_some_and(|r| r.token > f.token) {
            s.scenario = Some(Scenario::FenceRefusedAfterSuccessor);
        }
    }
}

/// The resource accepts a write with `token`: judged against the last new generation
/// committed (the model's ground truth, not the machine's).
fn accept(s: &mut State, token: u64) {
    if token != s.max_committed {
        s.violations |= props::bit(names::FENCED);
    }
    let w = &mut s.written.0;
    w.highest = w.highest.max(token);
    w.last = Some((token, s.max_committed));
    s.scenario = Some(Scenario::FencedWrite);
}
