//! Property test (issue 48): `commit::standbys_required` reads `synchronous_standby_names` as
//! a real server does. One primary of the test's own with three streaming standbys (`alpha`,
//! `beta`, `gamma`); each case sets a generated value with `ALTER SYSTEM` and
//! `pg_reload_conf()`, and the server's verdict is compared with the library's:
//!
//! - The server refuses the value (`ALTER SYSTEM` fails: a syntax error, or a count that is not
//!   positive): the library must say `None`.
//! - The server takes it: the library must say `Some(required)`, and with `listed` the
//!   streaming standbys the value names (`sync_state` other than `async` in
//!   `pg_stat_replication`), the server must show what its documented semantics make of
//!   `required` (PostgreSQL 15 docs, §27.2.8 and `pg_stat_replication`):
//!   - priority (`FIRST n`, `n (…)`, a plain list, which is `FIRST 1`): the first `n` listed
//!     standbys by priority are `sync`, the others `potential`, so `sync` =
//!     `min(required, listed)`; no `quorum`;
//!   - quorum (`ANY n`): every listed standby is a `quorum` candidate whatever `n`, so
//!     `quorum` = `listed`; no `sync`. There `n` shows only in what a commit waits for:
//!   - a commit (`synchronous_commit = on`) completes without help iff
//!     `required <= listed` (it waits for `required` confirmations from listed streaming
//!     standbys, which confirm at once). A commit still waiting after a grace is cancelled
//!     (`pg_cancel_backend`, which the server answers with success and its WARNING
//!     "canceling wait for synchronous replication"): that WARNING is how the test knows it
//!     waited. This pins `n` at the boundary for both methods.
//!
//! The generator builds values over the server's grammar (plain lists, `n (…)`, `FIRST n`,
//! `ANY n`, `*`, quoted names with blanks and doubled quotes, numbers as names, keyword case
//! and blank variations, counts from 1 to `i32::MAX` and past it, zero) and breaks some of them
//! in ways the grammar always refuses (a stray character, a missing count, parenthesis or
//! name, an empty list, an extra comma or word, a bare keyword as a name, an unterminated
//! quote, a name starting with a digit, blanks only). It knows which values are well-formed
//! and whom each one's list names, and checks that the server agrees (a disagreement there is
//! the test's own mistake, reported as such). It leaves out `\n` (`ALTER SYSTEM` refuses a
//! value with a newline whatever the grammar says) and counts of 2^32 and more, which the
//! server's `atoi` reads differently by platform (the library says `None` there; its unit
//! test pins that).
//!
//! Waiting for the reload: the test polls, with a deadline, until its own session's
//! `synchronous_standby_names` is the new value (its `pg_stat_replication` reading uses its
//! own copy) and every standby's `sync_priority` is what the value gives it (each walsender
//! re-reads the setting on its own). A walsender or the checkpointer that has not re-read it
//! yet is invisible when their priority does not change, so a commit whose outcome disagrees
//! with the library is tried again, up to three times: a real disagreement repeats, a late
//! reload does not.

use crate::cluster::Node;
use crate::pg;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flocklease::commit::standbys_required;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// The standbys' `application_name`s.
const STANDBYS: [&str; 3] = ["alpha", "beta", "gamma"];
/// How long a commit the library says needs no more standbys than stream may take.
const COMMIT_BOUND: Duration = Duration::from_secs(10);
/// How long a commit the library says cannot complete is watched waiting before it is
/// cancelled.
const GRACE: Duration = Duration::from_millis(300);

/// One entry of a list: its text and whom it names.
#[derive(Clone, Debug)]
struct Entry {
    text: String,
    /// `Some(i)`: standby `STANDBYS[i]`; `None`: no connected standby.
    names: Option<usize>,
    /// `*` (quoted or not): every standby.
    all: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Plain,
    Num,
    First,
    Any,
}

