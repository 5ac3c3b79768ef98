//! PostgreSQL benchmarks: `PgLease` beside its floor, the same transactions' SQL sent by hand
//! on raw connections, in one run against a throwaway server (as the tests start it).
//!
//! `cargo bench --features postgres --bench pg` prints the tables of BENCHMARKS.md's
//! PostgreSQL section. `-- quick` runs fewer rounds. Without PostgreSQL it says so and exits.

#![allow(clippy::unwrap_used, missing_docs)]

#[cfg(feature = "postgres")]
#[path = "../tests/support/pg.rs"]
mod pg;

#[cfg(not(feature = "postgres"))]
fn main() {
    eprintln!("the PostgreSQL benchmark needs --features postgres");
}

#[cfg(feature = "postgres")]
fn main() {
    imp::main();
}

#[cfg(feature = "postgres")]
mod imp {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use flocklease::pg::PgLease;
    use flocklease::{Owner, SessionId};
    use tokio_postgres::{Client, NoTls, Statement};

    use super::pg;

    const ROLE: &str = "FLOCKLEASE_BENCH_ROLE";
    /// The application name of the idle holder's sessions.
    const IDLE_APP: &str = "bench-idle-holder";

    pub fn main() {
        if let Ok(role) = std::env::var(ROLE) {
            return child(&role);
        }
        let quick = std::env::args().any(|a| a == "quick");
        let Some(server) = pg::server() else {
            eprintln!("PostgreSQL not found: nothing measured");
            return;
        };
        let db = server.fresh_db();
        let url = server.url(&db);
        let (rounds, ops, runs) = if quick { (3, 200, 15) } else { (9, 500, 150) };
        println!(
            "### PostgreSQL (TCP on 127.0.0.1, fsync=off; medians of {rounds} rounds of {ops})\n"
        );
        println!("| operation | median | throughput | floor | floor median | ratio |");
        println!("| --- | --- | --- | --- | --- | --- |");
        let leases = PgLease::connect(&url).unwrap();
        let raw = Raw::connect(&url);
        let id = SessionId::new("bench").unwrap();
        let me = Owner::new("bench").unwrap();
        // Warm up both (connections, prepared statements, the row).
        for _ in 0..50 {
            let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
            leases.release(&l).unwrap();
        }
        raw.own_row();
        let key = raw.key("bench-raw");
        // Rounds alternate between the lease and its floor, so both see the same load.
        let (cycle, cycle_floor) = interleaved(
            rounds,
            || {
                time(ops, || {
                    let l = leases.acquire(&id, &me).unwrap().lease().unwrap();
                    leases.release(&l).unwrap();
                })
            },
            || time(ops, || raw.cycle(key)),
        );
        row(
            "acquire + release cycle",
            cycle,
            "the same SQL by hand",
            cycle_floor,
        );
        let lease = leases.acquire(&id, &me).unwrap().lease().unwrap();
        let (renew, renew_floor) = interleaved(
            rounds,
            || {
                time(ops, || {
                    leases.renew(&lease).unwrap().lease().unwrap();
                })
            },
            || time(ops, || raw.renew(key)),
        );
        row("renew", renew, "the same SQL by hand", renew_floor);
        // A fenced section of one UPDATE against the same UPDATE in a plain transaction
        // (BEGIN, UPDATE, COMMIT on a raw connection: three round trips; the section adds the
        // row's share lock with the clock in the first, and the clock before COMMIT).
        raw.rt
            .block_on(raw.tx.client.batch_execute(
                "CREATE TABLE IF NOT EXISTS bench_counter (n int8); \
                 INSERT INTO bench_counter VALUES (0)",
            ))
            .unwrap();
        let bump = "UPDATE bench_counter SET n = n + 1";
        let (fenced, plain) = interleaved(
            rounds,
            || {
                time(ops, || {
                    leases
                        .fenced(&lease, |tx| tx.execute(bump, &[]))
                        .unwrap()
                        .unwrap();
                })
            },
            || {
                time(ops, || {
                    raw.rt.block_on(async {
                        raw.tx.client.execute("BEGIN", &[]).await.unwrap();
                        raw.tx.client.execute(bump, &[]).await.unwrap();
                        raw.tx.client.execute("COMMIT", &[]).await.unwrap();
                    })
                })
            },
        );
        row(
            "fenced section (one UPDATE)",
            fenced,
            "the UPDATE in a plain transaction",
            plain,
        );
        leases.release(&lease).unwrap();
        drop(leases);
        println!();
        takeover(&url, runs);
    }

