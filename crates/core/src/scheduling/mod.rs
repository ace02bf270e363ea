//! The scheduling core: filters -> weighted scorers -> picker, per profile, with GIE semantics.
//! Plugins are plain Rust objects over plain data; nothing here knows about the proxy.
//!
//!
//! One file per concern: the plugin traits (`traits.rs`), the per-decision state they read
//! (`cycle.rs`), profiles as data (`profile.rs`), score arithmetic (`score.rs`) and the
//! scheduler that runs them (`scheduler.rs`). Their items are re-exported here, so callers
//! name `crate::scheduling::X` whichever file `X` lives in.

mod cycle;
pub mod flow_policy;
pub mod flow_policy_plugins;
pub mod plugins;
pub mod prefix_home;
pub mod prefix_index;
mod profile;
pub mod rng;
mod scheduler;
mod score;
mod traits;

pub use cycle::{
    CycleState, LatencyPredictions, LearnedPrefix, Prediction, PrefixMatches, SchedulingContext,
    Wiring,
};
pub use profile::{Profile, ProfileResult, WeightedScorer};
pub use scheduler::explain::ExplainRow;
pub use scheduler::{Decision, ScheduleError, Scheduler};
pub use score::{clamp_score, score_lower_is_better};
pub use traits::{
    Admission, BuiltIn, DataLayerPlugin, Filter, ModelsSource, PdDecider, Picker, Plugin,
    PluginInstance, PluginSummary, ProfileHandler, SaturationDetector, Scorer,
};

#[cfg(test)]
pub(crate) mod test_support;
