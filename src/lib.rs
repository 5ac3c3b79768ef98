//! Single-host session leases with a monotone fencing token, kept in a lease directory with
//! `flock(2)` locks and an atomic JSON record.
//!
//! A *session lease* gives one owner the exclusive right to drive one session id for a limited
//! time, among cooperating processes of one host. A crashed holder is replaced at once (the
//! kernel drops its lock), an expired one can always be taken over, and every new holder gets a
//! greater **fencing token** to hand to the resource it protects.
//!
//! ```
//! use flocklease::{FlockLease, SessionId};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?; let dir = dir.path();
//! let leases = FlockLease::open(dir)?; // e.g. "/run/myapp/leases"
//! if let Some(lease) = leases.acquire_guard(&SessionId::new("nightly-report")?)? {
//!     println!("running with token {}", lease.token); // fence writes with it
//! } // released here, also if the work panics
//! # Ok(())
//! # }
//! ```
//!
//! # Where to go next
//!
//! - [`FlockLease`]: open a lease directory; [`acquire`](FlockLease::acquire),
//!   [`renew`](FlockLease::renew), [`release`](FlockLease::release), and
//!   [`acquire_wait`](FlockLease::acquire_wait) to wait for the holder to leave.
//! - [`LeaseGuard`] (from [`acquire_guard`](SessionLease::acquire_guard)): release on drop.
//! - [`KeepAlive`]: renew in the background for long work, and learn of a loss at once.
//! - [`Lease`], [`Grant`], [`Error`]: what the calls return; contention is [`Grant::Held`],
//!   failures are [`Error`]s naming the file.
//! - [`SessionId`], [`Owner`] (with [`Owner::unique`] and [`Owner::this_process`]),
//!   [`Timestamp`]: the values.
//! - [`MemLease`]: the same semantics in memory with an injected clock, for your tests.
//! - [`Fence`]: the resource side of fencing, a fence file that refuses stale tokens, and a
//!   whole-file write that happens only for an admitted token ([`Fence::write_file`]).
//! - [`status`]: a read-only view of a lease directory (what `flocklease status` prints).
//! - `pg` (feature `postgres`): the same leases across hosts, in a PostgreSQL database.
//! - Feature `tracing`: events for the `tracing` ecosystem at each decision that matters (a
//!   grant with its token and reason, a refusal, a renew lost or slow, a release, a failed
//!   transition, a keep-alive's loss as a warning); the README shows them.
//! - [`error`]: the detail types [`Error`]'s variants carry.
//! - The protocol, every guarantee and what is not promised: [PROTOCOL](https://docs.rs/crate/flocklease/latest/source/docs/PROTOCOL.md) (`docs/PROTOCOL.md`
//!   in the package and the repository). The machinery behind the adapters (the pure transition function `machine`,
//!   its interpreter `driver`, the conformance suite every backend passes) is public only with
//!   the `internals` feature, for the model checker and the fuzz targets.
//!
//! In the protocol's terms: [`SessionLease::acquire`] returns a [`Lease`]
//! `{ session_id, owner, token, expiry }`, or [`Grant::Held`] when another live owner holds it;
//! [`SessionLease::renew`] extends it with the same token; [`SessionLease::release`] gives it
//! up.
//!
//! ```text
//!          acquire: free, released, expired      token := token + 1
//!          or holder crashed
//!   free ─────────────────────────────────────▶ held by A ◀─┐ renew: same token,
//!    ▲                                            │    └────┘ expiry := now + ttl
//!    └──── release: tombstone, same token ◀───────┘
//!   held by A ── A crashes or expires ──▶ B may take over (token + 1)
//! ```
//!
//! # Guarantees
//!
//! - **Fencing.** The token of an id strictly increases with every takeover, never changes on
//!   renew and never goes back, across release, process restart and (with
//!   [`Durability::Full`]) power loss.
//! - **Crash takeover at once.** Each generation keeps its own liveness `flock`, which the
//!   kernel drops when the holding process dies: another process acquires immediately, without
//!   waiting for the expiry.
//! - **Expiry.** An expired lease can always be taken over, even if its holder still runs.
//! - **Stale calls are harmless.** A release or renew of a superseded generation never changes
//!   the record or unlocks a successor.
//! - **Suspension.** A holder suspended past its TTL can still renew if nobody took over.
//! - **Failures are errors, contention is data.** [`Grant::Held`] is never a failure; every
//!   [`Error`] names the file involved; a corrupt record is an error, never "free".
//!
//! # Non-guarantees
//!
//! - Leases are **advisory** and **single-host**: they coordinate cooperating processes that
//!   share one lease directory on one machine. Network file systems are refused by default.
//! - Expiry is wall-clock time: a clock stepped forward can expire a lease early. Use the
//!   token, not the expiry, to fence the protected resource.
//! - A bare lease does not tell its holder when it expires; [`KeepAlive`] does, at the
//!   expiry by the wall clock, and nothing interrupts the holder's work.
//! - Deleting the record by hand resets the token; the crate never deletes it.
//!
//! # Decisions beyond the Go package
//!
//! The choices in the protocol that a reader of the Go package might not expect (the order of a
//! takeover, a failed directory fsync, sweeping, shared directories, descriptors) are listed
//! in [PROTOCOL](https://docs.rs/crate/flocklease/latest/source/docs/PROTOCOL.md) §12.
//!
//! # Architecture
//!
//! One pure transition function, `machine::step`, decides every transition. The real adapter
//! [`FlockLease`], the in-memory adapter [`MemLease`] and the model checker interpret its
//! decisions through one interpreter, `driver::run`; so does `pg::PgLease` (feature
//! `postgres`), the same leases across hosts in a PostgreSQL database.
//!
//! # Examples
//!
//! ```
//! use flocklease::{FlockLease, Grant, Owner, SessionId, SessionLease};
//!
//! # fn main() -> Result<(), flocklease::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let leases = FlockLease::open(dir.path())?;
//! let id = SessionId::new("nightly-report")?;
//!
//! match leases.acquire(&id, &Owner::new("host-a/pid-42")?)? {
//!     Grant::Granted(lease) => {
//!         // Fence writes to the protected resource with `lease.token`.
//!         println!("leased with token {} until {}", lease.token, lease.expiry);
//!         leases.release(&lease)?;
//!     }
//!     Grant::Held => println!("somebody else is running it"),
//! }
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod error;
pub mod fence;
#[cfg(feature = "postgres")]
pub mod pg;
// `status` lives beside the flock backend it reads.
pub use flock::status;
// `mend` too: it repairs what `status` reports unreadable.
pub use flock::mend;
#[cfg(feature = "supervise")]
pub mod supervise;

