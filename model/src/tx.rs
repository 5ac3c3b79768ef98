//! [`ModelTx`]: the model's interpretation of the driver's steps, over [`State`].
//!
//! It gives each step the meaning `FlockLease` gives it on files, primitive by primitive, and
//! nothing more: when a step runs, what a failure drops and when the record counts as
//! committed are the driver's ([`flocklease::driver::Run`]) rules, not this file's.
//!
//! | step ([`flocklease::driver::Io`]) | contract (what another actor can observe) |
//! | --- | --- |
//! | `Lock` | open (creating) `<stem>.lock`, lock it, check it is still the file at the path, retrying until it is: one step, since an actor acting between those calls only makes the adapter retry |
//! | `Begin` | the committed record or an error (a planted file is corrupt or not a file); PostgreSQL: the row lock and the read, one statement |
//! | `Probe` | the generation's own file (the tag the record names) locked: live; unlocked: dead; anything else: unknown |
//! | `Commit(LockLive)`, `Commit(EnsureLive)` | **publish**: the generation's file appears already locked under its name, or nothing changes there (its temporary name is unique: no actor can reach it by name) |
//! | `Commit(EnsureLive)` (PostgreSQL) | nothing while the holder counts its liveness connection live; once it has seen it end, **re-lock**: one statement, `pg_try_advisory_lock` on a fresh connection, which fails if any session holds the lock (the old one, not yet ended on the server) |
//! | `Commit(WriteTemp)`, `Commit(SyncTemp)` | this transition's own temporary record |
//! | `Commit(Point)` | **commit**: only if the lock held is still the file at `<stem>.lock` (the check and the rename are one step: see the README for the one-system-call window); PostgreSQL: one statement, the new generation's advisory lock, the `UPDATE` and the `COMMIT`, which releases the row lock |
//! | `Commit(SyncDir)` | the visible record becomes the durable one |
//! | `Cleanup` | closes, unlinks; the takeover's directory listing runs at the next transition's unlock (PostgreSQL: closing a generation only) |
//!
//! Besides, it notes (in [`Ghost`]) what the properties need to know about the call.

use std::io;

use flocklease::commit::{self, Reread, Verdict};
use flocklease::driver::{Begun, CommitStep, Grain, Transaction};
use flocklease::machine::{self, AtName, Cleanup, Liveness, Local, Plan};
use flocklease::{Error, Record};

use crate::props::{self, names};
use crate::{Backend, LiveFile, LockAt, Locker, Planted, State, Temp, What, at, session};

/// PostgreSQL: process `p` locks generation `token` again on a fresh liveness connection
/// (the adapter's one `pg_try_advisory_lock` statement): granted only if no session holds the
/// lock. Judges, against the model's own state, that this happens only while `p` holds the
/// row lock and the row names the generation. Returns whether the lock was taken.
pub(crate) fn relock(s: &mut State, p: usize, token: u64) -> bool {
    let named = s.record.as_ref().is_some_and(|r| {
        r.token == token
            && s.procs[p]
                .local
                .as_ref()
                .is_some_and(|l| l.token == token && r.owner == l.owner.as_str())
    });
    if s.lock_holder() != Some(p) || !named {
        s.violations |= props::bit(names::RELOCK_GUARDED);
    }
    if s.live
        .get(&token)
        .is_some_and(|f| f.holder.is_some() || f.shared)
    {
        return false;
    }
    s.live.insert(
        token,
        LiveFile {
            what: What::Own(p),
            holder: Some(Locker::Proc(p)),
            shared: false,
            restored: false,
            old: false,
        },
    );
    s.procs[p].loss = None;
    true
}

