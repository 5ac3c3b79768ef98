#!/usr/bin/env bash
# System calls per operation of this tree and of an earlier revision, from the binary
# scripts/ab.sh built (run it first): each side's acquire + release, renew and acquire answered
# "held", without fsync, under `strace -f -c` (every thread): a run of N operations minus a run
# of none, divided by N.
#   scripts/ab-syscalls.sh [DIR] [N]     (default /dev/shm, 2000)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$repo/target/ab/target/release/flocklease-ab"
dir="${1:-/dev/shm}"
n="${2:-2000}"
work=$(mktemp -d -p "$dir")
trap 'rm -rf "$work"' EXIT
echo "| operation | this tree | the old revision |"
echo "| --- | --- | --- |"
for op in cycle renew held; do
  row="| $op |"
  for side in new old; do
    strace -f -c -o "$work/base" "$bin" ops "$side" "$op" 0 "$work" >/dev/null
    strace -f -c -o "$work/run" "$bin" ops "$side" "$op" "$n" "$work" >/dev/null
    per=$(python3 - "$work/base" "$work/run" "$n" <<'PY'
import sys
def calls(path):
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            out[parts[-1]] = int(parts[3])
    return out
base, run, n = calls(sys.argv[1]), calls(sys.argv[2]), int(sys.argv[3])
per = {k: (run.get(k, 0) - base.get(k, 0)) / n for k in set(run) | set(base)}
print(f"{sum(v for v in per.values() if v >= 0.005):.2f}")
PY
)
    row="$row $per |"
  done
  echo "$row"
done
