//! [`ModelTx`]: the model's interpretation of the driver's primitive steps, over [`State`].
//!
//! It gives each step the meaning `FlockLease` gives it on files — a lock is taken when
//! `lock_live` returns, the temporary file is one path that the next writer replaces, the
//! rename moves whatever stands at that path, the directory sync makes the visible record the
//! durable one — and nothing more: when a step runs, what a failure drops and when the record
//! counts as committed are the driver's ([`flocklease::driver::Run`]) rules, not this file's.
//! Besides, it notes (in [`Ghost`]) what the properties need to know about the call.

use std::io;

use flocklease::driver::Transaction;
use flocklease::machine::{Liveness, Local};
use flocklease::{Error, Record, Timestamp};

use crate::{Backend, State, Temp, at};

/// What a call saw and did, for the properties (never read by the code under test).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// The record, the time and the local generation the call read under the lock.
    pub seen: Option<Seen>,
    /// The probe found the recorded generation without a running holder: its file unlocked,
    /// or never created (its holder crashed before locking it) and not deleted by hand.
    pub probed_dead: bool,
    /// The call renamed a record into place.
    pub renamed: bool,
    /// The call unlocked or deleted a liveness lock held by another process.
    pub touched_other: bool,
}

/// What a call read under the transition lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seen {
    /// The record.
    pub record: Option<Record>,
    /// The time, in ticks.
    pub now: u8,
    /// The generation the process held.
    pub local: Option<Local>,
    /// Who held the recorded generation's liveness lock.
    pub holder: Option<usize>,
}

/// The driver's transaction over the model's state, for process `p`.
pub struct ModelTx<'a> {
    pub(crate) state: &'a mut State,
    pub(crate) p: usize,
    /// Fail the next fallible step (a fault the model injects).
    pub(crate) fault: bool,
    /// Set when the injected fault was returned.
    pub(crate) fired: bool,
    /// Whether fsyncs happen (`Durability::Full`).
    pub(crate) durable: bool,
    pub(crate) backend: Backend,
    pub(crate) ghost: Ghost,
}

impl ModelTx<'_> {
    /// Fails with the injected error if a fault is armed.
    fn fault(&mut self, op: &'static str) -> Result<(), Error> {
        if self.fault && !self.fired {
            self.fired = true;
            return Err(Error::Io {
                op,
                path: "model.lease.json".into(),
                source: io::Error::other("injected"),
            });
        }
        Ok(())
    }

    fn unlock(&mut self, token: u64) {
        if let Some(h) = self.state.live.get_mut(&token)
            && *h == Some(self.p)
        {
            *h = None;
        }
    }

    fn remove_file(&mut self, token: u64) {
        if let Some(Some(q)) = self.state.live.remove(&token)
            && q != self.p
        {
            self.ghost.touched_other = true;
        }
    }
}

impl Transaction for ModelTx<'_> {
    type Pending = u64;

    fn lock_stable(&mut self) -> Result<bool, Error> {
        match self.state.stable {
            Some(q) if q != self.p => Ok(false),
            _ => {
                self.state.stable = Some(self.p);
                Ok(true)
            }
        }
    }

    fn unlock_stable(&mut self) {
        if self.state.stable == Some(self.p) {
            self.state.stable = None;
        }
    }

    fn now(&self) -> Timestamp {
        at(self.state.now)
    }

    fn read(&mut self) -> Result<Option<Record>, Error> {
        self.fault("read")?;
        let record = self.state.record.clone();
        let holder = record
            .as_ref()
            .and_then(|r| self.state.live.get(&r.token).copied().flatten());
        self.ghost.seen = Some(Seen {
            record: record.clone(),
            now: self.state.now,
            local: self.local(),
            holder,
        });
        Ok(record)
    }

    fn local(&self) -> Option<Local> {
        let proc = &self.state.procs[self.p];
        // PostgreSQL: the adapter learns at once that its liveness connection ended, and no
        // longer counts the generation as held here.
        if proc.lost.is_some() {
            return None;
        }
        proc.local.clone()
    }

    fn probe(&mut self, token: u64) -> Result<Liveness, Error> {
        self.fault("lock")?;
        let liveness = match self.state.live.get(&token) {
            None => Liveness::Unknown,
            Some(None) => Liveness::Dead,
            Some(Some(_)) => Liveness::Live,
        };
        let never_created = !self.state.was_created(token);
        self.ghost.probed_dead = liveness == Liveness::Dead
            || (liveness == Liveness::Unknown && never_created && self.backend == Backend::Flock);
        Ok(liveness)
    }

    fn lock_live(&mut self, token: u64) -> Result<u64, Error> {
        self.fault("lock")?;
        self.state.note_created(token);
        match self.state.live.entry(token).or_insert(None) {
            Some(_) => Err(Error::LiveLockBusy {
                path: format!("model.{token}.live").into(),
            }),
            h => {
                *h = Some(self.p);
                Ok(token)
            }
        }
    }

    fn abandon(&mut self, token: u64) {
        self.unlock(token);
    }

    fn ensure_live(&mut self, token: u64) -> Result<(), Error> {
        self.fault("stat")?;
        self.state.note_created(token);
        if let Some(Some(q)) = self.state.live.insert(token, Some(self.p))
            && q != self.p
        {
            self.ghost.touched_other = true;
        }
        Ok(())
    }

    fn write_temp(&mut self, record: &Record) -> Result<(), Error> {
        self.fault("write")?;
        // A file found at the temporary name is removed and created anew.
        self.state.temp = Some(Temp {
            record: record.clone(),
            synced: false,
        });
        Ok(())
    }

    fn sync_temp(&mut self) -> Result<(), Error> {
        if !self.durable {
            return Ok(());
        }
        self.fault("fsync")?;
        if let Some(t) = self.state.temp.as_mut() {
            t.synced = true;
        }
        Ok(())
    }

    fn rename(&mut self) -> Result<(), Error> {
        self.fault("rename")?;
        // Whatever stands at the temporary path is renamed; nothing there: ENOENT.
        let Some(temp) = self.state.temp.take() else {
            return Err(Error::Io {
                op: "rename",
                path: "model.lease.json".into(),
                source: io::Error::from(io::ErrorKind::NotFound),
            });
        };
        self.state.record = Some(temp.record);
        self.state.record_synced = temp.synced;
        self.ghost.renamed = true;
        Ok(())
    }

    fn discard_temp(&mut self) {
        self.state.temp = None;
    }

    fn sync_dir(&mut self) -> Result<(), Error> {
        if !self.durable {
            return Ok(());
        }
        self.fault("fsync")?;
        // The name is durable now; contents never synced would read back torn after a power
        // loss — as good as no record, which the token property sees.
        self.state.durable = if self.state.record_synced {
            self.state.record.clone()
        } else {
            None
        };
        Ok(())
    }

    fn close_local(&mut self, token: u64) {
        let proc = &mut self.state.procs[self.p];
        if proc.local.as_ref().is_some_and(|l| l.token == token) {
            proc.local = None;
            self.unlock(token);
        }
    }

    fn delete_live(&mut self, token: u64) {
        self.remove_file(token);
    }

    fn sweep(&mut self, below: u64) {
        let doomed: Vec<u64> = self.state.live.range(..below).map(|(t, _)| *t).collect();
        for t in doomed {
            self.remove_file(t);
        }
        self.state.temp = None;
    }

    fn adopt(&mut self, token: u64, local: Local) {
        debug_assert_eq!(token, local.token);
        self.state.procs[self.p].local = Some(local);
    }
}