/// What a call saw and did, for the properties (never read by the code under test).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The record, the time and the local generation the call read under the lock.
    pub seen: Option<Seen>,
    /// The probe found the recorded generation dead (its own file, unlocked).
    pub probed_dead: bool,
    /// The probe found something that is not the generation's own file at its name.
    pub probed_planted: bool,
    /// The call renamed a record into place.
    pub renamed: bool,
    /// The record it renamed into place (what the record was right after its commit; with a
    /// replaced transition lock, another transition may commit after it before it ends).
    pub committed: Option<Record>,
    /// The call unlocked or deleted a liveness lock held by another process.
    pub touched_other: bool,
    /// PostgreSQL: at its preparation step the process had seen its liveness connection end.
    pub knew_lost: bool,
    /// PostgreSQL: after that, during the call, the connection holding the generation ended
    /// again (a re-lock's fresh one).
    pub lost_again: bool,
    /// PostgreSQL: the call locked its generation again on a fresh connection.
    pub relocked: bool,
    /// PostgreSQL: the re-lock found the generation locked by another session.
    pub relock_busy: bool,
    /// The record is no longer the file this call read (another commit, or a cleaner's
    /// replacement, since): the adapter's commit refuses (`check_record`).
    pub record_changed: bool,
    /// PostgreSQL: a failover broke the call's connections while it ran.
    pub severed: bool,
    /// PostgreSQL: an acquire's speculative probe, made by its first statement under the row
    /// lock (the generation the row names, and what stood at its lock then); a probe of that
    /// generation is answered from it, with no statement of its own. (The adapter's memory,
    /// not a ghost's: kept here as the call's state besides the driver's run.)
    pub speculated: Option<(u64, Option<LiveFile>)>,
}

/// What a call read under the transition lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seen {
    /// The record.
    pub record: Option<Record>,
    /// The time, in ticks.
    pub now: u8,
    /// The generation the process held.
    pub local: Option<Local>,
    /// Who held the recorded generation's liveness lock.
    pub holder: Option<usize>,
    /// The liveness tag the record named (the process that published the generation).
    pub tag: Option<usize>,
}

/// The driver's transaction over the model's state, for process `p`.
pub struct ModelTx<'a> {
    pub(crate) state: &'a mut State,
    pub(crate) p: usize,
    /// Fail the next fallible step (a fault the model injects).
    pub(crate) fault: bool,
    /// PostgreSQL: the injected fault is the commit statement refused (nothing committed), not
    /// its reply lost.
    pub(crate) refuse: bool,
    /// Set when the injected fault was returned.
    pub(crate) fired: bool,
    /// Whether fsyncs happen (`Durability::Full`).
    pub(crate) durable: bool,
    pub(crate) backend: Backend,
    /// Records name no liveness tag ([`crate::LeaseModel::untagged`]).
    pub(crate) untagged: bool,
    /// PostgreSQL: the synchronous standbys a commit needs ([`crate::LeaseModel::standbys`]).
    pub(crate) standbys: u8,
    /// PostgreSQL: the fault is a lost reply after which the first standby confirmed the
    /// commit before the re-read.
    pub(crate) caught_up: bool,
    /// A bug planted on purpose, to show the checker catches it.
    pub(crate) planted: Option<Planted>,
    /// PostgreSQL: the call is an acquire, whose first statement probes speculatively.
    pub(crate) speculate: bool,
    pub(crate) ghost: Ghost,
}

