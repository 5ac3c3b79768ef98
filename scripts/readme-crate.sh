#!/usr/bin/env bash
# Builds every ```rust block of README.md as a program of a fresh crate that depends on
# flocklease alone (and tokio for the async example; no dev-dependencies, unlike doctests), so the README's examples compile
# when a newcomer pastes them. Run from anywhere; uses the registry cache (--offline).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$repo/target/readme-crate"
rm -rf "$work/src"
mkdir -p "$work/src/bin"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "readme-examples"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
flocklease = { path = "$repo" }
# The async example runs on tokio, as its text says a user's would.
tokio = { version = "1.38", features = ["rt", "macros", "time"] }

[features]
# The README's PostgreSQL examples are written for a crate that enables flocklease's
# postgres feature, its tracing example for one with tracing and tracing-subscriber, as
# their text says.
postgres = ["flocklease/postgres"]
tracing = ["flocklease/tracing", "dep:tracing-subscriber"]

[dependencies.tracing-subscriber]
version = "0.3.18"
optional = true
default-features = false
features = ["registry", "std", "fmt"]

[workspace]
TOML
echo 'fn main() {}' > "$work/src/main.rs"
# Each ```rust ... ``` block becomes src/bin/example_N.rs.
awk -v dir="$work/src/bin" '
    /^```rust/ { n++; file = sprintf("%s/example_%02d.rs", dir, n); inside = 1; next }
    /^```/ && inside { inside = 0; close(file); next }
    inside { print > file }
    END { if (n == 0) { print "no rust blocks found" > "/dev/stderr"; exit 1 } }
' "$repo/README.md"
count=$(ls "$work/src/bin" | wc -l)
echo "building $count README examples as a separate crate in $work"
cp "$repo/Cargo.lock" "$work/Cargo.lock"
# With the features their text names, every example; as a user with no feature builds them,
# every example that names none (the PostgreSQL and tracing ones are set aside meanwhile).
cargo build --offline --quiet --manifest-path "$work/Cargo.toml" --bins --features postgres,tracing
aside="$work/aside"
rm -rf "$aside" && mkdir -p "$aside"
for f in "$work"/src/bin/*.rs; do
    if grep -qE '(^|[^a-z_])pg::|tracing_subscriber|features = \[' "$f"; then mv "$f" "$aside/"; fi
done
cargo build --offline --quiet --manifest-path "$work/Cargo.toml" --bins
mv "$aside"/*.rs "$work/src/bin/" 2>/dev/null || true
echo "README examples compile in a crate that depends only on flocklease (each with the features its text names, and those that name none with none)"
