//! `flocklease status` driven as a real process : states, ids,
//! exit statuses for scripts, and never blocking on what is planted in the directory.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::cli_support::*;
use flocklease::{FlockLease, Owner, Record, SessionId, Timestamp, record};

/// `flocklease status --dir DIR ARGS...`, bounded by the guard (a hang fails the test).
fn status(dir: &Path, args: &[&str]) -> Output {
    let dir = dir.to_str().unwrap();
    flocklease(["status", "--dir", dir].iter().chain(args))
}

/// The rows of a `--json` listing (which exits 70 when a record is broken; every row is
/// listed all the same).
fn json_rows(out: &Output) -> Vec<serde_json::Value> {
    assert!(
        matches!(out.status.code(), Some(0 | 70)),
        "{}",
        describe(out)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn row_of<'a>(rows: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    let stem = SessionId::new(id).unwrap().stem().to_owned();
    rows.iter()
        .find(|r| r["stem"] == stem.as_str())
        .unwrap_or_else(|| panic!("no row for {id}"))
}

fn plant(dir: &Path, id: &str, rec: &Record) {
    std::fs::write(record_path(dir, id), record::encode(rec)).unwrap();
}

fn past(owner: &str, token: u64) -> Record {
    Record {
        owner: owner.into(),
        token,
        expiry: Timestamp::from_unix_secs(1_000_000_000).unwrap(),
    }
}

#[test]
fn status_reports_each_state_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let leases = FlockLease::open(d).unwrap();
    let o = Owner::new("me").unwrap();
    let id = |s: &str| SessionId::new(s).unwrap();
    // live: held by this process.
    let live = leases.acquire(&id("live"), &o).unwrap().lease().unwrap();
    // released.
    let rel = leases
        .acquire(&id("released"), &o)
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&rel).unwrap();
    // dead: granted by an instance that is gone.
    {
        let other = FlockLease::open(d).unwrap();
        let _ = other.acquire(&id("dead"), &o).unwrap();
    }
    plant(d, "expired", &past("old", 9));
    std::fs::write(record_path(d, "corrupt"), b"{").unwrap();

    let listed = status(d, &["--json"]);
    // A broken record makes the whole listing's status an error, for monitoring (issue 50).
    assert_eq!(listed.status.code(), Some(70), "{}", describe(&listed));
    assert!(
        String::from_utf8_lossy(&listed.stderr).contains("1 of 5 records are broken"),
        "{}",
        describe(&listed)
    );
    let rows = json_rows(&listed);
    let state = |id: &str| {
        let row = row_of(&rows, id);
        (
            row["state"].as_str().unwrap().to_owned(),
            row["acquirable"].as_bool().unwrap(),
        )
    };
    assert_eq!(state("live"), ("live".into(), false));
    assert_eq!(state("released"), ("released".into(), true));
    assert_eq!(state("dead"), ("dead".into(), true));
    assert_eq!(state("expired"), ("expired".into(), true));
    assert_eq!(state("corrupt").0, "corrupt");
    assert_eq!(rows.len(), 5);
    // Looking did not disturb the holder: it renews with its token.
    let renewed = leases.renew(&live).unwrap().lease().unwrap();
    assert_eq!(renewed.token, live.token);

    let out = status(d, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |id: &str| {
        let stem = SessionId::new(id).unwrap().stem().to_owned();
        text.lines()
            .find(|l| l.ends_with(&stem))
            .unwrap_or_else(|| panic!("no line for {id}: {text}"))
            .to_owned()
    };
    assert!(line("live").contains(" live "), "{text}");
    assert!(line("live").contains("Z (in "), "relative expiry: {text}");
    assert!(line("expired").contains("Z (2"), "{text}");
    assert!(line("expired").contains("years ago)"), "{text}");
    assert!(line("dead").contains("dead (free to acquire)"), "{text}");
    // A broken row's error goes below the table, so it does not widen every line.
    assert!(line("corrupt").contains("corrupt (see below)"), "{text}");
    let corrupt_stem = SessionId::new("corrupt").unwrap().stem().to_owned();
    let note = text.lines().last().unwrap();
    assert!(
        note.starts_with(&format!("{corrupt_stem}: corrupt lease record")),
        "{text}"
    );
    let table: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(table.len(), 6, "{text}");
    assert!(table.iter().all(|l| l.len() < 120), "{text}");
    // Rows sorted (by id, then stem); expiries to the second.
    let stems: Vec<&str> = table[1..]
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    let mut sorted = stems.clone();
    sorted.sort_unstable();
    assert_eq!(stems, sorted, "{text}");
    assert!(!line("live").contains('.'), "{text}");
}

