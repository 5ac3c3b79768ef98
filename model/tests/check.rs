//! The model checker's verdicts on the configurations CI relies on.

use flocklease::driver::{CommitStep, Io};
use flocklease_model::props::names;
use flocklease_model::{Action, Change, Cut, FenceIo, LeaseModel, Planted, Tamper, Target, report};
use stateright::{Checker, Model};

// The checker's allocator, as in `check` (main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The default configuration: every property verified, every scenario witnessed, and the full
/// state space explored (a pinned count, so a silently truncated search fails).
#[test]
fn default_configuration_holds_exhaustively() {
    let outcome = report::explore(&LeaseModel::default());
    assert!(outcome.complete);
    assert_eq!(outcome.failed(), Vec::<&str>::new());
    // 28 since property [12] (the transition lock held from the first read to the end).
    assert_eq!(outcome.verdicts.len(), 28);
    // 4 801 465 before the front's final expiry check was part of the model (a grant expired
    // at its return is renewed first, as the front does, and a failed renew answers lost:
    // property [10] and its scenario).
    assert_eq!(
        outcome.unique_states, 4_902_009,
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
        cleaner: 0,
        faults: 0,
        ..LeaseModel::default()
    };
    let outcome = report::explore(&model);
    let failed = outcome.failed();
    assert!(failed.contains(&names::NEVER_BACK), "{failed:?}");
    assert!(!outcome.complete);
    let path = report::shortest(&model, names::NEVER_BACK).expect("a counterexample");
    let actions = path.into_actions();
    // Lock, read, lock the new generation, write, (no) fsync, rename, (no) directory fsync,
    // adopt, unlock: the grant is reported, and a power loss would lose it.
    assert!(
        matches!(actions.last(), Some(Action::Step(_, Io::Unlock))),
        "{actions:?}"
    );
    assert_eq!(actions.len(), 9, "{actions:?}");
}

/// Without a host crash or faults the scenarios that need them are not claimed.
#[test]
fn smaller_configurations_hold() {
    let model = LeaseModel {
        host_crash: false,
        cleaner: 0,
        faults: 0,
        ..LeaseModel::default()
    };
    assert_all_hold(&model);
}

/// The configurations `check` runs after the default one (`LeaseModel::alongside_default`):
/// the cleaner that moves the liveness file or the lock aside and back (without the fault and
/// the host crash, no call past token 1), and records without a tag, the Go package's (the
/// file at the generation's name judged by its type and its lock, `machine::own_liveness`;
/// without the fault and the host crash). Every property holds and every scenario is
/// witnessed, exhaustively; the counts are pinned. (`.ci/run` also runs `moves` with the host
/// crash, 1.5 million states, and `go-records` whole, 2.5 million.)
#[test]
fn the_configurations_checked_with_the_default_hold() {
    let [moves, go_records, ..] = LeaseModel::default().alongside_default();
    for (model, states) in [(moves, 648_566), (go_records, 437_144)] {
        let outcome = report::explore(&model);
        assert!(outcome.complete, "{}", model.name);
        assert_eq!(outcome.failed(), Vec::<&str>::new(), "{}", model.name);
        assert_eq!(
            outcome.unique_states, states,
            "{}: state space changed: re-pin after review",
            model.name
        );
    }
}

/// Two processes with the same owner string are foreign to each other (PROTOCOL §3.1).
#[test]
fn shared_owner_holds() {
    assert_all_hold(&LeaseModel::named("shared-owner").expect("a named configuration"));
}

/// PostgreSQL: liveness lost while the holder runs (the server ending the session first, or
/// the holder seeing its connection break first); a rival takes over before the expiry, or the
/// holder's renew locks its generation again under the row lock (or finds the old session
/// still holding it), and the properties in their PostgreSQL form hold, exhaustively.
#[test]
fn postgres_holds() {
    let model = LeaseModel::named("postgres").expect("a named configuration");
    let outcome = report::explore(&model);
    assert!(outcome.complete);
    assert_eq!(outcome.failed(), Vec::<&str>::new());
    for name in [
        names::ONE_LIVE_HOLDER,
        names::HOLDER_TOLD,
        names::RELOCK_GUARDED,
        names::RENEW_RELOCKED,
        names::FENCED,
    ] {
        assert!(outcome.verdicts.iter().any(|v| v.name == name), "{name}");
    }
    assert_eq!(outcome.verdicts.len(), 34);
    // 361 556 while the PostgreSQL backend ran the flock backend's steps; at statement grain
    // (the row lock and the read one step, the commit one statement that releases the row
    // lock, no steps for files PostgreSQL does not have, an acquire probing in its first
    // statement) 275 634; with the front's final expiry check in the model, 290 852; with a
    // commit statement refused by the server (nothing committed) besides its reply lost,
    // 332 394; with the server ending the session of a generation committed and not adopted
    // yet (not only through a failover; property "a holder whose generation's liveness lock
    // is gone is told"), 399 334.
    assert_eq!(
        outcome.unique_states, 399_334,
        "state space changed: re-pin after review"
    );
}

