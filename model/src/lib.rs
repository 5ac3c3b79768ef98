//! A [stateright] model of flocklease at the granularity of its I/O: N lease-manager
//! processes on one host sharing one session id's record, temporary files, transition lock and
//! liveness locks, with a ticking clock, process crashes between any two I/O steps, failing
//! steps and a host crash — and every other actor that touches the lease directory, at any
//! moment: a cleaner (a tmp cleaner or an operator) that deletes or replaces the liveness
//! file, the transition lock, the record or a temporary file with a regular file, a FIFO or a
//! directory; an observer (a waiter, `status`) taking and dropping a shared lock on a liveness
//! file; a prober in the style of the Go package (creating a missing liveness file, taking an
//! exclusive try-lock).
//!
//! Every call is a [`flocklease::driver::Run`] — the very interpreter the real adapters use —
//! and every model action advances one process's run by **one I/O step** (lock the transition
//! lock, read, probe, lock the new generation, write the temporary file, fsync it, rename it,
//! fsync the directory, clean up, adopt, unlock), over [`ModelTx`], which maps each step onto
//! this model's state as `FlockLease` maps it onto files. The order of the steps is the
//! driver's; no lease decision is made here: the model records what happened, and checks it.
//!
//! The safety properties are PROTOCOL §10 ([`props`]). A call's properties are judged when it
//! ends, against what it read under the lock, and leave a mark in [`State::violations`] for an
//! `always` property to see. `sometimes` properties show that each scenario is reachable.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use flocklease::driver::{CommitStep, Grain, Io, Run, Step};
use flocklease::machine::{Event, FinalCheck, Local, Outcome, Then};
use flocklease::{Error, Owner, Record, SessionId, Timestamp};
use stateright::{Model, Property};

mod fence;
pub mod harness;
pub mod line;
pub mod program;
pub mod props;
pub mod report;
pub mod resource;
pub mod run;
pub mod run_schedules;
pub mod threads;
mod tx;

pub use fence::{Fence, FenceIo, schedule};
pub use tx::{Ghost, ModelTx, Seen};

/// Which backend's primitives the model gives the processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Files and `flock(2)`: a liveness lock lasts as long as its process.
    Flock,
    /// PostgreSQL: liveness is a session advisory lock on the holder's connection, which can
    /// be lost while the holder runs; there is no liveness file to delete. A holder keeps its
    /// generation when the connection ends, and its next renew, under the row lock and only
    /// if the row still names the generation, locks it again on a fresh connection.
    Postgres,
}

/// The command-line options that give `check` and `explore` each of
/// [`LeaseModel::alongside_default`]'s configurations, in its order (a planted mistake's
/// `--planted NAME` added); printed under their counterexamples, and run by a test that pins
/// the state counts they give (the first two: the PostgreSQL ones take minutes in a debug
/// build; `check` itself, the main job, runs all five).
pub const ALONGSIDE_OPTIONS: [&str; 5] = [
    "--config moves --faults 0 --max-token 1 --no-host-crash",
    "--config go-records --faults 0 --no-host-crash",
    "--config postgres --standbys 0",
    "--config failover --standbys 1",
    "--config failover --standbys 2",
];

/// The model's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseModel {
    /// The configuration's name, for reports.
    pub name: &'static str,
    /// Number of lease-manager processes (2 by default, up to 3).
    pub procs: usize,
    /// The clock runs from tick 0 to this tick.
    pub max_time: u8,
    /// The lease TTL, in ticks.
    pub ttl_ticks: u8,
    /// No call starts once the record's token exceeds this (calls under way finish, and every
    /// state is checked).
    pub max_token: u64,
    /// How many I/O steps may fail (any fallible step of any call).
    pub faults: u8,
    /// Whether a host crash (every process dies, what was not durable is lost) can happen, once.
    pub host_crash: bool,
    /// How many times the cleaner (a tmp cleaner, an operator) may act — a vanished or
    /// replaced file is not proof of death.
    pub cleaner: u8,
    /// What the cleaner may touch, and how.
    pub tamper: Tamper,
    /// Whether an observer (a waiter, `status`) takes and drops shared locks on the recorded
    /// generation's liveness file.
    pub observer: bool,
    /// Whether a prober in the style of the Go package creates the recorded generation's
    /// liveness file when it is missing and takes and drops exclusive try-locks on it.
    pub go_prober: bool,
    /// A bug planted on purpose, to show that the checker catches it (never in a named
    /// configuration).
    pub planted: Option<Planted>,
    /// Whether the adapter fsyncs (`Durability::Full`). With `false`, a host crash can bring
    /// back an older token.
    pub durable: bool,
    /// Whether every process uses the same owner string (PROTOCOL §3.1: still foreign to each
    /// other).
    pub shared_owner: bool,
    /// The backend.
    pub backend: Backend,
    /// PostgreSQL: how many times a holder's liveness connection may drop while it runs.
    pub liveness_losses: u8,
    /// Whether a process that believes it holds a lease runs fenced sections with it (PROTOCOL
    /// §9), and property \[11\] is checked.
    pub fenced: bool,
    /// PostgreSQL: whether the primary can fail over (once) to its synchronous standby, which
    /// has what it confirmed and no advisory lock. (The standby is always there: a commit's
    /// reply waits for its confirmation, which can lag.)
    pub failover: bool,
    /// Whether records name no liveness tag, as the Go package writes them: a probe then takes
    /// any regular file at the generation's name for its own and lets the lock decide
    /// ([`flocklease::machine::own_liveness`]). The cleaner then replaces a liveness file only
    /// with a FIFO or a directory: a regular file planted at a live Go holder's name reads
    /// dead, the Go package's own rule (PROTOCOL §1.4, §11).
    pub untagged: bool,
    /// PostgreSQL: how many synchronous standbys must confirm a commit before its reply
    /// (`synchronous_standby_names`: 0, none — then no failover; 1; 2, both of two). A commit
    /// whose reply was lost is judged by `commit::verdict` with this many required, and a
    /// failover promotes any of them (each has every commit whose reply came).
    pub standbys: u8,
}

/// What the cleaner may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tamper {
    /// Delete the recorded generation's liveness file.
    pub delete_live: bool,
    /// Replace it with a regular file, a FIFO or a directory.
    pub replace_live: bool,
    /// Delete or replace `<stem>.lock`.
    pub lock: bool,
    /// Replace the record with a regular file that is not a record, a FIFO or a directory.
    /// (Deleting the record is not modelled: it forgets the id, and tokens start over — no
    /// protocol can tell; see the README.)
    pub record: bool,
    /// Delete a transition's temporary record.
    pub temp: bool,
    /// Move the recorded liveness file or `<stem>.lock` aside (a rename, or a hard link and
    /// an unlink: the inode, its tag and its locks go with it) and later put it back at its
    /// name, over whatever stands there.
    pub moves: bool,
}

impl Tamper {
    /// Only deleting the recorded liveness file.
    pub const DELETE_LIVE: Tamper = Tamper {
        delete_live: true,
        replace_live: false,
        lock: false,
        record: false,
        temp: false,
        moves: false,
    };
    /// Deleting or replacing the recorded liveness file.
    pub const LIVE: Tamper = Tamper {
        delete_live: true,
        replace_live: true,
        lock: false,
        record: false,
        temp: false,
        moves: false,
    };
    /// The lock, the record and the temporary records.
    pub const FILES: Tamper = Tamper {
        delete_live: false,
        replace_live: false,
        lock: true,
        record: true,
        temp: true,
        moves: false,
    };
    /// Everything but moves.
    pub const ALL: Tamper = Tamper {
        delete_live: true,
        replace_live: true,
        lock: true,
        record: true,
        temp: true,
        moves: false,
    };
    /// Moving the recorded liveness file or the lock aside and back, and deleting the
    /// liveness file.
    pub const MOVES: Tamper = Tamper {
        delete_live: true,
        replace_live: false,
        lock: false,
        record: false,
        temp: false,
        moves: true,
    };
}

