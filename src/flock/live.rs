//! Liveness files: a generation's file is **published already locked**, and what stands at a
//! generation's name is judged by one function, [`identify`], for the library's probes and
//! waits and for `status` alike.
//!
//! A generation's liveness file carries a random [`LiveTag`] that the record names (key
//! `live`). [`identify`] calls a file the generation's own only if it is a regular file that
//! carries that tag; anything else at the name — a FIFO, a directory, a socket, a symbolic
//! link, a fresh empty file that a Go prober or a tmp tool created — is *not the generation's*,
//! and the probe answers [`Liveness::Unknown`] (the machine then falls back to the expiry),
//! never [`Liveness::Dead`]. A record without a tag (written by the Go package or by an older
//! version) is judged by its lock alone, as before, but a file that is not regular is still
//! not the generation's.
//!
//! [`publish`] creates the file under a unique temporary name, writes the tag, locks it, and
//! only then renames it into place: under the generation's name there is either what was there
//! before or the locked file, never an unlocked one. On failure the temporary file is removed
//! and nothing changed under the final name.

use std::collections::hash_map::RandomState;
use std::fs::{File, TryLockError};
use std::hash::{BuildHasher, Hash, Hasher};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::files::Access;
use super::sys::{Dir, Peeked};
use crate::error::Error;
use crate::fault::FaultPoint;
use crate::machine::{self, AtName, Liveness, NotOwn};
use crate::record::LiveTag;

/// A new tag, unique with overwhelming probability: a process-wide counter and the time,
/// hashed with std's randomly keyed SipHash (its keys come from the operating system's random
/// source, once per thread). Not a secret — anyone who can read the lease directory can read
/// it — only a name no other file can carry by accident. (No process id: reading it is a
/// system call. A forked child shares its parent's keys and counter but not its clock
/// reading, and two equal tags would matter only for one generation's name, which one
/// process publishes at a time under the transition lock.)
pub(crate) fn fresh_tag() -> LiveTag {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    COUNTER.fetch_add(1, Ordering::Relaxed).hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    LiveTag(h.finish())
}

/// What stands at a generation's liveness path.
#[derive(Debug)]
pub(crate) enum Found<F = File> {
    /// The generation's own file (or, for a record without a tag, a regular file), opened.
    Own(F),
    /// Nothing.
    Missing,
    /// Something that is not the generation's file; why, in words.
    NotOwn(String),
}

/// How a probe judged a generation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Probed {
    /// The answer for the machine.
    pub(crate) liveness: Liveness,
    /// Why the answer is [`Liveness::Unknown`] when a file stands at the name.
    pub(crate) reason: Option<String>,
}

/// Judges what opening `path` (a generation's liveness file, opened read-only, without
/// following links or blocking) gave, against the `tag` the record names. The one place that
/// decides whether a file is a generation's own.
///
/// # Errors
///
/// An I/O failure that says nothing about the file (`EMFILE`, `EIO`, ...).
pub(crate) fn identify<F>(
    opened: Result<F, Error>,
    path: &Path,
    tag: Option<LiveTag>,
    peek: impl FnOnce(&F, Option<&mut [u8]>) -> io::Result<Peeked>,
) -> Result<Found<F>, Error> {
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => return Ok(Found::Missing),
        Err(
            e @ (Error::Symlink { .. }
            | Error::NotAFile { .. }
            | Error::ForeignOwner { .. }
            | Error::ForeignDenied { .. }),
        ) => {
            return Ok(Found::NotOwn(e.to_string()));
        }
        Err(e) => return Err(e),
    };
    // One system call tells what stands there: with a tag to compare, a positioned read of
    // the first bytes (a directory answers EISDIR, a FIFO ESPIPE, a regular file its
    // contents); without one, a stat. The judgement is the machine's.
    let mut buf = [0u8; 17];
    let hex = tag.map_or([0; 16], |tag| tag.to_hex());
    let peeked = peek(&file, tag.is_some().then_some(&mut buf[..]));
    let found = match peeked
        .map_err(|e| Error::io(if tag.is_some() { "read" } else { "stat" }, path, e))?
    {
        Peeked::File(n) => AtName::File { first: &buf[..n] },
        Peeked::Directory => AtName::Directory,
        Peeked::Fifo => AtName::Fifo,
        Peeked::Other => AtName::Other,
    };
    let what = match machine::own_liveness(tag.map(|_| &hex[..]), found) {
        Ok(()) => return Ok(Found::Own(file)),
        Err(NotOwn::Directory) => "a directory",
        Err(NotOwn::Fifo) => "a FIFO",
        Err(NotOwn::Other) => "not a regular file",
        Err(NotOwn::Tag) => {
            return Ok(Found::NotOwn(format!(
                "{}: does not carry the tag its record names (another file was put at its name)",
                path.display()
            )));
        }
    };
    Ok(Found::NotOwn(format!(
        "{}: {what}, not the liveness file its generation published",
        path.display()
    )))
}

