//! When a commit whose reply never came counts (PROTOCOL §8.4): the pure judgement the
//! PostgreSQL adapter makes after it ended its session and re-read the row, and that the
//! model checker's PostgreSQL configuration makes at the same point, against a standby whose
//! confirmation can lag and a failover.
//!
//! A commit whose wait for the synchronous standbys was cut short becomes visible on the
//! primary alone (one still waiting is not visible to others yet). So finding one's own record
//! in a re-read proves the commit only once the standbys that must confirm it have.

/// How many synchronous standbys must confirm a commit, from `synchronous_standby_names`
/// (PostgreSQL's grammar: empty for none; `s1, s2` or `*` for the first one; `FIRST n (…)` or
/// `n (…)` for the first `n`; `ANY n (…)` for any `n`). `None` when the value does not parse:
/// then no commit cut short can be shown durable.
pub fn standbys_required(names: &str) -> Option<u32> {
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
pub enum Reread {
    /// The row does not hold our record: nothing was committed.
    NotOurs,
    /// The row holds our record.
    Ours {
        /// How many standbys must confirm commits ([`standbys_required`]; `None` when that
        /// is unknown).
        required: Option<u32>,
        /// How many synchronous standbys have confirmed (flushed, or applied under
        /// `remote_apply`) the WAL position read with the row, or a later one.
        confirmed: u32,
    },
}

/// The judgement on a commit whose reply never came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It did not happen: report the failure.
    NotCommitted,
    /// It happened and is as durable as the server makes commits: report success.
    Committed,
    /// It happened on this server, but the standbys that must confirm it have not (yet): it
    /// may be lost to a failover. Look again until the caller's deadline, then report
    /// `Error::CommitUnknown`.
    NotYetDurable,
}

/// Decides what a re-read proves (see the module documentation).
pub fn verdict(read: Reread) -> Verdict {
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
