#!/usr/bin/env bash
# Mutation testing of the pure transition machine. Every mutant of src/machine.rs must be
# caught by the machine's unit tests, the conformance suite or the model checker.
#   scripts/mutants.sh            # needs cargo-mutants (installed here if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
exec cargo mutants --timeout 300 -- \
    --workspace --lib --test conformance --test check "$@"
