//! What one transition of the flock backend asks of the lease directory ([`Dir`]): each method
//! one system call (or, where it says so, a few that act only on what the caller made
//! itself), so that the transaction (`FlockTx`) and the publish of a liveness file
//! (`live::publish`) run unchanged on the kernel ([`Kernel`]) and, inside the model checker,
//! on a simulated directory that is part of the model's state. The model interleaves the
//! calls of several processes one at a time and judges what lands.
//!
//! Paths are the lease directory's own files (`<stem>.lock`, `<stem>.lease.json`,
//! `<stem>.<token>.live` and the temporary files beside them): every name is looked up in the
//! lease directory.

use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::MutexGuard;

use super::FlockLease;
use super::files;
pub use super::files::Access;
/// One attempt at a lock file over its own seam: the transition lock's, which the model
/// checker runs on its simulated directory.
#[cfg(feature = "internals")]
pub use super::files::{LockSteps, lock_once_on};
// What the model checker needs to run a transition on its own directory.
#[cfg(feature = "internals")]
pub use super::live::Published;
pub use super::tx::Sweeps;
#[cfg(feature = "internals")]
pub use super::tx::{FlockTx, Slot, TxState, held_at};
use crate::Timestamp;
use crate::error::Error;
use crate::fault::FaultPoint;
/// The front's bounded loop around one attempt at a transition lock (`front::begin_or_wait`).
#[cfg(feature = "internals")]
pub use crate::front::begin_or_wait;
use crate::record::LiveTag;

/// The file names of `id`'s transition lock and record in the lease directory
/// (`<stem>.lock`, `<stem>.lease.json`), as the adapter's paths name them.
#[cfg(feature = "internals")]
pub fn lock_and_record(id: &crate::SessionId) -> (String, String) {
    let paths = files::Paths::new(Path::new(""), id.stem().to_owned());
    let name = |p: &Path| p.to_string_lossy().into_owned();
    (name(&paths.lock), name(&paths.record))
}

/// What one look at an open file found: the first bytes it read, or the kind of file it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peeked {
    /// A regular file: how many of its first bytes were read into the caller's buffer (none
    /// when no buffer was given).
    File(usize),
    /// A directory.
    Directory,
    /// A FIFO.
    Fifo,
    /// Anything else that is not a regular file.
    Other,
}

/// The lease directory as one transition sees it.
pub trait Dir {
    /// An open file of the directory. Dropping it closes it, which releases a lock it holds.
    type File: fmt::Debug;

    /// The fault seam before the step `point` on `path` (tests make it fail or pause there;
    /// the default: nothing).
    ///
    /// # Errors
    ///
    /// The failure a test's hook chose.
    fn fault(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        let _ = (point, path);
        Ok(())
    }

    /// The time a transition reads under the lock.
    fn now(&self) -> Timestamp;

    /// Whether commits are fsynced ([`super::Durability::Full`]).
    fn durable(&self) -> bool;

    /// Whether a copy of each new liveness descriptor goes to a receiver
    /// ([`super::FlockLeaseBuilder::share_liveness`]).
    fn shares(&self) -> bool;

    /// Whether records name their generation's tag (always, but for a test seam).
    fn tags_records(&self) -> bool;

    /// The instance's deferred sweeps and the listing they share.
    fn sweeps(&self) -> MutexGuard<'_, Sweeps>;

    /// A tag no other file carries.
    fn fresh_tag(&self) -> LiveTag;

    /// Opens `path` for `access` (never through a symbolic link; one `openat`, and the checks
    /// of what was opened that `access` asks for).
    ///
    /// # Errors
    ///
    /// What stands there is refused, or the open failed.
    fn open(&self, path: &Path, access: Access) -> Result<Self::File, Error>;

    /// The whole content of `file` (bounded by the record's size limit).
    ///
    /// # Errors
    ///
    /// The read failed (`EISDIR` for a directory).
    fn read(&self, file: &Self::File) -> io::Result<Vec<u8>>;

    /// Reads the first bytes of `file` into `buf` (a positioned read), or, without a buffer,
    /// stats it: what kind of file it is.
    ///
    /// # Errors
    ///
    /// The read or the stat failed for another reason than the kind of file.
    fn peek(&self, file: &Self::File, buf: Option<&mut [u8]>) -> io::Result<Peeked>;

    /// Which file `file` is: (device, inode), one `fstat`.
    ///
    /// # Errors
    ///
    /// The stat failed.
    fn identity(&self, file: &Self::File) -> io::Result<(u64, u64)>;

    /// Which file stands at `path` now (`None`: nothing), one stat of the name.
    ///
    /// # Errors
    ///
    /// The stat failed.
    fn standing(&self, path: &Path) -> io::Result<Option<(u64, u64)>>;

    /// Writes `bytes` to `file` whole.
    ///
    /// # Errors
    ///
    /// The write failed.
    fn write(&self, file: &Self::File, bytes: &[u8]) -> io::Result<()>;

    /// Fsyncs `file`'s data.
    ///
    /// # Errors
    ///
    /// The fsync failed.
    fn sync(&self, file: &Self::File) -> io::Result<()>;

    /// Locks `file` exclusively if nobody holds a lock on it (`Ok(false)`: somebody does).
    ///
    /// # Errors
    ///
    /// The lock call failed for another reason.
    fn try_lock(&self, file: &Self::File) -> io::Result<bool>;

    /// Whether nobody holds an exclusive lock on `file`: a shared try-lock, dropped at once.
    ///
    /// # Errors
    ///
    /// The lock call failed for another reason than contention.
    fn holder_gone(&self, file: &Self::File) -> io::Result<bool>;

