//! One transition of the flock backend: what it gives the front (`front::Backend`: the id's
//! slot, one attempt at `<stem>.lock`, the lock given back), and the transaction — the primitive steps of
//! one transition on files, done under the id's transition lock, for
//! [`driver::run`](crate::driver::run), which orders them.

use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use super::files::{self, Access, HeldLock, Paths};
use super::live::{self, Found, Published};
use super::sys::{Dir, Kernel, Peeked};
use super::{Files, FlockLease};
use crate::Timestamp;
use crate::driver::{Begun, CommitStep, Grain, Transaction};
use crate::error::Error;
use crate::fault::FaultPoint;
use crate::front::{Backend, Entry, Idle};
use crate::machine::{self, Cleanup, Event, Liveness, Local, Outcome, Plan};
use crate::name::SessionId;
use crate::record::{self, LiveTag, Record};

/// Whether an instance whose entry's `held` (`front::Entry::held`) reads `until` holds the id
/// at `now`: until the committed expiry, by the machine's one definition of expiry.
///
/// The flock backend keeps it so (`mark_held`): set at each commit point to the expiry of the
/// record committed when it names this instance's generation, to none when it does not (a
/// release's tombstone), and to none at the end of a transition that leaves the instance
/// without a generation. So it changes with the record, not later: the release's deletion of
/// its liveness file, which wakes the waiters, comes after it went down, and an acquire's
/// refresh tries at once from its commit on; and it lapses with the lease's expiry. (A
/// takeover by another process before the expiry, which needs this holder's liveness lock
/// gone, shows here only at this instance's next transition on the id; so does a commit whose
/// transition then failed.) A waiting acquire's look reads it: it must neither wait for
/// another thread's call that has the slot nor guess when it cannot read it.
pub fn held_at(until: &AtomicI64, now: Timestamp) -> bool {
    match until.load(Ordering::Acquire) {
        i64::MIN => false,
        at => Timestamp::from_unix_nanos(i128::from(at))
            .is_some_and(|expiry| !machine::is_expired(expiry, now)),
    }
}

/// Says in `held`, for the look that reads it without the slot's mutex, until when this
/// instance holds the id (`None`: it does not; [`held_at`]'s rule).
pub(super) fn mark_held(held: &AtomicI64, until: Option<Timestamp>) {
    // Unix nanoseconds within `i64` (years 1677 to 2262; beyond, the nearest end).
    let nanos = |t: Timestamp| t.unix_nanos().clamp(i64::MIN.into(), i64::MAX.into()) as i64;
    held.store(until.map_or(i64::MIN, nanos), Ordering::Release);
}

/// What this instance holds for one id.
#[derive(Debug)]
pub struct Slot<F = File> {
    /// The id's paths in the lease directory.
    pub(super) paths: Arc<Paths>,
    /// The generation this instance holds, if any.
    pub(super) local: Option<LocalGen<F>>,
    /// A sweep of generations below this token that a takeover left to this id's next
    /// transition here (see [`FlockTx::sweep`]).
    pub(super) pending_sweep: Option<u64>,
    /// How many transitions that sweep has waited for a shared listing.
    sweep_waits: u32,
    /// The id's `<stem>.lock` descriptor, unlocked, kept from its last transition here for the
    /// next one (at most [`files::KEEP_LOCKS`] per instance; given back at the descriptor
    /// limit).
    pub(super) kept: Option<HeldLock>,
}

impl<F> Slot<F> {
    /// The slot of id `id` in the lease directory `dir`: nothing held yet.
    pub fn new(dir: &std::path::Path, id: &SessionId) -> Slot<F> {
        Slot {
            paths: Arc::new(Paths::new(dir, id.stem().to_owned())),
            local: None,
            pending_sweep: None,
            sweep_waits: 0,
            kept: None,
        }
    }

    /// Whether a sweep a takeover left waits for this id's next transition here (the
    /// registry keeps the slot for it).
    pub fn owes_sweep(&self) -> bool {
        self.pending_sweep.is_some()
    }

    /// Leaves a listing below `below` to this id's next transition here.
    pub(super) fn keep_sweep(&mut self, below: u64) {
        self.pending_sweep = Some(self.pending_sweep.map_or(below, |b| b.max(below)));
    }

    /// What a transition that has just taken the id's transition lock carries: the listing an
    /// earlier takeover of this instance left to it.
    pub fn begin(&mut self) -> TxState<F> {
        TxState {
            carried_sweep: self.pending_sweep.take(),
            ..TxState::default()
        }
    }