/// PostgreSQL with a synchronous standby and a failover: the library's recovery before
/// `commit::verdict` (a commit whose reply was lost counts once the re-read finds it, though
/// the standby never confirmed it) reports a grant the standby does not have (property [2]),
/// and after the failover the same token is granted again.
#[test]
fn a_reread_after_terminate_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::RereadAfterTerminate),
        ..LeaseModel::named("failover").expect("a named configuration")
    };
    let path = report::shortest(&model, names::NEVER_BACK).expect("a counterexample for [2]");
    let actions = path.into_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Fail(_, Io::Commit(CommitStep::Point)))),
        "the commit's reply was lost: {actions:?}"
    );
    let path = report::shortest(&model, names::INCREASE).expect("a counterexample for [2]");
    let actions = path.into_actions();
    assert!(
        actions.iter().any(|a| matches!(a, Action::Failover)),
        "the token is granted again after the failover: {actions:?}"
    );
}

/// The same, with the fix: a lost reply never becomes a grant the standby lacks. The whole
/// failover configuration (1.02 million states) is checked by `.ci/run` in release mode; here,
/// its first 200 000 states.
#[test]
fn the_failover_configuration_holds_in_its_first_states() {
    let model = LeaseModel::named("failover").expect("a named configuration");
    let checker = model
        .clone()
        .checker()
        .threads(2)
        .target_state_count(200_000)
        .spawn_bfs()
        .join();
    for p in model.properties() {
        if p.expectation == stateright::Expectation::Always {
            assert!(checker.discovery(p.name).is_none(), "{} broken", p.name);
        }
    }
}

/// PostgreSQL, a reconnect that re-locks the generation as soon as the holder sees its
/// liveness connection end, outside any transition: without the row lock and without reading
/// the row. The checker flags the re-lock itself, and shows the harm: the rival took over
/// while the lock was free, the old holder's re-lock succeeds, and two unexpired holders have
/// their liveness lock (property [1]).
#[test]
fn a_relock_outside_the_row_lock_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::RelockOnNotice),
        ..LeaseModel::named("postgres").expect("a named configuration")
    };
    let failed = failed_always(&model);
    assert!(failed.contains(&names::RELOCK_GUARDED), "{failed:?}");
    let path = report::shortest(&model, names::RELOCK_GUARDED).expect("a counterexample");
    let actions = path.into_actions();
    assert!(
        matches!(actions.last(), Some(Action::Relock(_))),
        "{actions:?}"
    );
    let path = report::shortest(&model, names::ONE_LIVE_HOLDER).expect("a counterexample for [1]");
    let actions = path.into_actions();
    // The server ends the holder's session, a rival's probe finds the generation free and
    // it takes over, and the old holder locks its generation again: its lease, unexpired, has
    // its liveness lock, and the record is the rival's.
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::LoseLiveness(_, Cut::ServerFirst))),
        "{actions:?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Step(_, Io::Probe { .. }))),
        "{actions:?}"
    );
    assert!(
        actions.iter().any(|a| matches!(a, Action::Relock(_))),
        "{actions:?}"
    );
}

