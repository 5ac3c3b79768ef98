//! `flocklease status`: what a lease directory holds, without disturbing anyone.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use std::io::Write;

use flocklease::status::{SessionStatus, scan_each, session};
use flocklease::{Clock, SessionId, SystemClock, Timestamp};

use crate::EXIT_ERROR;

/// The arguments of `status`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["dir", "pg"])))]
pub struct StatusArgs {
    /// The lease directory.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// List the PostgreSQL lease table instead (a connection string). Liveness is read from
    /// `pg_locks`, times are the server's. Needs a binary built with the `postgres` feature.
    #[arg(long, value_name = "CONNINFO", conflicts_with = "dir")]
    pg: Option<String>,
    /// With --pg: verify the server's TLS certificate against the CA certificates in this
    /// PEM file, and require TLS (`sslmode=require` alone verifies against the system's
    /// roots). Needs a binary built with the `postgres-tls` feature.
    #[arg(long, value_name = "PEM", requires = "pg")]
    pg_ca: Option<PathBuf>,
    /// Only this session id. Exit status: 0 when it is held, 1 when it is free (released,
    /// expired, holder dead, or never granted), 70 when its record is broken.
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// JSON output: an array of objects (stem, id when known, owner, token, expiry, state,
    /// acquirable, error).
    #[arg(long)]
    json: bool,
    /// With --id: print nothing; only the exit status answers.
    #[arg(short = 'q', long, requires = "id")]
    quiet: bool,
}

/// Runs `status`, returning the exit status.
pub fn main(args: &StatusArgs) -> u8 {
    match status(args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("flocklease: {msg}");
            EXIT_ERROR
        }
    }
}

fn status(a: &StatusArgs) -> Result<u8, String> {
    if let Some(url) = &a.pg {
        return status_pg(a, url);
    }
    // clap requires --dir or --pg.
    let dir = a.dir.as_deref().unwrap_or_else(|| unreachable!());
    let now = SystemClock.now();
    let Some(id) = &a.id else {
        // The whole directory, streamed: memory stays flat however many ids it holds.
        let mut out = Rows::new(a.json, now);
        let scanned = scan_each(dir, now, |row| out.push(row));
        // Closed either way, so what was printed stays valid JSON; the error goes to stderr.
        out.finish();
        scanned.map_err(|e| crate::describe(&e))?;
        return Ok(0);
    };
    let id = SessionId::new(id.as_str()).map_err(|e| crate::describe(&e))?;
    let rows: Vec<SessionStatus> = session(dir, &id, now)
        .map_err(|e| crate::describe(&e))?
        .into_iter()
        .collect();
    if a.quiet {
    } else if a.json {
        let json = serde_json::to_string_pretty(&rows).map_err(|e| crate::describe(&e))?;
        println!("{json}");
    } else {
        match rows.is_empty() {
            true => println!("{id}: free (never granted: no record)"),
            false => {
                let mut out = Rows::new(false, now);
                rows.iter().cloned().for_each(|r| out.push(r));
                out.finish();
            }
        }
    }
    Ok(match rows.first() {
        None => 1,
        Some(row) if row.is_broken() => {
            let why = row.error.as_deref().unwrap_or(row.state);
            eprintln!("flocklease: {why}");
            EXIT_ERROR
        }
        Some(row) if row.is_held() => 0,
        Some(_) => 1,
    })
}

