#!/usr/bin/env bash
# Counts the system calls of one acquire + release cycle, of one renew and of one acquire
# answered "held", in the steady state, with strace (every thread): a run of N operations minus
# a run of none, divided by N.
#   scripts/syscalls.sh [N]      (default 2000; needs strace, installed if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace; }
cargo bench --bench lease --no-run 2>/dev/null
bin=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/lease-* | grep -v '\.d$' | head -1)
work=$(mktemp -d -p "${SYSCALLS_DIR:-/dev/shm}")
trap 'rm -rf "$work"' EXIT
for op in cycle renew held; do
  strace -f -c -o "$work/base" "$bin" ops "$op" 0 "$work/$op-base" 2>/dev/null
  strace -f -c -o "$work/run" "$bin" ops "$op" "$n" "$work/$op-run" 2>/dev/null
  python3 - "$work/base" "$work/run" "$n" "$op" <<'PY'
import sys
def calls(path):
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            # % time, seconds, usecs/call, calls, [errors], syscall
            out[parts[-1]] = int(parts[3])
    return out
base, run, n, op = calls(sys.argv[1]), calls(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
per = {k: (run.get(k, 0) - base.get(k, 0)) / n for k in set(run) | set(base)}
per = {k: v for k, v in per.items() if v >= 0.005}
print(f"{op}: {sum(per.values()):.2f} syscalls per operation")
for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
    print(f"  {k:14} {v:6.2f}")
PY
done
