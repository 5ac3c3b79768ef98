//! Invariant checks over untrusted input, shared by the fuzz targets (`fuzz/`) and the stable
//! corpus replay test. Each function panics with a description when an invariant is broken and
//! returns quietly otherwise, whatever the bytes.

use crate::machine::{self, Cleanup, Decision, DirSync, Event, Input, Outcome, Prepare, StepError};
use crate::name::stem;
use crate::record::{self, Record};

/// Record decoding never panics; what decodes re-encodes canonically and decodes back equal:
/// `decode(encode(r)) == r` and `encode(decode(encode(r))) == encode(r)`.
pub fn record_decode(bytes: &[u8]) {
    let Ok(r) = record::decode(bytes) else { return };
    let canonical = record::encode(&r);
    let again = record::decode(&canonical)
        .unwrap_or_else(|e| panic!("canonical encoding {canonical:?} does not decode: {e}"));
    assert_eq!(again, r, "decode(encode(r)) != r");
    assert_eq!(
        record::encode(&again),
        canonical,
        "encoding is not canonical"
    );
    assert!(canonical.len() <= record::MAX_RECORD_BYTES + 64);
}

/// The stem of any id is made of `[A-Za-z0-9_-]`, is never `.` or `..`, has at most 57 bytes,
/// ends with `-` and 16 hex digits, and is deterministic.
pub fn safe_name(id: &[u8]) {
    let s = stem(id);
    assert!(s.len() <= 57, "stem {s:?} is {} bytes", s.len());
    assert!(
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "stem {s:?} has a forbidden byte"
    );
    assert!(s != "." && s != "..");
    let (prefix, hash) = s.rsplit_once('-').expect("a dash before the hash");
    assert!(!prefix.is_empty(), "empty prefix in {s:?}");
    assert!(
        hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{s:?}"
    );
    assert_eq!(stem(id), s, "stem is not deterministic");
}

/// The transition invariants of one machine step: tokens never decrease, a new generation is
/// exactly one above the recorded token and is locked before it is committed, renew and
/// refresh keep the token, release never raises it, "held" and errors commit nothing, the
/// machine asks for a probe only when it matters and at most once.
pub fn machine_step(input: &Input) {
    let old = input.record.as_ref().map_or(0, |r| r.token);
    let plan = match machine::step(input) {
        Err(StepError::TokenExhausted) => {
            assert_eq!(old, u64::MAX, "token exhausted below u64::MAX");
            return;
        }
        Err(StepError::ExpiryOutOfRange) => {
            assert!(input.now.checked_add(input.ttl).is_none());
            return;
        }
        Ok(Decision::Probe { token }) => {
            let rec = input.record.as_ref().expect("probe without a record");
            assert!(input.liveness.is_none(), "asked to probe twice");
            assert_eq!(token, rec.token, "probe of another generation");
            assert!(
                !rec.is_tombstone() && input.now < rec.expiry,
                "needless probe"
            );
            assert!(matches!(input.event, Event::Acquire { .. }));
            return;
        }
        Ok(Decision::Plan(plan)) => plan,
    };
    let locked: Vec<u64> = plan
        .prepare
        .iter()
        .filter_map(|p| match p {
            Prepare::LockLive { token, .. } => Some(*token),
            Prepare::EnsureLive { .. } => None,
        })
        .collect();
    match (&plan.outcome, &plan.commit) {
        (Outcome::Held, c) => {
            assert!(c.is_none(), "held commits nothing");
            assert!(plan.prepare.is_empty());
        }
        (Outcome::Granted { token, expiry }, Some(c)) => {
            assert_eq!((c.token, c.expiry), (*token, *expiry));
            assert!(!c.is_tombstone(), "a grant commits a holder");
            assert_eq!(Some(*expiry), input.now.checked_add(input.ttl));
            assert!(*token >= old, "token went back");
            if *token != old || input.record.as_ref().is_none_or(Record::is_tombstone) {
                // A new generation: exactly one more, locked first, made durable.
                assert_eq!(*token, old + 1, "takeover skipped a token");
                assert_eq!(locked, vec![*token], "new generation not locked first");
                assert_eq!(
                    plan.sync_dir,
                    DirSync::Required,
                    "a new generation must be made durable"
                );
                assert!(matches!(input.event, Event::Acquire { .. }));
            } else {
                assert!(locked.is_empty(), "same generation locked again");
                assert_eq!(plan.sync_dir, DirSync::No);
            }
        }
        (Outcome::Granted { .. }, None) => panic!("granted without a commit"),
        (Outcome::Released, c) => {
            assert!(matches!(input.event, Event::Release { .. }));
            assert!(locked.is_empty());
            if let Some(c) = c {
                assert!(c.is_tombstone(), "release commits a tombstone");
                assert_eq!(c.token, old, "release changed the token");
                assert_eq!(plan.sync_dir, DirSync::BestEffort);
            }
        }
    }
    // Cleanup never touches the generation just granted.
    if let Outcome::Granted { token, .. } = plan.outcome {
        for c in &plan.cleanup {
            match c {
                Cleanup::CloseLocal { token: t } | Cleanup::DeleteLive { token: t } => {
                    assert_ne!(*t, token, "cleanup closes the granted generation");
                }
                Cleanup::Sweep { below } => assert!(*below <= token),
            }
        }
    }
    // With the liveness known, the machine always decides.
    if input.liveness.is_none() {
        for l in [
            machine::Liveness::Live,
            machine::Liveness::Dead,
            machine::Liveness::Unknown,
        ] {
            let mut with = input.clone();
            with.liveness = Some(l);
            assert!(!matches!(machine::step(&with), Ok(Decision::Probe { .. })));
        }
    }
}

