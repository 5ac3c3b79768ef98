//! `flocklease run`: hold a session lease while a job runs.
//!
//! The promise (PROTOCOL §7): **no process of the job runs while another `run` holds the
//! lease, unless `run` and its watchdog are both down at once.** How it is kept:
//!
//! - the job runs in its own process group; SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2
//!   and SIGWINCH received by `run` are forwarded to the group; after SIGTERM or SIGINT `run`
//!   keeps renewing while the job drains, sends SIGKILL to the group after `--grace`, and
//!   releases only once the group is empty (the others start no grace period: a job may
//!   survive a reload or a log-reopen request);
//! - when the command exits, processes it left in its group get SIGTERM, then SIGKILL after
//!   `--grace`, before the release;
//! - when the lease is lost, the whole group gets SIGTERM, then SIGKILL after `--grace`;
//! - the hard deadline (the last confirmed expiry less the margin, on the boot-time clock) is
//!   applied by `run`'s main loop and by the [watchdog](crate::watchdog), on every path;
//! - when `run` itself dies, the watchdog, which keeps every liveness file the lease manager
//!   published (sent to it before each was placed), stops the group as
//!   [`flocklease::supervise::next`] says; when the watchdog dies, `run` stops the group.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args, ValueEnum};
use flocklease::{
    Clock, Durability, Error, FlockLease, KeepAlive, Lease, Owner, SessionId, SessionLease,
    SystemClock,
};
use nix::sys::signal::Signal;

use flocklease::supervise::{Do, Exit as RunExit, RunSide, Said, Seen};

use crate::job::{self, Exit, Job};
use crate::say::say;
use crate::signals::{self, Event, Route, Signals};
use crate::watchdog::{Channel, Deadlines, Heard, Watchdog, boot_nanos};
use crate::{
    EXIT_DEADLINE, EXIT_ERROR, EXIT_HELD, EXIT_LOST, EXIT_WATCHDOG_GONE, duration, status,
};

/// While the command has exited but processes of its group remain, how often `run` checks
/// whether they are gone (their deaths are not signalled to it unless it is their parent).
const DRAIN_POLL: Duration = Duration::from_millis(10);
/// The longest the main loop sleeps without an event (it re-checks the lease then).
const IDLE: Duration = Duration::from_secs(1);
/// How long `run` waits for its watchdog to say whether it killed the job (it answers within
/// a scheduling delay unless it is stopped).
const WATCHDOG_WORD: Duration = Duration::from_secs(1);

