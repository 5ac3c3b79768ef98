//! Replays every committed fuzz corpus file and fixed crash artifact through the same checks
//! the fuzz targets run, on the stable toolchain, in `cargo test`.

use std::path::Path;

use flocklease::checks;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.expect("corpus entry").path();
        let bytes = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "{} fails its check", path.display());
        n += 1;
    }
    assert!(
        n >= 5,
        "{target}: only {n} corpus files; the seeds are missing"
    );
}

#[test]
fn record_decode_corpus() {
    replay("record_decode", checks::record_decode);
}

#[test]
fn safe_name_corpus() {
    replay("safe_name", checks::safe_name);
}

#[test]
fn machine_step_corpus() {
    replay("machine_step", checks::machine_step_bytes);
}

#[test]
fn ops_corpus() {
    replay("ops", checks::ops_bytes);
}