/// Probes what [`identify`] found: the generation's own file with a shared try-lock, dropped
/// at once (a holder's exclusive lock excludes it; another probe or a waiter does not).
///
/// # Errors
///
/// The lock call failing for another reason than contention.
pub(crate) fn probe<F>(
    found: Found<F>,
    path: &Path,
    holder_gone: impl FnOnce(&F) -> io::Result<bool>,
) -> Result<Probed, Error> {
    let (liveness, reason) = match found {
        Found::Own(file) => {
            let gone = holder_gone(&file).map_err(|e| Error::io("lock", path, e))?;
            (if gone { Liveness::Dead } else { Liveness::Live }, None)
        }
        Found::Missing => (Liveness::Unknown, None),
        Found::NotOwn(reason) => (Liveness::Unknown, Some(reason)),
    };
    Ok(Probed { liveness, reason })
}

/// Whether the holder of the liveness lock that `file` opened is gone: a shared try-lock,
/// dropped at once (closing the caller's descriptor releases it too).
pub(crate) fn holder_gone(file: &File) -> io::Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => {
            // Unlock now, so the instant this descriptor holds a shared lock is as short as
            // possible (it excludes nobody but an exclusive locker of this very file).
            let _ = file.unlock();
            Ok(true)
        }
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// A published generation's file: open, exclusively locked, at its final name (when
/// published), with its identity and the tag it carries.
#[derive(Debug)]
pub struct Published<F = File> {
    pub(super) file: F,
    /// The (device, inode) of `file`, to check it is still the one at its path.
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// The tag `file` carries, which the record names.
    pub(super) tag: LiveTag,
}

/// What a publish may replace at the generation's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Over {
    /// Anything: the generation is this instance's own (a restore).
    Anything,
    /// Anything but a file whose lock is held ([`Error::LiveLockBusy`]): a new generation,
    /// whose name a live holder can stand at only if the record was moved back under it. A
    /// symbolic link there is refused ([`Error::Symlink`]).
    NotHeld,
}

/// Publishes generation file `path` (in the lease directory `dir`) carrying `tag`: creates
/// `<path>.<tag>.tmp` exclusively, writes the tag, locks it exclusively, and renames it over
/// `path`. What stood at `path` is replaced in one step as `over` allows (the caller holds the
/// transition lock and publishes only its own generations).
///
/// # Errors
///
/// Any step failing; the temporary file is then removed and `path` is untouched.
pub(super) fn publish<D: Dir>(
    dir: &D,
    path: &Path,
    tag: LiveTag,
    over: Over,
) -> Result<Published<D::File>, Error> {
    let temp = temp_path(path, tag);
    let file = dir.open(&temp, Access::LiveCreate)?;
    match lock_and_place(dir, &file, (&temp, path), tag, over) {
        Ok((dev, ino)) => Ok(Published {
            file,
            dev,
            ino,
            tag,
        }),
        Err(e) => {
            // Closing drops the lock; the name goes. Nothing was placed at `path`.
            drop(file);
            let _ = dir.unlink(&temp);
            Err(e)
        }
    }
}

