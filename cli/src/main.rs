//! `flocklease`: session leases for shells and cron, modelled on `flock(1)`.
//!
//! `flocklease run` holds a lease while a job runs: it renews it, forwards stop signals to the
//! job's process group, stops the whole group if the lease is lost, and keeps the lease live
//! for the job even if `run` itself is killed. `flocklease status` shows a lease directory
//! without disturbing anyone. The README's "Command line" section is the manual.

mod dirs;
mod duration;
mod fence;
mod job;
mod mend;
mod run;
mod say;
mod signals;
mod status;
mod watchdog;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Exit status when the lease is held by another live owner (`-E` changes it).
const EXIT_HELD: u8 = 75;
/// Exit status when the lease was lost while the job ran (the job was stopped).
const EXIT_LOST: u8 = 76;
/// Exit status for a lease-directory, record or system error.
const EXIT_ERROR: u8 = 70;
/// Exit status of `fence` when the token is refused: a greater one was admitted (sysexits'
/// EX_NOPERM).
const EXIT_STALE: u8 = 77;
/// Exit status of `run` when its watchdog killed the job at the hard deadline: no renew of the
/// lease was confirmed in time (`run` stopped, hung or starved), whether or not the lease was
/// then lost.
const EXIT_DEADLINE: u8 = 78;
/// Exit status of `run` when its watchdog died or stopped listening and `run` stopped the job
/// (nothing would have stopped it had `run` died too); not when the watchdog went during an
/// ordinary stop.
const EXIT_WATCHDOG_GONE: u8 = 79;
/// Exit status for bad usage (an unknown option, a malformed duration), as in flock(1).
const EXIT_USAGE: u8 = 64;

/// `run`'s exit statuses, in its `--help` and manual page.
const RUN_EXIT: &str = "Exit status: the command's own (128+N if signal N killed it); 75 (or -E \
                        N) when the lease is held elsewhere; 76 when the lease was lost and the \
                        job stopped; 78 when the job was killed at the hard deadline (no renew \
                        confirmed in time: run stopped, hung or starved); 79 when the watchdog \
                        died or stopped listening and run stopped the job while it held the \
                        lease; 126/127 when the command cannot be executed / is not found; 70 on \
                        an error; 64 on bad usage; 128+N when signal N arrived before the command \
                        started.";

/// `run --help` and `flocklease-run(1)` in full: the exit statuses, the environment, the files
/// and examples.
const RUN_MORE: &str = concat!(
    "EXIT STATUS\n",
    "The command's own (128+N if signal N killed it); 75 (or -E N) when the lease is held \
     elsewhere; 76 when the lease was lost and the job stopped; 78 when the job was killed at \
     the hard deadline (no renew confirmed in time: run stopped, hung or starved); 79 when the \
     watchdog died or stopped listening and run stopped the job while it held the lease; \
     126/127 when the command cannot be executed / is not found; 70 on an error; 64 on bad \
     usage; 128+N when signal N arrived before the command started.\n",
    "\nENVIRONMENT\n",
    "FLOCKLEASE_DIR: the lease directory when --dir is not given. The job gets \
     FLOCKLEASE_TOKEN (its fencing token), FLOCKLEASE_ID, FLOCKLEASE_OWNER, FLOCKLEASE_EXPIRY \
     (RFC 3339) and FLOCKLEASE_DIR (absolute).\n",
    "\nFILES\n",
    "/run/lock/flocklease (root) or $XDG_RUNTIME_DIR/flocklease (other users; removed at a \
     user's last logout unless lingering): the default lease directory. In it, per session \
     id: STEM.lease.json (the record), STEM.lock (the transition lock), STEM.N.live \
     (generation N's liveness lock), STEM.queue (the line of waiters), STEM.id (the id, for \
     status).\n",
    "\nEXAMPLES\n",
    "A crontab line that never overlaps itself: */5 * * * * flocklease run -q --id report -- \
     /usr/local/bin/report\n",
    "Wait up to a minute for the previous run: flocklease run -w 1m --id backup -- \
     /usr/local/bin/backup\n",
    "Fence the writes with the token: flocklease run --id sync -- sh -c 'flocklease fence \
     --fence /srv/data/.fence --write /srv/data/state < new-state'\n",
);

