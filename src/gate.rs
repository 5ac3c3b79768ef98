//! [`Gate`]: the in-process turn on one id of a lease manager, shared by the backends: a
//! condition variable with a timed wait, so the k-th caller queued on an id waits for its own
//! deadline, not for k lock timeouts.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// One id's in-process turn: at most one caller of an instance runs a transition on an id.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    state: Mutex<GateState>,
    free: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    busy: bool,
    /// Callers waiting for the turn: only then does leaving it wake anyone (a condition
    /// variable's notify is a system call even with nobody waiting).
    waiting: usize,
}

impl Gate {
    /// Takes the turn, waiting until `deadline` at most (`None`: no limit). Returns `None` at
    /// the deadline.
    pub(crate) fn enter(&self, deadline: Option<Instant>) -> Option<Turn<'_>> {
        let mut st = lock(&self.state);
        while st.busy {
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    Some(left)
                }
            };
            st.waiting += 1;
            st = match left {
                None => self.free.wait(st).unwrap_or_else(PoisonError::into_inner),
                Some(left) => {
                    self.free
                        .wait_timeout(st, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
            st.waiting -= 1;
        }
        st.busy = true;
        Some(Turn { gate: self })
    }

    /// Whether nobody has the turn now (for pruning idle ids).
    pub(crate) fn is_free(&self) -> bool {
        self.state
            .try_lock()
            .is_ok_and(|st| !st.busy && st.waiting == 0)
    }
}

/// A caller's turn on an id; dropping it (also on unwinding) lets the next caller in.
pub(crate) struct Turn<'a> {
    gate: &'a Gate,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.gate.state);
        st.busy = false;
        if st.waiting > 0 {
            self.gate.free.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Two plain fields updated in single steps: usable after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
