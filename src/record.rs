//! The lease record `{owner, token, expiry}`: a strict, bounded decoder and a canonical encoder.
//!
//! The encoder writes exactly what the Go package writes for a UTC expiry:
//! `{"owner":"…","token":N,"expiry":"…"}` with Go's `encoding/json` string escaping and
//! `time.RFC3339Nano`. The decoder accepts what the Go package may write (keys in any order,
//! unknown keys, any offset) and refuses everything else as corrupt, so a damaged record can
//! never read as "free, token 0".

use std::fmt;

use serde::Deserialize;

use crate::timestamp::{TimeError, Timestamp};

/// The largest record file accepted, in bytes (64 KiB).
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// The durable state of one session id: who holds it, its fencing token and when it expires.
///
/// An empty `owner` is a *tombstone*: the lease is not held, whatever `expiry` says, and
/// `token` remembers the last generation so the next grant gets a greater one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// The holder's owner string; empty for a tombstone.
    pub owner: String,
    /// The fencing token of the recorded generation.
    pub token: u64,
    /// When the recorded generation expires (`now >= expiry` means expired).
    pub expiry: Timestamp,
}

impl Record {
    /// Whether this record is a tombstone (empty owner: not held).
    pub fn is_tombstone(&self) -> bool {
        self.owner.is_empty()
    }
}

/// Why record bytes are corrupt.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodeError {
    /// The file is larger than 64 KiB (`MAX_RECORD_BYTES`).
    TooLarge {
        /// The size seen (at least the limit plus one).
        len: usize,
    },
    /// The bytes are not a JSON object with the three keys of the right types (a missing key,
    /// a duplicated key, a negative, fractional, quoted or too large token, `null`, invalid
    /// UTF-8, trailing bytes, ...). The text is the JSON parser's description.
    Json(String),
    /// The `expiry` string is not an acceptable RFC 3339 instant.
    Expiry(TimeError),
    /// A [fence file](crate::fence) does not hold one token as decimal digits (no sign, no
    /// leading zero) and a newline, nor is it empty. The text says what is wrong.
    FenceToken(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooLarge { len } => {
                write!(
                    f,
                    "record is {len} bytes, over the {MAX_RECORD_BYTES}-byte limit"
                )
            }
            DecodeError::Json(msg) => write!(f, "record is not a valid lease object: {msg}"),
            DecodeError::Expiry(e) => write!(f, "record expiry is invalid: {e}"),
            DecodeError::FenceToken(msg) => {
                write!(f, "not a token as decimal digits and a newline: {msg}")
            }
        }
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DecodeError::Expiry(e) => Some(e),
            _ => None,
        }
    }
}

/// Decodes record bytes strictly. Never panics, whatever the bytes.
///
/// # Errors
///
/// [`DecodeError`] when the bytes are not a valid record (see [`DecodeError`]'s variants).
///
/// # Examples
///
/// ```
/// use flocklease::record;
///
/// let r = record::decode(br#"{"expiry":"2026-11-30T05:20:54.123456789+01:00","owner":"a","token":7}"#)
///     .unwrap();
/// assert_eq!((r.owner.as_str(), r.token), ("a", 7));
/// assert_eq!(r.expiry.to_string(), "2026-11-30T04:20:54.123456789Z");
/// assert!(record::decode(b"null").is_err());
/// ```
pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    decode_tagged(bytes).map(|(record, _)| record)
}

/// Decodes record bytes strictly, with the [`LiveTag`] of the recorded generation's liveness
/// file when the record names one (the `live` key, which the Go package neither writes nor
/// keeps). Never panics, whatever the bytes.
///
/// # Errors
///
/// As [`decode`]; besides, a `live` key that is not 16 lowercase hexadecimal digits is
/// [`DecodeError::Json`].
///
/// # Examples
///
/// ```
/// use flocklease::record::{self, LiveTag};
///
/// let bytes = br#"{"owner":"a","token":7,"expiry":"2026-11-30T04:20:54Z","live":"00000000000000ff"}"#;
/// let (r, tag) = record::decode_tagged(bytes).unwrap();
/// assert_eq!((r.token, tag), (7, Some(LiveTag(0xff))));
/// // A record the Go package wrote names no tag.
/// let (_, tag) = record::decode_tagged(br#"{"owner":"a","token":7,"expiry":"2026-11-30T04:20:54Z"}"#).unwrap();
/// assert_eq!(tag, None);
/// ```
pub fn decode_tagged(bytes: &[u8]) -> Result<(Record, Option<LiveTag>), DecodeError> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(DecodeError::TooLarge { len: bytes.len() });
    }
    let raw: Raw = serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
    let expiry = Timestamp::parse_rfc3339(&raw.expiry).map_err(DecodeError::Expiry)?;
    let tag = match raw.live {
        None => None,
        Some(text) => Some(LiveTag::parse(text.as_bytes()).ok_or_else(|| {
            DecodeError::Json(format!(
                "\"live\" is not 16 lowercase hexadecimal digits: {text:?}"
            ))
        })?),
    };
    let record = Record {
        owner: raw.owner,
        token: raw.token,
        expiry,
    };
    Ok((record, tag))
}

