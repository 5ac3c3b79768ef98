//! Where the lease directory is when the command line does not say: `--dir`, else
//! `FLOCKLEASE_DIR`, else a default that needs no set-up (`run` and `status` alike).

use std::path::{Path, PathBuf};

/// The default for root: `/run/lock` is a tmpfs every init system provides, for lock files.
pub const ROOT_DEFAULT: &str = "/run/lock/flocklease";

/// The lease directory: `given`, else `$FLOCKLEASE_DIR`, else the default ([`default_dir`]).
pub fn lease_dir(given: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = given {
        return Ok(dir.to_owned());
    }
    if let Some(dir) = std::env::var_os("FLOCKLEASE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    default_dir()
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
