//! The pure transition function: every acquire, renew and release decision lives here.
//!
//! [`step`] maps (record as read, liveness of the recorded generation, what this instance holds
//! locally, now, TTL, event) to a [`Plan`]: the preparation to do, the record to commit, the
//! cleanup to do after the commit, and the [`Outcome`] to report. It never touches the file
//! system, a clock or a thread, so the flock adapter, the in-memory adapter and the model
//! checker interpret the very same decisions.
//!
//! # How an adapter interprets a plan
//!
//! Under the id's stable lock, with the record freshly read:
//!
//! 1. Call [`step`]. If it answers [`Decision::Probe`], probe the liveness lock of that token
//!    (without creating its file), set [`Input::liveness`] and call [`step`] again.
//! 2. Run [`Plan::prepare`] in order. If a step fails, undo the preparation done so far (close
//!    any generation locked by [`Prepare::LockLive`]), report the error and change nothing else.
//! 3. If [`Plan::commit`] is set, replace the record atomically. On failure, undo the
//!    preparation and report the error: the old record stands, the local state is unchanged.
//! 4. Run [`Plan::cleanup`] in order. The record is committed (or nothing was to be
//!    committed), so a cleanup failure is never reported; what it leaves behind is swept later.
//! 5. Report [`Plan::outcome`].
//!
//! After a successful commit, the generation locked by [`Prepare::LockLive`] is the one this
//! instance holds for the id.

use std::time::Duration;

use crate::name::Owner;
use crate::record::Record;
use crate::timestamp::Timestamp;

/// What one transition starts from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Input {
    /// The record as read under the stable lock (`None`: no record file). A corrupt record
    /// never reaches the machine: the adapter reports it as an error.
    pub record: Option<Record>,
    /// Liveness of the recorded generation's lock, once probed (see [`Decision::Probe`]).
    pub liveness: Option<Liveness>,
    /// The generation this instance holds locally for this id, if any.
    pub local: Option<Local>,
    /// The current wall-clock time.
    pub now: Timestamp,
    /// The lease time-to-live.
    pub ttl: Duration,
    /// What the caller asked for.
    pub event: Event,
}

/// A generation whose liveness lock this instance keeps open.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Local {
    /// The generation's token.
    pub token: u64,
    /// The owner it was granted to.
    pub owner: Owner,
}

/// A caller's request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// Acquire the lease for `owner`.
    Acquire {
        /// Who asks.
        owner: Owner,
    },
    /// Renew the lease `(owner, token)`.
    Renew {
        /// The lease's owner.
        owner: Owner,
        /// The lease's token.
        token: u64,
    },
    /// Release the lease `(owner, token)`.
    Release {
        /// The lease's owner.
        owner: Owner,
        /// The lease's token.
        token: u64,
    },
}

/// The state of a generation's liveness lock, as a non-creating, non-blocking probe sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Liveness {
    /// Another open file description holds the lock: its process runs.
    Live,
    /// The file exists and the lock was free: its holder died (or closed it).
    Dead,
    /// The file does not exist, or what stands at its name is not the file the generation
    /// published (a FIFO, a directory, a socket, a symbolic link, a file another program created
    /// there). Not proof of death (an operator or a tmp cleaner may have deleted or replaced
    /// it), so the decision falls back to the record's expiry.
    Unknown,
}

/// The machine's answer for one input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum Decision {
    /// The decision depends on the liveness of generation `token`: probe it and step again
    /// with [`Input::liveness`] set.
    Probe {
        /// The recorded generation's token.
        token: u64,
    },
    /// The work to do.
    Plan(Plan),
}

/// The work one transition does, in order: prepare, commit, clean up; then report.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub struct Plan {
    /// Steps that must succeed before the commit; a failure aborts the transition.
    pub prepare: Vec<Prepare>,
    /// The record to write atomically, if any.
    pub commit: Option<Record>,
    /// Whether, and how strictly, the directory is synced after the rename.
    pub sync_dir: DirSync,
    /// Steps after the commit; their failures are not reported.
    pub cleanup: Vec<Cleanup>,
    /// What to report once the commit (if any) succeeded.
    pub outcome: Outcome,
}

impl Plan {
    /// Whether the record this plan commits keeps the machine's own invariants against the
    /// `input` it was decided on: a new generation's token is the previous one plus one (1
    /// without a record), any other commit keeps the token; a grant's expiry lies after `now`
    /// and no later than `now + ttl`; a tombstone names nobody. A plan that commits nothing
    /// keeps them trivially. The driver asserts it for every plan it runs, in every build (so
    /// every configuration of the model checker runs it too).
    pub fn commit_keeps_invariants(&self, input: &Input) -> bool {
        let Some(commit) = &self.commit else {
            return true;
        };
        let previous = input.record.as_ref().map_or(0, |r| r.token);
        let token_ok = match self.new_generation() {
            Some(local) => {
                previous.checked_add(1) == Some(commit.token) && local.token == commit.token
            }
            None => commit.token == previous,
        };
        let expiry_ok = commit.is_tombstone()
            || (commit.expiry > input.now
                && input
                    .now
                    .checked_add(input.ttl)
                    .is_some_and(|latest| commit.expiry <= latest));
        token_ok && expiry_ok
    }

    /// The generation the plan's preparation locks or checks ([`Prepare::LockLive`] or
    /// [`Prepare::EnsureLive`]), if it has one.
    pub fn prepared_token(&self) -> Option<u64> {
        self.prepare.first().map(|p| match p {
            Prepare::LockLive { token, .. } | Prepare::EnsureLive { token } => *token,
        })
    }

    /// The new generation the plan locks ([`Prepare::LockLive`]), if any: this instance's
    /// local generation once the plan commits.
    pub fn new_generation(&self) -> Option<Local> {
        self.prepare.iter().find_map(|p| match p {
            Prepare::LockLive { token, owner } => Some(Local {
                token: *token,
                owner: owner.clone(),
            }),
            Prepare::EnsureLive { .. } => None,
        })
    }
}

/// Whether the directory is synced after the commit's rename, so the new record survives
/// power loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DirSync {
    /// No sync: a renew's or a refresh's new expiry need not survive power loss (the record
    /// it replaces names the same generation).
    No,
    /// A new owner or token: until the sync succeeds the token could be reissued after power
    /// loss, so a failed sync fails the transition.
    Required,
    /// A release's tombstone: it keeps the token, so losing it to power loss only brings back
    /// the released (dead) generation, which the next acquire replaces with a greater token.
    /// The sync is attempted; its failure is not reported (the record is already committed).
    BestEffort,
}