/// PostgreSQL, a renew (or refresh) that trusts the row alone once its holder saw the
/// liveness connection end, and commits without locking the generation again: the grant
/// leaves a holder told "granted" with no lock a rival's probe would see.
#[test]
fn a_renew_without_the_relock_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::RenewWithoutRelock),
        ..LeaseModel::named("postgres").expect("a named configuration")
    };
    let failed = failed_always(&model);
    assert!(failed.contains(&names::RENEW_RELOCKED), "{failed:?}");
    let path = report::shortest(&model, names::RENEW_RELOCKED).expect("a counterexample");
    let actions = path.into_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::LoseLiveness(..))),
        "{actions:?}"
    );
    // The renew's last step is its commit (statement grain: the `COMMIT` ends the call's
    // transaction; its reply may be lost and the commit found by the re-read).
    assert!(
        matches!(
            actions.last(),
            Some(
                Action::Step(_, Io::Commit(CommitStep::Point))
                    | Action::Fail(_, Io::Commit(CommitStep::Point))
            )
        ),
        "{actions:?}"
    );
}

/// The `always` properties the checker found violated in `model`.
fn failed_always(model: &LeaseModel) -> Vec<&'static str> {
    report::explore(model)
        .verdicts
        .iter()
        .filter(|v| !v.ok && v.expectation == "always")
        .map(|v| v.name)
        .collect()
}

/// The larger configuration CI runs (`check --config large`: the cleaner's changes to the
/// lock, the record and the temporary records, and the observer); run with
/// `cargo test --release -p flocklease-model -- --ignored`.
#[test]
#[ignore = "stress: the large configuration"]
fn large_configuration_holds() {
    assert_all_hold(&LeaseModel::named("large").expect("a named configuration"));
}

fn assert_all_hold(model: &LeaseModel) {
    assert_eq!(report::explore(model).failed(), Vec::<&str>::new());
}

/// PostgreSQL with two required standbys: a lost reply's commit counted once one standby
/// confirmed it is granted again after a failover to the other (the re-read's judgement,
/// `commit::verdict`, run with each number of required standbys: 0 and 2 beside the default
/// check, 1 in the named configurations).
#[test]
fn one_confirmation_of_two_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::OneStandbyEnough),
        standbys: 2,
        ..LeaseModel::named("failover").expect("a named configuration")
    };
    assert!(report::shortest(&model, names::NEVER_BACK).is_some());
}

/// The transition lock given back before the cleanup and the adoption: property [12] names
/// it at once (before it, the default configuration ran into millions of extra states without
/// a violation: the liveness locks keep the lease safe, the lock's promise broke unseen).
#[test]
fn a_lock_given_back_before_the_cleanup_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::UnlockBeforeCleanup),
        ..LeaseModel::default()
    };
    assert!(report::shortest(&model, names::LOCK_HELD).is_some());
}

/// The restore of a deleted liveness file as it was before publishing became atomic: created
/// at its final name, then locked. A failure of the lock leaves the live holder's generation
/// unlocked under its name, and the checker finds the rival's grant while the holder runs
/// (property [1]) and the probe that read a live holder as dead (property [9]).
#[test]
fn the_old_create_then_lock_restore_is_caught() {
    let model = LeaseModel {
        planted: Some(Planted::CreateThenLock),
        max_token: 1,
        host_crash: false,
        tamper: Tamper::DELETE_LIVE,
        observer: false,
        go_prober: false,
        ..LeaseModel::default()
    };
    let outcome = report::explore(&model);
    let failed: Vec<&str> = outcome
        .verdicts
        .iter()
        .filter(|v| !v.ok && v.expectation == "always")
        .map(|v| v.name)
        .collect();
    assert!(!failed.is_empty(), "the planted bug went unseen");
    let path = report::shortest(&model, names::PROBE_TRUTH).expect("a counterexample for [9]");
    let actions = path.into_actions();
    // The holder's renew fails while restoring its deleted file; the rival's probe reads the
    // unlocked file as dead.
    assert!(
        actions.contains(&Action::Tamper(Target::Live, Change::Delete)),
        "{actions:?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Fail(_, Io::Commit(CommitStep::EnsureLive)))),
        "{actions:?}"
    );
    assert!(
        matches!(actions.last(), Some(Action::Step(_, Io::Probe { .. }))),
        "{actions:?}"
    );
}

/// The default's bounds with only what a fenced-section counterexample needs: the processes,
/// the clock and the takeover of an expired lease (no host crash, fault or other actor).
fn fence_bug(planted: Planted, base: LeaseModel) -> LeaseModel {
    LeaseModel {
        planted: Some(planted),
        max_token: 1,
        faults: 0,
        host_crash: false,
        cleaner: 0,
        go_prober: false,
        observer: false,
        ..base
    }
}

