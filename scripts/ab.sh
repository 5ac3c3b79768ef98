#!/usr/bin/env bash
# Same-run A/B of this tree against an earlier revision: cycle and renew, interleaved round by
# round (scripts/ab/main.rs). Usage: scripts/ab.sh [REV] (default b0f7fd0, the code of
# 2026-11-30 that BENCHMARKS.md compares with).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rev="${1:-b0f7fd0}"
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

[workspace]
TOML
cp "$repo/Cargo.lock" "$work/Cargo.lock"
cargo build --release --quiet --manifest-path "$work/Cargo.toml"
echo "A/B against $rev ($(git -C "$repo" log -1 --format=%cs "$rev")), median of 9 interleaved rounds of 10 000:"
"$work/target/release/flocklease-ab"
