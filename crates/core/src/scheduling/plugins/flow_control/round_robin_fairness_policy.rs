//! `round-robin-fairness-policy`: the flows of a band (one per fairness id,
//! `x-llm-d-inference-fairness-id`) take turns in fairness-id order, skipping flows with
//! nothing waiting, so a tenant sending ten times more still gets one dispatch in N while
//! the others wait. The cursor is the fairness id served last in the band, Envoy-wide.
//! No parameters.

use super::no_parameters_policy;
use crate::scheduling::flow_policy::{Fairness, FlowPolicy};
use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "round-robin-fairness-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<NoParameters>);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    no_parameters_policy(parameters, FlowPolicy::Fairness(Fairness::RoundRobin))
}

/// Index of the next flow after `last` in fairness-id order (wrapping), among `heads`.
pub fn pick<K>(heads: &[(&str, K)], last: Option<&str>) -> Option<usize> {
    let after = |i: &usize| heads.get(*i).map(|h| h.0);
    let next = (0..heads.len())
        .filter(|i| last.is_none_or(|last| after(i).is_some_and(|id| id > last)))
        .min_by_key(after);
    next.or_else(|| (0..heads.len()).min_by_key(after))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn flows_take_turns_in_id_order_and_wrap() {
        let heads = [("b", 1), ("a", 2), ("c", 3)];
        assert_eq!(pick(&heads, None), Some(1), "a first");
        assert_eq!(pick(&heads, Some("a")), Some(0), "then b");
        assert_eq!(pick(&heads, Some("b")), Some(2), "then c");
        assert_eq!(pick(&heads, Some("c")), Some(1), "wraps to a");
        assert_eq!(pick(&[("x", 0)], Some("x")), Some(0), "one flow always");
        assert_eq!(pick::<u64>(&[], Some("x")), None);
    }
}
