//! A holder's host vanishing from the network without a word — no FIN, no RST, as when a
//! machine loses power or a cable is cut — is noticed on both ends well before the expiry, by
//! the TCP keepalives and `tcp_user_timeout` that `PgLease` sets on its liveness connections
//! (about a third of the TTL):
//!
//! - the server ends the holder's session, so a waiter elsewhere holds the lease before the
//!   old expiry;
//! - the holder's `KeepAlive` reports `Loss::LivenessLost` before the expiry, and its next
//!   call fails within the connections' TCP user timeout rather than hanging.
//!
//! The holder runs in its own network namespace, joined to this one by a veth pair; the server
//! listens on this side's address. "Host death" is the holder side's link going down: packets
//! in both directions vanish. Needs root (network namespaces and veth pairs); skips loudly
//! otherwise, and fails instead when `FLOCKLEASE_REQUIRE_PG=1` and we are root.

use crate::pg;
use crate::support;

use std::io::Write;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use flocklease::pg::{PgLease, PgStep};
use flocklease::{KeepAlive, Timestamp};
use support::{RoleChild, hear, id, owner, role, tell};

const ENTRY: &str = "host_death::child_entry";
const TTL: Duration = Duration::from_secs(12);

/// The holder role: `URL`. Says `ready`, waits for `go` (its network is set up then), acquires `job` with
/// the test's TTL under a `KeepAlive`, says `token N expiry NANOS`, then reports the loss:
/// `lost LOSS early|late` (early: before the lease's expiry by the server's clock).
#[test]
fn child_entry() {
    let Some((role, args)) = role() else { return };
    // In its own network namespace by now: the parent may move the link in.
    tell("ready");
    assert_eq!(hear().as_deref(), Some("go"));
    if role == "stuck" {
        return stuck(&args[0]);
    }
    let leases = Arc::new(PgLease::builder(&args[0]).ttl(TTL).connect().unwrap());
    let lease = leases
        .acquire(&id("job"), &owner("far"))
        .unwrap()
        .lease()
        .expect("free");
    let (tx, rx) = mpsc::channel();
    let _keep = KeepAlive::builder(Arc::clone(&leases), lease.clone())
        .clock(leases.clock())
        .on_loss(move |loss| {
            let _ = tx.send(loss.clone());
        })
        .start()
        .unwrap();
    tell(&format!(
        "token {} expiry {}",
        lease.token,
        lease.expiry.unix_nanos()
    ));
    let loss = rx.recv().unwrap();
    let when = if leases.clock().now() < lease.expiry {
        "early"
    } else {
        "late"
    };
    tell(&format!("lost {loss:?} {when}"));
    // A call on a transition connection into the dead network fails within the connection's
    // TCP user timeout (a third of the TTL), instead of TCP's quarter hour of retransmissions.
    let renewed = leases.renew(&lease);
    tell(&format!(
        "renew {}",
        if renewed.is_err() {
            "failed"
        } else {
            "answered"
        }
    ));
    while hear().is_some() {}
}

/// The `stuck` role: acquires `job`, says `token N`, then renews; the renew's transaction,
/// once its row is locked, says `stuck PID` (its server session) and waits there.
fn stuck(url: &str) {
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook_armed = Arc::clone(&armed);
    let leases = PgLease::builder(url)
        .ttl(TTL)
        .faults(Arc::new(move |step, pid| {
            if step == PgStep::Commit && hook_armed.swap(false, Ordering::SeqCst) {
                tell(&format!("stuck {pid}"));
                let _ = hear();
            }
            None
        }))
        .connect()
        .unwrap();
    let lease = leases
        .acquire(&id("job"), &owner("far"))
        .unwrap()
        .lease()
        .expect("free");
    tell(&format!("token {}", lease.token));
    armed.store(true, Ordering::SeqCst);
    let _ = leases.renew(&lease);
    while hear().is_some() {}
}