/// The shortest counterexample for property [11] in `model`, which must fail it.
fn fence_counterexample(model: &LeaseModel) -> Vec<Action> {
    let failed = failed_always(model);
    assert!(failed.contains(&names::FENCED), "{failed:?}");
    report::shortest(model, names::FENCED)
        .expect("a counterexample for [11]")
        .into_actions()
}

/// Whether `actions` has a rival's takeover committed between the writer's check (its
/// section's first step) and the acceptance of its write (the last action: the write, or on
/// PostgreSQL the `COMMIT` of the transaction it was made in).
fn takeover_between_check_and_write(actions: &[Action]) -> bool {
    let Some(Action::FenceStep(writer, FenceIo::Write | FenceIo::Unlock)) = actions.last() else {
        return false;
    };
    let Some(start) = actions.iter().position(|a| *a == Action::Fence(*writer)) else {
        return false;
    };
    actions[start..]
        .iter()
        .any(|a| matches!(a, Action::Step(q, Io::Commit(CommitStep::Point)) if q != writer))
}

/// The control: a write made after the application's own check that its lease has not
/// expired (as `KeepAlive::is_lost()`), with no lock, is accepted after a successor's grant.
/// The checker finds it: the holder checks, the clock ticks past its expiry (a pause), a rival
/// takes over, the holder's write lands. Property [11] is not vacuous.
#[test]
fn an_unfenced_write_is_caught() {
    let model = fence_bug(Planted::UnfencedWrite, LeaseModel::default());
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
    assert!(actions.contains(&Action::Tick), "{actions:?}");
}

/// A fenced section that reads and checks the record before it takes the transition lock:
/// a rival's takeover commits between the check and the lock, and the write is accepted.
#[test]
fn a_fenced_check_before_the_lock_is_caught() {
    let model = fence_bug(Planted::FenceCheckBeforeLock, LeaseModel::default());
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
    // The section took its lock after the takeover, and wrote under it.
    let lock = actions
        .iter()
        .rposition(|a| matches!(a, Action::FenceStep(_, FenceIo::Lock)))
        .expect("the section's lock step");
    let rename = actions
        .iter()
        .rposition(|a| matches!(a, Action::Step(_, Io::Commit(CommitStep::Point))))
        .expect("the takeover's commit");
    assert!(rename < lock, "{actions:?}");
}

/// A fenced section that unlocks before the caller's write: the rival's takeover commits
/// between the unlock and the write.
#[test]
fn a_fenced_unlock_before_the_write_is_caught() {
    let model = fence_bug(Planted::FenceUnlockBeforeWrite, LeaseModel::default());
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
    let unlock = actions
        .iter()
        .position(|a| matches!(a, Action::FenceStep(_, FenceIo::Unlock)))
        .expect("the section's unlock");
    let rename = actions
        .iter()
        .rposition(|a| matches!(a, Action::Step(_, Io::Commit(CommitStep::Point))))
        .expect("the takeover's commit");
    assert!(unlock < rename, "{actions:?}");
}

/// PostgreSQL: the caller's statements run outside the fenced transaction (another
/// connection, after its `COMMIT`): the rival's `FOR UPDATE` no longer waits, its takeover
/// commits, and the write is accepted after it.
#[test]
fn a_postgres_write_outside_the_fenced_transaction_is_caught() {
    let pg = LeaseModel::named("postgres").expect("a named configuration");
    let model = fence_bug(
        Planted::FenceUnlockBeforeWrite,
        LeaseModel {
            liveness_losses: 0,
            ..pg
        },
    );
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
}

/// PostgreSQL: a plain `SELECT` checked before the row is locked `FOR SHARE`. A takeover of
/// the expired lease in between would be caught by the re-check of the expiry before
/// `COMMIT`; one after the holder's liveness session ended, before the expiry, is not: the
/// rival's probe finds the generation free, its takeover commits, and the `COMMIT` accepts
/// the write.
#[test]
fn a_postgres_check_before_the_share_lock_is_caught() {
    let pg = LeaseModel::named("postgres").expect("a named configuration");
    let model = fence_bug(Planted::FenceCheckBeforeLock, pg);
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::LoseLiveness(..))),
        "{actions:?}"
    );
    assert!(
        matches!(actions.last(), Some(Action::FenceStep(_, FenceIo::Unlock))),
        "{actions:?}"
    );
}

