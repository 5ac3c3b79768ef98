//! `flocklease fence`: admits a fencing token at a fence file, or writes standard input to a
//! file only if the token is admitted, so shell jobs can fence their output.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use flocklease::{Admission, Fence};

use crate::{EXIT_ERROR, EXIT_STALE, EXIT_USAGE, duration};

/// The variable `run` gives its job the token in.
const TOKEN_VAR: &str = "FLOCKLEASE_TOKEN";

/// The arguments of `fence`.
#[derive(Args)]
pub struct FenceArgs {
    /// The fence file: the highest token admitted so far, as decimal text (created at the
    /// first admission, in a directory that must exist; its lock is FILE.lock).
    #[arg(long, value_name = "FILE")]
    fence: PathBuf,
    /// The fencing token [default: $FLOCKLEASE_TOKEN, which `flocklease run` gives its job].
    #[arg(long, value_name = "N")]
    token: Option<u64>,
    /// Read all of standard input, then write it to TARGET as a whole (a temporary file
    /// renamed over it) only if the token is admitted; a refused token leaves TARGET as it
    /// was. Without --write, the token is only admitted (and recorded).
    #[arg(long, value_name = "TARGET")]
    write: Option<PathBuf>,
    /// How long to wait for the fence's lock before failing.
    #[arg(long, default_value = "5s", value_name = "DURATION",
          value_parser = duration::parse, allow_hyphen_values = true)]
    lock_timeout: Duration,
}

/// Runs `fence`, returning the exit status.
pub fn main(args: &FenceArgs) -> u8 {
    let token = match args.token {
        Some(token) => token,
        None => match token_from_env(std::env::var_os(TOKEN_VAR)) {
            Ok(token) => token,
            Err(msg) => {
                eprintln!("flocklease: {msg}");
                return EXIT_USAGE;
            }
        },
    };
    match fence(args, token) {
        Ok(Admission::Admitted { .. }) => 0,
        Ok(Admission::Refused { highest }) => {
            eprintln!(
                "flocklease: token {token} refused: the fence {} has admitted {highest}",
                args.fence.display()
            );
            // The one way an honest holder meets this for good: its lease directory started
            // over (tmpfs after a reboot, a removed directory) while the fence kept its count.
            eprintln!(
                "flocklease: if the lease directory was reset (tokens start again at 1 on tmpfs \
                 after a reboot, or in a directory made anew), every token stays below {highest} \
                 here: keep leases and fence on the same kind of storage, or remove the fence \
                 file once no holder of a token up to {highest} can still write"
            );
            EXIT_STALE
        }
        Err(msg) => {
            eprintln!("flocklease: {msg}");
            EXIT_ERROR
        }
    }
}

fn fence(args: &FenceArgs, token: u64) -> Result<Admission, String> {
    // All of the input first: the lock is held for the write alone, not for as long as the
    // producer takes.
    let input = match &args.write {
        Some(_) => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| format!("read standard input: {e}"))?;
            Some(bytes)
        }
        None => None,
    };
    let fence = Fence::builder(&args.fence)
        .lock_timeout(args.lock_timeout)
        .open()
        .map_err(|e| crate::describe(&e))?;
    match (&args.write, input) {
        (Some(target), Some(bytes)) => fence.write_file(token, target, &bytes),
        _ => fence.admit(token),
    }
    .map_err(|e| crate::describe(&e))
}

/// The token in `$FLOCKLEASE_TOKEN`, or why there is none.
fn token_from_env(value: Option<OsString>) -> Result<u64, String> {
    let Some(value) = value else {
        return Err(format!(
            "no token: give --token N, or run under `flocklease run`, which sets {TOKEN_VAR}"
        ));
    };
    value
        .to_str()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| format!("{TOKEN_VAR} is not a token: {value:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_environment_or_is_refused_with_the_value_quoted() {
        assert_eq!(token_from_env(Some("42".into())), Ok(42));
        assert!(token_from_env(None).unwrap_err().contains("--token"));
        for bad in ["", "-1", "4x", " 4", "18446744073709551616"] {
            let msg = token_from_env(Some(bad.into())).unwrap_err();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        }
    }
}
