//! Property test: random sequences of acquire / renew / release (current, stale and foreign
//! leases) / instance crash / clock advance, run on `FlockLease` (a temporary directory),
//! `MemLease` and the model's reference interpreter. Every step's outcome, token and expiry,
//! and the record after it, must agree across all three.

use std::sync::Arc;
use std::time::Duration;

use flocklease::machine::{Event, Outcome};
use flocklease::{
    Durability, Error, FlockLease, Grant, Lease, ManualClock, MemLease, MemStore, Owner, Record,
    SessionId, record,
};
use flocklease_model::{LeaseModel, State, at, session};
use proptest::prelude::*;

const INSTANCES: usize = 3;
const OWNERS: [&str; 2] = ["a", "b"];

#[derive(Clone, Debug)]
enum Op {
    Acquire { inst: usize, owner: usize },
    Renew { inst: usize, lease: usize },
    Release { inst: usize, lease: usize },
    Crash { inst: usize },
    Tick { secs: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..INSTANCES, 0..OWNERS.len()).prop_map(|(inst, owner)| Op::Acquire { inst, owner }),
        3 => (0..INSTANCES, any::<prop::sample::Index>()).prop_map(|(inst, l)| Op::Renew { inst, lease: l.index(usize::MAX) }),
        2 => (0..INSTANCES, any::<prop::sample::Index>()).prop_map(|(inst, l)| Op::Release { inst, lease: l.index(usize::MAX) }),
        1 => (0..INSTANCES).prop_map(|inst| Op::Crash { inst }),
        2 => (1u8..=3).prop_map(|secs| Op::Tick { secs }),
    ]
}

/// What a step reported, comparable across backends.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Granted(u64, i128),
    Held,
    Released,
    Failed(String),
}

fn seen_grant(r: Result<Grant, Error>) -> Seen {
    match r {
        Ok(Grant::Granted(l)) => Seen::Granted(l.token, l.expiry.unix_nanos()),
        Ok(Grant::Held) => Seen::Held,
        Err(e) => Seen::Failed(kind(&e)),
    }
}

fn seen_outcome(r: Result<Outcome, Error>) -> Seen {
    match r {
        Ok(Outcome::Granted { token, expiry }) => Seen::Granted(token, expiry.unix_nanos()),
        Ok(Outcome::Held) => Seen::Held,
        Ok(Outcome::Released) => Seen::Released,
        Err(e) => Seen::Failed(kind(&e)),
    }
}

fn kind(e: &Error) -> String {
    format!("{e:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

struct Backends {
    model: LeaseModel,
    state: State,
    clock: ManualClock,
    dir: tempfile::TempDir,
    flock: Vec<FlockLease>,
    store: MemStore,
    mem: Vec<MemLease>,
}

impl Backends {
    fn new() -> Backends {
        let model = LeaseModel {
            procs: INSTANCES,
            ttl_ticks: 5,
            ..LeaseModel::default()
        };
        let clock = ManualClock::new(at(0));
        let dir = tempfile::tempdir().expect("tempdir");
        let store = MemStore::new();
        let mut b = Backends {
            state: model.initial(),
            model,
            clock,
            dir,
            flock: vec![],
            store,
            mem: vec![],
        };
        for _ in 0..INSTANCES {
            b.flock.push(b.new_flock());
            b.mem.push(b.new_mem());
        }
        b
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.model.ttl_ticks))
    }

    fn new_flock(&self) -> FlockLease {
        FlockLease::builder(self.dir.path())
            .clock(Arc::new(self.clock.clone()))
            .ttl(self.ttl())
            .durability(Durability::NoSync)
            .open()
            .expect("open")
    }

    fn new_mem(&self) -> MemLease {
        MemLease::new(self.store.clone(), Arc::new(self.clock.clone()), self.ttl())
    }

    fn file_record(&self, id: &SessionId) -> Option<Record> {
        let path = self.dir.path().join(format!("{}.lease.json", id.stem()));
        std::fs::read(path)
            .ok()
            .map(|b| record::decode(&b).expect("valid record"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn adapters_agree_with_the_reference(ops in proptest::collection::vec(op(), 1..40)) {
        let mut b = Backends::new();
        let id = session();
        // Every lease any instance was granted, so renews and releases can replay stale and
        // foreign copies.
        let mut leases: Vec<Lease> = vec![];
        for (i, op) in ops.iter().enumerate() {
            let (reference, flock, mem) = match op {
                Op::Acquire { inst, owner } => {
                    let who = Owner::new(OWNERS[*owner]).expect("owner");
                    let r = b.model.apply(&mut b.state, *inst, Event::Acquire { owner: who.clone() });
                    let f = b.flock[*inst].acquire(&id, &who);
                    let m = b.mem[*inst].acquire(&id, &who);
                    if let Ok(Grant::Granted(l)) = &f {
                        leases.push(l.clone());
                    }
                    (seen_outcome(r), seen_grant(f), seen_grant(m))
                }
                Op::Renew { inst, lease } | Op::Release { inst, lease } => {
                    let Some(l) = leases.get(lease % leases.len().max(1)).cloned() else { continue };
                    let renew = matches!(op, Op::Renew { .. });
                    let event = if renew {
                        Event::Renew { owner: l.owner.clone(), token: l.token }
                    } else {
                        Event::Release { owner: l.owner.clone(), token: l.token }
                    };
                    let r = seen_outcome(b.model.apply(&mut b.state, *inst, event));
                    if renew {
                        (r, seen_grant(b.flock[*inst].renew(&l)), seen_grant(b.mem[*inst].renew(&l)))
                    } else {
                        let done = |x: Result<(), Error>| match x {
                            Ok(()) => Seen::Released,
                            Err(e) => Seen::Failed(kind(&e)),
                        };
                        (r, done(b.flock[*inst].release(&l)), done(b.mem[*inst].release(&l)))
                    }
                }
                Op::Crash { inst } => {
                    b.model.crash(&mut b.state, *inst);
                    b.flock[*inst] = b.new_flock();
                    b.mem[*inst] = b.new_mem();
                    continue;
                }
                Op::Tick { secs } => {
                    b.state.now += secs;
                    b.clock.set(at(b.state.now));
                    continue;
                }
            };
            prop_assert_eq!(&flock, &reference, "step {} {:?}: flock vs reference", i, op);
            prop_assert_eq!(&mem, &reference, "step {} {:?}: memory vs reference", i, op);
            prop_assert_eq!(b.file_record(&id), b.state.record.clone(), "step {}: record on disk", i);
            prop_assert_eq!(b.store.record(&id), b.state.record.clone(), "step {}: record in memory", i);
        }
    }
}
