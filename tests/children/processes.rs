//! Real processes: holders are SIGKILLed and SIGSTOPped, race each other, spawn programs and
//! get stuck inside a transition. Every child is this test binary in the `agent` role, driven
//! line by line through its stdin; time is a shared file clock, so "past the TTL" is a write
//! to that file, not a sleep.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::fault::FaultPoint;
use flocklease::{Error, FlockLease, Grant, Lease};
use nix::sys::signal::{Signal, kill};
use support::{FileClock, RoleChild, hear, id, open_with_file_clock, owner, role, tell};

const ENTRY: &str = "processes::child_entry";
const TTL: Duration = Duration::from_secs(30);

/// The agent role: `DIR CLOCK [stop-in-transition]`. Commands on stdin, one reply each:
/// `acquire ID OWNER`, `renew`, `release` (of the last lease granted), `spawn-sleep`.
#[test]
fn child_entry() {
    let Some((_, args)) = role() else { return };
    let (dir, clock) = (Path::new(&args[0]), Path::new(&args[1]));
    let leases = if args.get(2).map(String::as_str) == Some("stop-in-transition") {
        // Stop this process while it holds the transition lock, just before reading the record.
        let hook: flocklease::fault::FaultHook = Arc::new(|point, _| {
            if point == FaultPoint::OpenRecord {
                nix::sys::signal::raise(Signal::SIGSTOP).unwrap();
            }
            None
        });
        FlockLease::builder(dir)
            .clock(Arc::new(FileClock::open(clock)))
            .ttl(TTL)
            .faults(hook)
            .open()
            .unwrap()
    } else {
        open_with_file_clock(dir, clock, TTL)
    };
    let mut last: Option<Lease> = None;
    let reply = |g: Result<Grant, Error>, last: &mut Option<Lease>| match g {
        Ok(Grant::Granted(l)) => {
            tell(&format!("granted {}", l.token));
            *last = Some(l);
        }
        Ok(Grant::Held) => tell("held"),
        Err(e) => tell(&format!("error {e}")),
    };
    while let Some(line) = hear() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["acquire", sid, who] => reply(leases.acquire(&id(sid), &owner(who)), &mut last),
            ["renew"] => reply(leases.renew(last.as_ref().unwrap()), &mut last),
            ["release"] => match leases.release(last.as_ref().unwrap()) {
                Ok(()) => tell("released"),
                Err(e) => tell(&format!("error {e}")),
            },
            ["spawn-sleep"] => {
                // Deliberately not waited for: it must outlive this process.
                #[allow(clippy::zombie_processes)]
                let child = std::process::Command::new("sleep")
                    .arg("600")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                tell(&format!("pid {}", child.id()));
            }
            [] => {}
            other => panic!("unknown command {other:?}"),
        }
    }
}

/// A lease directory with a shared clock file.
struct Setup {
    dir: tempfile::TempDir,
    clock: FileClock,
    clock_path: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let clock_path = dir.path().join("clock");
        let clock = FileClock::create(&clock_path, START);
        Setup {
            dir,
            clock,
            clock_path,
        }
    }

    fn agent(&self, extra: &[&str]) -> RoleChild {
        let mut args = vec![
            self.dir.path().to_str().unwrap(),
            self.clock_path.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        RoleChild::spawn(ENTRY, "agent", &args)
    }

    /// A lease manager in this (parent) process on the same directory and clock.
    fn local(&self) -> FlockLease {
        open_with_file_clock(self.dir.path(), &self.clock_path, TTL)
    }
}

fn ask(child: &mut RoleChild, cmd: &str) -> String {
    child.say(cmd);
    child.line()
}

fn token(reply: &str) -> u64 {
    reply
        .strip_prefix("granted ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("expected a grant, got {reply:?}"))
}

#[test]
fn sigkilled_holder_is_replaced_at_once_with_a_greater_token() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    let first = token(&ask(&mut holder, "acquire job a"));
    let mut rival = s.agent(&[]);
    assert_eq!(ask(&mut rival, "acquire job b"), "held");
    holder.kill(); // SIGKILL, then reap
    // The shared clock has not moved: the lease is far from expiry, yet it is taken over as
    // soon as the kernel has dropped the dead holder's lock.
    let second = s
        .local()
        .acquire_wait(&id("job"), &owner("b"), Duration::from_secs(10))
        .unwrap()
        .lease()
        .expect("granted before the deadline");
    assert!(second.token > first);
}

#[test]
fn a_waiting_acquire_wakes_when_the_holder_is_killed() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    let first = token(&ask(&mut holder, "acquire job a"));
    let leases = s.local();
    std::thread::scope(|scope| {
        let waiter =
            scope.spawn(|| leases.acquire_wait(&id("job"), &owner("w"), Duration::from_secs(20)));
        holder.kill();
        let got = waiter.join().unwrap().unwrap().lease().unwrap();
        assert_eq!(got.token, first + 1);
    });
}

#[test]
fn a_waiting_acquire_that_outlasts_its_deadline_answers_held() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    token(&ask(&mut holder, "acquire job a"));
    // Contention is data: held at the deadline, not an error.
    let got = s
        .local()
        .acquire_wait(&id("job"), &owner("w"), Duration::from_millis(200))
        .unwrap();
    assert_eq!(got, Grant::Held);
    // The holder is undisturbed.
    assert_eq!(token(&ask(&mut holder, "renew")), 1);
}

