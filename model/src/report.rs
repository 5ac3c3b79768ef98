//! Running the checker and printing its verdicts, configurations and counterexamples.

use std::collections::BTreeSet;
use std::fmt;
use std::io::{self, Write};

use flocklease::Record;

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::{Action, Backend, LeaseModel, Said, State, io_label, ticks};

/// How to read a state: printed by `check` before a counterexample and by `explore`.
pub const LEGEND: &str = "\
how to read a state:
  t=N                 the clock, in ticks
  record=p0#2@4       the visible record: owner p0, token 2, expires at tick 4
                      (tombstone#2 = released at token 2; none = no record file)
  durable=...         the record as a power loss would leave it (the last directory fsync)
  temp1=p1#3@5 synced  p1's temporary record file and whether its contents were fsynced
  lock=p0             who holds the transition lock <stem>.lock (lock=gone: deleted;
                      lock=planted: a FIFO or directory; lock#2: the file's inode changed)
  live=[1:-,2:p0]     liveness files by token: 2 p0's own, locked by p0; 1 present and
                      unlocked; plain/fifo/dir: a planted file; go: locked by the Go-style
                      prober; +s: share-locked by the observer; PostgreSQL: the advisory
                      locks held, p0~: by a session of p0's that p0 gave up and the server
                      has not ended yet
  record=...!         a planted file stands at the record's name (reads fail)
  reported=#2         the highest token ever reported granted to a caller
  written=#2 (last #1, #2 committed then)   the protected resource: the highest token
                      whose write it accepted; its last write's token and the last new
                      generation committed when it was accepted (shown, not compared)
  p0: lease #2@4      what p0 believes it holds; stale #1@2: an older lease it kept
      local #2        the liveness lock p0 keeps open
      LIVENESS #2 LOST (seen)  PostgreSQL: its connection ended (seen: p0 knows)
      [renew -> next: rename]   p0's call under way and the I/O step it takes next
      [fenced #1 -> next: Write]  p0's fenced section with lease #1 and its next step
                      (refused: the check said no; share: PostgreSQL, the row FOR SHARE)
      last: acquire = granted #2@4   p0's last finished call and its answer
                      (held, released, FAILED, crashed)
  VIOLATION: ...      the call property a call just broke";

pub use crate::harness::{Outcome, Verdict};

/// Explores every reachable state of `model` (breadth first, two threads) and judges each
/// property. The search stops at the first violation of an `always` property: a planted bug
/// can make the state space explode, and one counterexample is the answer that matters.
pub fn explore(model: &LeaseModel) -> Outcome {
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs();
    let checker = with_progress(checker);
    let complete = !model
        .properties()
        .iter()
        .any(|p| p.expectation == Expectation::Always && checker.discovery(p.name).is_some());
    Outcome::of(model, &checker, complete)
}

/// Waits for `checker`, printing a progress line to standard error every 10 s (every second,
/// on one line, on a terminal): states so far, depth, and the rate.
pub fn with_progress<C: Checker<LeaseModel>>(checker: C) -> C {
    use std::io::{IsTerminal, Write};
    use std::time::{Duration, Instant};
    let tty = std::io::stderr().is_terminal();
    let every = if tty {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(10)
    };
    let started = Instant::now();
    let mut last = Instant::now();
    let mut printed = false;
    while !checker.is_done() {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() >= every {
            last = Instant::now();
            let states = checker.unique_state_count();
            let secs = started.elapsed().as_secs_f64();
            let line = format!(
                "  ... {states} states, depth {}, {:.0} states/s, {secs:.0} s",
                checker.max_depth(),
                states as f64 / secs.max(0.001)
            );
            let mut err = std::io::stderr().lock();
            let _ = if tty {
                write!(err, "\r{line}   ")
            } else {
                writeln!(err, "{line}")
            };
            printed = true;
        }
    }
    if printed && tty {
        eprintln!();
    }
    checker.join()
}

/// A shortest path to a discovery of property `name`: any discovery first, then a binary
/// search on the depth bound for the least bound that still has one (a multi-threaded
/// breadth-first search does not guarantee the shortest path, and iterative deepening from
/// depth 1 costs too much at this model's depths).
pub fn shortest(model: &LeaseModel, name: &'static str) -> Option<Path<State, Action>> {
    let find = |depth: Option<usize>| {
        let mut builder = model
            .clone()
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([name])));
        if let Some(d) = depth {
            builder = builder.target_max_depth(d);
        }
        builder.spawn_bfs().join().discovery(name)
    };
    let mut best = find(None)?;
    // A path of n actions is found with a depth bound of n + 2 (stateright's depth bound
    // stops expanding states at that depth, and counts from 1).
    let (mut lo, mut hi) = (1, best.clone().into_actions().len() + 2);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match find(Some(mid)) {
            Some(path) => {
                hi = (path.clone().into_actions().len() + 2).min(mid);
                best = path;
            }
            None => lo = mid + 1,
        }
    }
    Some(best)
}

