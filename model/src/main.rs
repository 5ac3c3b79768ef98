//! `flocklease-model check` and `flocklease-model explore`.

use std::process::ExitCode;

use flocklease_model::harness::{self, SmallModel};
use flocklease_model::line::LineModel;
use flocklease_model::program::ProgramModel;
use flocklease_model::resource::ResourceModel;
use flocklease_model::run::RunModel;
use flocklease_model::threads::ThreadsModel;
use flocklease_model::{Backend, CONFIGS, LeaseModel, Planted, Tamper, report};
use stateright::Model;

// mimalloc, not the system allocator: a search clones and drops states on both cores, and a
// state built on one core is often freed on the other, which with glibc's malloc waits on the
// other thread's arena lock. Measured on 2 idle cores: the default configuration 80.7 s wall
// (111 s on-CPU) with glibc's allocator, 23.8 s (46 s) with mimalloc; the whole `check`
// 137.6 s (195 s) -> 52.3 s (101 s). BENCHMARKS.md, "The checker's allocator".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
usage: flocklease-model <check|explore> [options]

commands:
  check      explore every reachable state of the configuration; print the state count, each
             property's verdict and, for a violation, the shortest counterexample; exit 1 on any
             violation or unwitnessed `sometimes` property
  explore    serve stateright's explorer to click through interleavings in a browser

