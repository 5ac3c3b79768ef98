//! The conformance suite, run against every backend of the crate.

use std::sync::Arc;

use flocklease::conformance::{START, TTL, World};
use flocklease::{FlockLease, ManualClock, MemLease, MemStore, Record, SessionId, record};

struct MemWorld {
    store: MemStore,
    clock: ManualClock,
}

impl World for MemWorld {
    type Lease = MemLease;
    fn instance(&self) -> MemLease {
        MemLease::new(self.store.clone(), Arc::new(self.clock.clone()), TTL)
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn record(&self, id: &SessionId) -> Option<Record> {
        self.store.record(id)
    }
    fn set_record(&self, id: &SessionId, record: Record) {
        self.store.set_record(id, record);
    }
}

struct FlockWorld {
    dir: tempfile::TempDir,
    clock: ManualClock,
}

impl World for FlockWorld {
    type Lease = FlockLease;
    fn instance(&self) -> FlockLease {
        FlockLease::builder(self.dir.path())
            .clock(Arc::new(self.clock.clone()))
            .ttl(TTL)
            .open()
            .expect("open lease directory")
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn record(&self, id: &SessionId) -> Option<Record> {
        let path = self.dir.path().join(format!("{}.lease.json", id.stem()));
        let bytes = std::fs::read(path).ok()?;
        Some(record::decode(&bytes).expect("record decodes"))
    }
    fn set_record(&self, id: &SessionId, r: Record) {
        let path = self.dir.path().join(format!("{}.lease.json", id.stem()));
        std::fs::write(path, record::encode(&r)).expect("write record");
    }
    fn stuck_transition(
        &self,
        id: &SessionId,
        timeout: std::time::Duration,
    ) -> Option<(FlockLease, Box<dyn std::any::Any>)> {
        let leases = FlockLease::builder(self.dir.path())
            .clock(Arc::new(self.clock.clone()))
            .ttl(TTL)
            .lock_timeout(timeout)
            .open()
            .expect("open lease directory");
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.path().join(format!("{}.lock", id.stem())))
            .unwrap();
        lock.lock().unwrap();
        Some((leases, Box::new(lock)))
    }
}

mod memory {
    use super::*;
    fn world() -> MemWorld {
        MemWorld {
            store: MemStore::new(),
            clock: ManualClock::new(START),
        }
    }
    flocklease::conformance_tests!(world());
}

mod flock {
    use super::*;
    fn world() -> FlockWorld {
        FlockWorld {
            dir: tempfile::tempdir().expect("tempdir"),
            clock: ManualClock::new(START),
        }
    }
    flocklease::conformance_tests!(world());
}