/// Writes `path` as numbered steps: each state, then the action taken from it.
pub fn write_path(
    model: &LeaseModel,
    path: Path<State, Action>,
    out: &mut impl Write,
) -> io::Result<()> {
    for (i, (state, action)) in path.into_vec().into_iter().enumerate() {
        writeln!(out, "  {i:>3}  {state:?}")?;
        if let Some(a) = action {
            // The action stored with a state is the one taken *from* it.
            writeln!(out, "       -> {}", model.format_action(&a))?;
        }
    }
    Ok(())
}

/// The configuration as a sentence, with its bounds and what "exhaustive" means for it.
pub fn describe(m: &LeaseModel) -> String {
    let owners = if m.shared_owner {
        "all with the same owner string \"p0\" (still foreign to each other)".to_owned()
    } else {
        "each with its own owner (p0, p1, ...)".to_owned()
    };
    let backend = match m.backend {
        Backend::Flock => "flock".to_owned(),
        Backend::Postgres => format!(
            "PostgreSQL (liveness may be lost while its holder runs, up to {} time{}; {}{})",
            m.liveness_losses,
            if m.liveness_losses == 1 { "" } else { "s" },
            match m.standbys {
                0 => "no synchronous standby: a commit is durable once the primary has it, and \
                      a commit whose reply is lost (an injected failure of the commit) counts \
                      as soon as the adapter's re-read of the row finds it"
                    .to_owned(),
                n => format!(
                    "{} confirm{} every commit whose reply comes; a commit whose reply is lost \
                     (an injected failure of the commit) stays unconfirmed until the standbys \
                     catch up, and the adapter judges it by re-reading the row (commit::verdict, \
                     {n} required)",
                    if n == 1 {
                        "a synchronous standby"
                    } else {
                        "two synchronous standbys, each on its own,"
                    },
                    if n == 1 { "s" } else { "" },
                ),
            },
            if m.failover {
                "; the primary may fail over to a standby once, at any moment: the row as \
                 that standby has it, no advisory lock, every client's connections broken"
            } else {
                ""
            }
        ),
    };
    let mut extras = vec![];
    extras.push(match m.faults {
        0 => "no injected failures".to_owned(),
        n => format!("up to {n} injected failure(s) of any fallible I/O step"),
    });
    if m.host_crash {
        extras.push("one host crash (what was not fsynced is lost)".into());
    }
    if m.cleaner > 0 {
        let t = m.tamper;
        let mut what = vec![];
        if t.delete_live {
            what.push("delete the recorded liveness file");
        }
        if t.replace_live && m.untagged {
            what.push("replace it with a FIFO or a directory");
        } else if t.replace_live {
            what.push("replace it with a regular file, a FIFO or a directory");
        }
        if t.lock {
            what.push("delete or replace <stem>.lock");
        }
        if t.moves {
            what.push(
                "move the recorded liveness file or <stem>.lock aside (a rename, or a hard link \
                 and an unlink) and put it back later",
            );
        }
        if t.record {
            what.push("replace the record");
        }
        if t.temp {
            what.push("delete a temporary record");
        }
        extras.push(format!(
            "a cleaner acting {} time(s), at any moment: {}",
            m.cleaner,
            what.join(", ")
        ));
    }
    if m.observer {
        extras
            .push("an observer (a waiter, status) share-locking the recorded liveness file".into());
    }
    if m.go_prober {
        extras.push(
            "a Go-style prober creating the recorded liveness file if missing and \
             exclusively try-locking it"
                .into(),
        );
    }
    if m.fenced {
        extras.push(
            "every lease holder may run a fenced section (PROTOCOL §9) with the lease it \
             believes it holds, its write judged when the resource accepts it"
                .into(),
        );
    }
    if let Some(planted) = m.planted {
        extras.push(format!("PLANTED BUG: {planted:?}"));
    }
    extras.push(if m.durable {
        "fsync on (Durability::Full)".into()
    } else {
        "fsync off (Durability::NoSync)".into()
    });
    format!(
        "configuration \"{}\": {} lease-manager processes, {owners}, on the {backend} backend, \
         one session id; the clock runs from tick 0 to tick {} with a TTL of {} ticks; calls \
         start while the record's token is at most {} (calls under way still finish); {}; any \
         process may crash between any two I/O steps of a call.\n\
         exhaustive: every interleaving of these processes' I/O steps, crashes, ticks and \
         faults within these bounds is explored and every reachable state is checked; longer \
         histories, more processes, ids or tokens are not.",
        m.name,
        m.procs,
        m.max_time,
        m.ttl_ticks,
        m.max_token,
        extras.join("; "),
    )
}