/// A step before the commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Prepare {
    /// Publish the liveness file of generation `token`, already locked, without blocking (a
    /// backend makes it appear locked under its name, or not at all).
    /// On commit it becomes this instance's local generation for `owner`.
    LockLive {
        /// The new generation's token.
        token: u64,
        /// Its owner.
        owner: Owner,
    },
    /// Make sure the liveness file of the locally held generation `token` is still the file
    /// this instance has locked; publish it again, already locked, if it was deleted or
    /// replaced.
    EnsureLive {
        /// The local generation's token.
        token: u64,
    },
}

/// A step after the commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cleanup {
    /// Close this instance's liveness lock of generation `token` and forget it.
    CloseLocal {
        /// The generation's token.
        token: u64,
    },
    /// Delete the liveness file of generation `token`.
    DeleteLive {
        /// The generation's token.
        token: u64,
    },
    /// Delete the liveness files of every generation below `below` and any leftover
    /// temporary record file: the previous holder did not leave cleanly.
    Sweep {
        /// The new generation's token.
        below: u64,
    },
}

/// The result reported to the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The lease is granted (acquire) or extended (renew).
    Granted {
        /// The generation's fencing token.
        token: u64,
        /// Its new expiry.
        expiry: Timestamp,
    },
    /// Another live holder has it (acquire), or it is lost (renew).
    Held,
    /// Released, or nothing to release.
    Released,
}

/// A transition that cannot be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepError {
    /// A takeover is due but the token is already `u64::MAX`; tokens never wrap.
    TokenExhausted,
    /// `now + ttl` lies past [`Timestamp::MAX`].
    ExpiryOutOfRange,
}

/// Decides one transition. Pure: same input, same answer.
///
/// # Errors
///
/// [`StepError`] when the transition cannot be made at all; nothing is to be done then.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use flocklease::machine::{step, Decision, Event, Input, Outcome};
/// use flocklease::{Owner, Timestamp};
///
/// let input = Input {
///     record: None,
///     liveness: None,
///     local: None,
///     now: Timestamp::from_unix_secs(1_700_000_000).unwrap(),
///     ttl: Duration::from_secs(30),
///     event: Event::Acquire { owner: Owner::new("a").unwrap() },
/// };
/// let Decision::Plan(plan) = step(&input).unwrap() else { unreachable!() };
/// assert!(matches!(plan.outcome, Outcome::Granted { token: 1, .. }));
/// assert_eq!(plan.commit.unwrap().token, 1);
/// ```
pub fn step(input: &Input) -> Result<Decision, StepError> {
    match &input.event {
        Event::Acquire { owner } => acquire(input, owner),
        Event::Renew { owner, token } => Ok(Decision::Plan(renew(input, owner, *token)?)),
        Event::Release { owner, token } => Ok(Decision::Plan(release(input, owner, *token))),
    }
}

fn acquire(input: &Input, owner: &Owner) -> Result<Decision, StepError> {
    let rec = match &input.record {
        Some(rec) if !rec.is_tombstone() => rec,
        // Free: never granted, or released.
        _ => {
            let old = input.record.as_ref().map_or(0, |r| r.token);
            return takeover(input, owner, old, false).map(Decision::Plan);
        }
    };
    if expired(rec, input.now) {
        return takeover(input, owner, rec.token, true).map(Decision::Plan);
    }
    let held_here = input.local.as_ref().is_some_and(|l| l.token == rec.token);
    if held_here {
        if rec.owner == owner.as_str() {
            // Refresh: same generation, fresh expiry.
            let expiry = expiry(input)?;
            return Ok(Decision::Plan(Plan {
                prepare: vec![Prepare::EnsureLive { token: rec.token }],
                commit: Some(Record {
                    owner: rec.owner.clone(),
                    token: rec.token,
                    expiry,
                }),
                sync_dir: DirSync::No,
                cleanup: vec![],
                outcome: Outcome::Granted {
                    token: rec.token,
                    expiry,
                },
            }));
        }
        // This instance holds it for another owner: as good as a live foreign holder.
        return Ok(Decision::Plan(held(vec![])));
    }
    match input.liveness {
        None => Ok(Decision::Probe { token: rec.token }),
        Some(Liveness::Dead) => takeover(input, owner, rec.token, true).map(Decision::Plan),
        // Live, or unknown and unexpired: the holder keeps it.
        Some(Liveness::Live | Liveness::Unknown) => {
            Ok(Decision::Plan(held(close_stale_local(input))))
        }
    }
}

fn renew(input: &Input, owner: &Owner, token: u64) -> Result<Plan, StepError> {
    if !holds(input, owner, token) {
        // Never acquired here, or an earlier call already declared it lost.
        return Ok(held(vec![]));
    }
    if !names(input, owner, token) {
        // A genuine competitor took over: definitive loss.
        return Ok(held(vec![Cleanup::CloseLocal { token }]));
    }
    // Still ours, expired or not: on one host nobody took over in the meantime.
    let expiry = expiry(input)?;
    Ok(Plan {
        prepare: vec![Prepare::EnsureLive { token }],
        commit: Some(Record {
            owner: owner.as_str().to_owned(),
            token,
            expiry,
        }),
        sync_dir: DirSync::No,
        cleanup: vec![],
        outcome: Outcome::Granted { token, expiry },
    })
}

fn release(input: &Input, owner: &Owner, token: u64) -> Plan {
    let released = |cleanup| Plan {
        prepare: vec![],
        commit: None,
        sync_dir: DirSync::No,
        cleanup,
        outcome: Outcome::Released,
    };
    if !holds(input, owner, token) {
        // Stale or foreign: touch nothing.
        return released(vec![]);
    }
    if !names(input, owner, token) {
        // Superseded: only our own lock goes.
        return released(vec![Cleanup::CloseLocal { token }]);
    }
    Plan {
        prepare: vec![],
        commit: Some(Record {
            owner: String::new(),
            token,
            expiry: input.now,
        }),
        sync_dir: DirSync::BestEffort,
        cleanup: vec![Cleanup::DeleteLive { token }, Cleanup::CloseLocal { token }],
        outcome: Outcome::Released,
    }
}

