//! `slo-deadline-ordering-policy`: earliest TTFT deadline first, the deadline being arrival +
//! the request header `x-llm-d-slo-ttft-ms` (older name `x-slo-ttft-ms`, milliseconds).
//! Requests without the header go after every request with one, in arrival order.
//! Consumes that header; no parameters.

use super::no_parameters_policy;
use crate::scheduling::flow_policy::{FlowPolicy, OrderFacts, Ordering};
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "slo-deadline-ordering-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<NoParameters>).consuming(&[
        Data::RequestHeader(crate::protocol::SLO_TTFT_HEADER),
        Data::RequestHeader(crate::protocol::SLO_TTFT_LEGACY_HEADER),
    ]);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    no_parameters_policy(parameters, FlowPolicy::Ordering(Ordering::SloDeadline))
}

pub fn key(facts: &OrderFacts) -> u64 {
    facts.slo_deadline_ms.unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::scheduling::flow_policy_plugins::ordering_key;

    #[test]
    fn a_stated_deadline_beats_none_and_the_tighter_one_goes_first() {
        let none = OrderFacts {
            arrived_ms: 1,
            expires_ms: 60_000,
            slo_deadline_ms: None,
        };
        let loose = OrderFacts {
            arrived_ms: 2,
            expires_ms: 60_000,
            slo_deadline_ms: Some(2_000),
        };
        let tight = OrderFacts {
            arrived_ms: 3,
            expires_ms: 60_000,
            slo_deadline_ms: Some(300),
        };
        let policy = Ordering::SloDeadline;
        assert!(ordering_key(policy, &tight) < ordering_key(policy, &loose));
        assert!(ordering_key(policy, &loose) < ordering_key(policy, &none));
    }
}