/// The `check` command: explores, prints the verdicts and the shortest counterexample of
/// each violated `always` property. Returns whether everything holds.
pub fn check(model: &LeaseModel, out: &mut impl Write) -> io::Result<bool> {
    check_with(model, usize::MAX, "", out)
}

/// [`check`], printing the counterexamples of at most `counterexamples` violated properties
/// (each costs a few more searches), each with the command that explores it: `explore` with
/// `options` (the options that give `model`).
pub fn check_with(
    model: &LeaseModel,
    counterexamples: usize,
    options: &str,
    out: &mut impl Write,
) -> io::Result<bool> {
    writeln!(out, "{}", describe(model))?;
    let start = std::time::Instant::now();
    let outcome = explore(model);
    outcome.write_counts(start.elapsed(), out)?;
    let mut all_ok = outcome.complete;
    for v in &outcome.verdicts {
        v.write(62, out)?;
        all_ok &= v.ok;
    }
    if !outcome.complete {
        writeln!(
            out,
            "  (the search stopped at the first violation, so a property not decided by then is \
             \"unknown\": a violation can make the state space explode, and one \
             counterexample is the answer that matters; fix it and check again)"
        )?;
    }
    let violated: Vec<&Verdict> = outcome
        .verdicts
        .iter()
        .filter(|v| !v.ok && v.expectation == "always")
        .take(counterexamples)
        .collect();
    // Once per process: a planted mistake that several configurations catch prints the legend
    // above the first counterexample only.
    static LEGEND_SHOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !violated.is_empty() && !LEGEND_SHOWN.swap(true, std::sync::atomic::Ordering::Relaxed) {
        writeln!(out, "\n{LEGEND}")?;
    }
    for v in violated {
        writeln!(out, "\nshortest counterexample for \"{}\":", v.name)?;
        match shortest(model, v.name) {
            Some(path) => {
                let steps = path.last_state().clone();
                let states = path.clone().into_states();
                let last_step = path
                    .clone()
                    .into_actions()
                    .last()
                    .map(|a| model.format_action(a));
                let last_action = path.clone().into_actions().last().cloned();
                let encoded = path.encode(model);
                write_path(model, path, out)?;
                writeln!(
                    out,
                    "  the last state breaks it: {}",
                    why(model, v.name, &steps)
                )?;
                if let Some(step) = last_step {
                    writeln!(out, "  the step that broke it: {step}")?;
                }
                if let ([.., before, after], Some(action)) = (states.as_slice(), &last_action) {
                    writeln!(
                        out,
                        "  in words: {}",
                        in_words(model, v.name, before, after, action)
                    )?;
                }
                if let [.., before, after] = states.as_slice() {
                    for change in changes(before, after) {
                        writeln!(out, "  what that step changed: {change}")?;
                    }
                }
                let space = if options.is_empty() { "" } else { " " };
                writeln!(
                    out,
                    "  step through it in the explorer: `cargo run --release -p \
                     flocklease-model -- explore{space}{options}`, then \
                     http://127.0.0.1:3000/#/steps/{encoded}"
                )?;
            }
            None => writeln!(out, "   (not found again)")?,
        }
    }
    writeln!(out, "{}", if all_ok { "OK" } else { "FAILED" })?;
    Ok(all_ok)
}

