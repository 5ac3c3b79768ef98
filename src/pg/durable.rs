//! When a commit counts: the judgements behind "no grant, renew or release is reported on a
//! commit that may not be durable" (PROTOCOL §8.6).
//!
//! A `COMMIT` in PostgreSQL becomes visible to every session *before* it is replicated: with
//! synchronous replication, the committing backend writes and flushes its commit record,
//! marks the transaction committed, and only then waits for the standbys to confirm. If that
//! wait is cut short (the library ends a stuck session, an administrator terminates or cancels
//! it, the server shuts down), the commit stays on the primary alone, visible, and is lost if
//! the primary fails over. So a re-read that finds our record after a commit whose reply never
//! came proves the commit durable only when no standby had to confirm it, or when the
//! standbys that must confirm it have confirmed the primary's WAL position as of the re-read.
//! Everything else is [`Error::CommitUnknown`](crate::Error::CommitUnknown).

/// The `synchronous_commit` levels that wait at least for what the server's replication
/// settings require: `on` (the local flush, and the synchronous standbys' flush when
/// `synchronous_standby_names` names any) and `remote_apply`. The library's sessions run with
/// the server's setting when it is one of these, and with `on` otherwise (`off`, `local` and
/// `remote_write` would let a grant be reported that a crash or a failover undoes).
pub(crate) const DURABLE_ENOUGH: [&str; 2] = ["on", "remote_apply"];

/// The statement that makes a session's `synchronous_commit` durable enough (see
/// [`DURABLE_ENOUGH`]); it never weakens the server's own level.
pub(crate) fn synchronous_commit_setting() -> String {
    let kept = DURABLE_ENOUGH
        .iter()
        .map(|l| format!("'{l}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT set_config('synchronous_commit', CASE WHEN current_setting('synchronous_commit') \
         IN ({kept}) THEN current_setting('synchronous_commit') ELSE 'on' END, false)"
    )
}

/// Read with the row by the re-read: the standbys that must confirm commits, and the WAL
/// position (at or past the commit record of any commit the re-read sees).
pub(crate) const WAL_POSITION: &str =
    "SELECT current_setting('synchronous_standby_names'), pg_current_wal_lsn()::text";

/// How many synchronous standbys have confirmed WAL position `$1` (flushed it, or applied it
/// when the session's level is `remote_apply`). The positions are visible to superusers and
/// members of `pg_monitor` (`pg_read_all_stats`) only: for other roles the count is 0.
pub(crate) const CONFIRMED_STANDBYS: &str = "SELECT count(*)::int8 FROM pg_stat_replication \
     WHERE sync_state IN ('sync', 'quorum') AND (CASE WHEN current_setting('synchronous_commit') \
     = 'remote_apply' THEN replay_lsn ELSE flush_lsn END) >= $1::text::pg_lsn";

/// How many synchronous standbys must confirm a commit, from `synchronous_standby_names`
/// (PostgreSQL's grammar: empty for none; `s1, s2` or `*` for the first one; `FIRST n (…)` or
/// `n (…)` for the first `n`; `ANY n (…)` for any `n`). `None` when the value does not parse:
/// then no commit cut short can be shown durable.
pub(crate) fn standbys_required(names: &str) -> Option<u32> {
    let s = names.trim();
    if s.is_empty() {
        return Some(0);
    }
    let keyword = strip_word(s, "FIRST").or_else(|| strip_word(s, "ANY"));
    let rest = keyword.unwrap_or(s);
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        // A plain list: the first listed standby that is connected is the synchronous one.
        // After FIRST or ANY the count is mandatory.
        return (keyword.is_none() && !s.starts_with('(')).then_some(1);
    }
    let n: u32 = rest[..digits].parse().ok()?;
    rest[digits..].trim_start().starts_with('(').then_some(n)
}

/// `s` without its leading keyword `word` (any case) and the blanks after it.
fn strip_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let head = s.get(..word.len())?;
    let rest = &s[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(char::is_whitespace))
        .then(|| rest.trim_start())
}

/// What a re-read after a commit whose reply never came shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reread {
    /// The row does not hold our record: nothing was committed.
    NotOurs,
    /// The row holds our record; `required` standbys must confirm commits
    /// ([`standbys_required`], `None` when that is unknown), and `confirmed` synchronous
    /// standbys have confirmed (flushed, or applied under `remote_apply`) the WAL position
    /// read with the row, or later.
    Ours {
        required: Option<u32>,
        confirmed: u32,
    },
}

/// The judgement on a commit whose reply never came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It did not happen: report the failure.
    NotCommitted,
    /// It happened and is as durable as the server makes commits: report success.
    Committed,
    /// It happened on this server, but the standbys that must confirm it have not (yet): it
    /// may be lost to a failover. Look again until the caller's deadline, then report
    /// [`Error::CommitUnknown`](crate::Error::CommitUnknown).
    NotYetDurable,
}

/// Decides what a re-read proves (see the module documentation).
pub(crate) fn verdict(read: Reread) -> Verdict {
    match read {
        Reread::NotOurs => Verdict::NotCommitted,
        Reread::Ours {
            required: Some(required),
            confirmed,
        } if confirmed >= required => Verdict::Committed,
        Reread::Ours { .. } => Verdict::NotYetDurable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_level_keeps_only_the_durable_levels() {
        let sql = synchronous_commit_setting();
        assert!(sql.contains("IN ('on', 'remote_apply')"), "{sql}");
        assert!(sql.contains("ELSE 'on' END"), "{sql}");
    }

    #[test]
    fn standbys_required_follows_the_servers_grammar() {
        for (names, n) in [
            ("", Some(0)),
            ("  ", Some(0)),
            ("s1", Some(1)),
            ("*", Some(1)),
            ("s1, s2", Some(1)),
            ("\"standby one\"", Some(1)),
            ("2 (s1, s2, s3)", Some(2)),
            ("FIRST 2 (s1, s2, s3)", Some(2)),
            ("first 1 (s1)", Some(1)),
            ("ANY 3 (s1, s2, s3)", Some(3)),
            ("any 1(*)", Some(1)),
            ("ANY 1 (*)", Some(1)),
            ("FIRST (s1)", None),
            ("2 s1", None),
            ("(s1)", None),
        ] {
            assert_eq!(standbys_required(names), n, "{names:?}");
        }
        // A standby named like the keyword is a plain list.
        assert_eq!(standbys_required("first"), Some(1));
        assert_eq!(standbys_required("anyhost"), Some(1));
    }

    #[test]
    fn a_commit_cut_short_counts_only_once_the_standbys_confirmed_it() {
        assert_eq!(verdict(Reread::NotOurs), Verdict::NotCommitted);
        let ours = |required, confirmed| Reread::Ours {
            required,
            confirmed,
        };
        assert_eq!(verdict(ours(Some(0), 0)), Verdict::Committed);
        assert_eq!(verdict(ours(Some(1), 1)), Verdict::Committed);
        assert_eq!(verdict(ours(Some(2), 3)), Verdict::Committed);
        assert_eq!(verdict(ours(Some(1), 0)), Verdict::NotYetDurable);
        assert_eq!(verdict(ours(Some(2), 1)), Verdict::NotYetDurable);
        assert_eq!(verdict(ours(None, 5)), Verdict::NotYetDurable);
    }
}