    fn row(what: &str, t: Duration, floor_what: &str, floor: Duration) {
        println!(
            "| {what} | {} | {:.0}/s | {floor_what} | {} | {:.2}× |",
            fmt(t),
            1.0 / t.as_secs_f64(),
            fmt(floor),
            t.as_secs_f64() / floor.as_secs_f64()
        );
    }

    fn fmt(d: Duration) -> String {
        if d < Duration::from_millis(1) {
            format!("{:.0} µs", d.as_secs_f64() * 1e6)
        } else {
            format!("{:.2} ms", d.as_secs_f64() * 1e3)
        }
    }

    fn time(n: u32, mut f: impl FnMut()) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        start.elapsed() / n
    }

    /// Medians of `rounds` rounds of `a` and of `b`, run alternately.
    fn interleaved(
        rounds: usize,
        mut a: impl FnMut() -> Duration,
        mut b: impl FnMut() -> Duration,
    ) -> (Duration, Duration) {
        let (mut va, mut vb) = (vec![], vec![]);
        for _ in 0..rounds {
            va.push(a());
            vb.push(b());
        }
        va.sort();
        vb.sort();
        (va[va.len() / 2], vb[vb.len() / 2])
    }

    /// The floor: a transition connection and a liveness connection, driven by hand with the
    /// very statements `PgLease` sends, pipelined the same way: an acquire's transaction on the
    /// liveness connection (its commit statement takes the generation's lock), a release's on
    /// the transition connection, then the unlock on the liveness connection.
    struct Raw {
        rt: tokio::runtime::Runtime,
        tx: Side,
        live: Side,
    }

    /// One connection and its prepared statements.
    struct Side {
        client: Client,
        begin: Statement,
        commit: Statement,
        lock_row: Statement,
        clock: Statement,
        probe_row: Statement,
        update: Statement,
        commit_live: Statement,
        unlock: Statement,
    }

    impl Side {
        fn connect(rt: &tokio::runtime::Runtime, url: &str) -> Side {
            let client = rt.block_on(async {
                let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
                tokio::spawn(conn);
                c
            });
            let p = |sql: &str| rt.block_on(client.prepare(sql)).unwrap();
            Side {
                begin: p("BEGIN"),
                commit: p("COMMIT"),
                lock_row: p(
                    "SELECT key, owner, token, expiry FROM flocklease_leases WHERE id = $1 FOR UPDATE",
                ),
                clock: p("SELECT clock_timestamp(), pg_backend_pid()"),
                probe_row: p(
                    "SELECT ((token << 32) >> 32)::int4, pg_try_advisory_xact_lock_shared(key, \
                     ((token << 32) >> 32)::int4) FROM flocklease_leases WHERE id = $1 \
                     AND token IS DISTINCT FROM $2::int8",
                ),
                update: p("UPDATE flocklease_leases SET owner = $2, token = $3, \
                     expiry = clock_timestamp() + interval '30 s' WHERE key = $1"),
                commit_live: p(
                    "WITH live AS MATERIALIZED (SELECT pg_try_advisory_lock($1::int4, $4::int4) \
                     AS got), upd AS (UPDATE flocklease_leases SET owner = $2, token = $3, \
                     expiry = clock_timestamp() + interval '30 s' FROM live \
                     WHERE key = $1 AND live.got RETURNING 1) \
                     SELECT got, (SELECT count(*) FROM upd) FROM live",
                ),
                unlock: p("SELECT pg_advisory_unlock($1::int4, $2::int4)"),
                client,
            }
        }
    }

    impl Raw {
        fn connect(url: &str) -> Raw {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let tx = Side::connect(&rt, url);
            let live = Side::connect(&rt, url);
            Raw { rt, tx, live }
        }

        fn key(&self, id: &str) -> i32 {
            self.rt
                .block_on(
                    self.tx
                        .client
                        .query_one("SELECT key FROM flocklease_leases WHERE id = $1", &[&id]),
                )
                .unwrap()
                .get(0)
        }

        /// First round trip on `c`: BEGIN, lock and read the row, the clock, the speculative
        /// probe.
        fn lock(&self, c: &Side, probe: bool) -> i64 {
            let id = "bench-raw";
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
            let none: Option<i64> = None;
            let probe_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &none];
            let speculate = async {
                match probe {
                    true => c.client.query_opt(&c.probe_row, &probe_params).await,
                    false => Ok(None),
                }
            };
            let (_, row, _, _) = self
                .rt
                .block_on(async {
                    tokio::try_join!(
                        c.client.execute(&c.begin, &[]),
                        c.client.query_opt(&c.lock_row, &params),
                        c.client.query_one(&c.clock, &[]),
                        speculate,
                    )
                })
                .unwrap();
            row.map_or(0, |r| r.get(2))
        }

        /// UPDATE and COMMIT on the transition connection, pipelined (one round trip), as
        /// `PgLease` sends them.
        fn write(&self, key: i32, owner: &str, token: i64) {
            let c = &self.tx;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&key, &owner, &token];
            self.rt
                .block_on(async {
                    tokio::try_join!(
                        c.client.execute(&c.update, &params),
                        c.client.execute(&c.commit, &[]),
                    )
                })
                .unwrap();
        }

        /// The acquire's SQL, on the liveness connection: returns the new token.
        fn acquire(&self, key: i32) -> i64 {
            let c = &self.live;
            let token = self.lock(c, true) + 1;
            let gk = token as u32 as i32;
            let owner = "bench";
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&key, &owner, &token, &gk];
            let (row, _) = self
                .rt
                .block_on(async {
                    tokio::try_join!(
                        c.client.query_one(&c.commit_live, &params),
                        c.client.execute(&c.commit, &[]),
                    )
                })
                .unwrap();
            assert!(row.get::<_, bool>(0));
            token
        }

        fn cycle(&self, key: i32) {
            let token = self.acquire(key);
            let gk = token as u32 as i32;
            let _ = self.lock(&self.tx, false);
            self.write(key, "", token);
            let c = &self.live;
            self.rt
                .block_on(c.client.query_one(&c.unlock, &[&key, &gk]))
                .unwrap();
        }

        fn renew(&self, key: i32) {
            let token = self.lock(&self.tx, false);
            self.write(key, "bench", token);
        }

        /// Gives the raw floor its own row (so it does not disturb the lease's).
        fn own_row(&self) {
            self.rt
                .block_on(self.tx.client.execute(
                    "INSERT INTO flocklease_leases (id, owner, token, expiry) \
                     VALUES ('bench-raw', '', 1, 'epoch') ON CONFLICT DO NOTHING",
                    &[],
                ))
                .unwrap();
        }
    }

    /// A child holding the lease (`lease`) or a bare advisory lock (`bare`); it says `held`
    /// and waits to be killed.
    fn child(role: &str) {
        let url = std::env::var("FLOCKLEASE_BENCH_URL").unwrap();
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        // Kept alive until the process is killed.
        let _keep: Box<dyn std::any::Any> = match role {
            "lease" | "lease-idle" => {
                // "lease-idle": a holder whose pooled transition connection closes soon after
                // its acquire (as with the default idle timeout, only sooner), killed while
                // idle: its liveness session is its only one.
                let leases = if role == "lease-idle" {
                    PgLease::builder(&format!("{url} application_name={IDLE_APP}"))
                        .idle_timeout(Some(Duration::from_millis(50)))
                        .connect()
                        .unwrap()
                } else {
                    PgLease::builder(&url).idle_timeout(None).connect().unwrap()
                };
                let id = SessionId::new("takeover").unwrap();
                let lease = leases.acquire(&id, &Owner::new("child").unwrap()).unwrap();
                assert!(lease.lease().is_some());
                Box::new(leases)
            }
            "raw" => {
                // The floor of the lease holder: the same two sessions, driven by hand — the
                // acquire's transaction on the transition connection, the generation's lock on
                // the liveness connection.
                let raw = Raw::connect(&url);
                raw.own_row();
                let key = raw.key("bench-raw");
                raw.acquire(key);
                Box::new(raw)
            }
            _ => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                let client = rt.block_on(async {
                    let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
                    tokio::spawn(conn);
                    c.execute("SELECT pg_advisory_lock(7, 7)", &[])
                        .await
                        .unwrap();
                    c
                });
                Box::new((rt, client))
            }
        };
        writeln!(out, "held").unwrap();
        out.flush().unwrap();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }

    fn spawn(url: &str, role: &str) -> Child {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ROLE, role)
            .env("FLOCKLEASE_BENCH_URL", url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held");
        child
    }

    fn waiters(admin: &pg::Admin) -> i64 {
        admin.advisory_waiters()
    }

    /// SIGKILL of the holder → the waiter holds: `acquire_wait` against a bare
    /// `pg_advisory_lock` waiter.
    fn takeover(url: &str, runs: usize) {
        let admin = pg::Admin::connect(url);
        let leases = PgLease::connect(url).unwrap();
        let id = SessionId::new("takeover").unwrap();
        let me = Owner::new("waiter").unwrap();
        let (rt, bare) = {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let c = rt.block_on(async {
                let (c, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
                tokio::spawn(conn);
                c
            });
            (rt, c)
        };
        let mut lease_times = vec![];
        let mut idle_times = vec![];
        let mut raw_on_lease = vec![];
        let mut raw_times = vec![];
        let mut bare_times = vec![];
        // One SIGKILL → granted measurement: `holder` is the child's role, `wait` blocks until
        // the lease (or lock) is ours and returns that instant.
        let measure = |holder: &str, wait: &(dyn Fn() -> Instant + Sync)| -> Duration {
            let mut child = spawn(url, holder);
            if holder == "lease-idle" {
                // Killed while idle: once its transition session is closed.
                let sessions = || -> i64 {
                    admin.query(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                        &[&IDLE_APP],
                    )[0]
                    .get(0)
                };
                while sessions() != 1 {
                    std::thread::yield_now();
                }
            }
            let (tx, rx) = mpsc::channel();
            let d = std::thread::scope(|s| {
                s.spawn(|| tx.send(wait()).unwrap());
                while waiters(&admin) == 0 {
                    std::thread::yield_now();
                }
                let killed = Instant::now();
                child.kill().unwrap();
                rx.recv().unwrap() - killed
            });
            child.wait().unwrap();
            d
        };
        // A bare waiter with `lock` on the generation that `id`'s row names; returns when it
        // holds it (and unlocks with `unlock`).
        let bare_wait = |id: &str, lock: &str, unlock: &str| -> Instant {
            let row = rt
                .block_on(bare.query_one(
                    "SELECT key, ((token << 32) >> 32)::int4 FROM flocklease_leases WHERE id = $1",
                    &[&id],
                ))
                .unwrap();
            let (k, t): (i32, i32) = (row.get(0), row.get(1));
            rt.block_on(bare.execute(lock, &[&k, &t])).unwrap();
            let at = Instant::now();
            rt.block_on(bare.execute(unlock, &[&k, &t])).unwrap();
            at
        };
        for _ in 0..runs {
            lease_times.push(measure("lease", &|| {
                let got = leases
                    .acquire_wait(&id, &me, Duration::from_secs(30))
                    .unwrap();
                let at = Instant::now();
                leases.release(&got.lease().unwrap()).unwrap();
                at
            }));
            idle_times.push(measure("lease-idle", &|| {
                let got = leases
                    .acquire_wait(&id, &me, Duration::from_secs(30))
                    .unwrap();
                let at = Instant::now();
                leases.release(&got.lease().unwrap()).unwrap();
                at
            }));
            // A bare waiter on a lease holder: when the server releases its liveness lock.
            raw_on_lease.push(measure("lease", &|| {
                bare_wait(
                    "takeover",
                    "SELECT pg_advisory_lock_shared($1, $2)",
                    "SELECT pg_advisory_unlock_shared($1, $2)",
                )
            }));
            // The floor of the first row: a bare waiter on a holder with the same two
            // sessions, driven by hand.
            raw_times.push(measure("raw", &|| {
                bare_wait(
                    "bench-raw",
                    "SELECT pg_advisory_lock($1, $2)",
                    "SELECT pg_advisory_unlock($1, $2)",
                )
            }));
            bare_times.push(measure("bare", &|| {
                rt.block_on(bare.execute("SELECT pg_advisory_lock(7, 7)", &[]))
                    .unwrap();
                let at = Instant::now();
                rt.block_on(bare.execute("SELECT pg_advisory_unlock(7, 7)", &[]))
                    .unwrap();
                at
            }));
        }
        lease_times.sort();
        idle_times.sort();
        raw_on_lease.sort();
        raw_times.sort();
        bare_times.sort();
        let pct = |v: &[Duration], p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        println!(
            "### PostgreSQL crash takeover: SIGKILL of the holder → waiter holds ({runs} runs)\n"
        );
        println!("| waiter | min | median | p90 | max |");
        println!("| --- | --- | --- | --- | --- |");
        for (what, v) in [
            (
                "`PgLease::acquire_wait` on a `PgLease` holder killed right after its acquire (2 sessions)",
                &lease_times,
            ),
            (
                "`PgLease::acquire_wait` on a `PgLease` holder killed while idle (1 session)",
                &idle_times,
            ),
            (
                "bare `pg_advisory_lock_shared` on a `PgLease` holder right after its acquire",
                &raw_on_lease,
            ),
            (
                "bare `pg_advisory_lock` on a holder of the same two sessions by hand, right after its acquire (floor of the first row)",
                &raw_times,
            ),
            (
                "bare `pg_advisory_lock` on a bare one-session holder (floor of the second row)",
                &bare_times,
            ),
        ] {
            println!(
                "| {what} | {} | {} | {} | {} |",
                fmt(v[0]),
                fmt(pct(v, 0.5)),
                fmt(pct(v, 0.9)),
                fmt(v[v.len() - 1])
            );
        }
        let diff = |a: &[Duration], b: &[Duration]| {
            let (a, b) = (pct(a, 0.5), pct(b, 0.5));
            match a.checked_sub(b) {
                Some(d) => format!("+{}", fmt(d)),
                None => format!("-{}", fmt(b - a)),
            }
        };
        println!(
            "| difference of medians, holder right after its acquire (first row − its floor) | | {} | | |",
            diff(&lease_times, &raw_times)
        );
        println!(
            "| difference of medians, idle holder (second row − its floor) | | {} | | |",
            diff(&idle_times, &bare_times)
        );
        println!(
            "| the holder's second session: its floor − the one-session floor | | {} | | |",
            diff(&raw_times, &bare_times)
        );
    }
}