/// Runs `ip` (in the network namespace of `pid`, if given); `Err` with its output on failure.
fn ip(netns_of: Option<u32>, args: &[&str]) -> Result<(), String> {
    let mut cmd = match netns_of {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.args(["-t", &pid.to_string(), "-n", "ip"]);
            c
        }
        None => Command::new("ip"),
    };
    let out = cmd
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The veth pair, deleted when the test ends (deleting one end deletes both).
struct Veth(String);

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = ip(None, &["link", "del", &self.0]);
    }
}

fn skip(why: &str) {
    let required = std::env::var(pg::REQUIRE).is_ok_and(|v| v == "1");
    assert!(
        !(required && nix::unistd::geteuid().is_root()),
        "{}=1 and root, but: {why}",
        pg::REQUIRE
    );
    let _ = std::io::stderr()
        .write_all(format!("\n*** the host-death test DID NOT RUN: {why} ***\n").as_bytes());
}

/// A child in `role`, in a network namespace of its own joined to this one by a veth pair,
/// told `go` once its network is up; the server listens on this side's address too. `None`
/// (after a loud notice, or a failure when required) without root or `ip`.
struct Far {
    child: RoleChild,
    /// The child's pid (its namespace's).
    pid: u32,
    /// The child's end of the pair, in its namespace.
    there: String,
    server: &'static pg::PgServer,
    db: String,
    _veth: Veth,
    /// One at a time: the server listens on the pair's address (one per test binary).
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn far(role: &str) -> Option<Far> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !nix::unistd::geteuid().is_root() {
        skip("it needs root for a network namespace and a veth pair");
        return None;
    }
    let n = std::process::id();
    let (here, there) = (
        format!("flh{}a", n % 100_000),
        format!("flh{}b", n % 100_000),
    );
    let net = format!("10.213.{}", n % 250);
    let (here_addr, there_addr) = (format!("{net}.1"), format!("{net}.2"));
    // The previous test's pair may still be going away (see below): wait for its name.
    let gone = std::time::Instant::now() + Duration::from_secs(10);
    while ip(None, &["link", "show", &here]).is_ok() && std::time::Instant::now() < gone {
        std::thread::yield_now();
    }
    if let Err(e) = ip(
        None,
        &["link", "add", &here, "type", "veth", "peer", "name", &there],
    ) {
        skip(&e);
        return None;
    }
    let veth = Veth(here.clone());
    // The previous test's pair goes away with its namespace, which the kernel tears down in
    // the background: its address can linger for a moment. Retried, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match ip(
            None,
            &["addr", "add", &format!("{here_addr}/24"), "dev", &here],
        ) {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = &e;
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
    ip(None, &["link", "set", &here, "up"]).unwrap();
    let server = pg::server_also_on(&here_addr, &format!("{net}.0/24"))?;
    let db = server.fresh_db();
    let far_url = format!(
        "host={here_addr} port={} user=postgres dbname={db}",
        server.port
    );
    // In a network namespace of its own with the other end of the pair. (`unshare` execs
    // the test binary in place: the child's pid is the holder's.)
    let mut child = RoleChild::spawn_wrapped(&["unshare", "--net", "--"], ENTRY, role, &[&far_url]);
    let pid = child.child.id();
    assert_eq!(child.line(), "ready");
    ip(None, &["link", "set", &there, "netns", &pid.to_string()]).unwrap();
    ip(Some(pid), &["link", "set", "lo", "up"]).unwrap();
    ip(
        Some(pid),
        &["addr", "add", &format!("{there_addr}/24"), "dev", &there],
    )
    .unwrap();
    ip(Some(pid), &["link", "set", &there, "up"]).unwrap();
    // Only a guard against a hang (a call stuck in TCP retransmissions): the child is killed
    // after a minute, which fails the test on its next line instead of hanging it.
    let guard_pid = child.pid();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        let _ = nix::sys::signal::kill(guard_pid, nix::sys::signal::Signal::SIGKILL);
    });
    child.say("go");
    Some(Far {
        child,
        pid,
        there,
        server,
        db,
        _veth: veth,
        _serial: serial,
    })
}

