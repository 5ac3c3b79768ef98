//! Session ids, owners and the safe file stem of an id.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The longest session id accepted, in bytes.
pub const MAX_ID_BYTES: usize = 1024;
/// The longest owner accepted, in bytes.
pub const MAX_OWNER_BYTES: usize = 1024;
/// The number of characters of an id kept readable in its stem.
const PREFIX_CHARS: usize = 40;

/// A validated session id: 1 to [`MAX_ID_BYTES`] bytes, no control characters.
///
/// Any such string is allowed; the file names derived from it ([`stem`]) are always safe, so
/// ids like `a/b` or `../etc/passwd` cannot reach outside the lease directory.
///
/// # Examples
///
/// ```
/// use flocklease::SessionId;
///
/// let id = SessionId::new("orders/eu-1").unwrap();
/// assert_eq!(id.stem(), "orders_eu-1-9e6170a68a528904");
/// assert!(SessionId::new("").is_err());
/// // Also by parsing or conversion:
/// assert_eq!("orders/eu-1".parse::<SessionId>().unwrap(), id);
/// assert_eq!(SessionId::try_from(String::from("orders/eu-1")).unwrap(), id);
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(Arc<IdAndStem>);

/// The id and its stem, computed once; shared by clones.
#[derive(PartialEq, Eq, PartialOrd, Ord, Hash)]
struct IdAndStem {
    id: String,
    stem: String,
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SessionId").field(&self.0.id).finish()
    }
}

impl SessionId {
    /// Validates `id`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when `id` is empty, longer than [`MAX_ID_BYTES`] or contains a control
    /// character (NUL included).
    pub fn new(id: impl Into<String>) -> Result<SessionId, InvalidInput> {
        let id = id.into();
        check("session id", &id, MAX_ID_BYTES)?;
        let stem = stem(id.as_bytes());
        Ok(SessionId(Arc::new(IdAndStem { id, stem })))
    }

    /// The id as given.
    pub fn as_str(&self) -> &str {
        &self.0.id
    }

    /// The safe file stem of this id (see [`stem`]), computed once.
    pub fn stem(&self) -> &str {
        &self.0.stem
    }
}

impl std::str::FromStr for SessionId {
    type Err = InvalidInput;

    /// As [`SessionId::new`]: `"orders/eu-1".parse::<SessionId>()`.
    fn from_str(s: &str) -> Result<SessionId, InvalidInput> {
        SessionId::new(s)
    }
}

impl TryFrom<&str> for SessionId {
    type Error = InvalidInput;

    fn try_from(s: &str) -> Result<SessionId, InvalidInput> {
        SessionId::new(s)
    }
}

impl TryFrom<String> for SessionId {
    type Error = InvalidInput;

    fn try_from(s: String) -> Result<SessionId, InvalidInput> {
        SessionId::new(s)
    }
}

impl serde::Serialize for SessionId {
    /// As the id string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for SessionId {
    /// From a string, validated as [`SessionId::new`].
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SessionId, D::Error> {
        SessionId::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.id)
    }
}

/// A validated owner: 1 to [`MAX_OWNER_BYTES`] bytes, no control characters.
///
/// An owner is never empty: an empty owner in the record means "not held" (a tombstone).
///
/// # Examples
///
/// ```
/// use flocklease::Owner;
///
/// assert_eq!(Owner::new("worker-7").unwrap().as_str(), "worker-7");
/// assert!(Owner::new("").is_err());
/// assert_eq!("worker-7".parse::<Owner>().unwrap(), Owner::try_from("worker-7").unwrap());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(Arc<str>);

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Owner").field(&&*self.0).finish()
    }
}

impl Owner {
    /// Validates `owner`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] when `owner` is empty, longer than [`MAX_OWNER_BYTES`] or contains a
    /// control character.
    pub fn new(owner: impl Into<String>) -> Result<Owner, InvalidInput> {
        let owner = owner.into();
        check("owner", &owner, MAX_OWNER_BYTES)?;
        Ok(Owner(owner.into()))
    }

    /// The owner as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This process, as `HOST:PID` (the host name, `localhost` if it cannot be read).
    ///
    /// Every thread of the process gets the same owner, and an instance treats an acquire by
    /// the owner it already holds for as a refresh (PROTOCOL §3.1): threads sharing one
    /// instance and this owner are all "inside" at once. For one holder at a time among
    /// threads, give each acquirer its own owner ([`Owner::unique`]), as
    /// [`SessionLease::acquire_guard`](crate::SessionLease::acquire_guard) does.
    ///
    /// ```
    /// let me = flocklease::Owner::this_process();
    /// assert!(me.as_str().ends_with(&format!(":{}", std::process::id())));
    /// ```
    pub fn this_process() -> Owner {
        Owner(format!("{}:{}", host_name(), std::process::id()).into())
    }

    /// A new owner distinct from every other one this process makes: `HOST:PID:N`. Two
    /// acquirers with distinct owners exclude each other even on one instance.
    ///
    /// ```
    /// use flocklease::Owner;
    ///
    /// assert_ne!(Owner::unique(), Owner::unique());
    /// ```
    pub fn unique() -> Owner {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Owner(format!("{}:{}:{n}", host_name(), std::process::id()).into())
    }
}

/// The host name, without control characters and bounded so an owner built from it is valid.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let clean: String = name.chars().filter(|c| !c.is_control()).take(255).collect();
    if clean.is_empty() {
        "localhost".into()
    } else {
        clean
    }
}

impl std::str::FromStr for Owner {
    type Err = InvalidInput;