/// How a well-formed value is broken (each always refused by the grammar).
#[derive(Clone, Debug)]
enum Break {
    /// A character the scanner does not take, between two tokens.
    Junk(char, usize),
    /// The count after `FIRST` or `ANY` left out (a keyword put before a plain list).
    NoCount,
    /// `( )` with nothing inside.
    EmptyList,
    /// The opening (`true`) or closing parenthesis left out (a stray `)` in a plain list).
    NoParen(bool),
    /// A comma at the start (0), at the end (1), or doubled (2).
    Comma(u8),
    /// A name replaced by a bare keyword.
    Keyword(usize, &'static str),
    /// A word after the end.
    Trailing,
    /// An unterminated quoted name at the end.
    Unterminated,
    /// A name replaced by one that starts with a digit.
    DigitName(usize),
    /// Blanks only.
    BlanksOnly,
}

/// A generated value and what the test knows of it.
#[derive(Clone, Debug)]
struct Value {
    text: String,
    /// Whether the grammar takes it; then `method`, `entries` say what it means.
    well_formed: bool,
    method: Method,
    entries: Vec<Entry>,
}

impl Value {
    /// The `sync_priority` the server gives standby `i` under this value (0: not named).
    fn priority(&self, i: usize) -> i32 {
        if self.text.is_empty() {
            return 0;
        }
        let Some(pos) = self
            .entries
            .iter()
            .position(|e| e.all || e.names == Some(i))
        else {
            return 0;
        };
        // Quorum members all have priority 1; otherwise the first matching entry's place.
        if self.method == Method::Any {
            1
        } else {
            i32::try_from(pos + 1).unwrap()
        }
    }
}

/// `word` with `case` applied to every other character, the first included (mixed case).
fn alternating(word: &str, case: fn(&char) -> char) -> String {
    word.chars()
        .enumerate()
        .map(|(k, c)| if k % 2 == 0 { case(&c) } else { c })
        .collect()
}

fn entry() -> impl Strategy<Value = Entry> {
    let standby = (0..STANDBYS.len(), 0..5u8).prop_map(|(i, style)| {
        let name = STANDBYS[i];
        let text = match style {
            0 => name.to_owned(),
            1 => name.to_uppercase(),
            2 => alternating(name, char::to_ascii_uppercase),
            // Quoted names are matched case-blind too (`pg_strcasecmp`).
            3 => format!("\"{name}\""),
            _ => format!("\"{}\"", name.to_uppercase()),
        };
        Entry {
            text,
            names: Some(i),
            all: false,
        }
    });
    let other = prop::sample::select(vec![
        "delta",
        "\"al pha\"",
        "\"a\"\"b\"",
        "\"\"",
        "\"first\"",
        "\"ANY\"",
        "anyone",
        "firstly",
        "7",
        "007",
        "_x$1",
        "na\u{ef}ve",
        "\"(beta)\"",
    ])
    .prop_map(|t| Entry {
        text: t.to_owned(),
        names: None,
        all: false,
    });
    let star = prop::sample::select(vec!["*", "\"*\""]).prop_map(|t| Entry {
        text: t.to_owned(),
        names: None,
        all: true,
    });
    prop_oneof![6 => standby, 3 => other, 1 => star]
}

/// A count as written, and whether the server takes it (1..=i32::MAX).
fn count() -> impl Strategy<Value = (String, bool)> {
    prop_oneof![
        8 => (1u32..=4).prop_map(|n| (n.to_string(), true)),
        1 => Just(("02".to_owned(), true)),
        1 => Just(("2147483647".to_owned(), true)),
        1 => prop::sample::select(vec!["0", "00", "2147483648"]).prop_map(|t| (t.to_owned(), false)),
    ]
}

fn keyword(word: &'static str) -> impl Strategy<Value = String> {
    (0..3u8).prop_map(move |style| match style {
        0 => word.to_owned(),
        1 => word.to_lowercase(),
        _ => alternating(word, char::to_ascii_lowercase),
    })
}

fn blank() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "", " ", " ", "  ", "\t", " \r ", "\x0b", "\x0c"])
}