/// A bug planted in the model's steps, for the tests that show the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Planted {
    /// The restore of a deleted liveness file creates it at its final name, then locks it (the
    /// adapter's code before publishing was atomic): a failure of the lock leaves it unlocked.
    CreateThenLock,
    /// PostgreSQL: a holder that sees its liveness connection end locks its generation again
    /// on a fresh connection at once, outside any transition: without the row lock, and
    /// without reading whether the row still names the generation.
    RelockOnNotice,
    /// PostgreSQL: a renew whose liveness connection ended trusts the row alone and commits
    /// without locking its generation again.
    RenewWithoutRelock,
    /// PostgreSQL: an acquire's probe taken at its own step, as if it were a statement of its
    /// own; the adapter's is part of the first statement (speculative, under the row lock), so
    /// a holder that dies in between reads live to the adapter and dead to this model. Not a
    /// bug of the protocol: a model that is not the adapter, which the lockstep must tell.
    LateProbe,
    /// The control of property \[11\]: the application writes after a local check that its
    /// lease has not expired (as `KeepAlive::is_lost()`), with no lock and no read.
    UnfencedWrite,
    /// The fenced section reads and checks the record before it takes the lock (PostgreSQL:
    /// a plain `SELECT`, then the row `FOR SHARE`, not checked again).
    FenceCheckBeforeLock,
    /// The fenced section unlocks before the caller's write (PostgreSQL: the caller's
    /// statements on another connection, after the fenced transaction's `COMMIT`).
    FenceUnlockBeforeWrite,
    /// A restore publishes the liveness file with the tag the record already names (the
    /// adapter before this round): the holder's own file moved aside and put back after the
    /// renew then reads as the generation's own, unlocked: dead.
    RestoreKeepsTag,
    /// PostgreSQL: a commit whose reply was lost counts as soon as the re-read finds the
    /// record, whether or not the standby confirmed it (the library's recovery before
    /// `commit::verdict`: it ended its own session, which keeps the commit on the primary
    /// alone).
    RereadAfterTerminate,
    /// PostgreSQL: a commit whose reply was lost counts once one standby confirmed it, however
    /// many are required (a reading of `synchronous_standby_names` that stops at the first
    /// name).
    OneStandbyEnough,
    /// The transition lock given back as the cleanup begins, before the cleanup and the
    /// adoption (a driver that schedules the unlock right after the commit).
    UnlockBeforeCleanup,
}

/// The named configurations `check --config NAME` knows.
pub const CONFIGS: [&str; 8] = [
    "default",
    "large",
    "long",
    "shared-owner",
    "postgres",
    "failover",
    "moves",
    "go-records",
];

impl Default for LeaseModel {
    /// The default configuration: what `check` runs and CI checks first.
    fn default() -> Self {
        LeaseModel {
            name: "default",
            procs: 2,
            max_time: 2,
            ttl_ticks: 2,
            max_token: 2,
            faults: 1,
            host_crash: true,
            cleaner: 1,
            tamper: Tamper::LIVE,
            observer: false,
            go_prober: true,
            planted: None,
            durable: true,
            shared_owner: false,
            backend: Backend::Flock,
            liveness_losses: 0,
            fenced: true,
            failover: false,
            untagged: false,
            standbys: 1,
        }
    }
}

impl LeaseModel {
    /// The named configuration `name` (see [`CONFIGS`]).
    pub fn named(name: &str) -> Option<LeaseModel> {
        let d = LeaseModel::default();
        Some(match name {
            "default" => d,
            // The other actors: the cleaner deletes or replaces `<stem>.lock`, replaces the
            // record or deletes a temporary record, and an observer share-locks liveness
            // files (the default configuration has the liveness file's deletion and
            // replacement and the Go-style prober).
            "large" => LeaseModel {
                name: "large",
                tamper: Tamper::FILES,
                observer: true,
                go_prober: false,
                // Its cleaner deletes <stem>.lock: a fenced section's known window (README).
                fenced: false,
                ..d
            },
            // Longer histories: more ticks and one more generation, the liveness file's
            // deletion the only tampering.
            "long" => LeaseModel {
                name: "long",
                max_time: 3,
                max_token: 3,
                tamper: Tamper::DELETE_LIVE,
                go_prober: false,
                fenced: false,
                ..d
            },
            "shared-owner" => LeaseModel {
                name: "shared-owner",
                shared_owner: true,
                ..d
            },
            "postgres" => LeaseModel {
                name: "postgres",
                backend: Backend::Postgres,
                cleaner: 0,
                observer: false,
                go_prober: false,
                host_crash: false,
                liveness_losses: 1,
                ..d
            },
            // A primary with a synchronous standby that fails over once: commits whose reply
            // was lost, the re-read's judgement, the promotion. (The failover ends every
            // holder's liveness itself, so no other loss; no fenced sections.)
            "failover" => LeaseModel {
                name: "failover",
                backend: Backend::Postgres,
                cleaner: 0,
                observer: false,
                go_prober: false,
                host_crash: false,
                failover: true,
                fenced: false,
                ..d
            },
            // Records without a tag (the Go package's): the probe judges the file at the
            // name by its type and its lock.
            // The cleaner moves the holder's liveness file or the lock aside (a rename, or a
            // hard link and an unlink) and puts it back later, or deletes the liveness file.
            "moves" => LeaseModel {
                name: "moves",
                tamper: Tamper::MOVES,
                go_prober: false,
                // A lock moved aside during a fenced section: the known window (README).
                fenced: false,
                ..d
            },
            "go-records" => LeaseModel {
                name: "go-records",
                untagged: true,
                go_prober: false,
                ..d
            },
            _ => return None,
        })
    }

    /// The lease directory's other adversaries, in bounds small enough to be checked with the
    /// default configuration (`check` with no `--config` and no option shaping the model runs
    /// them after it, with its planted bug): the cleaner that moves the liveness file or the lock aside and
    /// puts it back (`moves`, without the fault and the host crash, no call past token 1:
    /// 649 k states, 4 s), and records without a tag (`go-records` without the fault and the
    /// host crash: 437 k states, 2.3 s). Their named configurations explore more (`moves`:
    /// 48 M states; CI runs it with the host crash, and `go-records` whole).
    ///
    /// And PostgreSQL's commit verdict (`commit::verdict`) with no required standby, one and
    /// two: `postgres` with none (a lost reply counts once the re-read finds it; no failover:
    /// 261 k states, 2 s), `failover` with its one (1.0 M states, 6 s) and with two, either of
    /// which the failover may promote (1.3 M states, 9 s).
    pub fn alongside_default(&self) -> [LeaseModel; 5] {
        // ALONGSIDE_OPTIONS says the same on the command line.
        let named = |name| LeaseModel::named(name).expect("a named configuration");
        [
            LeaseModel {
                name: "moves (small)",
                faults: 0,
                max_token: 1,
                host_crash: false,
                planted: self.planted,
                ..named("moves")
            },
            LeaseModel {
                name: "go-records (small)",
                faults: 0,
                host_crash: false,
                planted: self.planted,
                ..named("go-records")
            },
            LeaseModel {
                name: "postgres, no required standby",
                standbys: 0,
                planted: self.planted,
                ..named("postgres")
            },
            LeaseModel {
                name: "failover, one required standby",
                standbys: 1,
                planted: self.planted,
                ..named("failover")
            },
            LeaseModel {
                name: "failover, two required standbys",
                standbys: 2,
                planted: self.planted,
                ..named("failover")
            },
        ]
    }

    /// Every actor and action of this configuration, in one sentence: what `--help` says of
    /// each named configuration, generated from its fields so that it cannot drift.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!(
            "{} {} processes calling acquire, renew and release step by step (one system call \
             or statement a step) and crashing at any step{}",
            self.procs,
            match self.backend {
                Backend::Flock => "flock",
                Backend::Postgres => "PostgreSQL",
            },
            if self.fenced {
                ", and running fenced sections"
            } else {
                ""
            }
        )];
        parts.push(format!(
            "the clock ticking from 0 to {}, TTL {} ticks, tokens up to {}{}",
            self.max_time,
            self.ttl_ticks,
            self.max_token,
            if self.shared_owner {
                ", one owner string for every process"
            } else {
                ""
            }
        ));
        match self.faults {
            0 => parts.push("no failing I/O step".into()),
            1 => parts.push("1 failing I/O step".into()),
            n => parts.push(format!("{n} failing I/O steps")),
        }
        if self.host_crash {
            parts.push("a host crash".into());
        }
        if self.cleaner > 0 && self.backend == Backend::Flock {
            let t = self.tamper;
            let what: Vec<&str> = [
                (t.delete_live, "deleting the recorded liveness file"),
                (t.replace_live, "replacing it"),
                (t.lock, "deleting or replacing <stem>.lock"),
                (t.record, "replacing the record"),
                (t.temp, "deleting a temporary record"),
                (
                    t.moves,
                    "moving the liveness file or the lock aside and putting it back",
                ),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, s)| *s)
            .collect();
            let times = match self.cleaner {
                1 => "once".to_owned(),
                n => format!("up to {n} times"),
            };
            parts.push(format!("the cleaner {} ({times})", what.join(", ")));
        }
        if self.observer {
            parts.push("an observer (waiter, status) share-locking liveness files".into());
        }
        if self.go_prober {
            parts.push("the Go-style prober creating and exclusively try-locking them".into());
        }
        if self.backend == Backend::Postgres {
            parts.push(format!(
                "a synchronous standby whose confirmation of commits can lag (a commit's reply \
                 waits for it; a lost reply is recovered by re-reading the row){}",
                if self.failover {
                    ", and a failover to it"
                } else {
                    ""
                }
            ));
        }
        if self.liveness_losses > 0 {
            parts.push(format!(
                "liveness lost {} while its holder runs (the server ending the session first, \
                 or the holder seeing its connection break while the session lives on), and \
                 the renew that locks the generation again",
                match self.liveness_losses {
                    1 => "once".to_owned(),
                    n => format!("up to {n} times"),
                }
            ));
        }
        if !self.durable {
            parts.push("Durability::NoSync".into());
        }
        if self.untagged {
            parts.push(
                "records without a liveness tag (the Go package's: a regular file at the \
                 name is the generation's, its lock decides; the cleaner plants no regular \
                 file there)"
                    .into(),
            );
        }
        parts.join("; ")
    }

    /// The owner string of process `p`.
    pub fn owner(&self, p: usize) -> Owner {
        if self.shared_owner {
            owner(0)
        } else {
            owner(p)
        }
    }
}