/// The arguments of `run`.
#[derive(Args)]
#[command(group(ArgGroup::new("what").required(true).args(["command", "shell_command"])))]
#[command(group(ArgGroup::new("where").args(["dir", "pg"])))]
pub struct RunArgs {
    /// The lease directory [default: $FLOCKLEASE_DIR, else /run/lock/flocklease for root and
    /// $XDG_RUNTIME_DIR/flocklease (or /run/user/UID/flocklease) for other users: tmpfs, so
    /// tokens start again at 1 after a reboot]. Created (mode 0700) if missing, but only its
    /// last component: a missing parent is an error.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    dir: Option<PathBuf>,
    /// In a directory shared with other users (sticky and world-writable, such as /run/lock
    /// itself): accept lease files that belong to another user (by default they are refused,
    /// since anyone could have planted them). Only a file's owner or root may replace it
    /// there: for root and users together, use a group directory and --file-mode 660.
    #[arg(long, conflicts_with = "pg")]
    trust_foreign_owners: bool,
    /// The mode of lease files, in octal: 660 for a directory shared by a group (make it
    /// setgid: chgrp GROUP DIR && chmod 2770 DIR). Applied whatever the umask.
    #[arg(long, value_name = "OCTAL", value_parser = octal_mode, conflicts_with = "pg")]
    file_mode: Option<u32>,
    /// Accept a lease directory on a network or FUSE file system (NFS, SMB, sshfs, ...),
    /// refused by default: flock(2) there is not the kernel's own on one host.
    #[arg(long, conflicts_with = "pg")]
    allow_network_filesystem: bool,
    /// Keep the lease in PostgreSQL instead (a connection string: `host=… user=… dbname=…`
    /// or `postgresql://…`): one host of a fleet at a time. If `run` is killed, the lease is
    /// free at once (its connection ends) and the watchdog kills the job at once (SIGKILL, no
    /// grace period); fence with FLOCKLEASE_TOKEN for the milliseconds between. Needs a
    /// binary built with the `postgres` feature.
    #[arg(long, value_name = "CONNINFO", conflicts_with_all = ["dir", "durability"])]
    pg: Option<String>,
    /// With --pg: verify the server's TLS certificate against the CA certificates in this
    /// PEM file, and require TLS (`sslmode=require` alone verifies against the system's
    /// roots). Needs a binary built with the `postgres-tls` feature.
    #[arg(long, value_name = "PEM", requires = "pg")]
    pg_ca: Option<PathBuf>,
    /// The session id (any text but the empty one; `/` and the like are safe).
    #[arg(long, value_name = "ID", value_parser = nonempty_id)]
    id: String,
    /// The owner recorded in the lease [default: HOST:PID].
    #[arg(long, value_name = "OWNER")]
    owner: Option<String>,
    /// Lease time-to-live, at least 500ms: renewed every third of it; the job is killed a
    /// tenth of it (50 ms to 1 s) before the expiry if no renew was confirmed; the longest
    /// others wait after `run` and its watchdog were both killed. Durations: 30s, 1.5s, 500ms,
    /// 2m30s, 10 (seconds).
    #[arg(long, default_value = "30s", value_name = "DURATION",
          value_parser = duration::ttl, allow_hyphen_values = true)]
    ttl: Duration,
    /// Fail at once when the lease is held (the default; accepted as in flock(1)).
    #[arg(
        short = 'n',
        long = "nonblock",
        visible_alias = "nb",
        conflicts_with = "wait"
    )]
    nonblock: bool,
    /// Wait at most this long for the lease to be released, its holder to die or to expire.
    /// With --pg, a lost or refused connection (a failover) is tried again until then.
    #[arg(short = 'w', long = "wait", visible_alias = "timeout", value_name = "DURATION",
          value_parser = duration::parse, allow_hyphen_values = true)]
    wait: Option<Duration>,
    /// Exit status when the lease is held by another owner.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N", default_value_t = EXIT_HELD)]
    conflict_exit_code: u8,
    /// Print nothing when the lease is held (cron then mails nothing).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// An exclusive lease: always (accepted as in flock(1)).
    #[arg(short = 'x', long = "exclusive", visible_alias = "ex")]
    exclusive: bool,
    /// flock(1)'s options that have no lease counterpart; refused with a message.
    #[arg(short = 's', long = "shared", visible_alias = "sh", hide = true)]
    shared: bool,
    #[arg(short = 'u', long = "unlock", hide = true)]
    unlock: bool,
    #[arg(short = 'o', long = "close", hide = true)]
    close: bool,
    #[arg(short = 'F', long = "no-fork", hide = true)]
    no_fork: bool,
    /// Time between SIGTERM and SIGKILL when the job is stopped.
    #[arg(long, default_value = "5s", value_name = "DURATION",
          value_parser = duration::parse, allow_hyphen_values = true)]
    grace: Duration,
    /// `full`: fsync the record (tokens survive power loss); `nosync`: for tmpfs.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Full, value_name = "MODE")]
    durability: DurabilityArg,
    /// Run CMD with `sh -c`.
    #[arg(short = 'c', long = "command", value_name = "CMD")]
    shell_command: Option<String>,
    /// The command and its arguments (after `--`, or after the options). Options are parsed
    /// strictly up to it: an unknown one is bad usage, never run as the command.
    #[arg(trailing_var_arg = true, value_name = "COMMAND",
          value_hint = clap::ValueHint::CommandWithArguments)]
    command: Vec<String>,
}

/// `--durability`.
#[derive(Clone, Copy, ValueEnum)]
enum DurabilityArg {
    /// Fsync the record and the directory.
    Full,
    /// No fsync.
    Nosync,
}

/// A session id given on the command line: any text the library accepts as one (not empty,
/// no control character), checked here so that a bad one is bad usage (64).
pub(crate) fn nonempty_id(s: &str) -> Result<String, String> {
    SessionId::new(s)
        .map(|_| s.to_owned())
        .map_err(|e| crate::describe(&e))
}

