//! A tour of flocklease on a temporary directory: acquire, contention, a child process's crash
//! taken over at once with a higher token, renew and release.
//!
//! Run with `cargo run --example demo`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flocklease::{Error, FlockLease, Grant, Owner, SessionId};

const TTL: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, dir] = args.as_slice()
        && flag == "--child"
    {
        return Ok(child(Path::new(dir))?);
    }
    let dir = tempfile::tempdir()?;
    let leases = FlockLease::builder(dir.path()).ttl(TTL).open()?;
    let id = SessionId::new("demo-session")?;
    let parent = Owner::new("parent")?;
    println!("lease directory: {}", dir.path().display());

    let lease = expect_grant(leases.acquire(&id, &parent)?, "first acquire")?;
    println!(
        "parent acquired {id}: token {} until {}",
        lease.token, lease.expiry
    );
    leases.release(&lease)?;
    println!(
        "parent released it (the record keeps token {} as a tombstone)",
        lease.token
    );

    // A child process takes the lease and is then killed without releasing it.
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("--child")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no child stdout")?).read_line(&mut line)?;
    print!("child  (pid {}) says: {line}", child.id());

    match leases.acquire(&id, &parent)? {
        Grant::Held => println!("parent acquire while the child runs: held"),
        Grant::Granted(l) => return Err(format!("unexpected grant {l:?}").into()),
    }

    let killed = Instant::now();
    child.kill()?; // SIGKILL: no release, no cleanup
    child.wait()?;
    // Wait on the dead holder's liveness lock: the kernel drops it as the child is torn down.
    let taken = expect_grant(
        leases.acquire_wait(&id, &parent, Duration::from_secs(5))?,
        "waiting acquire",
    )?;
    println!(
        "child SIGKILLed; parent took over {:?} after the kill with token {} (TTL was {:?})",
        killed.elapsed(),
        taken.token,
        TTL
    );

    let renewed = expect_grant(leases.renew(&taken)?, "renew")?;
    println!(
        "parent renewed: same token {}, expiry moved to {}",
        renewed.token, renewed.expiry
    );
    leases.release(&renewed)?;
    println!(
        "parent released; releasing again is a no-op: {:?}",
        leases.release(&renewed)
    );
    Ok(())
}

/// The child: acquire, say so, then wait for stdin to close (it is killed first).
fn child(dir: &Path) -> Result<(), Error> {
    let leases = FlockLease::builder(dir).ttl(TTL).open()?;
    let id = SessionId::new("demo-session")?;
    match leases.acquire(&id, &Owner::new("child")?)? {
        Grant::Granted(l) => println!("acquired token {} until {}", l.token, l.expiry),
        Grant::Held => println!("held"),
    }
    let _ = std::io::stdout().flush();
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    Ok(())
}

fn expect_grant(g: Grant, what: &str) -> Result<flocklease::Lease, String> {
    g.lease()
        .ok_or_else(|| format!("{what}: held by someone else"))
}
