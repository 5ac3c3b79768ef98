#!/usr/bin/env bash
# Runs the cargo-fuzz targets on the stable toolchain (no sanitizer: `-s none`).
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 30 s each, every target
# Seeds come from tests/corpus/<target> (committed); new inputs go to fuzz/corpus/<target>
# (ignored by git). A crash fails the run and prints the artifact.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(record_decode safe_name machine_step ops)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo fuzz build -s none

status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" logs
  log="logs/$t.log"
  echo "== fuzz $t for ${secs}s"
  if cargo fuzz run -s none "$t" "corpus/$t" "../tests/corpus/$t" -- \
      -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    files=$(ls "corpus/$t" | wc -l)
    echo "   ok: $runs runs, $rate exec/s, corpus $files files (+ $(ls "../tests/corpus/$t" | wc -l) seeds)"
  else
    status=1
    echo "!! $t crashed:"
    tail -40 "$log"
    for a in artifacts/"$t"/*; do
      [ -f "$a" ] || continue
      echo "-- artifact $a:"
      od -A x -t x1z "$a" | head -32
    done
  fi
done
exit $status
