//! The properties (PROTOCOL §10): `always` properties over every state, the call properties
//! judged when a call ends, and the `sometimes` scenarios.
//!
//! Every judgement here uses the model's own reading of the state (ticks, tokens, who holds
//! which lock), never the machine's helpers: a bug planted in the machine cannot bend the
//! property that is to catch it.

use flocklease::driver::Io;
use flocklease::machine::Outcome;
use flocklease::{Error, Record};
use stateright::Property;

use crate::{Backend, Call, Kind, LeaseModel, LeaseView, Said, Scenario, State, ticks};

/// Names of the `always` properties (PROTOCOL §10 numbers in brackets: §10.n is \[n\]).
pub mod names {
    /// PROTOCOL §10.1 (flock).
    pub const ONE_HOLDER: &str = "[1] at most one unexpired holder, the record's";
    /// PROTOCOL §10.1 (PostgreSQL form).
    pub const ONE_LIVE_HOLDER: &str =
        "[1] at most one unexpired holder with its liveness intact, the record's";
    /// PostgreSQL (PROTOCOL §8.2: every overlap is "told"): a process whose generation's
    /// liveness lock is gone — its local one, or one its call committed and has yet to adopt —
    /// has the loss coming to it (it sees its connection end).
    pub const HOLDER_TOLD: &str = "[1] a holder whose generation's liveness lock is gone is told";
    /// PROTOCOL §10.2, across a host crash.
    pub const NEVER_BACK: &str = "[2] tokens never go back, even after a host crash or a failover";
    /// PROTOCOL §10.2.
    pub const INCREASE: &str = "[2] every new generation gets a greater token";
    /// PROTOCOL §10.3.
    pub const STALE_RELEASE: &str = "[3] a stale release changes nothing";
    /// PROTOCOL §10.4.
    pub const RENEW_CURRENT: &str = "[4] renew only for the current generation";
    /// PROTOCOL §10.5.
    pub const RENEW_SUCCEEDS: &str = "[5] renew by the current holder succeeds";
    /// PROTOCOL §10.6.
    pub const CRASHED_REPLACED: &str = "[6] a crashed holder is replaced at once";
    /// PROTOCOL §10.7.
    pub const NO_FAILURE_AFTER_COMMIT: &str = "[7] no failure after commit";
    /// PROTOCOL §10.7.
    pub const NO_SUCCESS_WITHOUT_COMMIT: &str = "[7] no success without commit";
    /// PROTOCOL §10.7 (and "held" is never a failure): with nothing injected, nothing fails.
    pub const NO_FAILURE_WITHOUT_FAULT: &str = "[7] no failure without a fault";
    /// PROTOCOL §10.8.
    pub const EXPIRED_TAKEN: &str = "[8] an expired record is never answered held";
    /// PostgreSQL: a generation is locked again (after its liveness connection ended) only by
    /// its holder's transition, under the row lock, while the row names the generation.
    pub const RELOCK_GUARDED: &str =
        "[pg] a generation is locked again only under the row lock, while the row names it";
    /// PostgreSQL: a renew (or refresh) by a holder that had seen its liveness connection end
    /// is granted only with the generation locked again by this holder.
    pub const RENEW_RELOCKED: &str =
        "[pg] a renew after the holder saw its liveness end is granted only re-locked";
    /// PROTOCOL §10.9 (flock): judged at every probe, against who keeps the generation.
    pub const PROBE_TRUTH: &str =
        "[9] a probe never makes a dead holder look alive, nor a live one dead";
    /// PROTOCOL §10.11: judged when the resource accepts a write, against the last new generation
    /// committed.
    pub const FENCED: &str = "[11] no fenced write is accepted after a successor's grant";
    /// PROTOCOL §10.10: judged as a call returns a grant, after the front's final expiry check
    /// (`machine::FinalCheck`), against the model's clock.
    pub const RETURNED_EXPIRED: &str = "[10] no call returns a lease already expired";
    /// PROTOCOL §4 (flock): a transition holds its `<stem>.lock` from its first read until its
    /// end — the commit, its syncs, the cleanup and the adoption included (the model's own
    /// reading: the lock the process holds, against the step its run is at).
    pub const LOCK_HELD: &str =
        "[12] a transition holds its lock from its first read until its end";
}

use names::*;

