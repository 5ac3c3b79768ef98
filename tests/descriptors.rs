//! Descriptors at the process's limit: one per held lease and a small constant besides, a
//! clear error naming the limit, and every release still succeeding there.
//!
//! One test in a binary of its own: it lowers this process's descriptor limit.

#![allow(clippy::unwrap_used)]

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use flocklease::{Durability, Error, FlockLease, Owner, SessionId};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn at_the_descriptor_limit_leases_cost_one_each_and_every_release_succeeds() {
    const ROOM: u64 = 64;
    const CYCLED: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::builder(dir.path())
        .durability(Durability::NoSync)
        .open()
        .unwrap();
    let me = Owner::new("me").unwrap();
    // Ids used and released first keep no descriptor open but their `<stem>.lock`'s, 64 at
    // most (given back at the limit).
    const KEEP_LOCKS: usize = 64;
    let fresh = open_descriptors();
    for i in 0..CYCLED {
        let id = SessionId::new(format!("cycled-{i}")).unwrap();
        let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
        leases.release(&l).unwrap();
    }
    let base = open_descriptors();
    assert!(
        base <= fresh + KEEP_LOCKS + 1,
        "{CYCLED} released ids keep descriptors open: {fresh} -> {base}"
    );
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // `read_dir` of /proc/self/fd counts its own descriptor.
    let base = base as u64;
    let limit = base + ROOM;
    setrlimit(Resource::RLIMIT_NOFILE, limit, hard).unwrap();

    let mut held = vec![];
    let error = loop {
        let id = SessionId::new(format!("held-{}", held.len())).unwrap();
        match leases.acquire(&id, &me) {
            Ok(grant) => held.push(grant.lease().unwrap()),
            Err(e) => break e,
        }
        assert!(held.len() < 10_000, "the limit was never reached");
    };
    let text = error.to_string();
    match &error {
        Error::TooManyOpenFiles { limit: Some(l), .. } => assert_eq!(*l, limit, "{text}"),
        other => panic!("not a clear descriptor error: {other:?}"),
    }
    assert!(text.contains(&format!("limit is {limit}")), "{text}");
    assert!(text.contains("ulimit -n"), "{text}");
    // One descriptor per held lease, and only a few besides (a transition's lock and
    // temporary file).
    assert!(
        held.len() as u64 + 4 >= ROOM,
        "only {} leases held with room for {ROOM} more descriptors",
        held.len()
    );
    // At the limit, every release succeeds.
    for l in &held {
        leases.release(l).unwrap();
    }
    eprintln!(
        "{} leases held with room for {ROOM} descriptors",
        held.len()
    );
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
}
