//! A token is never granted twice across crashes and failovers (issue 32, PROTOCOL §8.6), with
//! servers of the tests' own: a primary with a synchronous standby made by `pg_basebackup`
//! whose replication is stalled, then the primary crashed and the standby promoted; and a
//! server whose default is `synchronous_commit = off`, crashed after grants.

#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/pg.rs"]
mod pg;

use std::time::Duration;

use cluster::Node;
use flocklease::pg::PgLease;
use flocklease::{Error, Owner, SessionId, SessionLease};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

fn owner(name: &str) -> Owner {
    Owner::new(name).unwrap()
}

fn lease_on(node: &Node) -> PgLease {
    PgLease::builder(&node.url())
        .ttl(Duration::from_secs(3))
        .lock_timeout(Duration::from_millis(300))
        .connect()
        .unwrap()
}

/// Acquires and releases `id` `n` times; the tokens granted.
fn grants(lease: &PgLease, id: &SessionId, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let l = lease
                .acquire(id, &owner(&format!("g{i}")))
                .unwrap()
                .lease()
                .expect("free");
            lease.release(&l).unwrap();
            l.token
        })
        .collect()
}

fn assert_never_twice(tokens: &[u64]) {
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "a token was granted twice or went back: {tokens:?}"
    );
}

#[test]
fn a_commit_the_standby_never_confirmed_is_never_a_grant() {
    // Issue 32.1: the standby's replication stalls (its walsender stopped); an acquire's COMMIT
    // waits for it; the library gives up on the reply and ends its session, which keeps the
    // commit on the primary alone. It must not report the grant: the primary then crashes,
    // the standby is promoted, and the next acquire there is granted the same token.
    let Some(primary) = Node::primary(&["synchronous_standby_names=s1", "fsync=off"]) else {
        return;
    };
    let standby = primary.standby("s1");
    let walsender = primary.sync_walsender("s1");
    let id = SessionId::new("failover").unwrap();
    let lease = lease_on(&primary);
    let mut granted = grants(&lease, &id, 3);

    kill(Pid::from_raw(walsender), Signal::SIGSTOP).unwrap();
    let stalled = lease.acquire(&id, &owner("stalled"));
    if let Ok(g) = &stalled {
        granted.extend(g.clone().lease().map(|l| l.token));
    }
    assert!(
        matches!(stalled, Err(Error::CommitUnknown { .. })),
        "an acquire the standby never confirmed: {stalled:?}"
    );
    // The commit is on the primary, visible there: the row says so.
    let row = primary.admin().row("failover");
    assert_eq!(row.map(|r| r.0), Some("stalled".to_owned()));

    // The primary dies (the stopped walsender gets SIGKILL from the postmaster); the standby
    // takes over.
    primary.crash();
    standby.promote();
    let lease = lease_on(&standby);
    granted.extend(grants(&lease, &id, 2));
    assert_never_twice(&granted);
}

#[test]
fn a_server_that_commits_asynchronously_loses_no_grant_in_a_crash() {
    // Issue 32.2: a server whose default is `synchronous_commit = off` (the WAL writer every
    // 10 s), stopped at once after three grants: the library's sessions commit synchronously,
    // so the next grant after the restart has a greater token.
    let Some(node) = Node::primary(&[
        "synchronous_commit=off",
        "wal_writer_delay=10000ms",
        "fsync=off",
    ]) else {
        return;
    };
    let id = SessionId::new("async").unwrap();
    let lease = lease_on(&node);
    let level = node.admin().query("SHOW synchronous_commit", &[]);
    assert_eq!(
        level[0].get::<_, String>(0),
        "off",
        "the server's own default"
    );
    let mut granted = grants(&lease, &id, 3);
    drop(lease);
    node.crash();
    node.start();
    let lease = lease_on(&node);
    granted.extend(grants(&lease, &id, 1));
    assert_never_twice(&granted);
}
