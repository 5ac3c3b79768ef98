//! [`MemLease`]: the in-process reference adapter, with an injected clock.
//!
//! Several `MemLease` instances over one [`MemStore`] behave like several processes over one
//! lease directory: the store keeps the records and which instance holds which generation's
//! liveness lock; dropping an instance is a crash (its locks vanish, its files stay).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::driver::{Begun, CommitStep, Grain, Transaction};
use crate::error::Error;
use crate::front::{Backend, Entry, Idle, Leases};
use crate::machine::{Cleanup, Event, Liveness, Local, Outcome, Plan};
use crate::name::SessionId;
use crate::record::Record;

/// The shared state of a set of [`MemLease`] instances: the "directory". Clones share it.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    inner: Arc<Mutex<StoreState>>,
    next_instance: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct StoreState {
    records: HashMap<SessionId, Record>,
    /// Liveness files: (id, token) -> the instance holding its lock, if any.
    live: HashMap<(SessionId, u64), Option<u64>>,
    /// Per instance, the generation it holds for each id.
    local: HashMap<u64, HashMap<SessionId, Local>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// The record of `id`, as a reader of the directory would see it.
    pub fn record(&self, id: &SessionId) -> Option<Record> {
        self.lock().records.get(id).cloned()
    }

    /// Replaces the record of `id` directly (an operator's edit); for tests.
    pub fn set_record(&self, id: &SessionId, record: Record) {
        self.lock().records.insert(id.clone(), record);
    }

    /// How many liveness files exist for `id` (locked or not).
    pub fn live_files(&self, id: &SessionId) -> usize {
        self.lock().live.keys().filter(|(i, _)| i == id).count()
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        crate::front::lock(&self.inner)
    }
}

/// An in-process lease manager instance over a [`MemStore`], driving the same machine as
/// [`FlockLease`](crate::FlockLease). Its time comes from an injected [`Clock`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use flocklease::{Grant, ManualClock, MemLease, MemStore, Owner, SessionId, SessionLease, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
/// let store = MemStore::new();
/// let a = MemLease::new(store.clone(), Arc::new(clock.clone()), Duration::from_secs(30));
/// let b = MemLease::new(store, Arc::new(clock.clone()), Duration::from_secs(30));
/// let id = SessionId::new("job").unwrap();
///
/// let lease = a.acquire(&id, &Owner::new("a").unwrap()).unwrap().lease().unwrap();
/// assert!(b.acquire(&id, &Owner::new("b").unwrap()).unwrap().is_held());
/// drop(a); // a crash: its liveness lock vanishes
/// let taken = b.acquire(&id, &Owner::new("b").unwrap()).unwrap().lease().unwrap();
/// assert!(taken.token > lease.token);
/// ```
pub type MemLease = Leases<Mem>;

/// The memory backend of one [`MemLease`]: its store, and which instance of the store it is.
#[derive(Debug)]
pub struct Mem {
    store: MemStore,
    instance: u64,
}

impl MemLease {
    /// A new instance over `store`. A zero `ttl` means [`DEFAULT_TTL`](crate::DEFAULT_TTL).
    pub fn new(store: MemStore, clock: Arc<dyn Clock>, ttl: Duration) -> MemLease {
        let instance = store.next_instance.fetch_add(1, Ordering::Relaxed);
        // No lock timeout: a transition holds the store's mutex for a few map operations only.
        Leases::with(Mem { store, instance }, ttl, Duration::MAX, clock)
    }
}

/// The memory backend (the store's mutex is the transition lock, taken by the transaction).
impl Backend for Mem {
    type State = ();
    type Lock = ();
    type Tx<'a> = MemTx<'a>;

    fn state(&self, _id: &SessionId) {}

    /// Always free: the transaction takes the store's mutex, for the whole run.
    fn lock(
        _: &MemLease,
        _: &SessionId,
        _: &mut (),
        _: &Event,
        _: Option<Instant>,
    ) -> Result<Option<()>, Error> {
        Ok(Some(()))
    }

    fn tx<'a>(
        l: &'a MemLease,
        id: &'a SessionId,
        _: &'a Entry<()>,
        _: &'a mut (),
        _: &'a mut (),
    ) -> MemTx<'a> {
        MemTx {
            state: l.inner.store.lock(),
            instance: l.inner.instance,
            id,
            now: l.clock.now(),
            temp: None,
        }
    }

    fn unlock(_: &MemLease, _: &Entry<()>, _: &mut (), _: (), _: &Result<Outcome, Error>) {}
}