    /// The end of a transition, before its transition lock is given back: `held` says no more
    /// than the slot holds, and a listing the run did not get to waits for the next
    /// transition. The transition lock is unlocked by `unlock` if the run did not unlock it
    /// (closing would unlock too, but a copy of the descriptor in a process forked meanwhile,
    /// without exec, must not keep the lock). Whether it is unlocked now: its descriptor may
    /// be kept for the id's next transition; otherwise it must be closed.
    pub fn end(
        &mut self,
        held: &AtomicI64,
        st: &mut TxState<F>,
        unlock: impl FnOnce() -> bool,
    ) -> bool {
        if self.local.is_none() {
            mark_held(held, None);
        }
        // The carried listing waits for the next transition if the run did not get to it (the
        // driver ends every run by releasing the lock, which runs it).
        if let Some(below) = st.carried_sweep.take() {
            self.keep_sweep(below);
        }
        st.unlocked || unlock()
    }
}

/// How many deferred sweeps share one listing of the directory: after a listing of `E`
/// entries, the next one waits until `E / SWEEP_SHARE` more sweeps have been left by a
/// takeover or kept waiting again by a transition (or a minute has passed), so listings cost
/// about `SWEEP_SHARE` entries per takeover however many ids the directory holds (PROTOCOL §6.8),
/// and a waiting sweep still runs when takeovers stop. In a small directory every sweep still
/// lists at once.
pub const SWEEP_SHARE: usize = 64;

/// The deferred sweeps of one instance's takeovers (PROTOCOL §6.8), and the listing they
/// share. Leftovers are rare (a crash inside a transition, a failed deletion) and harmless but
/// for the space they take, so a sweep may wait: a listing serves every sweep pending when it
/// runs. It runs under the transition lock of the id whose sweep asks for it, and it only
/// *names* the other pending ids' leftovers: each id removes its own at its next transition
/// here, under its own transition lock and within the bound the machine gives for the record
/// that transition read ([`machine::deferred_sweep_below`]), exactly as a listing of its own
/// would. A name found earlier can only have gone since (a temporary name is never reused; a
/// generation below the bound is dead whenever it was created).
#[derive(Debug, Default)]
pub struct Sweeps {
    /// The ids (stems) whose takeover left a sweep not yet run.
    pending: std::collections::HashSet<String>,
    /// Pending ids a listing running now will name leftovers for; an id whose sweep ends
    /// meanwhile (by a listing of its own, or dropped) leaves this set, and that listing
    /// then records nothing for it.
    listing: std::collections::HashSet<String>,
    /// Leftovers a listing found for pending ids other than the one that listed.
    found: std::collections::HashMap<String, Vec<std::ffi::OsString>>,
    /// Sweeps left, or kept waiting, since the last listing.
    since: usize,
    /// Sweeps to wait for before the next listing (0: list at the next sweep).
    every: usize,
    /// When the last listing ended: a sweep never waits longer than [`SWEEP_WAIT_MAX`] for
    /// the next one.
    last: Option<std::time::Instant>,
}

/// The longest a waiting sweep waits for a shared listing: one listing a minute per instance
/// at most, whatever the size of the directory, when takeovers have stopped.
const SWEEP_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);

impl Sweeps {
    /// The sweep of `stem` is over (run, or dropped): nothing more is kept for it.
    fn end(&mut self, stem: &str) {
        self.pending.remove(stem);
        self.listing.remove(stem);
        self.found.remove(stem);
    }
}

/// A generation this instance holds: the locked liveness file stays open for its whole life.
#[derive(Debug)]
pub(super) struct LocalGen<F = File> {
    pub(super) local: Local,
    pub(super) live: Published<F>,
    /// After a restore (a fresh tag, `FlockTx::ensure_live`) whose record is not
    /// committed yet: the file carrying the tag the committed record still names, kept open
    /// and locked until a record naming `live`'s tag is committed. Until then that file, if
    /// it is put back at its name, must still read as the live holder's.
    pub(super) committed: Option<Published<F>>,
}

/// A new generation's locked liveness file, not yet adopted. Dropping it
/// un-adopted (the commit failed) closes the descriptor, which releases the lock. The file
/// stays: if the rename happened but the directory sync failed, the record names this
/// generation, and a present, unlocked file lets the next acquire see it dead and replace it
/// at once; otherwise the next takeover publishes over it. Unless a copy of the descriptor
/// went to a receiver (`FlockLeaseBuilder::share_liveness`), which may keep the lock as long
/// as it likes: then the undo removes the file, if it is still the one at the name, so that
/// no later acquire finds the name locked (PROTOCOL §7.1).
#[derive(Debug)]
pub struct PendingLive<F = File>(Published<F>, u64);

/// One transition's transaction on the lease directory `D` (the kernel's, or the model's),
/// for [`driver::run`](crate::driver::run).
pub struct FlockTx<'a, D: Dir = Kernel<'a>> {
    pub(super) dir: D,
    pub(super) paths: Arc<Paths>,
    /// Until when this instance holds the id ([`held_at`]).
    pub(super) held: &'a AtomicI64,
    pub(super) slot: &'a mut Slot<D::File>,
    /// The transition lock, taken before the run; the driver says when to release it.
    pub(super) stable: &'a D::File,
    /// The (device, inode) of the locked `<stem>.lock`, checked again just before the commit.
    pub(super) stable_id: (u64, u64),
    /// What the transition carries from one step to the next.
    pub(super) st: &'a mut TxState<D::File>,
}

