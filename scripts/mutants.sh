#!/usr/bin/env bash
# Mutation testing with the model checker as the oracle (scripts/mutants.py; issue 48): a
# seeded sample of each file's mutants, each judged by `check`, then the locksteps, then the
# tests. Needs cargo-mutants (installed here if missing). About 1–3 minutes a mutant on two
# cores (a release build of the checker, then the oracles). BENCHMARKS.md keeps the tables.
#   scripts/mutants.sh [SAMPLE] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
sample="${1:-10}"
seed="${2:-1}"
scripts/mutants.py --file src/line.rs --sample "$sample" --seed "$seed" \
    --check "--config line" --lockstep line_lockstep --tests "-p flocklease --lib line"
scripts/mutants.py --file src/commit.rs --sample "$sample" --seed "$seed" \
    --check "--config failover --standbys 2" --check "--config postgres --standbys 0" \
    --check "--config failover" --tests "-p flocklease --lib commit"
