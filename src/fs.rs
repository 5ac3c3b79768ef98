//! What the resource-side fence asks of the file system ([`Fs`]): each method one step another
//! process can come between, so that the same code runs on the kernel (`fence::Kernel`) and,
//! inside the model checker, on a simulated file system that is part of the model's state
//! (`flocklease_model::resource`). The model interleaves the steps of several callers and a
//! cleaner, one method call at a time, and judges what lands.
//!
//! A method that acts only on what its caller made itself (a temporary file under a fresh
//! name, its fsync, the directory's fsync) cannot be seen by another process before the
//! rename that publishes it, so the model may run it together with the step after it; each
//! method says which kind it is.

use std::path::Path;
use std::time::Instant;

use crate::error::Error;
use crate::fault::FaultPoint;

/// What a temporary file is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TempFor {
    /// The fence file's next content: the fence's own file mode (0600).
    Fence,
    /// A guarded target's: mode 0666 less the umask for a new target, or the permission bits
    /// of the target it replaces.
    Target(Option<u32>),
}

/// The fence's file-system calls. Paths are the fence's own: `<fence file>`,
/// `<fence file>.lock`, the guarded target, and the temporary files beside them.
pub trait Fs {
    /// A lock file, open and locked by this caller.
    type Lock;
    /// A new temporary file, open for writing.
    type Temp;

    /// One attempt at the lock file at `path`: open it (creating it), lock it exclusively
    /// (waiting for it until `deadline` while it is still the file at the path), and check it
    /// is the file at the path. `Ok(None)`: busy to the deadline, or the file locked was not
    /// the one at the path (then it is unlocked). Seen by others.
    ///
    /// # Errors
    ///
    /// What stands at the path is refused, or I/O failed; nothing is held then.
    fn lock_once(
        &self,
        path: &Path,
        deadline: Option<Instant>,
    ) -> Result<Option<Self::Lock>, Error>;

    /// Whether `lock` is still the file at `path` (one stat of the path). Sees others.
    ///
    /// # Errors
    ///
    /// The stat failed.
    fn still_at(&self, lock: &Self::Lock, path: &Path) -> Result<bool, Error>;

    /// Unlocks `lock` and closes it. Seen by others.
    fn unlock(&self, lock: Self::Lock);

    /// The whole content of the regular file at `path` (`None`: nothing there): one open and
    /// read of the file that stands there then. Sees others.
    ///
    /// # Errors
    ///
    /// What stands there is refused (a symbolic link, not a regular file, another user's
    /// where that is refused), or I/O failed.
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Error>;

    /// The permission bits of the regular file at `path` (`None`: nothing there), which a
    /// replacement keeps. Its own: only what stands at the path's type matters, and only this
    /// caller's own kind of write replaces it.
    ///
    /// # Errors
    ///
    /// A symbolic link or not a regular file there, or the stat failed.
    fn mode(&self, path: &Path) -> Result<Option<u32>, Error>;

    /// A fresh number for a temporary file's name, never given before. Its own.
    fn fresh(&self) -> u64;

    /// Creates the new temporary file `path` exclusively, never through a symbolic link, for
    /// `what`. Its own: nobody else uses its fresh name.
    ///
    /// # Errors
    ///
    /// The creation failed (also when something stands at the name); nothing is left then.
    fn create(&self, path: &Path, what: TempFor) -> Result<Self::Temp, Error>;

    /// Writes `bytes` to `temp` (at `path`) whole and fsyncs it. Its own.
    ///
    /// # Errors
    ///
    /// The write or the fsync failed.
    fn write_sync(&self, temp: &mut Self::Temp, path: &Path, bytes: &[u8]) -> Result<(), Error>;

    /// Renames `from` over `to` (one `rename(2)`, replacing what stands at `to`). Seen by
    /// others.
    ///
    /// # Errors
    ///
    /// The rename failed; nothing changed then.
    fn rename(&self, from: &Path, to: &Path) -> Result<(), Error>;

    /// Removes this caller's temporary file `path`, best effort. Its own.
    fn remove(&self, path: &Path);

    /// Fsyncs the directory `dir`, so that a rename in it is durable. Its own.
    ///
    /// # Errors
    ///
    /// The fsync failed.
    fn sync_dir(&self, dir: &Path) -> Result<(), Error>;

    /// The fault seam before the step `point` on `path` (tests make it fail or pause there;
    /// the default: nothing).
    ///
    /// # Errors
    ///
    /// The failure a test's hook chose.
    fn hook(&self, point: FaultPoint, path: &Path) -> Result<(), Error> {
        let _ = (point, path);
        Ok(())
    }
}
