//! `timestamptz` on the wire: microseconds since 2000-01-01 UTC, converted exactly to and from
//! [`Timestamp`] (no float, no text). `±infinity` and instants outside the years 0001–9999 are
//! refused on read, so a hand-edited row becomes [`Error::CorruptRow`](crate::Error::CorruptRow).

use std::error::Error as StdError;

use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};

use crate::timestamp::Timestamp;

/// Unix seconds of 2000-01-01T00:00:00Z, PostgreSQL's epoch.
const PG_EPOCH_UNIX_SECS: i128 = 946_684_800;
const NANOS_PER_MICRO: i128 = 1_000;

/// A `timestamptz` value: microseconds since PostgreSQL's epoch (`i64::MIN`/`MAX`: `∓infinity`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SqlTime(pub(super) i64);

impl SqlTime {
    /// `t`, truncated to whole microseconds (the column's precision).
    pub(super) fn from_timestamp(t: Timestamp) -> SqlTime {
        let micros =
            (t.unix_nanos() - PG_EPOCH_UNIX_SECS * 1_000_000_000).div_euclid(NANOS_PER_MICRO);
        // Years 0001–9999 are ±3.2e17 µs from 2000: far inside i64.
        SqlTime(i64::try_from(micros).unwrap_or(i64::MAX))
    }

    /// The instant, if finite and within the years 0001–9999.
    pub(super) fn to_timestamp(self) -> Option<Timestamp> {
        if self.0 == i64::MIN || self.0 == i64::MAX {
            return None;
        }
        let nanos = (i128::from(self.0) * NANOS_PER_MICRO) + PG_EPOCH_UNIX_SECS * 1_000_000_000;
        Timestamp::from_unix_nanos(nanos)
    }
}

/// `t` truncated to whole microseconds.
pub(super) fn truncate_to_micros(t: Timestamp) -> Timestamp {
    SqlTime::from_timestamp(t).to_timestamp().unwrap_or(t)
}

impl<'a> FromSql<'a> for SqlTime {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<SqlTime, Box<dyn StdError + Sync + Send>> {
        let bytes: [u8; 8] = raw.try_into().map_err(|_| "timestamptz is not 8 bytes")?;
        Ok(SqlTime(i64::from_be_bytes(bytes)))
    }

    accepts!(TIMESTAMPTZ);
}

impl ToSql for SqlTime {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        out.extend_from_slice(&self.0.to_be_bytes());
        Ok(IsNull::No)
    }

    accepts!(TIMESTAMPTZ);
    to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_whole_microseconds_and_truncates_the_rest() {
        for nanos in [
            0i128,
            1_700_000_000_123_456_000,
            -62_135_596_800_000_000_000,
        ] {
            let t = Timestamp::from_unix_nanos(nanos).unwrap();
            assert_eq!(SqlTime::from_timestamp(t).to_timestamp(), Some(t));
        }
        let t = Timestamp::from_unix_nanos(1_700_000_000_123_456_789).unwrap();
        assert_eq!(
            truncate_to_micros(t),
            Timestamp::from_unix_nanos(1_700_000_000_123_456_000).unwrap()
        );
        assert_eq!(
            SqlTime::from_timestamp(Timestamp::from_unix_secs(946_684_800).unwrap()),
            SqlTime(0)
        );
        assert_eq!(SqlTime(i64::MAX).to_timestamp(), None);
        assert_eq!(SqlTime(i64::MIN).to_timestamp(), None);
    }
}