/// The properties judged when a call ends (or, for the PostgreSQL re-lock, when it is
/// done), in the order of [`State::violations`]' bits.
pub const CALL_PROPERTIES: [&str; 14] = [
    INCREASE,
    STALE_RELEASE,
    RENEW_CURRENT,
    RENEW_SUCCEEDS,
    CRASHED_REPLACED,
    NO_FAILURE_AFTER_COMMIT,
    NO_SUCCESS_WITHOUT_COMMIT,
    NO_FAILURE_WITHOUT_FAULT,
    EXPIRED_TAKEN,
    RELOCK_GUARDED,
    PROBE_TRUTH,
    RENEW_RELOCKED,
    FENCED,
    RETURNED_EXPIRED,
];

/// The bit of call property `name` in [`State::violations`].
pub fn bit(name: &str) -> u16 {
    let i = CALL_PROPERTIES
        .iter()
        .position(|n| *n == name)
        .expect("a call property");
    1 << i
}

/// The properties of `model`.
pub fn properties(model: &LeaseModel) -> Vec<Property<LeaseModel>> {
    let mut v = vec![];
    if model.backend == Backend::Flock {
        v.push(Property::always(ONE_HOLDER, |m: &LeaseModel, s: &State| {
            one_holder(m, s, false)
        }));
    } else {
        v.push(Property::always(
            ONE_LIVE_HOLDER,
            |m: &LeaseModel, s: &State| one_holder(m, s, true),
        ));
        v.push(Property::always(HOLDER_TOLD, |_, s: &State| {
            holders_told(s)
        }));
    }
    if model.backend == Backend::Flock {
        v.push(Property::always(LOCK_HELD, |_, s: &State| lock_held(s)));
    }
    v.push(Property::always(NEVER_BACK, |m: &LeaseModel, s: &State| {
        let durable = s.durable.as_ref().map_or(0, |r| r.token);
        let visible = s.record.as_ref().map_or(0, |r| r.token);
        // With two required standbys, the failover may promote either: both must have it.
        let second = s.durable2.0.as_ref().map_or(0, |r| r.token);
        let second_ok = m.standbys < 2 || (second >= s.max_granted && visible >= second);
        durable >= s.max_granted && visible >= durable && second_ok
    }));
    // One `always` property per call property, so each counterexample names what broke.
    macro_rules! call {
        ($i:literal) => {
            Property::always(CALL_PROPERTIES[$i], |_, s: &State| {
                s.violations & (1 << $i) == 0
            })
        };
    }
    v.extend([
        call!(0),
        call!(1),
        call!(2),
        call!(3),
        call!(4),
        call!(5),
        call!(6),
        call!(7),
        call!(8),
        call!(13),
    ]);
    if model.backend == Backend::Postgres {
        v.extend([call!(9), call!(11)]);
    } else {
        v.push(call!(10));
    }
    if model.fenced {
        v.push(call!(12));
    }
    v.extend([
        Property::sometimes("takeover after a crash", |_, s: &State| {
            s.scenario == Some(Scenario::TakeoverAfterCrash)
        }),
        Property::sometimes("takeover of an expired, running holder", |_, s: &State| {
            s.scenario == Some(Scenario::TakeoverOfExpiredRunningHolder)
        }),
        Property::sometimes("renew after suspension past the TTL", |_, s: &State| {
            s.scenario == Some(Scenario::RenewAfterSuspension)
        }),
        Property::sometimes("stale release after a successor exists", |_, s: &State| {
            s.scenario == Some(Scenario::StaleReleaseAfterSuccessor)
        }),
        Property::sometimes(
            "a crash between commit and the end of the call",
            |_, s: &State| s.scenario == Some(Scenario::CrashAfterCommit),
        ),
        Property::sometimes("grant after a host crash", |m: &LeaseModel, s: &State| {
            !m.host_crash || s.scenario == Some(Scenario::GrantAfterHostCrash)
        }),
        Property::sometimes("a failed step", |m: &LeaseModel, s: &State| {
            m.faults == 0 || s.scenario == Some(Scenario::FailedStep)
        }),
        Property::sometimes(
            "held although the holder's liveness file vanished",
            |m: &LeaseModel, s: &State| {
                m.cleaner == 0
                    || !m.tamper.delete_live
                    || s.scenario == Some(Scenario::HeldDespiteMissingFile)
            },
        ),
        Property::sometimes(
            "held although another file stood at the holder's liveness file's name",
            |m: &LeaseModel, s: &State| {
                let plants = m.tamper.replace_live || (m.go_prober && m.tamper.delete_live);
                m.cleaner == 0 || !plants || s.scenario == Some(Scenario::HeldDespiteReplacedFile)
            },
        ),
        Property::sometimes(
            "a transition whose lock was replaced commits nothing",
            |m: &LeaseModel, s: &State| {
                m.cleaner == 0
                    || !m.tamper.lock
                    || s.scenario == Some(Scenario::LockReplacedRefused)
            },
        ),
    ]);
    v.push(Property::sometimes(
        "a grant expired before its call returned, renewed first",
        |m: &LeaseModel, s: &State| {
            m.max_time < m.ttl_ticks || s.scenario == Some(Scenario::ReturnedAfterRenew)
        },
    ));
    if model.fenced {
        v.push(Property::sometimes(
            "a fenced write accepted",
            |_, s: &State| s.scenario == Some(Scenario::FencedWrite),
        ));
        v.push(Property::sometimes(
            "a fenced section refused after a successor's grant",
            |_, s: &State| s.scenario == Some(Scenario::FenceRefusedAfterSuccessor),
        ));
    }
    if model.fenced && model.backend == Backend::Postgres {
        v.push(Property::sometimes(
            "a fenced transaction rolled back by its expiry re-check",
            |_, s: &State| s.scenario == Some(Scenario::FenceRecheckRefused),
        ));
    }
    if model.backend == Backend::Postgres {
        v.push(Property::sometimes(
            "takeover while the old holder runs with its liveness lost",
            |m: &LeaseModel, s: &State| {
                m.liveness_losses == 0 || s.scenario == Some(Scenario::TakeoverAfterLivenessLoss)
            },
        ));
        v.push(Property::sometimes(
            "a renew granted after locking its generation again",
            |m: &LeaseModel, s: &State| {
                m.liveness_losses == 0 || s.scenario == Some(Scenario::RenewRelocked)
            },
        ));
        v.push(Property::sometimes(
            "a new generation's liveness ended before its call adopted it",
            |m: &LeaseModel, s: &State| {
                m.liveness_losses == 0 || s.scenario == Some(Scenario::LostBeforeAdopt)
            },
        ));
        v.push(Property::sometimes(
            "a re-lock refused while the old session still holds the generation",
            |m: &LeaseModel, s: &State| {
                m.liveness_losses == 0 || s.scenario == Some(Scenario::RelockBusy)
            },
        ));
    }
    if model.failover && model.backend == Backend::Postgres {
        v.push(Property::sometimes(
            "grant after a failover to the standby",
            |_, s: &State| s.scenario == Some(Scenario::GrantAfterFailover),
        ));
    }
    v
}