/// The flock fenced section's one window, as for a commit (README): a cleaner that deletes
/// `<stem>.lock` while a section holds it lets a rival lock a new file at the path and take
/// over an expired lease before the section's write. The checker shows it; named
/// configurations whose cleaner touches the lock (`large`) run without fenced sections.
#[test]
fn a_deleted_lock_during_a_fenced_section_is_the_known_window() {
    let model = LeaseModel {
        cleaner: 1,
        tamper: Tamper {
            delete_live: false,
            replace_live: false,
            lock: true,
            record: false,
            temp: false,
            moves: false,
        },
        planted: None,
        ..fence_bug(Planted::UnfencedWrite, LeaseModel::default())
    };
    let actions = fence_counterexample(&model);
    assert!(takeover_between_check_and_write(&actions), "{actions:?}");
    assert!(
        actions.contains(&Action::Tamper(Target::Lock, Change::Delete)),
        "{actions:?}"
    );
}

/// The cleaner that moves files aside and back (`--config moves`: 48 million states, 14 min,
/// not run by CI; `.ci/run` checks it without faults and with one token; here also without
/// the host crash: 647 thousand states): a restore that reused the record's tag lets the
/// holder's own file, moved aside and put back after the renew, read dead beside the live
/// holder (issue 33.1).
#[test]
fn a_restore_that_keeps_the_tag_is_caught_by_the_moves() {
    let base = LeaseModel {
        host_crash: false,
        faults: 0,
        max_token: 1,
        ..LeaseModel::named("moves").expect("a named configuration")
    };
    assert_all_hold(&base);
    let planted = LeaseModel {
        planted: Some(Planted::RestoreKeepsTag),
        ..base
    };
    let failed = failed_always(&planted);
    assert!(!failed.is_empty(), "the planted restore passed");
}

/// The options printed under a side run's counterexample (`ALONGSIDE_OPTIONS`) give the very
/// configuration that side run checked: run as `check` options, they explore as many states
/// as the pinned counts above (issue 50: the explorer opened without them showed another
/// path).
#[test]
fn the_printed_options_of_the_side_runs_give_their_configurations() {
    for (options, states) in flocklease_model::ALONGSIDE_OPTIONS
        .iter()
        .zip([648_566, 437_144])
    {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flocklease-model"))
            .arg("check")
            .args(options.split(' '))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{options}: {text}");
        assert!(
            text.contains(&format!("explored {states} unique states")),
            "{options}: {text}"
        );
    }
}

/// Issue 50: one planted bug printed several counterexamples, each with the 30-line legend,
/// and none said in words what went wrong. Across every `check_with` of a process the legend
/// comes once, and each counterexample has one sentence naming who acted, what came of it,
/// and the property broken.
#[test]
fn each_counterexample_says_its_violation_in_words_under_one_legend() {
    let mut out = vec![];
    for planted in [Planted::UnlockBeforeCleanup, Planted::CreateThenLock] {
        let model = LeaseModel {
            planted: Some(planted),
            ..LeaseModel::default()
        };
        assert!(!report::check_with(&model, usize::MAX, "", &mut out).unwrap());
    }
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("how to read a state:").count(), 1, "{text}");
    let blocks: Vec<&str> = text
        .split("shortest counterexample for \"")
        .skip(1)
        .collect();
    assert!(blocks.len() >= 2, "{text}");
    for block in blocks {
        let property = block.split('"').next().unwrap();
        let words = block
            .lines()
            .find_map(|l| l.strip_prefix("  in words: "))
            .unwrap_or_else(|| panic!("no sentence in words for {property}: {block}"));
        assert!(words.contains("p0") || words.contains("p1"), "{words}");
        assert!(words.contains("the record"), "{words}");
        assert!(
            words.ends_with(&format!("that breaks \"{property}\"")),
            "{words}"
        );
    }
}

/// The explorer shows a model's SVG beside every step: the lease model's is the legend.
#[test]
fn the_explorer_page_carries_the_legend() {
    let model = LeaseModel::default();
    let none: [&Action; 0] = [];
    let path = stateright::Path::from_actions(&model, model.init_states()[0].clone(), none);
    let svg = model.as_svg(path.unwrap()).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("how to read a state:"),
        "{svg}"
    );
    assert!(svg.contains("&lt;stem&gt;.lock"), "{svg}");
}
