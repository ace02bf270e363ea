//! Every plugin type the filter knows, registered in one place. Each plugin lives in a file
//! named after its config `type` and carries its parameters, defaults and tests.

pub mod admitter;
pub mod data_producer;
pub mod datalayer;
pub mod decider;
pub mod filter;
pub mod flow_control;
mod not_supported;
pub mod parser;
pub mod picker;
pub mod pre_request;
pub mod profile_handler;
pub mod saturation_detector;
pub mod scorer;

pub mod spec;

pub use spec::{
    no_parameters, parameters, Builder, Data, Effective, Ignored, Kind, NoParameters,
    PickerParameters, PluginSpec, Signal,
};

use super::Plugin;
use serde_yaml::Value;

/// Every plugin type, by kind. Each entry is the `SPEC` its own file declares.
const REGISTRY: &[&PluginSpec] = &[
    &datalayer::core_metrics_extractor::SPEC,
    &datalayer::metrics_data_source::SPEC,
    &datalayer::models_data_extractor::SPEC,
    &datalayer::models_data_source::SPEC,
    &datalayer::prometheus_metric::SPEC,
    &filter::by_label::SPEC,
    &filter::decode_filter::SPEC,
    &filter::encode_filter::SPEC,
    &filter::header_based_testing_filter::SPEC,
    &filter::label_selector_filter::SPEC,
    &filter::prefill_filter::SPEC,
    &filter::prefix_cache_affinity_filter::SPEC,
    &filter::slo_headroom_tier_filter::SPEC,
    &scorer::active_request_scorer::SPEC,
    &scorer::context_length_aware::SPEC,
    &scorer::kv_cache_utilization_scorer::SPEC,
    &scorer::latency_scorer::SPEC,
    &scorer::load_aware_scorer::SPEC,
    &scorer::lora_affinity_scorer::SPEC,
    &scorer::metric_scorer::SPEC,
    &scorer::no_hit_lru_scorer::SPEC,
    &scorer::prefix_cache_scorer::SPEC,
    &scorer::queue_scorer::SPEC,
    &scorer::request_cost_scorer::SPEC,
    &scorer::running_requests_size_scorer::SPEC,
    &scorer::session_affinity_scorer::SPEC,
    &scorer::token_load_scorer::SPEC,
    &picker::max_score_picker::SPEC,
    &picker::random_picker::SPEC,
    &picker::weighted_random_picker::SPEC,
    &profile_handler::disagg_profile_handler::SPEC,
    &profile_handler::header_profile_handler::SPEC,
    &profile_handler::pd_profile_handler::SPEC,
    &profile_handler::single_profile_handler::SPEC,
    &decider::always_disagg_pd_decider::SPEC,
    &decider::prefix_based_pd_decider::SPEC,
    &saturation_detector::concurrency_detector::SPEC,
    &saturation_detector::utilization_detector::SPEC,
    &pre_request::disagg_headers_handler::SPEC,
    &flow_control::global_strict_fairness_policy::SPEC,
    &flow_control::round_robin_fairness_policy::SPEC,
    &flow_control::fcfs_ordering_policy::SPEC,
    &flow_control::edf_ordering_policy::SPEC,
    &flow_control::slo_deadline_ordering_policy::SPEC,
    &flow_control::static_usage_limit_policy::SPEC,
    &flow_control::priority_holdback_policy::SPEC,
    &flow_control::priority_reserve_policy::SPEC,
    &data_producer::approx_prefix_cache_producer::SPEC,
    &data_producer::inflight_load_producer::SPEC,
    &data_producer::predicted_latency_producer::SPEC,
    &admitter::latency_slo_admitter::SPEC,
    &data_producer::token_producer::SPEC,
    &parser::openai_parser::SPEC,
    &parser::anthropic_parser::SPEC,
    &parser::passthrough_parser::SPEC,
    &parser::vllmhttp_parser::SPEC,
    &parser::sglanghttp_parser::SPEC,
];

use not_supported::NOT_SUPPORTED;

