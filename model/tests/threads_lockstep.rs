//! Lockstep of what one `FlockLease` call holds with the model's threads (`check --config
//! threads`, `flocklease_model::threads`): a real transition (`acquire`) and a real fenced
//! section run with a fault hook that observes each step of what they hold
//! ([`FaultPoint::Held`]); after each step, whether the instance's turn on the id, its state
//! of the id and the id's transition lock are held is compared with what the model's thread
//! holds after the same step of the same order (`flock::TRANSITION`, `flock::SECTION`). The
//! model runs the orders as data; this checks that the adapter's steps do what the data says
//! (a step that forgets to give back, or gives back the wrong thing, diverges).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs::File;
use std::sync::{Arc, Mutex};

use flocklease::fault::{FaultHook, FaultPoint};
use flocklease::flock::Hold;
use flocklease::{FlockLease, Owner, SessionId};
use flocklease_model::threads::{Call, Op, ops};

/// What the model's thread holds after each of its steps of `call` that the adapter
/// observes (every step but the call's begin and end).
fn expected(call: Call) -> Vec<BTreeSet<String>> {
    let mut held = BTreeSet::new();
    let mut after = Vec::new();
    for op in ops(call) {
        match op {
            Op::Take(h) => {
                held.insert(format!("{h:?}"));
            }
            Op::Give(h) => {
                held.remove(&format!("{h:?}"));
            }
            Op::Run => {
                held.remove(&format!("{:?}", Hold::Lock));
            }
            Op::Work | Op::TryState | Op::Wait => {}
            Op::Begin(_) | Op::End => continue,
        }
        after.push(held.clone());
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

    let granted = lease.acquire(&id, &Owner::new("a").unwrap()).unwrap();
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, expected(Call::Transition), "an acquire's transition");

    let held = granted.lease().unwrap();
    let ran = lease.fenced(&held, || ()).unwrap();
    assert!(ran.is_some(), "the section ran");
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, expected(Call::Section(None)), "a fenced section");
    // The hook holds the instance: let it go.
    lease_of.lock().unwrap().take();
}