impl ModelTx<'_> {
    /// Fails with the injected error if a fault is armed.
    fn fault(&mut self, op: &'static str) -> Result<(), Error> {
        if self.fault && !self.fired {
            self.fired = true;
            return Err(Error::Io {
                op,
                path: "model.lease.json".into(),
                source: io::Error::other("injected"),
            });
        }
        Ok(())
    }

    /// PostgreSQL: the `COMMIT`'s reply was lost (the injected fault: the reply bound ran
    /// out, or the session ended while the commit waited for the synchronous standby). The
    /// commit is visible on the primary and the standby has not confirmed it. The adapter's
    /// recovery: it ends its session (which stops the wait and keeps the commit on the
    /// primary alone), re-reads the row, and judges by [`commit::verdict`], as `PgTx` does.
    fn reply_lost(&mut self) -> Result<(), Error> {
        let mine = self.ghost.committed.clone();
        if self.standbys == 0 || self.caught_up {
            // No standby: the primary's own commit is all there is (fsynced at COMMIT). Or
            // the first standby caught up before the re-read.
            self.state.durable = self.state.record.clone();
            self.state.durable_tag = self.state.record_tag;
        }
        let read = if mine.is_some() && self.state.record == mine {
            let first = u32::from(self.standbys > 0 && self.state.durable == mine);
            let second = u32::from(self.standbys > 1 && self.state.durable2.0 == mine);
            Reread::Ours {
                required: Some(u32::from(self.standbys)),
                confirmed: first + second,
            }
        } else {
            Reread::NotOurs
        };
        let verdict = match (self.planted, read) {
            (Some(Planted::RereadAfterTerminate), Reread::Ours { .. }) => Verdict::Committed,
            (
                Some(Planted::OneStandbyEnough),
                Reread::Ours {
                    required,
                    confirmed,
                },
            ) => commit::verdict(Reread::Ours {
                required: required.map(|r| r.min(1)),
                confirmed,
            }),
            _ => commit::verdict(read),
        };
        if verdict == Verdict::Committed {
            return Ok(());
        }
        Err(Error::Io {
            op: "commit",
            path: "model.lease.json".into(),
            source: io::Error::other("the reply was lost and the commit is not confirmed"),
        })
    }

    /// Closes this process's descriptors of generation `token`'s liveness files, wherever
    /// they stand now (at the name, or moved aside).
    fn unlock(&mut self, token: u64) {
        let aside = self
            .state
            .aside_live
            .as_mut()
            .filter(|(t, _)| *t == token)
            .map(|(_, f)| f);
        for f in self.state.live.get_mut(&token).into_iter().chain(aside) {
            if f.holder == Some(Locker::Proc(self.p)) {
                f.holder = None;
            }
        }
    }

    /// Unlinks the file at generation `token`'s name (a directory stays: `unlink` fails).
    fn remove_file(&mut self, token: u64) {
        if self
            .state
            .live
            .get(&token)
            .is_some_and(|f| f.what == What::Dir)
        {
            return;
        }
        if let Some(f) = self.state.live.remove(&token)
            && let Some(Locker::Proc(q)) = f.holder
            && q != self.p
            && self.keeps(q, token)
        {
            self.ghost.touched_other = true;
        }
    }

    /// Publishes generation `token`'s file, locked by this process: replaces whatever stands at
    /// the name in one rename (a directory makes the rename fail).
    fn publish(&mut self, token: u64) -> Result<(), Error> {
        if self
            .state
            .live
            .get(&token)
            .is_some_and(|f| f.what == What::Dir)
        {
            return Err(Error::NotAFile {
                path: format!("model.{token}.live").into(),
            });
        }
        self.state.live.insert(
            token,
            LiveFile {
                what: What::Own(self.p),
                holder: Some(Locker::Proc(self.p)),
                shared: false,
                restored: false,
                old: false,
            },
        );
        Ok(())
    }

    /// Whether process `q` keeps generation `token`: its local generation, or a new one its
    /// transition locked and may still commit (its transition lock is still the lock). A
    /// transition on a replaced lock cannot commit: a listing that removes its new file
    /// harms nobody.
    fn keeps(&self, q: usize, token: u64) -> bool {
        let proc = &self.state.procs[q];
        let pending = proc
            .call
            .as_ref()
            .and_then(|c| c.run.pending())
            .is_some_and(|l| l.token == token);
        // Its commit checks both: its lock is the one at the path, and the record is the one
        // it read (a lock moved aside and put back passes the first only).
        let may_commit = proc
            .stable
            .is_some_and(|i| self.state.lock_at == LockAt::File(i))
            && proc.call.as_ref().is_some_and(|c| !c.ghost.record_changed);
        proc.local.as_ref().is_some_and(|l| l.token == token) || (pending && may_commit)
    }

    /// Whether generation `token` is kept by a running process: its local generation, or a
    /// new one it locked and has not adopted yet.
    fn alive(&self, token: u64) -> bool {
        self.state.procs.iter().enumerate().any(|(q, proc)| {
            q != self.p
                && (proc.local.as_ref().is_some_and(|l| l.token == token)
                    || proc
                        .call
                        .as_ref()
                        .and_then(|c| c.run.pending())
                        .is_some_and(|l| l.token == token))
        })
    }

    /// The directory listing a takeover left to this process's next transition: liveness files
    /// below the bound the machine gives for the record this transition read, and leftover
    /// temporary records.
    fn run_carried_sweep(&mut self) {
        let Some(below) = self.state.procs[self.p].carried.take() else {
            return;
        };
        let Some(seen) = self.ghost.seen.as_ref() else {
            // The transition did not read the record: the listing waits for the next one.
            self.state.procs[self.p].keep_sweep(below);
            return;
        };
        let token = seen.record.as_ref().map(|r| r.token);
        if let Some(below) = machine::deferred_sweep_below(below, token) {
            let doomed: Vec<u64> = self.state.live.range(..below).map(|(t, _)| *t).collect();
            for t in doomed {
                self.remove_file(t);
            }
            for temp in &mut self.state.temps {
                *temp = None;
            }
        }
    }
}

