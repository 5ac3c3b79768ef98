//! Wall-clock instants with nanosecond precision and their RFC 3339 text form.
//!
//! A [`Timestamp`] is plain data (an integer count of nanoseconds since the Unix epoch), so the
//! pure machine, the model checker and the fuzzers can build one without reading any clock.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NANOS_PER_SEC: i128 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;

/// A wall-clock instant in UTC with nanosecond precision, between the years 0001 and 9999.
///
/// The range is the one the record format can express (RFC 3339 with a four-digit year), so
/// every `Timestamp` can be written to a record and read back unchanged.
///
/// # Examples
///
/// ```
/// use flocklease::Timestamp;
///
/// let t = Timestamp::parse_rfc3339("2023-11-14T23:13:50.5+01:00").unwrap();
/// assert_eq!(t.to_string(), "2023-11-14T22:13:50.5Z");
/// assert_eq!(format!("{t:?}"), "Timestamp(2023-11-14T22:13:50.5Z)");
/// assert_eq!(t.unix_nanos(), 1_700_000_030_500_000_000);
/// // To and from SystemTime (a SystemTime outside the years 0001-9999 does not convert).
/// let st: std::time::SystemTime = t.into();
/// assert_eq!(Timestamp::try_from(st).unwrap(), t);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    unix_nanos: i128,
}

impl fmt::Debug for Timestamp {
    /// `Timestamp(2023-11-14T22:13:50.5Z)`: the instant, readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({self})")
    }
}

impl From<Timestamp> for SystemTime {
    /// The same instant as a [`SystemTime`] (every `Timestamp` is representable).
    fn from(t: Timestamp) -> SystemTime {
        let abs = Duration::new(
            (t.unix_nanos.unsigned_abs() / NANOS_PER_SEC as u128) as u64,
            (t.unix_nanos.unsigned_abs() % NANOS_PER_SEC as u128) as u32,
        );
        if t.unix_nanos >= 0 {
            UNIX_EPOCH + abs
        } else {
            UNIX_EPOCH - abs
        }
    }
}

impl TryFrom<SystemTime> for Timestamp {
    type Error = OutOfRange;

    /// The same instant, or [`OutOfRange`] outside the years 0001–9999.
    fn try_from(t: SystemTime) -> Result<Timestamp, OutOfRange> {
        Timestamp::from_system_time(t).ok_or(OutOfRange)
    }
}

/// A [`SystemTime`] outside the years 0001–9999, which a [`Timestamp`] cannot hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OutOfRange;

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("instant outside the years 0001-9999")
    }
}

impl std::error::Error for OutOfRange {}

impl serde::Serialize for Timestamp {
    /// As its RFC 3339 text (the record's form).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    /// From RFC 3339 text, any offset, as [`Timestamp::parse_rfc3339`].
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Timestamp::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

impl Timestamp {
    /// The earliest representable instant, `0001-01-01T00:00:00Z`.
    pub const MIN: Timestamp = Timestamp {
        unix_nanos: -62_135_596_800 * NANOS_PER_SEC,
    };
    /// The latest representable instant, `9999-12-31T23:59:59.999999999Z`.
    pub const MAX: Timestamp = Timestamp {
        unix_nanos: 253_402_300_800 * NANOS_PER_SEC - 1,
    };
    /// The Unix epoch, `1970-01-01T00:00:00Z`.
    pub const UNIX_EPOCH: Timestamp = Timestamp { unix_nanos: 0 };

    /// The instant `nanos` nanoseconds after (or, if negative, before) the Unix epoch, or `None`
    /// when it falls outside [`Timestamp::MIN`]..=[`Timestamp::MAX`].
    pub const fn from_unix_nanos(nanos: i128) -> Option<Timestamp> {
        if nanos < Self::MIN.unix_nanos || nanos > Self::MAX.unix_nanos {
            None
        } else {
            Some(Timestamp { unix_nanos: nanos })
        }
    }

    /// The instant `secs` whole seconds after the Unix epoch, or `None` when out of range.
    pub const fn from_unix_secs(secs: i64) -> Option<Timestamp> {
        Self::from_unix_nanos(secs as i128 * NANOS_PER_SEC)
    }

    /// Nanoseconds since the Unix epoch (negative before 1970).
    pub const fn unix_nanos(self) -> i128 {
        self.unix_nanos
    }

    /// The current wall-clock time: [`SystemClock`](crate::SystemClock)'s reading, clamped to
    /// the years 0001–9999.
    ///
    /// ```
    /// use flocklease::Timestamp;
    ///
    /// assert!(Timestamp::now() > Timestamp::parse_rfc3339("2020-01-01T00:00:00Z").unwrap());
    /// ```
    pub fn now() -> Timestamp {
        use crate::clock::Clock;
        crate::clock::SystemClock.now()
    }

    /// Converts a [`SystemTime`], or `None` when it falls outside the representable years.
    pub fn from_system_time(t: SystemTime) -> Option<Timestamp> {
        let nanos = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i128::try_from(d.as_nanos()).ok()?,
            Err(e) => -i128::try_from(e.duration().as_nanos()).ok()?,
        };
        Self::from_unix_nanos(nanos)
    }