    /// Unlocks `file`.
    ///
    /// # Errors
    ///
    /// The unlock failed (closing the file still unlocks it).
    fn unlock(&self, file: &Self::File) -> io::Result<()>;

    /// Hands a copy of `file`, a new liveness file not yet at `path`, to the receiver (when
    /// [`Dir::shares`]); never blocks, and a failure is ignored.
    fn share(&self, file: &Self::File, path: &Path) {
        let _ = (file, path);
    }

    /// Renames `from` to `to` only if nothing stands at `to`: `Ok(false)` when something
    /// does, or when the file system cannot tell (the caller then looks).
    ///
    /// # Errors
    ///
    /// The rename failed otherwise.
    fn place_new(&self, from: &Path, to: &Path) -> Result<bool, Error>;

    /// Renames `from` over `to`, replacing what stands there.
    ///
    /// # Errors
    ///
    /// The rename failed; nothing changed then.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes the name `path`.
    ///
    /// # Errors
    ///
    /// The unlink failed.
    fn unlink(&self, path: &Path) -> io::Result<()>;

    /// Fsyncs the directory, so that a rename in it is durable.
    ///
    /// # Errors
    ///
    /// The fsync failed.
    fn sync_dir(&self) -> io::Result<()>;

    /// Lists the directory, calling `each` with every name: how many names it read, or `None`
    /// if it could not read the whole directory.
    fn list(&self, each: &mut dyn FnMut(&OsStr)) -> Option<usize>;
}

/// The kernel's lease directory, as a [`FlockLease`] opened it.
#[derive(Clone, Copy, Debug)]
pub struct Kernel<'a>(pub(crate) &'a FlockLease);

/// The name of a file of the lease directory, to look it up from the directory's descriptor.
fn name_of(path: &Path) -> &OsStr {
    path.file_name().unwrap_or(path.as_os_str())
}

impl Dir for Kernel<'_> {
    type File = File;

    fn fault(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        self.0.inner.opener.faults.check(point, path)
    }

    fn now(&self) -> Timestamp {
        self.0.clock.now()
    }

    fn durable(&self) -> bool {
        self.0.inner.durability == super::Durability::Full
    }

    fn shares(&self) -> bool {
        self.0.inner.opener.share.is_some()
    }

    fn tags_records(&self) -> bool {
        #[cfg(feature = "fault-injection")]
        return !self.0.inner.untagged_records;
        #[cfg(not(feature = "fault-injection"))]
        true
    }

    fn sweeps(&self) -> MutexGuard<'_, Sweeps> {
        super::lock(&self.0.inner.sweeps)
    }

    fn fresh_tag(&self) -> LiveTag {
        super::live::fresh_tag()
    }

    fn open(&self, path: &Path, access: Access) -> Result<File, Error> {
        let (opener, dir) = (&self.0.inner.opener, &self.0.inner.dir_file);
        self.0.relieved(|| opener.open_in(dir, path, access))
    }

    fn read(&self, file: &File) -> io::Result<Vec<u8>> {
        files::read_bounded(file)
    }

    fn peek(&self, file: &File, buf: Option<&mut [u8]>) -> io::Result<Peeked> {
        super::live::peek(file, buf)
    }

    fn identity(&self, file: &File) -> io::Result<(u64, u64)> {
        files::identity(file)
    }

    fn standing(&self, path: &Path) -> io::Result<Option<(u64, u64)>> {
        files::standing(Some(&self.0.inner.dir_file), path).map(|m| m.map(|m| m.id()))
    }

    fn write(&self, mut file: &File, bytes: &[u8]) -> io::Result<()> {
        io::Write::write_all(&mut file, bytes)
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn try_lock(&self, file: &File) -> io::Result<bool> {
        match file.try_lock() {
            Ok(()) => Ok(true),
            Err(std::fs::TryLockError::WouldBlock) => Ok(false),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn holder_gone(&self, file: &File) -> io::Result<bool> {
        super::live::holder_gone(file)
    }

    fn unlock(&self, file: &File) -> io::Result<()> {
        file.unlock()
    }

    fn share(&self, file: &File, path: &Path) {
        if let Some(socket) = &self.0.inner.opener.share {
            super::live::share(socket, file, path);
        }
    }

    fn place_new(&self, from: &Path, to: &Path) -> Result<bool, Error> {
        super::live::place_new(&self.0.inner.dir_file, from, to)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let dir = &self.0.inner.dir_file;
        nix::fcntl::renameat(dir, name_of(from), dir, name_of(to)).map_err(io::Error::from)
    }

    fn unlink(&self, path: &Path) -> io::Result<()> {
        let dir = &self.0.inner.dir_file;
        nix::unistd::unlinkat(dir, name_of(path), nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(io::Error::from)
    }

    fn sync_dir(&self) -> io::Result<()> {
        self.0.inner.dir_file.sync_all()
    }

    fn list(&self, each: &mut dyn FnMut(&OsStr)) -> Option<usize> {
        // Listed with `std`'s directory reader: open, stat, `getdents64` until it returns
        // nothing, close. (nix's reader, over `fdopendir`, adds two `fcntl` calls and a
        // rewind; it allocates less per entry, about 10 % faster over 300 000 entries.) By
        // path, like the transaction's file steps (only the directory's fsync uses the
        // descriptor opened at `open`).
        let entries = std::fs::read_dir(&self.0.inner.dir).ok()?;
        let mut count = 0;
        // Stops at the first error: a directory that keeps failing to list (an I/O error)
        // is not asked again and again under the transition lock.
        for entry in entries {
            count += 1;
            each(&entry.ok()?.file_name());
        }
        Some(count)
    }
}