/// A new generation `old + 1` for `owner`. The new liveness lock is taken before the commit;
/// the previous local generation is closed only after it, so a failed commit loses nothing.
fn takeover(input: &Input, owner: &Owner, old: u64, unclean: bool) -> Result<Plan, StepError> {
    let token = old.checked_add(1).ok_or(StepError::TokenExhausted)?;
    let expiry = expiry(input)?;
    let mut cleanup: Vec<Cleanup> = input
        .local
        .iter()
        .map(|l| Cleanup::CloseLocal { token: l.token })
        .collect();
    if unclean {
        // The previous holder crashed or overran its TTL: its liveness file (and maybe
        // leftovers of earlier crashes) is garbage now.
        cleanup.push(Cleanup::Sweep { below: token });
    } else if input.record.is_some() {
        // From a tombstone: the release deleted its generation's file unless that cleanup
        // failed; delete it now (one unlink, no directory scan on the hot path).
        cleanup.push(Cleanup::DeleteLive { token: old });
    }
    Ok(Plan {
        prepare: vec![Prepare::LockLive {
            token,
            owner: owner.clone(),
        }],
        commit: Some(Record {
            owner: owner.as_str().to_owned(),
            token,
            expiry,
        }),
        sync_dir: DirSync::Required,
        cleanup,
        outcome: Outcome::Granted { token, expiry },
    })
}

fn held(cleanup: Vec<Cleanup>) -> Plan {
    Plan {
        prepare: vec![],
        commit: None,
        sync_dir: DirSync::No,
        cleanup,
        outcome: Outcome::Held,
    }
}

/// A local generation that is no longer the recorded one is dead weight: close it.
fn close_stale_local(input: &Input) -> Vec<Cleanup> {
    let current = input.record.as_ref().map(|r| r.token);
    input
        .local
        .iter()
        .filter(|l| Some(l.token) != current)
        .map(|l| Cleanup::CloseLocal { token: l.token })
        .collect()
}

/// Whether this instance holds generation `token` for `owner`.
fn holds(input: &Input, owner: &Owner, token: u64) -> bool {
    input
        .local
        .as_ref()
        .is_some_and(|l| l.token == token && l.owner == *owner)
}

/// Whether the record names generation `(owner, token)`.
fn names(input: &Input, owner: &Owner, token: u64) -> bool {
    input
        .record
        .as_ref()
        .is_some_and(|r| r.token == token && r.owner == owner.as_str())
}

/// Whether a fenced section of generation `(owner, token)` may run (and, for a backend that
/// commits the section's writes at its end, commit) with `record` read under the id's
/// transition lock (flock) or the lease row's share lock (PostgreSQL) at `now`: the record
/// names the generation and has not expired, and this instance holds the generation
/// (`held_here`: its liveness lock is this instance's). While the lock is held no takeover
/// can commit, so the answer stays true until the section ends (but for the expiry, which a
/// backend whose writes commit at the end checks again then).
///
/// ```
/// use std::time::Duration;
/// use flocklease::machine::fence_holds;
/// use flocklease::{Owner, Record, Timestamp};
///
/// let now = Timestamp::from_unix_secs(1_700_000_000).unwrap();
/// let a = Owner::new("a").unwrap();
/// let rec = Record { owner: "a".into(), token: 7, expiry: now.checked_add(Duration::from_secs(5)).unwrap() };
/// assert!(fence_holds(Some(&rec), &a, 7, true, now));
/// assert!(!fence_holds(Some(&rec), &a, 6, true, now)); // superseded
/// assert!(!fence_holds(Some(&rec), &a, 7, false, now)); // not held here
/// assert!(!fence_holds(Some(&rec), &a, 7, true, rec.expiry)); // expired
/// ```
pub fn fence_holds(
    record: Option<&Record>,
    owner: &Owner,
    token: u64,
    held_here: bool,
    now: Timestamp,
) -> bool {
    held_here
        && record.is_some_and(|r| {
            !r.is_tombstone() && r.token == token && r.owner == owner.as_str() && !expired(r, now)
        })
}

/// What stands at a generation's liveness name, as a probe learns it with one system call:
/// with a tag to compare, a positioned read of the first bytes (which tells a directory,
/// `EISDIR`, and a FIFO, `ESPIPE`, without a `stat`); without one, a `stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtName<'a> {
    /// A regular file; its first bytes (one more than the tag's length at most) when a tag is
    /// to be compared, else nothing.
    File {
        /// The bytes read from its start.
        first: &'a [u8],
    },
    /// A directory.
    Directory,
    /// A FIFO.
    Fifo,
    /// Anything else: a socket, a device (a symbolic link or another user's file is refused
    /// when opened, before anything is read).
    Other,
}

/// Why what stands at a generation's liveness name is not its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotOwn {
    /// A directory.
    Directory,
    /// A FIFO.
    Fifo,
    /// Not a regular file.
    Other,
    /// A regular file that does not carry the tag the record names (put at its name by
    /// someone else: a plant, a copy of another generation, an earlier file of this one
    /// moved back after a restore).
    Tag,
}

/// Whether what stands at a generation's liveness name (`found`) is the file the generation
/// published, whose lock then tells whether its holder lives: with the record naming a tag
/// (`tag`, as its file carries it), only a regular file holding exactly those bytes is; with
/// none (a record of the Go package), any regular file is, and the lock alone decides.
///
/// ```
/// use flocklease::machine::{own_liveness, AtName, NotOwn};
///
/// let tag = b"00000000000000ab";
/// assert_eq!(own_liveness(Some(tag), AtName::File { first: tag }), Ok(()));
/// assert_eq!(own_liveness(Some(tag), AtName::File { first: b"" }), Err(NotOwn::Tag));
/// assert_eq!(own_liveness(None, AtName::File { first: b"" }), Ok(()));
/// assert_eq!(own_liveness(None, AtName::Fifo), Err(NotOwn::Fifo));
/// ```
pub fn own_liveness(tag: Option<&[u8]>, found: AtName<'_>) -> Result<(), NotOwn> {
    match (found, tag) {
        (AtName::File { first }, Some(tag)) if first == tag => Ok(()),
        (AtName::File { .. }, Some(_)) => Err(NotOwn::Tag),
        (AtName::File { .. }, None) => Ok(()),
        (AtName::Directory, _) => Err(NotOwn::Directory),
        (AtName::Fifo, _) => Err(NotOwn::Fifo),
        (AtName::Other, _) => Err(NotOwn::Other),
    }
}

