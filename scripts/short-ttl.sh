#!/usr/bin/env bash
# How often `flocklease run` kills a healthy job at a short TTL on a loaded machine (issue 31):
# for each TTL, RUNS runs of `run --ttl T -- sleep JOB` (PAR at a time, each on its own id in
# a lease directory on disk), while LOAD busy loops per core and one writer that fsyncs in a
# loop compete for the machine. A healthy job ends with 0; 78 (the deadline) or 76 (lost)
# is a false kill: nobody else wanted the lease.
#
# Usage: scripts/short-ttl.sh [TTL...]   (default: 100ms 200ms 300ms 500ms 1s)
# Knobs: RUNS (40), PAR (4), JOB (1, seconds), LOAD (2 busy loops per core), BIN (the binary;
# built with `cargo build --release -p flocklease-cli` when unset).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
runs="${RUNS:-40}" par="${PAR:-4}" job="${JOB:-1}" load="${LOAD:-2}"
if [ -z "${BIN:-}" ]; then
    cargo build --quiet --release -p flocklease-cli --manifest-path "$repo/Cargo.toml"
    BIN="$repo/target/release/flocklease"
fi
ttls=("$@")
[ ${#ttls[@]} -gt 0 ] || ttls=(100ms 200ms 300ms 500ms 1s)
work="$(mktemp -d "$repo/target/short-ttl.XXXXXX")"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq $(($(nproc) * load))); do
    (while :; do :; done) &
    pids+=($!)
done
(while :; do dd if=/dev/zero of="$work/io" bs=1M count=16 conv=fsync status=none; done) &
pids+=($!)

printf '%-6s %5s %8s %8s %8s\n' ttl runs healthy deadline lost
for ttl in "${ttls[@]}"; do
    mkdir -p "$work/$ttl"
    seq "$runs" | xargs -P "$par" -I{} sh -c \
        '"$0" run --dir "$1" --id "j{}" --ttl "$2" -q -- sleep "$3" 2>/dev/null; echo $? > "$1/exit.{}"' \
        "$BIN" "$work/$ttl" "$ttl" "$job" || true
    ok=0 deadline=0 lost=0
    for f in "$work/$ttl"/exit.*; do
        case "$(cat "$f")" in
            0) ok=$((ok + 1)) ;;
            78) deadline=$((deadline + 1)) ;;
            76) lost=$((lost + 1)) ;;
            *) echo "unexpected exit $(cat "$f") in $f" >&2 ;;
        esac
    done
    printf '%-6s %5s %8s %8s %8s\n' "$ttl" "$runs" "$ok" "$deadline" "$lost"
done