/// The identity of one published liveness file: a random value written into the file and
/// named by the record (key `live`), so that a probe can tell the generation's own file from
/// one that a tmp cleaner, an operator or another program put at its name.
///
/// Inode numbers cannot tell: a deleted file's inode number is reused at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LiveTag(pub u64);

impl LiveTag {
    /// The bytes written into the liveness file and into the record: 16 lowercase hex digits.
    pub fn to_hex(self) -> [u8; 16] {
        use std::io::Write;
        let mut out = [0u8; 16];
        write!(&mut out[..], "{:016x}", self.0).expect("sixteen digits fill sixteen bytes");
        out
    }

    /// Parses exactly 16 lowercase hex digits (what [`LiveTag::to_hex`] writes).
    pub fn parse(bytes: &[u8]) -> Option<LiveTag> {
        // `from_str_radix` alone would also take upper case and a leading `+`.
        if bytes.len() != 16 || !bytes.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let hex = std::str::from_utf8(bytes).ok()?;
        u64::from_str_radix(hex, 16).ok().map(LiveTag)
    }
}

/// Encodes a record canonically: `{"owner":"…","token":N,"expiry":"…"}`, no whitespace, the
/// owner escaped as Go's `encoding/json` escapes it, the expiry as Go's `time.RFC3339Nano` in UTC.
///
/// # Examples
///
/// ```
/// use flocklease::{record, Record, Timestamp};
///
/// let r = Record {
///     owner: "worker <1>".into(),
///     token: 3,
///     expiry: Timestamp::parse_rfc3339("2023-11-14T22:13:50.5Z").unwrap(),
/// };
/// assert_eq!(
///     record::encode(&r),
///     br#"{"owner":"worker \u003c1\u003e","token":3,"expiry":"2023-11-14T22:13:50.5Z"}"#
/// );
/// assert_eq!(record::decode(&record::encode(&r)).unwrap(), r);
/// ```
pub fn encode(r: &Record) -> Vec<u8> {
    encode_tagged(r, None)
}

/// Encodes a record as [`encode`] does, naming the recorded generation's [`LiveTag`] (key
/// `live`, last) when there is one.
///
/// # Examples
///
/// ```
/// use flocklease::record::{self, LiveTag};
/// use flocklease::{Record, Timestamp};
///
/// let r = Record {
///     owner: "a".into(),
///     token: 3,
///     expiry: Timestamp::parse_rfc3339("2023-11-14T22:13:50Z").unwrap(),
/// };
/// assert_eq!(
///     record::encode_tagged(&r, Some(LiveTag(0xabc))),
///     br#"{"owner":"a","token":3,"expiry":"2023-11-14T22:13:50Z","live":"0000000000000abc"}"#
/// );
/// ```
pub fn encode_tagged(r: &Record, tag: Option<LiveTag>) -> Vec<u8> {
    use std::fmt::Write;
    let mut out = String::with_capacity(70 + r.owner.len());
    out.push_str("{\"owner\":");
    push_go_json_string(&mut out, &r.owner);
    let (token, expiry) = (r.token, r.expiry);
    write!(out, ",\"token\":{token},\"expiry\":\"{expiry}\"").expect("a String takes any write");
    if let Some(LiveTag(tag)) = tag {
        write!(out, ",\"live\":\"{tag:016x}\"").expect("a String takes any write");
    }
    out.push('}');
    out.into_bytes()
}

/// The decoding shape: unknown keys are ignored, every listed key is required, duplicates and
/// wrong types are errors.
#[derive(Deserialize)]
struct Raw {
    owner: String,
    token: u64,
    expiry: String,
    /// The liveness file's tag; absent in the Go package's records.
    #[serde(default)]
    live: Option<String>,
}

