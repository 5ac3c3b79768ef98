//! Stateright model of the `flocklease` transition machine (placeholder until the model lands).

pub use flocklease::machine;
