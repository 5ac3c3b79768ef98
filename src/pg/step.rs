//! [`PgStepper`]: one transition of a real [`PgLease`] advanced one statement at a time, for
//! the lockstep harness that runs the model's PostgreSQL schedules against a real server
//! (features `postgres` and `fault-injection`; never for production use).

use super::PgLease;
use crate::driver::Grain;
use crate::front::Steps;
use crate::machine::Event;
use crate::name::SessionId;

/// One transition of a [`PgLease`] in progress, advanced by `next(&lease)`: the very `PgTx` and
/// `Run` a call runs (the front's own steps, `front::Steps`), at [`Grain::Statement`]. Its
/// begin is the transition's first round trip (the row locked and read with the server's
/// clock, the lock waited for in the server), its commit point the one statement that takes
/// the new generation's lock, updates the row and commits, and its end the call's own. What
/// it leaves out is the in-process turn on the id and a waiting acquire's wait for the holder.
/// Dropping it mid-way drops its connection: the server ends the session, and with it the row
/// lock and any advisory lock it took — what a crash of the process does.
pub type PgStepper = Steps<super::Inner, super::tx::PendingLive>;

impl PgLease {
    /// A transition for `event` on `id`, not started: see [`PgStepper`].
    pub fn stepper(&self, id: &SessionId, event: Event) -> PgStepper {
        Steps::new(self, id, event, Grain::Statement)
    }
}

impl PgStepper {
    /// The server session of the connection the run holds (none before its first step or
    /// after its last): a harness ends it to crash the call as the server sees a crash.
    pub fn session_pid(&self) -> Option<i32> {
        self.held.as_ref().map(|h| h.conn.pid)
    }

    /// Whether the connection the run holds has seen its server session end (a harness that
    /// ends it waits for this before the call's next step, as the holder's seeing it).
    pub fn session_ended(&self) -> bool {
        self.held.as_ref().is_some_and(|h| {
            let c = &h.conn;
            c.ended.is_ended() || c.client.is_closed()
        })
    }
}