#[derive(Parser)]
#[command(
    name = "flocklease",
    version,
    about = "Exclusive, time-limited session leases with fencing tokens, for shells and cron",
    after_help = "Exit status of `run`: the command's own (128+N if signal N killed it); 75 (or \
                  -E N) when the lease is held elsewhere; 76 when the lease was lost and the job \
                  stopped; 78 when the job was killed at the hard deadline (no renew confirmed \
                  in time); 79 when the watchdog died or stopped listening and run stopped the \
                  job; 126/127 when the command cannot be executed / is not found; 70 on an \
                  error; 64 on bad usage; 128+N when signal N arrived before the command started. \
                  Exit status of `fence`: 0 when the token is admitted; 77 when it is refused \
                  (stale: the fence has admitted a greater one); 70 on an error; 64 on bad \
                  usage or no token."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command while holding the lease of a session id.
    ///
    /// The command gets FLOCKLEASE_TOKEN, FLOCKLEASE_ID, FLOCKLEASE_OWNER, FLOCKLEASE_EXPIRY
    /// and FLOCKLEASE_DIR (absolute) in its environment and runs in its own process group. The
    /// lease is renewed every TTL/3 and released once every process of the group has exited.
    /// SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGWINCH are forwarded to the
    /// group (after SIGTERM or SIGINT, SIGKILL follows the grace period). If the lease is lost,
    /// or run is killed, the group gets SIGTERM, then SIGKILL.
    #[command(after_help = RUN_EXIT, after_long_help = RUN_MORE)]
    Run(run::RunArgs),
    /// Show the sessions of a lease directory (or one, with --id) without taking any lock.
    ///
    /// Exit status of the whole listing: 0; 70 when a record is broken or unreadable (every
    /// row is listed all the same, the broken ones said on stderr) or the directory cannot be
    /// read. With --id: see --id.
    Status(status::StatusArgs),
    /// Admit a fencing token at a fence file, or (with --write) write standard input to a file
    /// only if the token is admitted.
    ///
    /// The fence file holds the highest token admitted. A token lower than it is refused with
    /// exit status 77 and a message, and nothing is written; an equal or greater one is
    /// admitted (exit 0) and recorded before the write. The token is --token N or, in a job of
    /// `flocklease run`, $FLOCKLEASE_TOKEN.
    Fence(fence::FenceArgs),
    /// Repair the record of an id that no call can use (a FIFO, a directory, a symbolic link
    /// or garbage in its place), never losing the fencing token.
    ///
    /// Under the id's transition lock, writes a released record whose token is the highest
    /// the directory shows (the record's own if it reads, and every STEM.N.live file's N) or
    /// --at-least N if greater (a release deletes its generation's file), as
    /// a transition writes it (temporary file, fsync, rename, fsync of the directory); an
    /// empty directory at the record's name is removed first. A record that reads and is not
    /// behind its generations' files is left as it is. Refused while a holder lives (a
    /// generation's liveness file is locked). Exit status: 0 when mended or nothing to mend;
    /// 75 when refused because a holder lives or the record names one until its expiry; 70 on
    /// an error (a bad STEM.lock: remove it); 64 on bad usage. PROTOCOL §6.6.
    Mend(mend::MendArgs),
    /// Print the manual page (roff) of flocklease, or of one of its commands.
    ///
    /// Install: mkdir -p /usr/local/share/man/man1; flocklease man >
    /// /usr/local/share/man/man1/flocklease.1, and for each of run, status, fence and mend:
    /// flocklease man run > /usr/local/share/man/man1/flocklease-run.1.
    Man {
        /// The command whose page to print (run, status, fence, mend); none: flocklease(1).
        #[arg(value_name = "COMMAND")]
        command: Option<String>,
    },
    /// Print a shell completion script.
    ///
    /// bash: flocklease completions bash > /etc/bash_completion.d/flocklease (or
    /// ~/.local/share/bash-completion/completions/flocklease); zsh: into a directory of
    /// $fpath as _flocklease; fish: ~/.config/fish/completions/flocklease.fish.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The internal watchdog's command line (`flocklease __watchdog …`, started by `run` only),
