//! The I/O seam of [`FlockLease`](crate::FlockLease): every file-system step it takes is named
//! by a [`FaultPoint`], and a test build (feature `fault-injection`) can make any one of them
//! fail through [`FlockLeaseBuilder::faults`](crate::FlockLeaseBuilder).

use std::fmt;
use std::path::Path;
#[cfg(feature = "fault-injection")]
use std::{io, sync::Arc};

use crate::error::Error;

/// One file-system step of a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FaultPoint {
    /// Opening (creating) `<stem>.lock`.
    OpenStable,
    /// Locking `<stem>.lock`.
    LockStable,
    /// Checking the locked `<stem>.lock` is still the file at its path.
    StatStable,
    /// Opening the record for reading.
    OpenRecord,
    /// Reading the record.
    ReadRecord,
    /// Opening a generation's liveness file to probe it.
    OpenProbe,
    /// Probing a generation's liveness lock.
    LockProbe,
    /// Creating a generation's liveness file under its temporary name (publishing it).
    OpenLive,
    /// Writing the tag into a generation's liveness file being published.
    WriteLive,
    /// Locking a generation's liveness file being published.
    LockLive,
    /// Checking the local generation's liveness file is still in place.
    StatLive,
    /// Creating the temporary record file.
    CreateTemp,
    /// Writing the temporary record file.
    WriteTemp,
    /// Fsyncing the temporary record file.
    SyncTemp,
    /// Renaming the temporary file over the record.
    Rename,
    /// Fsyncing the directory after the rename.
    SyncDir,
    /// Deleting an obsolete liveness file.
    Unlink,
    /// Checking a freshly locked liveness file's identity (after [`FaultPoint::LockLive`]).
    StatNewLive,
    /// Renaming a published generation's locked liveness file into place.
    PublishLive,
    /// Checking, just before the commit's rename, that the transition lock held is still the
    /// file at `<stem>.lock`.
    CheckStable,
    /// Listing the directory to sweep dead generations' files.
    ReadDir,
    /// Opening a holder's liveness file to wait for it (a waiting acquire).
    OpenWait,
    /// Opening the id's line of waiting acquires, `<stem>.queue` (a failure leaves the wait
    /// unqueued: it is never the call's error).
    OpenQueue,
    /// A [`Fence`](crate::Fence)'s guarded write renaming its temporary file over its target
    /// (after the checks that it may land). Not reached by a lease transition.
    CommitTarget,
    /// A [`Fence`](crate::Fence) giving up its lock (closing the lock file): never fails, a
    /// test's hook may only pause there. Not reached by a lease transition.
    UnlockFence,
    /// A fenced section or a transition of [`FlockLease`](crate::FlockLease) has just taken
    /// one step of what it holds (the id's turn, its state, its lock: `flock::SECTION`,
    /// `driver::TRANSITION`), named by the lock's path: a point to observe, never failed (what
    /// the hook answers is ignored).
    Held,
}

impl FaultPoint {
    /// Every fault point of a lease transition, in the order a transition may reach them (a
    /// fence's own, [`FaultPoint::CommitTarget`] and [`FaultPoint::UnlockFence`], are not
    /// among them).
    pub const ALL: [FaultPoint; 23] = [
        FaultPoint::OpenStable,
        FaultPoint::LockStable,
        FaultPoint::StatStable,
        FaultPoint::OpenRecord,
        FaultPoint::ReadRecord,
        FaultPoint::OpenProbe,
        FaultPoint::LockProbe,
        FaultPoint::OpenLive,
        FaultPoint::WriteLive,
        FaultPoint::LockLive,
        FaultPoint::StatLive,
        FaultPoint::CreateTemp,
        FaultPoint::WriteTemp,
        FaultPoint::SyncTemp,
        FaultPoint::Rename,
        FaultPoint::SyncDir,
        FaultPoint::Unlink,
        FaultPoint::StatNewLive,
        FaultPoint::PublishLive,
        FaultPoint::CheckStable,
        FaultPoint::ReadDir,
        FaultPoint::OpenWait,
        FaultPoint::OpenQueue,
    ];
}

/// A fault hook: called before each step; returning an error makes that step fail with it.
#[cfg(feature = "fault-injection")]
pub type FaultHook = Arc<dyn Fn(FaultPoint, &Path) -> Option<io::Error> + Send + Sync>;

/// The hook as the adapter keeps it (nothing at all without the feature).
#[derive(Clone, Default)]
pub(crate) struct Faults {
    #[cfg(feature = "fault-injection")]
    hook: Option<FaultHook>,
}

impl Faults {
    #[cfg(feature = "fault-injection")]
    pub(crate) fn new(hook: FaultHook) -> Faults {
        Faults { hook: Some(hook) }
    }

    /// Whether a hook is set (never without the feature): a caller may skip building the
    /// path it would name.
    #[inline]
    pub(crate) fn hooked(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        return self.hook.is_some();
        #[cfg(not(feature = "fault-injection"))]
        false
    }

    /// Tells the hook that `point` was reached (its answer is ignored).
    #[inline]
    pub(crate) fn observe(&self, point: FaultPoint, path: &Path) {
        let _ = self.check(point, path);
    }

    /// Fails with the injected error if the hook asks for one at `point`.
    #[inline]
    pub(crate) fn check(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        #[cfg(feature = "fault-injection")]
        if let Some(e) = self.hook.as_ref().and_then(|h| h(point, path)) {
            return Err(Error::io(point.op(), path, e));
        }
        let _ = (point, path);
        Ok(())
    }
}

impl FaultPoint {
    #[cfg(feature = "fault-injection")]
    fn op(self) -> &'static str {
        match self {
            FaultPoint::OpenStable
            | FaultPoint::OpenRecord
            | FaultPoint::OpenProbe
            | FaultPoint::OpenLive
            | FaultPoint::CreateTemp
            | FaultPoint::OpenWait
            | FaultPoint::OpenQueue => "open",
            FaultPoint::UnlockFence => "unlock",
            FaultPoint::Held => "hold",
            FaultPoint::CommitTarget | FaultPoint::PublishLive | FaultPoint::Rename => "rename",
            FaultPoint::LockStable | FaultPoint::LockProbe | FaultPoint::LockLive => "lock",
            FaultPoint::StatStable
            | FaultPoint::StatLive
            | FaultPoint::StatNewLive
            | FaultPoint::CheckStable => "stat",
            FaultPoint::WriteLive | FaultPoint::WriteTemp => "write",
            FaultPoint::ReadDir => "read directory",
            FaultPoint::ReadRecord => "read",
            FaultPoint::SyncTemp | FaultPoint::SyncDir => "fsync",
            FaultPoint::Unlink => "unlink",
        }
    }
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("injecting", &self.hooked())
            .finish()
    }
}