/// Every process whose call has read the record (its run is past its lock and its read, and
/// not over) holds the transition lock it took.
fn lock_held(s: &State) -> bool {
    s.procs.iter().all(|p| {
        p.call.as_ref().is_none_or(|c| {
            matches!(c.run.peek(), None | Some(Io::Lock | Io::Begin)) || p.stable.is_some()
        })
    })
}

/// PostgreSQL: every process whose generation's liveness lock is not held by it any more
/// (the one it keeps: a new one its call committed, or else its local one) has that loss
/// recorded, to be noticed. (A local generation a committed call supersedes is closed by that
/// call; nobody keeps it.)
fn holders_told(s: &State) -> bool {
    (0..s.procs.len()).all(|p| {
        LeaseModel::liveness_token(s, p).is_none_or(|t| {
            let held = s
                .live
                .get(&t)
                .is_some_and(|f| f.holder == Some(crate::Locker::Proc(p)));
            held || s.procs[p].loss.is_some_and(|l| l.token == t)
        })
    })
}

/// At most one process believes it holds an unexpired lease (with `live_only`, counting only
/// those whose liveness lock is intact), and it is the record's generation.
fn one_holder(m: &LeaseModel, s: &State, live_only: bool) -> bool {
    let holders: Vec<(usize, LeaseView)> = s
        .procs
        .iter()
        .enumerate()
        // A process that called release has given the lease up.
        .filter(|(_, proc)| proc.call.as_ref().is_none_or(|c| c.kind != Kind::Release))
        .filter_map(|(p, proc)| proc.lease.map(|l| (p, l)))
        .filter(|(_, l)| s.now < l.expiry)
        .filter(|(p, l)| {
            !live_only
                || s.live
                    .get(&l.token)
                    .is_some_and(|f| f.holder == Some(crate::Locker::Proc(*p)))
        })
        .collect();
    match holders.as_slice() {
        [] => true,
        [(p, l)] => s
            .record
            .as_ref()
            .is_some_and(|r| r.owner == m.owner(*p).as_str() && r.token == l.token),
        _ => false,
    }
}