/// What property `name` reads in `s`, said plainly.
fn why(m: &LeaseModel, name: &str, s: &State) -> String {
    use crate::props::names::*;
    let tok = |r: &Option<Record>| r.as_ref().map_or(0, |r| r.token);
    match name {
        n if n == NEVER_BACK => format!(
            "it needs highest token reported ({}) <= durable token ({}, record {}) <= visible \
             token ({}, record {}); a power loss now would leave token {} as the last issued",
            s.max_granted,
            tok(&s.durable),
            rec(&s.durable),
            tok(&s.record),
            rec(&s.record),
            tok(&s.durable),
        ),
        n if n == FENCED => {
            let (token, committed) = s.written.0.last.unwrap_or_default();
            format!(
                "the resource just accepted a write with token #{token} while the last new \
                 generation committed was #{committed} (see VIOLATION)"
            )
        }
        n if crate::props::CALL_PROPERTIES.contains(&n) => {
            "judged on the call's answer against what it read and did (when the call ends, or \
             at its commit for a new generation's token): see VIOLATION in the last state, and \
             the step below"
                .to_owned()
        }
        _ => {
            let holders: Vec<String> = s
                .procs
                .iter()
                .enumerate()
                .filter_map(|(p, pr)| pr.lease.map(|l| (p, l)))
                .filter(|(_, l)| s.now < l.expiry)
                .map(|(p, l)| format!("{} holds #{}@{}", m.owner(p), l.token, l.expiry))
                .collect();
            format!(
                "at t={}: {}; the record is {}",
                s.now,
                holders.join(", "),
                rec(&s.record)
            )
        }
    }
}