#[test]
fn status_names_the_ids_run_wrote_and_the_one_asked_for_and_reads_go_written_records() {
    let s = Scene::new();
    // A session leased by `run`, whose id has characters the stem cannot keep.
    let out = s
        .run("reports/eu nightly", &[], &["true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    // A record as the Go package writes it (its own time format, offset, no sidecar, no
    // liveness file), unexpired.
    std::fs::write(
        record_path(&s.leases, "go-session"),
        br#"{"owner":"go-host-1","token":7,"expiry":"2099-01-02T03:04:05.123456789+01:00"}"#,
    )
    .unwrap();
    let go_stem = SessionId::new("go-session").unwrap().stem().to_owned();
    std::fs::write(s.leases.join(format!("{go_stem}.lock")), b"").unwrap();
    // A sidecar that claims another id under the Go stem is not believed.
    std::fs::write(
        s.leases.join(format!("{go_stem}.id")),
        b"reports/eu nightly",
    )
    .unwrap();

    let rows = json_rows(&status(&s.leases, &["--json"]));
    assert_eq!(
        row_of(&rows, "reports/eu nightly")["id"],
        "reports/eu nightly"
    );
    let go = row_of(&rows, "go-session");
    assert!(go.get("id").is_none(), "{go}");
    assert_eq!(go["owner"], "go-host-1");
    assert_eq!(go["token"], 7);
    // No liveness file: held until its expiry, as far as anyone can tell.
    assert_eq!(go["state"], "unknown");
    assert_eq!(go["acquirable"], false);

    let text = String::from_utf8_lossy(&status(&s.leases, &[]).stdout).into_owned();
    assert!(
        text.lines().any(|l| l.starts_with("reports/eu nightly ")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("- ") && l.ends_with(&go_stem)),
        "{text}"
    );
    // Asked by id, it is named, and held answers 0.
    let out = status(&s.leases, &["--id", "go-session", "--json"]);
    let rows = json_rows(&out);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], "go-session");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn status_id_answers_0_when_held_1_when_free_and_70_when_broken() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let leases = FlockLease::open(d).unwrap();
    let o = Owner::new("me").unwrap();
    let id = |s: &str| SessionId::new(s).unwrap();
    let _live = leases.acquire(&id("held"), &o).unwrap().lease().unwrap();
    let rel = leases
        .acquire(&id("released"), &o)
        .unwrap()
        .lease()
        .unwrap();
    leases.release(&rel).unwrap();
    {
        let other = FlockLease::open(d).unwrap();
        let _ = other.acquire(&id("dead"), &o).unwrap();
    }
    plant(d, "expired", &past("old", 3));
    std::fs::write(record_path(d, "corrupt"), b"[]").unwrap();
    // Expired at the last token: no acquire can succeed, so it is neither held nor free.
    plant(d, "exhausted", &past("old", u64::MAX));
    let code = |args: &[&str]| status(d, args).status.code();
    for (id, expected) in [
        ("held", 0),
        ("released", 1),
        ("dead", 1),
        ("expired", 1),
        ("never-granted", 1),
        ("corrupt", 70),
        ("exhausted", 70),
    ] {
        assert_eq!(code(&["--id", id]), Some(expected), "{id}");
        let out = status(d, &["--id", id, "-q"]);
        assert_eq!(out.status.code(), Some(expected), "{id} -q");
        assert!(out.stdout.is_empty(), "{id} -q printed");
    }
    let out = status(d, &["--id", "exhausted"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exhausted"),
        "{}",
        describe(&out)
    );
    // A broken record's error is said once, on stderr (it was also printed below the table).
    for args in [&["--id", "corrupt"][..], &["--id", "corrupt", "-q"]] {
        let out = status(d, args);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            said.matches("corrupt lease record").count(),
            1,
            "{args:?}: {said}"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("corrupt lease record"),
            "{args:?}: {said}"
        );
    }
    let rows = json_rows(&status(d, &["--json"]));
    let row = row_of(&rows, "exhausted");
    assert_eq!(row["state"], "exhausted");
    assert_eq!(row["acquirable"], false);
    assert_eq!(
        leases
            .acquire(&id("exhausted"), &o)
            .unwrap_err()
            .to_string(),
        "fencing token of session exhausted is exhausted (u64::MAX)"
    );
    let out = status(d, &["--id", "never-granted"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "never-granted: free (never granted: no record)\n"
    );
    // A mistyped directory is an error, never "free".
    let out = status(&d.join("nope"), &["--id", "held"]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
    // Without --id, a listing lists whatever it finds, and its status says a record is broken.
    assert_eq!(code(&[]), Some(70));
}

#[test]
fn status_never_blocks_on_a_fifo_socket_or_symlink_planted_under_a_files_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = |path: &Path| nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
    fifo(&record_path(d, "fifo"));
    let _socket = std::os::unix::net::UnixListener::bind(record_path(d, "socket")).unwrap();
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::write(&elsewhere, record::encode(&past("x", 1))).unwrap();
    std::os::unix::fs::symlink(&elsewhere, record_path(d, "link")).unwrap();
    // A valid, unexpired record whose liveness file and id sidecar are FIFOs.
    let stem = SessionId::new("odd-live").unwrap().stem().to_owned();
    plant(
        d,
        "odd-live",
        &Record {
            owner: "someone".into(),
            token: 4,
            expiry: Timestamp::from_unix_secs(4_000_000_000).unwrap(),
        },
    );
    fifo(&d.join(format!("{stem}.4.live")));
    fifo(&d.join(format!("{stem}.id")));

    let rows = json_rows(&status(d, &["--json"]));
    for (id, why) in [
        ("fifo", "not a regular file"),
        ("socket", "not a regular file"),
        ("link", "symbolic link"),
    ] {
        let row = row_of(&rows, id);
        assert_eq!(row["state"], "unreadable", "{id}: {row}");
        let error = row["error"].as_str().unwrap();
        assert!(
            error.contains(why) && error.contains(".lease.json"),
            "{id}: {error}"
        );
    }
    let odd = row_of(&rows, "odd-live");
    assert_eq!(odd["state"], "unknown", "{odd}");
    assert!(odd["error"].as_str().unwrap().contains(".4.live"), "{odd}");
    assert!(odd.get("id").is_none());
    // The text listing and a single id do not block either (the listing's status: records
    // are broken).
    assert_eq!(status(d, &[]).status.code(), Some(70));
    assert_eq!(status(d, &["--id", "fifo"]).status.code(), Some(70));
    assert_eq!(status(d, &["--id", "odd-live"]).status.code(), Some(0));
    // The link's target was not read as this directory's record: nothing of it is shown.
    let link = row_of(&rows, "link");
    assert!(link["token"].is_null() && link["owner"].is_null(), "{link}");
}

/// `/proc/locks` in another pid namespace does not list the holder's lock: a reader that
/// relied on it saw a live holder as dead. The shared-lock probe does not depend on it. Needs
/// `unshare` with the right to create a pid namespace; says so and passes trivially without.
#[test]
fn status_sees_a_live_holder_from_another_pid_namespace() {
    let unshare = |args: &[&str]| {
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc"])
            .args(args)
            .stdin(Stdio::null())
            .output()
    };
    if !unshare(&["true"]).is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: cannot create a pid namespace here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path()).unwrap();
    let _held = leases
        .acquire(&SessionId::new("ns").unwrap(), &Owner::new("me").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    let out = unshare(&[
        BIN,
        "status",
        "--dir",
        dir.path().to_str().unwrap(),
        "--id",
        "ns",
    ])
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(" live "),
        "{}",
        describe(&out)
    );
}

