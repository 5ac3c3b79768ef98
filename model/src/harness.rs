//! What the models' checks share: the verdicts on their properties and the lines `check`
//! prints of them.

use std::io::{self, Write};
use std::time::Duration;

use stateright::{Checker, Expectation, Model};

/// One property's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The property's name.
    pub name: &'static str,
    /// `always`, `sometimes` or `eventually`.
    pub expectation: &'static str,
    /// Whether it holds (`always`, `eventually`: no counterexample; `sometimes`: witnessed).
    pub ok: bool,
    /// Whether the verdict is final: `false` for a property not (yet) violated or witnessed
    /// when the search stopped at the first violation of another.
    pub known: bool,
}

impl Verdict {
    /// The verdict in words, as `check` prints it.
    pub fn word(&self) -> &'static str {
        match (self.expectation, self.ok, self.known) {
            (_, _, false) => "unknown (search stopped)",
            ("sometimes", true, _) => "witnessed",
            ("sometimes", false, _) => "NEVER WITNESSED",
            (_, true, _) => "holds",
            (_, false, _) => "VIOLATED",
        }
    }

    /// Writes the verdict's line, its name padded to `width`.
    pub fn write(&self, width: usize, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "  {:9} {:width$} {}",
            self.expectation,
            self.name,
            self.word()
        )
    }
}

/// The result of a check.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Distinct states explored.
    pub unique_states: usize,
    /// States generated, with repeats.
    pub states: usize,
    /// The deepest path explored.
    pub max_depth: usize,
    /// One verdict per property, in the model's order.
    pub verdicts: Vec<Verdict>,
    /// Whether every reachable state was explored (no violation stopped the search).
    pub complete: bool,
}

impl Outcome {
    /// What `checker`, done, found of `model`'s properties (`complete`: of every state).
    pub fn of<M>(model: &M, checker: &impl Checker<M>, complete: bool) -> Outcome
    where
        M: Model<State: Clone + PartialEq, Action: Clone + PartialEq>,
    {
        let found = checker.discoveries();
        let verdicts = model
            .properties()
            .iter()
            .map(|p| {
                let found = found.contains_key(p.name);
                let (expectation, ok) = match p.expectation {
                    Expectation::Always => ("always", !found),
                    Expectation::Sometimes => ("sometimes", found),
                    Expectation::Eventually => ("eventually", !found),
                };
                Verdict {
                    name: p.name,
                    expectation,
                    ok,
                    known: complete || found,
                }
            })
            .collect();
        Outcome {
            unique_states: checker.unique_state_count(),
            states: checker.state_count(),
            max_depth: checker.max_depth(),
            verdicts,
            complete,
        }
    }

    /// Writes `check`'s line of counts and the search's time.
    pub fn write_counts(&self, elapsed: Duration, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "explored {} unique states ({} generated, max depth {}) in {elapsed:.1?}{}",
            self.unique_states,
            self.states,
            self.max_depth,
            if self.complete {
                ""
            } else {
                "; stopped at the first violation"
            }
        )
    }

    /// The properties that do not hold (an `always` violated, a `sometimes` never witnessed).
    pub fn failed(&self) -> Vec<&'static str> {
        self.verdicts
            .iter()
            .filter(|v| !v.ok)
            .map(|v| v.name)
            .collect()
    }
}
