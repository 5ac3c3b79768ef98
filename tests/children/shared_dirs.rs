//! Lease directories shared between users, with two real user ids: a sticky world-writable
//! directory (`/tmp`-like) trusts only the caller's own files; a group directory works with a
//! group file mode. Root runs the test and a child runs as `nobody`; without root the tests
//! say so and return.

use crate::support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flocklease::{Error, FlockLease, Grant};
use support::{RoleChild, hear, id, owner, role, tell};

const ENTRY: &str = "shared_dirs::child_entry";
const NOBODY: u32 = 65534;

/// The other user: `DIR MODE` (file mode in octal). Commands: `acquire ID`, `release`,
/// `plant-record ID`.
#[test]
fn child_entry() {
    let Some((_, args)) = role() else { return };
    let dir = Path::new(&args[0]);
    let mode = u32::from_str_radix(&args[1], 8).unwrap();
    let leases = FlockLease::builder(dir).file_mode(mode).open();
    let leases = match leases {
        Ok(l) => l,
        Err(e) => {
            tell(&format!("error {e}"));
            return;
        }
    };
    let mut last = None;
    while let Some(line) = hear() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["acquire", sid] => match leases.acquire(&id(sid), &owner("other")) {
                Ok(Grant::Granted(l)) => {
                    tell(&format!("granted {}", l.token));
                    last = Some(l);
                }
                Ok(Grant::Held) => tell("held"),
                Err(e) => tell(&format!("error {e}")),
            },
            ["release"] => {
                leases.release(last.as_ref().unwrap()).unwrap();
                tell("released");
            }
            ["plant-record", sid] => {
                let path = dir.join(format!("{}.lease.json", id(sid).stem()));
                fs::write(
                    &path,
                    br#"{"owner":"evil","token":1,"expiry":"9999-01-01T00:00:00Z"}"#,
                )
                .unwrap();
                tell("planted");
            }
            [] => {}
            other => panic!("unknown command {other:?}"),
        }
    }
}

fn is_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("NOT RUN: these tests need root to start a child as another user");
    false
}

/// A directory with `mode` (and group `gid`) inside a traversable parent.
fn shared_dir(mode: u32, gid: u32) -> (tempfile::TempDir, PathBuf) {
    let parent = tempfile::tempdir().unwrap();
    fs::set_permissions(parent.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = parent.path().join("shared");
    fs::create_dir(&dir).unwrap();
    nix::unistd::chown(&dir, None, Some(nix::unistd::Gid::from_raw(gid))).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
    (parent, dir)
}

fn other_user(dir: &Path, mode: &str) -> RoleChild {
    RoleChild::spawn_as(
        ENTRY,
        "other",
        &[dir.to_str().unwrap(), mode],
        NOBODY,
        NOBODY,
    )
}

#[test]
fn a_sticky_world_writable_directory_is_accepted_but_other_users_files_are_refused() {
    if !is_root() {
        return;
    }
    let (_parent, dir) = shared_dir(0o1777, 0);
    // Another user takes a lease there: its files are its own.
    let mut other = other_user(&dir, "600");
    other.say("acquire s");
    assert_eq!(other.line(), "granted 1");
    let lock = dir.join(format!("{}.lock", id("s").stem()));
    assert_eq!(fs::metadata(&lock).unwrap().uid(), NOBODY);
    // Accepted (it is sticky), but a file of another user is neither trusted nor followed.
    let mine = FlockLease::open(&dir).unwrap();
    let err = mine.acquire(&id("s"), &owner("me")).unwrap_err();
    assert!(
        matches!(err, Error::ForeignOwner { uid: NOBODY, .. }),
        "{err}"
    );
    assert_eq!(err.path(), Some(lock.as_path()));
    assert!(err.to_string().contains("uid 65534"), "{err}");
    // A planted record is refused the same way, naming the record.
    other.say("plant-record p");
    assert_eq!(other.line(), "planted");
    let err = mine.acquire(&id("p"), &owner("me")).unwrap_err();
    assert!(matches!(err, Error::ForeignOwner { .. }), "{err}");
    assert!(
        err.path()
            .unwrap()
            .ends_with(format!("{}.lease.json", id("p").stem()))
    );
    // Ids whose files are the caller's own work normally.
    let l = mine
        .acquire(&id("mine"), &owner("me"))
        .unwrap()
        .lease()
        .unwrap();
    mine.release(&l).unwrap();
    // Opting in trusts them: the other user's live lease is then seen as held.
    let trusting = FlockLease::builder(&dir)
        .trust_foreign_owners(true)
        .open()
        .unwrap();
    assert!(trusting.acquire(&id("s"), &owner("me")).unwrap().is_held());
    other.finish();
}

#[test]
fn world_writable_without_the_sticky_bit_is_refused_with_advice() {
    let (_parent, dir) = shared_dir(0o777, 0);
    let err = FlockLease::open(&dir).unwrap_err();
    assert!(matches!(err, Error::WorldWritable { .. }), "{err}");
    assert!(err.to_string().contains("private subdirectory"), "{err}");
}

#[test]
fn a_group_directory_needs_and_works_with_a_group_file_mode() {
    if !is_root() {
        return;
    }
    let (_parent, dir) = shared_dir(0o2770, NOBODY);
    // With the default mode (0600) the other member of the group cannot use the files.
    let private = FlockLease::open(&dir).unwrap();
    let l = private
        .acquire(&id("h"), &owner("me"))
        .unwrap()
        .lease()
        .unwrap();
    private.release(&l).unwrap();
    let mut other = other_user(&dir, "600");
    other.say("acquire h");
    let reply = other.line();
    assert!(reply.contains("Permission denied"), "{reply}");
    other.finish();
    // With 0660 (applied whatever the umask) both use the lease in turn; tokens go on.
    let group = FlockLease::builder(&dir).file_mode(0o660).open().unwrap();
    let l = group
        .acquire(&id("g"), &owner("me"))
        .unwrap()
        .lease()
        .unwrap();
    let record = dir.join(format!("{}.lease.json", id("g").stem()));
    assert_eq!(fs::metadata(&record).unwrap().mode() & 0o777, 0o660);
    assert_eq!(
        fs::metadata(&record).unwrap().gid(),
        NOBODY,
        "setgid directory"
    );
    let mut other = other_user(&dir, "660");
    other.say("acquire g");
    assert_eq!(other.line(), "held");
    group.release(&l).unwrap();
    other.say("acquire g");
    assert_eq!(other.line(), format!("granted {}", l.token + 1));
    other.say("release");
    assert_eq!(other.line(), "released");
    other.finish();
    assert_eq!(
        group
            .acquire(&id("g"), &owner("me"))
            .unwrap()
            .lease()
            .unwrap()
            .token,
        l.token + 2
    );
}

#[test]
fn unusable_file_modes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o400, 0o666, 0o700, 0o4600] {
        let err = FlockLease::builder(dir.path())
            .file_mode(mode)
            .open()
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidFileMode { .. }),
            "{mode:o}: {err}"
        );
    }
}