/// Ids and owners of any script line up: columns are measured in display columns (a CJK
/// character takes two), not characters.
#[test]
fn wide_characters_keep_the_columns_aligned() {
    let dir = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path()).unwrap();
    let mut held = vec![];
    for (id, owner) in [("日本語のジョブ", "東京"), ("ab", "me")] {
        let id = SessionId::new(id).unwrap();
        let owner = Owner::new(owner).unwrap();
        held.push(leases.acquire(&id, &owner).unwrap().lease().unwrap());
    }
    let out = status(dir.path(), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let column_of = |line: &str, word: &str| {
        let at = line
            .find(word)
            .unwrap_or_else(|| panic!("{word} in {line}"));
        unicode_width::UnicodeWidthStr::width(&line[..at])
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let state = column_of(lines[0], "STATE");
    assert!(
        lines[1..].iter().all(|l| column_of(l, "live") == state),
        "{text}"
    );
}

/// `status` reads `FLOCKLEASE_DIR` as `run` does (it used to ignore it and exit 64), and
/// `--dir` still wins over it.
#[test]
fn status_finds_the_directory_in_flocklease_dir() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let leases = FlockLease::open(dir.path()).unwrap();
    let id = SessionId::new("nightly").unwrap();
    let _held = leases
        .acquire(&id, &Owner::new("me").unwrap())
        .unwrap()
        .lease()
        .unwrap();
    let status_with = |args: &[&str]| {
        let child = Command::new(BIN)
            .args(["status", "--id", "nightly"])
            .args(args)
            .env("FLOCKLEASE_DIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        output_of(child)
    };
    let from_env = status_with(&[]);
    assert_eq!(
        from_env.status.code(),
        Some(0),
        "held: {}",
        describe(&from_env)
    );
    assert!(String::from_utf8_lossy(&from_env.stdout).contains("live"));
    let elsewhere = status_with(&["--dir", other.path().to_str().unwrap()]);
    assert_eq!(
        elsewhere.status.code(),
        Some(1),
        "free: {}",
        describe(&elsewhere)
    );
}

/// The notes below the table are bounded like the table (memory stays flat however many
/// records are broken): the first 4096, then a count of the rest.
#[test]
fn notes_of_broken_records_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 4096 + 5;
    for i in 0..n {
        std::fs::write(record_path(d, &format!("broken-{i}")), b"{").unwrap();
    }
    // Standard output to a file: a pipe would fill before the end.
    let printed = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(BIN)
        .args(["status", "--dir"])
        .arg(d)
        .stdin(std::process::Stdio::null())
        .stdout(printed.reopen().unwrap())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = output_of(child);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    let text = std::fs::read_to_string(printed.path()).unwrap();
    let notes = text
        .lines()
        .filter(|l| l.contains(": corrupt lease record"))
        .count();
    assert_eq!(notes, 4096, "notes kept");
    assert!(
        text.contains("... and 5 more broken records"),
        "{}",
        text.lines().last().unwrap_or_default()
    );
}