/// What one transition carries from one of its steps to the next.
#[derive(Debug)]
pub struct TxState<F = File> {
    /// The temporary record this transition created (under a name of its own) and has not
    /// renamed yet.
    pub(super) temp: Option<(F, std::path::PathBuf)>,
    /// Whether the driver released the transition lock (then the adapter need not again).
    pub(super) unlocked: bool,
    /// The listing an earlier takeover left to this transition (see `FlockTx::sweep`
    /// below), run just before the transition lock is released.
    pub(super) carried_sweep: Option<u64>,
    /// The token of the record this transition read: `None` before the read, `Some(None)`
    /// when there was no record.
    pub(super) seen_token: Option<Option<u64>>,
    /// The liveness tag the record read names.
    pub(super) seen_tag: Option<LiveTag>,
    /// The (device, inode) of the record file this transition read (`Some(None)`: there was
    /// none), checked again just before the commit: a transition commits only over the
    /// record it decided on. Taken from `seen_file` at the commit check (no stat on a read
    /// that commits nothing), or when that file is closed early.
    pub(super) seen_record: Option<Option<(u64, u64)>>,
    /// The record file read, kept open until the commit check so that its inode number cannot
    /// be given to another file meanwhile (which would defeat the check above), and closed
    /// right after the rename, still under the transition lock: the inode the rename
    /// replaced is freed there, never after the unlock (on ext4 a free deferred past the
    /// unlock cost milliseconds per transition under load).
    pub(super) seen_file: Option<F>,
    /// The tag of the generation the record to commit names: the new generation's
    /// (`FlockTx::lock_live`) or the local one's (`FlockTx::ensure_live`); none for
    /// a tombstone.
    pub(super) commit_tag: Option<LiveTag>,
}

impl<F> Default for TxState<F> {
    fn default() -> Self {
        TxState {
            temp: None,
            unlocked: false,
            carried_sweep: None,
            seen_token: None,
            seen_tag: None,
            seen_record: None,
            seen_file: None,
            commit_tag: None,
        }
    }
}

impl<'a, D: Dir> FlockTx<'a, D> {
    /// The transaction of one transition of `slot`'s id on `dir`, under the transition lock
    /// `stable` (the file whose (device, inode) is `stable_id`), carrying `st` (from
    /// [`Slot::begin`]); `held` is the id's entry's held flag (`held_at`).
    pub fn new(
        dir: D,
        held: &'a AtomicI64,
        slot: &'a mut Slot<D::File>,
        (stable, stable_id): (&'a D::File, (u64, u64)),
        st: &'a mut TxState<D::File>,
    ) -> Self {
        FlockTx {
            dir,
            paths: Arc::clone(&slot.paths),
            held,
            slot,
            stable,
            stable_id,
            st,
        }
    }
}

impl<D: Dir> FlockTx<'_, D> {
    fn check(&self, point: FaultPoint, path: &std::path::Path) -> Result<(), Error> {
        self.dir.fault(point, path)
    }

    /// Publishes generation `token`'s liveness file carrying `tag` (see [`live::publish`]);
    /// the record this transition commits names that tag.
    fn publish(
        &mut self,
        token: u64,
        tag: LiveTag,
        over: live::Over,
    ) -> Result<Published<D::File>, Error> {
        let path = self.paths.live(token);
        // On any failure it removes its temporary file and leaves the final name as it was.
        let published = live::publish(&self.dir, &path, tag, over)?;
        self.st.commit_tag = Some(tag);
        Ok(published)
    }

    /// The commit check ([`machine::commit_check`]), one system call before the rename: the
    /// transition lock this transition holds is still the file at `<stem>.lock` (a
    /// transition commits only under the lock everyone else takes), and the record at its
    /// path is still the file this transition read, or still absent (whatever happened to
    /// the lock: deleted, or hard-linked aside and put back while another transition ran a
    /// whole acquire on a fresh one, a transition commits only over the record it decided
    /// on). The record's inode cannot have been reused: the transition keeps the file it read
    /// open through both stats (its own and the path's), so while it is open no other file
    /// can have its (device, inode), and equal identities mean the same file (PROTOCOL §11).
    fn check_commit(&mut self) -> Result<(), Error> {
        // The file read first (its descriptor: no path), so that the lock's stat stays one
        // system call before the rename.
        self.note_seen_record()?;
        let lock = &self.paths.lock;
        self.check(FaultPoint::CheckStable, lock)?;
        let id = |path: &std::path::Path| {
            (self.dir.standing(path)).map_err(|e| Error::io("stat", path, e))
        };
        let lock_at = id(lock)?;
        // The record is looked at only under the lock (the lock's answer is the one reported).
        let record_at = match self.st.seen_record {
            Some(_) if lock_at == Some(self.stable_id) => id(&self.paths.record)?,
            _ => None,
        };
        let read = self.st.seen_record.as_ref().map(Option::as_ref);
        machine::commit_check(&self.stable_id, lock_at.as_ref(), read, record_at.as_ref())
            .map_err(|_| Error::LockReplaced { path: lock.clone() })
    }

