//! Messages to stderr that never block the caller and never panic.
//!
//! `run` and its watchdog must act whatever their stderr is: a pipe nobody reads (a write
//! blocks), a pipe whose reader is gone (`EPIPE`), a terminal that was hung up (`EIO`) or that
//! stops a background writer (`stty tostop`: `SIGTTOU`). `eprintln!` panics on the errors and
//! waits on the full pipe, so a supervisor that prints on its way to a signal may never send
//! it (PROTOCOL §7.1). Here a message is handed to a writer thread through a bounded queue:
//! [`line()`] (and `say!`) returns at once, a message that does not fit is dropped, and a failed write is
//! dropped too. The inherited stderr stays blocking: the job shares it.
//!
//! The rule every caller keeps: **act, then say** — the signal is sent before its message is
//! queued.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;

/// Messages waiting for the writer; more are dropped.
const QUEUE: usize = 64;

enum Item {
    Line(String),
    /// Answered once every line queued before it was written (or dropped).
    Flushed(SyncSender<()>),
}

static QUEUED: OnceLock<Option<SyncSender<Item>>> = OnceLock::new();

fn queue() -> Option<&'static SyncSender<Item>> {
    QUEUED
        .get_or_init(|| {
            let (tx, rx) = mpsc::sync_channel(QUEUE);
            std::thread::Builder::new()
                .name("flocklease-stderr".into())
                .spawn(move || write_all(&rx))
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

fn write_all(rx: &Receiver<Item>) {
    let mut err = std::io::stderr();
    while let Ok(item) = rx.recv() {
        match item {
            // A broken pipe, a hung-up terminal, a full disk: the message is lost, nothing else.
            Item::Line(line) => {
                let _ = err.write_all(line.as_bytes());
            }
            Item::Flushed(done) => {
                let _ = done.try_send(());
            }
        }
    }
}

/// Queues `message` (a newline is added) for stderr and returns at once; drops it if the
/// queue is full or no writer thread could be started.
pub fn line(message: impl std::fmt::Display) {
    if let Some(q) = queue() {
        let _ = q.try_send(Item::Line(format!("{message}\n")));
    }
}

/// Waits up to `bound` for the messages queued so far to be written: called on the way out,
/// when nothing is left to act on, so that an ordinary exit loses no message and a stderr
/// that blocks delays the exit by `bound` at most.
pub fn flush(bound: Duration) {
    let Some(q) = QUEUED.get().and_then(Option::as_ref) else {
        return;
    };
    let (tx, rx) = mpsc::sync_channel(1);
    match q.try_send(Item::Flushed(tx)) {
        Ok(()) => {
            let _ = rx.recv_timeout(bound);
        }
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
    }
}

/// Formats and queues a message ([`line()`]): `say!("flocklease: {x}")`.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::line(format_args!($($arg)*))
    };
}
pub(crate) use say;