/// A process, as its own memory knows itself.
#[derive(Clone, Debug, Default)]
pub struct Proc {
    /// The generation whose liveness lock it keeps open.
    pub local: Option<Local>,
    /// The lease it believes it holds (from its last successful acquire or renew).
    pub lease: Option<LeaseView>,
    /// A lease it held earlier, kept to replay (a stale renew or release).
    pub stale: Option<LeaseView>,
    /// The call under way, if any.
    pub call: Option<Call>,
    /// PostgreSQL: the local generation's liveness connection, once it is no longer intact
    /// (until a renew locks the generation again, or the generation is closed).
    pub loss: Option<Loss>,
    /// The `<stem>.lock` file (by its inode) whose lock it holds.
    pub stable: Option<u8>,
    /// A directory listing a takeover left to its next transition (below this token).
    pub sweep: Option<u64>,
    /// The listing the call under way carries, run when it unlocks.
    pub carried: Option<u64>,
    /// The fenced section under way, if any (never at the same time as a call: calls and
    /// sections on one id are serialized in the process).
    pub fence: Option<Fence>,
    /// PostgreSQL: the fenced section holds the row `FOR SHARE`.
    pub share: bool,
    /// For display only (not part of the state's identity): its last call and the answer.
    pub last: Option<(Kind, Said)>,
}

impl Proc {
    /// Leaves a listing below `below` to the next transition.
    pub(crate) fn keep_sweep(&mut self, below: u64) {
        self.sweep = Some(self.sweep.map_or(below, |b| b.max(below)));
    }

    fn key(&self) -> impl Hash + PartialEq + '_ {
        (
            (&self.local, self.lease, self.stale, &self.call, self.loss),
            (
                self.stable,
                self.sweep,
                self.carried,
                self.fence,
                self.share,
            ),
        )
    }
}

impl PartialEq for Proc {
    fn eq(&self, o: &Proc) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Proc {}
impl Hash for Proc {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.key().hash(h);
    }
}

/// PostgreSQL: how a process's liveness connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loss {
    /// The generation whose lock the connection held.
    pub token: u64,
    /// Whether the process has seen the connection end (and was told: `on_liveness_lost`).
    /// Until then its adapter counts the connection as live, and a renew does not lock the
    /// generation again.
    pub noticed: bool,
}

/// PostgreSQL: which end of a liveness connection learns first that it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cut {
    /// The server ends the session (`pg_terminate_backend`, `idle_session_timeout`, a
    /// restart): its locks go at once; the holder sees the connection end a moment later.
    ServerFirst,
    /// The holder sees the connection break (its keepalives, `tcp_user_timeout`) while the
    /// server's session lives on, holding its locks, until the server's own keepalives end
    /// it.
    ClientFirst,
}

/// A call under way: the driver's run and what the properties need to know about it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Call {
    /// What was called.
    pub kind: Kind,
    /// The lease it was called with (renew, release).
    pub view: Option<LeaseView>,
    /// The driver's progress.
    pub run: Run<u64>,
    /// What it saw and did.
    pub ghost: Ghost,
    /// The front's final expiry check of this call (after one renew or more, the run is such
    /// a renew, of the lease the call granted).
    pub check: FinalCheck,
}

/// What a call answered, for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Said {
    /// Granted this token, expiring at this tick.
    Granted(u64, u8),
    /// Held (acquire) or lost (renew).
    Held,
    /// Released.
    Released,
    /// An error.
    Failed,
    /// Crashed during the call.
    Crashed,
}

/// What a process knows of a lease it was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseView {
    /// The fencing token.
    pub token: u64,
    /// The expiry, in ticks.
    pub expiry: u8,
}

/// A transition's temporary record file (each transition writes its own).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Temp {
    /// What was written to it.
    pub record: Record,
    /// The liveness tag it names (the publishing process).
    pub tag: Option<usize>,
    /// Whether its contents were fsynced.
    pub synced: bool,
}

/// What stands at a liveness file's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum What {
    /// A file process `p` published: it carries `p`'s tag.
    Own(usize),
    /// A regular file without a tag (planted, or created by the Go-style prober).
    Plain,
    /// A FIFO.
    Fifo,
    /// A directory.
    Dir,
}

/// Who holds an exclusive lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Locker {
    /// A lease-manager process.
    Proc(usize),
    /// The Go-style prober.
    Go,
    /// PostgreSQL: a server session of process `p` whose connection `p` has seen end (or
    /// that outlived `p`), which the server has not ended yet: it still holds its locks.
    Ended(usize),
}

/// The file at a liveness name and its locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveFile {
    /// What it is.
    pub what: What,
    /// Its exclusive lock's holder.
    pub holder: Option<Locker>,
    /// Whether the observer holds a shared lock on it.
    pub shared: bool,
    /// Published by a restore whose record is not committed yet: it carries a fresh tag,
    /// which the record does not name until the renew commits (a probe reads it as not the
    /// generation's own).
    pub restored: bool,
    /// Carries a tag no record names any more, nor ever will: an earlier file of its
    /// generation, moved aside, whose holder's renew has since committed a record naming
    /// the file that replaced it.
    pub old: bool,
}

/// What the cleaner puts at a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plant {
    /// A regular file (empty, or anything but the expected contents).
    Plain,
    /// A FIFO.
    Fifo,
    /// A directory.
    Dir,
}

/// What stands at `<stem>.lock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockAt {
    /// A regular file, by inode (a replacement is a new inode).
    File(u8),
    /// Nothing: the next locker creates it.
    Missing,
    /// A FIFO or a directory: every call fails, naming it.
    NotAFile,
}

/// What the cleaner touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The recorded generation's liveness file.
    Live,
    /// `<stem>.lock`.
    Lock,
    /// The record.
    Record,
    /// Process `p`'s temporary record.
    Temp(usize),
}

/// What the cleaner does to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// Deletes it.
    Delete,
    /// Replaces it.
    Replace(Plant),
    /// Moves it aside (the inode, its tag and its locks intact, away from the name).
    MoveAside,
    /// Puts what was moved aside back at its name (the second half of the same act).
    PutBack,
}

/// The whole system.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The time, in ticks.
    pub now: u8,
    /// The record as every process sees it.
    pub record: Option<Record>,
    /// Whether the visible record's contents were fsynced before its rename.
    pub record_synced: bool,
    /// The liveness tag the visible record names (the process that published its
    /// generation).
    pub record_tag: Option<usize>,
    /// A plant standing at the record's name (the visible record is then unreadable; `record`
    /// keeps the last one committed).
    pub record_bad: Option<Plant>,
    /// The record as it would be after a power loss.
    pub durable: Option<Record>,
    /// The tag the durable record names.
    pub durable_tag: Option<usize>,
    /// PostgreSQL with two required standbys: the second standby's copy of the record, and
    /// the tag it names (`durable` is the first one's).
    pub durable2: (Option<Record>, Option<usize>),
    /// Each process's temporary record file, if it has one.
    pub temps: Vec<Option<Temp>>,
    /// What stands at `<stem>.lock`.
    pub lock_at: LockAt,
    /// The inode number the next created `<stem>.lock` gets.
    pub next_lock: u8,
    /// Liveness files by token.
    pub live: BTreeMap<u64, LiveFile>,
    /// A liveness file the cleaner moved aside (its generation's token, the file), to put
    /// back.
    pub aside_live: Option<(u64, LiveFile)>,
    /// The inode of a `<stem>.lock` the cleaner moved aside, to put back.
    pub aside_lock: Option<u8>,
    /// The processes.
    pub procs: Vec<Proc>,
    /// Failing steps left to inject.
    pub faults_left: u8,
    /// Whether the host crash is still to come.
    pub host_crash_left: bool,
    /// PostgreSQL: whether the failover is still to come.
    pub failover_left: bool,
    /// How many more times the cleaner may act.
    pub cleaner_left: u8,
    /// Ghost: the cleaner acted (failures it causes are not faults).
    pub tampered: bool,
    /// PostgreSQL: liveness losses left to inject.
    pub losses_left: u8,
    /// Ghost: the highest token ever reported granted to a caller.
    pub max_granted: u64,
    /// Ghost: the token of the last new generation committed.
    pub max_committed: u64,
    /// The protected resource: the highest token whose write it accepted. Shown in traces,
    /// not part of the state's identity: no step reads it, and property \[11\] is judged when
    /// a write is accepted, so keeping it apart only multiplies states.
    pub written: Shown<Written>,
    /// Ghost: the notable scenario the last step completed, if any.
    pub scenario: Option<Scenario>,
    /// Ghost: the call properties some call broke, one bit each
    /// ([`props::CALL_PROPERTIES`]).
    pub violations: u16,
}

