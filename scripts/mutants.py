#!/usr/bin/env python3
"""Mutation testing with the model checker as the oracle (issue 48).

cargo-mutants generates the mutants (`cargo mutants --list --json --diff`); this script applies
each to a scratch worktree of HEAD, builds the model checker, and asks, in order, which oracle
catches it:

  check     the model checker's configurations named by --check (a property violated, or a
            `sometimes` scenario no longer reached: `check` exits non-zero)
  lockstep  the model's lockstep tests named by --lockstep (the real adapter against the model)
  tests     the library's and the model's other tests named by --tests
  missed    none of them (to triage: equivalent, or a gap)
  unviable  the mutant does not build

Usage (one file, a seeded sample, the oracles that cover it):

  scripts/mutants.py --file src/line.rs --sample 12 --seed 1 \
      --check "--config line" --lockstep line_lockstep --tests "-p flocklease --lib line"

Prints one row per mutant and a summary line, as Markdown; BENCHMARKS.md keeps the tables.
Needs cargo-mutants (`cargo install cargo-mutants --locked`). Never touches the working tree:
the scratch worktree lives under target/mutants-wt with its own target directory.
"""

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WT = os.path.join(REPO, "target", "mutants-wt")
TARGET = os.path.join(REPO, "target", "mutants-target")


def run(cmd, cwd, timeout, env=None):
    """Runs `cmd` (a list); returns (exit status or None on timeout, seconds)."""
    start = time.time()
    # Its own process group, killed whole at the timeout: a test binary that cargo started
    # (a mutant may make it spin) must not outlive its run and slow every later one.
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout), time.time() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, time.time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", required=True, help="the source file to mutate (src/...)")
    ap.add_argument("--sample", type=int, default=0, help="mutants to take (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", action="append", default=[],
                    help="options of one `check` run (repeatable)")
    ap.add_argument("--lockstep", action="append", default=[],
                    help="a model test binary run as the lockstep oracle (repeatable)")
    ap.add_argument("--tests", action="append", default=[],
                    help="arguments of one `cargo test` run after the others (repeatable)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per oracle run")
    ap.add_argument("--names", help="a file of mutant names (one per line, a leading "
                    "`path:line:col: ` ignored): only those, e.g. the ones an earlier run "
                    "missed, again on a changed tree")
    a = ap.parse_args()

    listed = subprocess.run(
        ["cargo", "mutants", "--list", "--json", "--diff", "--file", a.file],
        cwd=REPO, check=True, capture_output=True, text=True).stdout
    mutants = []
    for m in json.loads(listed):
        # Only the file asked for, each mutant once.
        if m["file"] == a.file and all(m["name"] != n["name"] for n in mutants):
            mutants.append(m)
    def bare(name):
        # `src/x.rs:12:5: replace …` → `replace …` (line numbers move when the tree changes).
        parts = name.split(": ", 1)
        return parts[1] if len(parts) == 2 and parts[0].count(":") == 2 else name

    if a.names:
        with open(a.names) as f:
            wanted = {bare(line.strip().strip("|` ")) for line in f if line.strip()}
        mutants = [m for m in mutants if bare(m["name"]) in wanted]
    elif a.sample and a.sample < len(mutants):
        mutants = random.Random(a.seed).sample(mutants, a.sample)

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    if not os.path.isdir(WT):
        subprocess.run(["git", "worktree", "add", "--detach", WT, head], cwd=REPO, check=True)
    else:
        subprocess.run(["git", "checkout", "--detach", "--force", head], cwd=WT, check=True)
    # One build per mutant: the checker and the lockstep binaries with the same features (a
    # second feature set would build the library twice), incrementally (a mutant changes one
    # function; a release build from scratch of the library took most of each mutant's time).
    env = dict(os.environ, CARGO_TARGET_DIR=TARGET, CARGO_PROFILE_RELEASE_INCREMENTAL="true")
    build = ["cargo", "test", "--release", "-q", "-p", "flocklease-model", "--all-features",
             "--no-run"]
    status, _ = run(build, WT, 3600, env)
    if status != 0:
        sys.exit("the unmutated tree does not build")

    checker = os.path.join(TARGET, "release", "flocklease-model")
    counts = {}
    print(f"mutants of {a.file}: {len(mutants)} (seed {a.seed}, at {head[:7]})")
    print("| mutant | verdict | seconds |")
    print("| --- | --- | --- |")
    for m in mutants:
        name = m["name"]
        # cargo-mutants' diff names the mutant on its `+++` line: give git its paths.
        body = m["diff"].split("\n", 2)[2]
        diff = f"--- a/{m['file']}\n+++ b/{m['file']}\n{body}"
        subprocess.run(["git", "checkout", "--force", "--", "."], cwd=WT, check=True)
        applied = subprocess.run(["git", "apply", "-"], cwd=WT, input=diff, text=True)
        start = time.time()
        if applied.returncode != 0:
            verdict = "not applied"
        elif run(build, WT, 3600, env)[0] != 0:
            verdict = "unviable"
        else:
            verdict = "missed"
            for opts in a.check:
                status, _ = run([checker, "check"] + shlex.split(opts), WT, a.timeout, env)
                if status != 0:
                    verdict = f"check ({opts})"
                    break
            if verdict == "missed":
                for binary in a.lockstep:
                    cmd = ["cargo", "test", "--release", "-q", "-p", "flocklease-model",
                           "--all-features", "--test", binary]
                    if run(cmd, WT, a.timeout, env)[0] != 0:
                        verdict = f"lockstep ({binary})"
                        break
            if verdict == "missed":
                for args in a.tests:
                    cmd = ["cargo", "test", "-q", "--all-features"] + shlex.split(args)
                    if run(cmd, WT, a.timeout, env)[0] != 0:
                        verdict = f"tests ({args})"
                        break
        kind = verdict.split(" ")[0]
        counts[kind] = counts.get(kind, 0) + 1
        print(f"| `{name}` | {verdict} | {time.time() - start:.0f} |", flush=True)
    subprocess.run(["git", "checkout", "--force", "--", "."], cwd=WT, check=True)
    print("summary: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