/// The spec registered for a type name or one of its aliases.
pub fn spec(type_name: &str) -> Option<&'static PluginSpec> {
    REGISTRY
        .iter()
        .copied()
        .find(|spec| spec.answers_to(type_name))
}

/// Every spec, in registry order.
pub fn specs() -> impl Iterator<Item = &'static PluginSpec> {
    REGISTRY.iter().copied()
}

/// The name a configured type was registered under (`&'static`), if known.
pub fn known_type(type_name: &str) -> Option<&'static str> {
    specs()
        .flat_map(|spec| std::iter::once(spec.type_name).chain(spec.aliases.iter().copied()))
        .find(|name| *name == type_name)
}

/// Every type name and alias the loader accepts.
pub fn all_types() -> impl Iterator<Item = &'static str> {
    specs().flat_map(|spec| std::iter::once(spec.type_name).chain(spec.aliases.iter().copied()))
}

/// Every llm-d type the filter refuses by name, with its reason.
pub fn refused_types() -> impl Iterator<Item = (&'static str, &'static str)> {
    NOT_SUPPORTED.iter().copied()
}

/// Why an llm-d plugin type the filter knows of is not implemented.
pub fn not_supported(type_name: &str) -> Option<&'static str> {
    NOT_SUPPORTED
        .iter()
        .find(|(name, _)| *name == type_name)
        .map(|(_, why)| *why)
}

/// Builds a plugin from its type and `parameters` (null when absent).
pub fn build(type_name: &str, parameters: &Value) -> Result<Plugin, String> {
    if let Some(why) = not_supported(type_name) {
        return Err(format!("plugin type {type_name:?} is not supported: {why}"));
    }
    let spec = spec(type_name).ok_or_else(|| format!("unknown plugin type {type_name:?}"))?;
    (spec.build)(parameters)
}

/// A plugin's parameters as the filter uses them: given values plus every default.
pub fn effective_parameters(type_name: &str, parameters: &Value) -> Result<Value, String> {
    let spec = spec(type_name).ok_or_else(|| format!("unknown plugin type {type_name:?}"))?;
    (spec.effective)(parameters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    /// Types that need parameters to mean anything.
    const NEED_PARAMETERS: &[&str] = &[
        "prometheus-metric",
        "metric-scorer",
        "label-selector-filter",
        "by-label-selector",
        "by-label",
        "priority-holdback-policy",
    ];

    #[test]
    fn every_type_builds_with_defaults() {
        for type_name in all_types() {
            let built = build(type_name, &Value::Null);
            assert_eq!(
                built.is_ok(),
                !NEED_PARAMETERS.contains(&type_name),
                "{type_name}"
            );
        }
    }

    #[test]
    fn effective_parameters_fill_in_defaults() {
        let given: Value = serde_yaml::from_str("{threshold: 10}").unwrap();
        let effective = effective_parameters("load-aware-scorer", &given).unwrap();
        assert_eq!(effective["threshold"], 10.0);
        let effective = effective_parameters("prefix-cache-scorer", &Value::Null).unwrap();
        assert_eq!(effective["blockSizeTokens"], 16);
        assert_eq!(effective["lruCapacityPerServer"], 31250);
        let effective = effective_parameters("active-request-scorer", &Value::Null).unwrap();
        assert_eq!(effective["requestTimeout"], "120s");
        for type_name in all_types() {
            if !NEED_PARAMETERS.contains(&type_name) {
                assert!(
                    effective_parameters(type_name, &Value::Null).is_ok(),
                    "{type_name}"
                );
            }
        }
    }

    #[test]
    fn unknown_types_and_parameters_are_rejected() {
        assert!(build("queue-scorerr", &Value::Null)
            .unwrap_err()
            .contains("unknown plugin type"));
        let bad: Value = serde_yaml::from_str("{nope: 1}").unwrap();
        assert!(build("max-score-picker", &bad)
            .unwrap_err()
            .contains("nope"));
        let zero: Value = serde_yaml::from_str("{maxNumOfEndpoints: 0}").unwrap();
        assert!(build("random-picker", &zero).is_err());
    }
}