impl State {
    /// The recorded generation's token, for a record that is not a tombstone.
    pub fn held_token(&self) -> Option<u64> {
        self.record
            .as_ref()
            .filter(|r| !r.is_tombstone())
            .map(|r| r.token)
    }

    /// Which process holds the transition lock on the file at `<stem>.lock`.
    pub fn lock_holder(&self) -> Option<usize> {
        let LockAt::File(i) = self.lock_at else {
            return None;
        };
        self.procs.iter().position(|p| p.stable == Some(i))
    }
}

/// A value carried in a state for display only: every two are equal and hash alike, so it
/// never tells two states apart. Only for what no step and no property reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shown<T>(pub T);

impl<T> PartialEq for Shown<T> {
    fn eq(&self, _: &Shown<T>) -> bool {
        true
    }
}
impl<T> Eq for Shown<T> {}
impl<T> Hash for Shown<T> {
    fn hash<H: Hasher>(&self, _: &mut H) {}
}

/// What the protected resource accepted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Written {
    /// The highest token whose write it accepted (0: none yet).
    pub highest: u64,
    /// The last write it accepted: its token, and the token of the last new generation
    /// committed at that moment.
    pub last: Option<(u64, u64)>,
}

/// A notable scenario, for the `sometimes` properties.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// An acquire took over the lease of a crashed holder before its expiry.
    TakeoverAfterCrash,
    /// An acquire took over an expired lease whose holder still runs.
    TakeoverOfExpiredRunningHolder,
    /// A renew succeeded for a lease that had expired (the holder was suspended).
    RenewAfterSuspension,
    /// A stale release ran while a successor held the lease.
    StaleReleaseAfterSuccessor,
    /// A lease was granted after a host crash.
    GrantAfterHostCrash,
    /// PostgreSQL: a new generation was granted after the failover.
    GrantAfterFailover,

    /// A failed step left the process able to retry.
    FailedStep,
    /// An acquire was refused although the holder's liveness file had vanished: the unexpired
    /// record still protected the holder.
    HeldDespiteMissingFile,
    /// An acquire was refused although a file that is not the holder's stood at its liveness
    /// file's name (a FIFO, a directory, another regular file).
    HeldDespiteReplacedFile,
    /// A transition found its transition lock replaced and committed nothing.
    LockReplacedRefused,
    /// A process crashed after its rename and before its call ended.
    CrashAfterCommit,
    /// PostgreSQL: a rival took over while the old holder, its liveness lost, still ran.
    TakeoverAfterLivenessLoss,
    /// PostgreSQL: a renew (or refresh) was granted after it locked its generation again on a
    /// fresh connection.
    RenewRelocked,
    /// PostgreSQL: a renew's re-lock found the generation still locked by the holder's old
    /// session, not yet ended on the server; the renew failed (a later one retries).
    RelockBusy,
    /// PostgreSQL: the server ended the session holding a new generation's lock after its
    /// call committed and before the call adopted it.
    LostBeforeAdopt,
    /// The resource accepted a write.
    FencedWrite,
    /// A fenced section was refused: the record names a successor.
    FenceRefusedAfterSuccessor,
    /// PostgreSQL: a fenced section's re-check found the lease expired; it rolled back.
    FenceRecheckRefused,
    /// A grant expired before its call returned; the front renews it first (PROTOCOL §5.3).
    ReturnedAfterRenew,
}

/// The failure a step is taken with, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// An injected I/O failure (PostgreSQL's commit: its reply lost after the commit).
    Io,
    /// PostgreSQL: the commit statement answered with an error ([`Action::Refuse`]).
    Refused,
    /// PostgreSQL: the commit's reply lost, and the first standby confirmed the commit before
    /// the adapter's re-read ([`Action::FailCaughtUp`]).
    CaughtUp,
}

/// A step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Process `p` calls: the call takes the transition lock (its first I/O step).
    Call(usize, Kind),
    /// Process `p` performs the next I/O step of its call (named for the reader: it is the
    /// one its run schedules next).
    Step(usize, Io),
    /// Process `p` performs the next I/O step of its call, and that step fails.
    Fail(usize, Io),
    /// PostgreSQL: process `p`'s commit statement is answered with an error (the server refused
    /// it, a statement timeout): nothing is committed, and a generation lock the statement took
    /// goes with its session, which the adapter ends. (An injected failure of the commit step,
    /// [`Action::Fail`], is its reply lost after the commit.)
    Refuse(usize),
    /// PostgreSQL: process `p` commits, its reply is lost, and by the adapter's re-read (it
    /// looks again until its deadline) the first synchronous standby has confirmed the commit
    /// (with two required, the second has not): the re-read's judgement sees a standby
    /// confirmation other than none.
    FailCaughtUp(usize),
    /// Process `p` crashes and restarts with no local state, keeping only a copy of its last
    /// lease to replay.
    Crash(usize),
    /// The clock ticks.
    Tick,
    /// The host crashes: every process dies, undurable writes are lost.
    HostCrash,
    /// The cleaner acts.
    Tamper(Target, Change),
    /// The observer takes a shared try-lock on the recorded generation's liveness file.
    ObserverLock,
    /// The observer drops its shared lock.
    ObserverUnlock,
    /// The Go-style prober opens the recorded generation's liveness file, creating it.
    GoCreate,
    /// The Go-style prober takes an exclusive try-lock on it.
    GoLock,
    /// The Go-style prober drops its lock.
    GoUnlock,
    /// PostgreSQL: process `p`'s liveness connection ends, one end learning it first.
    LoseLiveness(usize, Cut),
    /// PostgreSQL: process `p` sees its liveness connection end (after the server ended it).
    NoticeLoss(usize),
    /// PostgreSQL: the server ends process `p`'s session that `p` had given up; its locks go.
    SessionEnds(usize),
    /// PostgreSQL, planted bug [`Planted::RelockOnNotice`]: process `p` locks its generation
    /// again on a fresh connection, outside any transition.
    Relock(usize),
    /// PostgreSQL: the synchronous standby confirms the primary's WAL up to now (it has the
    /// visible record).
    StandbyConfirms,
    /// PostgreSQL, two required standbys: the second one confirms.
    SecondStandbyConfirms,
    /// PostgreSQL: the primary fails; the standby is promoted with what it confirmed, and no
    /// advisory lock; every client's connections break.
    Failover,
    /// PostgreSQL, two required standbys: the failover promotes the second one.
    FailoverToSecond,
    /// Process `p` starts a fenced section with its lease and takes its first step.
    Fence(usize),
    /// Process `p` takes the next step of its fenced section.
    FenceStep(usize, FenceIo),
}

/// What a process calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Acquire.
    Acquire,
    /// Renew its current lease.
    Renew,
    /// Release its current lease.
    Release,
    /// Renew the stale lease it kept.
    RenewStale,
    /// Release the stale lease it kept.
    ReleaseStale,
}

/// The owner string of process `p` (when owners are not shared).
pub fn owner(p: usize) -> Owner {
    // "p0", "p1", ... are valid owners: non-empty, short, no control characters.
    Owner::new(format!("p{p}")).expect("valid owner")
}

/// The one session id of the model.
pub fn session() -> SessionId {
    SessionId::new("model").expect("valid id")
}

/// Tick `t` as a timestamp.
pub fn at(t: u8) -> Timestamp {
    Timestamp::from_unix_secs(i64::from(t)).expect("in range")
}

/// A timestamp of the model as ticks.
pub fn ticks(t: Timestamp) -> u8 {
    // Every timestamp in the model is a whole number of seconds below 256.
    u8::try_from(t.unix_nanos() / 1_000_000_000).expect("model time fits in u8")
}

impl LeaseModel {
    /// The initial state of this configuration.
    pub fn initial(&self) -> State {
        self.init_states().remove(0)
    }

