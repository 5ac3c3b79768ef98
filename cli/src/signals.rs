//! Signals received by `run`, turned into events of its main loop.
//!
//! The signals are blocked in every thread (the mask is set before any thread exists, and
//! threads inherit it) and taken by one thread with `sigwait`, so no handler runs at an
//! arbitrary point. Before the job exists, a forwarded signal whose default action ends a
//! process ends `run` at once with 128 + the signal number (nothing to forward yet; the kernel
//! drops our locks with the process); from the moment the job is spawned, signals are routed
//! to the main loop, which forwards them.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nix::sys::signal::{SigSet, Signal};

use crate::say::say;

/// The signals `run` forwards to the job's process group.
pub const FORWARDED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

/// Whether a forwarded signal asks the job to stop, so that the grace period starts (SIGKILL
/// after it). The others ask for something else as often as not (SIGHUP: reload; SIGQUIT: a
/// thread dump; SIGUSR1/2: reopen logs), and a job that survives them keeps running.
pub fn stops(sig: Signal) -> bool {
    matches!(sig, Signal::SIGTERM | Signal::SIGINT)
}

/// What wakes the main loop of `run`.
pub enum Event {
    /// A signal to forward.
    Signal(Signal),
    /// A child changed state (exited or stopped).
    Child,
    /// The keep-alive reported the loss of the lease (its handle says which).
    Lost,
    /// The watchdog killed the job at its deadline: no renew was confirmed in time.
    WatchdogKilled,
    /// The watchdog is gone: nothing would stop the job if `run` died now.
    WatchdogGone,
}

/// Where a received signal goes.
pub enum Route {
    /// No job yet: exit with 128 + the signal.
    Exit,
    /// To the main loop.
    Loop(Sender<Event>),
}

/// The signal-receiving thread's routing table.
pub struct Signals {
    route: Arc<Mutex<Route>>,
}

impl Signals {
    /// Blocks the forwarded signals, `SIGCHLD` and `SIGTTOU` in the calling thread (call it
    /// before any other thread exists) and starts the thread that receives them.
    ///
    /// `SIGTTOU` is only blocked, never received: it lets `run` hand the terminal to the job
    /// and take it back while in the background.
    pub fn start() -> Result<Signals, String> {
        let mut waited = SigSet::empty();
        for sig in FORWARDED {
            waited.add(sig);
        }
        waited.add(Signal::SIGCHLD);
        let mut blocked = waited;
        blocked.add(Signal::SIGTTOU);
        blocked
            .thread_block()
            .map_err(|e| format!("cannot block signals: {e}"))?;
        let route = Arc::new(Mutex::new(Route::Exit));
        let shared = Arc::clone(&route);
        std::thread::Builder::new()
            .name("flocklease-signals".into())
            .spawn(move || receive(&waited, &shared))
            .map_err(|e| format!("cannot start the signal thread: {e}"))?;
        Ok(Signals { route })
    }

    /// The routing table, locked: hold it across spawning the job and switching to
    /// [`Route::Loop`], so that no signal falls between the two.
    pub fn lock(&self) -> MutexGuard<'_, Route> {
        self.route.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn receive(set: &SigSet, route: &Mutex<Route>) {
    loop {
        let Ok(sig) = set.wait() else { continue };
        let route = route.lock().unwrap_or_else(PoisonError::into_inner);
        match &*route {
            // A child's or a window's change: nothing to do before the job exists.
            Route::Exit if matches!(sig, Signal::SIGCHLD | Signal::SIGWINCH) => {}
            Route::Exit => {
                say!(
                    "flocklease: received {} before the command started; exiting",
                    sig.as_str()
                );
                crate::say::flush(std::time::Duration::from_millis(200));
                std::process::exit(128 + sig as i32);
            }
            Route::Loop(tx) => {
                let event = if sig == Signal::SIGCHLD {
                    Event::Child
                } else {
                    Event::Signal(sig)
                };
                // The loop may be gone (run is finishing): nothing to do then.
                let _ = tx.send(event);
            }
        }
    }
}