    /// This instant plus `d`, or `None` past [`Timestamp::MAX`].
    pub fn checked_add(self, d: Duration) -> Option<Timestamp> {
        let d = i128::try_from(d.as_nanos()).ok()?;
        Self::from_unix_nanos(self.unix_nanos.checked_add(d)?)
    }

    /// This instant minus `d`, or `None` before [`Timestamp::MIN`].
    pub fn checked_sub(self, d: Duration) -> Option<Timestamp> {
        let d = i128::try_from(d.as_nanos()).ok()?;
        Self::from_unix_nanos(self.unix_nanos.checked_sub(d)?)
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is not earlier.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        let diff = self.unix_nanos - earlier.unix_nanos;
        if diff <= 0 {
            return Duration::ZERO;
        }
        // Both ends lie within 10 000 years, so the difference fits in u64 seconds.
        Duration::new((diff / NANOS_PER_SEC) as u64, (diff % NANOS_PER_SEC) as u32)
    }

    /// Parses an RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS[.F{1,9}](Z|±hh:mm)`.
    ///
    /// This is the subset the record format allows: an upper-case `T` and `Z`, a four-digit
    /// year, 1–9 fraction digits when a `.` is present, an offset of at most 23:59 and no leap
    /// second. The result is normalised to UTC and must fall within the representable range.
    ///
    /// # Errors
    ///
    /// [`TimeError`] describing the first problem found.
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, TimeError> {
        parse(s.as_bytes())
    }

    /// Splits into UTC calendar fields `(year, month, day, hour, minute, second, nanosecond)`.
    fn to_civil(self) -> (i64, u32, u32, u32, u32, u32, u32) {
        let secs = self.unix_nanos.div_euclid(NANOS_PER_SEC) as i64;
        let nanos = self.unix_nanos.rem_euclid(NANOS_PER_SEC) as u32;
        let days = secs.div_euclid(SECS_PER_DAY);
        let sod = secs.rem_euclid(SECS_PER_DAY) as u32;
        let (y, m, d) = civil_from_days(days);
        (y, m, d, sod / 3600, sod / 60 % 60, sod % 60, nanos)
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC with `Z`; the fraction has 1–9 digits without trailing zeros and is
    /// omitted when zero — byte for byte what Go's `time.RFC3339Nano` writes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, mo, d, h, mi, s, ns) = self.to_civil();
        write!(f, "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}")?;
        if ns != 0 {
            // Nine digits, trailing zeros removed, without allocating.
            let (mut ns, mut width) = (ns, 9);
            while ns % 10 == 0 {
                ns /= 10;
                width -= 1;
            }
            write!(f, ".{ns:0width$}")?;
        }
        f.write_str("Z")
    }
}

/// Why a date-time text is not an acceptable RFC 3339 instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TimeError {
    /// The text does not have the `YYYY-MM-DDTHH:MM:SS…` shape.
    Syntax,
    /// A field (month, day, hour, minute, second or offset) is out of its range.
    FieldRange,
    /// The instant, once normalised to UTC, lies outside the years 0001–9999.
    OutOfRange,
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeError::Syntax => "not an rfc 3339 date-time",
            TimeError::FieldRange => "a date-time field is out of range",
            TimeError::OutOfRange => "instant outside the years 0001-9999",
        })
    }
}

impl std::error::Error for TimeError {}

fn parse(b: &[u8]) -> Result<Timestamp, TimeError> {
    use TimeError::{FieldRange, Syntax};
    // Fixed part: "YYYY-MM-DDTHH:MM:SS" is 19 bytes.
    if b.len() < 20 {
        return Err(Syntax);
    }
    let lit = |i: usize, c: u8| if b[i] == c { Ok(()) } else { Err(Syntax) };
    let year = digits(&b[0..4])?;
    lit(4, b'-')?;
    let month = digits(&b[5..7])?;
    lit(7, b'-')?;
    let day = digits(&b[8..10])?;
    lit(10, b'T')?;
    let hour = digits(&b[11..13])?;
    lit(13, b':')?;
    let minute = digits(&b[14..16])?;
    lit(16, b':')?;
    let second = digits(&b[17..19])?;
    let mut rest = &b[19..];
    let mut nanos: u32 = 0;
    if let [b'.', tail @ ..] = rest {
        let n = tail.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 || n > 9 {
            return Err(Syntax);
        }
        let frac = digits(&tail[..n])?;
        nanos = frac * 10u32.pow(9 - n as u32);
        rest = &tail[n..];
    }
    let offset_secs: i64 = match rest {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let oh = digits(&[*h1, *h2])?;
            let om = digits(&[*m1, *m2])?;
            if oh > 23 || om > 59 {
                return Err(FieldRange);
            }
            let off = i64::from(oh * 3600 + om * 60);
            if *sign == b'-' { -off } else { off }
        }
        _ => return Err(Syntax),
    };
    if year == 0 || !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return Err(FieldRange);
    }
    if hour > 23 || minute > 59 || second > 59 {
        return Err(FieldRange);
    }
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * SECS_PER_DAY + i64::from(hour * 3600 + minute * 60 + second) - offset_secs;
    Timestamp::from_unix_nanos(secs as i128 * NANOS_PER_SEC + i128::from(nanos))
        .ok_or(TimeError::OutOfRange)
}