/// Why a transition may not make its commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitRefused {
    /// The transition lock this transition holds is no longer the file at the lock's path
    /// (deleted, replaced, or moved aside while another transition took a new one).
    Lock,
    /// The record at its path is no longer the one this transition read (or its absence):
    /// another transition committed beside this one, whatever became of the lock since.
    Record,
}

/// Where an instance's store stands, judged from the identity of what it opened (`held`) and
/// of what is at its path now (`at_path`: `Ok(None)` when nothing is, `Err(())` when the look
/// failed for another reason). Identities are the backend's (a device and inode for flock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorePlace {
    /// The store at the path is the one opened.
    Same,
    /// Something else is at the path: the store was replaced, or a file system mounted over
    /// it or unmounted from under it.
    Replaced,
    /// Nothing is at the path: the store was removed.
    Removed,
    /// The look failed (permissions, I/O): not a loss by itself.
    Unknown,
}

/// [`StorePlace`] of a store opened as `held` whose path now shows `at_path`.
///
/// ```
/// use flocklease::machine::{store_place, StorePlace};
///
/// assert_eq!(store_place(&(1, 2), Ok(Some(&(1, 2)))), StorePlace::Same);
/// assert_eq!(store_place(&(1, 2), Ok(Some(&(1, 3)))), StorePlace::Replaced);
/// assert_eq!(store_place::<(u64, u64)>(&(1, 2), Ok(None)), StorePlace::Removed);
/// assert_eq!(store_place::<(u64, u64)>(&(1, 2), Err(())), StorePlace::Unknown);
/// ```
pub fn store_place<I: PartialEq>(held: &I, at_path: Result<Option<&I>, ()>) -> StorePlace {
    match at_path {
        Ok(Some(now)) if now == held => StorePlace::Same,
        Ok(Some(_)) => StorePlace::Replaced,
        Ok(None) => StorePlace::Removed,
        Err(()) => StorePlace::Unknown,
    }
}

/// The commit check, one system call before the commit: a transition commits only while the
/// lock it holds (`held`) is the one at the lock's path (`lock_at`, `None` when the path is
/// empty), and while the record at its path (`record_at`) is the one it read (`read`; `None`
/// when it read none, so nothing to compare; `Some(None)` when the record was absent). The
/// lock is judged first: its answer is the one a caller reports. Identities are whatever the
/// backend compares (a device and inode for flock: the record read's taken from its
/// descriptor, held open from the read through this check, so that no other file can have
/// them meanwhile; PROTOCOL §11).
///
/// ```
/// use flocklease::machine::{commit_check, CommitRefused};
///
/// assert_eq!(commit_check(&1, Some(&1), Some(Some(&7)), Some(&7)), Ok(()));
/// assert_eq!(commit_check(&1, None, Some(Some(&7)), Some(&7)), Err(CommitRefused::Lock));
/// // The lock put back after another transition's whole commit: the record tells.
/// assert_eq!(commit_check(&1, Some(&1), Some(Some(&7)), Some(&8)), Err(CommitRefused::Record));
/// assert_eq!(commit_check(&1, Some(&1), Some(None), Some(&8)), Err(CommitRefused::Record));
/// ```
pub fn commit_check<L: PartialEq, R: PartialEq>(
    held: &L,
    lock_at: Option<&L>,
    read: Option<Option<&R>>,
    record_at: Option<&R>,
) -> Result<(), CommitRefused> {
    if lock_at != Some(held) {
        return Err(CommitRefused::Lock);
    }
    match read {
        Some(read) if read != record_at => Err(CommitRefused::Record),
        _ => Ok(()),
    }
}

/// Until when the instance that has just committed `committed` holds the id: the record's
/// expiry, or none for a release's tombstone. The flock backend sets the flag its waiting
/// acquires' look reads (`acquire_wait`: an instance that holds the id tries at once, out of
/// the line's order) from it at each commit point — at the commit, not at the generation's
/// close, so a release's waiters of the same instance keep their places (PROTOCOL §9.2); the
/// line model's release sets its holder's flag from it too.
pub fn held_until(committed: Option<&Record>) -> Option<Timestamp> {
    committed.filter(|r| !r.is_tombstone()).map(|r| r.expiry)
}

/// Whether a lease expiring at `expiry` is expired at `now`: `now >= expiry` (the boundary
/// instant belongs to the next holder). The one definition of expiry, for adapters, the
/// keep-alive and status reports alike.
pub fn is_expired(expiry: Timestamp, now: Timestamp) -> bool {
    now >= expiry
}

fn expired(rec: &Record, now: Timestamp) -> bool {
    is_expired(rec.expiry, now)
}

/// Whether an acquire by an owner this instance holds nothing for would be granted now, given
/// the record and its generation's liveness: what status reports call free (`Ok(true)`) or
/// held (`Ok(false)`). [`StepError::TokenExhausted`] when a takeover is due but impossible.
///
/// ```
/// use std::time::Duration;
/// use flocklease::machine::{free_for_others, Liveness};
/// use flocklease::{Record, Timestamp};
///
/// let now = Timestamp::from_unix_secs(1_700_000_000).unwrap();
/// let rec = Record { owner: "a".into(), token: 7, expiry: now.checked_add(Duration::from_secs(5)).unwrap() };
/// assert_eq!(free_for_others(Some(&rec), Liveness::Live, now), Ok(false));
/// assert_eq!(free_for_others(Some(&rec), Liveness::Dead, now), Ok(true));
/// assert_eq!(free_for_others(None, Liveness::Unknown, now), Ok(true));
/// ```
///
/// # Errors
///
/// [`StepError`], as [`step`] would answer the acquire.
pub fn free_for_others(
    record: Option<&Record>,
    liveness: Liveness,
    now: Timestamp,
) -> Result<bool, StepError> {
    let stranger = Owner::new("\u{fffd}status").unwrap_or_else(|_| unreachable!("valid owner"));
    let input = Input {
        record: record.cloned(),
        liveness: Some(liveness),
        local: None,
        now,
        // Any TTL that keeps the new expiry in range: only the outcome is looked at.
        ttl: Duration::ZERO,
        event: Event::Acquire { owner: stranger },
    };
    match step(&input)? {
        Decision::Plan(p) => Ok(matches!(p.outcome, Outcome::Granted { .. })),
        Decision::Probe { .. } => unreachable!("the machine asked for a liveness it was given"),
    }
}

