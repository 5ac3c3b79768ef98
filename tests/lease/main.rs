//! The library's tests of the flock and memory backends, one test binary grouped by area (one
//! binary links the crate once). Children in a role re-run this binary filtered to their
//! module's `child_entry` (`support::RoleChild`).
//!
//! Tests that read process-wide figures run in binaries of their own: `descriptors` (it lowers
//! the descriptor limit), `waits` (it counts the process's descriptors and inotify marks),
//! `fairness` (shares of grants), `chaos` and `soak` (long, timed).

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod api;
mod bad_input;
mod born_expired;
mod conformance;
mod corpus;
mod faults;
mod fence;
mod fenced;
mod flock;
mod keepalive;
mod processes;
mod record_props;
mod recovery;
mod shared_dirs;
mod tamper;