fn lock_and_place<D: Dir>(
    dir: &D,
    file: &D::File,
    (temp, path): (&Path, &Path),
    tag: LiveTag,
    over: Over,
) -> Result<(u64, u64), Error> {
    dir.fault(FaultPoint::WriteLive, temp)?;
    dir.write(file, &tag.to_hex())
        .map_err(|e| Error::io("write", temp, e))?;
    dir.fault(FaultPoint::LockLive, temp)?;
    // A unique name nobody else publishes: only a planted file could be locked.
    if !dir.try_lock(file).map_err(|e| Error::io("lock", temp, e))? {
        return Err(Error::LiveLockBusy {
            path: temp.to_owned(),
        });
    }
    dir.fault(FaultPoint::StatNewLive, temp)?;
    let id = dir.identity(file).map_err(|e| Error::io("stat", temp, e))?;
    if dir.shares() {
        dir.share(file, path);
    }
    dir.fault(FaultPoint::PublishLive, path)?;
    if over == Over::NotHeld {
        if dir.place_new(temp, path)? {
            return Ok(id);
        }
        // Something stands at the name: replaced unless a holder keeps it locked.
        let opened = dir.open(path, Access::Probe);
        if let Err(e @ Error::Symlink { .. }) = opened {
            return Err(e);
        }
        let peek = |f: &D::File, buf: Option<&mut [u8]>| dir.peek(f, buf);
        if let Found::Own(held) = identify(opened, path, None, peek)?
            && !dir
                .holder_gone(&held)
                .map_err(|e| Error::io("lock", path, e))?
        {
            return Err(Error::LiveLockBusy {
                path: path.to_owned(),
            });
        }
    }
    dir.rename(temp, path).map_err(|e| match e.raw_os_error() {
        Some(nix::libc::EISDIR | nix::libc::ENOTEMPTY | nix::libc::EEXIST) => Error::NotAFile {
            path: path.to_owned(),
        },
        _ => Error::io("rename", path, e),
    })?;
    Ok(id)
}

/// Sends `file` (locked, not yet at `path`) over `socket` as `live PATH` with the descriptor
/// attached (see [`FlockLeaseBuilder::share_liveness`](super::FlockLeaseBuilder::share_liveness)):
/// one `sendmsg`, never blocking; a failure is ignored.
pub(super) fn share(socket: &std::os::fd::OwnedFd, file: &File, path: &Path) {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let mut message = b"live ".to_vec();
    message.extend_from_slice(path.as_os_str().as_bytes());
    let fds = [file.as_raw_fd()];
    let _ = sendmsg::<()>(
        socket.as_raw_fd(),
        &[std::io::IoSlice::new(&message)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        None,
    );
}

/// Renames `temp` to `path` only if nothing stands at `path` (one `renameat2` with
/// `RENAME_NOREPLACE`, relative to the lease directory): `Ok(false)` when something does, or
/// when the file system cannot tell (the caller then looks).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(super) fn place_new(dir: &File, temp: &Path, path: &Path) -> Result<bool, Error> {
    use nix::errno::Errno;
    use nix::fcntl::{RenameFlags, renameat2};
    let (Some(from), Some(to)) = (temp.file_name(), path.file_name()) else {
        return Ok(false);
    };
    match renameat2(dir, from, dir, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST | Errno::EINVAL | Errno::ENOSYS) => Ok(false),
        Err(e) => Err(Error::io("rename", path, std::io::Error::from(e))),
    }
}

/// Without `renameat2`: the caller always looks at what stands at `path` first.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(super) fn place_new(_dir: &File, _temp: &Path, _path: &Path) -> Result<bool, Error> {
    Ok(false)
}

/// The unique temporary name a generation's file is published from.
pub(crate) fn temp_path(path: &Path, tag: LiveTag) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{:016x}.tmp", tag.0));
    PathBuf::from(name)
}

/// Looks at an open file of the kernel's ([`Dir::peek`]): reads its first bytes into `buf`
/// (positioned, retrying short reads), or without a buffer stats it.
pub(crate) fn peek(file: &File, buf: Option<&mut [u8]>) -> io::Result<Peeked> {
    let Some(buf) = buf else {
        let kind = file.metadata()?.file_type();
        return Ok(if kind.is_file() {
            Peeked::File(0)
        } else if kind.is_dir() {
            Peeked::Directory
        } else if kind.is_fifo() {
            Peeked::Fifo
        } else {
            Peeked::Other
        });
    };
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::EISDIR) => return Ok(Peeked::Directory),
            Err(e) if e.raw_os_error() == Some(nix::libc::ESPIPE) => return Ok(Peeked::Fifo),
            Err(e) => return Err(e),
        }
    }
    Ok(Peeked::File(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_tags_differ() {
        let tags: std::collections::BTreeSet<_> = (0..1000).map(|_| fresh_tag()).collect();
        assert_eq!(tags.len(), 1000);
    }

    #[test]
    fn a_publish_temp_name_ends_in_tmp_beside_its_file() {
        let p = temp_path(Path::new("/d/s-0123.7.live"), LiveTag(0xab));
        assert_eq!(p, Path::new("/d/s-0123.7.live.00000000000000ab.tmp"));
    }
}