#[cfg(feature = "arbitrary")]
pub use fuzzing::{machine_step_bytes, ops_bytes};

#[cfg(feature = "arbitrary")]
mod fuzzing {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use arbitrary::{Arbitrary, Result, Unstructured};

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::error::Error;
    use crate::flock::{Durability, FlockLease};
    use crate::lease::{Grant, Lease};
    use crate::machine::{Liveness, Local};
    use crate::memory::{MemLease, MemStore};
    use crate::name::{Owner, SessionId};
    use crate::timestamp::Timestamp;

    const BASE: i64 = 1_700_000_000;

    fn token(u: &mut Unstructured<'_>) -> Result<u64> {
        Ok(match u.int_in_range(0..=5)? {
            0 => 0,
            1 => 1,
            2 => u.int_in_range(2..=6)?,
            3 => u64::MAX,
            4 => u64::MAX - 1,
            _ => u64::arbitrary(u)?,
        })
    }

    fn instant(u: &mut Unstructured<'_>) -> Result<Timestamp> {
        Ok(if u.ratio(1, 16)? {
            let n = u.int_in_range(Timestamp::MIN.unix_nanos()..=Timestamp::MAX.unix_nanos())?;
            Timestamp::from_unix_nanos(n).unwrap_or(Timestamp::MAX)
        } else {
            let secs = BASE + i64::from(u.int_in_range(0u8..=120)?);
            Timestamp::from_unix_secs(secs).unwrap_or(Timestamp::MAX)
        })
    }

    fn owner(u: &mut Unstructured<'_>) -> Result<Owner> {
        Ok(Owner::new(["a", "b", "c"][u.choose_index(3)?]).unwrap_or_else(|_| unreachable!()))
    }

    fn input(u: &mut Unstructured<'_>) -> Result<Input> {
        let record = if u.ratio(1, 5)? {
            None
        } else {
            let holder = if u.ratio(1, 4)? {
                String::new()
            } else {
                owner(u)?.as_str().to_owned()
            };
            Some(Record {
                owner: holder,
                token: token(u)?,
                expiry: instant(u)?,
            })
        };
        let liveness = match u.int_in_range(0..=3)? {
            0 => None,
            1 => Some(Liveness::Live),
            2 => Some(Liveness::Dead),
            _ => Some(Liveness::Unknown),
        };
        // Reachable-looking: an instance only holds a generation up to the recorded one (a
        // higher one needs the record moved back by hand, which the adapter reports as
        // `Error::LiveLockBusy`).
        let local = match &record {
            Some(r) if u.ratio(1, 2)? => {
                let t = token(u)?;
                Some(Local {
                    token: if t <= r.token { t } else { r.token },
                    owner: owner(u)?,
                })
            }
            _ => None,
        };
        let event = match u.int_in_range(0..=2)? {
            0 => Event::Acquire { owner: owner(u)? },
            1 => Event::Renew {
                owner: owner(u)?,
                token: token(u)?,
            },
            _ => Event::Release {
                owner: owner(u)?,
                token: token(u)?,
            },
        };
        Ok(Input {
            record,
            liveness,
            local,
            now: instant(u)?,
            // Zero to two minutes.
            ttl: Duration::from_secs(u.int_in_range(0..=120)?),
            event,
        })
    }

