//! Fuzz target `safe_name`: see `flocklease::checks` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flocklease::checks::safe_name(data);
});