impl ModelTx<'_> {
    /// PostgreSQL's `ensure_live`, as the adapter's: nothing for a generation not held here or
    /// whose connection it still counts live; otherwise the re-lock, one statement. The
    /// machine planned it under the row lock, for the generation the row names.
    fn relock_if_lost(&mut self, token: u64) -> Result<(), Error> {
        let proc = &self.state.procs[self.p];
        let held = proc.local.as_ref().is_some_and(|l| l.token == token);
        let noticed = proc.loss.is_some_and(|l| l.noticed && l.token == token);
        if !held || !noticed {
            return Ok(());
        }
        self.ghost.knew_lost = true;
        if self.planted == Some(Planted::RenewWithoutRelock) {
            return Ok(());
        }
        self.fault("lock")?;
        if !relock(self.state, self.p, token) {
            // The old session still holds it: not yet ended on the server. (The real
            // backend's error is `AdvisoryLockBusy`, a variant of its feature; the model,
            // built without it, answers with the flock backend's equivalent: the generation's
            // liveness lock is held by someone else.)
            self.ghost.relock_busy = true;
            return Err(Error::LiveLockBusy {
                path: format!("{}.{token}.live", session().stem()).into(),
            });
        }
        self.ghost.relocked = true;
        Ok(())
    }
}

impl Transaction for ModelTx<'_> {
    type Pending = u64;

    fn grain(&self) -> Grain {
        match self.backend {
            Backend::Flock => Grain::SystemCall,
            Backend::Postgres => Grain::Statement,
        }
    }

    fn lock(&mut self) -> Result<bool, Error> {
        let inode = match self.state.lock_at {
            LockAt::NotAFile => {
                return Err(Error::NotAFile {
                    path: "model.lock".into(),
                });
            }
            LockAt::Missing => {
                let i = self.state.next_lock;
                self.state.next_lock += 1;
                self.state.lock_at = LockAt::File(i);
                i
            }
            LockAt::File(i) => i,
        };
        let busy = self
            .state
            .procs
            .iter()
            .enumerate()
            .any(|(q, proc)| q != self.p && (proc.stable == Some(inode) || proc.share));
        if busy {
            return Ok(false);
        }
        self.state.procs[self.p].stable = Some(inode);
        Ok(true)
    }

    fn unlock(&mut self) {
        self.run_carried_sweep();
        self.state.procs[self.p].stable = None;
    }

    fn begin(&mut self) -> Result<Begun, Error> {
        let record = self.read()?;
        let local = self.state.procs[self.p].local.as_ref().map(|l| l.token);
        if self.speculate
            && self.planted != Some(Planted::LateProbe)
            && let Some(token) = record.as_ref().map(|r| r.token)
            && Some(token) != local
        {
            self.ghost.speculated = Some((token, self.state.live.get(&token).copied()));
        }
        Ok(Begun {
            now: at(self.state.now),
            record,
            // PostgreSQL too: a generation whose liveness connection ended stays held here
            // until a renew locks it again or a transition closes it.
            local: self.state.procs[self.p].local.clone(),
        })
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        let file = match self.ghost.speculated {
            // Answered by the first statement's speculative probe (PostgreSQL).
            Some((t, file)) if t == token => file,
            _ => {
                self.fault("lock")?;
                self.state.live.get(&token).copied()
            }
        };
        let tag = self.ghost.seen.as_ref().and_then(|x| x.tag);
        let liveness = match file {
            // PostgreSQL: no session holds the lock, so the try-lock is granted.
            None if self.backend == Backend::Postgres => Liveness::Dead,
            None => Liveness::Unknown,
            // The generation's own file, as the machine judges it: with a tag, the one
            // carrying the tag the record names (a restored file carries a fresh tag until its
            // renew commits); without, any regular file.
            Some(f) if own(tag, &f, self.planted == Some(Planted::RestoreKeepsTag)) => {
                if f.holder.is_some() {
                    Liveness::Live
                } else {
                    Liveness::Dead
                }
            }
            Some(_) => {
                self.ghost.probed_planted = true;
                Liveness::Unknown
            }
        };
        // PROTOCOL §10.9: the answer is the truth about the generation's holder.
        let lied = match liveness {
            Liveness::Dead => self.alive(token),
            Liveness::Live => match file.and_then(|f| f.holder) {
                // A session the server has not ended yet holds it: live, as far as the server
                // can tell (PostgreSQL only; not judged there).
                Some(Locker::Go | Locker::Ended(_)) => false,
                Some(Locker::Proc(q)) => {
                    let proc = &self.state.procs[q];
                    let keeps = proc.local.as_ref().is_some_and(|l| l.token == token)
                        || proc
                            .call
                            .as_ref()
                            .and_then(|c| c.run.pending())
                            .is_some_and(|l| l.token == token);
                    !keeps
                }
                None => true,
            },
            Liveness::Unknown => false,
        };
        if lied && self.backend == Backend::Flock {
            self.state.violations |= props::bit(names::PROBE_TRUTH);
        }
        self.ghost.probed_dead = liveness == Liveness::Dead;
        Ok(liveness)
    }

    fn commit_step(&mut self, step: CommitStep, plan: &Plan) -> Result<Option<u64>, Error> {
        let token = plan.prepared_token();
        match (step, &plan.commit) {
            (CommitStep::LockLive, _) => {
                return self
                    .lock_live(token.expect("a planned generation"))
                    .map(Some);
            }
            (CommitStep::EnsureLive, _) => {
                self.ensure_live(token.expect("a planned generation"))?
            }
            (CommitStep::WriteTemp, Some(record)) => self.write_temp(record)?,
            (CommitStep::SyncTemp, _) => self.sync_temp()?,
            (CommitStep::Point, Some(record)) if self.backend == Backend::Postgres => {
                // One statement: the new generation's advisory lock (if planned), the UPDATE
                // and the COMMIT. An injected fault is the `COMMIT`'s reply lost, after the
                // commit; a refusal, an error answered before anything was committed.
                if self.refuse {
                    self.fault("commit")?;
                }
                let reply_lost = self.fault && !self.fired;
                self.fired |= reply_lost;
                let live = plan.new_generation().map(|g| g.token);
                let pending = live.map(|t| self.lock_live(t)).transpose()?;
                let committed = self
                    .write_temp(record)
                    .and_then(|()| self.rename(reply_lost));
                if let Err(e) = committed {
                    // The statement failed after its lock was granted: the adapter ends the
                    // session (it never pools it), and the lock goes with it.
                    if let Some(t) = pending {
                        self.unlock(t);
                    }
                    return Err(e);
                }
                return Ok(pending);
            }
            (CommitStep::Point, _) => self.rename(false)?,
            (CommitStep::SyncDir, _) => self.sync_dir()?,
            _ => unreachable!("a commit step its plan does not list"),
        }
        Ok(None)
    }

    fn undo(&mut self, pending: Option<u64>) {
        if let Some(token) = pending {
            self.unlock(token);
        }
        self.state.temps[self.p] = None;
    }

    fn cleanup(&mut self, step: &Cleanup) {
        if self.planted == Some(Planted::UnlockBeforeCleanup) {
            self.state.procs[self.p].stable = None;
        }
        match *step {
            Cleanup::CloseLocal { token } => self.close_local(token),
            Cleanup::DeleteLive { token } => self.delete_live(token),
            Cleanup::Sweep { below } => self.sweep(below),
        }
    }

    fn adopt(&mut self, token: u64, local: Local) {
        debug_assert_eq!(token, local.token);
        self.state.procs[self.p].local = Some(local);
    }
}