#[test]
fn json_rows_come_in_the_tables_order() {
    // Issue 50: `--json` listed rows in directory order while the table was sorted.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let leases = FlockLease::open(d).unwrap();
    let o = Owner::new("me").unwrap();
    let ids = [
        "kilo", "alpha", "hotel", "echo", "delta", "golf", "bravo", "charlie",
    ];
    for id in ids {
        let id = SessionId::new(id).unwrap();
        leases.acquire(&id, &o).unwrap().lease().unwrap();
        flocklease::status::write_id(d, &id, 0o600).unwrap();
    }
    let rows = json_rows(&status(d, &["--json"]));
    let listed: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    assert_eq!(listed, sorted);
}

#[test]
fn an_empty_id_is_bad_usage_as_in_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = status(dir.path(), &["--id", ""]);
    assert_eq!(out.status.code(), Some(64), "{}", describe(&out));
}

#[test]
fn a_missing_directory_prints_no_table_only_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = status(&dir.path().join("missing"), &[]);
    assert_eq!(out.status.code(), Some(70), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
}

#[test]
fn ids_that_would_reorder_or_hide_text_are_shown_escaped() {
    // Issue 50: a right-to-left override or a zero-width space in an id was printed raw.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let leases = FlockLease::open(d).unwrap();
    let o = Owner::new("me").unwrap();
    for id in ["rtl\u{202e}cba", "zero\u{200b}width"] {
        let id = SessionId::new(id).unwrap();
        leases.acquire(&id, &o).unwrap().lease().unwrap();
        flocklease::status::write_id(d, &id, 0o600).unwrap();
    }
    let out = status(d, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rtl\\u{202e}cba"), "{text}");
    assert!(text.contains("zero\\u{200b}width"), "{text}");
    assert!(
        !text.contains('\u{202e}') && !text.contains('\u{200b}'),
        "{text}"
    );
}