/// What an acquirer answered [`Outcome::Held`] waits for before it asks the machine again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Wait {
    /// The recorded generation, whose liveness lock ends with its holder.
    pub token: u64,
    /// How long until its expiry, which ends the wait too.
    pub until_expiry: Duration,
}

/// What to wait for, given the record read without the transition lock: the end of its
/// generation or its expiry, whichever comes first. `None` when the record names no holder to
/// wait for (released, or expired at `now`): ask again at once. Waiting decides nothing; the
/// next [`step`] does.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use flocklease::machine::{wait_for, Wait};
/// use flocklease::{Record, Timestamp};
///
/// let now = Timestamp::from_unix_secs(1_700_000_000).unwrap();
/// let held = Record { owner: "a".into(), token: 7, expiry: now.checked_add(Duration::from_secs(5)).unwrap() };
/// assert_eq!(wait_for(&held, now), Some(Wait { token: 7, until_expiry: Duration::from_secs(5) }));
/// let released = Record { owner: String::new(), ..held };
/// assert_eq!(wait_for(&released, now), None);
/// ```
pub fn wait_for(record: &Record, now: Timestamp) -> Option<Wait> {
    if record.is_tombstone() || expired(record, now) {
        return None;
    }
    Some(Wait {
        token: record.token,
        until_expiry: record.expiry.saturating_duration_since(now),
    })
}

/// How many renews the front's final expiry check makes of a grant that keeps expiring before
/// it is returned ([`at_return`]).
pub const RECLAIMS: usize = 3;

/// What the front does with a granted lease (of an acquire or a renew) as the call returns
/// ([`at_return`]; PROTOCOL §5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtReturn {
    /// Return it: it is unexpired on the backend's clock.
    Return,
    /// Renew it first: it expired before the call could return (a stopped or descheduled
    /// process between the commit and the return); the renew succeeds only if nobody took
    /// over meanwhile, and its grant is judged again.
    Renew,
    /// Answer lost ([`Grant::Held`](crate::Grant::Held)): still expired after
    /// [`RECLAIMS`] renews (a TTL shorter than a call).
    Lost,
}

/// The front's final expiry check: no call returns a lease already expired. `expiry` is the
/// grant's, `now` the backend's clock as the call returns, `renewed` how many renews the call
/// already made for this check. The front and the model checker both ask it.
///
/// ```
/// use flocklease::Timestamp;
/// use flocklease::machine::{AtReturn, RECLAIMS, at_return};
///
/// let t = |s| Timestamp::from_unix_secs(s).unwrap();
/// assert_eq!(at_return(t(10), t(9), 0), AtReturn::Return);
/// // Expiry is at `now >= expiry`, as everywhere.
/// assert_eq!(at_return(t(10), t(10), 0), AtReturn::Renew);
/// assert_eq!(at_return(t(10), t(11), RECLAIMS), AtReturn::Lost);
/// ```
pub fn at_return(expiry: Timestamp, now: Timestamp, renewed: usize) -> AtReturn {
    if !is_expired(expiry, now) {
        AtReturn::Return
    } else if renewed < RECLAIMS {
        AtReturn::Renew
    } else {
        AtReturn::Lost
    }
}

/// A call's final expiry check as the call goes on (PROTOCOL §5.3): the answer of each of the
/// call's runs goes in ([`FinalCheck::next`]), what the call does next comes out — return an
/// answer, or renew the grant first and bring that renew's answer back. It counts the renews
/// and decides each grant with [`at_return`]. The front, the model checker and both lockstep
/// harnesses advance this one value.
///
/// ```
/// use flocklease::Timestamp;
/// use flocklease::machine::{FinalCheck, Outcome, Then};
///
/// let t = |s| Timestamp::from_unix_secs(s).unwrap();
/// let mut check = FinalCheck::default();
/// // A grant that expired before the call could return: renew it first.
/// let first: Result<Outcome, ()> = Ok(Outcome::Granted { token: 7, expiry: t(10) });
/// assert_eq!(check.next(first, || t(10)), Then::Renew { token: 7 });
/// // The renew's grant is unexpired: the call returns it.
/// let renewed: Result<Outcome, ()> = Ok(Outcome::Granted { token: 7, expiry: t(40) });
/// assert_eq!(check.next(renewed, || t(11)), Then::Return(renewed));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FinalCheck {
    /// How many renews the check made so far.
    renewed: u8,
}

/// What a call does after one of its runs answered ([`FinalCheck::next`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then<E> {
    /// Return this answer to the caller.
    Return(Result<Outcome, E>),
    /// Renew the grant of this token first (same owner), and bring the renew's answer back.
    Renew {
        /// The grant's token.
        token: u64,
    },
}

impl FinalCheck {
    /// What the call does with `answer` (of its acquire or renew, or of a renew this check
    /// asked for), `now` being the backend's clock as the call would return (read only for a
    /// grant): a grant as [`at_return`] decides (returned; renewed first; or answered
    /// [`Outcome::Held`], lost); an error of a renew the check asked for answered held too
    /// (the call's first answer committed, and an error after a commit is never reported);
    /// any other answer as it is.
    pub fn next<E>(
        &mut self,
        answer: Result<Outcome, E>,
        now: impl FnOnce() -> Timestamp,
    ) -> Then<E> {
        match answer {
            Ok(Outcome::Granted { token, expiry }) => {
                match at_return(expiry, now(), usize::from(self.renewed)) {
                    AtReturn::Return => Then::Return(answer),
                    AtReturn::Lost => Then::Return(Ok(Outcome::Held)),
                    AtReturn::Renew => {
                        self.renewed += 1;
                        Then::Renew { token }
                    }
                }
            }
            Err(_) if self.renewed > 0 => Then::Return(Ok(Outcome::Held)),
            other => Then::Return(other),
        }
    }

    /// How many renews the check made so far.
    pub fn renewed(&self) -> u8 {
        self.renewed
    }
}