/// `--file-mode`: octal permission bits.
fn octal_mode(s: &str) -> Result<u32, String> {
    let digits = s.trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        // The owner must be able to read and write its own lease files.
        Ok(mode)
            if digits.bytes().all(|b| b.is_ascii_digit())
                && mode <= 0o777
                && mode & 0o600 == 0o600 =>
        {
            Ok(mode)
        }
        _ => Err(format!(
            "{s:?} is not an octal file mode with read and write for the owner, such as 600, \
             640 or 660"
        )),
    }
}

/// Why `a` cannot run, as bad usage: flock(1)'s options without a lease counterpart, or no
/// place for the lease.
fn usage_problem(a: &RunArgs) -> Option<String> {
    let unsupported = [
        (
            a.shared,
            "-s/--shared: a lease is exclusive; use the library for shared access",
        ),
        (
            a.unlock,
            "-u/--unlock: a lease is released when the job ends (or by the library)",
        ),
        (
            a.close,
            "-o/--close: the lease is kept by run and its watchdog, not by a descriptor the \
             job could close (the copy the job inherits matters only if both die; a daemon \
             that keeps it keeps the lease live until the expiry)",
        ),
        (
            a.no_fork,
            "-F/--no-fork: run must outlive the command to renew and release",
        ),
    ];
    if let Some((_, why)) = unsupported.iter().find(|(set, _)| *set) {
        return Some(format!("flocklease run does not support {why}"));
    }
    if let [only] = a.command.as_slice()
        && !only.is_empty()
        && only.bytes().all(|b| b.is_ascii_digit())
    {
        return Some(format!(
            "flocklease run does not take flock(1)'s file-descriptor form ({only} is taken \
             for a descriptor number, not a command): a lease lives as long as the command \
             it runs. Instead of `exec {only}>FILE; flock {only}` in a script, run the whole \
             script under the lease: `[ -n \"$FLOCKLEASE_TOKEN\" ] || exec flocklease run \
             --id NAME -- \"$0\" \"$@\"` as its first line"
        ));
    }
    None
}

/// Runs `run`, returning the exit status.
pub fn main(mut args: RunArgs) -> u8 {
    if let Some(problem) = usage_problem(&args) {
        say!("{problem}");
        return crate::EXIT_USAGE;
    }
    if args.pg.is_none() {
        match crate::dirs::lease_dir(args.dir.as_deref()) {
            Ok(dir) => args.dir = Some(dir),
            Err(no) => return no.report(),
        }
    }
    match run(args) {
        Ok(code) => code,
        Err(msg) => {
            say!("flocklease: {msg}");
            EXIT_ERROR
        }
    }
}