    /// [`machine_step`] on an input built from fuzzer bytes.
    pub fn machine_step_bytes(data: &[u8]) {
        if let Ok(i) = input(&mut Unstructured::new(data)) {
            machine_step(&i);
        }
    }

    #[derive(Debug)]
    enum Op {
        Acquire(usize, usize),
        Renew(usize, usize),
        Release(usize, usize),
        Crash(usize),
        Tick(u8),
    }

    fn ops(u: &mut Unstructured<'_>) -> Result<Vec<Op>> {
        let mut v = vec![];
        while !u.is_empty() && v.len() < 48 {
            let inst = u.choose_index(2)?;
            v.push(match u.int_in_range(0..=4)? {
                0 => Op::Acquire(inst, u.choose_index(2)?),
                1 => Op::Renew(inst, usize::from(u8::arbitrary(u)?)),
                2 => Op::Release(inst, usize::from(u8::arbitrary(u)?)),
                3 => Op::Crash(inst),
                _ => Op::Tick(u.int_in_range(1..=40)?),
            });
        }
        Ok(v)
    }

    fn seen(g: &std::result::Result<Grant, Error>) -> String {
        match g {
            Ok(Grant::Granted(l)) => format!("granted {} {}", l.token, l.expiry),
            Ok(Grant::Held) => "held".to_owned(),
            Err(e) => format!("error {e}"),
        }
    }