    /// As [`Owner::new`]: `"worker-7".parse::<Owner>()`.
    fn from_str(s: &str) -> Result<Owner, InvalidInput> {
        Owner::new(s)
    }
}

impl TryFrom<&str> for Owner {
    type Error = InvalidInput;

    fn try_from(s: &str) -> Result<Owner, InvalidInput> {
        Owner::new(s)
    }
}

impl TryFrom<String> for Owner {
    type Error = InvalidInput;

    fn try_from(s: String) -> Result<Owner, InvalidInput> {
        Owner::new(s)
    }
}

impl serde::Serialize for Owner {
    /// As the owner string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Owner {
    /// From a string, validated as [`Owner::new`].
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Owner, D::Error> {
        Owner::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a session id or owner was refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The value is empty.
    Empty {
        /// `"owner"` or `"session id"`.
        what: &'static str,
    },
    /// The value is longer than allowed.
    TooLong {
        /// `"owner"` or `"session id"`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The value contains a control character.
    ControlCharacter {
        /// `"owner"` or `"session id"`.
        what: &'static str,
        /// Byte offset of the first control character.
        at: usize,
    },
}

impl fmt::Display for InvalidInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidInput::Empty { what } => write!(f, "{what} is empty"),
            InvalidInput::TooLong { what, len, max } => {
                write!(f, "{what} is {len} bytes long, over the {max}-byte limit")
            }
            InvalidInput::ControlCharacter { what, at } => {
                write!(f, "{what} has a control character at byte {at}")
            }
        }
    }
}

impl std::error::Error for InvalidInput {}

/// The safe file stem of a session id given as bytes.
///
/// `prefix + "-" + hex(first 8 bytes of SHA-256(id))`. The prefix walks the id character by
/// character (an invalid UTF-8 byte counts as one character) and stops once it holds 40
/// characters; an ASCII letter, digit, `-` or `_` is kept, anything else becomes one `_`. An
/// empty prefix becomes `id`. The stem is therefore at most 57 ASCII bytes of `[A-Za-z0-9_-]`,
/// never `.` or `..`, and identical to the Go package's.
///
/// # Examples
///
/// ```
/// assert_eq!(flocklease::stem(b"a/b"), "a_b-c14cddc033f64b9d");
/// assert_eq!(flocklease::stem("héllo wörld".as_bytes()), "h_llo_w_rld-a1003f7d04a41157");
/// ```
pub fn stem(id: &[u8]) -> String {
    let prefix: String = id
        .utf8_chunks()
        .flat_map(|chunk| {
            let kept = chunk.valid().chars().map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            });
            // Each byte of an invalid sequence counts as one character.
            kept.chain(chunk.invalid().iter().map(|_| '_'))
        })
        .take(PREFIX_CHARS)
        .collect();
    let prefix = if prefix.is_empty() { "id" } else { &prefix };
    let digest = Sha256::digest(id);
    let hash = digest[..8]
        .iter()
        .fold(0u64, |h, &b| (h << 8) | u64::from(b));
    format!("{prefix}-{hash:016x}")
}

fn check(what: &'static str, s: &str, max: usize) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::Empty { what });
    }
    if s.len() > max {
        return Err(InvalidInput::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    if let Some((at, _)) = s.char_indices().find(|(_, c)| c.is_control()) {
        return Err(InvalidInput::ControlCharacter { what, at });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        assert_eq!(
            stem(b"conf-lease-fresh"),
            "conf-lease-fresh-25bfc77ba4eaaad1"
        );
        assert_eq!(stem(b"a/b"), "a_b-c14cddc033f64b9d");
        assert_eq!(stem(b"../etc/passwd"), "___etc_passwd-7fef78f53440346c");
        assert_eq!(
            stem("héllo wörld".as_bytes()),
            "h_llo_w_rld-a1003f7d04a41157"
        );
        assert_eq!(
            stem("x".repeat(50).as_bytes()),
            format!("{}-77cf12060d47183e", "x".repeat(40))
        );
    }

    #[test]
    fn invalid_utf8_bytes_count_one_each_and_empty_prefix_is_id() {
        let s = stem(b"\xff\xfea");
        assert!(s.starts_with("__a-"), "{s}");
        assert!(stem(b"").starts_with("id-"));
        // A long run of invalid bytes is cut at 40 characters too.
        let s = stem(&[0xffu8; 100]);
        assert!(s.starts_with(&format!("{}-", "_".repeat(40))), "{s}");
        assert_eq!(s.len(), 57);
    }

    #[test]
    fn multibyte_characters_count_once() {
        let id = "é".repeat(45);
        let s = stem(id.as_bytes());
        assert!(s.starts_with(&format!("{}-", "_".repeat(40))), "{s}");
    }

    #[test]
    fn validation() {
        assert!(matches!(
            SessionId::new(""),
            Err(InvalidInput::Empty { .. })
        ));
        assert!(matches!(
            SessionId::new("a\0b"),
            Err(InvalidInput::ControlCharacter { at: 1, .. })
        ));
        assert!(matches!(
            SessionId::new("x".repeat(10_000)),
            Err(InvalidInput::TooLong { len: 10_000, .. })
        ));
        assert!(SessionId::new("x".repeat(MAX_ID_BYTES)).is_ok());
        assert!(SessionId::new("../etc/passwd").is_ok());
        assert!(matches!(Owner::new(""), Err(InvalidInput::Empty { .. })));
        assert!(Owner::new("x".repeat(MAX_OWNER_BYTES + 1)).is_err());
        assert!(Owner::new("tab\there").is_err());
    }
}
