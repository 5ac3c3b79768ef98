//! Lockstep of the line of waiting acquires (`<stem>.queue`, PROTOCOL §4.6) with its model
//! (`check --config line`, `flocklease_model::line`): each model waiter is a real
//! [`LineStepper`] — the very place and count a wait of `FlockLease::acquire_wait` keeps — on
//! a real `<stem>.queue`, its place a real byte it appended and holds under an OFD lock, its
//! looks the kernel's `F_OFD_GETLK` answers; the model's stray lock is a real OFD lock of the
//! same span, held by a description of the harness's own. The clock is the model's (a tick is
//! 10 ms) and so is the lease (held or free, its token): what the line decides is the attempt,
//! not the grant.
//!
//! After each join and each look, every waiter's place (its byte, how far it has passed over)
//! and its count of the lease left free are compared with the model's, and each look's answer
//! (may it try) with the model's: a waiter granted in the model is one whose look said "try"
//! on a free lease. (On a held lease the answer itself is not compared — either answer ends in
//! the waiter seeing the holder — but what the look passed over is, through the places and
//! counts compared after it.) The model's `F_OFD_GETLK` reports, of several locks, the one that starts
//! last; the kernel reports any one: the rule must find the same earliest place either way.
//!
//! Schedules: seeded random walks of the model. A divergence fails with the seed and the
//! actions so far.

#![allow(clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};

use flocklease::flock::LineStepper;
use flocklease::{FlockLease, SessionId};
use flocklease_model::line::{LineAction, LineModel, LinePlanted, LineState, TICK};
use flocklease_model::report::SplitMix;
use nix::fcntl::{FcntlArg, fcntl};
use nix::libc;
use stateright::Model;

/// How many seeded random walks.
const WALKS: u64 = 20_000;
/// The longest walk, in actions.
const WALK_LEN: usize = 200;

/// An OFD write lock of `len` bytes from `start` (0: to the end and beyond) on `file`.
fn ofd_lock(file: &File, (start, len): (i64, i64)) {
    let range = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    fcntl(file, FcntlArg::F_OFD_SETLK(&range)).unwrap();
}

/// Compares each waiter's place and count with the model's.
fn compare(s: &LineState, real: &[Option<LineStepper<'_>>]) -> Result<(), String> {
    for (w, (model, real)) in s.waiters.iter().zip(real).enumerate() {
        match real {
            None if model.gone => {}
            None => return Err(format!("w{w} left the line in the real one only")),
            Some(_) if model.gone => return Err(format!("w{w} left the line in the model only")),
            Some(r) => {
                let (place, yielded) = r.state();
                if place != model.place || yielded != model.yielded {
                    return Err(format!(
                        "w{w}: real place {place:?} count {yielded:?}, model place {:?} count {:?}",
                        model.place, model.yielded
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What one walk reached.
#[derive(Default)]
struct Reached {
    looks: usize,
    /// A grant past a stopped waiter's place.
    past_stopped: bool,
    /// A grant past a lock of several bytes.
    past_span: bool,
}

/// One walk of `m` from seed `seed`: what it reached, or the divergence.
fn walk(m: &LineModel, seed: u64) -> Result<Reached, String> {
    let mut rng = SplitMix::new(seed);
    let inits = m.init_states();
    let mut s = inits[rng.below(inits.len())].clone();
    let dir = tempfile::tempdir().unwrap();
    let lease = FlockLease::open(dir.path()).unwrap();
    let id = SessionId::new("line").unwrap();
    let path = dir.path().join(format!("{}.queue", id.stem()));
    // The bytes of earlier waiters, long gone, and the stray lock, before the waiters come;
    // without a stray lock, a new file (the model's first waiter is at byte 0 then).
    let earlier: &[u8] = if s.stray.is_some() { b".." } else { b"" };
    fs::write(&path, earlier).unwrap();
    let stray = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    if let Some(span) = s.stray {
        ofd_lock(&stray, span);
    }
    let mut real: Vec<Option<LineStepper<'_>>> = (0..s.waiters.len())
        .map(|_| {
            let mut waiter = lease.line_stepper(&id);
            waiter.join();
            Some(waiter)
        })
        .collect();
    let mut log = vec![format!("start: {s}")];
    let fail = |log: &[String], why: String| {
        Err(format!(
            "seed {seed}: {why}\n  after:\n    {}",
            log.join("\n    ")
        ))
    };
    if let Err(why) = compare(&s, &real) {
        return fail(&log, why);
    }
    let mut looks = 0;
    let mut actions = Vec::new();
    for _ in 0..WALK_LEN {
        actions.clear();
        m.actions(&s, &mut actions);
        if actions.is_empty() {
            break;
        }
        let action = actions[rng.below(actions.len())];
        let Some(next) = m.next_state(&s, action) else {
            continue;
        };
        if let LineAction::Look(w) = action {
            looks += 1;
            let now = TICK * u32::from(s.now);
            let waiter = real[w].as_mut().unwrap();
            // The adapter's look: an instance that holds the id tries at once, without asking
            // the line. The flag is the model's (a line stepper has none): what is compared is
            // the real line, asked when the flag is down.
            let tries = LineModel::held_here(&s, w) || waiter.may_try(now, Some(s.token));
            let free = s.holder.is_none();
            if tries && free {
                // Granted: its call returns and its place is gone.
                real[w] = None;
            } else if free {
                waiter.let_go(now, Some(s.token));
            } else {
                waiter.saw_held();
            }
            if next.waiters[w].gone != (tries && free) {
                log.push(format!("{action:?} -> {next}"));
                return fail(
                    &log,
                    format!(
                        "w{w}'s look: real may try {tries} on a {} lease, model granted {}",
                        if free { "free" } else { "held" },
                        next.waiters[w].gone
                    ),
                );
            }
        }
        s = next;
        log.push(format!("{action:?} -> {s}"));
        if let Err(why) = compare(&s, &real) {
            return fail(&log, why);
        }
    }
    Ok(Reached {
        looks,
        past_stopped: s.past_stopped,
        past_span: s.past_span,
    })
}

#[test]
fn the_real_line_follows_the_model() {
    let m = LineModel::default();
    let (mut looks, mut past_stopped, mut past_span) = (0, 0, 0);
    for seed in 0..WALKS {
        let reached = walk(&m, seed).unwrap_or_else(|e| panic!("{e}"));
        looks += reached.looks;
        past_stopped += usize::from(reached.past_stopped);
        past_span += usize::from(reached.past_span);
    }
    println!(
        "{WALKS} walks, {looks} looks, no divergence; {past_stopped} walks granted a waiter past a \
         stopped one, {past_span} past a lock of several bytes"
    );
    // The walks reach what the line is for: passing over stopped places and wide locks.
    assert!(past_stopped > 0 && past_span > 0);
}

/// A model planted with either known mistake of the line (a pass-over of the lock's first
/// byte only; the whole grace for every place ahead) no longer describes the real line: the
/// harness finds where they part.
#[test]
fn a_planted_model_diverges() {
    for planted in [LinePlanted::PassOverFirstByte, LinePlanted::WholeGraceEach] {
        let m = LineModel {
            planted: Some(planted),
            ..LineModel::default()
        };
        let diverged = (0..WALKS).find_map(|seed| walk(&m, seed).err());
        let why = diverged.unwrap_or_else(|| panic!("no walk told {planted:?} from the real line"));
        println!("{planted:?}: {why}");
    }
}