/// parsed apart from [`Cli`] so that no help text, manual page or shell completion offers it.
#[derive(Parser)]
#[command(name = "flocklease __watchdog")]
struct WatchdogCli {
    #[command(flatten)]
    args: watchdog::WatchdogArgs,
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "__watchdog") {
        return match WatchdogCli::try_parse_from(&args[1..]) {
            Ok(w) => {
                let code = watchdog::main(&w.args);
                // Its messages, if stderr takes them soon (the job is over by now).
                say::flush(std::time::Duration::from_secs(1));
                ExitCode::from(code)
            }
            Err(e) => {
                let _ = e.print();
                ExitCode::from(EXIT_USAGE)
            }
        };
    }
    if let Some(hint) = flock_form(&args).or_else(|| before_parsing(&args)) {
        eprintln!("flocklease: {hint}");
        return ExitCode::from(EXIT_USAGE);
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    ExitCode::from(match cli.command {
        Cmd::Run(args) => {
            let code = run::main(args);
            // `run` speaks through `say` (never blocking): what is queued is written now, if
            // stderr takes it within a bound (the lease is released by now).
            say::flush(std::time::Duration::from_secs(1));
            code
        }
        Cmd::Status(args) => status::main(&args),
        Cmd::Fence(args) => fence::main(&args),
        Cmd::Mend(args) => mend::main(&args),
        Cmd::Man { command } => man(command.as_deref()),
        Cmd::Completions { shell } => {
            let mut script = Vec::new();
            let mut cli = offered(&Cli::command());
            clap_complete::generate(shell, &mut cli, "flocklease", &mut script);
            print_all(&script)
        }
    })
}

/// What the argument parser would say badly: an id with a control character (which its
/// message would echo raw to the terminal: an escape sequence would act there), and flock(1)'s
/// `--verbose`, for which it suggests a command named `--verbose`.
fn before_parsing(args: &[std::ffi::OsString]) -> Option<String> {
    let words: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .take_while(|w| w != "--")
        .collect();
    let ids = words
        .windows(2)
        .filter(|w| w[0] == "--id")
        .map(|w| w[1].as_str())
        .chain(words.iter().filter_map(|w| w.strip_prefix("--id=")));
    for id in ids {
        if id.chars().any(char::is_control) {
            return Some(format!(
                "invalid session id {}: it contains a control character",
                id.escape_debug()
            ));
        }
    }
    if words.first().is_some_and(|w| w == "run") && words.iter().any(|w| w == "--verbose") {
        return Some(
            "flocklease run has no --verbose (flock(1)'s, which reports the wait): run says \
             only what went wrong, and `flocklease status --id ID` shows who holds a lease"
                .into(),
        );
    }
    None
}

/// The long help's headings (`EXIT STATUS`, ...) as the page's own sections, instead of lines
/// of the generic section clap's page generator puts the long help in.
fn sections(page: &str) -> String {
    let mut out = page.replace(".SH EXTRA\n", "");
    for heading in ["EXIT STATUS", "ENVIRONMENT", "FILES", "EXAMPLES"] {
        out = out.replace(&format!("\n{heading}\n"), &format!("\n.SH \"{heading}\"\n"));
    }
    out
}

/// `cmd` as completions offer it: without its hidden arguments and commands (flock(1)'s
/// options that `run` refuses with a message, the watchdog), which the completion generators
/// would otherwise list.
fn offered(cmd: &clap::Command) -> clap::Command {
    let mut out = cmd.clone();
    let hidden: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_hide_set())
        .map(|a| a.get_id().to_string())
        .collect();
    if !hidden.is_empty() {
        // Rebuilt without them (clap has no way to remove an argument).
        let mut kept = clap::Command::new(cmd.get_name().to_owned());
        if let Some(about) = cmd.get_about() {
            kept = kept.about(about.clone());
        }
        // Groups that name a hidden argument (the derive's own, of every field) go too: they
        // only check a command line, and completions check none.
        kept = kept
            .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned())
            .groups(
                cmd.get_groups()
                    .filter(|g| {
                        g.get_args()
                            .all(|id| !hidden.iter().any(|h| h.as_str() == id.as_str()))
                    })
                    .cloned(),
            );
        out = kept;
    }
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set())
        .map(offered)
        .collect();
    for sub in subs {
        let name = sub.get_name().to_owned();
        out = out.mut_subcommand(name, |_| sub);
    }
    out
}

