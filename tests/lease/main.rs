//! The library's tests of the flock and memory backends that start no process, one test binary
//! grouped by area (one binary links the crate once).
//!
//! The tests that start child processes are in `tests/children` (and `tests/flock.rs`): a child forked by one test
//! holds copies of every descriptor of the process until it execs, so a test here that checks
//! a lock is free (`faults`, `tamper`) would see it taken now and then. Tests that read
//! process-wide figures run in binaries of their own: `descriptors` (it lowers the descriptor
//! limit), `waits` (it counts the process's descriptors and inotify marks), `fairness` (shares
//! of grants), `chaos` and `soak` (long, timed).

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod api;
mod bad_input;
mod born_expired;
mod conformance;
mod corpus;
mod faults;
mod fenced;
mod keepalive;
mod record_props;
mod recovery;
mod tamper;
