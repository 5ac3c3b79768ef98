#!/usr/bin/env bash
# Removes one safety check of the machine at a time and shows that the model checker finds a
# counterexample for each (and prints it). The tree is restored after every plant.
#   scripts/planted-bugs.sh           # all plants
#   scripts/planted-bugs.sh renew     # the plants whose name contains "renew"
set -euo pipefail
cd "$(dirname "$0")/.."
machine=src/machine.rs
backup=$(mktemp)
cp "$machine" "$backup"
# Restore the machine and rebuild, so no planted binary is left behind in target/.
trap 'cp "$backup" "$machine"; rm -f "$backup"; cargo build -q --release -p flocklease-model' EXIT

# Each plant: a name, the exact text to find (once) and its replacement ("\n" = newline).
names=() finds=() repls=()
plant() { names+=("$1"); finds+=("$2"); repls+=("$3"); }
plant live-holder-ignored \
  'Some(Liveness::Dead) => takeover' \
  'Some(Liveness::Dead | Liveness::Live) => takeover'
plant missing-file-means-dead \
  'Some(Liveness::Live | Liveness::Missing) => {' \
  'Some(Liveness::Missing) => takeover(input, owner, rec.token, true).map(Decision::Plan),\n        Some(Liveness::Live) => {'
plant renew-skips-record-check \
  '    if !names(input, owner, token) {\n        // A genuine' \
  '    if false \&\& !names(input, owner, token) {\n        // A genuine'
plant release-skips-record-check \
  '    if !names(input, owner, token) {\n        // Superseded' \
  '    if false \&\& !names(input, owner, token) {\n        // Superseded'
plant takeover-reuses-token \
  'let token = old.checked_add(1)' \
  'let token = old.max(1).checked_add(0)'
plant no-local-lock-needed-to-renew-or-release \
  '        .is_some_and(|l| l.token == token && l.owner == *owner)' \
  '        .is_none_or(|l| l.token == token || l.owner == *owner)'
plant no-dir-sync-on-takeover \
  '        sync_dir: true,\n        cleanup,' \
  '        sync_dir: false,\n        cleanup,'

status=0
for i in "${!names[@]}"; do
  name=${names[$i]} find=${finds[$i]} replace=${repls[$i]}
  if [ $# -gt 0 ] && [[ "$name" != *"$1"* ]]; then continue; fi
  cp "$backup" "$machine"
  FIND="$find" REPLACE="$replace" python3 - "$machine" <<'PY'
import os, sys
p = sys.argv[1]
s = open(p).read()
find = os.environ["FIND"].replace("\\n", "\n").replace("\\&", "&")
repl = os.environ["REPLACE"].replace("\\n", "\n").replace("\\&", "&")
assert s.count(find) == 1, f"plant anchor not found exactly once: {find!r}"
open(p, "w").write(s.replace(find, repl))
PY
  echo "=================== plant: $name"
  # A plant that does not compile proves nothing: fail loudly.
  cargo build -q --release -p flocklease-model
  if out=$(cargo run -q --release -p flocklease-model -- check 2>&1); then
    echo "$out"
    echo "!!! plant $name NOT caught by the model checker"
    status=1
  else
    echo "$out" | sed -n '/^  always\|^  sometimes/p;/^shortest/,$p'
    echo "--> caught"
  fi
done
exit $status
