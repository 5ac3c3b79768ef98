//! Durations on the command line: `30s`, `1.5s`, `250ms`, `2m30s`, `1h`, or a plain number of
//! seconds (`10`, `0.5`) as `flock -w` takes them.
//!
//! Units are `ms`, `s`, `m`, `h` and `d`; a compound lists each unit at most once, largest
//! first. Fractions are exact to the nanosecond (finer digits are dropped). Negative, empty,
//! malformed and out-of-range values are errors that quote the value, never a default or a
//! wrap-around.

use std::time::Duration;

/// The longest duration accepted: 100 years. Longer values are certainly typos, and the
/// library's expiry must stay within the year 9999.
const MAX: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The shortest TTL accepted. The watchdog kills the job when no renew was confirmed by the
/// expiry less its margin (`supervise::margin`), so a renew (with its fsyncs) that is merely
/// slow must not take most of the TTL. Measured with `scripts/short-ttl.sh` (two busy loops
/// per core and an fsync-heavy writer): healthy jobs were killed in 9 of 40 runs at 100ms,
/// 9 of 140 at 200ms, 5 of 140 at 300ms, none of 140 at 500ms and 1s (BENCHMARKS.md).
const MIN_TTL: Duration = Duration::from_millis(500);

const HINT: &str = "use e.g. 30s, 1.5s, 250ms, 2m30s or 10 (seconds)";

/// Parses a duration (see the module documentation).
pub fn parse(s: &str) -> Result<Duration, String> {
    let invalid = |why: &str| format!("invalid duration '{s}': {why}; {HINT}");
    if s.starts_with('-') {
        return Err(invalid("a duration cannot be negative"));
    }
    if s.is_empty() {
        return Err(invalid("it is empty"));
    }
    // A plain number is seconds.
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let nanos = amount(s, 1_000_000_000).ok_or_else(|| invalid_number(s))?;
        return within_range(s, nanos);
    }
    let mut total: u128 = 0;
    let mut rest = s;
    let mut last_unit = u128::MAX;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        if num.is_empty() {
            return Err(invalid(&format!("'{unit}' has no number before it")));
        }
        let scale = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3_600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => return Err(invalid(&format!("'{num}' has no unit after it"))),
            _ => return Err(invalid(&format!("unknown unit '{unit}'"))),
        };
        if scale >= last_unit {
            return Err(invalid("each unit at most once, largest first"));
        }
        last_unit = scale;
        let part = amount(num, scale).ok_or_else(|| invalid_number(s))?;
        total = total.saturating_add(part);
        rest = tail;
    }
    within_range(s, total)
}

/// Parses a TTL: a duration of at least 500 ms.
pub fn ttl(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d.is_zero() {
        return Err(format!(
            "invalid ttl '{s}': a lease needs a positive time to live (the default is 30s)"
        ));
    }
    if d < MIN_TTL {
        return Err(format!(
            "invalid ttl '{s}': at least 500ms, so that a renew slowed down by a loaded \
             machine never gets a healthy job killed"
        ));
    }
    Ok(d)
}

fn invalid_number(s: &str) -> String {
    format!("invalid duration '{s}': a number is malformed or too large; {HINT}")
}

/// `num` (digits with at most one `.`) times `scale` nanoseconds, or `None` if malformed or
/// beyond `u128`.
fn amount(num: &str, scale: u128) -> Option<u128> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return None;
    }
    let whole: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    // At most 18 fraction digits matter at nanosecond precision for any of our scales.
    let frac = &frac[..frac.len().min(18)];
    let part = if frac.is_empty() {
        0
    } else {
        frac.parse::<u128>().ok()? * scale / 10u128.pow(frac.len() as u32)
    };
    whole.checked_mul(scale)?.checked_add(part)
}

fn within_range(s: &str, nanos: u128) -> Result<Duration, String> {
    if nanos > MAX.as_nanos() {
        return Err(format!(
            "invalid duration '{s}': out of range (at most 100 years)"
        ));
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| invalid_number(s))?;
    // The remainder of a division by 10^9 always fits in u32.
    let sub = (nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_fractions_compounds_and_plain_seconds() {
        let ok = |s: &str, d: Duration| assert_eq!(parse(s), Ok(d), "{s}");
        ok("30s", Duration::from_secs(30));
        ok("1.5s", Duration::from_millis(1500));
        ok("250ms", Duration::from_millis(250));
        ok("2m30s", Duration::from_secs(150));
        ok("1h2m3.5s", Duration::from_millis(3_723_500));
        ok("1d", Duration::from_secs(86_400));
        ok("10", Duration::from_secs(10));
        ok("0.5", Duration::from_millis(500));
        ok(".25s", Duration::from_millis(250));
        ok("0", Duration::ZERO);
        ok("1.000000001s", Duration::new(1, 1));
        ok("0.0000000019s", Duration::new(0, 1));
    }

    #[test]
    fn refuses_negative_malformed_and_overflowing_values() {
        for bad in [
            "", "-1", "-1s", "1.5.s", "1..5s", ".", "s", "10x", "1 s", "30s2m", "1s1s", "1s 2",
            "5m1h", "ms", "1e3s",
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(&format!("'{bad}'")), "{bad}: {err}");
        }
        for huge in [
            "99999999999999999999999999999999999999999s",
            "18446744073709551616s",
            "101y",
            "36501d",
            "1000000h",
        ] {
            assert!(parse(huge).is_err(), "{huge}");
        }
        assert!(parse("36500d").is_ok());
    }

    #[test]
    fn a_ttl_is_positive_and_not_tiny() {
        assert!(ttl("0").unwrap_err().contains("positive"));
        assert!(ttl("0s").unwrap_err().contains("positive"));
        assert!(ttl("10ms").unwrap_err().contains("at least 500ms"));
        assert!(ttl("499ms").unwrap_err().contains("at least 500ms"));
        assert_eq!(ttl("500ms"), Ok(Duration::from_millis(500)));
    }
}
