//! Property test: random sequences of acquire / renew / release (current, stale and foreign
//! leases) / instance crash / clock advance, run on `PgLease` against a real server and on
//! `MemLease` (the reference adapter of the same machine), with one manual clock. Every
//! step's answer and the record after it must agree; and the model's properties are checked
//! on the server's state directly: tokens never go back, at most one generation's liveness
//! generation is locked at most once and none ahead of the row, a grant is always the row's generation.

use crate::pg;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flocklease::conformance::START;
use flocklease::pg::PgLease;
use flocklease::{Error, Grant, Lease, ManualClock, MemLease, MemStore, Owner, SessionId};
use proptest::prelude::*;

const INSTANCES: usize = 3;
const OWNERS: [&str; 2] = ["a", "b"];
const TTL: Duration = Duration::from_secs(5);

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

#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Granted(u64, i128),
    Held,
    Released,
    Failed(String),
}

fn seen(r: Result<Grant, Error>) -> Seen {
    match r {
        Ok(Grant::Granted(l)) => Seen::Granted(l.token, l.expiry.unix_nanos()),
        Ok(Grant::Held) => Seen::Held,
        Err(e) => Seen::Failed(e.to_string()),
    }
}

fn released(r: Result<(), Error>) -> Seen {
    match r {
        Ok(()) => Seen::Released,
        Err(e) => Seen::Failed(e.to_string()),
    }
}

struct Setup {
    url: String,
    admin: pg::Admin,
}

fn setup() -> Option<&'static Setup> {
    static SETUP: std::sync::OnceLock<Option<Setup>> = std::sync::OnceLock::new();
    SETUP
        .get_or_init(|| {
            let server = pg::server()?;
            let db = server.fresh_db();
            let url = server.url(&db);
            drop(PgLease::connect(&url).unwrap());
            Some(Setup {
                admin: server.admin(&db),
                url,
            })
        })
        .as_ref()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn pg_agrees_with_memory_and_keeps_the_models_properties(ops in proptest::collection::vec(op(), 1..30)) {
        let Some(s) = setup() else { return Ok(()) };
        static CASE: AtomicUsize = AtomicUsize::new(0);
        let name = format!("case{}", CASE.fetch_add(1, Ordering::Relaxed));
        let id = SessionId::new(name.clone()).unwrap();
        let clock = ManualClock::new(START);
        let store = MemStore::new();
        let pg = || PgLease::builder(&s.url).clock(Arc::new(clock.clone())).ttl(TTL).connect().unwrap();
        let mem = || MemLease::new(store.clone(), Arc::new(clock.clone()), TTL);
        let mut pgs: Vec<PgLease> = (0..INSTANCES).map(|_| pg()).collect();
        let mut mems: Vec<MemLease> = (0..INSTANCES).map(|_| mem()).collect();
        let mut leases: Vec<Lease> = vec![];
        let mut top = 0u64;
        for (i, op) in ops.iter().enumerate() {
            let (p, m) = match op {
                Op::Acquire { inst, owner } => {
                    let who = Owner::new(OWNERS[*owner]).unwrap();
                    let p = pgs[*inst].acquire(&id, &who);
                    let m = mems[*inst].acquire(&id, &who);
                    if let Ok(Grant::Granted(l)) = &p {
                        leases.push(l.clone());
                    }
                    (seen(p), seen(m))
                }
                Op::Renew { inst, lease } => {
                    let Some(l) = leases.get(lease % leases.len().max(1)).cloned() else { continue };
                    (seen(pgs[*inst].renew(&l)), seen(mems[*inst].renew(&l)))
                }
                Op::Release { inst, lease } => {
                    let Some(l) = leases.get(lease % leases.len().max(1)).cloned() else { continue };
                    (released(pgs[*inst].release(&l)), released(mems[*inst].release(&l)))
                }
                Op::Crash { inst } => {
                    pgs[*inst] = pg();
                    mems[*inst] = mem();
                    continue;
                }
                Op::Tick { secs } => {
                    clock.advance(Duration::from_secs(u64::from(*secs)));
                    continue;
                }
            };
            prop_assert_eq!(&p, &m, "step {} {:?}: postgres vs memory", i, op);
            let row = s.admin.row(&name).filter(|(o, t, _)| !(o.is_empty() && *t == 0));
            let mem_rec = store.record(&id);
            prop_assert_eq!(
                row.as_ref().map(|(o, t, e)| (o.clone(), *t as u64, i128::from(*e) * 1000)),
                mem_rec.map(|r| (r.owner, r.token, r.expiry.unix_nanos())),
                "step {}: row vs memory record", i
            );
            // Tokens never go back; a grant is the row's generation.
            let token = row.as_ref().map_or(0, |r| r.1 as u64);
            prop_assert!(token >= top, "step {}: token went back", i);
            top = token;
            if let Seen::Granted(t, _) = p {
                prop_assert_eq!(t, token, "step {}: granted a generation the row does not name", i);
            }
            // Superseded generations may keep their lock until their instance's next call (as
            // a flock does), but only the row's generation is locked at most once, and no
            // lock names a generation the row has not reached.
            let key = s.admin.key(&name);
            let locks = s.admin.query(
                "SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND classid::int8 = $1 AND database = (SELECT oid FROM pg_database \
                 WHERE datname = current_database())",
                &[&i64::from(key)],
            );
            for l in &locks {
                prop_assert!(l.get::<_, i64>(0) <= token as i64, "step {}: a lock ahead of the row", i);
            }
            let current = locks.iter().filter(|r| r.get::<_, i64>(0) == token as i64).count();
            prop_assert!(current <= 1, "step {}: the row's generation locked twice", i);
        }
    }
}
