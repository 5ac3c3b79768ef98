//! The PostgreSQL backend's tests, one test binary grouped by area, against one throwaway
//! server for the binary (each test in a fresh database; `support/pg.rs`). Children in a
//! role re-run this binary filtered to their module's `child_entry` (`support::RoleChild`).
//! The TLS tests run in a binary of their own (they switch the server's TLS on and off), and so
//! do the pooler's (`tests/pg_pooler.rs`: every failure under its load must be the pooler's
//! refusal, so it keeps a server of its own).

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "../support/cluster.rs"]
mod cluster;
#[path = "../support/pg.rs"]
mod pg;
#[path = "../support/mod.rs"]
mod support;

mod conformance;
mod edges;
mod failover;
#[cfg(feature = "fault-injection")]
mod faults;
mod fenced;
mod host_death;
mod processes;
mod props;
mod standbys;