/// Decimal value of a run of ASCII digits (at most 9, so it fits in u32).
fn digits(b: &[u8]) -> Result<u32, TimeError> {
    b.iter().try_fold(0u32, |acc, &c| {
        if c.is_ascii_digit() {
            Ok(acc * 10 + u32::from(c - b'0'))
        } else {
            Err(TimeError::Syntax)
        }
    })
}

fn is_leap(y: u32) -> bool {
    y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400))
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (era-based: 400-year cycles).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12); // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    #[test]
    fn formats_like_go_rfc3339nano() {
        let t = Timestamp::from_unix_secs(1_700_000_030).unwrap();
        assert_eq!(t.to_string(), "2023-11-14T22:13:50Z");
        let half = Timestamp::from_unix_nanos(t.unix_nanos() + 500_000_000).unwrap();
        assert_eq!(half.to_string(), "2023-11-14T22:13:50.5Z");
        let one = Timestamp::from_unix_nanos(t.unix_nanos() + 1).unwrap();
        assert_eq!(one.to_string(), "2023-11-14T22:13:50.000000001Z");
        assert_eq!(Timestamp::MIN.to_string(), "0001-01-01T00:00:00Z");
        assert_eq!(Timestamp::MAX.to_string(), "9999-12-31T23:59:59.999999999Z");
        assert_eq!(Timestamp::UNIX_EPOCH.to_string(), "1970-01-01T00:00:00Z");
        let before = Timestamp::from_unix_nanos(-1).unwrap();
        assert_eq!(before.to_string(), "1969-12-31T23:59:59.999999999Z");
    }

    #[test]
    fn parses_offsets_and_fractions() {
        let t = ts("2026-11-30T05:20:54.123456789+01:00");
        assert_eq!(t.to_string(), "2026-11-30T04:20:54.123456789Z");
        assert_eq!(
            ts("2026-11-30T04:20:54-00:30").to_string(),
            "2026-11-30T04:50:54Z"
        );
        assert_eq!(
            ts("2000-02-29T00:00:00.1Z").to_string(),
            "2000-02-29T00:00:00.1Z"
        );
        assert_eq!(ts("0001-01-01T00:00:00Z"), Timestamp::MIN);
    }

    #[test]
    fn rejects_malformed_and_out_of_range() {
        use TimeError::*;
        for (s, e) in [
            ("", Syntax),
            ("2023-11-14 22:13:50Z", Syntax),
            ("2023-11-14t22:13:50Z", Syntax),
            ("2023-11-14T22:13:50z", Syntax),
            ("2023-11-14T22:13:50", Syntax),
            ("2023-11-14T22:13:50.Z", Syntax),
            ("2023-11-14T22:13:50.1234567891Z", Syntax),
            ("2023-11-14T22:13:50+0100", Syntax),
            ("+023-11-14T22:13:50Z", Syntax),
            ("2023-11-14T22:13:50Z ", Syntax),
            ("2023-13-14T22:13:50Z", FieldRange),
            ("2023-02-29T22:13:50Z", FieldRange),
            ("1900-02-29T00:00:00Z", FieldRange),
            ("2023-11-14T24:00:00Z", FieldRange),
            ("2023-11-14T23:59:60Z", FieldRange),
            ("2023-11-14T23:59:59+24:00", FieldRange),
            ("0000-12-31T23:59:59Z", FieldRange),
            ("0001-01-01T00:00:00+00:01", OutOfRange),
            ("9999-12-31T23:59:59-00:01", OutOfRange),
        ] {
            assert_eq!(Timestamp::parse_rfc3339(s), Err(e), "{s:?}");
        }
    }

    #[test]
    fn civil_round_trip_over_the_whole_range() {
        // Every 997th day across 0001..=9999 plus the edges.
        let first = days_from_civil(1, 1, 1);
        let last = days_from_civil(9999, 12, 31);
        let mut z = first;
        while z <= last {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            assert!(d >= 1 && d <= days_in_month(y as u32, m));
            z += 997;
        }
        assert_eq!(civil_from_days(last), (9999, 12, 31));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }

    #[test]
    fn arithmetic_is_checked() {
        assert_eq!(Timestamp::MAX.checked_add(Duration::from_nanos(1)), None);
        assert_eq!(Timestamp::MIN.checked_sub(Duration::from_nanos(1)), None);
        let t = ts("2023-11-14T22:13:50Z");
        let later = t.checked_add(Duration::from_millis(1500)).unwrap();
        assert_eq!(
            later.saturating_duration_since(t),
            Duration::from_millis(1500)
        );
        assert_eq!(t.saturating_duration_since(later), Duration::ZERO);
    }
}