    /// Notes the (device, inode) of the record file this transition read and still holds
    /// open (one `fstat`), if not noted yet: at the commit check, or before the file is
    /// closed early at the descriptor limit.
    fn note_seen_record(&mut self) -> Result<(), Error> {
        if self.st.seen_record.is_none()
            && let Some(file) = &self.st.seen_file
        {
            let id =
                (self.dir.identity(file)).map_err(|e| Error::io("stat", &self.paths.record, e))?;
            self.st.seen_record = Some(Some(id));
        }
        Ok(())
    }

    /// At the descriptor limit: the record read is closed to make room (a release must
    /// succeed there), its identity noted first. The commit still checks the record's
    /// identity, without the guard against its inode number being reused meanwhile
    /// (PROTOCOL §11).
    fn close_seen_record(&mut self) -> Result<(), Error> {
        self.note_seen_record()?;
        self.st.seen_file = None;
        Ok(())
    }
}

impl<D: Dir> FlockTx<'_, D> {
    /// Runs the listing an earlier takeover left to this transition, if any (see
    /// `FlockTx::sweep`'s implementation below). Best effort, like all cleanup.
    ///
    /// The machine bounds it by the record this transition read
    /// ([`machine::deferred_sweep_below`]); the record may have been deleted or restored by
    /// hand (or lost with [`Durability::NoSync`]) since the takeover. A transition that did not
    /// get to read the record keeps the listing for the next one.
    fn run_carried_sweep(&mut self) {
        let Some(below) = self.st.carried_sweep.take() else {
            return;
        };
        match self.st.seen_token {
            Some(token) => match machine::deferred_sweep_below(below, token) {
                Some(below) => self.sweep_listing(below),
                // No record: nothing is known to be superseded; the sweep is dropped.
                None => {
                    self.slot.sweep_waits = 0;
                    if self.slot.pending_sweep.is_none() {
                        self.dir.sweeps().end(&self.paths.stem);
                    }
                }
            },
            None => self.slot.keep_sweep(below),
        }
    }

    /// Removes every liveness file of this id below `below` and a leftover temporary record:
    /// the listing part of a takeover's sweep. It uses what a listing shared with the
    /// instance's other pending sweeps found ([`Sweeps`]), or lists the directory if enough
    /// sweeps have waited, or waits itself for the next transition.
    fn sweep_listing(&mut self, below: u64) {
        let stem = &self.paths.stem;
        // Still pending afterwards if this very transition's takeover left a new sweep.
        let again = self.slot.pending_sweep.is_some();
        let others = {
            let mut sweeps = self.dir.sweeps();
            // What another transition's listing found for this id, if one did.
            let mine = sweeps.found.remove(stem);
            let waited_long = sweeps.last.is_some_and(|t| t.elapsed() >= SWEEP_WAIT_MAX);
            if mine.is_none() && sweeps.since < sweeps.every && !waited_long {
                // Not yet worth a listing: this sweep waits for one (a later transition).
                // Waiting again counts towards it, so that it runs when takeovers stop (a
                // first wait does not: a takeover already counted this sweep).
                self.slot.sweep_waits = self.slot.sweep_waits.saturating_add(1);
                if self.slot.sweep_waits > 1 {
                    sweeps.since += 1;
                }
                self.slot.keep_sweep(below);
                return;
            }
            self.slot.sweep_waits = 0;
            sweeps.end(stem);
            if again {
                sweeps.pending.insert(stem.clone());
            }
            if let Some(names) = mine {
                drop(sweeps);
                for name in names {
                    self.remove_if_stale(&name, below);
                }
                return;
            }
            sweeps.since = 0;
            let others: std::collections::HashSet<String> = sweeps
                .pending
                .iter()
                .filter(|o| *o != stem && !sweeps.found.contains_key(*o))
                .cloned()
                .collect();
            sweeps.listing.extend(others.iter().cloned());
            others
        };
        let listed = self.list(below, &others);
        let mut sweeps = self.dir.sweeps();
        sweeps.last = Some(std::time::Instant::now());
        let Some((entries, mut found)) = listed else {
            // An incomplete listing names nothing: the others keep waiting for their own.
            for other in &others {
                sweeps.listing.remove(other);
            }
            return;
        };
        sweeps.every = entries / SWEEP_SHARE;
        for other in others {
            // Only for ids whose sweep is still waiting for this listing.
            if sweeps.listing.remove(&other) {
                let names = found.remove(&other).unwrap_or_default();
                sweeps.found.insert(other, names);
            }
        }
    }

    /// One listing of the directory: removes this id's leftovers below `below`, and collects
    /// the names of the `others`' candidates. Returns how many entries it read and what it
    /// found, or `None` if it could not read the whole directory (then what it found is not
    /// all there is, and is not used).
    #[allow(clippy::type_complexity)]
    fn list(
        &mut self,
        below: u64,
        others: &std::collections::HashSet<String>,
    ) -> Option<(
        usize,
        std::collections::HashMap<String, Vec<std::ffi::OsString>>,
    )> {
        let mut found: std::collections::HashMap<String, Vec<std::ffi::OsString>> =
            Default::default();
        if self.check(FaultPoint::ReadDir, &self.paths.dir).is_err() {
            return None;
        }
        let count = self.dir.list(&mut |name| {
            // A stem has no dot: the name's stem is what precedes its first one.
            let bytes = name.as_bytes();
            let Some(dot) = bytes.iter().position(|&b| b == b'.') else {
                return;
            };
            let Ok(stem) = std::str::from_utf8(&bytes[..dot]) else {
                return;
            };
            if stem == self.paths.stem {
                self.remove_if_stale(name, below);
            } else if others.contains(stem) && candidate(&bytes[dot + 1..]) {
                found
                    .entry(stem.to_owned())
                    .or_default()
                    .push(name.to_owned());
            }
        });
        Some((count?, found))
    }

    /// Removes the directory entry `name` of this id if it is a leftover (a temporary file,
    /// or the liveness file of a generation below `below`).
    fn remove_if_stale(&self, name: &std::ffi::OsStr, below: u64) {
        let Some(rest) = name
            .as_bytes()
            .strip_prefix(self.paths.stem.as_bytes())
            .and_then(|r| r.strip_prefix(b"."))
        else {
            return;
        };
        let stale = rest.ends_with(b".tmp") || live_token(rest).is_some_and(|t| t < below);
        if stale {
            let _ = self.dir.unlink(&self.paths.dir.join(name));
        }
    }
}