impl Idle for () {
    fn idle(&self) -> bool {
        true
    }
}

impl Drop for Mem {
    /// A crash, as the kernel sees it: every liveness lock of this instance is dropped; the
    /// files and records stay.
    fn drop(&mut self) {
        let mut state = self.store.lock();
        for holder in state.live.values_mut() {
            if *holder == Some(self.instance) {
                *holder = None;
            }
        }
        state.local.remove(&self.instance);
    }
}

pub struct MemTx<'a> {
    state: MutexGuard<'a, StoreState>,
    instance: u64,
    id: &'a SessionId,
    now: crate::Timestamp,
    /// The record written but not yet renamed into place.
    temp: Option<Record>,
}

impl MemTx<'_> {
    fn key(&self, token: u64) -> (SessionId, u64) {
        (self.id.clone(), token)
    }

    /// Unlocks generation `token`'s liveness lock if this instance holds it.
    fn release_live(&mut self, token: u64) {
        let instance = self.instance;
        let key = self.key(token);
        if let Some(holder) = self.state.live.get_mut(&key)
            && *holder == Some(instance)
        {
            *holder = None;
        }
    }
}

impl Transaction for MemTx<'_> {
    type Pending = u64;

    fn grain(&self) -> Grain {
        // The store mirrors the flock backend's files, step for step.
        Grain::SystemCall
    }

    fn begin(&mut self) -> Result<Begun, Error> {
        Ok(Begun {
            now: self.now,
            record: self.state.records.get(self.id).cloned(),
            local: self
                .state
                .local
                .get(&self.instance)
                .and_then(|m| m.get(self.id))
                .cloned(),
        })
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        Ok(match self.state.live.get(&self.key(token)) {
            None => Liveness::Unknown,
            Some(Some(_)) => Liveness::Live,
            Some(None) => Liveness::Dead,
        })
    }

    fn commit_step(&mut self, step: CommitStep, plan: &Plan) -> Result<Option<u64>, Error> {
        let token = plan.prepared_token();
        match (step, token) {
            (CommitStep::LockLive, Some(token)) => {
                let key = self.key(token);
                let slot = self.state.live.entry(key).or_insert(None);
                if slot.is_some() {
                    // Only possible when the record was moved back under a live holder.
                    return Err(Error::LiveLockBusy {
                        path: format!("<memory>/{}.{token}.live", self.id.stem()).into(),
                    });
                }
                *slot = Some(self.instance);
                return Ok(Some(token));
            }
            (CommitStep::EnsureLive, Some(token)) => {
                let key = self.key(token);
                self.state.live.insert(key, Some(self.instance));
            }
            (CommitStep::WriteTemp, _) => self.temp = plan.commit.clone(),
            (CommitStep::Point, _) => {
                if let Some(record) = self.temp.take() {
                    self.state.records.insert(self.id.clone(), record);
                }
            }
            // Memory has no power loss to survive.
            (CommitStep::SyncTemp | CommitStep::SyncDir, _) => {}
            _ => unreachable!("a commit step its plan does not list"),
        }
        Ok(None)
    }

    fn undo(&mut self, pending: Option<u64>) {
        if let Some(token) = pending {
            self.release_live(token);
        }
        self.temp = None;
    }

    fn cleanup(&mut self, step: &Cleanup) {
        match *step {
            Cleanup::CloseLocal { token } => {
                let Some(mine) = self.state.local.get_mut(&self.instance) else {
                    return;
                };
                if mine.get(self.id).is_some_and(|l| l.token == token) {
                    mine.remove(self.id);
                    self.release_live(token);
                }
            }
            Cleanup::DeleteLive { token } => {
                let key = self.key(token);
                self.state.live.remove(&key);
            }
            Cleanup::Sweep { below } => {
                let id = self.id;
                self.state.live.retain(|(i, t), _| i != id || *t >= below);
            }
        }
    }

    fn adopt(&mut self, token: u64, local: Local) {
        debug_assert_eq!(token, local.token);
        self.state
            .local
            .entry(self.instance)
            .or_default()
            .insert(self.id.clone(), local);
    }
}
