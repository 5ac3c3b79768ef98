//! The PostgreSQL backend's tests, one test binary grouped by area, against one throwaway
//! server for the binary (each test in a fresh database; `support/pg.rs`). Children in a
//! role re-run this binary filtered to their module's `child_entry` (`support::RoleChild`).
//! The TLS tests run in a binary of their own: they switch the server's TLS on and off.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "../support/cluster.rs"]
mod cluster;
#[path = "../support/pg.rs"]
mod pg;
#[path = "../support/pgbouncer.rs"]
mod pgbouncer;
#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod edges;
mod failover;
#[cfg(feature = "fault-injection")]
mod faults;
mod fenced;
mod host_death;
mod pooler;
mod processes;
mod props;
