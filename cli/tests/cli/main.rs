//! The `flocklease` binary driven as a real process, one test binary grouped by area: `run`
//! (supervision, signals, expiry, the flock(1) forms, chaos), `status`, `fence`, files planted
//! in the lease directory, and the PostgreSQL forms against this binary's throwaway server.

#![allow(clippy::unwrap_used)]

mod cli_support;
#[cfg(feature = "postgres")]
#[path = "../../../tests/support/cluster.rs"]
mod cluster;
#[cfg(feature = "postgres")]
#[path = "../../../tests/support/pg.rs"]
mod pg;
#[cfg(feature = "postgres-tls")]
#[path = "../../../tests/support/tls.rs"]
mod tls;

mod bad_files;
mod chaos;
mod environment;
mod fence;
mod flock_compat;
mod lockstep;
mod mend;
mod pg_run;
mod pg_tls;
mod run;
mod run_expiry;
mod signals;
mod status;
mod supervision;