/// The token of a liveness file's name after `<stem>.` (`<token>.live`).
fn live_token(rest: &[u8]) -> Option<u64> {
    rest.strip_suffix(b".live")
        .and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| t.parse::<u64>().ok())
}

/// Whether a name after `<stem>.` may be a leftover: a temporary file (records:
/// `lease.json.tmp` of older versions, `lease.json.<tag>.tmp`; liveness files being
/// published: `<token>.live.<tag>.tmp`; only a crash leaves them, since both are created and
/// renamed or removed within one transition) or a liveness file (judged against the bound
/// when its id's transition removes it).
fn candidate(rest: &[u8]) -> bool {
    rest.ends_with(b".tmp") || live_token(rest).is_some()
}

impl<D: Dir> Transaction for FlockTx<'_, D> {
    type Pending = PendingLive<D::File>;

    fn grain(&self) -> Grain {
        Grain::SystemCall
    }

    fn unlock(&mut self) {
        self.run_carried_sweep();
        // If this fails, the adapter closes the descriptor, which releases the lock too.
        self.st.unlocked = self.dir.unlock(self.stable).is_ok();
    }

    fn begin(&mut self) -> Result<Begun, Error> {
        Ok(Begun {
            now: self.dir.now(),
            record: self.read()?,
            local: self.slot.local.as_ref().map(|g| g.local.clone()),
        })
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        let path = self.paths.live(token);
        let mut opened = self.dir.open(&path, Access::Probe);
        if matches!(opened, Err(Error::TooManyOpenFiles { .. })) && self.st.seen_file.is_some() {
            // At the descriptor limit, as in `write_temp`: the record read makes room.
            self.close_seen_record()?;
            opened = self.dir.open(&path, Access::Probe);
        }
        let peek = |f: &D::File, buf: Option<&mut [u8]>| self.dir.peek(f, buf);
        let found = live::identify(opened, &path, self.st.seen_tag, peek)?;
        if matches!(found, Found::Own(_)) {
            self.check(FaultPoint::LockProbe, &path)?;
        }
        Ok(live::probe(found, &path, |f| self.dir.holder_gone(f))?.liveness)
    }

    fn commit_step(
        &mut self,
        step: CommitStep,
        plan: &Plan,
    ) -> Result<Option<PendingLive<D::File>>, Error> {
        let token = plan.prepared_token();
        match (step, token, &plan.commit) {
            (CommitStep::LockLive, Some(token), _) => return self.lock_live(token).map(Some),
            (CommitStep::EnsureLive, Some(token), _) => self.ensure_live(token)?,
            (CommitStep::WriteTemp, _, Some(record)) => self.write_temp(record)?,
            (CommitStep::SyncTemp, ..) => self.sync_temp()?,
            (CommitStep::Point, _, commit) => {
                self.rename()?;
                // The record names this instance's generation now, or (a release) none.
                mark_held(self.held, machine::held_until(commit.as_ref()));
            }
            (CommitStep::SyncDir, ..) => self.sync_dir()?,
            _ => unreachable!("a commit step its plan does not list"),
        }
        Ok(None)
    }

    fn undo(&mut self, pending: Option<PendingLive<D::File>>) {
        // Closing the descriptor releases a new generation's lock; its file stays (see
        // `PendingLive`), unless a receiver may keep the lock.
        if let Some(PendingLive(published, token)) = pending
            && self.dir.shares()
        {
            let path = self.paths.live(token);
            if (self.dir.standing(&path)).is_ok_and(|m| m == Some((published.dev, published.ino))) {
                let _ = self.dir.unlink(&path);
            }
        }
        // Only a file this transition created: a refused foreign file is not ours to remove.
        if let Some((temp, path)) = self.st.temp.take() {
            drop(temp);
            let _ = self.dir.unlink(&path);
        }
    }

    fn cleanup(&mut self, step: &Cleanup) {
        match *step {
            Cleanup::CloseLocal { token } => self.close_local(token),
            Cleanup::DeleteLive { token } => self.delete_live(token),
            Cleanup::Sweep { below } => self.sweep(below),
        }
    }

    fn adopt(&mut self, pending: PendingLive<D::File>, local: Local) {
        self.slot.local = Some(LocalGen {
            local,
            committed: None,
            live: pending.0,
        });
    }
}