/// An error as one line: its message, then each cause its message does not already say (the
/// PostgreSQL driver's message is often only the step, "error performing TLS handshake", and
/// its cause the reason, an unknown certificate issuer).
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

/// `flocklease man [COMMAND]`: the manual page, generated from the argument definitions.
fn man(command: Option<&str>) -> u8 {
    let top = Cli::command();
    let page = match command {
        None => top,
        Some(name) => match top
            .get_subcommands()
            .find(|c| c.get_name() == name && !c.is_hide_set())
        {
            // No `.version()` here: it would list a -V that `run` refuses; the version goes in
            // the page's header (`source`, below).
            Some(sub) => sub
                .clone()
                .display_name(format!("flocklease-{name}"))
                .bin_name(format!("flocklease {name}")),
            None => {
                eprintln!(
                    "flocklease: no command {name:?} (run, status, fence, mend, man, completions)"
                );
                return EXIT_USAGE;
            }
        },
    };
    let mut roff = Vec::new();
    let man =
        clap_mangen::Man::new(page).source(format!("flocklease {}", env!("CARGO_PKG_VERSION")));
    match man.render(&mut roff) {
        Ok(()) => print_all(sections(&String::from_utf8_lossy(&roff)).as_bytes()),
        Err(e) => {
            eprintln!("flocklease: {e}");
            EXIT_ERROR
        }
    }
}

/// Writes `bytes` to standard output; a reader that stops early (`| head`) is no error.
fn print_all(bytes: &[u8]) -> u8 {
    use std::io::Write;
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("flocklease: {e}");
            EXIT_ERROR
        }
    }
}

/// flock(1)'s `flock FILE COMMAND` form, which has no meaning here: a hint saying how a path
/// splits into a lease directory and an id, instead of clap's bare "unrecognized subcommand".
fn flock_form(args: &[std::ffi::OsString]) -> Option<String> {
    let words: Vec<&str> = args
        .iter()
        .skip(1)
        .map(|a| a.to_str())
        .collect::<Option<_>>()?;
    let cli = Cli::command();
    let is_command = |w: &str| w == "help" || cli.get_subcommands().any(|c| c.get_name() == w);
    // A path, as flock's lock file always is here; a bare word is left to clap (a mistyped
    // command gets its "did you mean"). Where it may stand: first (`flock FILE CMD`), after
    // flock's options (`flock -n -w 5 FILE -c CMD`), or right after `run` without an id
    // (`run FILE CMD`).
    let is_path = |w: &str| !w.starts_with('-') && w.contains('/');
    let first: &str = match *words.first()? {
        "run" if !words.iter().any(|w| *w == "--id" || w.starts_with("--id=")) => {
            words.get(1).copied().filter(|w| is_path(w))?
        }
        w if w.starts_with('-') && !words.iter().any(|w| is_command(w)) => words
            .iter()
            .copied()
            .take_while(|w| *w != "--")
            .find(|w| is_path(w))?,
        w if is_path(w) && !is_command(w) => w,
        _ => return None,
    };
    let path = std::path::Path::new(first);
    let id = path.file_name()?.to_string_lossy().into_owned();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => format!("--dir {} ", d.display()),
        _ => String::new(),
    };
    Some(format!(
        "`flocklease [run] {first} COMMAND` is flock(1)'s form; a lease has a directory and an id: \
         `flocklease run {dir}--id {id} -- COMMAND` (without --dir: $FLOCKLEASE_DIR, else \
         /run/lock/flocklease for root and $XDG_RUNTIME_DIR/flocklease for other users). \
         See flocklease --help."
    ))
}