fn run(a: RunArgs) -> Result<u8, String> {
    // First, before any thread exists: every thread inherits the blocked signals.
    let signals = Signals::start()?;
    job::become_subreaper()?;
    let id = SessionId::new(a.id.as_str()).map_err(|e| crate::describe(&e))?;
    let owner = Owner::new(a.owner.clone().unwrap_or_else(default_owner))
        .map_err(|e| crate::describe(&e))?;
    // The watchdog's socket, before the lease: the lease manager sends the generation's
    // liveness file over it as it publishes it, so the watchdog keeps every one it places.
    let channel = Channel::new()
        .inspect_err(|e| say!("flocklease: {e}; running without a watchdog"))
        .ok();
    if let Some(url) = a.pg.clone() {
        return run_pg(&a, &url, &signals, &id, &owner, channel);
    }
    // `main` resolved the directory (--dir, FLOCKLEASE_DIR or the default).
    let given = a.dir.as_deref().unwrap_or_else(|| unreachable!());
    // The library's rule for the directory: its last component is created if missing, never
    // its parents (a mistyped parent is an error naming it).
    let mut builder = FlockLease::builder(given)
        .ttl(a.ttl)
        .trust_foreign_owners(a.trust_foreign_owners)
        .allow_network_filesystem(a.allow_network_filesystem);
    if let Some(mode) = a.file_mode {
        builder = builder.file_mode(mode);
    }
    if let Some(sharer) = channel.as_ref().and_then(Channel::sharer) {
        builder = builder.share_liveness(sharer);
    }
    let leases = Arc::new(
        builder
            .durability(match a.durability {
                DurabilityArg::Full => Durability::Full,
                DurabilityArg::Nosync => Durability::NoSync,
            })
            .open()
            .map_err(|e| crate::describe(&e))?,
    );
    // The job is told the absolute path (it may change its working directory).
    let dir = fs::canonicalize(given).map_err(|e| format!("resolve {}: {e}", given.display()))?;
    // `-w 0` is `-n`, as in flock(1).
    let wait = a.wait.filter(|w| !w.is_zero());
    let Some(lease) = acquire(&leases, &id, &owner, wait).map_err(|e| crate::describe(&e))? else {
        if !a.quiet {
            say!("flocklease: {}", held_message(&dir, &id, wait));
        }
        return Ok(a.conflict_exit_code);
    };
    // From here on, dropping `keep` (any early return) releases the lease.
    let (tx, rx) = mpsc::channel();
    let deadlines = Deadlines::default();
    let keep = {
        let tx = tx.clone();
        KeepAlive::builder(Arc::clone(&leases), lease.clone())
            .on_renew(tell_expiry(&deadlines, leases.clock()))
            .on_loss(move |_| {
                let _ = tx.send(Event::Lost);
            })
            .start()
            .map_err(|e| {
                // No renewer (the lease has almost no time left): give it back.
                let _ = leases.release(&lease);
                e.to_string()
            })?
    };
    // Best effort: without it, `status` shows the stem only.
    let mode = a.file_mode.unwrap_or(0o600);
    let _ = flocklease::status::write_id(&dir, &id, mode);
    let live = || leases.liveness_fd(&lease).map_err(|e| crate::describe(&e));
    let clock = leases.clock();
    hold(
        &a,
        &signals,
        keep,
        (tx, rx),
        &owner,
        live,
        Some(&dir),
        (&deadlines, &*clock, channel),
    )
}

/// The keep-alive's renew callback: passes each renewed expiry to the watchdog, as an instant
/// of the boot-time clock (see [`Deadlines`]).
fn tell_expiry(deadlines: &Deadlines, clock: Arc<dyn Clock>) -> impl Fn(&Lease) + Send + 'static {
    let deadlines = deadlines.clone();
    move |lease| deadlines.note(local_deadline(&*clock, lease))
}

/// `lease`'s expiry, judged by `clock` (the backend's), as an instant of the boot-time clock
/// in nanoseconds: now plus the time the lease has left. A wall-clock step after this does
/// not move it.
fn local_deadline(clock: &dyn Clock, lease: &Lease) -> u64 {
    let left = lease.expiry.saturating_duration_since(clock.now());
    boot_nanos().saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
}

