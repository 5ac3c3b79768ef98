//! When a commit whose reply never came counts (PROTOCOL §8.4): the pure judgement the
//! PostgreSQL adapter makes after it ended its session and re-read the row, and that the
//! model checker's PostgreSQL configuration makes at the same point, against a standby whose
//! confirmation can lag and a failover.
//!
//! A commit whose wait for the synchronous standbys was cut short becomes visible on the
//! primary alone (one still waiting is not visible to others yet). So finding one's own record
//! in a re-read proves the commit only once the standbys that must confirm it have.

/// How many synchronous standbys must confirm a commit, from `synchronous_standby_names`,
/// read by PostgreSQL's own grammar: empty for none; a list `s1, s2` (names, numbers, `*` or
/// `"quoted names"`) for the first one connected; `n (…)` or `FIRST n (…)` for the first `n`;
/// `ANY n (…)` for any `n`. Keywords are case-blind, blanks are ASCII blanks, and a keyword
/// standing alone is a keyword, never a name. `None` when the server would refuse the value
/// (a syntax error, or a count that is not positive): then no commit cut short can be shown
/// durable.
///
/// A count past `i32::MAX` is `None` as well. The server reads counts with C's `atoi`, whose
/// answer there depends on the platform (on 64-bit Linux `4294967297` reads as 1 and
/// `2147483648` as a negative count it refuses): not knowing is the safe side.
pub fn standbys_required(names: &str) -> Option<u32> {
    if names.is_empty() {
        return Some(0);
    }
    let tokens = tokens(names)?;
    let (count, list) = match tokens.as_slice() {
        [
            Token::Any | Token::First,
            Token::Num(n),
            Token::Open,
            list @ ..,
            Token::Close,
        ]
        | [Token::Num(n), Token::Open, list @ .., Token::Close] => (Some(*n), list),
        list => (None, list),
    };
    // The list: one name or more, separated by commas (a number is a name here).
    let mut want_name = true;
    for token in list {
        match (want_name, token) {
            (true, Token::Name | Token::Num(_)) | (false, Token::Comma) => want_name = !want_name,
            _ => return None,
        }
    }
    if want_name {
        return None;
    }
    match count {
        None => Some(1),
        Some(digits) => {
            let n: i32 = digits.parse().ok()?;
            u32::try_from(n).ok().filter(|&n| n > 0)
        }
    }
}

/// A token of the server's `synchronous_standby_names` scanner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token<'a> {
    Any,
    First,
    /// An identifier, a quoted name or `*`.
    Name,
    /// Digits (a count, or a standby's name).
    Num(&'a str),
    Comma,
    Open,
    Close,
}

/// `names` split as the server's scanner splits it; `None` at a character it does not take
/// (outside quotes) or an unterminated quote. Bytes past ASCII are identifier characters.
fn tokens(names: &str) -> Option<Vec<Token<'_>>> {
    let ident_start = |b: u8| b.is_ascii_alphabetic() || b == b'_' || b >= 0x80;
    let ident_cont = |b: u8| ident_start(b) || b.is_ascii_digit() || b == b'$';
    let bytes = names.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let start = i;
        i += 1;
        let token = match b {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => continue,
            b',' => Token::Comma,
            b'(' => Token::Open,
            b')' => Token::Close,
            b'*' => Token::Name,
            b'"' => {
                // A doubled quote inside is one quote; the name ends at a single one.
                loop {
                    match (bytes.get(i), bytes.get(i + 1)) {
                        (None, _) => return None,
                        (Some(b'"'), Some(b'"')) => i += 2,
                        (Some(b'"'), _) => break,
                        _ => i += 1,
                    }
                }
                i += 1;
                Token::Name
            }
            b'0'..=b'9' => {
                while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                }
                // `start..i` holds ASCII digits only: a character boundary on both sides.
                Token::Num(&names[start..i])
            }
            b if ident_start(b) => {
                while bytes.get(i).is_some_and(|&b| ident_cont(b)) {
                    i += 1;
                }
                let word = &bytes[start..i];
                if word.eq_ignore_ascii_case(b"any") {
                    Token::Any
                } else if word.eq_ignore_ascii_case(b"first") {
                    Token::First
                } else {
                    Token::Name
                }
            }
            _ => return None,
        };
        out.push(token);
    }
    Some(out)
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
            ("s1", Some(1)),
            ("*", Some(1)),
            ("s1, s2", Some(1)),
            ("s1,s2", Some(1)),
            ("\"standby one\"", Some(1)),
            ("\"a\"\"b\", \"\"", Some(1)),
            ("\"*\"", Some(1)),
            ("na\u{ef}ve", Some(1)),
            ("_x$1", Some(1)),
            // A number is a name in a list.
            ("7", Some(1)),
            ("7, 8", Some(1)),
            ("2 (s1, s2, s3)", Some(2)),
            ("02(s1)", Some(2)),
            ("FIRST 2 (s1, s2, s3)", Some(2)),
            ("first 1 (s1)", Some(1)),
            ("\tFiRsT\x0b1\r(\x0cs1 )  ", Some(1)),
            ("ANY 3 (s1, s2, s3)", Some(3)),
            ("any 1(*)", Some(1)),
            ("ANY 1 (*)", Some(1)),
            ("ANY 1 (7)", Some(1)),
            ("2147483647 (s1)", Some(2147483647)),
            // A name spelled like a keyword is a name only quoted.
            ("\"first\"", Some(1)),
            ("anyhost", Some(1)),
            ("firsts, any1", Some(1)),
            // What the server refuses.
            ("  ", None),
            ("first", None),
            ("s1, ANY", None),
            ("FIRST (s1)", None),
            ("ANY 0 (s1)", None),
            ("00 (s1)", None),
            ("2147483648 (s1)", None),
            ("FIRST 1 ()", None),
            ("FIRST 1 (s1", None),
            ("FIRST 1 (s1) s2", None),
            ("FIRST 1 ((s1))", None),
            ("2 s1", None),
            ("(s1)", None),
            ("s1,", None),
            (",s1", None),
            ("s1,,s2", None),
            ("s-1", None),
            ("s1; s2", None),
            ("$s1", None),
            ("1abc", None),
            ("\"s1", None),
            ("s1 s2", None),
            ("\"FIRST\" 1 (s1)", None),
            // The server's atoi reads this as 1 on 64-bit Linux; we do not guess.
            ("4294967297 (s1)", None),
        ] {
            assert_eq!(standbys_required(names), n, "{names:?}");
        }
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