/// Where a deferred [`Cleanup::Sweep`] may run. An adapter may do a takeover's sweep in two
/// parts (see [`Transaction::cleanup`](crate::driver::Transaction::cleanup)): the dead generation
/// at once, the rest at its next transition on the id, under the transition lock. That later
/// transition removes generations below the returned token: below the takeover's `below`,
/// and never at or above the token of the record it read, because tokens go back when a
/// record is deleted or restored by hand, and a generation below the takeover's token may then
/// be live. `record_token` is the token of the record that transition read, `None` when it
/// read no record: then nothing is known to be superseded, and the answer is `None`.
///
/// ```
/// use flocklease::machine::deferred_sweep_below;
///
/// assert_eq!(deferred_sweep_below(9, Some(9)), Some(9));
/// // The record was deleted and tokens restarted at 1: generation 1 may be live.
/// assert_eq!(deferred_sweep_below(9, Some(1)), Some(1));
/// assert_eq!(deferred_sweep_below(9, None), None);
/// ```
pub fn deferred_sweep_below(below: u64, record_token: Option<u64>) -> Option<u64> {
    record_token.map(|token| below.min(token))
}

/// What a resource-side fence does with a token, given the highest token it admitted before
/// (`None`: none yet). The one rule of [`Fence`](crate::Fence): a token lower than one admitted
/// before is refused; an equal one is admitted (the same lease writes many times); a greater
/// one is admitted and becomes the highest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use]
pub enum FenceStep {
    /// Refuse the token: a greater one was admitted. Nothing changes.
    Refuse {
        /// The highest token admitted.
        highest: u64,
    },
    /// Admit the token.
    Admit {
        /// The new highest token to store durably before anything the token guards is done;
        /// `None` when the token already is the highest (nothing to store).
        record: Option<u64>,
    },
}

/// Decides what a fence does with `token` when the highest token admitted before is
/// `highest`: see [`FenceStep`].
///
/// # Examples
///
/// ```
/// use flocklease::machine::{fence_step, FenceStep};
///
/// assert_eq!(fence_step(None, 3), FenceStep::Admit { record: Some(3) });
/// assert_eq!(fence_step(Some(3), 3), FenceStep::Admit { record: None });
/// assert_eq!(fence_step(Some(3), 4), FenceStep::Admit { record: Some(4) });
/// assert_eq!(fence_step(Some(3), 2), FenceStep::Refuse { highest: 3 });
/// ```
pub fn fence_step(highest: Option<u64>, token: u64) -> FenceStep {
    match highest {
        Some(highest) if token < highest => FenceStep::Refuse { highest },
        Some(highest) if token == highest => FenceStep::Admit { record: None },
        _ => FenceStep::Admit {
            record: Some(token),
        },
    }
}

