//! `flocklease`: session leases for shells and cron, modelled on `flock(1)`.
//!
//! `flocklease run` holds a lease while a command runs (renewing it, killing the command if the
//! lease is lost); `flocklease status` shows a lease directory without disturbing anyone.

use std::path::PathBuf;
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use flocklease::{Clock, FlockLease, Grant, KeepAlive, Lease, Owner, SessionId, SystemClock};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Exit status when the lease is held by another live owner (like `flock -E`).
const EXIT_HELD: u8 = 75;
/// Exit status when the lease was lost while the command ran (the command was stopped).
const EXIT_LOST: u8 = 76;
/// Exit status for a usage or lease-directory error.
const EXIT_ERROR: u8 = 70;

#[derive(Parser)]
#[command(
    name = "flocklease",
    version,
    about = "Exclusive, time-limited session leases with fencing tokens, for shells and cron",
    after_help = "Exit status of `run`: the command's own; 75 when the lease is held elsewhere; \
                  76 when the lease was lost and the command stopped; 70 on an error."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command while holding the lease of a session id.
    ///
    /// The command gets FLOCKLEASE_TOKEN, FLOCKLEASE_ID, FLOCKLEASE_OWNER, FLOCKLEASE_EXPIRY and
    /// FLOCKLEASE_DIR in its environment. The lease is renewed every TTL/3 while it runs and
    /// released when it exits. If the lease is lost, the command gets SIGTERM, then SIGKILL
    /// after the grace period.
    Run(RunArgs),
    /// List the sessions of a lease directory without taking any lock.
    Status {
        /// The lease directory.
        #[arg(long)]
        dir: PathBuf,
        /// Only this session id.
        #[arg(long)]
        id: Option<String>,
        /// JSON output (an array of objects).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run(args) => run(args),
        Cmd::Status { dir, id, json } => status(&dir, id.as_deref(), json),
    };
    match result {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("flocklease: {msg}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// The arguments of `run`.
#[derive(Args)]
struct RunArgs {
    /// The lease directory.
    #[arg(long)]
    dir: PathBuf,
    /// The session id.
    #[arg(long)]
    id: String,
    /// The owner recorded in the lease (default: HOST:PID).
    #[arg(long)]
    owner: Option<String>,
    /// Lease time-to-live (e.g. 30s, 500ms, 2m).
    #[arg(long, default_value = "30s", value_parser = duration)]
    ttl: Duration,
    /// How long to wait for the lease when it is held (default: do not wait).
    #[arg(long, value_parser = duration)]
    wait: Option<Duration>,
    /// Time between SIGTERM and SIGKILL after a loss.
    #[arg(long, default_value = "5s", value_parser = duration)]
    grace: Duration,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<String>,
}

fn run(a: RunArgs) -> Result<ExitCode, String> {
    let id = SessionId::new(a.id).map_err(|e| e.to_string())?;
    let owner = match a.owner {
        Some(o) => o,
        None => format!(
            "{}:{}",
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".into()),
            std::process::id()
        ),
    };
    let owner = Owner::new(owner).map_err(|e| e.to_string())?;
    let leases = Arc::new(
        FlockLease::builder(&a.dir)
            .ttl(a.ttl)
            .open()
            .map_err(|e| e.to_string())?,
    );
    let Some(lease) = acquire(&leases, &id, &owner, a.wait)? else {
        eprintln!("flocklease: {id} is held by another owner");
        return Ok(ExitCode::from(EXIT_HELD));
    };
    let mut child = Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("FLOCKLEASE_TOKEN", lease.token.to_string())
        .env("FLOCKLEASE_ID", id.as_str())
        .env("FLOCKLEASE_OWNER", owner.as_str())
        .env("FLOCKLEASE_EXPIRY", lease.expiry.to_string())
        .env("FLOCKLEASE_DIR", &a.dir)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", a.command[0]))?;
    let keep = KeepAlive::start(Arc::clone(&leases), lease);
    let pid = Pid::from_raw(child.id() as i32);
    let status = loop {
        // Not yet reaped, so the pid cannot have been reused while we signal it.
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Outcome::Exited(status);
        }
        if let Some(loss) = keep.wait_lost(Some(Duration::from_millis(20))) {
            eprintln!("flocklease: {loss}; stopping {}", a.command[0]);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + a.grace;
            while child.try_wait().map_err(|e| e.to_string())?.is_none() {
                if Instant::now() >= deadline {
                    let _ = kill(pid, Signal::SIGKILL);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.wait();
            break Outcome::Lost;
        }
    };
    if let Err(e) = keep.release() {
        eprintln!("flocklease: release failed (the lease will expire): {e}");
    }
    Ok(match status {
        Outcome::Lost => ExitCode::from(EXIT_LOST),
        Outcome::Exited(s) => ExitCode::from(exit_code(s)),
    })
}

enum Outcome {
    Exited(ExitStatus),
    Lost,
}

/// Acquires; with `wait`, blocks until the holder releases, dies or expires, at most that long.
fn acquire(
    leases: &FlockLease,
    id: &SessionId,
    owner: &Owner,
    wait: Option<Duration>,
) -> Result<Option<Lease>, String> {
    match wait {
        None => match leases.acquire(id, owner).map_err(|e| e.to_string())? {
            Grant::Granted(l) => Ok(Some(l)),
            Grant::Held => Ok(None),
        },
        Some(w) => match leases
            .acquire_wait(id, owner, w)
            .map_err(|e| e.to_string())?
        {
            Grant::Granted(l) => Ok(Some(l)),
            Grant::Held => Ok(None),
        },
    }
}

fn exit_code(s: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => 1,
    }
}

fn status(dir: &std::path::Path, id: Option<&str>, json: bool) -> Result<ExitCode, String> {
    let mut rows = flocklease::status::scan(dir, SystemClock.now()).map_err(|e| e.to_string())?;
    if let Some(id) = id {
        let id = SessionId::new(id).map_err(|e| e.to_string())?;
        let stem = id.stem();
        rows.retain(|r| r.stem == stem);
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<58} {:<24} {:>6} {:<32} STATE",
        "STEM", "OWNER", "TOKEN", "EXPIRY"
    );
    for r in rows {
        let state = match (&r.error, r.acquirable) {
            (Some(e), _) => format!("{} ({e})", r.state),
            (None, true) => format!("{} (free to acquire)", r.state),
            (None, false) => r.state.to_owned(),
        };
        println!(
            "{:<58} {:<24} {:>6} {:<32} {state}",
            r.stem, r.owner, r.token, r.expiry
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `30s`, `500ms`, `2m`, `1h`, or plain seconds.
fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration"))?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{s:?}: unit must be ms, s, m or h")),
    })
}