/// Runs the job while `keep` keeps its lease alive, then releases; returns the exit status.
/// `live` gives the liveness descriptor the job inherits (flock), if any; `dir` is put in the
/// job's environment; `deadlines` (filled by `keep`'s renews) tell the watchdog the expiry,
/// judged by `clock`, over `channel`.
#[allow(clippy::too_many_arguments)]
fn hold<L: SessionLease + 'static>(
    a: &RunArgs,
    signals: &Signals,
    keep: KeepAlive<L>,
    (tx, rx): (mpsc::Sender<Event>, Receiver<Event>),
    owner: &Owner,
    live: impl FnOnce() -> Result<Option<std::os::fd::OwnedFd>, String>,
    dir: Option<&Path>,
    (deadlines, clock, channel): (&Deadlines, &dyn Clock, Option<Channel>),
) -> Result<u8, String> {
    let lease = keep.lease();
    let id = &lease.session_id;
    let live = live()?;
    // If `run` dies, the watchdog decides (`supervise::next`): it keeps the liveness file the
    // lease manager sent it, so the job gets the grace period, bounded by the expiry; without
    // one (`--pg`: the liveness is `run`'s connection, which ends with it), SIGKILL at once.
    // Without a watchdog (no /proc to find our own binary), the inherited liveness descriptor
    // still keeps the lease live for the job of a killed `run`, up to the expiry.
    deadlines.note(local_deadline(clock, &keep.lease()));
    let mut watchdog = channel
        .ok_or_else(|| "no watchdog socket".to_owned())
        .and_then(|c| c.spawn(a.grace, flocklease::supervise::margin(a.ttl)))
        .inspect_err(|e| {
            say!(
                "flocklease: {e}; if run is killed, its job is not stopped (the lease stays \
                 live until its expiry)"
            );
        })
        .ok();
    if let Some(w) = &watchdog {
        let tx = tx.clone();
        let deadlines = deadlines.clone();
        w.listen(move |heard| {
            let _ = tx.send(match heard {
                Heard::Killed => Event::WatchdogKilled,
                Heard::Gone => Event::WatchdogGone,
                Heard::Deadline(at) => return deadlines.heard(at),
            });
        });
    }
    // The watchdog knows the expiry before the job runs (and the job's group from the job
    // itself, before its command runs): a `run` stopped right after the start still has its
    // job killed before the lease can lapse.
    if let Some(pipe) = watchdog.as_ref().and_then(Watchdog::writer) {
        deadlines.attach(pipe);
    }
    let (mut cmd, name) = command(a);
    cmd.env("FLOCKLEASE_TOKEN", lease.token.to_string())
        .env("FLOCKLEASE_ID", id.as_str())
        .env("FLOCKLEASE_OWNER", owner.as_str())
        .env("FLOCKLEASE_EXPIRY", lease.expiry.to_string());
    if let Some(dir) = dir {
        cmd.env("FLOCKLEASE_DIR", dir);
    }
    let spawned = {
        let mut route = signals.lock();
        let arm = watchdog.as_ref().map(Watchdog::raw_fd);
        let spawned = Job::spawn(&mut cmd, live.as_ref(), job::Terminal::foreground(), arm);
        if spawned.is_ok() {
            *route = Route::Loop(tx);
        }
        spawned
    };
    // The job has its own copy; ours would keep the generation's lock after the release.
    drop(live);
    let job = match spawned {
        Ok(job) => job,
        Err(e) => {
            deadlines.detach();
            if let Some(w) = watchdog {
                w.done();
            }
            say!("flocklease: cannot run {name}: {e}");
            release(keep);
            return Ok(if e.kind() == io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    if let Some(w) = &mut watchdog {
        w.arm(job.pgid());
    }
    let margin = flocklease::supervise::margin(a.ttl);
    let code = supervise(
        job,
        &keep,
        (&rx, watchdog.as_ref()),
        (a.grace, a.ttl),
        (deadlines, margin),
    );
    deadlines.detach();
    if let Some(w) = watchdog {
        w.done();
    }
    release(keep);
    Ok(code)
}

/// A `PgLease` builder for `url`, with TLS verified against `ca` when given.
#[cfg(feature = "postgres")]
pub(crate) fn pg_builder(
    url: &str,
    ca: Option<&std::path::Path>,
) -> Result<flocklease::pg::PgLeaseBuilder, String> {
    let builder = flocklease::pg::PgLease::builder(url);
    let Some(ca) = ca else {
        return Ok(builder);
    };
    #[cfg(feature = "postgres-tls")]
    {
        let tls = flocklease::pg::PgTls::ca_file(ca).map_err(|e| crate::describe(&e))?;
        Ok(builder.tls(tls))
    }
    #[cfg(not(feature = "postgres-tls"))]
    {
        Err(format!(
            "--pg-ca {}: this flocklease was built without TLS (the `postgres-tls` feature)",
            ca.display()
        ))
    }
}

/// `run --pg`: the lease in PostgreSQL, the job supervised as with a directory.
#[cfg(feature = "postgres")]
fn run_pg(
    a: &RunArgs,
    url: &str,
    signals: &Signals,
    id: &SessionId,
    owner: &Owner,
    channel: Option<Channel>,
) -> Result<u8, String> {
    let wait = a.wait.filter(|w| !w.is_zero());
    let (leases, grant) = pg_acquire(a, url, id, owner, wait)?;
    let Some(lease) = grant.lease() else {
        if !a.quiet {
            let waited = wait.map_or(String::new(), |w| {
                format!(" after waiting {}", status::human(w))
            });
            // Who, as far as the row tells (as a directory's message does).
            let who = leases.sessions(Some(id)).ok().and_then(|rows| {
                let row = rows.into_iter().next()?;
                let rec = row.record?;
                (!rec.owner.is_empty()).then(|| {
                    format!(
                        " {} (token {}, expires {})",
                        rec.owner,
                        rec.token,
                        status::relative(&rec.expiry.to_string(), row.now)
                    )
                })
            });
            let who = who.unwrap_or_else(|| " another owner".to_owned());
            say!("flocklease: {id} is held by{who}{waited}");
        }
        return Ok(a.conflict_exit_code);
    };
    let (tx, rx) = mpsc::channel();
    let deadlines = Deadlines::default();
    let keep = {
        let tx = tx.clone();
        // The server's clock (as estimated here) decides the expiry, not this host's: the
        // keep-alive's default.
        KeepAlive::builder(Arc::clone(&leases), lease.clone())
            .on_renew(tell_expiry(&deadlines, leases.clock()))
            .on_loss(move |_| {
                let _ = tx.send(Event::Lost);
            })
            .start()
            .map_err(|e| {
                let _ = leases.release(&lease);
                e.to_string()
            })?
    };
    let clock = leases.clock();
    hold(
        a,
        signals,
        keep,
        (tx, rx),
        owner,
        || Ok(None),
        None,
        (&deadlines, &*clock, channel),
    )
}

/// Connects and acquires, waiting up to `wait` if given. A waiter keeps waiting through a
/// failover: a connection error or a call to be made again (`ErrorKind::Io`, `Retry`) is
/// followed by another attempt, from a new connection if need be, until the wait's end
/// (the lease is free on a promoted standby once the old primary's sessions are gone).
#[cfg(feature = "postgres")]
fn pg_acquire(
    a: &RunArgs,
    url: &str,
    id: &SessionId,
    owner: &Owner,
    wait: Option<Duration>,
) -> Result<(Arc<flocklease::pg::PgLease>, flocklease::Grant), String> {
    use flocklease::ErrorKind;
    /// The pause between attempts (a server coming back is polled: nothing signals it).
    const PAUSE: Duration = Duration::from_millis(250);
    let deadline = wait.map(|w| Instant::now() + w);
    let mut leases: Option<Arc<flocklease::pg::PgLease>> = None;
    let mut said = false;
    loop {
        let attempt = match &leases {
            Some(l) => Ok(Arc::clone(l)),
            None => pg_builder(url, a.pg_ca.as_deref())?
                .ttl(a.ttl)
                .connect()
                .map(Arc::new),
        }
        .and_then(|l| {
            leases = Some(Arc::clone(&l));
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match left {
                None => l.acquire(id, owner),
                Some(w) => l.acquire_wait(id, owner, w.max(Duration::from_millis(1))),
            }
            .map(|g| (l, g))
        });
        let e = match attempt {
            Ok(got) => return Ok(got),
            Err(e) => e,
        };
        let again = matches!(e.kind(), ErrorKind::Io | ErrorKind::Retry)
            && deadline.is_some_and(|d| Instant::now() + PAUSE < d);
        if !again {
            return Err(crate::describe(&e));
        }
        if !said && !a.quiet {
            say!(
                "flocklease: {}; trying again until the wait ends",
                crate::describe(&e)
            );
            said = true;
        }
        if matches!(e.kind(), ErrorKind::Io) && leases.is_some() {
            // A connection error: the next attempt may go to another server (a promoted
            // standby); a new instance checks it afresh (writable, schema).
            leases = None;
        }
        std::thread::sleep(PAUSE);
    }
}

#[cfg(not(feature = "postgres"))]
fn run_pg(
    _: &RunArgs,
    _: &str,
    _: &Signals,
    _: &SessionId,
    _: &Owner,
    _: Option<Channel>,
) -> Result<u8, String> {
    Err("this flocklease was built without PostgreSQL support (cargo feature `postgres`)".into())
}

/// Acquires, waiting up to `wait` if given. `None` means held: contention is data, and a
/// stuck transition lock is an error (`LockTimeout` naming `<stem>.lock`), never "held".
fn acquire(
    leases: &FlockLease,
    id: &SessionId,
    owner: &Owner,
    wait: Option<Duration>,
) -> Result<Option<Lease>, Error> {
    let grant = match wait {
        None => leases.acquire(id, owner)?,
        Some(w) => leases.acquire_wait(id, owner, w)?,
    };
    Ok(grant.lease())
}

/// Waits for the job to end, forwarding signals and stopping it on loss; returns the exit
/// status of `run`. What to do is [`RunSide::step`]'s answer (PROTOCOL §7); this loop only
/// gathers what it saw and performs the answer, signals before words.
fn supervise<L: SessionLease + 'static>(
    mut job: Job,
    keep: &KeepAlive<L>,
    (events, watchdog): (&Receiver<Event>, Option<&Watchdog>),
    (grace, ttl): (Duration, Duration),
    (deadlines, margin): (&Deadlines, Duration),
) -> u8 {
    let pgid = job.pgid();
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (margin, ttl) = (nanos(margin), nanos(ttl));
    // The hard deadline, as the watchdog applies it: the last confirmed expiry less the
    // margin.
    let hard_deadline = || deadlines.latest().map(|d| d.saturating_sub(margin));
    let mut side = RunSide::new(nanos(grace));
    // What the loop has fed already, so that each is seen once.
    let (mut exit_fed, mut lost_fed, mut deaf_fed) = (false, false, false);
    // The group was seen empty: its id is never signalled again.
    let mut group_gone = false;
    let mut event: Option<Event> = None;
    loop {
        if job.reap() {
            job.suspend();
            continue;
        }
        let mut seen = Vec::new();
        if let (Some(exit), false) = (job.exit, exit_fed) {
            exit_fed = true;
            seen.push(Seen::Exited {
                status: exit.status(),
                by_sigkill: exit == Exit::Signal(Signal::SIGKILL as i32),
            });
        }
        if !lost_fed && keep.loss().is_some() {
            lost_fed = true;
            seen.push(Seen::Lost);
        }
        if watchdog.is_some() && !deaf_fed && deadlines.deaf(boot_nanos(), ttl) {
            deaf_fed = true;
            seen.push(Seen::WatchdogGone);
        }
        let mut signal = None;
        match event.take() {
            Some(Event::Signal(sig)) => {
                signal = Some(sig);
                seen.push(Seen::Signal {
                    stops: signals::stops(sig),
                });
            }
            Some(Event::WatchdogKilled) => seen.push(Seen::WatchdogKilled),
            Some(Event::WatchdogGone) if !deaf_fed => {
                deaf_fed = true;
                seen.push(Seen::WatchdogGone);
            }
            _ => {}
        }
        if exit_fed && !job.group_alive() {
            group_gone = true;
            seen.push(Seen::GroupGone);
        } else {
            seen.push(Seen::Tick);
        }
        let mut seen = std::collections::VecDeque::from(seen);
        while let Some(s) = seen.pop_front() {
            for act in side.step(s, boot_nanos(), hard_deadline()) {
                match act {
                    Do::Forward => {
                        if let Some(sig) = signal.filter(|_| !group_gone) {
                            job.signal(sig);
                        }
                    }
                    Do::Term if !group_gone => terminate(&job),
                    Do::Kill if !group_gone => job.signal(Signal::SIGKILL),
                    Do::Term | Do::Kill => {}
                    Do::AskWatchdog => {
                        if watchdog.is_some_and(|w| watchdog_said_killed(w, events)) {
                            seen.push_back(Seen::WatchdogKilled);
                        }
                        seen.push_back(Seen::GroupGone);
                    }
                    Do::Say(said) => tell(said, pgid, keep),
                    Do::Exit(exit) => {
                        return match exit {
                            RunExit::Job(code) => code,
                            RunExit::Lost => EXIT_LOST,
                            RunExit::Deadline => EXIT_DEADLINE,
                            RunExit::WatchdogGone => EXIT_WATCHDOG_GONE,
                        };
                    }
                }
            }
        }
        let now = boot_nanos();
        let mut wake = IDLE;
        let mut until = |at: Option<u64>| {
            if let Some(at) = at {
                wake = wake.min(Duration::from_nanos(at.saturating_sub(now)));
            }
        };
        until(side.wake_at(hard_deadline()));
        if watchdog.is_some() && !deaf_fed {
            until(deadlines.deaf_at(ttl));
        }
        if side.command_exited() {
            wake = wake.min(DRAIN_POLL);
        }
        match events.recv_timeout(wake) {
            // A child's change is seen by the reap at the top; a loss by the keep-alive's
            // handle.
            Ok(Event::Child | Event::Lost) | Err(RecvTimeoutError::Timeout) => {}
            Ok(e) => event = Some(e),
            // Every sender is gone: nothing wakes us but time.
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(wake),
        }
    }
}

/// Words for what `run` did (queued after the act, never blocking).
fn tell<L: SessionLease + 'static>(said: Said, pgid: nix::unistd::Pid, keep: &KeepAlive<L>) {
    match said {
        Said::Lost => {
            let loss = keep
                .loss()
                .map_or_else(|| "the lease was lost".to_owned(), |l| l.to_string());
            say!("flocklease: {loss}; the job (process group {pgid}) is stopped");
        }
        Said::Leftovers => say!(
            "flocklease: the command exited; stopping what it left running in its process \
             group {pgid}"
        ),
        Said::DeadlineKill => say!(
            "flocklease: no renew of the lease confirmed before its deadline; killed the job \
             (process group {pgid})"
        ),
        Said::WatchdogKilled => say!(
            "flocklease: the watchdog killed the job (process group {pgid}): no renew of the \
             lease was confirmed before its deadline"
        ),
        Said::GraceOver => say!(
            "flocklease: the job (process group {pgid}) was still running after the grace \
             period; killed it"
        ),
        Said::WatchdogGone => say!(
            "flocklease: the watchdog died or stopped listening; stopping the job (process \
             group {pgid}) while the lease is held"
        ),
        // `Said` is the library's, and may grow.
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

/// Whether the watchdog killed the job: tells it `done` and waits for what it said before
/// reading that (`killed`), or for the end of its socket. Bounded, for a watchdog that is
/// stopped: after [`WATCHDOG_WORD`] the answer is no.
fn watchdog_said_killed(w: &Watchdog, events: &Receiver<Event>) -> bool {
    w.done();
    let by = Instant::now() + WATCHDOG_WORD;
    loop {
        match events.recv_timeout(by.saturating_duration_since(Instant::now())) {
            Ok(Event::WatchdogKilled) => return true,
            Ok(Event::WatchdogGone) | Err(_) => return false,
            Ok(_) => {}
        }
    }
}

/// SIGTERM to the group, then SIGCONT so that stopped members can act on it.
fn terminate(job: &Job) {
    job.signal(Signal::SIGTERM);
    job.signal(Signal::SIGCONT);
}

fn release<L: SessionLease + 'static>(keep: KeepAlive<L>) {
    if let Err(e) = keep.release() {
        say!("flocklease: release failed (the lease will expire): {e}");
    }
}

/// The command to spawn and its name for messages.
fn command(a: &RunArgs) -> (Command, String) {
    if let Some(script) = &a.shell_command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        return (cmd, "sh".into());
    }
    // clap requires a command or -c.
    let (program, args) = a.command.split_first().unwrap_or_else(|| unreachable!());
    let mut cmd = Command::new(program);
    cmd.args(args);
    (cmd, program.clone())
}

fn default_owner() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}:{}", std::process::id())
}

/// "ID is held by OWNER (token N, expires in 12 s)", as far as the record tells.
fn held_message(dir: &Path, id: &SessionId, wait: Option<Duration>) -> String {
    let waited = wait.map_or(String::new(), |w| {
        format!(" after waiting {}", status::human(w))
    });
    let now = SystemClock.now();
    match flocklease::status::session(dir, id, now) {
        Ok(Some(flocklease::status::SessionStatus {
            owner: Some(owner),
            token: Some(token),
            expiry: Some(expiry),
            ..
        })) if !owner.is_empty() => format!(
            "{id} is held by {owner} (token {token}, expires {}){waited}",
            status::relative(&expiry, now)
        ),
        _ => format!("{id} is held by another owner{waited}"),
    }
}
