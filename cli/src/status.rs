//! `flocklease status`: what a lease directory holds, without disturbing anyone.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use std::io::Write;

use flocklease::status::{SessionStatus, scan_each_trusting, session_trusting};
use flocklease::{Clock, SessionId, SystemClock, Timestamp};

use crate::EXIT_ERROR;

/// The arguments of `status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The lease directory [default: $FLOCKLEASE_DIR, else /run/lock/flocklease for root and
    /// $XDG_RUNTIME_DIR/flocklease (or /run/user/UID/flocklease) for other users, as `run`].
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
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
    #[arg(long, value_name = "ID", value_parser = crate::run::nonempty_id)]
    id: Option<String>,
    /// JSON output: an array of objects (stem, id when known, owner, token, expiry, state,
    /// acquirable, error).
    #[arg(long)]
    json: bool,
    /// In a directory shared with other users (sticky and world-writable): read their lease
    /// files too (by default they are refused, and their rows shown unreadable), as `run
    /// --trust-foreign-owners` does.
    #[arg(long, conflicts_with = "pg")]
    trust_foreign_owners: bool,
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
    let dir = &match crate::dirs::lease_dir(a.dir.as_deref()) {
        Ok(dir) => dir,
        Err(no) => return Ok(no.report()),
    };
    let now = SystemClock.now();
    let Some(id) = &a.id else {
        // The whole directory, streamed: memory stays flat however many ids it holds.
        let mut out = Rows::new(a.json, now);
        let mut rows = 0usize;
        let mut broken = 0usize;
        let scanned = scan_each_trusting(dir, now, a.trust_foreign_owners, |row| {
            rows += 1;
            broken += usize::from(row.is_broken());
            out.push(row);
        });
        // Closed either way once something was listed, so what was printed stays valid JSON;
        // the error goes to stderr. Nothing listed (a missing directory): no header either.
        if rows > 0 || scanned.is_ok() {
            out.finish();
        }
        scanned.map_err(|e| crate::describe(&e))?;
        // Monitoring learns from the status too: a broken or unreadable record is an error.
        if broken > 0 {
            eprintln!(
                "flocklease: {broken} of {rows} records are broken or unreadable (see above)"
            );
            return Ok(EXIT_ERROR);
        }
        return Ok(0);
    };
    let id = SessionId::new(id.as_str()).map_err(|e| crate::describe(&e))?;
    let rows: Vec<SessionStatus> = session_trusting(dir, &id, now, a.trust_foreign_owners)
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
                // A broken record's error is said once, on stderr below the table.
                out.drop_notes();
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
        let mut table = Table::new(["ID", "OWNER", "TOKEN", "EXPIRY", "STATE"]);
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
                        to_the_second(&rec.expiry.to_string()),
                        relative(&rec.expiry.to_string(), r.now)
                    ),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            let state = match &r.problem {
                Some(why) => format!("{} ({why})", r.state()),
                None => r.state().to_owned(),
            };
            table.push([r.id.clone(), owner, token, expiry, state]);
        }
        table.finish();
    }
    Ok(match (&a.id, rows.first()) {
        // As for a directory: a broken row makes the listing's status an error.
        (None, _) if rows.iter().any(|r| r.is_broken()) => {
            let broken = rows.iter().filter(|r| r.is_broken()).count();
            eprintln!(
                "flocklease: {broken} of {} rows are broken (see above)",
                rows.len()
            );
            EXIT_ERROR
        }
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

/// Rows of `status --dir`, written as they come: JSON array elements one by one, or lines
/// of a [`Table`].
enum Rows {
    Json {
        out: std::io::BufWriter<std::io::StdoutLock<'static>>,
        written: usize,
        /// Rows kept to be sorted as the table is (by id, then stem), up to [`SORTED`].
        held: Vec<SessionStatus>,
        /// More than [`SORTED`] rows came: streaming in directory order.
        streaming: bool,
    },
    Text {
        table: Box<Table<6>>,
        now: Timestamp,
    },
}

impl Rows {
    fn new(json: bool, now: Timestamp) -> Rows {
        if json {
            Rows::Json {
                out: std::io::BufWriter::new(std::io::stdout().lock()),
                written: 0,
                held: vec![],
                streaming: false,
            }
        } else {
            Rows::Text {
                table: Box::new(Table::new([
                    "ID", "OWNER", "TOKEN", "EXPIRY", "STATE", "STEM",
                ])),
                now,
            }
        }
    }

    fn push(&mut self, r: SessionStatus) {
        match self {
            Rows::Json {
                out,
                written,
                held,
                streaming,
            } => {
                if *streaming {
                    json_row(out, written, &r);
                    return;
                }
                held.push(r);
                if held.len() > SORTED {
                    *streaming = true;
                    eprintln!("flocklease: more than {SORTED} ids: listed in directory order");
                    for r in held.drain(..) {
                        json_row(out, written, &r);
                    }
                }
            }
            Rows::Text { table, now } => {
                if let Some(e) = &r.error {
                    let who = r.id.as_deref().unwrap_or(&r.stem);
                    table.note(format!("{who}: {e}"));
                }
                table.push(table_line(&r, *now));
            }
        }
    }

    /// Forgets the notes of the rows pushed so far (their errors are said elsewhere).
    fn drop_notes(&mut self) {
        if let Rows::Text { table, .. } = self {
            table.notes.clear();
        }
    }

    fn finish(self) {
        match self {
            Rows::Json {
                mut out,
                mut written,
                mut held,
                ..
            } => {
                // The table's order: by its ID column (`-` for a row without one), then stem.
                let key = |r: &SessionStatus| {
                    let id = r.id.as_deref().filter(|id| !id.is_empty()).unwrap_or("-");
                    (id.to_owned(), r.stem.clone())
                };
                held.sort_by_cached_key(key);
                for r in &held {
                    json_row(&mut out, &mut written, r);
                }
                let _ = writeln!(out, "{}", if written == 0 { "[]" } else { "\n]" });
                let _ = out.flush();
            }
            Rows::Text { table, .. } => table.finish(),
        }
    }
}

/// Writes `r` as the next element of the JSON array on `out` (pretty-printed, as `--json`
/// always was).
fn json_row(out: &mut impl Write, written: &mut usize, r: &SessionStatus) {
    let text = serde_json::to_string_pretty(r).unwrap_or_default();
    let sep = if *written == 0 { "[\n" } else { ",\n" };
    let _ = write!(out, "{sep}  {}", text.replace('\n', "\n  "));
    *written += 1;
}

/// A table written to stdout: sorted by its first column (then its last) and aligned as a
/// whole while it has at most [`SORTED`] lines; past that, written as its lines come, aligned
/// in batches (a column only ever widens), so memory stays bounded. Two spaces between
/// columns, the third (the token) right-aligned, the last not padded; widths are display
/// widths. Notes (one per broken row) follow the table.
struct Table<const N: usize> {
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    header: Option<[String; N]>,
    batch: Vec<[String; N]>,
    widths: [usize; N],
    /// More than [`SORTED`] lines came: streaming.
    streaming: bool,
    /// At most [`SORTED`] notes are kept; the rest are counted.
    notes: Vec<String>,
    notes_left: usize,
}

/// Table lines sorted and aligned together (about 1 MiB); beyond, lines are streamed.
const SORTED: usize = 4096;
/// Table lines aligned together once streaming.
const BATCH: usize = 256;

impl<const N: usize> Table<N> {
    fn new(header: [&str; N]) -> Table<N> {
        Table {
            out: std::io::BufWriter::new(std::io::stdout().lock()),
            header: Some(header.map(String::from)),
            batch: vec![],
            widths: [0; N],
            streaming: false,
            notes: vec![],
            notes_left: 0,
        }
    }

    fn push(&mut self, line: [String; N]) {
        self.batch.push(line);
        if self.batch.len() > SORTED && !self.streaming {
            self.streaming = true;
            eprintln!("flocklease: more than {SORTED} ids: listed in directory order");
        }
        if self.streaming && self.batch.len() >= BATCH {
            self.flush_batch();
        }
    }

    /// A line printed below the table (the first [`SORTED`]; the rest are counted, so memory
    /// stays bounded however many records are broken).
    fn note(&mut self, note: String) {
        if self.notes.len() < SORTED {
            self.notes.push(note);
        } else {
            self.notes_left += 1;
        }
    }

    fn flush_batch(&mut self) {
        let header = self.header.take();
        for line in header.iter().chain(&self.batch) {
            for (w, cell) in self.widths.iter_mut().zip(line) {
                *w = (*w).max(unicode_width::UnicodeWidthStr::width(cell.as_str()));
            }
        }
        for line in header.into_iter().chain(self.batch.drain(..)) {
            let mut text = String::new();
            for (c, (cell, w)) in line.iter().zip(self.widths).enumerate() {
                let pad = w.saturating_sub(unicode_width::UnicodeWidthStr::width(cell.as_str()));
                if c + 1 == N {
                    text.push_str(cell);
                } else if c == 2 {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                    text.push_str("  ");
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad + 2));
                }
            }
            let _ = writeln!(self.out, "{text}");
        }
    }

    fn finish(mut self) {
        if !self.streaming {
            self.batch
                .sort_by(|a, b| (&a[0], &a[N - 1]).cmp(&(&b[0], &b[N - 1])));
        }
        self.flush_batch();
        if !self.notes.is_empty() {
            let _ = writeln!(self.out);
            for note in std::mem::take(&mut self.notes) {
                let _ = writeln!(self.out, "{note}");
            }
        }
        if self.notes_left > 0 {
            let _ = writeln!(
                self.out,
                "... and {} more broken records (`flocklease status --json` gives each one's \
                 error)",
                self.notes_left
            );
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
        Some(expiry) => format!("{} ({})", to_the_second(expiry), relative(expiry, now)),
    };
    let state = match (&r.error, r.acquirable) {
        (Some(_), _) => format!("{} (see below)", r.state),
        (None, true) => format!("{} (free to acquire)", r.state),
        (None, false) => r.state.to_owned(),
    };
    let token = r.token.map_or_else(|| "-".to_owned(), |t| t.to_string());
    [
        dash(&visible(r.id.as_deref().unwrap_or(""))),
        dash(r.owner.as_deref().unwrap_or("")),
        token,
        expiry,
        state,
        r.stem.clone(),
    ]
}

/// `text` with the characters that change how a terminal shows the rest of a line (bidirectional
/// controls, zero-width characters) written as `\u{...}`, so a row says what its id is.
fn visible(text: &str) -> String {
    let hidden = |c: char| matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
    if !text.chars().any(hidden) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if hidden(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An RFC 3339 instant to the second, for the eye (the record and `--json` keep the
/// fraction).
fn to_the_second(expiry: &str) -> String {
    match expiry.split_once('.') {
        Some((seconds, _)) => format!("{seconds}Z"),
        None => expiry.to_owned(),
    }
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
