//! `global-strict-fairness-policy` (llm-d's default fairness): no fairness between flows;
//! the band is one queue and the request that its ordering policy puts first goes next,
//! whichever tenant sent it. No parameters.

use super::no_parameters_policy;
use crate::scheduling::flow_policy::{Fairness, FlowPolicy};
use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "global-strict-fairness-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<NoParameters>);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    no_parameters_policy(parameters, FlowPolicy::Fairness(Fairness::GlobalStrict))
}

/// Index of the flow whose head goes first: the smallest ordering key.
pub fn pick<K: Ord + Copy>(heads: &[(&str, K)]) -> Option<usize> {
    (0..heads.len()).min_by_key(|&i| heads.get(i).map(|h| h.1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn the_oldest_head_wins_whoever_sent_it() {
        assert_eq!(pick(&[("a", 5), ("b", 3), ("c", 9)]), Some(1));
        assert_eq!(pick::<u64>(&[]), None);
    }
}
