#!/usr/bin/env bash
# Which lines and branches of the library's code the model checker runs: builds the model
# checker with LLVM's source-based coverage, runs `check` (every configuration it runs by
# default, or the options given), and reports the library's files it reached.
#   scripts/coverage.sh                              # `check` as CI runs it
#   scripts/coverage.sh --config resource-fence      # one configuration
#   FILES='src/machine.rs src/line.rs' scripts/coverage.sh   # report only these files
# Needs rustup's llvm-tools (`rustup component add llvm-tools`). Its build and profiles live in
# target/coverage; the report goes to stdout, uncovered lines per file to target/coverage/*.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
sysroot=$(rustc --print sysroot)
bin="$sysroot/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin"
if [ ! -x "$bin/llvm-profdata" ]; then
    rustup component add llvm-tools
fi
out=target/coverage
rm -rf "$out/profiles"
mkdir -p "$out/profiles"
# Build scripts are instrumented too: their profiles go beside the build, not into the tree.
RUSTFLAGS="-C instrument-coverage" CARGO_TARGET_DIR="$out/build" \
    LLVM_PROFILE_FILE="$(pwd)/$out/build-%p-%m.profraw" \
    cargo build --release -q -p flocklease-model --bin flocklease-model
model="$out/build/release/flocklease-model"
LLVM_PROFILE_FILE="$(pwd)/$out/profiles/check-%p-%m.profraw" "$model" check "$@" >"$out/check.txt" || {
    echo "check failed (its output: $out/check.txt)" >&2
    exit 1
}
"$bin/llvm-profdata" merge -sparse "$out"/profiles/*.profraw -o "$out/check.profdata"
files=${FILES:-$(ls src/*.rs src/flock/*.rs src/pg/*.rs | grep -v -e conformance -e /tls.rs)}
# shellcheck disable=SC2086
"$bin/llvm-cov" report "$model" -instr-profile="$out/check.profdata" \
    -ignore-filename-regex='(/\.cargo/|/rustc/|model/)' $files
for f in $files; do
    "$bin/llvm-cov" show "$model" -instr-profile="$out/check.profdata" \
        -show-line-counts-or-regions "$f" >"$out/$(echo "$f" | tr / _).txt" 2>/dev/null || true
done