mod clock;
mod front;
mod keepalive;
mod lease;
mod memory;
mod name;
mod timestamp;
#[cfg(feature = "tracing")]
mod trace;

// The machinery behind the adapters, public only with the `internals` feature (for the model
// checker, the fuzz targets and the crate's own tests; no stability promise): the pure
// transition function, its interpreter, the record codec, the judgement of a commit whose reply
// was lost, the line of waiters' rule, the flock adapter's module (its
// step seam), the fence's file-system seam, the byte-driven checks and the conformance suite every
// backend passes. Without the feature they are private and the documentation does not show
// them.
// Declared one by one, not by a macro: rustfmt and cargo-mutants find a module only by its
// `mod` line.
#[cfg(feature = "internals")]
pub mod checks;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod checks;
#[cfg(feature = "internals")]
pub mod commit;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod commit;
#[cfg(feature = "internals")]
pub mod conformance;
#[cfg(feature = "internals")]
pub mod driver;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod driver;
#[cfg(feature = "internals")]
pub mod flock;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod flock;
#[cfg(feature = "internals")]
pub mod fs;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod fs;
#[cfg(feature = "internals")]
pub mod line;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod line;
#[cfg(feature = "internals")]
pub mod machine;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod machine;
#[cfg(feature = "internals")]
pub mod record;
#[cfg(not(feature = "internals"))]
#[allow(dead_code)]
mod record;

// The fault-injection seam, public only with the `fault-injection` feature (tests only) or
// `internals` (the model checker's simulated directory fails its steps through it).
#[cfg(any(feature = "fault-injection", feature = "internals"))]
pub mod fault;
#[cfg(not(any(feature = "fault-injection", feature = "internals")))]
#[allow(dead_code)]
mod fault;

pub use clock::{Clock, ManualClock, SystemClock};
#[doc(inline)]
pub use error::{Error, ErrorKind, LockOf};
#[doc(inline)]
pub use fence::{Admission, Fence};
pub use flock::{AcquireWait, DEFAULT_LOCK_TIMEOUT, Durability, FlockLease, FlockLeaseBuilder};
/// The one front of every backend: use it as [`FlockLease`], [`MemLease`] or `PgLease`.
pub use front::Leases;
pub use keepalive::{DEFAULT_CLOCK_CHECK, KeepAlive, KeepAliveBuilder, Loss, Lost};
pub use lease::{DEFAULT_TTL, Grant, Lease, LeaseGuard, SessionLease};
pub use memory::{MemLease, MemStore};
pub use name::{MAX_ID_BYTES, MAX_OWNER_BYTES, Owner, SessionId, stem};
pub use record::Record;
pub use timestamp::Timestamp;

/// The README's examples, compiled and run as doctests. Only with the `postgres` and
/// `tracing` features (CI's `--all-features`): those examples are written as a user copies
/// them into a crate that enables the feature, with no `cfg` guard that would compile them to
/// an empty `main` there.
#[cfg(all(doctest, feature = "postgres", feature = "tracing"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
