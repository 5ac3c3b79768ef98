//! The library's tests that start child processes (real holders killed, stopped, run as
//! another user), one test binary grouped by area. Children in a role re-run this binary
//! filtered to their module's `child_entry` (`support::RoleChild`). Apart from the tests that
//! check a lock is free (`tests/lease`, and `tests/flock.rs`, which starts two children of
//! its own): a child holds copies of this process's descriptors between its fork and its exec.

#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod fence;
mod processes;
mod shared_dirs;
