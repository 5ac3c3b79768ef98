//! Property tests of the codec and the names: round trips, canonical form, no panics.

use flocklease::{Record, Timestamp, record, stem};
use proptest::prelude::*;

fn any_timestamp() -> impl Strategy<Value = Timestamp> {
    (Timestamp::MIN.unix_nanos()..=Timestamp::MAX.unix_nanos())
        .prop_map(|n| Timestamp::from_unix_nanos(n).expect("in range"))
}

fn any_record() -> impl Strategy<Value = Record> {
    (".{0,40}", any::<u64>(), any_timestamp()).prop_map(|(owner, token, expiry)| Record {
        owner,
        token,
        expiry,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decode_inverts_encode(r in any_record()) {
        let bytes = record::encode(&r);
        prop_assert_eq!(record::decode(&bytes), Ok(r));
    }

    #[test]
    fn decoding_never_panics_and_what_decodes_is_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(r) = record::decode(&bytes) {
            let canonical = record::encode(&r);
            prop_assert_eq!(record::decode(&canonical), Ok(r));
        }
    }

    #[test]
    fn near_miss_records_never_panic(
        owner in ".{0,8}",
        token in "-?[0-9]{0,21}(\\.[0-9])?",
        expiry in "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,10})?(Z|[+-][0-9]{2}:[0-9]{2})",
    ) {
        let text = format!(r#"{{"owner":{owner:?},"token":{token},"expiry":"{expiry}"}}"#);
        if let Ok(r) = record::decode(text.as_bytes()) {
            prop_assert_eq!(record::decode(&record::encode(&r)), Ok(r));
        }
    }

    #[test]
    fn timestamps_print_and_parse_back(t in any_timestamp()) {
        prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_string()), Ok(t));
    }

    #[test]
    fn stems_are_safe_bounded_and_deterministic(id in proptest::collection::vec(any::<u8>(), 0..120)) {
        let s = stem(&id);
        prop_assert!(s.len() <= 57, "{} is {} bytes", s, s.len());
        prop_assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{}", s);
        prop_assert!(s != "." && s != "..");
        let (prefix, hash) = s.rsplit_once('-').expect("a dash before the hash");
        prop_assert!(!prefix.is_empty());
        prop_assert_eq!(hash.len(), 16);
        prop_assert_eq!(stem(&id), s);
    }
}
