//! The model checker's verdicts on the configurations CI relies on.

use flocklease_model::{LeaseModel, report};

/// The default configuration: every property verified, every scenario witnessed, and the full
/// state space explored (a pinned count, so a silently truncated search fails).
#[test]
fn default_configuration_holds_exhaustively() {
    let outcome = report::explore(&LeaseModel::default());
    for v in &outcome.verdicts {
        assert!(v.ok, "{} {} failed", v.expectation, v.name);
    }
    assert_eq!(outcome.verdicts.len(), 10);
    assert_eq!(
        outcome.unique_states, 1_156_925,
        "state space changed: re-pin after review"
    );
}

/// Without fsync a host crash can bring back an older token: the durability property must see
/// it, with a one-step shortest counterexample (the first grant is not durable).
#[test]
fn without_fsync_tokens_can_go_back() {
    let model = LeaseModel {
        durable: false,
        ..LeaseModel::default()
    };
    let outcome = report::explore(&model);
    let failed: Vec<&str> = outcome
        .verdicts
        .iter()
        .filter(|v| !v.ok)
        .map(|v| v.name)
        .collect();
    assert!(
        failed.contains(&"tokens never go back, even after a host crash"),
        "{failed:?}"
    );
    let path = report::shortest(&model, "tokens never go back, even after a host crash", 30)
        .expect("a counterexample");
    assert_eq!(path.into_actions().len(), 1);
}

/// Without a host crash or faults the scenarios that need them are not claimed.
#[test]
fn smaller_configurations_hold() {
    let model = LeaseModel {
        host_crash: false,
        cleaner: false,
        max_time: 4,
        write_faults: 0,
        ..LeaseModel::default()
    };
    assert_all_hold(&model);
}

/// Three processes on the default configuration: 12.6 M states, about 4 minutes and 5 GiB
/// in release on 2 cores; run with `cargo test --release -p flocklease-model -- --ignored`.
#[test]
#[ignore = "stress: 12.6 M states"]
fn three_processes() {
    let model = LeaseModel {
        procs: 3,
        ..LeaseModel::default()
    };
    assert_all_hold(&model);
}

fn assert_all_hold(model: &LeaseModel) {
    let outcome = report::explore(model);
    assert!(
        outcome.verdicts.iter().all(|v| v.ok),
        "{:?}",
        outcome.verdicts
    );
}
