//! The network seam of [`PgLease`](super::PgLease): every statement a transition sends is
//! named by a [`PgStep`], and a test build (feature `fault-injection`) can make any one of them
//! fail ([`PgFault::Fail`]: the server answers an error) or lose its reply after the server
//! ran it ([`PgFault::LoseReply`]: an unknown outcome, the connection is then dropped). A
//! dropped connection is injected by the hook itself: it receives the backend pid of the
//! connection about to run the step and may end that session (`pg_terminate_backend`).

use std::fmt;
#[cfg(feature = "fault-injection")]
use std::sync::Arc;

/// One statement of a transition, or of the liveness connection's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum PgStep {
    /// The first round trip of a transition, pipelined: `BEGIN`, `SELECT … FOR UPDATE` of the
    /// lease row, `SELECT clock_timestamp(), pg_backend_pid()` (for a waiting acquire, after
    /// its wait for the holder, `pg_advisory_xact_lock_shared` in a transaction of its own).
    LockRow,
    /// The same after `INSERT … ON CONFLICT DO NOTHING` of a missing lease row (first use of
    /// an id).
    InsertRow,
    /// `pg_try_advisory_xact_lock_shared`: probing the recorded generation's liveness.
    Probe,
    /// `pg_try_advisory_lock` of a new generation. It goes out with the commit, in the
    /// statement that updates the row (see [`PgStep::Commit`]); a [`PgFault`] injected here
    /// makes that lock fail before the commit.
    LockLive,
    /// Re-locking the local generation on a fresh liveness connection: a renew after its
    /// connection ended, or an acquire whose commit's reply was lost but which committed
    /// (then under the row lock: the row read, then the lock with `COMMIT`).
    RelockLive,
    /// `UPDATE` of the lease row and `COMMIT`, pipelined. An acquire that takes a new
    /// generation sends it as one statement with the generation's `pg_try_advisory_lock`,
    /// on the liveness connection that runs its transaction: the row is updated only if the
    /// lock was granted.
    Commit,
    /// Re-reading the row after a commit whose outcome is unknown.
    Reread,
    /// `pg_advisory_unlock` on a liveness connection (a release, a superseded generation).
    /// A takeover that fails after its commit statement took the new generation's lock ends
    /// that connection's session instead.
    Unlock,
    /// A statement of a fenced section ([`PgLease::fenced`](super::PgLease::fenced)): its
    /// first round trip (the row's share lock), the caller's statements, the clock before its
    /// commit. (Its `COMMIT` is [`PgStep::Commit`].)
    Fenced,
}

impl PgStep {
    /// Every step, in the order a transition may reach them.
    pub const ALL: [PgStep; 9] = [
        PgStep::LockRow,
        PgStep::InsertRow,
        PgStep::Probe,
        PgStep::LockLive,
        PgStep::RelockLive,
        PgStep::Commit,
        PgStep::Reread,
        PgStep::Unlock,
        PgStep::Fenced,
    ];
}

/// What an injected fault does to a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PgFault {
    /// The server answers the step with an error (the statement `SELECT 1/0` is sent instead:
    /// an open transaction is aborted, as by any failed statement).
    Fail,
    /// The server runs the step, but its reply is lost: the connection is dropped and the
    /// step reported failed with an unknown outcome.
    LoseReply,
}

/// A fault hook: called before each step with the backend pid of the connection that runs it.
#[cfg(feature = "fault-injection")]
pub type PgFaultHook = Arc<dyn Fn(PgStep, i32) -> Option<PgFault> + Send + Sync>;

/// The hook of a [`PgLease`](super::PgLease), if any.
#[derive(Clone, Default)]
pub(super) struct Faults {
    #[cfg(feature = "fault-injection")]
    hook: Option<PgFaultHook>,
}

impl Faults {
    #[cfg(feature = "fault-injection")]
    pub(super) fn new(hook: PgFaultHook) -> Faults {
        Faults { hook: Some(hook) }
    }

    /// The fault to inject at `step` on backend `pid`, if any.
    pub(super) fn check(&self, step: PgStep, pid: i32) -> Option<PgFault> {
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &self.hook {
            return hook(step, pid);
        }
        let _ = (step, pid);
        None
    }
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Faults")
    }
}