    /// Runs `event` as process `p` at the state's time, every step at once with no fault and
    /// no interleaving: the reference the adapters are compared against in property tests.
    ///
    /// # Errors
    ///
    /// What the interpreter reports (token exhausted, a busy liveness lock).
    pub fn apply(&self, state: &mut State, p: usize, event: Event) -> Result<Outcome, Error> {
        let mut run = Run::new(self.grain(), event, self.ttl());
        let mut ghost = Ghost::default();
        state.procs[p].carried = state.procs[p].sweep.take();
        loop {
            let (step, (g, _)) = self.advance(state, p, &mut run, ghost, Fault::None);
            ghost = g;
            match step {
                Step::Done(result) => {
                    let proc = &mut state.procs[p];
                    if let Some(below) = proc.carried.take() {
                        proc.keep_sweep(below);
                    }
                    return result;
                }
                Step::Continue => {}
                Step::Blocked => panic!("transition lock held by another process"),
            }
        }
    }

    /// Process `p` crashes: its locks vanish, it forgets everything.
    pub fn crash(&self, state: &mut State, p: usize) {
        crash(state, p);
    }

    /// The grain of this configuration's backend: what one of its steps is.
    pub fn grain(&self) -> Grain {
        match self.backend {
            Backend::Flock => Grain::SystemCall,
            Backend::Postgres => Grain::Statement,
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(u64::from(self.ttl_ticks))
    }

    /// Advances `run` of process `p` by one I/O step; returns its result and what the
    /// transaction noted (and whether an armed fault fired).
    fn advance(
        &self,
        state: &mut State,
        p: usize,
        run: &mut Run<u64>,
        ghost: Ghost,
        fault: Fault,
    ) -> (Step, (Ghost, bool)) {
        let mut tx = ModelTx {
            state,
            p,
            fault: fault != Fault::None,
            refuse: fault == Fault::Refused,
            caught_up: fault == Fault::CaughtUp,
            fired: false,
            durable: self.durable,
            backend: self.backend,
            untagged: self.untagged,
            standbys: self.standbys,
            planted: self.planted,
            speculate: self.backend == Backend::Postgres
                && matches!(run.event(), Event::Acquire { .. }),
            ghost,
        };
        let step = run.next(&mut tx, &session());
        (step, (tx.ghost, tx.fired))
    }

    /// The event process `p`'s call of `kind` carries from state `s`: acquire for its owner,
    /// or renew and release of the lease (current or stale) it holds there.
    pub fn call_event(&self, s: &State, p: usize, kind: Kind) -> Event {
        self.event(p, kind, Self::view(s, p, kind))
    }

    fn view(s: &State, p: usize, kind: Kind) -> Option<LeaseView> {
        match kind {
            Kind::Acquire => None,
            Kind::Renew | Kind::Release => s.procs[p].lease,
            Kind::RenewStale | Kind::ReleaseStale => s.procs[p].stale,
        }
    }

    fn event(&self, p: usize, kind: Kind, view: Option<LeaseView>) -> Event {
        let owner = self.owner(p);
        match (kind, view) {
            (Kind::Acquire, _) => Event::Acquire { owner },
            (Kind::Renew | Kind::RenewStale, Some(v)) => Event::Renew {
                owner,
                token: v.token,
            },
            (Kind::Release | Kind::ReleaseStale, Some(v)) => Event::Release {
                owner,
                token: v.token,
            },
            // actions() only offers lease operations to processes that have that lease.
            _ => unreachable!("no lease to operate on"),
        }
    }

    /// Process `p` starts a call and takes its first step; `None` if that is not possible.
    fn call(&self, last: &State, p: usize, kind: Kind) -> Option<State> {
        let view = Self::view(last, p, kind);
        let mut s = last.clone();
        s.scenario = None;
        // The listing an earlier takeover left goes with this call.
        s.procs[p].carried = s.procs[p].sweep.take();
        s.procs[p].call = Some(Call {
            kind,
            view,
            run: Run::new(self.grain(), self.event(p, kind, view), self.ttl()),
            ghost: Ghost::default(),
            check: FinalCheck::default(),
        });
        self.step(&s, p, Fault::None)
    }

    /// Process `p` performs one I/O step (failing if `fault`); `None` if it cannot.
    fn step(&self, last: &State, p: usize, fault: Fault) -> Option<State> {
        let severed = Self::severed(last, p);
        if fault != Fault::None && severed {
            // A severed call's next fallible step fails anyway: that is its plain step.
            return None;
        }
        let mut s = last.clone();
        s.scenario = None;
        let mut call = s.procs[p].call.take()?;
        let ghost = std::mem::take(&mut call.ghost);
        let (step, (ghost, fired)) = self.advance(
            &mut s,
            p,
            &mut call.run,
            ghost,
            if severed { Fault::Io } else { fault },
        );
        call.ghost = ghost;
        if fault != Fault::None && !fired {
            // An armed fault that would not fire is no step of the model.
            return None;
        }
        if fired && severed {
            // The failover's doing, not an injected fault.
            call.ghost.severed = false;
        } else if fired {
            s.faults_left -= 1;
        }
        match step {
            Step::Blocked => return None,
            Step::Continue => s.procs[p].call = Some(call),
            Step::Done(result) => {
                let proc = &mut s.procs[p];
                if let Some(below) = proc.carried.take() {
                    proc.keep_sweep(below);
                }
                props::observe(self, &mut s, p, &call, fired, &result);
                if matches!(result, Err(Error::LockReplaced { .. })) {
                    s.scenario = Some(Scenario::LockReplacedRefused);
                }
                self.at_return(&mut s, p, call, result);
            }
        }
        Some(s)
    }

    /// The front's final expiry check (PROTOCOL §5.3) on the answer process `p`'s run just
    /// gave, the adapters' own `machine::FinalCheck` against the model's clock: the answer
    /// returned, the grant renewed first (the call goes on with a renew of it, whose steps
    /// interleave like any other), or the call answered lost (an expired grant after the
    /// renews, or a renew of the check that failed).
    fn at_return(&self, s: &mut State, p: usize, mut call: Call, result: Result<Outcome, Error>) {
        let answered_held = matches!(result, Ok(Outcome::Held));
        let granted_expiry = match result {
            Ok(Outcome::Granted { expiry, .. }) => ticks(expiry),
            _ => 0,
        };
        match call.check.next(result, || at(s.now)) {
            Then::Return(Ok(Outcome::Granted { expiry, .. })) => {
                if ticks(expiry) <= s.now {
                    s.violations |= props::bit(props::names::RETURNED_EXPIRED);
                }
            }
            Then::Return(Ok(Outcome::Held)) if !answered_held => {
                let proc = &mut s.procs[p];
                proc.stale = proc.lease.take();
                proc.last = Some((call.kind, Said::Held));
            }
            // [7] judged on the call's answer too: a call one of whose runs committed a grant
            // (it asked for a renew) answers no error.
            Then::Return(Err(_)) if call.check.renewed() > 0 => {
                s.violations |= props::bit(props::names::NO_FAILURE_AFTER_COMMIT);
            }
            Then::Return(_) => {}
            Then::Renew { token } => {
                let view = LeaseView {
                    token,
                    expiry: granted_expiry,
                };
                s.scenario = Some(Scenario::ReturnedAfterRenew);
                s.procs[p].call = Some(Call {
                    kind: Kind::Renew,
                    view: Some(view),
                    run: Run::new(
                        self.grain(),
                        self.event(p, Kind::Renew, Some(view)),
                        self.ttl(),
                    ),
                    ghost: Ghost::default(),
                    check: call.check,
                });
            }
        }
    }

    /// PostgreSQL: whether process `p`'s call lost its connections to a failover before its
    /// commit's reply came, and its next step is a statement (a fallible step), which then
    /// fails. (Past the reply, its remaining steps are the client's own.)
    fn severed(s: &State, p: usize) -> bool {
        s.procs[p]
            .call
            .as_ref()
            .is_some_and(|c| c.ghost.severed && !c.ghost.renamed && c.run.next_can_fail())
    }

    /// Whether process `p` can take the next step of its call (or start one).
    fn can_step(s: &State, p: usize, run: Option<&Run<u64>>) -> bool {
        let lock_free = s.lock_free_for(p);
        match run {
            None => lock_free,
            Some(r) if r.next_locks() => lock_free,
            Some(r) => r.peek().is_some(),
        }
    }
}

/// PostgreSQL: the standby is promoted with what it confirmed. No advisory lock survives
/// (they are not replicated), so every process whose generation was locked has lost its
/// liveness (told when it sees its connection end); every call under way loses its
/// transaction (its row lock goes; its commit fails, or its reply never comes).
fn failover(s: &mut State) {
    s.record = s.durable.clone();
    s.record_tag = s.durable_tag;
    // Every standby follows the promoted one from here (a copy ahead of it is rebuilt).
    if s.durable2.0.is_some() {
        s.durable2 = (s.record.clone(), s.record_tag);
    }
    s.record_synced = true;
    // Commits the standby did not have are gone; nobody was told of them (property
    // NEVER_BACK: a reported grant was confirmed).
    s.max_committed = s.durable.as_ref().map_or(0, |r| r.token);
    for f in s.live.values_mut() {
        f.holder = None;
        f.shared = false;
    }
    for p in 0..s.procs.len() {
        // The generation the process keeps (a new one its call committed, or else its local
        // one) loses its lock: the process learns it. A loss recorded of another generation
        // (the local one the committed call supersedes, which that call closes) gives way to
        // it.
        if let Some(token) = LeaseModel::liveness_token(s, p)
            && s.procs[p].loss.is_none_or(|l| l.token != token)
        {
            s.procs[p].loss = Some(Loss {
                token,
                noticed: false,
            });
        }
        let proc = &mut s.procs[p];
        // A transaction not yet committed loses its row lock. (One past its commit released
        // it with its `COMMIT`: its remaining steps are the client's own.)
        if proc.call.as_ref().is_none_or(|c| !c.ghost.renamed) {
            proc.stable = None;
        }
        if let Some(c) = proc.call.as_mut() {
            c.ghost.severed = true;
            // A re-lock's fresh connection ended too: the holder is told again.
            c.ghost.lost_again |= c.ghost.knew_lost;
        }
    }
    s.failover_left = false;
}

/// The record's file was replaced: every call that has read it will refuse to commit.
pub(crate) fn record_changed(s: &mut State) {
    for proc in &mut s.procs {
        if let Some(c) = proc.call.as_mut()
            && c.ghost.seen.is_some()
        {
            c.ghost.record_changed = true;
        }
    }
}

fn crash(s: &mut State, p: usize) {
    // The kernel drops the process's flocks (liveness locks and the transition lock); its
    // files stay. (Its temporary record stays too, under its own name, until a listing: no
    // transition reads or renames another's, so the model forgets it.)
    for f in s
        .live
        .values_mut()
        .chain(s.aside_live.as_mut().map(|(_, f)| f))
    {
        if f.holder == Some(Locker::Proc(p)) {
            f.holder = None;
        }
    }
    s.temps[p] = None;
    if s.procs[p].call.as_ref().is_some_and(|c| c.ghost.renamed) {
        s.scenario = Some(Scenario::CrashAfterCommit);
    }
    // The restarted process has no local state, but may replay a copy of the lease it held
    // (persisted by the application, or handed over): a lease this instance never acquired.
    let proc = &mut s.procs[p];
    let copy = proc.lease.or(proc.stale);
    let last = proc.call.as_ref().map(|c| (c.kind, Said::Crashed));
    *proc = Proc {
        stale: copy,
        last: last.or(proc.last),
        ..Proc::default()
    };
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            record: None,
            record_synced: false,
            record_tag: None,
            record_bad: None,
            durable: None,
            durable_tag: None,
            durable2: (None, None),
            temps: vec![None; self.procs],
            lock_at: LockAt::Missing,
            next_lock: 0,
            live: BTreeMap::new(),
            aside_live: None,
            aside_lock: None,
            procs: vec![Proc::default(); self.procs],
            faults_left: self.faults,
            host_crash_left: self.host_crash,
            failover_left: self.failover && self.backend == Backend::Postgres && self.standbys > 0,
            cleaner_left: self.cleaner,
            tampered: false,
            losses_left: self.liveness_losses,
            max_granted: 0,
            max_committed: 0,
            written: Shown(Written::default()),
            scenario: None,
            violations: 0,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Past the token bound only the calls under way go on, so the grant that crossed
        // the bound is reported and checked.
        let beyond = s.record.as_ref().is_some_and(|r| r.token > self.max_token);
        for (p, proc) in s.procs.iter().enumerate() {
            let run = proc.call.as_ref().map(|c| &c.run);
            self.fence_actions(s, p, beyond, actions);
            if let Some(io) = run.and_then(Run::peek) {
                if LeaseModel::can_step(s, p, run) {
                    let severed = Self::severed(s, p);
                    actions.push(Action::Step(p, io));
                    if !beyond
                        && !severed
                        && s.faults_left > 0
                        && run.is_some_and(Run::next_can_fail)
                    {
                        actions.push(Action::Fail(p, io));
                        if self.backend == Backend::Postgres && io == Io::Commit(CommitStep::Point)
                        {
                            actions.push(Action::Refuse(p));
                            if self.standbys > 0 {
                                actions.push(Action::FailCaughtUp(p));
                            }
                        }
                    }
                }
            } else if !beyond && proc.fence.is_none() && LeaseModel::can_step(s, p, None) {
                actions.push(Action::Call(p, Kind::Acquire));
                if proc.lease.is_some() {
                    actions.push(Action::Call(p, Kind::Renew));
                    actions.push(Action::Call(p, Kind::Release));
                }
                if proc.stale.is_some() {
                    actions.push(Action::Call(p, Kind::RenewStale));
                    actions.push(Action::Call(p, Kind::ReleaseStale));
                }
            }
            if beyond {
                continue;
            }
            if proc.local.is_some() || proc.lease.is_some() || proc.call.is_some() {
                actions.push(Action::Crash(p));
            }
            if self.backend == Backend::Postgres {
                self.liveness_actions(s, p, actions);
            }
        }
        if beyond {
            return;
        }
        if s.now < self.max_time {
            actions.push(Action::Tick);
        }
        if s.host_crash_left {
            actions.push(Action::HostCrash);
        }
        if self.backend == Backend::Postgres
            && self.standbys > 0
            && (s.durable != s.record || s.durable_tag != s.record_tag)
        {
            actions.push(Action::StandbyConfirms);
        }
        if self.backend == Backend::Postgres
            && self.standbys > 1
            && s.durable2 != (s.record.clone(), s.record_tag)
        {
            actions.push(Action::SecondStandbyConfirms);
        }
        if s.failover_left {
            actions.push(Action::Failover);
            if self.standbys > 1 {
                actions.push(Action::FailoverToSecond);
            }
        }
        self.tamper_actions(s, actions);
        self.prober_actions(s, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut next = self.next(last, action)?;
        if self.backend == Backend::Postgres {
            // The server's lock table: only locks some session holds (no files stay behind).
            next.live.retain(|_, f| f.holder.is_some() || f.shared);
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::properties(self)
    }

    /// Presentation only: the explorer shows this beside every step, so it carries the
    /// legend ([`report::legend_svg`]).
    fn as_svg(&self, _path: stateright::Path<State, Action>) -> Option<String> {
        Some(report::legend_svg())
    }

    fn format_action(&self, action: &Action) -> String {
        match action {
            Action::Call(p, kind) => {
                format!("p{p} calls {} (lock the transition lock)", kind.label())
            }
            Action::Step(p, Io::Begin) if self.backend == Backend::Postgres => {
                format!("p{p} locks the row and reads it (SELECT ... FOR UPDATE)")
            }
            Action::Step(p, Io::Commit(CommitStep::Point)) if self.backend == Backend::Postgres => {
                format!("p{p} commits (its new generation's lock, UPDATE, COMMIT)")
            }
            Action::Step(p, Io::Unlock) if self.backend == Backend::Postgres => {
                format!("p{p} ends its transaction (nothing to commit)")
            }
            Action::Step(p, io) => format!("p{p} {}", io_label(*io)),
            Action::Fail(p, Io::Commit(CommitStep::Point)) if self.backend == Backend::Postgres => {
                format!(
                    "p{p} commits (COMMIT), and its reply is LOST before the standby confirmed it \
                 (the adapter ends its session and re-reads the row)"
                )
            }
            Action::Fail(p, io) => format!("p{p} {} FAILS (injected I/O error)", io_label(*io)),
            Action::Refuse(p) => format!(
                "p{p} commits, and the server answers its commit statement with an ERROR \
                 (nothing committed; the adapter ends the session)"
            ),
            Action::FailCaughtUp(p) => format!(
                "p{p} commits (COMMIT), its reply is LOST, and the first standby confirms the \
                 commit before the adapter's re-read (which then judges it)"
            ),
            Action::Crash(p) => format!("p{p} crashes"),
            Action::Tick => "tick".into(),
            Action::HostCrash => "host crash".into(),
            Action::Tamper(target, change) => {
                let what = match target {
                    Target::Live => "the recorded generation's liveness file".to_owned(),
                    Target::Lock => "<stem>.lock".to_owned(),
                    Target::Record => "the record".to_owned(),
                    Target::Temp(p) => format!("p{p}'s temporary record"),
                };
                match change {
                    Change::MoveAside => format!("the cleaner moves {what} aside"),
                    Change::PutBack => format!("the cleaner puts {what} it moved aside back"),
                    Change::Delete => format!("the cleaner deletes {what}"),
                    Change::Replace(plant) => {
                        format!("the cleaner replaces {what} with {}", plant.label())
                    }
                }
            }
            Action::ObserverLock => {
                "an observer (a waiter, status) share-locks the recorded liveness file".into()
            }
            Action::ObserverUnlock => "the observer drops its shared lock".into(),
            Action::GoCreate => {
                "a Go-style prober opens the recorded liveness file, creating it".into()
            }
            Action::GoLock => "the Go-style prober try-locks it exclusively".into(),
            Action::GoUnlock => "the Go-style prober drops its lock".into(),
            Action::LoseLiveness(p, Cut::ServerFirst) => {
                format!(
                    "the server ends p{p}'s liveness session (its lock goes; p{p} not told yet)"
                )
            }
            Action::LoseLiveness(p, Cut::ClientFirst) => format!(
                "p{p}'s liveness connection breaks: p{p} sees it end, the server's session lives \
                 on, holding the lock"
            ),
            Action::NoticeLoss(p) => format!("p{p} sees its liveness connection end (told)"),
            Action::SessionEnds(p) => {
                format!("the server ends p{p}'s given-up session (its lock goes)")
            }
            Action::Relock(p) => format!(
                "p{p} locks its generation again on a fresh connection, outside any \
                 transition (PLANTED)"
            ),
            Action::StandbyConfirms if self.standbys > 1 => {
                "the first synchronous standby confirms the primary's WAL (it has the record)"
                    .into()
            }
            Action::StandbyConfirms => {
                "the synchronous standby confirms the primary's WAL (it has the record)".into()
            }
            Action::SecondStandbyConfirms => {
                "the second synchronous standby confirms the primary's WAL (it has the record)"
                    .into()
            }
            Action::FailoverToSecond => "the primary fails over to the second standby (every \
                                         client's connections break; no advisory lock \
                                         survives)"
                .into(),
            Action::Failover => "the primary fails over to the standby (every client's \
                                 connections break; no advisory lock survives)"
                .into(),
            Action::Fence(p) => format!(
                "p{p} starts a fenced section with its lease ({})",
                fence_label(self.backend, schedule(self.backend, self.planted)[0])
            ),
            Action::FenceStep(p, io) => format!("p{p} {}", fence_label(self.backend, *io)),
        }
    }
}

impl LeaseModel {
    /// The model's next state after `action` (before the backend's normalisation).
    fn next(&self, last: &State, action: Action) -> Option<State> {
        match action {
            Action::Call(p, kind) => self.call(last, p, kind),
            Action::Step(p, _) => self.step(last, p, Fault::None),
            Action::Fail(p, _) => self.step(last, p, Fault::Io),
            Action::Refuse(p) => self.step(last, p, Fault::Refused),
            Action::FailCaughtUp(p) => self.step(last, p, Fault::CaughtUp),
            Action::Crash(p) => {
                let mut s = last.clone();
                s.scenario = None;
                crash(&mut s, p);
                Some(s)
            }
            Action::Tick => {
                let mut s = last.clone();
                s.scenario = None;
                s.now += 1;
                Some(s)
            }
            Action::HostCrash => {
                let mut s = last.clone();
                s.scenario = None;
                for p in 0..s.procs.len() {
                    crash(&mut s, p);
                }
                // Every process on the host dies: the observer's and the prober's locks too.
                for f in s
                    .live
                    .values_mut()
                    .chain(s.aside_live.as_mut().map(|(_, f)| f))
                {
                    f.holder = None;
                    f.shared = false;
                }
                s.scenario = None;
                s.record = s.durable.clone();
                s.record_tag = s.durable_tag;
                // Commits that were not made durable are gone, and nobody was told of them
                // (a grant reported is durable: property NEVER_BACK).
                s.max_committed = s.durable.as_ref().map_or(0, |r| r.token);
                s.record_synced = true;
                s.host_crash_left = false;
                // A liveness file moved aside whose generation the durable record does not
                // name: its token will be published again, with a fresh tag.
                let named = s.record.as_ref().map(|r| r.token).zip(s.record_tag);
                if let Some((t, f)) = s.aside_live.as_mut()
                    && !matches!((f.what, named), (What::Own(q), Some((n, p))) if n == *t && p == q)
                {
                    f.old = true;
                }
                Some(s)
            }
            Action::Tamper(target, change) => {
                let mut s = last.clone();
                s.scenario = None;
                tamper(&mut s, target, change);
                if change != Change::PutBack {
                    s.cleaner_left -= 1;
                }
                s.tampered = true;
                Some(s)
            }
            Action::ObserverLock
            | Action::ObserverUnlock
            | Action::GoCreate
            | Action::GoLock
            | Action::GoUnlock => {
                let mut s = last.clone();
                s.scenario = None;
                probe_by_others(&mut s, action);
                Some(s)
            }
            Action::LoseLiveness(p, cut) => {
                let mut s = last.clone();
                s.scenario = None;
                let token = Self::liveness_token(&s, p)?;
                if s.procs[p].local.as_ref().is_none_or(|l| l.token != token) {
                    s.scenario = Some(Scenario::LostBeforeAdopt);
                }
                // The process runs on, and keeps its generation (as the adapter does).
                let f = s.live.get_mut(&token)?;
                f.holder = match cut {
                    // The server ends the session: its advisory locks go.
                    Cut::ServerFirst => None,
                    // The server's session lives on, holding the lock, given up by the process.
                    Cut::ClientFirst => Some(Locker::Ended(p)),
                };
                let proc = &mut s.procs[p];
                proc.loss = Some(Loss {
                    token,
                    noticed: cut == Cut::ClientFirst,
                });
                if let Some(c) = proc.call.as_mut()
                    && c.ghost.knew_lost
                {
                    c.ghost.lost_again = true;
                }
                s.losses_left -= 1;
                Some(s)
            }
            Action::StandbyConfirms => {
                let mut s = last.clone();
                s.scenario = None;
                s.durable = s.record.clone();
                s.durable_tag = s.record_tag;
                Some(s)
            }
            Action::SecondStandbyConfirms => {
                let mut s = last.clone();
                s.scenario = None;
                s.durable2 = (s.record.clone(), s.record_tag);
                Some(s)
            }
            Action::Failover => {
                let mut s = last.clone();
                s.scenario = None;
                failover(&mut s);
                Some(s)
            }
            Action::FailoverToSecond => {
                let mut s = last.clone();
                s.scenario = None;
                // The second standby is promoted: what it has is what the first would have
                // had; the first follows the new primary from there.
                (s.durable, s.durable_tag) = s.durable2.clone();
                failover(&mut s);
                Some(s)
            }
            Action::NoticeLoss(p) => {
                let mut s = last.clone();
                s.scenario = None;
                s.procs[p].loss.as_mut()?.noticed = true;
                Some(s)
            }
            Action::SessionEnds(p) => {
                let mut s = last.clone();
                s.scenario = None;
                for f in s.live.values_mut() {
                    if f.holder == Some(Locker::Ended(p)) {
                        f.holder = None;
                    }
                }
                Some(s)
            }
            Action::Fence(p) => self.fence_start(last, p),
            Action::FenceStep(p, _) => self.fence_step(last, p),
            Action::Relock(p) => {
                let mut s = last.clone();
                s.scenario = None;
                let token = s.procs[p].loss?.token;
                tx::relock(&mut s, p, token);
                Some(s)
            }
        }
    }

    /// PostgreSQL: the generation whose liveness connection process `p` keeps — a new one its
    /// call committed and has not adopted yet (the transaction's connection is that
    /// generation's), or else its local one.
    pub(crate) fn liveness_token(s: &State, p: usize) -> Option<u64> {
        let proc = &s.procs[p];
        let committed = proc
            .call
            .as_ref()
            .filter(|c| c.ghost.renamed)
            .and_then(|c| c.run.pending())
            .map(|l| l.token);
        committed.or(proc.local.as_ref().map(|l| l.token))
    }

    /// PostgreSQL: process `p`'s liveness connection ending, either end learning it first,
    /// and what follows: `p` seeing it end, the server ending a session `p` gave up.
    fn liveness_actions(&self, s: &State, p: usize, actions: &mut Vec<Action>) {
        let proc = &s.procs[p];
        let intact = proc.loss.is_none()
            && Self::liveness_token(s, p).is_some_and(|token| {
                s.live
                    .get(&token)
                    .is_some_and(|f| f.holder == Some(Locker::Proc(p)))
            });
        // At any moment, during a call too: the liveness connection is idle meanwhile.
        if s.losses_left > 0 && intact {
            actions.push(Action::LoseLiveness(p, Cut::ServerFirst));
            actions.push(Action::LoseLiveness(p, Cut::ClientFirst));
        }
        if proc.loss.is_some_and(|l| !l.noticed) {
            actions.push(Action::NoticeLoss(p));
        }
        if s.live.values().any(|f| f.holder == Some(Locker::Ended(p))) {
            actions.push(Action::SessionEnds(p));
        }
        if self.planted == Some(Planted::RelockOnNotice)
            && proc.call.is_none()
            && proc.loss.is_some_and(|l| l.noticed)
        {
            actions.push(Action::Relock(p));
        }
    }

    fn tamper_actions(&self, s: &State, actions: &mut Vec<Action>) {
        // The second half of a move, whatever the budget: over anything but a directory.
        if let Some((t, _)) = s.aside_live
            && s.live.get(&t).is_none_or(|f| f.what != What::Dir)
        {
            actions.push(Action::Tamper(Target::Live, Change::PutBack));
        }
        if s.aside_lock.is_some() && s.lock_at != LockAt::NotAFile {
            actions.push(Action::Tamper(Target::Lock, Change::PutBack));
        }
        if s.cleaner_left == 0 {
            return;
        }
        let moving = s.aside_live.is_some() || s.aside_lock.is_some();
        if self.tamper.moves && !moving {
            if s.held_token()
                .and_then(|tok| s.live.get(&tok))
                .is_some_and(|f| matches!(f.what, What::Own(_)))
            {
                actions.push(Action::Tamper(Target::Live, Change::MoveAside));
            }
            if matches!(s.lock_at, LockAt::File(_)) {
                actions.push(Action::Tamper(Target::Lock, Change::MoveAside));
            }
        }
        let t = self.tamper;
        const PLANTS: [Plant; 3] = [Plant::Plain, Plant::Fifo, Plant::Dir];
        if let Some(f) = s.held_token().and_then(|tok| s.live.get(&tok)) {
            if t.delete_live && f.what != What::Dir {
                actions.push(Action::Tamper(Target::Live, Change::Delete));
            }
            if t.replace_live {
                for plant in PLANTS {
                    if self.untagged && plant == Plant::Plain {
                        continue;
                    }
                    actions.push(Action::Tamper(Target::Live, Change::Replace(plant)));
                }
            }
        }
        if t.lock && matches!(s.lock_at, LockAt::File(_)) {
            actions.push(Action::Tamper(Target::Lock, Change::Delete));
            for plant in PLANTS {
                actions.push(Action::Tamper(Target::Lock, Change::Replace(plant)));
            }
        }
        if t.record && s.record.is_some() && s.record_bad.is_none() {
            for plant in PLANTS {
                actions.push(Action::Tamper(Target::Record, Change::Replace(plant)));
            }
        }
        if t.temp {
            for (p, temp) in s.temps.iter().enumerate() {
                if temp.is_some() {
                    actions.push(Action::Tamper(Target::Temp(p), Change::Delete));
                }
            }
        }
    }

    fn prober_actions(&self, s: &State, actions: &mut Vec<Action>) {
        let recorded = s.held_token().map(|t| (t, s.live.get(&t)));
        if self.observer {
            if s.live.values().any(|f| f.shared) {
                actions.push(Action::ObserverUnlock);
            } else if let Some((_, Some(f))) = recorded
                && f.holder.is_none()
            {
                actions.push(Action::ObserverLock);
            }
        }
        if self.go_prober {
            if s.live.values().any(|f| f.holder == Some(Locker::Go)) {
                actions.push(Action::GoUnlock);
            } else {
                match recorded {
                    Some((_, None)) => actions.push(Action::GoCreate),
                    Some((_, Some(f)))
                        if f.holder.is_none()
                            && !f.shared
                            && matches!(f.what, What::Own(_) | What::Plain) =>
                    {
                        actions.push(Action::GoLock);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The cleaner's change to the directory. Locks held on a replaced or deleted file stay with
/// the file, which no path reaches any more.
fn tamper(s: &mut State, target: Target, change: Change) {
    match target {
        Target::Live => {
            if change == Change::PutBack {
                if let Some((t, f)) = s.aside_live.take() {
                    s.live.insert(t, f);
                }
                return;
            }
            let Some(t) = s.held_token() else { return };
            match change {
                Change::MoveAside => {
                    s.aside_live = s.live.remove(&t).map(|f| (t, f));
                }
                Change::PutBack => {}
                Change::Delete => {
                    s.live.remove(&t);
                }
                Change::Replace(plant) => {
                    let what = match plant {
                        Plant::Plain => What::Plain,
                        Plant::Fifo => What::Fifo,
                        Plant::Dir => What::Dir,
                    };
                    s.live.insert(
                        t,
                        LiveFile {
                            what,
                            holder: None,
                            shared: false,
                            restored: false,
                            old: false,
                        },
                    );
                }
            }
        }
        Target::Lock => {
            s.lock_at = match change {
                Change::MoveAside => {
                    if let LockAt::File(i) = s.lock_at {
                        s.aside_lock = Some(i);
                    }
                    LockAt::Missing
                }
                Change::PutBack => match s.aside_lock.take() {
                    Some(i) => LockAt::File(i),
                    None => s.lock_at,
                },
                Change::Delete => LockAt::Missing,
                Change::Replace(Plant::Plain) => {
                    let i = s.next_lock;
                    s.next_lock += 1;
                    LockAt::File(i)
                }
                Change::Replace(_) => LockAt::NotAFile,
            };
        }
        Target::Record => {
            if let Change::Replace(plant) = change {
                s.record_bad = Some(plant);
                record_changed(s);
            }
        }
        Target::Temp(p) => s.temps[p] = None,
    }
}

/// The observer's and the Go-style prober's system calls on the recorded liveness file.
fn probe_by_others(s: &mut State, action: Action) {
    let recorded = s.held_token();
    match action {
        Action::ObserverLock => {
            if let Some(f) = recorded.and_then(|t| s.live.get_mut(&t)) {
                f.shared = true;
            }
        }
        Action::ObserverUnlock => {
            for f in s.live.values_mut() {
                f.shared = false;
            }
        }
        Action::GoCreate => {
            if let Some(t) = recorded {
                s.live.entry(t).or_insert(LiveFile {
                    what: What::Plain,
                    holder: None,
                    shared: false,
                    restored: false,
                    old: false,
                });
            }
        }
        Action::GoLock => {
            if let Some(f) = recorded.and_then(|t| s.live.get_mut(&t)) {
                f.holder = Some(Locker::Go);
            }
        }
        Action::GoUnlock => {
            for f in s.live.values_mut() {
                if f.holder == Some(Locker::Go) {
                    f.holder = None;
                }
            }
        }
        _ => {}
    }
}

impl Plant {
    /// The plant in a few words.
    pub fn label(self) -> &'static str {
        match self {
            Plant::Plain => "a regular file",
            Plant::Fifo => "a FIFO",
            Plant::Dir => "a directory",
        }
    }
}

impl Kind {
    /// The call as a word.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Acquire => "acquire",
            Kind::Renew => "renew",
            Kind::Release => "release",
            Kind::RenewStale => "renew (stale lease)",
            Kind::ReleaseStale => "release (stale lease)",
        }
    }
}

/// An I/O step as a few words.
pub fn io_label(io: Io) -> String {
    match io {
        Io::Lock => "locks the transition lock".into(),
        Io::Begin => "reads the record".into(),
        Io::Probe { token } => format!("probes generation {token}"),
        Io::Commit(CommitStep::LockLive) => {
            "publishes its new generation's liveness file, locked".into()
        }
        Io::Commit(CommitStep::EnsureLive) => {
            "checks its liveness file (restores it if lost)".into()
        }
        Io::Commit(CommitStep::WriteTemp) => "writes the temporary file".into(),
        Io::Commit(CommitStep::SyncTemp) => "fsyncs the temporary file".into(),
        Io::Commit(CommitStep::Point) => {
            "commits (renames the temporary file over the record)".into()
        }
        Io::Commit(CommitStep::SyncDir) => "fsyncs the directory".into(),
        Io::Cleanup(i) => format!("cleans up (step {i})"),
        Io::Adopt => "adopts the new generation".into(),
        Io::Unlock => "unlocks the transition lock".into(),
    }
}

/// A fenced section's step as a few words.
pub fn fence_label(backend: Backend, io: FenceIo) -> &'static str {
    match (io, backend) {
        (FenceIo::LocalCheck, _) => "checks locally that its lease is unexpired (no lock)",
        (FenceIo::Lock, Backend::Flock) => "locks the transition lock for its fenced section",
        (FenceIo::Lock, Backend::Postgres) => "locks the row FOR SHARE",
        (FenceIo::Read, _) => "reads the record and the clock for its fenced section (check)",
        (FenceIo::LockRead, _) => {
            "locks the row FOR SHARE, reads it and the server's clock (check)"
        }
        (FenceIo::Write, _) => "writes to the protected resource",
        (FenceIo::Recheck, _) => "re-checks the expiry on the server's clock",
        (FenceIo::Unlock, Backend::Flock) => "unlocks its fenced section's transition lock",
        (FenceIo::Unlock, Backend::Postgres) => "ends its fenced transaction (COMMIT)",
    }
}