/// The violating step of a counterexample as one sentence: who acted and, for a call that the
/// step ended, what it was answered; what the record names and who else believes it holds
/// after the step; and the property it breaks. Generic over the properties: derived from the
/// last action and the two states around it, e.g. "p0's renew of #1 was answered held,
/// although the record names p0#1@4, and nobody else holds a lease: that breaks \"\[5\] renew by
/// the current holder succeeds\"".
pub fn in_words(
    m: &LeaseModel,
    name: &str,
    before: &State,
    after: &State,
    action: &Action,
) -> String {
    let actor = match *action {
        Action::Call(p, _)
        | Action::Step(p, _)
        | Action::Fail(p, _)
        | Action::Refuse(p)
        | Action::Crash(p)
        | Action::LoseLiveness(p, _)
        | Action::NoticeLoss(p)
        | Action::SessionEnds(p)
        | Action::Relock(p)
        | Action::Fence(p)
        | Action::FenceStep(p, _) => Some(p),
        _ => None,
    };
    let step = m.format_action(action);
    let took_over = match after.max_committed > before.max_committed {
        true => format!(" (it committed generation #{})", after.max_committed),
        false => String::new(),
    };
    let record = format!(
        "{}{}",
        rec(&after.record),
        if after.record_bad.is_some() {
            " (a planted file stands at its name)"
        } else {
            ""
        }
    );
    // Who acted and what came of it, up to the record.
    let what = match actor {
        Some(p) => {
            let (b, a) = (&before.procs[p], &after.procs[p]);
            let call = b.call.as_ref().or(a.call.as_ref());
            let of = call
                .and_then(|c| c.view)
                .map(|v| format!(" of #{}", v.token))
                .unwrap_or_default();
            match (a.last != b.last, a.last, call.map(|c| c.kind)) {
                (true, Some((kind, said)), _) => {
                    let answer = match said {
                        Said::Granted(t, e) => format!("was answered granted #{t}@{e}"),
                        Said::Held => "was answered held".into(),
                        Said::Released => "was answered released".into(),
                        Said::Failed => "failed".into(),
                        Said::Crashed => "crashed".into(),
                    };
                    format!(
                        "p{p}'s {}{of} {answer}{took_over}, although the record names {record}",
                        kind.label()
                    )
                }
                (_, _, Some(kind)) => format!(
                    "in p{p}'s {}{of}, the step \"{step}\"{took_over} left the record naming \
                     {record}",
                    kind.label()
                ),
                _ => match b.fence.or(a.fence) {
                    Some(f) => format!(
                        "in p{p}'s fenced section with #{}, the step \"{step}\" came while the \
                         record names {record}",
                        f.token
                    ),
                    None => {
                        format!("the step \"{step}\"{took_over} left the record naming {record}")
                    }
                },
            }
        }
        None => format!("the step \"{step}\"{took_over} left the record naming {record}"),
    };
    let lock = match (before.lock_holder(), after.lock_holder()) {
        (b, a) if b == a => String::new(),
        (Some(b), None) => format!(", p{b} no longer holds the transition lock"),
        (None, Some(a)) => format!(", p{a} took the transition lock"),
        (Some(b), Some(a)) => format!(", the transition lock went from p{b} to p{a}"),
        (None, None) => String::new(),
    };
    let others: Vec<String> = after
        .procs
        .iter()
        .enumerate()
        .filter(|(p, _)| Some(*p) != actor)
        .filter_map(|(p, pr)| pr.lease.filter(|l| after.now < l.expiry).map(|l| (p, l)))
        .map(|(p, l)| format!("p{p} believes it holds #{}@{}", l.token, l.expiry))
        .collect();
    let others = match (others.is_empty(), actor.is_some()) {
        (true, true) => "nobody else holds a lease".to_owned(),
        (true, false) => "nobody holds a lease".to_owned(),
        (false, _) => others.join(" and "),
    };
    format!("{what}{lock}, and {others}: that breaks \"{name}\"")
}

/// The legend as an SVG image, for the explorer's page: it shows a model's `as_svg` beside
/// each step, and has no other place for text of ours.
pub fn legend_svg() -> String {
    let lines: Vec<&str> = LEGEND.lines().collect();
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{}\" \
         font-family=\"monospace\" font-size=\"12\">",
        lines.len() * 15 + 10
    );
    for (i, line) in lines.iter().enumerate() {
        let text = line
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        out.push_str(&format!(
            "<text x=\"4\" y=\"{}\" xml:space=\"preserve\">{text}</text>",
            i * 15 + 15
        ));
    }
    out.push_str("</svg>");
    out
}

/// What changed between two states, in words: the record, its durable copy, the highest
/// token reported, the liveness files.
fn changes(before: &State, after: &State) -> Vec<String> {
    let tok = |r: &Option<Record>| r.as_ref().map(|r| r.token);
    let mut said = vec![];
    let mut record = |what: &str, b: &Option<Record>, a: &Option<Record>| {
        if b == a {
            return;
        }
        let went = match (tok(b), tok(a)) {
            (Some(x), Some(y)) if y < x => format!(" (token {x} went back to {y})"),
            (Some(x), None) => format!(" (token {x} is gone)"),
            _ => String::new(),
        };
        said.push(format!("{what} {} -> {}{went}", rec(b), rec(a)));
    };
    record("the record", &before.record, &after.record);
    record("its durable copy", &before.durable, &after.durable);
    if before.max_granted != after.max_granted {
        said.push(format!(
            "the highest token reported {} -> {}",
            before.max_granted, after.max_granted
        ));
    }
    if before.live != after.live {
        said.push(format!(
            "liveness files {:?} -> {:?}",
            before.live.keys().collect::<Vec<_>>(),
            after.live.keys().collect::<Vec<_>>()
        ));
    }
    said
}