/// The steps' meanings, one model step each (or part of one, at statement grain).
impl ModelTx<'_> {
    fn read(&mut self) -> Result<Option<Record>, Error> {
        self.fault("read")?;
        if self.state.record_bad.is_some() {
            return Err(Error::NotAFile {
                path: "model.lease.json".into(),
            });
        }
        let record = self.state.record.clone();
        let holder = record.as_ref().and_then(|r| {
            match self.state.live.get(&r.token).and_then(|f| f.holder) {
                Some(Locker::Proc(q)) => Some(q),
                _ => None,
            }
        });
        self.ghost.seen = Some(Seen {
            record: record.clone(),
            now: self.state.now,
            local: self.state.procs[self.p].local.clone(),
            holder,
            tag: self.state.record_tag,
        });
        Ok(record)
    }

    fn lock_live(&mut self, token: u64) -> Result<u64, Error> {
        self.fault("lock")?;
        // A live holder at the name of the generation about to be granted: refused.
        if self
            .state
            .live
            .get(&token)
            .is_some_and(|f| matches!(f.what, What::Own(_) | What::Plain) && f.holder.is_some())
        {
            return Err(Error::LiveLockBusy {
                path: format!("model.{token}.live").into(),
            });
        }
        self.publish(token)?;
        Ok(token)
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        if self.backend == Backend::Postgres {
            return self.relock_if_lost(token);
        }
        if self.planted == Some(Planted::CreateThenLock) {
            // The old restore: create the file at its final name, then lock it. A failure of
            // the lock (a fault, or a prober's shared lock on the fresh file) leaves it there,
            // unlocked.
            let ours = self.state.live.get(&token).is_some_and(|f| {
                f.what == What::Own(self.p) && f.holder == Some(Locker::Proc(self.p))
            });
            if !ours {
                self.state.live.insert(
                    token,
                    LiveFile {
                        what: What::Own(self.p),
                        holder: None,
                        shared: false,
                        restored: false,
                        old: false,
                    },
                );
                self.fault("lock")?;
                if let Some(f) = self.state.live.get_mut(&token) {
                    f.holder = Some(Locker::Proc(self.p));
                }
            }
            return Ok(());
        }
        self.fault("stat")?;
        let ours = self.state.live.get(&token).is_some_and(|f| {
            f.what == What::Own(self.p) && f.holder == Some(Locker::Proc(self.p)) && !f.old
        });
        if ours {
            return Ok(());
        }
        // Published with a fresh tag, which the renew's record names once committed.
        self.publish(token)?;
        if let Some(f) = self.state.live.get_mut(&token) {
            f.restored = true;
        }
        Ok(())
    }

    fn write_temp(&mut self, record: &Record) -> Result<(), Error> {
        self.fault("write")?;
        // The tag of the generation the record names: this process's (a new generation it
        // published, or its local one); none for a tombstone.
        let tag = (!record.is_tombstone() && !self.untagged).then_some(self.p);
        self.state.temps[self.p] = Some(Temp {
            record: record.clone(),
            tag,
            synced: false,
        });
        Ok(())
    }

    fn sync_temp(&mut self) -> Result<(), Error> {
        if !self.durable {
            return Ok(());
        }
        self.fault("fsync")?;
        if let Some(t) = self.state.temps[self.p].as_mut() {
            t.synced = true;
        }
        Ok(())
    }

    /// The commit point's rename (PostgreSQL: the UPDATE and the COMMIT; `reply_lost`: the
    /// injected fault, the `COMMIT`'s reply lost after the commit).
    fn rename(&mut self, reply_lost: bool) -> Result<(), Error> {
        self.fault("rename")?;
        // The commit check, the adapter's own (`machine::commit_check`): the commit only
        // under the lock everyone else takes, and (flock) over the record this call read.
        // The model tells records apart by whether one was committed since this call read.
        let held = self.state.procs[self.p].stable;
        let lock_at = match self.state.lock_at {
            LockAt::File(l) => Some(l),
            _ => None,
        };
        let (read, record_at) = match self.backend {
            Backend::Flock => (Some(Some(&false)), Some(&self.ghost.record_changed)),
            Backend::Postgres => (None, None),
        };
        let checked = held.map(|h| machine::commit_check(&h, lock_at.as_ref(), read, record_at));
        if checked.is_none_or(|c| c.is_err()) {
            return Err(Error::LockReplaced {
                path: "model.lock".into(),
            });
        }
        if self.state.record_bad == Some(crate::Plant::Dir) {
            return Err(Error::NotAFile {
                path: "model.lease.json".into(),
            });
        }
        // A cleaner deleted this transition's temporary file: ENOENT.
        let Some(temp) = self.state.temps[self.p].take() else {
            return Err(Error::Io {
                op: "rename",
                path: "model.lease.json".into(),
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        };
        // PROTOCOL §10.2, judged at the commit: a new generation's token exceeds every one
        // committed before (reports may come later, and out of order, from a transition on a
        // replaced lock).
        let read = self.ghost.seen.as_ref().and_then(|x| x.record.as_ref());
        let new_generation = read.is_none_or(|r| r.token != temp.record.token);
        if new_generation {
            if temp.record.token <= self.state.max_committed {
                self.state.violations |= props::bit(names::INCREASE);
            }
            self.state.max_committed = temp.record.token;
        }
        self.ghost.committed = Some(temp.record.clone());
        self.state.record = Some(temp.record);
        self.state.record_tag = temp.tag;
        self.state.record_synced = temp.synced;
        self.state.record_bad = None;
        self.ghost.renamed = true;
        crate::record_changed(self.state);
        // The record names this process's file of its generation now (a restored one's fresh
        // tag included).
        let mut restored_named = false;
        if self.state.record_tag == Some(self.p)
            && let Some(t) = self.state.record.as_ref().map(|r| r.token)
            && let Some(f) = self.state.live.get_mut(&t)
            && f.what == What::Own(self.p)
        {
            restored_named = f.restored;
            f.restored = false;
        }
        // When the record names a restored file: a file of the same generation moved aside
        // carries a tag this record no longer names; the holder closes it now if it kept it
        // (the file the record named before). Without a restore, the file aside is still the
        // one the record names, kept locked.
        if restored_named
            && self.state.record_tag == Some(self.p)
            && let Some(t) = self.state.record.as_ref().map(|r| r.token)
            && let Some((at, f)) = self.state.aside_live.as_mut()
            && *at == t
            && f.what == What::Own(self.p)
        {
            // Planted: the restore reused the tag, so the file aside still carries it.
            f.old = self.planted != Some(Planted::RestoreKeepsTag);
            f.restored = false;
            if f.holder == Some(Locker::Proc(self.p)) {
                f.holder = None;
            }
        }
        if self.backend == Backend::Postgres {
            if reply_lost {
                return self.reply_lost();
            }
            // The reply comes once the synchronous standbys confirmed the commit (and so every
            // commit before it); with none, once the primary flushed it.
            self.state.durable = self.state.record.clone();
            self.state.durable_tag = self.state.record_tag;
            if self.standbys > 1 {
                self.state.durable2 = (self.state.record.clone(), self.state.record_tag);
            }
        }
        Ok(())
    }

    fn sync_dir(&mut self) -> Result<(), Error> {
        // PostgreSQL: the commit's reply came with the rename (the `COMMIT`).
        if !self.durable || self.backend == Backend::Postgres {
            return Ok(());
        }
        self.fault("fsync")?;
        // The name is durable now; contents never synced would read back torn after a power
        // loss — as good as no record, which the token property sees.
        (self.state.durable, self.state.durable_tag) = if self.state.record_synced {
            (self.state.record.clone(), self.state.record_tag)
        } else {
            (None, None)
        };
        Ok(())
    }

    fn close_local(&mut self, token: u64) {
        let proc = &mut self.state.procs[self.p];
        if proc.local.as_ref().is_some_and(|l| l.token == token) {
            proc.local = None;
            // PostgreSQL: its connection is given up; a session the server has not ended yet
            // keeps the lock until it does. (A loss of the new generation the call committed
            // stays to be told.)
            if proc.loss.is_some_and(|l| l.token == token) {
                proc.loss = None;
            }
            self.unlock(token);
        }
    }

    fn delete_live(&mut self, token: u64) {
        if self.backend == Backend::Postgres {
            // Advisory locks leave no file behind.
            return;
        }
        self.remove_file(token);
    }

    fn sweep(&mut self, below: u64) {
        if self.backend == Backend::Postgres {
            // A dead session's locks vanish with it.
            return;
        }
        // The dead generation's file at once; the listing at this process's next transition.
        if let Some(dead) = below.checked_sub(1) {
            self.remove_file(dead);
        }
        self.state.procs[self.p].keep_sweep(below);
    }
}

/// The bytes a model liveness tag stands for: the publishing process, and whether it is a
/// restore's fresh tag (which the record names only once the renew commits).
fn tag_bytes(p: usize, fresh: bool) -> [u8; 2] {
    [if fresh { b'r' } else { b't' }, p as u8]
}

/// Whether `f`, at a generation's liveness name, is the generation's own file when the record
/// names `tag`: the machine's judgement ([`machine::own_liveness`]), as the adapter asks it.
/// `tag_reused`: the planted restore that publishes with the record's tag
/// ([`Planted::RestoreKeepsTag`]).
fn own(tag: Option<usize>, f: &LiveFile, tag_reused: bool) -> bool {
    let expected = tag.map(|q| tag_bytes(q, false));
    let carried;
    let found = match f.what {
        What::Own(q) => {
            carried = if f.old {
                [b'o', q as u8]
            } else {
                tag_bytes(q, f.restored && !tag_reused)
            };
            AtName::File { first: &carried }
        }
        What::Plain => AtName::File { first: b"" },
        What::Fifo => AtName::Fifo,
        What::Dir => AtName::Directory,
    };
    machine::own_liveness(expected.as_ref().map(|t| &t[..]), found).is_ok()
}
