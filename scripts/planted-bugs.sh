#!/usr/bin/env bash
# Plants one bug at a time in the machine or the driver and shows that the default model check
# finds a counterexample for each (and prints it). The tree is restored after every plant.
#   scripts/planted-bugs.sh           # all plants
#   scripts/planted-bugs.sh renew     # the plants whose name contains "renew"
#   CONFIG=large scripts/planted-bugs.sh   # against another named configuration (g- and h-
#                                          # are caught only by the runs `check` adds to the
#                                          # default: they are reported not caught there)
set -euo pipefail
cd "$(dirname "$0")/.."
files=(src/machine.rs src/driver.rs)
backup=$(mktemp -d)
for f in "${files[@]}"; do cp "$f" "$backup/$(basename "$f")"; done
restore() { for f in "${files[@]}"; do cp "$backup/$(basename "$f")" "$f"; done; }
# Restore the sources and rebuild, so no planted binary is left behind in target/.
trap 'restore; rm -rf "$backup"; cargo build -q --release -p flocklease-model' EXIT

# Each plant: a name, the file, the exact text to find (once) and its replacement
# ("\n" = newline).
names=() paths=() finds=() repls=()
plant() { names+=("$1"); paths+=("$2"); finds+=("$3"); repls+=("$4"); }
m=src/machine.rs d=src/driver.rs
plant live-holder-ignored $m \
  'Some(Liveness::Dead) => takeover' \
  'Some(Liveness::Dead | Liveness::Live) => takeover'
plant unknown-file-means-dead $m \
  'Some(Liveness::Live | Liveness::Unknown) => {' \
  'Some(Liveness::Unknown) => takeover(input, owner, rec.token, true).map(Decision::Plan),\n        Some(Liveness::Live) => {'
plant renew-skips-record-check $m \
  '    if !names(input, owner, token) {\n        // A genuine' \
  '    if false \&\& !names(input, owner, token) {\n        // A genuine'
plant release-skips-record-check $m \
  '    if !names(input, owner, token) {\n        // Superseded' \
  '    if false \&\& !names(input, owner, token) {\n        // Superseded'
plant takeover-reuses-token $m \
  'let token = old.checked_add(1)' \
  'let token = old.max(1).checked_add(0)'
plant no-local-lock-needed-to-renew-or-release $m \
  '        .is_some_and(|l| l.token == token \&\& l.owner == *owner)' \
  '        .is_none_or(|l| l.token == token || l.owner == *owner)'
plant no-dir-sync-on-takeover $m \
  '        sync_dir: DirSync::Required,\n        cleanup,' \
  '        sync_dir: DirSync::No,\n        cleanup,'
# Issue 13's plants (a)-(e).
plant a-expiry-boundary-not-expired $m \
  '    now >= expiry\n}' \
  '    now > expiry\n}'
plant b-dead-holder-takeover-reuses-token $m \
  'Some(Liveness::Dead) => takeover(input, owner, rec.token, true)' \
  'Some(Liveness::Dead) => takeover(input, owner, rec.token - 1, true)'
plant c-adopt-before-commit $d \
  '            .map(Io::Commit)\n            .collect();' \
  '            .flat_map(|s| match s {\n                CommitStep::WriteTemp if plan.prepare.iter().any(|p| matches!(p, Prepare::LockLive { .. })) => vec![Io::Adopt, Io::Commit(s)],\n                _ => vec![Io::Commit(s)],\n            })\n            .collect();'
plant d-commit-before-locking-new-generation $d \
  '        steps.push(CommitStep::Point);\n' \
  '        steps.push(CommitStep::Point);\n        steps.rotate_left(usize::from(!plan.prepare.is_empty()));\n'
plant e-unlock-before-rename $d \
  '            .map(Io::Commit)\n            .collect();' \
  '            .flat_map(|s| match s {\n                CommitStep::Point => vec![Io::Unlock, Io::Commit(s)],\n                _ => vec![Io::Commit(s)],\n            })\n            .collect();'

plant f-final-check-returns-at-expiry $m \
  '    if !is_expired(expiry, now) {\n        AtReturn::Return' \
  '    if now <= expiry {\n        AtReturn::Return'
plant f-final-check-failed-renew-is-an-error $m \
  '            Err(_) if self.renewed > 0 => Then::Return(Ok(Outcome::Held)),\n' \
  ''
# A record without a tag (the Go package's): a FIFO at its generation's name taken as its
# liveness file (caught by the go-records configuration that `check` runs after the default).
plant g-untagged-fifo-is-own $m \
  '        (AtName::File { .. }, None) => Ok(()),\n' \
  '        (AtName::File { .. }, None) => Ok(()),\n        (AtName::Fifo, None) => Ok(()),\n'
# The commit check on the lock's identity alone (the record half dropped): caught by the
# cleaner that moves the lock aside and back, in the moves run of `check`.
plant h-commit-check-lock-only $m \
  '        Some(read) if read != record_at => Err(CommitRefused::Record),' \
  '        Some(read) if false \&\& read != record_at => Err(CommitRefused::Record),'
config=${CONFIG:-default}
# `check` with no --config runs the default configuration and those checked with it.
with_config=()
if [ "$config" != default ]; then with_config=(--config "$config"); fi
status=0
for i in "${!names[@]}"; do
  name=${names[$i]} path=${paths[$i]} find=${finds[$i]} replace=${repls[$i]}
  if [ $# -gt 0 ] && [[ "$name" != *"$1"* ]]; then continue; fi
  restore
  FIND="$find" REPLACE="$replace" python3 - "$path" <<'PY'
import os, sys
p = sys.argv[1]
s = open(p).read()
find = os.environ["FIND"].replace("\\n", "\n").replace("\\&", "&")
repl = os.environ["REPLACE"].replace("\\n", "\n").replace("\\&", "&")
assert s.count(find) == 1, f"plant anchor not found exactly once: {find!r}"
open(p, "w").write(s.replace(find, repl))
PY
  echo "=================== plant: $name ($path)"
  # A plant that does not compile proves nothing: fail loudly.
  cargo build -q --release -p flocklease-model
  if out=$(cargo run -q --release -p flocklease-model -- check ${with_config[@]+"${with_config[@]}"} --counterexamples 1 2>&1); then
    echo "$out"
    echo "!!! plant $name NOT caught by the model checker"
    status=1
  else
    echo "$out" | sed -n '/^explored/p;/VIOLATED\|NEVER/p;/^shortest/,$p'
    echo "--> caught"
  fi
done
exit $status