/// Appends `s` as a JSON string the way Go's `encoding/json` (Go 1.22+, HTML escaping on) does:
/// `"` `\` and control characters escaped (`\b \f \n \r \t` short, others `\u00xx`), `<` `>` `&`
/// and U+2028/U+2029 as `\u` escapes, everything else verbatim.
fn push_go_json_string(out: &mut String, s: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c if (c as u32) < 0x20 || matches!(c, '<' | '>' | '&') => {
                write!(out, "\\u{:04x}", c as u32).expect("a String takes any write");
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(owner: &str, token: u64, expiry: &str) -> Record {
        Record {
            owner: owner.into(),
            token,
            expiry: Timestamp::parse_rfc3339(expiry).unwrap(),
        }
    }

    #[test]
    fn reads_a_go_written_record_with_offset() {
        let r =
            decode(br#"{"expiry":"2026-11-30T05:20:54.123456789+01:00","owner":"a","token":7}"#)
                .unwrap();
        assert_eq!(r, rec("a", 7, "2026-11-30T04:20:54.123456789Z"));
    }

    #[test]
    fn writes_canonical_bytes() {
        let r = rec("a", 7, "2026-11-30T04:20:54.5Z");
        assert_eq!(
            encode(&r),
            br#"{"owner":"a","token":7,"expiry":"2026-11-30T04:20:54.5Z"}"#
        );
        let tomb = rec("", u64::MAX, "0001-01-01T00:00:00Z");
        assert_eq!(
            encode(&tomb),
            br#"{"owner":"","token":18446744073709551615,"expiry":"0001-01-01T00:00:00Z"}"#
        );
    }

    #[test]
    fn escapes_like_go() {
        let r = rec(
            "q\"b\\s\u{8}\u{c}\n\r\t\u{1}\u{1f}<>&\u{7f}é\u{2028}\u{2029}😀",
            1,
            "2023-11-14T22:13:50Z",
        );
        let s = String::from_utf8(encode(&r)).unwrap();
        assert_eq!(
            s,
            "{\"owner\":\"q\\\"b\\\\s\\b\\f\\n\\r\\t\\u0001\\u001f\\u003c\\u003e\\u0026\u{7f}é\\u2028\\u2029😀\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}"
        );
        assert_eq!(decode(s.as_bytes()).unwrap(), r);
    }

    #[test]
    fn accepts_reordered_unknown_keys_and_whitespace() {
        let r = decode(
            b" {\"token\": 2, \"extra\": {\"nested\": [1, 2.5, null]}, \"expiry\": \"2023-11-14T22:13:50Z\", \"owner\": \"x\"}\n",
        )
        .unwrap();
        assert_eq!(r, rec("x", 2, "2023-11-14T22:13:50Z"));
    }

    #[test]
    fn refuses_every_corrupt_kind() {
        let cases: &[&[u8]] = &[
            b"",
            b"null",
            b"[]",
            b"{}",
            b"{\"owner\":\"a\",\"token\":1}",
            b"{\"owner\":\"a\",\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":-1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":1.5,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":1.0,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":1e3,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":\"1\",\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":18446744073709551616,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":null,\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"owner\":\"b\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
            b"{\"owner\":\"a\",\"token\":1,\"expiry\":\"yesterday\"}",
            b"{\"owner\":\"a\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"} x",
            b"{\"owner\":\"\xff\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}",
        ];
        for c in cases {
            assert!(decode(c).is_err(), "{:?}", String::from_utf8_lossy(c));
        }
        assert!(matches!(
            decode(b"{\"owner\":\"a\",\"token\":1,\"expiry\":\"2023-02-30T00:00:00Z\"}"),
            Err(DecodeError::Expiry(TimeError::FieldRange))
        ));
    }

    #[test]
    fn refuses_oversized_input_before_parsing() {
        let mut big = br#"{"owner":"a","token":1,"expiry":"2023-11-14T22:13:50Z","pad":""#.to_vec();
        big.resize(MAX_RECORD_BYTES + 1, b' ');
        assert_eq!(
            decode(&big),
            Err(DecodeError::TooLarge {
                len: MAX_RECORD_BYTES + 1
            })
        );
    }

    #[test]
    fn deep_nesting_in_unknown_keys_does_not_crash() {
        let mut s = String::from("{\"x\":");
        s.push_str(&"[".repeat(10_000));
        s.push_str(&"]".repeat(10_000));
        s.push_str(",\"owner\":\"a\",\"token\":1,\"expiry\":\"2023-11-14T22:13:50Z\"}");
        // Skipped without recursion: the record is read, the unknown key ignored.
        assert_eq!(
            decode(s.as_bytes()).unwrap(),
            rec("a", 1, "2023-11-14T22:13:50Z")
        );
        // A deeply nested value where a string is expected is an error, not a stack overflow.
        let mut t = String::from("{\"owner\":");
        t.push_str(&"[".repeat(10_000));
        assert!(decode(t.as_bytes()).is_err());
    }
}
