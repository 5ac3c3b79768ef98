//! [`PgStepper`]: one transition of a real [`PgLease`] advanced one statement at a time, for
//! the lockstep harness that runs the model's PostgreSQL schedules against a real server
//! (features `postgres` and `fault-injection`; never for production use).
//!
//! A stepper runs the very `PgTx` and [`Run`] a call runs, at [`Grain::Statement`]: its
//! [`Io::Begin`] step is the transition's first round trip (the row locked and read with the
//! server's clock), its commit point the one statement that takes the new generation's lock,
//! updates the row and commits, and its end the call's own (the connection kept as the new
//! generation's liveness connection, or the transaction ended). What it leaves out is the
//! in-process turn on the id (the harness never runs two calls of one instance at once) and a
//! waiting acquire's wait for the holder.

use std::sync::Arc;

use super::tx::{PendingLive, PgTx, TxData};
use super::{IdEntry, PgLease};
use crate::driver::{Grain, Io, Run, Step};
use crate::front::lock;
use crate::machine::Event;
use crate::name::SessionId;

/// One transition of a [`PgLease`] in progress, advanced by [`PgStepper::next`].
///
/// Dropping it mid-way drops its connection: the server ends the session, and with it the
/// row lock and any advisory lock it took — what a crash of the process does.
pub struct PgStepper {
    id: SessionId,
    entry: Arc<IdEntry>,
    acquire: bool,
    run: Run<PendingLive>,
    conn: Option<super::conn::Conn>,
    data: TxData,
    /// The connection could not be had: the run ended before its first step.
    failed: bool,
}

impl std::fmt::Debug for PgStepper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStepper")
            .field("id", &self.id)
            .field("next", &self.peek())
            .finish_non_exhaustive()
    }
}

impl PgLease {
    /// A transition for `event` on `id`, not started: see [`PgStepper`].
    pub fn stepper(&self, id: &SessionId, event: Event) -> PgStepper {
        PgStepper {
            id: id.clone(),
            entry: self.inner.id_state(id),
            acquire: matches!(event, Event::Acquire { .. }),
            run: Run::new(Grain::Statement, event, self.inner.ttl),
            conn: None,
            data: TxData::default(),
            failed: false,
        }
    }
}

impl PgStepper {
    /// The step the next call of [`PgStepper::next`] performs (`None`: the run is over).
    pub fn peek(&self) -> Option<Io> {
        if self.failed {
            return None;
        }
        self.run.peek()
    }

    /// The server session of the connection the run holds (none before its first step or
    /// after its last): a harness ends it to crash the call as the server sees a crash.
    pub fn session_pid(&self) -> Option<i32> {
        self.conn.as_ref().map(|c| c.pid)
    }

    /// Whether the connection the run holds has seen its server session end (a harness that
    /// ends it waits for this before the call's next step, as the holder's seeing it).
    pub fn session_ended(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.ended.is_ended() || c.client.is_closed())
    }

    /// Performs the next step on `lease` (the instance that made this stepper).
    ///
    /// # Panics
    ///
    /// When called after [`Step::Done`].
    pub fn next(&mut self, lease: &PgLease) -> Step {
        let inner = &lease.inner;
        let entry = Arc::clone(&self.entry);
        let mut state = lock(&entry.state);
        if self.conn.is_none() {
            match inner.run_conn(&self.id, self.acquire, &state) {
                Ok((conn, probe)) => {
                    self.conn = Some(conn);
                    self.data.ask = (probe, None);
                }
                Err(e) => {
                    self.failed = true;
                    return Step::Done(Err(e));
                }
            }
        }
        let conn = self.conn.as_mut().expect("a connection for the run");
        let mut tx = PgTx {
            inner,
            id: &self.id,
            conn,
            state: &mut state,
            d: &mut self.data,
        };
        let step = self.run.next(&mut tx, &self.id);
        if matches!(step, Step::Done(_))
            && let Some(conn) = self.conn.take()
        {
            inner.end_run(&mut state, conn, std::mem::take(&mut self.data));
        }
        step
    }
}
