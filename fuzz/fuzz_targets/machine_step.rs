//! Fuzz target `machine_step`: see `flocklease::checks` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flocklease::checks::machine_step_bytes(data);
});
