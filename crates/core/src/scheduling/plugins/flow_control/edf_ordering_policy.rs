//! `edf-ordering-policy`: earliest deadline first, the deadline being the moment the queue
//! would give up on the request (arrival + `defaultRequestTTL`, or `noEndpointRequestTTL`
//! while the pool has no endpoint). Consumes arrival and TTL; no parameters.

use super::no_parameters_policy;
use crate::scheduling::flow_policy::{FlowPolicy, OrderFacts, Ordering};
use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "edf-ordering-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<NoParameters>);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    no_parameters_policy(parameters, FlowPolicy::Ordering(Ordering::Edf))
}

pub fn key(facts: &OrderFacts) -> u64 {
    facts.expires_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::scheduling::flow_policy_plugins::ordering_key;

    #[test]
    fn the_nearer_deadline_goes_first() {
        let early = OrderFacts {
            arrived_ms: 1,
            expires_ms: 900,
            slo_deadline_ms: None,
        };
        let urgent = OrderFacts {
            arrived_ms: 2,
            expires_ms: 100,
            slo_deadline_ms: None,
        };
        assert!(ordering_key(Ordering::Edf, &urgent) < ordering_key(Ordering::Edf, &early));
    }
}
