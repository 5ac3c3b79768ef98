//! The only place that reads wall time: the [`Clock`] trait, the system clock and a manual clock.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::timestamp::Timestamp;

/// A source of wall-clock time for lease expiry.
///
/// Lease expiry is wall-clock time (it is shared with other processes through the record), so a
/// clock here is a [`SystemTime`]-like clock, not a monotonic one.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The system's real-time clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// [`SystemTime::now`], clamped to the representable years 0001–9999.
    fn now(&self) -> Timestamp {
        let now = SystemTime::now();
        Timestamp::from_system_time(now).unwrap_or(if now < SystemTime::UNIX_EPOCH {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        })
    }
}

/// A clock that moves only when told to; clones share the same time. For tests and simulations.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use flocklease::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_unix_secs(1_700_000_000).unwrap());
/// let view = clock.clone();
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(view.now(), Timestamp::from_unix_secs(1_700_000_031).unwrap());
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Timestamp>>,
}

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Sets the time (it may go backwards, as a wall clock can).
    pub fn set(&self, t: Timestamp) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = t;
    }

    /// Moves the time forward by `d`, saturating at [`Timestamp::MAX`].
    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now.checked_add(d).unwrap_or(Timestamp::MAX);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
