//! `fcfs-ordering-policy` (llm-d's default ordering): within a flow, requests leave in the
//! order they arrived. Consumes the arrival time; no parameters.

use super::no_parameters_policy;
use crate::scheduling::flow_policy::{FlowPolicy, OrderFacts, Ordering};
use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "fcfs-ordering-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<NoParameters>);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    no_parameters_policy(parameters, FlowPolicy::Ordering(Ordering::Fcfs))
}

pub fn key(facts: &OrderFacts) -> u64 {
    facts.arrived_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::scheduling::flow_policy_plugins::ordering_key;

    #[test]
    fn earlier_arrival_goes_first_whatever_the_deadline() {
        let early = OrderFacts {
            arrived_ms: 1,
            expires_ms: 900,
            slo_deadline_ms: Some(900),
        };
        let late = OrderFacts {
            arrived_ms: 2,
            expires_ms: 10,
            slo_deadline_ms: Some(5),
        };
        assert!(ordering_key(Ordering::Fcfs, &early) < ordering_key(Ordering::Fcfs, &late));
        assert!(build(&serde_yaml::from_str("{x: 1}").unwrap()).is_err());
    }
}