fn expiry(input: &Input) -> Result<Timestamp, StepError> {
    input
        .now
        .checked_add(input.ttl)
        .ok_or(StepError::ExpiryOutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_unix_secs(1_700_000_000 + secs).unwrap()
    }
    fn o(s: &str) -> Owner {
        Owner::new(s).unwrap()
    }
    fn rec(owner: &str, token: u64, expiry: i64) -> Option<Record> {
        Some(Record {
            owner: owner.into(),
            token,
            expiry: t(expiry),
        })
    }
    fn local(owner: &str, token: u64) -> Option<Local> {
        Some(Local {
            token,
            owner: o(owner),
        })
    }
    fn input(record: Option<Record>, local: Option<Local>, now: i64, event: Event) -> Input {
        Input {
            record,
            liveness: None,
            local,
            now: t(now),
            ttl: TTL,
            event,
        }
    }
    fn acq(owner: &str) -> Event {
        Event::Acquire { owner: o(owner) }
    }
    fn renew_ev(owner: &str, token: u64) -> Event {
        Event::Renew {
            owner: o(owner),
            token,
        }
    }
    fn rel(owner: &str, token: u64) -> Event {
        Event::Release {
            owner: o(owner),
            token,
        }
    }
    fn plan(i: &Input) -> Plan {
        match step(i).unwrap() {
            Decision::Plan(p) => p,
            d => panic!("expected a plan, got {d:?}"),
        }
    }
    fn granted(token: u64, now: i64) -> Outcome {
        Outcome::Granted {
            token,
            expiry: t(now + 30),
        }
    }
    fn takeover_plan(owner: &str, token: u64, now: i64, cleanup: Vec<Cleanup>) -> Plan {
        Plan {
            prepare: vec![Prepare::LockLive {
                token,
                owner: o(owner),
            }],
            commit: rec(owner, token, now + 30),
            sync_dir: DirSync::Required,
            cleanup,
            outcome: granted(token, now),
        }
    }

    // PROTOCOL §9.2: the held flag follows the committed record.
    #[test]
    fn the_instance_holds_until_the_committed_expiry_and_not_after_a_release() {
        assert_eq!(held_until(rec("a", 3, 30).as_ref()), Some(t(30)));
        assert_eq!(held_until(rec("", 3, 30).as_ref()), None);
        assert_eq!(held_until(None), None);
    }

    // PROTOCOL §3.1, row 1: absent or tombstone -> takeover with old + 1.
    #[test]
    fn acquire_absent_grants_token_one() {
        let p = plan(&input(None, None, 0, acq("a")));
        assert_eq!(p, takeover_plan("a", 1, 0, vec![]));
    }

    #[test]
    fn acquire_tombstone_grants_next_token_even_if_unexpired() {
        let p = plan(&input(rec("", 4, 100), None, 0, acq("b")));
        // The released generation's file goes too, in case the release could not delete it.
        assert_eq!(
            p,
            takeover_plan("b", 5, 0, vec![Cleanup::DeleteLive { token: 4 }])
        );
    }

    // Row 2: owner = caller, unexpired, held locally -> refresh, same token.
    #[test]
    fn acquire_refreshes_own_local_generation() {
        let p = plan(&input(rec("a", 3, 10), local("a", 3), 5, acq("a")));
        assert_eq!(
            p,
            Plan {
                prepare: vec![Prepare::EnsureLive { token: 3 }],
                commit: rec("a", 3, 35),
                sync_dir: DirSync::No,
                cleanup: vec![],
                outcome: granted(3, 5),
            }
        );
    }

    #[test]
    fn acquire_by_other_owner_of_a_local_generation_is_held_without_probe() {
        let p = plan(&input(rec("a", 3, 10), local("a", 3), 5, acq("b")));
        assert_eq!(p, held(vec![]));
    }

    // Row 3: unexpired, not held locally -> probe; live -> held; dead -> takeover.
    #[test]
    fn acquire_unexpired_foreign_needs_a_probe() {
        let i = input(rec("a", 3, 10), None, 5, acq("b"));
        assert_eq!(step(&i), Ok(Decision::Probe { token: 3 }));
        // Same owner string in another instance counts as foreign.
        let i = input(rec("a", 3, 10), None, 5, acq("a"));
        assert_eq!(step(&i), Ok(Decision::Probe { token: 3 }));
    }

    #[test]
    fn acquire_live_holder_is_held() {
        let mut i = input(rec("a", 3, 10), None, 5, acq("b"));
        i.liveness = Some(Liveness::Live);
        assert_eq!(plan(&i), held(vec![]));
    }

    #[test]
    fn acquire_dead_holder_is_taken_over_at_once() {
        let mut i = input(rec("a", 3, 10), None, 5, acq("b"));
        i.liveness = Some(Liveness::Dead);
        assert_eq!(
            plan(&i),
            takeover_plan("b", 4, 5, vec![Cleanup::Sweep { below: 4 }])
        );
    }

    #[test]
    fn acquire_missing_liveness_file_falls_back_to_expiry() {
        let mut i = input(rec("a", 3, 10), None, 5, acq("b"));
        i.liveness = Some(Liveness::Unknown);
        assert_eq!(plan(&i), held(vec![]));
        // Once expired, no probe is needed at all.
        let i = input(rec("a", 3, 10), None, 10, acq("b"));
        assert_eq!(
            plan(&i),
            takeover_plan("b", 4, 10, vec![Cleanup::Sweep { below: 4 }])
        );
    }

    #[test]
    fn acquire_held_closes_a_stale_local_generation() {
        let mut i = input(rec("b", 4, 10), local("a", 3), 5, acq("a"));
        i.liveness = Some(Liveness::Live);
        assert_eq!(plan(&i), held(vec![Cleanup::CloseLocal { token: 3 }]));
    }

    // Row 4: expired -> takeover even if the old holder runs; boundary is expired.
    #[test]
    fn acquire_expired_is_taken_over_at_the_boundary() {
        let i = input(rec("a", 3, 10), None, 10, acq("b"));
        assert_eq!(
            step(&i),
            Ok(Decision::Plan(takeover_plan(
                "b",
                4,
                10,
                vec![Cleanup::Sweep { below: 4 }]
            )))
        );
        let mut before = input(rec("a", 3, 10), None, 9, acq("b"));
        assert_eq!(step(&before), Ok(Decision::Probe { token: 3 }));
        before.liveness = Some(Liveness::Live);
        assert_eq!(plan(&before).outcome, Outcome::Held);
    }

    #[test]
    fn acquire_expired_own_local_generation_closes_it_after_commit() {
        let p = plan(&input(rec("a", 3, 10), local("a", 3), 40, acq("a")));
        assert_eq!(
            p,
            takeover_plan(
                "a",
                4,
                40,
                vec![
                    Cleanup::CloseLocal { token: 3 },
                    Cleanup::Sweep { below: 4 }
                ]
            )
        );
    }

    // Row 5: token exhausted.
    #[test]
    fn acquire_never_wraps_the_token() {
        for r in [rec("", u64::MAX, 0), rec("a", u64::MAX, 0)] {
            let i = input(r, None, 10, acq("b"));
            assert_eq!(step(&i), Err(StepError::TokenExhausted));
        }
        let mut i = input(rec("a", u64::MAX, 100), None, 10, acq("b"));
        i.liveness = Some(Liveness::Dead);
        assert_eq!(step(&i), Err(StepError::TokenExhausted));
        // Renew of the last token still works: it does not raise the token.
        let i = input(
            rec("a", u64::MAX, 100),
            local("a", u64::MAX),
            10,
            renew_ev("a", u64::MAX),
        );
        assert_eq!(plan(&i).outcome, granted(u64::MAX, 10));
    }

    #[test]
    fn expiry_past_the_representable_range_is_an_error() {
        let mut i = input(None, None, 0, acq("a"));
        i.now = Timestamp::MAX;
        assert_eq!(step(&i), Err(StepError::ExpiryOutOfRange));
    }

    // PROTOCOL §3.2.
    #[test]
    fn renew_not_held_locally_is_held() {
        let i = input(rec("a", 3, 10), None, 5, renew_ev("a", 3));
        assert_eq!(plan(&i), held(vec![]));
        // A copy with another token or owner than the local generation.
        let i = input(rec("a", 3, 10), local("a", 3), 5, renew_ev("a", 2));
        assert_eq!(plan(&i), held(vec![]));
        let i = input(rec("a", 3, 10), local("a", 3), 5, renew_ev("b", 3));
        assert_eq!(plan(&i), held(vec![]));
    }

    #[test]
    fn renew_after_takeover_is_definitive_loss() {
        for r in [rec("b", 4, 40), rec("", 3, 20), None, rec("b", 3, 40)] {
            let i = input(r, local("a", 3), 35, renew_ev("a", 3));
            assert_eq!(plan(&i), held(vec![Cleanup::CloseLocal { token: 3 }]));
        }
    }

    #[test]
    fn renew_extends_with_the_same_token_even_after_expiry() {
        for now in [5, 10, 1000] {
            let i = input(rec("a", 3, 10), local("a", 3), now, renew_ev("a", 3));
            assert_eq!(
                plan(&i),
                Plan {
                    prepare: vec![Prepare::EnsureLive { token: 3 }],
                    commit: rec("a", 3, now + 30),
                    sync_dir: DirSync::No,
                    cleanup: vec![],
                    outcome: granted(3, now),
                }
            );
        }
    }

    // PROTOCOL §3.3.
    #[test]
    fn release_stale_or_foreign_touches_nothing() {
        let released = Plan {
            prepare: vec![],
            commit: None,
            sync_dir: DirSync::No,
            cleanup: vec![],
            outcome: Outcome::Released,
        };
        // Never acquired here.
        assert_eq!(
            plan(&input(rec("a", 3, 10), None, 5, rel("a", 3))),
            released
        );
        // Held here under another owner or token.
        assert_eq!(
            plan(&input(rec("a", 3, 10), local("a", 3), 5, rel("b", 3))),
            released
        );
        assert_eq!(
            plan(&input(rec("a", 3, 10), local("a", 3), 5, rel("a", 2))),
            released
        );
    }

    #[test]
    fn release_of_a_superseded_generation_only_closes_its_lock() {
        let p = plan(&input(rec("b", 4, 40), local("a", 3), 35, rel("a", 3)));
        assert_eq!(
            p,
            Plan {
                prepare: vec![],
                commit: None,
                sync_dir: DirSync::No,
                cleanup: vec![Cleanup::CloseLocal { token: 3 }],
                outcome: Outcome::Released,
            }
        );
    }

    #[test]
    fn release_writes_a_tombstone_with_the_same_token() {
        for now in [5, 50] {
            let p = plan(&input(rec("a", 3, 10), local("a", 3), now, rel("a", 3)));
            assert_eq!(
                p,
                Plan {
                    prepare: vec![],
                    commit: rec("", 3, now),
                    // The tombstone keeps the token: its durability is best effort.
                    sync_dir: DirSync::BestEffort,
                    cleanup: vec![
                        Cleanup::DeleteLive { token: 3 },
                        Cleanup::CloseLocal { token: 3 }
                    ],
                    outcome: Outcome::Released,
                }
            );
        }
    }

    #[test]
    fn a_waiter_waits_for_a_live_generation_until_its_expiry_and_never_at_or_past_it() {
        let r = rec("a", 3, 10).unwrap();
        assert_eq!(
            wait_for(&r, t(4)),
            Some(Wait {
                token: 3,
                until_expiry: Duration::from_secs(6)
            })
        );
        // The expiry instant belongs to the next holder, as for `step`.
        assert_eq!(wait_for(&r, t(10)), None);
        assert_eq!(wait_for(&r, t(11)), None);
        assert_eq!(wait_for(&rec("", 3, 10).unwrap(), t(4)), None);
        // Whenever the waiter is told to ask again at once, `step` lets it acquire.
        for (r, now) in [(rec("a", 3, 10), 10), (rec("", 3, 10), 4)] {
            let p = plan(&input(r, None, now, acq("b")));
            assert!(matches!(p.outcome, Outcome::Granted { token: 4, .. }));
        }
    }

    #[test]
    fn a_deferred_sweep_stays_below_the_takeover_and_the_record_read_later() {
        assert_eq!(deferred_sweep_below(5, Some(9)), Some(5));
        assert_eq!(deferred_sweep_below(5, Some(5)), Some(5));
        assert_eq!(deferred_sweep_below(5, Some(2)), Some(2));
        assert_eq!(deferred_sweep_below(5, None), None);
    }

    #[test]
    fn a_fence_refuses_only_tokens_below_the_highest_and_stores_only_greater_ones() {
        for highest in [None, Some(0), Some(1), Some(7), Some(u64::MAX)] {
            for token in [0, 1, 6, 7, 8, u64::MAX - 1, u64::MAX] {
                let step = fence_step(highest, token);
                let expected = match highest {
                    Some(h) if token < h => FenceStep::Refuse { highest: h },
                    Some(h) if token == h => FenceStep::Admit { record: None },
                    _ => FenceStep::Admit {
                        record: Some(token),
                    },
                };
                assert_eq!(step, expected, "highest {highest:?}, token {token}");
            }
        }
    }

    #[test]
    fn step_is_deterministic() {
        let i = input(rec("a", 3, 10), local("a", 3), 5, acq("a"));
        assert_eq!(step(&i), step(&i.clone()));
    }

    #[test]
    fn the_final_check_returns_an_unexpired_grant_or_a_held_answer_without_a_renew() {
        type Answer = Result<Outcome, &'static str>;
        let granted: Answer = Ok(Outcome::Granted {
            token: 7,
            expiry: t(101),
        });
        assert_eq!(
            FinalCheck::default().next(granted, || t(100)),
            Then::Return(granted)
        );
        let held: Answer = Ok(Outcome::Held);
        let read_clock = || -> Timestamp { panic!("the clock is read for a grant only") };
        assert_eq!(
            FinalCheck::default().next(held, read_clock),
            Then::Return(held)
        );
        // The call's own error (no renew asked for) is the caller's.
        let failed: Answer = Err("io");
        assert_eq!(
            FinalCheck::default().next(failed, read_clock),
            Then::Return(failed)
        );
    }

    #[test]
    fn the_final_check_renews_an_expired_grant_or_answers_lost() {
        type Answer = Result<Outcome, &'static str>;
        let granted = |expiry| -> Answer {
            Ok(Outcome::Granted {
                token: 7,
                expiry: t(expiry),
            })
        };
        // At the expiry is expired (PROTOCOL §5.1: expiry <= now): renewed, then returned.
        let mut check = FinalCheck::default();
        assert_eq!(
            check.next(granted(100), || t(100)),
            Then::Renew { token: 7 }
        );
        assert_eq!(
            check.next(granted(130), || t(100)),
            Then::Return(granted(130))
        );
        // Taken over meanwhile: the renew's held answer is the call's.
        let mut check = FinalCheck::default();
        assert_eq!(check.next(granted(90), || t(100)), Then::Renew { token: 7 });
        let held: Answer = Ok(Outcome::Held);
        assert_eq!(check.next(held, || t(100)), Then::Return(held));
        // A renew that keeps coming back expired: tried a few times, then lost.
        let mut check = FinalCheck::default();
        let renews = (0..=RECLAIMS)
            .take_while(|_| check.next(granted(95), || t(100)) == (Then::Renew { token: 7 }))
            .count();
        assert_eq!(renews, RECLAIMS);
        assert_eq!(
            check.next(granted(95), || t(100)),
            Then::Return(Ok(Outcome::Held))
        );
        assert_eq!(usize::from(check.renewed()), RECLAIMS);
        // A renew's error: lost, not an error (the first answer's commit happened).
        let mut check = FinalCheck::default();
        assert_eq!(check.next(granted(90), || t(100)), Then::Renew { token: 7 });
        assert_eq!(
            check.next(Err("io"), || t(100)),
            Then::Return(Ok(Outcome::Held))
        );
    }
}
