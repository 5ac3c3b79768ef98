//! Where the lease directory is when the command line does not say: `--dir`, else
//! `FLOCKLEASE_DIR`, else a default that needs no set-up (`run` and `status` alike).

use std::path::{Path, PathBuf};

/// The default for root: `/run/lock` is a tmpfs every init system provides, for lock files.
pub const ROOT_DEFAULT: &str = "/run/lock/flocklease";

/// Why there is no lease directory to use.
pub enum NoDir {
    /// None given and no default for this user: bad usage (64).
    Usage(String),
    /// The default exists but is not this user's own (another user may have created it in
    /// the shared `/run/lock` first): an error (70).
    Unsafe(String),
}

impl NoDir {
    /// The exit status and the message.
    pub fn report(self) -> u8 {
        let (code, msg) = match self {
            NoDir::Usage(msg) => (crate::EXIT_USAGE, msg),
            NoDir::Unsafe(msg) => (crate::EXIT_ERROR, msg),
        };
        eprintln!("flocklease: {msg}");
        code
    }
}

/// The lease directory: `given`, else `$FLOCKLEASE_DIR`, else the default ([`default_dir`]),
/// created if missing and refused unless it is a directory of this user's own.
pub fn lease_dir(given: Option<&Path>) -> Result<PathBuf, NoDir> {
    if let Some(dir) = given {
        return Ok(dir.to_owned());
    }
    if let Some(dir) = std::env::var_os("FLOCKLEASE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let dir = default_dir().map_err(NoDir::Usage)?;
    own_dir(&dir).map_err(NoDir::Unsafe)?;
    Ok(dir)
}

/// Makes sure the default directory `dir` is this user's own: created here (mode 0700) if
/// missing, else a directory, not a symbolic link, owned by this user. `/run/lock` is writable
/// by every user: one could create `/run/lock/flocklease` (or a link by that name) before root
/// and own every lease file in it.
fn own_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        // A missing parent: the library's error names it.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.file_type().is_symlink() || !meta.is_dir() || meta.uid() != me {
        return Err(format!(
            "refusing the default lease directory {}: it is {}, not a directory of this user's \
             (uid {me}); another user may have created it first. Remove it, or pass --dir",
            dir.display(),
            if meta.file_type().is_symlink() {
                "a symbolic link".to_owned()
            } else if !meta.is_dir() {
                "not a directory".to_owned()
            } else {
                format!("owned by uid {}", meta.uid())
            }
        ));
    }
    Ok(())
}

/// The default lease directory: `/run/lock/flocklease` for root; `$XDG_RUNTIME_DIR/flocklease`
/// for other users, or `/run/user/UID/flocklease` where that variable is unset but the
/// directory exists (cron, `su`). Both are tmpfs: tokens start again at 1 after a reboot.
pub fn default_dir() -> Result<PathBuf, String> {
    let uid = nix::unistd::geteuid();
    default_for(
        uid.as_raw(),
        std::env::var_os("XDG_RUNTIME_DIR").as_deref(),
        |p| p.is_dir(),
    )
}

/// [`default_dir`] for user `uid`, with `XDG_RUNTIME_DIR` at `runtime` and `is_dir` to look
/// at the file system.
fn default_for(
    uid: u32,
    runtime: Option<&std::ffi::OsStr>,
    is_dir: impl Fn(&Path) -> bool,
) -> Result<PathBuf, String> {
    if uid == 0 {
        return Ok(PathBuf::from(ROOT_DEFAULT));
    }
    if let Some(runtime) = runtime.filter(|d| !d.is_empty()) {
        return Ok(Path::new(runtime).join("flocklease"));
    }
    let user_run = PathBuf::from(format!("/run/user/{uid}"));
    if is_dir(&user_run) {
        return Ok(user_run.join("flocklease"));
    }
    Err(format!(
        "no lease directory: pass --dir DIR or set FLOCKLEASE_DIR (the default for uid {uid} \
         is $XDG_RUNTIME_DIR/flocklease, and XDG_RUNTIME_DIR is unset and {} does not exist)",
        user_run.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn root_users_and_cron_each_get_a_directory_or_a_clear_error() {
        let never = |_: &Path| false;
        assert_eq!(
            default_for(0, Some(OsStr::new("/run/user/0")), never),
            Ok(PathBuf::from("/run/lock/flocklease"))
        );
        assert_eq!(
            default_for(1000, Some(OsStr::new("/run/user/1000")), never),
            Ok(PathBuf::from("/run/user/1000/flocklease"))
        );
        // Under cron: no XDG_RUNTIME_DIR, but the user's runtime directory exists.
        assert_eq!(
            default_for(1000, None, |p| p == Path::new("/run/user/1000")),
            Ok(PathBuf::from("/run/user/1000/flocklease"))
        );
        let e = default_for(1000, Some(OsStr::new("")), never).unwrap_err();
        assert!(e.contains("--dir") && e.contains("/run/user/1000"), "{e}");
    }
}