    /// Removes the scratch directory even when a check panics.
    struct Scratch(std::path::PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The generation an [`Oracle`] believes current.
    #[derive(Clone, Debug)]
    struct Generation {
        instance: usize,
        owner: usize,
        token: u64,
        expiry: Timestamp,
        /// Its instance still runs (no crash since the grant).
        alive: bool,
    }

    /// PROTOCOL §3 and §10 restated over the observable history, without the machine: what each
    /// call must answer, given the generations granted so far, crashes and the clock. A bug
    /// in the machine shared by both adapters passes their comparison but not this.
    #[derive(Debug, Default)]
    struct Oracle {
        current: Option<Generation>,
        /// The highest token granted so far (tokens only grow, by one per new generation).
        top: u64,
    }

    impl Oracle {
        /// The expected answer to `acquire` by `owner` on `instance` at `now`.
        fn acquire(
            &mut self,
            instance: usize,
            owner: usize,
            now: Timestamp,
            ttl: Duration,
        ) -> String {
            let expiry = now.checked_add(ttl).expect("in range");
            if let Some(g) = &mut self.current {
                // PROTOCOL §10.6 / §10.8: a crashed or expired holder is replaced; otherwise it
                // is held, unless this very instance holds it for this owner (a refresh).
                let expired = now >= g.expiry;
                if g.alive && !expired {
                    if g.instance == instance && g.owner == owner {
                        g.expiry = expiry;
                        return format!("granted {} {expiry}", g.token);
                    }
                    return "held".into();
                }
            }
            self.top += 1;
            self.current = Some(Generation {
                instance,
                owner,
                token: self.top,
                expiry,
                alive: true,
            });
            format!("granted {} {expiry}", self.top)
        }

        /// The expected answer to `renew` of `lease` (owner index, token) on `instance`.
        fn renew(
            &mut self,
            instance: usize,
            owner: usize,
            token: u64,
            now: Timestamp,
            ttl: Duration,
        ) -> String {
            match &mut self.current {
                // PROTOCOL §10.4 / §10.5: only the current generation, by the instance holding
                // it, and then even after its expiry.
                Some(g)
                    if g.alive
                        && g.instance == instance
                        && g.owner == owner
                        && g.token == token =>
                {
                    g.expiry = now.checked_add(ttl).expect("in range");
                    format!("granted {token} {}", g.expiry)
                }
                _ => "held".into(),
            }
        }

        /// A release: PROTOCOL §10.3, only the current generation's own instance frees it.
        fn release(&mut self, instance: usize, owner: usize, token: u64) {
            if self.current.as_ref().is_some_and(|g| {
                g.alive && g.instance == instance && g.owner == owner && g.token == token
            }) {
                self.current = None;
            }
        }

        fn crash(&mut self, instance: usize) {
            if let Some(g) = self.current.as_mut().filter(|g| g.instance == instance) {
                g.alive = false;
            }
        }
    }

    /// The same operations by two owners on two instances, against `FlockLease` on a scratch
    /// directory and `MemLease`, with one manual clock: every outcome must be identical, and
    /// equal to what an `Oracle` written from the protocol (docs/PROTOCOL.md, not from the machine)
    /// expects.
    pub fn ops_bytes(data: &[u8]) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let Ok(ops) = ops(&mut Unstructured::new(data)) else {
            return;
        };
        let dir = std::env::temp_dir().join(format!(
            "flocklease-ops-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _scratch = Scratch(dir.clone());
        // Created here, not by the adapter: a directory the adapter creates is synced into its
        // parent, a disk flush per input that would slow the fuzzer down for nothing.
        std::fs::create_dir(&dir).expect("create the scratch lease directory");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("private scratch directory");
        let clock = ManualClock::new(Timestamp::from_unix_secs(BASE).unwrap_or(Timestamp::MIN));
        let ttl = Duration::from_secs(30);
        let flock = || {
            FlockLease::builder(&dir)
                .clock(Arc::new(clock.clone()))
                .ttl(ttl)
                .durability(Durability::NoSync)
                .open()
                .expect("open scratch lease directory")
        };
        let store = MemStore::new();
        let mem = || MemLease::new(store.clone(), Arc::new(clock.clone()), ttl);
        let mut f = [flock(), flock()];
        let mut m = [mem(), mem()];
        let id = SessionId::new("fuzz").expect("valid id");
        let owners = [Owner::new("a"), Owner::new("b")].map(|o| o.expect("valid owner"));
        let mut leases: Vec<(Lease, usize)> = vec![];
        let mut oracle = Oracle::default();
        for op in ops {
            let (a, b) = match op {
                Op::Acquire(i, o) => {
                    let fa = f[i].acquire(&id, &owners[o]);
                    if let Ok(Grant::Granted(l)) = &fa {
                        leases.push((l.clone(), o));
                    }
                    let expected = oracle.acquire(i, o, clock.now(), ttl);
                    assert_eq!(seen(&fa), expected, "the specification disagrees on {op:?}");
                    (seen(&fa), seen(&m[i].acquire(&id, &owners[o])))
                }
                Op::Renew(i, k) | Op::Release(i, k) if !leases.is_empty() => {
                    let (l, o) = &leases[k % leases.len()];
                    if matches!(op, Op::Renew(..)) {
                        let fr = f[i].renew(l);
                        let expected = oracle.renew(i, *o, l.token, clock.now(), ttl);
                        assert_eq!(seen(&fr), expected, "the specification disagrees on {op:?}");
                        (seen(&fr), seen(&m[i].renew(l)))
                    } else {
                        oracle.release(i, *o, l.token);
                        (
                            format!("{:?}", f[i].release(l).map_err(|e| e.to_string())),
                            format!("{:?}", m[i].release(l).map_err(|e| e.to_string())),
                        )
                    }
                }
                Op::Renew(..) | Op::Release(..) => continue,
                Op::Crash(i) => {
                    f[i] = flock();
                    m[i] = mem();
                    oracle.crash(i);
                    continue;
                }
                Op::Tick(s) => {
                    clock.advance(Duration::from_secs(u64::from(s)));
                    continue;
                }
            };
            assert_eq!(a, b, "FlockLease and MemLease disagree on {op:?}");
        }
        assert_eq!(
            std::fs::read(dir.join(format!("{}.lease.json", id.stem())))
                .ok()
                .map(|b| record::decode(&b).expect("the adapter wrote a valid record")),
            store.record(&id),
            "records differ"
        );
    }
}