/// The flock backend's steps, one system call (or a few that no other actor can come
/// between) each.
impl<D: Dir> FlockTx<'_, D> {
    fn read(&mut self) -> Result<Option<Record>, Error> {
        let path = &self.paths.record;
        let file = match self.dir.open(path, Access::Read) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => {
                self.st.seen_token = Some(None);
                self.st.seen_record = Some(None);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        self.check(FaultPoint::ReadRecord, path)?;
        let buf = self.dir.read(&file).map_err(|e| match e.raw_os_error() {
            Some(nix::libc::EISDIR) => Error::NotAFile { path: path.clone() },
            _ => Error::io("read", path, e),
        })?;
        let (record, tag) = record::decode_tagged(&buf).map_err(|source| {
            // Bytes that are no record: a FIFO reads as empty, so say what the file is when
            // it is not a regular file (a stat only on this path, never on a good record's).
            match self.dir.peek(&file, None) {
                Ok(kind) if !matches!(kind, Peeked::File(_)) => {
                    Error::NotAFile { path: path.clone() }
                }
                _ => Error::Corrupt {
                    path: path.clone(),
                    source,
                },
            }
        })?;
        self.st.seen_token = Some(Some(record.token));
        self.st.seen_tag = tag;
        // Its identity is noted from the open file when the commit checks it: a read that
        // commits nothing (a "held" answer) needs no stat.
        self.st.seen_file = Some(file);
        Ok(Some(record))
    }

    fn lock_live(&mut self, token: u64) -> Result<PendingLive<D::File>, Error> {
        // A live holder of the generation about to be granted (the record was moved back
        // under it) keeps its file: the publish refuses to replace a locked file. A symbolic
        // link planted at the name is refused too, as everywhere in the directory.
        let published = self.publish(token, self.dir.fresh_tag(), live::Over::NotHeld)?;
        Ok(PendingLive(published, token))
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        let path = self.paths.live(token);
        let Some(generation) = self.slot.local.as_ref() else {
            return Ok(());
        };
        self.check(FaultPoint::StatLive, &path)?;
        let ours = &generation.live;
        match self.dir.standing(&path) {
            Ok(Some(m)) if m == (ours.dev, ours.ino) => {
                self.st.commit_tag = Some(ours.tag);
                return Ok(());
            }
            // Deleted, or something else stands at our path: publish a new file, already
            // locked, in one rename, carrying a fresh tag, which this transition's record
            // then names. Whatever stood there is replaced; nothing unlocked is ever left.
            // The tag is fresh so that no earlier file of the generation (our own inode
            // moved aside or hard-linked and put back after this, a copy) reads as its own:
            // a rival's probe then finds "not the generation's file" (unknown: the expiry
            // decides) instead of our old inode, unlocked, "dead". Until the record naming
            // the fresh tag is committed, the new file reads as unknown too.
            Ok(_) => {}
            Err(e) => return Err(Error::io("stat", &path, e)),
        }
        let published = self.publish(token, self.dir.fresh_tag(), live::Over::Anything)?;
        if let Some(generation) = self.slot.local.as_mut() {
            let old = std::mem::replace(&mut generation.live, published);
            // Keep the file whose tag the committed record names (the first one replaced
            // since the last commit); a file of an earlier failed restore was never named.
            if generation.committed.is_none() {
                generation.committed = Some(old);
            }
        }
        Ok(())
    }

    fn write_temp(&mut self, record: &Record) -> Result<(), Error> {
        let path = self.paths.temp(self.dir.fresh_tag());
        let tmp = match self.dir.open(&path, Access::Temp) {
            // At the descriptor limit the record read is closed to make room.
            Err(Error::TooManyOpenFiles { .. }) if self.st.seen_file.is_some() => {
                self.close_seen_record()?;
                self.dir.open(&path, Access::Temp)?
            }
            other => other?,
        };
        let tag = self.st.commit_tag.filter(|_| self.dir.tags_records());
        let written = self.check(FaultPoint::WriteTemp, &path).and_then(|()| {
            let bytes = record::encode_tagged(record, tag);
            (self.dir.write(&tmp, &bytes)).map_err(|e| Error::io("write", &path, e))
        });
        // Kept even on failure (the write's, or the fault seam's before it), so the driver's
        // discard removes what was created.
        self.st.temp = Some((tmp, path));
        written
    }

    fn sync_temp(&mut self) -> Result<(), Error> {
        if !self.dir.durable() {
            return Ok(());
        }
        match &self.st.temp {
            Some((tmp, path)) => {
                self.check(FaultPoint::SyncTemp, path)?;
                self.dir.sync(tmp).map_err(|e| Error::io("fsync", path, e))
            }
            None => Ok(()),
        }
    }

    fn rename(&mut self) -> Result<(), Error> {
        // The commit happens only under the lock everyone else takes: checked again here, one
        // system call before the rename (a tmp cleaner or an operator may have deleted
        // `<stem>.lock` since it was locked, letting another transition start beside this one).
        self.check_commit()?;
        let to = &self.paths.record;
        let Some((_, from)) = &self.st.temp else {
            return Err(Error::io(
                "rename",
                to,
                io::Error::from(io::ErrorKind::NotFound),
            ));
        };
        self.check(FaultPoint::Rename, to)?;
        // Both names looked up from the lease directory's descriptor (one component each).
        (self.dir.rename(from, to)).map_err(|e| Error::io("rename", to, e))?;
        // The record read is closed now, before the directory sync and the unlock: the
        // rename unlinked it, and its inode is freed here, under the lock, as a rename with no
        // descriptor open frees it (the check above no longer needs it).
        self.st.seen_file = None;
        self.st.temp = None;
        // The record names the local generation's current file now: the one an earlier
        // record named can go (its lock with it).
        if let Some(generation) = self.slot.local.as_mut()
            && self.st.commit_tag == Some(generation.live.tag)
        {
            generation.committed = None;
        }
        Ok(())
    }

    fn sync_dir(&mut self) -> Result<(), Error> {
        if !self.dir.durable() {
            return Ok(());
        }
        let dir = &self.paths.dir;
        self.check(FaultPoint::SyncDir, dir)?;
        self.dir.sync_dir().map_err(|e| Error::io("fsync", dir, e))
    }

    fn close_local(&mut self, token: u64) {
        if self
            .slot
            .local
            .as_ref()
            .is_some_and(|g| g.local.token == token)
        {
            // Closing the descriptor releases the liveness lock.
            self.slot.local = None;
        }
    }

    fn delete_live(&mut self, token: u64) {
        let path = self.paths.live(token);
        if self.check(FaultPoint::Unlink, &path).is_ok() {
            let _ = self.dir.unlink(&path);
        }
    }

    /// The takeover's sweep, in two parts. The dead generation's file (the record's, `below -
    /// 1`) goes at once, one call. The listing of the directory for older leftovers (PROTOCOL
    /// §6.8), whose cost grows with the number of ids sharing the directory, is left to this
    /// id's next transition here ([`FlockTx::run_carried_sweep`]), still under the transition
    /// lock, so that a crash takeover costs the same in a directory of 100 000 ids as in one of
    /// ten. (A leftover temporary record is replaced by the takeover's own write anyway.)
    fn sweep(&mut self, below: u64) {
        if let Some(dead) = below.checked_sub(1) {
            self.delete_live(dead);
        }
        self.slot.keep_sweep(below);
        let mut sweeps = self.dir.sweeps();
        sweeps.since += 1;
        sweeps.pending.insert(self.paths.stem.clone());
    }
}

