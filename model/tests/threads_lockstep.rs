//! Lockstep of what one `FlockLease` call holds with the model's threads (`check --config
//! threads`, `flocklease_model::threads`): a real transition (an acquire, through
//! `acquire_guard`) and a real fenced section run with a fault hook that observes each step
//! of what they hold ([`FaultPoint::Held`]); after each step, whether the instance's turn on
//! the id, its state of the id and the id's transition lock are held is compared with what
//! the model's thread holds after the same step of the same order (`driver::TRANSITION`,
//! `flock::SECTION`). The model runs the orders as data; this checks that the adapter's steps
//! do what the data says (a step that forgets to give back, or gives back the wrong thing,
//! diverges).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs::File;
use std::sync::{Arc, Mutex};

use flocklease::driver::Hold;
use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::{FlockLease, SessionId};
use flocklease_model::threads::{Call, Op, Thread, ThreadsAction, ThreadsModel, ThreadsState, ops};
use stateright::Model;

/// What the model's thread holds after each of its steps of `call` that the adapter
/// observes (every step but the call's begin and end), as the model's own `next_state` steps
/// a thread alone with nobody else on the id.
fn expected(call: Call) -> Vec<BTreeSet<String>> {
    let model = ThreadsModel::default();
    let mut s = ThreadsState {
        now: 0,
        threads: vec![Thread {
            ops: ops(call),
            pc: 0,
            frames: Vec::new(),
            failed: false,
            waited: false,
            parked: false,
            woken: false,
        }],
        turn: None,
        gate: Default::default(),
        two_turns: false,
        state: None,
        lock: None,
        rival_since: None,
        rival_left: 0,
    };
    let mut after = Vec::new();
    while let Some(&op) = s.threads[0].ops.get(s.threads[0].pc) {
        s = model
            .next_state(&s, ThreadsAction::Step(0))
            .expect("a thread's step is always a state");
        if matches!(op, Op::Begin(_) | Op::End) {
            continue;
        }
        let mut held = BTreeSet::new();
        for (h, on) in [
            (Hold::Turn, s.turn.is_some()),
            (Hold::State, s.state.is_some()),
            (Hold::Lock, s.lock.is_some()),
        ] {
            if on {
                held.insert(format!("{h:?}"));
            }
        }
        after.push(held);
    }
    after
}

/// Whether another open file description can lock the file at `path` now.
fn lock_held(path: &std::path::Path) -> bool {
    File::open(path).is_ok_and(|f| f.try_lock_shared().is_err())
}

#[test]
fn what_a_call_holds_follows_the_model_step_by_step() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::new("threads").unwrap();
    let seen: Arc<Mutex<Vec<BTreeSet<String>>>> = Arc::default();
    let lease_of: Arc<Mutex<Option<Arc<FlockLease>>>> = Arc::default();
    let hook: FaultHook = {
        let (seen, lease_of, id) = (Arc::clone(&seen), Arc::clone(&lease_of), id.clone());
        Arc::new(move |point, path| {
            if point == FaultPoint::Held
                && let Some(lease) = lease_of.lock().unwrap().as_ref()
            {
                let (turn, state) = lease.holds(&id);
                let mut held = BTreeSet::new();
                for (h, on) in [
                    (Hold::Turn, turn),
                    (Hold::State, state),
                    (Hold::Lock, lock_held(path)),
                ] {
                    if on {
                        held.insert(format!("{h:?}"));
                    }
                }
                seen.lock().unwrap().push(held);
            }
            None
        })
    };
    let lease = Arc::new(FlockLease::builder(dir.path()).faults(hook).open().unwrap());
    *lease_of.lock().unwrap() = Some(Arc::clone(&lease));

    // Through the guard a service takes the lease with (`acquire_guard`, an acquire under a
    // fresh owner), kept past the guard.
    let guard = lease.acquire_guard(&id).unwrap();
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, expected(Call::Transition), "an acquire's transition");
    let held = guard.expect("the id was free: granted").into_lease();
    let ran = lease.fenced(&held, || ()).unwrap();
    assert!(ran.is_some(), "the section ran");
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, expected(Call::Section(None)), "a fenced section");
    // The hook holds the instance: let it go.
    lease_of.lock().unwrap().take();
}
