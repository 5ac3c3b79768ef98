//! `flocklease mend`: repairs an id whose record no call can use (a FIFO, a directory, a
//! symbolic link or garbage at `<stem>.lease.json`, or a record deleted or moved back below its
//! generations' files) with the library's [`flocklease::mend::mend`], never losing the token.
//!
//! A command of its own rather than an option of `status`: `status` promises to take no lock
//! and change nothing, while mending takes the id's transition lock and writes the record.

use std::path::PathBuf;

use clap::Args;
use flocklease::mend::{Mended, mend};
use flocklease::{Clock, SessionId, SystemClock};

use crate::{EXIT_ERROR, EXIT_HELD};

/// The arguments of `mend`.
#[derive(Args)]
pub struct MendArgs {
    /// The lease directory [default: $FLOCKLEASE_DIR, else /run/lock/flocklease for root and
    /// $XDG_RUNTIME_DIR/flocklease (or /run/user/UID/flocklease) for other users, as `run`].
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    dir: Option<PathBuf>,
    /// The session id whose record to mend.
    #[arg(long, value_name = "ID", value_parser = crate::run::nonempty_id)]
    id: String,
    /// The token to write is at least N: what you know beyond the directory (a fence file's
    /// count, a job's log of FLOCKLEASE_TOKEN). A release deletes its generation's file, so a
    /// record replaced after a release leaves nothing in the directory to read its token from.
    #[arg(long, value_name = "N", default_value_t = 0)]
    at_least: u64,
}

/// Runs `mend`, returning the exit status.
pub fn main(a: &MendArgs) -> u8 {
    let dir = match crate::dirs::lease_dir(a.dir.as_deref()) {
        Ok(dir) => dir,
        Err(no) => return no.report(),
    };
    let id = match SessionId::new(a.id.as_str()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("flocklease: {}", crate::describe(&e));
            return crate::EXIT_USAGE;
        }
    };
    let shown = id.as_str().escape_debug();
    match mend(&dir, &id, SystemClock.now(), a.at_least) {
        Ok(Mended::Wrote {
            path,
            token,
            replaced,
        }) => {
            println!(
                "{shown}: mended: {} was {replaced}; wrote a released record of token {token}, \
                 the highest the directory shows or --at-least gave (the next holder gets {})",
                path.display(),
                token.saturating_add(1)
            );
            0
        }
        Ok(Mended::NoToken { replaced }) => {
            eprintln!(
                "flocklease: refusing to mend {shown}: its record is {replaced}, and no \
                 generation's file is left to read a token from (a release deletes its own); \
                 nothing written. Mend with --at-least N, N the highest token handed out (a \
                 fence file's count, FLOCKLEASE_TOKEN in a job's log; 1 if none was)"
            );
            crate::EXIT_USAGE
        }
        Ok(Mended::Sound { token: Some(token) }) => {
            println!(
                "{shown}: nothing to mend: the record reads (token {token}) and no generation's \
                 file names a greater token"
            );
            0
        }
        Ok(Mended::Sound { token: None }) => {
            println!(
                "{shown}: nothing to mend: no record and no generation's file (never granted)"
            );
            0
        }
        Ok(Mended::Live { path }) => {
            eprintln!(
                "flocklease: refusing to mend {shown}: a holder lives ({} is locked); nothing \
                 written. Stop the holder, or mend once it has gone",
                path.display()
            );
            EXIT_HELD
        }
        Ok(Mended::Unexpired { owner, expiry }) => {
            eprintln!(
                "flocklease: refusing to mend {shown}: the record names {} until {expiry} \
                 although a generation's file names a greater token (moved back?); nothing \
                 written. Mend after the expiry",
                owner.escape_debug()
            );
            EXIT_HELD
        }
        Ok(other) => {
            eprintln!("flocklease: {shown}: {other:?}");
            EXIT_ERROR
        }
        Err(e) => {
            eprintln!("flocklease: {}", crate::describe(&e));
            EXIT_ERROR
        }
    }
}