options (applied in order, on top of the named configuration):
  --config NAME      start from a named configuration (default: default); each is
                     described below the options; `run` is `flocklease run`'s supervision
                     (run, its watchdog, the job, a cleaner, a rival: PROTOCOL §7);
                     `line` the line of waiting acquires (waiters, stopped waiters, a stray
                     lock of any span, a holder: PROTOCOL §4.6); `resource-fence` a
                     resource's Fence (write_file and with writers, a cleaner deleting its
                     lock or moving it aside and back: PROTOCOL §9.4); `threads` the
                     threads of one instance (a fenced section whose closure calls the
                     instance, another thread's call, a rival on the lock: PROTOCOL §9.2);
                     `flock-program` the flock adapter's own FlockTx on a simulated lease
                     directory (two processes, a crash, a clock step, a cleaner: PROTOCOL
                     §10);
                     `check` with no --config runs, after the default configuration, the
                     moves and go-records configurations in small bounds (no fault, no
                     host crash; for moves no call past token 1; left out when another
                     option than --planted shapes the model) and these five
  --backend B        flock or postgres (postgres: liveness can be lost while its holder runs)
  --procs N          lease-manager processes (default 2, at most 3)
  --max-time T       the clock runs from tick 0 to T (default 2)
  --ttl T            lease TTL in ticks (default 2)
  --max-token K      no call starts past token K (default 2)
  --faults N         failing I/O steps to inject (default 1; 0 disables)
  --standbys N       PostgreSQL: synchronous standbys a commit needs (0, 1 — the default —
                     or 2; with 0 there is no failover)
  --shared-owner     every process uses the same owner string
  --no-host-crash    no host crash
  --no-cleaner       no cleaner (tmp cleaner, operator) touching the directory
  --cleaner N        how many times the cleaner may act (default 1)
  --tamper LIST      what the cleaner may do, comma-separated: delete-live, replace-live,
                     lock, record, temp, moves (move the liveness file or the lock
                     aside and put it back), all (default: the configuration's)
  --no-observer      no observer (waiter, status) share-locking liveness files
  --no-go-prober     no Go-style prober creating and exclusively try-locking them
  --no-fenced        no fenced sections (PROTOCOL §9; on in every named configuration but
                     large and long), and no property [11]
  --fenced           fenced sections on
  --planted BUG      plant a known bug to see the checker catch it: create-then-lock (the
                     restore of a deleted liveness file creates it, then locks it);
                     unlock-before-cleanup (the transition lock given back before the
                     cleanup and the adoption: caught by [12]);
                     restore-keeps-tag (the restore publishes the file with the tag the
                     record already names: caught by check's moves run, or --config moves);
                     with --config postgres: relock-on-notice (a holder that sees its
                     liveness connection end locks its generation again at once, outside
                     any transition), renew-without-relock (a renew after that trusts the
                     row and commits without locking the generation again),
                     reread-after-terminate (a commit whose reply was lost counts once the
                     re-read finds it, confirmed by the standby or not); with --config
                     failover --standbys 2: one-standby-enough (such a commit counts once one
                     of the two required standbys confirmed it);
                     for property [11]: unfenced-write (the control: a write after a local
                     is_lost()-style check, no lock), fence-check-before-lock (the section
                     checks the record before taking its lock), fence-unlock-before-write
                     (it unlocks, or commits, before the caller's write);
                     with --config run: grace-forgets-expiry (after run died the watchdog
                     waits out --grace past the expiry), share-after-place (a restored
                     liveness file reaches the watchdog after it is placed), job-keeps-liveness
                     (the old design: only the job's inherited descriptor keeps the lease),
                     blocking-deadline-write (run writes a deadline to the watchdog's full
                     socket with a blocking write under a lock its loop needs),
                     say-before-signal (the watchdog prints before it signals, itself),
                     panic-on-failed-write (a failed write to stderr panics),
                     watchdog-exits-on-term (the watchdog dies of the unit's SIGTERM);
                     for the line: pass-over-first-byte (a lock of several bytes is passed
                     one byte at a time), whole-grace-each (every stopped place ahead costs
                     the whole 50 ms), held-until-close (the held flag of the holder's
                     instance goes down at its release's close, not at its commit),
                     pass-over-reported (the pass-over passes the lock the kernel reported,
                     not the earliest ahead: a running waiter is overtaken); for the
                     threads: state-across-closure (a fenced
                     section gives the instance's state back after its closure), look-waits
                     (acquire_wait's look at what the instance holds waits for the state),
                     wait-past-deadline (acquire_wait attempts again after an attempt that
                     ended past its deadline); a resource's fence runs the
                     library's own Fence: its mistakes are planted in src/fence.rs
                     itself (model/tests/plants.rs)
  --no-sync          model Durability::NoSync (shows why fsync is needed)
  --counterexamples N  print the shortest counterexample of at most N violated properties
                     (default: all)
  --addr HOST:PORT   explorer address (default 127.0.0.1:3000)
";

/// The usage text, with every named configuration described from its own fields.
fn usage() -> String {
    let mut text = USAGE.to_owned();
    text.push_str("\nconfigurations (every actor and action each one has):\n");
    for name in CONFIGS {
        let model = LeaseModel::named(name).unwrap_or_default();
        text.push_str(&format!("  {name}:\n"));
        let mut line = String::from("   ");
        for word in model.describe().split(' ') {
            if line.len() + word.len() + 1 > 94 {
                text.push_str(&line);
                text.push('\n');
                line = String::from("   ");
            }
            line.push(' ');
            line.push_str(word);
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("flocklease-model: {msg}\n\n{}", usage());
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let (command, rest) = args.split_first().ok_or("missing command")?;
    let mut model = LeaseModel::default();
    let mut addr = "127.0.0.1:3000".to_owned();
    let mut counterexamples = usize::MAX;
    // `flocklease run`'s supervision: checked alone with `--config run`, and after the
    // default configuration when no configuration is named.
    let mut run_model: Option<RunModel> = None;
    // The waiting line, a resource's fence and one instance's threads: likewise.
    let mut line_model: Option<LineModel> = None;
    let mut resource_model: Option<ResourceModel> = None;
    let mut threads_model: Option<ThreadsModel> = None;
    let mut program_model: Option<ProgramModel> = None;
    let mut named = false;
    // An option that shapes the lease model (not a planted bug or the output): the small
    // moves and go-records runs after the default configuration are then left out.
    let mut shaped = false;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        shaped |= !matches!(
            flag.as_str(),
            "--config" | "--planted" | "--counterexamples" | "--addr" | "-h" | "--help"
        );
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--config" => {
                named = true;
                let name = value()?;
                if config(&mut run_model, name)
                    || config(&mut line_model, name)
                    || config(&mut resource_model, name)
                    || config(&mut threads_model, name)
                    || config(&mut program_model, name)
                {
                    continue;
                }
                model = LeaseModel::named(name).ok_or(format!(
                    "unknown configuration {name} (known: {})",
                    CONFIGS.join(", ")
                ))?;
            }
            "--backend" => match value()?.as_str() {
                "flock" => model.backend = Backend::Flock,
                "postgres" => {
                    model.backend = Backend::Postgres;
                    model.cleaner = 0;
                    model.observer = false;
                    model.go_prober = false;
                    model.host_crash = false;
                    model.liveness_losses = model.liveness_losses.max(1);
                }
                other => return Err(format!("unknown backend {other}")),
            },
            "--shared-owner" => model.shared_owner = true,
            "--counterexamples" => counterexamples = number(value()?, flag)?,
            "--procs" => model.procs = number(value()?, flag)?,
            "--max-time" => model.max_time = number(value()?, flag)?,
            "--ttl" => model.ttl_ticks = number(value()?, flag)?,
            "--max-token" => model.max_token = number(value()?, flag)?,
            "--faults" => model.faults = number(value()?, flag)?,
            "--standbys" => {
                model.standbys = number(value()?, flag)?;
                if model.standbys > 2 {
                    return Err("--standbys: 0, 1 or 2".into());
                }
            }
            "--no-host-crash" => model.host_crash = false,
            "--no-cleaner" => model.cleaner = 0,
            "--cleaner" => model.cleaner = number(value()?, flag)?,
            "--tamper" => model.tamper = tamper(value()?)?,
            "--no-observer" => model.observer = false,
            "--no-go-prober" => model.go_prober = false,
            "--no-fenced" => model.fenced = false,
            "--fenced" => model.fenced = true,
            "--planted" => match value()?.as_str() {
                name if plant(&mut run_model, name)
                    || plant(&mut line_model, name)
                    || plant(&mut resource_model, name)
                    || plant(&mut threads_model, name)
                    || plant(&mut program_model, name) =>
                {
                    named = true;
                }
                "create-then-lock" => model.planted = Some(Planted::CreateThenLock),
                "one-standby-enough" => model.planted = Some(Planted::OneStandbyEnough),
                "unlock-before-cleanup" => {
                    model.planted = Some(Planted::UnlockBeforeCleanup);
                }
                "restore-keeps-tag" => model.planted = Some(Planted::RestoreKeepsTag),
                "relock-on-notice" => model.planted = Some(Planted::RelockOnNotice),
                "renew-without-relock" => model.planted = Some(Planted::RenewWithoutRelock),
                "reread-after-terminate" => model.planted = Some(Planted::RereadAfterTerminate),
                "unfenced-write" => model.planted = Some(Planted::UnfencedWrite),
                "fence-check-before-lock" => model.planted = Some(Planted::FenceCheckBeforeLock),
                "fence-unlock-before-write" => {
                    model.planted = Some(Planted::FenceUnlockBeforeWrite);
                }
                other => return Err(format!("unknown planted bug {other}")),
            },
            "--no-sync" => model.durable = false,
            "--addr" => addr = value()?.clone(),
            "-h" | "--help" => {
                print!("{}", usage());
                return Ok(ExitCode::SUCCESS);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    if !(1..=3).contains(&model.procs) {
        return Err("--procs must be 1, 2 or 3".into());
    }
    if model.ttl_ticks == 0 || model.max_time > 200 {
        return Err("--ttl must be positive and --max-time at most 200".into());
    }
    let side = run_model.is_some()
        || line_model.is_some()
        || resource_model.is_some()
        || threads_model.is_some()
        || program_model.is_some();
    match command.as_str() {
        "check" if side => {
            let mut out = std::io::stdout();
            let mut ok = true;
            ok &= check(run_model, &mut out)?;
            ok &= check(line_model, &mut out)?;
            ok &= check(resource_model, &mut out)?;
            ok &= check(threads_model, &mut out)?;
            ok &= check(program_model, &mut out)?;
            println!("{}", if ok { "OK" } else { "FAILED" });
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        "explore" if side => {
            if let Some(m) = line_model {
                serve(m, &addr)
            } else if let Some(m) = resource_model {
                serve(m, &addr)
            } else if let Some(m) = threads_model {
                serve(m, &addr)
            } else if let Some(m) = program_model {
                serve(m, &addr)
            } else {
                serve(run_model.unwrap_or_default(), &addr)
            }
        }
        "check" => {
            let mut out = std::io::stdout();
            // What `explore` needs to show a counterexample: this command's options (but the
            // output's), or a side run's own with the planted mistake.
            let mut options = vec![];
            let mut planted = String::new();
            let mut given = rest.iter();
            while let Some(flag) = given.next() {
                if flag == "--counterexamples" {
                    given.next();
                    continue;
                }
                options.push(flag.as_str());
                if flag == "--planted"
                    && let Some(name) = given.next()
                {
                    planted = format!(" --planted {name}");
                    options.push(name.as_str());
                }
            }
            let mut ok = report::check_with(&model, counterexamples, &options.join(" "), &mut out)
                .map_err(|e| e.to_string())?;
            if !named {
                if !shaped {
                    let extras = model.alongside_default();
                    for (extra, base) in extras.iter().zip(flocklease_model::ALONGSIDE_OPTIONS) {
                        println!();
                        let extra_ok = report::check_with(
                            extra,
                            counterexamples,
                            &format!("{base}{planted}"),
                            &mut out,
                        )
                        .map_err(|e| e.to_string())?;
                        ok &= extra_ok;
                    }
                }
                for ok_side in [
                    check_alone::<RunModel>(&mut out)?,
                    check_alone::<LineModel>(&mut out)?,
                    check_alone::<ResourceModel>(&mut out)?,
                    check_alone::<ThreadsModel>(&mut out)?,
                    check_alone::<ProgramModel>(&mut out)?,
                ] {
                    ok &= ok_side;
                }
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        "explore" => {
            // stateright panics when the address is taken: say so clearly instead.
            drop(
                std::net::TcpListener::bind(addr.as_str())
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))?,
            );
            // The page shows the legend too, beside each step (the model's `as_svg`).
            println!("{}\n\n{}\n", report::describe(&model), report::LEGEND);
            println!("explorer on http://{addr} (Ctrl-C to stop)");
            // Serves until the process is stopped.
            let _checker = model.checker().serve(addr.as_str());
            Ok(ExitCode::SUCCESS)
        }
        "-h" | "--help" => {
            print!("{}", usage());
            Ok(ExitCode::SUCCESS)
        }
        other => Err(format!("unknown command {other}")),
    }
}

/// `--config NAME`: `M`'s default configuration into `slot` if `name` is `M`'s.
fn config<M: SmallModel>(slot: &mut Option<M>, name: &str) -> bool {
    (name == M::CONFIG)
        .then(|| slot.get_or_insert_with(M::default))
        .is_some()
}

/// `--planted NAME`: plants `name` in `slot`'s configuration (the default if none; the
/// configuration the mistake shows in if it has its own) if it is one of `M`'s mistakes.
fn plant<M: SmallModel>(slot: &mut Option<M>, name: &str) -> bool {
    let Some(&(_, planted)) = M::PLANTED.iter().find(|(n, _)| *n == name) else {
        return false;
    };
    let base = M::shown_in(planted).unwrap_or_else(|| slot.take().unwrap_or_default());
    *slot = Some(base.plant(planted));
    true
}

/// `check` of the smaller model in `slot`, if any.
fn check<M: SmallModel>(slot: Option<M>, out: &mut impl std::io::Write) -> Result<bool, String> {
    let Some(m) = slot else {
        return Ok(true);
    };
    let mut ok = true;
    for extra in m.alongside() {
        ok &= harness::check(extra, out).map_err(|e| e.to_string())?;
        println!();
    }
    Ok(harness::check(m, out).map_err(|e| e.to_string())? && ok)
}

/// After the default configuration: `M`'s default, after a blank line, closed by its verdict.
fn check_alone<M: SmallModel>(out: &mut impl std::io::Write) -> Result<bool, String> {
    println!();
    let ok = check(Some(M::default()), out)?;
    println!("{}", if ok { "OK" } else { "FAILED" });
    Ok(ok)
}

/// `explore` of a smaller model: serves until the process is stopped.
fn serve<M: SmallModel>(model: M, addr: &str) -> Result<ExitCode, String> {
    // stateright panics when the address is taken: say so clearly instead.
    drop(std::net::TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?);
    println!("explorer of {} on http://{addr} (Ctrl-C to stop)", M::TITLE);
    let _checker = model.checker().serve(addr);
    Ok(ExitCode::SUCCESS)
}

fn tamper(list: &str) -> Result<Tamper, String> {
    let mut t = Tamper {
        delete_live: false,
        replace_live: false,
        lock: false,
        record: false,
        temp: false,
        moves: false,
    };
    for item in list.split(',') {
        match item {
            "delete-live" => t.delete_live = true,
            "replace-live" => t.replace_live = true,
            "lock" => t.lock = true,
            "record" => t.record = true,
            "temp" => t.temp = true,
            "moves" => t.moves = true,
            "all" => {
                t = Tamper {
                    moves: true,
                    ..Tamper::ALL
                }
            }
            other => return Err(format!("--tamper: unknown change {other:?}")),
        }
    }
    Ok(t)
}

fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{flag}: {s:?} is not a valid number"))
}