impl<F> Idle for Slot<F> {
    fn idle(&self) -> bool {
        self.local.is_none() && !self.owes_sweep()
    }
}

/// What the flock backend gives the front (PROTOCOL §4): an id's slot, one attempt at
/// `<stem>.lock`, the transaction of one run under it, and the lock given back.
impl Backend for Files {
    type State = Slot;
    type Lock = (HeldLock, TxState);
    type Tx<'a> = FlockTx<'a>;

    fn state(&self, id: &SessionId) -> Slot {
        Slot::new(&self.dir, id)
    }

    /// One attempt at `<stem>.lock` ([`files::lock_once`]); taken, the run carries the
    /// listing an earlier takeover of this instance left to it.
    fn lock(
        l: &FlockLease,
        _id: &SessionId,
        slot: &mut Slot,
        _event: &Event,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Lock>, Error> {
        let path = &slot.paths.lock;
        let open = || l.open_lock(path);
        let kept = slot.kept.take();
        let dir = Some(&l.inner.dir_file);
        let faults = &l.inner.opener.faults;
        let taken = files::lock_once(path, dir, faults, open, kept, deadline)?;
        Ok(taken.map(|lock| (lock, slot.begin())))
    }

    fn tx<'a>(
        l: &'a FlockLease,
        _id: &'a SessionId,
        entry: &'a Entry<Slot>,
        slot: &'a mut Slot,
        (lock, st): &'a mut Self::Lock,
    ) -> FlockTx<'a> {
        FlockTx::new(
            Kernel(l),
            &entry.held,
            slot,
            (&lock.file, (lock.dev, lock.ino)),
            st,
        )
    }

    fn unlock(
        l: &FlockLease,
        entry: &Entry<Slot>,
        slot: &mut Slot,
        (mut lock, mut st): Self::Lock,
        _outcome: &Result<Outcome, Error>,
    ) {
        // Unlocked, its descriptor is kept for the id's next transition while a place is free;
        // otherwise (or if unlocking failed) closed, which unlocks it.
        if slot.end(&entry.held, &mut st, || lock.file.unlock().is_ok()) {
            if lock.place.is_none() {
                lock.place = files::KeepPlace::take(&l.inner.kept_locks);
            }
            if lock.place.is_some() {
                slot.kept = Some(lock);
            }
        }
    }

    fn lock_of(l: &FlockLease, id: &SessionId) -> crate::error::LockOf {
        crate::error::LockOf::File(Paths::new(&l.inner.dir, id.stem().to_owned()).lock)
    }

    fn observe(l: &FlockLease, id: &SessionId) {
        let faults = &l.inner.opener.faults;
        if faults.hooked() {
            let lock = Paths::new(&l.inner.dir, id.stem().to_owned()).lock;
            faults.observe(FaultPoint::Held, &lock);
        }
    }

    fn store_gone(l: &FlockLease) -> Option<String> {
        use std::os::unix::fs::MetadataExt;
        let id = |m: &fs::Metadata| (m.dev(), m.ino());
        let held = id(&l.inner.dir_file.metadata().ok()?);
        let now = match fs::metadata(&l.inner.dir) {
            Ok(m) => Ok(Some(id(&m))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(_) => Err(()),
        };
        let dir = l.inner.dir.display();
        match machine::store_place(&held, now.as_ref().map(Option::as_ref).map_err(|_| ())) {
            machine::StorePlace::Same | machine::StorePlace::Unknown => None,
            machine::StorePlace::Replaced => Some(format!(
                "the lease directory {dir} was replaced (or a file system mounted or unmounted \
                 there)"
            )),
            machine::StorePlace::Removed => Some(format!("the lease directory {dir} was removed")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A takeover's listing judges each name after `<stem>.`: a liveness file by its token, a
    /// temporary file always, anything else never.
    #[test]
    fn leftovers_are_known_by_their_names() {
        assert_eq!(live_token(b"7.live"), Some(7));
        assert_eq!(live_token(b"18446744073709551615.live"), Some(u64::MAX));
        assert_eq!(live_token(b"7.live.00000000000000ab.tmp"), None);
        assert_eq!(live_token(b"x.live"), None);
        assert_eq!(live_token(b"lease.json"), None);
        assert!(candidate(b"7.live") && candidate(b"7.live.00000000000000ab.tmp"));
        assert!(candidate(b"lease.json.00000000000000ab.tmp") && candidate(b"lease.json.tmp"));
        assert!(!candidate(b"lease.json") && !candidate(b"lock") && !candidate(b"x.live"));
    }

    /// The instance holds the id until the committed record's expiry, not at it (the expiry
    /// instant belongs to the next holder, `machine::is_expired`), and not after a release or
    /// before any commit.
    #[test]
    fn the_held_flag_lapses_at_the_expiry() {
        let expiry = Timestamp::from_unix_secs(1_700_000_030).unwrap();
        let before = Timestamp::from_unix_secs(1_700_000_029).unwrap();
        let until = AtomicI64::new(i64::MIN);
        assert!(!held_at(&until, before), "held before any commit");
        mark_held(&until, Some(expiry));
        assert!(held_at(&until, before));
        assert!(!held_at(&until, expiry), "held at the expiry instant");
        assert_eq!(
            held_at(&until, expiry),
            !crate::machine::is_expired(expiry, expiry)
        );
        mark_held(&until, None);
        assert!(!held_at(&until, before), "held after a release");
    }
}