fn rec(r: &Option<Record>) -> String {
    match r {
        None => "none".to_owned(),
        Some(r) if r.is_tombstone() => format!("tombstone#{}", r.token),
        Some(r) => format!("{}#{}@{}", r.owner, r.token, ticks(r.expiry)),
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "t={} record={}{} durable={}",
            self.now,
            rec(&self.record),
            if self.record_bad.is_some() { "!" } else { "" },
            rec(&self.durable)
        )?;
        for (p, t) in self.temps.iter().enumerate() {
            if let Some(t) = t {
                let synced = if t.synced { " synced" } else { "" };
                write!(f, " temp{p}={}{synced}", rec(&Some(t.record.clone())))?;
            }
        }
        match self.lock_at {
            crate::LockAt::Missing => write!(f, " lock=gone")?,
            crate::LockAt::NotAFile => write!(f, " lock=planted")?,
            crate::LockAt::File(i) => {
                if i > 0 {
                    write!(f, " lock#{i}")?;
                }
                if let Some(p) = self.lock_holder() {
                    write!(f, " lock=p{p}")?;
                }
            }
        }
        let live: Vec<String> = self
            .live
            .iter()
            .map(|(t, file)| {
                use crate::{Locker, What};
                let what = match file.what {
                    What::Own(p) if file.old => format!("p{p}'s(old)"),
                    What::Own(p) if file.restored => format!("p{p}'s*"),
                    What::Own(p) => format!("p{p}'s"),
                    What::Plain => "plain".into(),
                    What::Fifo => "fifo".into(),
                    What::Dir => "dir".into(),
                };
                let held = match file.holder {
                    Some(Locker::Proc(p)) => format!("p{p}"),
                    Some(Locker::Go) => "go".into(),
                    Some(Locker::Ended(p)) => format!("p{p}~"),
                    None => "-".into(),
                };
                let shared = if file.shared { "+s" } else { "" };
                format!("{t}:{what}:{held}{shared}")
            })
            .collect();
        write!(
            f,
            " live=[{}] reported=#{}",
            live.join(","),
            self.max_granted
        )?;
        if let Some((token, committed)) = self.written.0.last {
            write!(
                f,
                " written=#{} (last #{token}, #{committed} committed then)",
                self.written.0.highest
            )?;
        }
        for (p, proc) in self.procs.iter().enumerate() {
            write!(f, " | p{p}:")?;
            if let Some(l) = proc.lease {
                write!(f, " lease #{}@{}", l.token, l.expiry)?;
            }
            if let Some(l) = proc.stale {
                write!(f, " stale #{}@{}", l.token, l.expiry)?;
            }
            if let Some(l) = &proc.local {
                write!(f, " local #{}", l.token)?;
            }
            if let Some(l) = proc.loss {
                let noticed = if l.noticed { "seen" } else { "not seen yet" };
                write!(f, " LIVENESS #{} LOST ({noticed})", l.token)?;
            }
            if let Some(c) = &proc.call {
                let next = c.run.peek().map_or("-".into(), io_label);
                write!(f, " [{} -> next: {next}]", c.kind.label())?;
            }
            if let Some(fence) = proc.fence {
                let refused = if fence.admitted { "" } else { " refused" };
                let share = if proc.share { " share" } else { "" };
                write!(
                    f,
                    " [fenced #{}{refused}{share} -> next: {:?}]",
                    fence.token, fence.next
                )?;
            }
            if let Some((kind, said)) = proc.last {
                let said = match said {
                    Said::Granted(t, e) => format!("granted #{t}@{e}"),
                    Said::Held => "held".into(),
                    Said::Released => "released".into(),
                    Said::Failed => "FAILED".into(),
                    Said::Crashed => "crashed".into(),
                };
                write!(f, " last: {} = {said}", kind.label())?;
            }
        }
        for (i, name) in crate::props::CALL_PROPERTIES.iter().enumerate() {
            if self.violations & (1 << i) != 0 {
                write!(f, " | VIOLATION: {name}")?;
            }
        }
        Ok(())
    }
}

/// A small seeded generator (SplitMix64) for the lockstep harnesses' random walks, so a seed
/// replays its walk.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (which must not be 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
