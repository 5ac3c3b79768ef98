//! Fuzz target `record_decode`: see `flocklease::checks` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flocklease::checks::record_decode(data);
});