/// Judges the call of process `p` that just ended with `result`, and updates what the
/// process believes. `fired`: the last step failed by injection.
pub(crate) fn observe(
    m: &LeaseModel,
    s: &mut State,
    p: usize,
    call: &Call,
    fired: bool,
    result: &Result<Outcome, Error>,
) {
    let me = m.owner(p);
    let kind = call.kind;
    let view = call.view;
    let g = &call.ghost;
    let seen = g.seen.as_ref();
    let seen_record = seen.and_then(|x| x.record.as_ref());
    let names = |r: Option<&Record>, token: u64| {
        r.is_some_and(|r| r.owner == me.as_str() && r.token == token)
    };
    let held_here = |token: u64| {
        seen.and_then(|x| x.local.as_ref())
            .is_some_and(|l| l.token == token && l.owner == me)
    };
    let mut flags: Vec<&'static str> = vec![];
    let said;
    match result {
        Err(_) => {
            said = Said::Failed;
            // A process whose release failed stops using the lease; it may retry the release
            // (a replay of the stale lease).
            if kind == Kind::Release {
                let proc = &mut s.procs[p];
                proc.stale = proc.lease.take();
            }
            // The cleaner's doing (a planted record or lock, a deleted temporary file, a
            // transition beside this one on a replaced lock) is a failure without a fault; so
            // is a re-lock refused while the server has not yet ended the old session.
            if !fired && !s.tampered && !g.relock_busy && !g.severed {
                flags.push(NO_FAILURE_WITHOUT_FAULT);
            }
            // The directory sync's failure is the one error allowed after the rename: the
            // record is visible, maybe not durable, and names a generation left dead. (Its
            // record may be durable all the same: another transition's directory fsync, on a
            // replaced lock, synced it.)
            // PostgreSQL: so is a commit's lost reply that the re-read could not show
            // confirmed by the standby (`CommitUnknown`).
            let sync_failed = matches!(
                result,
                Err(Error::Io {
                    op: "fsync" | "commit",
                    ..
                })
            );
            if g.renamed && !sync_failed {
                flags.push(NO_FAILURE_AFTER_COMMIT);
            }
            s.scenario = Some(Scenario::FailedStep);
            if g.relock_busy {
                s.scenario = Some(Scenario::RelockBusy);
            }
        }
        Ok(Outcome::Granted { token, expiry }) => {
            let token = *token;
            said = Said::Granted(token, ticks(*expiry));
            // 7: success means the record now says so.
            let expected = Record {
                owner: me.as_str().to_owned(),
                token,
                expiry: *expiry,
            };
            if g.committed.as_ref() != Some(&expected) || !g.renamed {
                flags.push(NO_SUCCESS_WITHOUT_COMMIT);
            }
            if matches!(kind, Kind::Renew | Kind::RenewStale) {
                // 4: renew succeeds only for the record's current generation.
                if !names(seen_record, token) {
                    flags.push(RENEW_CURRENT);
                }
                if view.is_some_and(|v| seen.is_some_and(|x| v.expiry <= x.now)) {
                    s.scenario = Some(Scenario::RenewAfterSuspension);
                }
            }
            if held_here(token) && g.knew_lost {
                // PostgreSQL: the holder had seen its liveness connection end; the grant
                // stands only with the generation locked by it again (unless that fresh
                // connection ended too, since: it is told again).
                let relocked = s
                    .live
                    .get(&token)
                    .is_some_and(|f| f.holder == Some(crate::Locker::Proc(p)));
                if !relocked && !g.lost_again {
                    flags.push(RENEW_RELOCKED);
                }
                if g.relocked {
                    s.scenario = Some(Scenario::RenewRelocked);
                }
            }
            // A grant of a generation the process did not already hold is a new generation,
            // whatever its token.
            if !held_here(token) {
                // 2: it raises the token above every one reported before — judged here for
                // a lease still unexpired when reported (a grant reported already expired,
                // after a successor's, is PROTOCOL §10.10's matter), and at the commit for all.
                // PostgreSQL: the `COMMIT` releases the row lock before the grant is reported,
                // so a successor's grant, with a greater token, can come first when this
                // generation's liveness was lost in between (its holder is told; PROTOCOL
                // §10.2). The same token reported twice is never exempt.
                let lost = m.backend == crate::Backend::Postgres
                    && !s
                        .live
                        .get(&token)
                        .is_some_and(|f| f.holder == Some(crate::Locker::Proc(p)));
                let late = lost && token < s.max_granted;
                if token <= s.max_granted && s.now < ticks(*expiry) && !late {
                    flags.push(INCREASE);
                }
                let now = seen.map_or(0, |x| x.now);
                let live_rec = seen_record.filter(|r| !r.is_tombstone());
                let unexpired = live_rec.is_some_and(|r| now < ticks(r.expiry));
                let holder = seen.and_then(|x| x.holder);
                if unexpired && g.probed_dead {
                    s.scenario = Some(Scenario::TakeoverAfterCrash);
                    let old = live_rec.map(|r| r.token);
                    let lost_runner = s
                        .procs
                        .iter()
                        .enumerate()
                        .any(|(q, pr)| q != p && pr.loss.is_some_and(|l| Some(l.token) == old));
                    if lost_runner {
                        s.scenario = Some(Scenario::TakeoverAfterLivenessLoss);
                    }
                } else if !unexpired && live_rec.is_some() && holder.is_some_and(|q| q != p) {
                    s.scenario = Some(Scenario::TakeoverOfExpiredRunningHolder);
                }
                if !s.host_crash_left && m.host_crash {
                    s.scenario = Some(Scenario::GrantAfterHostCrash);
                }
                if !s.failover_left && m.failover && m.backend == Backend::Postgres {
                    s.scenario = Some(Scenario::GrantAfterFailover);
                }
            }
            s.max_granted = s.max_granted.max(token);
            let v = LeaseView {
                token,
                expiry: ticks(*expiry),
            };
            let proc = &mut s.procs[p];
            if let Some(old) = proc.lease.filter(|l| l.token != token) {
                proc.stale = Some(old);
            }
            // A kept copy of this very generation is current again, not stale.
            if proc.stale.is_some_and(|l| l.token == token) {
                proc.stale = None;
            }
            proc.lease = Some(v);
        }
        Ok(Outcome::Held) => {
            said = Said::Held;
            if matches!(kind, Kind::Renew | Kind::RenewStale) {
                // 5: renew by the current holder with the record unchanged always succeeds.
                if let Some(v) = view
                    && held_here(v.token)
                    && names(seen_record, v.token)
                {
                    flags.push(RENEW_SUCCEEDS);
                }
                // The lease is lost: keep it only as a stale one to replay.
                let proc = &mut s.procs[p];
                if kind == Kind::Renew {
                    proc.stale = proc.lease.take();
                }
            }
            if kind == Kind::Acquire {
                let live_rec = seen_record.filter(|r| !r.is_tombstone());
                if live_rec.is_some_and(|r| !s.live.contains_key(&r.token)) {
                    s.scenario = Some(Scenario::HeldDespiteMissingFile);
                }
                if g.probed_planted {
                    s.scenario = Some(Scenario::HeldDespiteReplacedFile);
                }
                // 6: an acquire after the recorded holder crashed succeeds at once.
                if g.probed_dead {
                    flags.push(CRASHED_REPLACED);
                }
                // 8: expiry is as good as death: `now >= expiry` is expired.
                let now = seen.map_or(0, |x| x.now);
                if live_rec.is_some_and(|r| now >= ticks(r.expiry)) {
                    flags.push(EXPIRED_TAKEN);
                }
            }
        }
        Ok(Outcome::Released) => {
            said = Said::Released;
            let current = view.is_some_and(|v| held_here(v.token) && names(seen_record, v.token));
            if !current {
                // 3: a stale or foreign release changes neither the record nor anyone
                // else's lock.
                if g.renamed || g.touched_other {
                    flags.push(STALE_RELEASE);
                }
                if seen_record.is_some_and(|r| !r.is_tombstone())
                    && view.is_some_and(|v| !names(seen_record, v.token))
                {
                    s.scenario = Some(Scenario::StaleReleaseAfterSuccessor);
                }
            } else if !g.renamed || !g.committed.as_ref().is_some_and(Record::is_tombstone) {
                // 7: a successful release of the current generation committed a tombstone.
                flags.push(NO_SUCCESS_WITHOUT_COMMIT);
            }
            let proc = &mut s.procs[p];
            match kind {
                Kind::Release => proc.stale = proc.lease.take(),
                Kind::ReleaseStale => proc.stale = None,
                _ => {}
            }
        }
    }
    s.procs[p].last = Some((kind, said));
    for name in flags {
        s.violations |= bit(name);
    }
}