fn breakage() -> impl Strategy<Value = Break> {
    let junk = prop::sample::select(vec!['-', ';', '.', '\'', '=', '!', '/', '#', '%', '\\']);
    prop_oneof![
        3 => (junk, 0..16usize).prop_map(|(c, at)| Break::Junk(c, at)),
        1 => Just(Break::NoCount),
        1 => Just(Break::EmptyList),
        1 => any::<bool>().prop_map(Break::NoParen),
        1 => (0..3u8).prop_map(Break::Comma),
        1 => (0..4usize, prop::sample::select(vec!["any", "ANY", "first", "First"]))
            .prop_map(|(at, k)| Break::Keyword(at, k)),
        1 => Just(Break::Trailing),
        1 => Just(Break::Unterminated),
        1 => (0..4usize).prop_map(Break::DigitName),
        1 => Just(Break::BlanksOnly),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let method = prop_oneof![
        Just(Method::Plain),
        Just(Method::Num),
        Just(Method::First),
        Just(Method::Any)
    ];
    let well_formed = (
        method,
        count(),
        keyword("FIRST"),
        keyword("ANY"),
        prop::collection::vec(entry(), 1..=4),
        prop::collection::vec(blank(), 24),
        prop::option::weighted(0.3, breakage()),
    )
        .prop_map(|(method, (n, n_ok), first, any, entries, blanks, broken)| {
            let mut tokens: Vec<String> = match method {
                Method::Plain => vec![],
                Method::Num => vec![n],
                Method::First => vec![first, n],
                Method::Any => vec![any, n],
            };
            let parens = method != Method::Plain;
            if parens {
                tokens.push("(".into());
            }
            // Where the names are in `tokens`.
            let mut at = vec![];
            for (k, e) in entries.iter().enumerate() {
                if k > 0 {
                    tokens.push(",".into());
                }
                at.push(tokens.len());
                tokens.push(e.text.clone());
            }
            if parens {
                tokens.push(")".into());
            }
            let broke = broken.is_some();
            let text = match broken {
                None => join(&tokens, &blanks),
                Some(b) => {
                    apply(b, &mut tokens, parens, &at);
                    let text = join(&tokens, &blanks);
                    if text.trim_matches(is_blank).is_empty() {
                        // Blanks only, never the empty string (which is well-formed).
                        format!(" {text}")
                    } else {
                        text
                    }
                }
            };
            Value {
                text,
                well_formed: !broke && (method == Method::Plain || n_ok),
                method,
                entries,
            }
        });
    prop_oneof![
        1 => Just(Value {
            text: String::new(),
            well_formed: true,
            method: Method::Plain,
            entries: vec![],
        }),
        20 => well_formed,
    ]
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\x0b' | '\x0c')
}

/// Breaks `tokens` as `b` says (always into something the grammar refuses).
fn apply(b: Break, tokens: &mut Vec<String>, parens: bool, names: &[usize]) {
    let pick = |k: usize| names[k % names.len()];
    match b {
        Break::Junk(c, at) => tokens.insert(at % (tokens.len() + 1), c.to_string()),
        Break::NoCount if parens => {
            let n = tokens.iter().position(|t| t == "(").unwrap() - 1;
            tokens.remove(n);
        }
        Break::NoCount => tokens.insert(0, "FIRST".into()),
        Break::EmptyList if parens => {
            let open = tokens.iter().position(|t| t == "(").unwrap();
            tokens.truncate(open + 1);
            tokens.push(")".into());
        }
        Break::EmptyList => *tokens = vec!["(".into(), ")".into()],
        Break::NoParen(open) if parens => {
            let p = if open { "(" } else { ")" };
            let at = tokens.iter().position(|t| t == p).unwrap();
            tokens.remove(at);
        }
        Break::NoParen(_) => tokens.push(")".into()),
        Break::Comma(0) => tokens.insert(if parens { names[0] } else { 0 }, ",".into()),
        Break::Comma(1) => {
            let end = if parens {
                tokens.len() - 1
            } else {
                tokens.len()
            };
            tokens.insert(end, ",".into());
        }
        Break::Comma(_) => tokens.insert(names[0] + 1, ",,".into()),
        Break::Keyword(k, word) => tokens[pick(k)] = word.into(),
        Break::Trailing => tokens.push("delta".into()),
        Break::Unterminated => tokens.push("\"beta".into()),
        Break::DigitName(k) => tokens[pick(k)] = "1abc".into(),
        Break::BlanksOnly => tokens.clear(),
    }
}

/// `tokens` with blanks between them (cycling through `blanks`); at least one blank between
/// two tokens that would otherwise run together into one word.
fn join(tokens: &[String], blanks: &[&str]) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$' || !c.is_ascii();
    let mut out = blanks[0].to_owned();
    for (k, t) in tokens.iter().enumerate() {
        let blank = blanks[(k + 1) % blanks.len()];
        if out.ends_with(word) && t.starts_with(word) {
            out.push(' ');
        }
        out.push_str(t);
        out.push_str(blank);
    }
    out
}