/// `status --pg`: the lease table, with the server's clock and `pg_locks` liveness.
#[cfg(feature = "postgres")]
fn status_pg(a: &StatusArgs, url: &str) -> Result<u8, String> {
    let leases = crate::run::pg_builder(url, a.pg_ca.as_deref())?
        .connect()
        .map_err(|e| crate::describe(&e))?;
    let id = match &a.id {
        Some(id) => Some(SessionId::new(id.as_str()).map_err(|e| crate::describe(&e))?),
        None => None,
    };
    let rows = leases
        .sessions(id.as_ref())
        .map_err(|e| crate::describe(&e))?;
    if a.quiet {
    } else if a.json {
        let json: Vec<_> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "id": r.id,
                    "owner": r.record.as_ref().map(|r| r.owner.clone()),
                    "token": r.record.as_ref().map(|r| r.token),
                    "expiry": r.record.as_ref().map(|r| r.expiry.to_string()),
                    "state": r.state(),
                    "error": r.problem,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json).map_err(|e| crate::describe(&e))?
        );
    } else {
        let mut lines = vec![["ID", "OWNER", "TOKEN", "EXPIRY", "STATE"].map(String::from)];
        for r in &rows {
            let (owner, token, expiry) = match &r.record {
                Some(rec) => (
                    if rec.owner.is_empty() {
                        "-".into()
                    } else {
                        rec.owner.clone()
                    },
                    rec.token.to_string(),
                    format!(
                        "{} ({})",
                        rec.expiry,
                        relative(&rec.expiry.to_string(), r.now)
                    ),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let state = match &r.problem {
                Some(why) => format!("{} ({why})", r.state()),
                None => r.state().to_owned(),
            };
            lines.push([r.id.clone(), owner, token, expiry, state]);
        }
        let w: Vec<usize> = (0..5)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for l in &lines {
            println!(
                "{:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {}",
                l[0],
                l[1],
                l[2],
                l[3],
                l[4],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
            );
        }
    }
    Ok(match (&a.id, rows.first()) {
        (None, _) => 0,
        (Some(_), Some(r)) if r.is_broken() => {
            eprintln!(
                "flocklease: session {}: {}",
                r.id,
                r.problem
                    .as_deref()
                    .unwrap_or("the fencing token is exhausted (u64::MAX): every acquire fails")
            );
            EXIT_ERROR
        }
        (Some(_), Some(r)) if r.is_held() => 0,
        (Some(_), _) => 1,
    })
}

#[cfg(not(feature = "postgres"))]
fn status_pg(_: &StatusArgs, _: &str) -> Result<u8, String> {
    Err("this flocklease was built without PostgreSQL support (cargo feature `postgres`)".into())
}

/// Rows of `status --dir`, written as they come: JSON array elements, or table lines aligned
/// in batches (a column only ever widens, so memory stays one batch).
struct Rows {
    json: bool,
    now: Timestamp,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    batch: Vec<[String; 6]>,
    widths: [usize; 6],
    written: usize,
}

/// Table lines aligned together.
const BATCH: usize = 256;

impl Rows {
    fn new(json: bool, now: Timestamp) -> Rows {
        let mut rows = Rows {
            json,
            now,
            out: std::io::BufWriter::new(std::io::stdout().lock()),
            batch: vec![],
            widths: [0; 6],
            written: 0,
        };
        if !json {
            rows.batch
                .push(["ID", "OWNER", "TOKEN", "EXPIRY", "STATE", "STEM"].map(String::from));
        }
        rows
    }

    fn push(&mut self, r: SessionStatus) {
        if self.json {
            // Pretty-printed as one element of an array, as `--json` always was.
            let text = serde_json::to_string_pretty(&r).unwrap_or_default();
            let sep = if self.written == 0 { "[\n" } else { ",\n" };
            let _ = write!(self.out, "{sep}  {}", text.replace('\n', "\n  "));
            self.written += 1;
            return;
        }
        self.batch.push(table_line(&r, self.now));
        if self.batch.len() >= BATCH {
            self.flush_batch();
        }
    }

    fn flush_batch(&mut self) {
        for line in &self.batch {
            for (w, cell) in self.widths.iter_mut().zip(line) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let w = self.widths;
        for l in self.batch.drain(..) {
            let _ = writeln!(
                self.out,
                "{:<w0$}  {:<w1$}  {:>w2$}  {:<w3$}  {:<w4$}  {}",
                l[0],
                l[1],
                l[2],
                l[3],
                l[4],
                l[5],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
                w4 = w[4],
            );
            self.written += 1;
        }
    }

    fn finish(mut self) {
        if self.json {
            let _ = writeln!(self.out, "{}", if self.written == 0 { "[]" } else { "\n]" });
        } else {
            self.flush_batch();
        }
        let _ = self.out.flush();
    }
}

/// One row of the table: id, owner, token, expiry, state, stem.
fn table_line(r: &SessionStatus, now: Timestamp) -> [String; 6] {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    let expiry = match &r.expiry {
        None => "-".to_owned(),
        Some(expiry) => format!("{expiry} ({})", relative(expiry, now)),
    };
    let state = match (&r.error, r.acquirable) {
        (Some(e), _) => format!("{} ({e})", r.state),
        (None, true) => format!("{} (free to acquire)", r.state),
        (None, false) => r.state.to_owned(),
    };
    let token = r.token.map_or_else(|| "-".to_owned(), |t| t.to_string());
    [
        dash(r.id.as_deref().unwrap_or("")),
        dash(r.owner.as_deref().unwrap_or("")),
        token,
        expiry,
        state,
        r.stem.clone(),
    ]
}

/// `in 12 s`, `3 min ago`, `now`, for an RFC 3339 `expiry` relative to `now`.
pub fn relative(expiry: &str, now: Timestamp) -> String {
    let Ok(at) = Timestamp::parse_rfc3339(expiry) else {
        return String::new();
    };
    let ahead = at.saturating_duration_since(now);
    let behind = now.saturating_duration_since(at);
    if !ahead.is_zero() {
        format!("in {}", human(ahead))
    } else if !behind.is_zero() {
        format!("{} ago", human(behind))
    } else {
        "now".to_owned()
    }
}

/// A duration rounded down to one readable unit: `250 ms`, `12 s`, `3 min`, `5 h`, `4 days`,
/// `24 years`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{} ms", d.as_millis()),
        1..120 => format!("{s} s"),
        120..7_200 => format!("{} min", s / 60),
        7_200..172_800 => format!("{} h", s / 3_600),
        172_800..63_072_000 => format!("{} days", s / 86_400),
        _ => format!("{} years", s / 31_536_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = Timestamp::parse_rfc3339("2026-01-01T00:00:00Z").unwrap_or_else(|_| {
            unreachable!("valid time");
        });
        assert_eq!(relative("2026-01-01T00:00:12Z", now), "in 12 s");
        assert_eq!(relative("2025-12-31T23:57:00Z", now), "3 min ago");
        assert_eq!(relative("2026-01-01T00:00:00.25Z", now), "in 250 ms");
        assert_eq!(relative("2026-01-01T00:00:00Z", now), "now");
        assert_eq!(relative("2026-01-01T05:00:00Z", now), "in 5 h");
        assert_eq!(relative("2001-09-09T01:46:40Z", now), "24 years ago");
        assert_eq!(relative("garbage", now), "");
    }
}
