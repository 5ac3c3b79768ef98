//! Fuzz target `ops`: see `flocklease::checks` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flocklease::checks::ops_bytes(data);
});