#[test]
fn holder_stopped_past_ttl_loses_to_a_competitor_and_cannot_disturb_it() {
    let s = Setup::new();
    let mut old = s.agent(&[]);
    let t1 = token(&ask(&mut old, "acquire job a"));
    kill(old.pid(), Signal::SIGSTOP).unwrap();
    support::wait_stopped(old.pid());
    s.clock.advance(TTL + Duration::from_secs(1));
    let mut new = s.agent(&[]);
    let t2 = token(&ask(&mut new, "acquire job b"));
    assert!(t2 > t1);
    kill(old.pid(), Signal::SIGCONT).unwrap();
    assert_eq!(ask(&mut old, "renew"), "held");
    assert_eq!(ask(&mut old, "release"), "released");
    // A third process sees the successor still holding it.
    let mut third = s.agent(&[]);
    assert_eq!(ask(&mut third, "acquire job c"), "held");
    assert_eq!(token(&ask(&mut new, "renew")), t2);
}

#[test]
fn holder_stopped_past_ttl_without_competitor_renews_with_the_same_token() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    let t1 = token(&ask(&mut holder, "acquire job a"));
    kill(holder.pid(), Signal::SIGSTOP).unwrap();
    support::wait_stopped(holder.pid());
    s.clock.advance(TTL * 5);
    kill(holder.pid(), Signal::SIGCONT).unwrap();
    assert_eq!(token(&ask(&mut holder, "renew")), t1);
    // Renewed: it is unexpired again, so a competitor is told held.
    let mut rival = s.agent(&[]);
    assert_eq!(ask(&mut rival, "acquire job b"), "held");
}

#[test]
fn an_expired_holder_that_still_runs_is_taken_over() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    let t1 = token(&ask(&mut holder, "acquire job a"));
    s.clock.advance(TTL);
    let mut rival = s.agent(&[]);
    let t2 = token(&ask(&mut rival, "acquire job b"));
    assert!(t2 > t1);
    assert_eq!(ask(&mut holder, "renew"), "held");
}

#[test]
fn two_racing_processes_get_one_grant_and_one_held() {
    let s = Setup::new();
    let mut a = s.agent(&[]);
    let mut b = s.agent(&[]);
    for round in 0..25 {
        let job = format!("acquire race-{round}");
        // Both commands are sent before either reply is read: the acquires overlap.
        a.say(&format!("{job} a"));
        b.say(&format!("{job} b"));
        let replies = [a.line(), b.line()];
        let grants = replies.iter().filter(|r| r.starts_with("granted")).count();
        let helds = replies.iter().filter(|r| *r == "held").count();
        assert_eq!((grants, helds), (1, 1), "round {round}: {replies:?}");
    }
}

#[test]
fn a_spawned_program_does_not_keep_the_lease_alive() {
    let s = Setup::new();
    let mut holder = s.agent(&[]);
    let t1 = token(&ask(&mut holder, "acquire job a"));
    let reply = ask(&mut holder, "spawn-sleep");
    let sleeper: i32 = reply.strip_prefix("pid ").unwrap().parse().unwrap();
    holder.kill();
    // The lease expires only after 30 s of the (frozen) shared clock: a grant within the bound
    // means the holder's death alone freed it, although the sleeper still runs.
    let got = s
        .local()
        .acquire_wait(&id("job"), &owner("parent"), Duration::from_secs(10));
    let _ = kill(nix::unistd::Pid::from_raw(sleeper), Signal::SIGKILL);
    assert_eq!(got.unwrap().lease().unwrap().token, t1 + 1);
}

#[test]
fn a_stuck_transition_delays_only_its_own_id_and_ends_in_a_timeout() {
    let s = Setup::new();
    let mut stuck = s.agent(&["stop-in-transition"]);
    stuck.say("acquire x stuck");
    support::wait_stopped(stuck.pid());
    // The stopped process holds x's transition lock. A caller of this instance waits for it
    // (its lock timeout is long: only SIGCONT lets it finish) and says when it is waiting.
    let (waiting_tx, waiting) = std::sync::mpsc::channel();
    let waiting_tx = std::sync::Mutex::new(waiting_tx);
    let hook: flocklease::fault::FaultHook = Arc::new(move |point, path| {
        if point == FaultPoint::LockStable && path.to_string_lossy().contains("/x-") {
            let _ = waiting_tx.lock().unwrap().send(());
        }
        None
    });
    let patient = FlockLease::builder(s.dir.path())
        .clock(Arc::new(FileClock::open(&s.clock_path)))
        .lock_timeout(Duration::from_secs(600))
        .faults(hook)
        .open()
        .unwrap();
    std::thread::scope(|scope| {
        let blocked = scope.spawn(|| patient.acquire(&id("x"), &owner("p")));
        waiting.recv().unwrap();
        // While that caller is blocked on x, the same instance serves y, whole cycles of it.
        for _ in 0..5 {
            let y = patient
                .acquire(&id("y"), &owner("p"))
                .unwrap()
                .lease()
                .unwrap();
            patient.release(&y).unwrap();
        }
        assert!(
            !blocked.is_finished(),
            "x's waiter returned while x was stuck"
        );
        // A second instance with a short bound ends in the typed error naming x's lock.
        let short = FlockLease::builder(s.dir.path())
            .clock(Arc::new(FileClock::open(&s.clock_path)))
            .lock_timeout(Duration::from_millis(100))
            .open()
            .unwrap();
        let err = short.acquire(&id("x"), &owner("p")).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        assert!(
            err.path()
                .unwrap()
                .ends_with(format!("{}.lock", id("x").stem()))
        );
        assert!(!blocked.is_finished());
        kill(stuck.pid(), Signal::SIGCONT).unwrap();
        assert!(stuck.line().starts_with("granted"));
        // Once it moved on, the waiting caller gets its answer: x is held by the agent.
        assert!(blocked.join().unwrap().unwrap().is_held());
    });
}
