//! A read-only view of a lease directory: every session's record and whether its holder lives.
//!
//! Nothing here takes a lock: liveness comes from `/proc/locks` (Linux), so looking never
//! disturbs a holder or makes a concurrent acquire see a lock that is not a holder's.

use std::collections::HashSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::Serialize;

use crate::error::Error;
use crate::machine::{self, Decision, Event, Input, Liveness, Outcome};
use crate::name::Owner;
use crate::record::{self, MAX_RECORD_BYTES};
use crate::timestamp::Timestamp;

/// What one session of a lease directory looks like now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SessionStatus {
    /// The session's file stem.
    pub stem: String,
    /// The recorded owner (empty once released).
    pub owner: String,
    /// The recorded fencing token.
    pub token: u64,
    /// The recorded expiry, RFC 3339.
    pub expiry: String,
    /// `live` (unexpired, its holder's lock is held), `dead` (unexpired, but its holder is
    /// gone), `unknown` (unexpired, its liveness file is missing), `expired`, `released`, or
    /// `corrupt`.
    pub state: &'static str,
    /// Whether an acquire by another owner would be granted now (the machine's answer).
    pub acquirable: bool,
    /// For a corrupt record, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Lists the sessions of `dir` (every `<stem>.lease.json`), sorted by stem, as of `now`.
///
/// # Errors
///
/// [`Error::Io`] when the directory cannot be read. A corrupt record is reported in its row.
pub fn scan(dir: &Path, now: Timestamp) -> Result<Vec<SessionStatus>, Error> {
    let locked = flock_inodes();
    let mut out = vec![];
    for entry in fs::read_dir(dir).map_err(|e| Error::io("read directory", dir, e))? {
        let entry = entry.map_err(|e| Error::io("read directory", dir, e))?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".lease.json")) else {
            continue;
        };
        out.push(status_of(dir, stem, now, &locked));
    }
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    Ok(out)
}

fn status_of(
    dir: &Path,
    stem: &str,
    now: Timestamp,
    locked: &HashSet<(u64, u64)>,
) -> SessionStatus {
    let corrupt = |error: String| SessionStatus {
        stem: stem.to_owned(),
        owner: String::new(),
        token: 0,
        expiry: String::new(),
        state: "corrupt",
        acquirable: false,
        error: Some(error),
    };
    let path = dir.join(format!("{stem}.lease.json"));
    let mut bytes = vec![];
    let read = fs::File::open(&path)
        .and_then(|f| f.take(MAX_RECORD_BYTES as u64 + 1).read_to_end(&mut bytes));
    if let Err(e) = read {
        return corrupt(format!("{}: {e}", path.display()));
    }
    let rec = match record::decode(&bytes) {
        Ok(r) => r,
        Err(e) => return corrupt(e.to_string()),
    };
    let live = dir.join(format!("{stem}.{}.live", rec.token));
    let liveness = match fs::symlink_metadata(&live) {
        Err(_) => Liveness::Missing,
        Ok(m) if locked.contains(&(m.dev(), m.ino())) => Liveness::Live,
        Ok(_) => Liveness::Dead,
    };
    let state = if rec.is_tombstone() {
        "released"
    } else if machine::is_expired(rec.expiry, now) {
        "expired"
    } else {
        match liveness {
            Liveness::Live => "live",
            Liveness::Dead => "dead",
            Liveness::Missing => "unknown",
        }
    };
    // Ask the machine whether a stranger's acquire would be granted.
    let stranger = Owner::new("\u{fffd}status").unwrap_or_else(|_| unreachable!("valid owner"));
    let input = Input {
        record: Some(rec.clone()),
        liveness: Some(liveness),
        local: None,
        now,
        ttl: std::time::Duration::from_secs(1),
        event: Event::Acquire { owner: stranger },
    };
    let acquirable = matches!(
        machine::step(&input),
        Ok(Decision::Plan(p)) if matches!(p.outcome, Outcome::Granted { .. })
    );
    SessionStatus {
        stem: stem.to_owned(),
        owner: rec.owner,
        token: rec.token,
        expiry: rec.expiry.to_string(),
        state,
        acquirable,
        error: None,
    }
}

/// (device, inode) of every file with a granted `flock` lock, from `/proc/locks`.
fn flock_inodes() -> HashSet<(u64, u64)> {
    let text = fs::read_to_string("/proc/locks").unwrap_or_default();
    text.lines().filter_map(parse_lock_line).collect()
}

/// `1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF` → (makedev(0xfd, 0x01), 1234). Waiters
/// (`1: -> FLOCK ...`) and other lock kinds are skipped.
fn parse_lock_line(line: &str) -> Option<(u64, u64)> {
    let mut words = line.split_whitespace().skip(1);
    if words.next()? != "FLOCK" {
        return None;
    }
    let id = words.nth(3)?;
    let mut parts = id.split(':');
    let major = u64::from_str_radix(parts.next()?, 16).ok()?;
    let minor = u64::from_str_radix(parts.next()?, 16).ok()?;
    let ino = parts.next()?.parse().ok()?;
    Some((nix::sys::stat::makedev(major, minor), ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_locks_lines() {
        assert_eq!(
            parse_lock_line("1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"),
            Some((nix::sys::stat::makedev(0xfd, 1), 1234))
        );
        assert_eq!(
            parse_lock_line("2: -> FLOCK  ADVISORY  WRITE 4243 fd:01:1234 0 EOF"),
            None
        );
        assert_eq!(
            parse_lock_line("3: POSIX  ADVISORY  WRITE 4244 00:2e:99 0 EOF"),
            None
        );
        assert_eq!(parse_lock_line("garbage"), None);
    }
}