#[test]
fn a_holder_host_that_vanishes_is_noticed_on_both_ends_before_the_expiry() {
    // Bound in this order so that they drop in the reverse one: the child, then the pair,
    // then the turn of the next test (which must not find this test's pair).
    let Some(Far {
        _serial,
        _veth,
        child: mut holder,
        pid,
        there,
        server,
        db,
    }) = far("holder")
    else {
        return;
    };
    let line = holder.line();
    let mut words = line.split(' ');
    let (token, expiry): (u64, i128) = match (words.next(), words.next(), words.nth(1)) {
        (Some("token"), Some(t), Some(e)) => (t.parse().unwrap(), e.parse().unwrap()),
        _ => panic!("unexpected line from the holder: {line}"),
    };
    let expiry = Timestamp::from_unix_nanos(expiry).unwrap();
    // A waiter on this host, over loopback, blocked in the server on the holder's lock.
    let admin = server.admin(&db);
    let near = PgLease::builder(&server.url(&db))
        .ttl(TTL)
        .connect()
        .unwrap();
    assert!(near.acquire(&id("job"), &owner("near")).unwrap().is_held());
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let got = near.acquire_wait(&id("job"), &owner("near"), TTL * 2);
            let at = near.clock().now();
            tx.send((got, at)).unwrap();
        });
        pg::until("the waiter blocks", || admin.advisory_waiters() > 0);
        // The holder's host vanishes: its link goes down, nothing is sent on the way out.
        ip(Some(pid), &["link", "set", &there, "down"]).unwrap();
        let (got, at) = rx.recv().unwrap();
        let lease = got
            .unwrap()
            .lease()
            .expect("granted once the server gave up on the holder");
        assert_eq!(lease.token, token + 1);
        assert!(
            at < expiry,
            "granted at {at}, not before the old expiry {expiry}: the server noticed the \
             holder's host only by the expiry"
        );
        near.release(&lease).unwrap();
    });
    // And the holder was told, before its expiry, that its liveness is gone.
    let told = holder.line();
    assert_eq!(told, "lost LivenessLost early", "the holder's report");
    assert_eq!(holder.line(), "renew failed");
    holder.kill();
}

/// A holder whose host vanishes (its link goes down) in the middle of a renew's transaction,
/// holding the lease row locked: the server ends that session (its idle-in-transaction bound,
/// here 4 s: a third of the TTL), so a rival on this host is answered again instead of failing
/// with `LockTimeout` until the far host's path comes back.
#[test]
fn a_holder_host_that_vanishes_mid_transaction_does_not_keep_the_row_locked() {
    // Bound in this order so that they drop in the reverse one: the child, then the pair,
    // then the turn of the next test (which must not find this test's pair).
    let Some(Far {
        _serial,
        _veth,
        mut child,
        pid,
        there,
        server,
        db,
    }) = far("stuck")
    else {
        return;
    };
    assert_eq!(child.line(), "token 1");
    let stuck: i32 = child
        .line()
        .strip_prefix("stuck ")
        .unwrap()
        .parse()
        .unwrap();
    ip(Some(pid), &["link", "set", &there, "down"]).unwrap();
    let admin = server.admin(&db);
    let rival = PgLease::builder(&server.url(&db))
        .ttl(TTL)
        .lock_timeout(Duration::from_millis(500))
        .connect()
        .unwrap();
    let mut timeouts = 0;
    let answer = loop {
        match rival.acquire(&id("job"), &owner("near")) {
            // At most 40 of 500 ms: five times the bound.
            Err(flocklease::Error::LockTimeout { .. }) if timeouts < 40 => timeouts += 1,
            other => break other,
        }
    };
    eprintln!("answered after {timeouts} row-lock timeouts of 500 ms: {answer:?}");
    assert!(answer.is_ok(), "the row stayed locked: {answer:?}");
    admin.until_ended(stuck);
    child.kill();
}
