//! What the models' checks share: the verdicts and the lines `check` prints of them; and, for
//! the smaller models (`run`'s supervision, the waiting line, a resource's fence, the threads
//! of one instance), the whole of `check` and the tests' two assertions: a configuration holds
//! with a pinned state count, and a planted mistake fails a property. A smaller model keeps
//! its state, actions and properties ([`Model`]) and its [`SmallModel`] items. The lease model
//! ([`crate::report`]) searches and reports its own way: it stops at the first violation,
//! shows its progress, and explains a counterexample in words.

use std::fmt;
use std::hash::Hash;
use std::io::{self, Write};
use std::time::{Duration, Instant};

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

/// A smaller model, checked whole: its configuration's defaults ([`Default`]), its planted
/// mistakes, and what `check` says of it.
pub trait SmallModel:
    Model<
        State: fmt::Display + fmt::Debug + Hash + Clone + PartialEq + Send + Sync + 'static,
        Action: fmt::Debug + Clone + PartialEq + Send + Sync,
    > + Clone
    + Default
    + Send
    + Sync
    + 'static
{
    /// Its planted mistakes.
    type Planted: Copy + fmt::Debug + PartialEq + 'static;
    /// Its name for `check --config NAME`.
    const CONFIG: &'static str;
    /// What `explore` serves, as "explorer of ..." says it.
    const TITLE: &'static str;
    /// Its planted mistakes, each with its name for `--planted`.
    const PLANTED: &'static [(&'static str, Self::Planted)] = &[];
    /// What the last state of a counterexample breaks, said plainly (empty: not said).
    const BREAKS: &'static str = "";

    /// Where it keeps its planted mistake (none: it has no mistakes to plant).
    fn planted_mut(&mut self) -> Option<&mut Option<Self::Planted>> {
        None
    }

    /// Configurations `check` runs after this one (the same model with other actors, too
    /// many states together with this one's).
    fn alongside(&self) -> Vec<Self> {
        Vec::new()
    }

    /// This configuration with `planted` planted.
    fn plant(mut self, planted: Self::Planted) -> Self {
        if let Some(slot) = self.planted_mut() {
            *slot = Some(planted);
        }
        self
    }

    /// The configuration `planted` shows in, when it is not the default: `--planted` checks
    /// it there, whatever configuration it was given with.
    fn shown_in(_planted: Self::Planted) -> Option<Self> {
        None
    }

    /// What `check` prints first: the actors and the bounds (the planted mistake follows).
    fn header(&self) -> String;

    /// The configurations `check` runs for this one: itself, unless the model adds some.
    fn configurations(self) -> Vec<Self> {
        vec![self]
    }
}

/// Explores every reachable state of `model`, breadth first, to the end, on as many threads as
/// the machine has cores (the lease model's search uses two as well).
pub fn explore<M: SmallModel>(model: M) -> impl Checker<M> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    model.checker().threads(threads).spawn_bfs().join()
}

/// `check` of each of `model`'s configurations: its header, counts and time, verdicts and,
/// under a violated property, its shortest counterexample (breadth first) step by step.
/// Returns whether everything held.
pub fn check<M: SmallModel>(model: M, out: &mut impl Write) -> io::Result<bool> {
    let mut ok = true;
    for (i, model) in model.configurations().into_iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        ok &= check_one(model, out)?;
    }
    Ok(ok)
}

/// Asserts that `model` holds every property with exactly `states` unique states: a pinned
/// count, so a truncated search fails and a change that moves it must say why.
pub fn assert_holds<M: SmallModel>(model: M, states: usize) {
    let outcome = Outcome::of(&model, &explore(model.clone()), true);
    assert_eq!(
        outcome.unique_states,
        states,
        "{}: state space changed: re-pin after review",
        M::CONFIG
    );
    assert_eq!(outcome.failed(), Vec::<&str>::new(), "{}", M::CONFIG);
}

/// Asserts that `planted`, in the configuration it shows in ([`SmallModel::shown_in`], else
/// the default), fails `property`. Returns every property it fails.
pub fn assert_caught<M: SmallModel>(planted: M::Planted, property: &str) -> Vec<&'static str> {
    let model = M::shown_in(planted).unwrap_or_default().plant(planted);
    let failed = Outcome::of(&model, &explore(model.clone()), true).failed();
    assert!(
        failed.contains(&property),
        "{planted:?} passed \"{property}\" (failed: {failed:?})"
    );
    failed
}

fn check_one<M: SmallModel>(mut model: M, out: &mut impl Write) -> io::Result<bool> {
    let planted = (model.planted_mut().and_then(|p| *p))
        .map_or(String::new(), |p| format!("; planted {p:?}"));
    writeln!(out, "{}{planted}", model.header())?;
    let start = Instant::now();
    let checker = explore(model.clone());
    let elapsed = start.elapsed();
    let outcome = Outcome::of(&model, &checker, true);
    outcome.write_counts(elapsed, out)?;
    for v in &outcome.verdicts {
        v.write(76, out)?;
        if v.expectation == "sometimes" || v.ok {
            continue;
        }
        let Some(path) = checker.discovery(v.name) else {
            continue;
        };
        writeln!(out, "\nshortest counterexample for \"{}\":", v.name)?;
        let states = path.clone().into_states();
        writeln!(out, "   start: {}", states[0])?;
        for (i, (a, s)) in path.into_actions().iter().zip(&states[1..]).enumerate() {
            writeln!(out, "  {:>2}. {a:?}: {s}", i + 1)?;
        }
        if !M::BREAKS.is_empty() {
            writeln!(out, "  the last state breaks it: {}", M::BREAKS)?;
        }
    }
    Ok(outcome.verdicts.iter().all(|v| v.ok))
}
