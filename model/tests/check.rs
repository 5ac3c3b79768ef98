//! The model checker's verdicts on the configurations CI relies on.

use flocklease::driver::Io;
use flocklease_model::props::names;
use flocklease_model::{Action, LeaseModel, report};

/// The default configuration: every property verified, every scenario witnessed, and the full
/// state space explored (a pinned count, so a silently truncated search fails).
#[test]
fn default_configuration_holds_exhaustively() {
    let outcome = report::explore(&LeaseModel::default());
    assert!(outcome.complete);
    for v in &outcome.verdicts {
        assert!(v.ok, "{} {} failed", v.expectation, v.name);
    }
    assert_eq!(outcome.verdicts.len(), 19);
    assert_eq!(
        outcome.unique_states, 2_232_462,
        "state space changed: re-pin after review"
    );
}

/// Without fsync a host crash can bring back an older token: the durability property must see
/// it. The shortest counterexample is the first grant, step by step: a power loss right after
/// it would lose the token.
#[test]
fn without_fsync_tokens_can_go_back() {
    let model = LeaseModel {
        durable: false,
        host_crash: true,
        cleaner: false,
        faults: 0,
        ..LeaseModel::default()
    };
    let outcome = report::explore(&model);
    let failed: Vec<&str> = outcome
        .verdicts
        .iter()
        .filter(|v| !v.ok)
        .map(|v| v.name)
        .collect();
    assert!(failed.contains(&names::NEVER_BACK), "{failed:?}");
    assert!(!outcome.complete);
    let path = report::shortest(&model, names::NEVER_BACK).expect("a counterexample");
    let actions = path.into_actions();
    // Lock, read, lock the new generation, write, (no) fsync, rename, (no) directory fsync,
    // adopt, unlock: the grant is reported, and a power loss would lose it.
    assert!(
        matches!(actions.last(), Some(Action::Step(_, Io::UnlockStable))),
        "{actions:?}"
    );
    assert_eq!(actions.len(), 9, "{actions:?}");
}

/// Without a host crash or faults the scenarios that need them are not claimed.
#[test]
fn smaller_configurations_hold() {
    let model = LeaseModel {
        host_crash: false,
        cleaner: false,
        faults: 0,
        ..LeaseModel::default()
    };
    assert_all_hold(&model);
}

/// Two processes with the same owner string are foreign to each other (SPEC §3.1).
#[test]
fn shared_owner_holds() {
    assert_all_hold(&LeaseModel::named("shared-owner").expect("a named configuration"));
}

/// PostgreSQL: liveness lost while the holder runs; a rival takes over before the expiry,
/// and the properties in their PostgreSQL form hold.
#[test]
fn postgres_holds() {
    let model = LeaseModel::named("postgres").expect("a named configuration");
    let outcome = report::explore(&model);
    for v in &outcome.verdicts {
        assert!(v.ok, "{} {} failed", v.expectation, v.name);
    }
    assert!(
        outcome
            .verdicts
            .iter()
            .any(|v| v.name == names::ONE_LIVE_HOLDER)
    );
}

/// The larger configuration CI runs (`check --config large`): 25.3 M states, about 6 minutes
/// and 5 GiB in release on 2 cores; run with
/// `cargo test --release -p flocklease-model -- --ignored`.
#[test]
#[ignore = "stress: the large configuration"]
fn large_configuration_holds() {
    assert_all_hold(&LeaseModel::named("large").expect("a named configuration"));
}

fn assert_all_hold(model: &LeaseModel) {
    let outcome = report::explore(model);
    assert!(
        outcome.verdicts.iter().all(|v| v.ok),
        "{:?}",
        outcome.verdicts
    );
}
