#!/usr/bin/env bash
# Same-run A/B of this tree against an earlier revision: acquire + release, renew and an acquire
# answered "held", without fsync, interleaved round by round, on-CPU time beside wall time
# (scripts/ab/main.rs). Usage: scripts/ab.sh [REV] [DIR] [ROUNDS] (default b0f7fd0, the code of
# 2026-11-30 that BENCHMARKS.md compares with; /dev/shm; 9 rounds of 10 000). DIR picks the
# file system: /dev/shm is tmpfs, a directory under /var/tmp is usually the root's (ext4).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-b0f7fd0}"
dir="${2:-/dev/shm}"
rounds="${3:-9}"
work="$repo/target/ab"
old="$repo/target/ab-old"
rm -rf "$old" && mkdir -p "$work/src"
# The old revision as a crate of its own, its version changed so both can be linked at once.
git -C "$repo" archive "$rev" | tar -x -C "$(mkdir -p "$old" && echo "$old")"
sed -i '0,/^version = ".*"/s//version = "0.0.1-old"/' "$old/Cargo.toml"
# Not a workspace of its own (it has the model as a member).
sed -i '/^\[workspace\]/,/^$/d' "$old/Cargo.toml"
cp "$repo/scripts/ab/main.rs" "$work/src/main.rs"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "flocklease-ab"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
new = { package = "flocklease", path = "$repo" }
old = { package = "flocklease", path = "$old" }
libc = "0.2"

[workspace]
TOML
cp "$repo/Cargo.lock" "$work/Cargo.lock"
CARGO_TARGET_DIR="$work/target" cargo build --release --quiet --manifest-path "$work/Cargo.toml"
echo "A/B against $rev ($(git -C "$repo" log -1 --format=%cs "$rev")) in $dir ($(findmnt -no FSTYPE -T "$dir" 2>/dev/null || stat -f -c %T "$dir")), median of $rounds interleaved rounds of 10 000, load average $(cut -d' ' -f1-3 /proc/loadavg):"
"$work/target/release/flocklease-ab" "$dir" "$rounds"