/// A session whose notices (WARNINGs) are kept, on a runtime of its own that runs its
/// statements in the background.
struct Session {
    rt: tokio::runtime::Runtime,
    client: Arc<Client>,
    notices: mpsc::Receiver<String>,
    pid: i32,
}

impl Session {
    fn connect(url: &str) -> Session {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let (tx, notices) = mpsc::channel();
        let client = rt.block_on(async {
            let (client, mut conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
            tokio::spawn(async move {
                while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                    if let AsyncMessage::Notice(n) = m {
                        let _ = tx.send(n.message().to_owned());
                    }
                }
            });
            client
        });
        let pid = rt
            .block_on(client.query_one("SELECT pg_backend_pid()", &[]))
            .expect("pg_backend_pid")
            .get(0);
        Session {
            rt,
            client: Arc::new(client),
            notices,
            pid,
        }
    }

    fn execute(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }
}

/// What a commit did.
#[derive(Debug, PartialEq, Eq)]
enum Commit {
    /// It completed on its own.
    Completed,
    /// It still waited for standbys when cancelled (the server's WARNING says so).
    Waited,
}

struct Cluster {
    primary: Node,
    _standbys: Vec<Node>,
    admin: pg::Admin,
    probe: Session,
}

impl Cluster {
    /// Polls (every 5 ms, at most 10 s) until `cond`.
    fn poll(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\n{}",
                self.primary.log()
            );
            // Polling the server: nothing signals a reload to a client.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `(application_name, sync_priority, sync_state)` of the streaming standbys.
    fn replication(&self) -> Vec<(String, i32, String)> {
        self.admin
            .query(
                "SELECT application_name, sync_priority, sync_state FROM pg_stat_replication \
                 WHERE state = 'streaming' ORDER BY application_name",
                &[],
            )
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// Commits one row on the probe session; cancels the commit if it still waits for
    /// standbys after `bound`.
    fn commit(&self, bound: Duration) -> Commit {
        while self.probe.notices.try_recv().is_ok() {}
        let client = Arc::clone(&self.probe.client);
        let task = self.probe.rt.spawn(async move {
            client
                .batch_execute("INSERT INTO standbys_probe VALUES (1)")
                .await
        });
        let by = Instant::now() + bound;
        while !task.is_finished() && Instant::now() < by {
            // Polling: the commit's end is seen on the task, its wait on the server.
            std::thread::sleep(Duration::from_millis(5));
        }
        // A cancel must reach the commit's wait for the standbys, not the statement before.
        self.poll("the probe's commit to end or wait for standbys", || {
            task.is_finished()
                || !self
                    .admin
                    .query(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'",
                        &[&self.probe.pid],
                    )
                    .is_empty()
        });
        if !task.is_finished() {
            self.admin
                .query("SELECT pg_cancel_backend($1)", &[&self.probe.pid]);
        }
        self.probe
            .rt
            .block_on(task)
            .expect("the probe task")
            .expect("a cancelled commit is answered with success");
        let waited = self
            .probe
            .notices
            .try_iter()
            .any(|n| n.contains("canceling wait for synchronous replication"));
        if waited {
            Commit::Waited
        } else {
            Commit::Completed
        }
    }
}

#[test]
fn standbys_required_reads_synchronous_standby_names_as_the_server_does() {
    let Some(primary) = Node::primary(&["fsync=off", "synchronous_commit=on"]) else {
        return;
    };
    let standbys: Vec<Node> = STANDBYS.iter().map(|n| primary.standby(n)).collect();
    let admin = primary.admin();
    admin.execute("CREATE TABLE standbys_probe (x int)", &[]);
    let cluster = Cluster {
        probe: Session::connect(&primary.url()),
        admin,
        _standbys: standbys,
        primary,
    };
    let ctl = Session::connect(&cluster.primary.url());
    cluster.poll("every standby to stream", || {
        cluster.replication().len() == STANDBYS.len()
    });

    let started = Instant::now();
    // Refused, taken, a commit waited, a commit completed.
    let tally = std::cell::RefCell::new([0usize; 4]);
    let config = Config {
        cases: 48,
        max_shrink_iters: 64,
        source_file: Some(file!()),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&value(), |v| {
        let required = standbys_required(&v.text);
        let alter = format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{}'",
            v.text.replace('\'', "''")
        );
        if let Err(e) = ctl.execute(&alter) {
            let e = e.as_db_error().map_or_else(
                || e.to_string(),
                |d| format!("{} ({:?})", d.message(), d.detail()),
            );
            tally.borrow_mut()[0] += 1;
            prop_assert!(
                !v.well_formed,
                "the test's mistake: the server refused {:?}, which it built as well-formed: {}",
                v.text,
                e
            );
            prop_assert_eq!(
                required,
                None,
                "the server refused {:?} ({}), standbys_required took it",
                v.text,
                e
            );
            return Ok(());
        }
        tally.borrow_mut()[1] += 1;
        prop_assert!(
            v.well_formed,
            "the test's mistake: the server took {:?}, which it built broken",
            v.text
        );
        ctl.execute("SELECT pg_reload_conf()").unwrap();
        let Some(required) = required else {
            return Err(TestCaseError::fail(format!(
                "the server took {:?}, standbys_required says None",
                v.text
            )));
        };
        // Until this session and every walsender have re-read the setting.
        let want: Vec<i32> = (0..STANDBYS.len()).map(|i| v.priority(i)).collect();
        cluster.poll(
            &format!("the server to apply {:?} (priorities {want:?})", v.text),
            || {
                let shown: String = cluster
                    .admin
                    .query("SELECT current_setting('synchronous_standby_names')", &[])[0]
                    .get(0);
                let got: Vec<i32> = cluster.replication().iter().map(|r| r.1).collect();
                shown == v.text && got == want
            },
        );
        let rows = cluster.replication();
        let count = |state: &str| rows.iter().filter(|r| r.2 == state).count();
        let listed = rows.len() - count("async");
        if v.method == Method::Any {
            prop_assert_eq!(
                (count("quorum"), count("sync")),
                (listed, 0),
                "{:?}: every listed standby is a quorum candidate: {:?}",
                v.text,
                rows
            );
        } else {
            let n = usize::try_from(required).unwrap();
            prop_assert_eq!(
                (count("sync"), count("quorum")),
                (n.min(listed), 0),
                "{:?}: standbys_required = {}, {} listed: sync must be min of the two: {:?}",
                v.text,
                required,
                listed,
                rows
            );
        }
        let expect = if usize::try_from(required).unwrap() <= listed {
            Commit::Completed
        } else {
            Commit::Waited
        };
        let bound = match expect {
            Commit::Completed => COMMIT_BOUND,
            Commit::Waited => GRACE,
        };
        let mut seen = cluster.commit(bound);
        for _ in 1..3 {
            if seen == expect {
                break;
            }
            seen = cluster.commit(bound);
        }
        tally.borrow_mut()[2 + usize::from(seen == Commit::Completed)] += 1;
        prop_assert_eq!(
            &seen,
            &expect,
            "{:?}: standbys_required = {}, {} listed standbys stream ({:?}): a commit {}",
            v.text,
            required,
            listed,
            rows,
            if seen == Commit::Waited {
                "waited for more standbys"
            } else {
                "did not wait for more standbys"
            }
        );
        Ok(())
    });
    let tally = tally.into_inner();
    eprintln!(
        "standbys: {} refused, {} taken ({} commits waited, {} completed) in {:.1} s",
        tally[0],
        tally[1],
        tally[2],
        tally[3],
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}
