//! Every plugin type the filter knows, registered in one place. Each plugin lives in a file
//! named after its config `type` and carries its parameters, defaults and tests.

pub mod datalayer;
pub mod decider;
pub mod filter;
pub mod picker;
pub mod pre_request;
pub mod profile_handler;
pub mod saturation_detector;
pub mod scorer;

use datalayer::{metrics_data_source, prometheus_metric};
use decider::{always_disagg_pd_decider, prefix_based_pd_decider};
use filter::{
    by_label, decode_filter, encode_filter, header_based_testing_filter, label_selector_filter,
    prefill_filter, prefix_cache_affinity_filter,
};
use picker::{max_score_picker, random_picker, weighted_random_picker};
use pre_request::disagg_headers_handler;
use profile_handler::{disagg_profile_handler, pd_profile_handler, single_profile_handler};
use saturation_detector::{concurrency_detector, utilization_detector};
use scorer::{
    active_request_scorer, context_length_aware, kv_cache_utilization_scorer, load_aware_scorer,
    lora_affinity_scorer, metric_scorer, no_hit_lru_scorer, prefix_cache_scorer, queue_scorer,
    request_cost_scorer, running_requests_size_scorer, session_affinity_scorer, token_load_scorer,
};

use super::Plugin;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

type Builder = fn(&Value) -> Result<Plugin, String>;
/// Parameters with every default filled in, for the config checker.
type Effective = fn(&Value) -> Result<Value, String>;

/// `(type, builder, effective parameters)`; older names and aliases users still write are
/// their own entries.
const REGISTRY: &[(&str, Builder, Effective)] = &[
    // Data layer (custom metrics).
    (
        metrics_data_source::TYPE,
        metrics_data_source::build,
        effective::<metrics_data_source::Parameters>,
    ),
    (
        prometheus_metric::TYPE,
        prometheus_metric::build,
        effective::<prometheus_metric::Parameters>,
    ),
    // Filters.
    (
        decode_filter::TYPE,
        decode_filter::build,
        effective::<NoParameters>,
    ),
    (
        prefill_filter::TYPE,
        prefill_filter::build,
        effective::<NoParameters>,
    ),
    (
        encode_filter::TYPE,
        encode_filter::build,
        effective::<NoParameters>,
    ),
    (
        label_selector_filter::TYPE,
        label_selector_filter::build,
        effective::<label_selector_filter::Selector>,
    ),
    (
        label_selector_filter::ALIAS_TYPE,
        label_selector_filter::build,
        effective::<label_selector_filter::Selector>,
    ),
    (
        by_label::TYPE,
        by_label::build,
        effective::<by_label::Parameters>,
    ),
    (
        prefix_cache_affinity_filter::TYPE,
        prefix_cache_affinity_filter::build,
        effective::<prefix_cache_affinity_filter::Parameters>,
    ),
    (
        header_based_testing_filter::TYPE,
        header_based_testing_filter::build,
        effective::<NoParameters>,
    ),
    // Scorers.
    (
        queue_scorer::TYPE,
        queue_scorer::build,
        effective::<NoParameters>,
    ),
    (
        kv_cache_utilization_scorer::TYPE,
        kv_cache_utilization_scorer::build,
        effective::<NoParameters>,
    ),
    (
        kv_cache_utilization_scorer::LEGACY_TYPE,
        kv_cache_utilization_scorer::build,
        effective::<NoParameters>,
    ),
    (
        running_requests_size_scorer::TYPE,
        running_requests_size_scorer::build,
        effective::<NoParameters>,
    ),
    (
        lora_affinity_scorer::TYPE,
        lora_affinity_scorer::build,
        effective::<NoParameters>,
    ),
    (
        prefix_cache_scorer::TYPE,
        prefix_cache_scorer::build,
        effective::<prefix_cache_scorer::Parameters>,
    ),
    (
        prefix_cache_scorer::LEGACY_TYPE,
        prefix_cache_scorer::build,
        effective::<prefix_cache_scorer::Parameters>,
    ),
    (
        active_request_scorer::TYPE,
        active_request_scorer::build,
        effective::<active_request_scorer::Parameters>,
    ),
    (
        load_aware_scorer::TYPE,
        load_aware_scorer::build,
        effective::<load_aware_scorer::Parameters>,
    ),
    (
        token_load_scorer::TYPE,
        token_load_scorer::build,
        effective::<token_load_scorer::Parameters>,
    ),
    (
        session_affinity_scorer::TYPE,
        session_affinity_scorer::build,
        effective::<NoParameters>,
    ),
    (
        no_hit_lru_scorer::TYPE,
        no_hit_lru_scorer::build,
        effective::<no_hit_lru_scorer::Parameters>,
    ),
    (
        context_length_aware::TYPE,
        context_length_aware::build,
        effective::<context_length_aware::Parameters>,
    ),
    (
        metric_scorer::TYPE,
        metric_scorer::build,
        effective::<metric_scorer::Parameters>,
    ),
    (
        request_cost_scorer::TYPE,
        request_cost_scorer::build,
        effective::<request_cost_scorer::Parameters>,
    ),
    // Pickers.
    (
        max_score_picker::TYPE,
        max_score_picker::build,
        effective::<PickerParameters>,
    ),
    (
        max_score_picker::LEGACY_TYPE,
        max_score_picker::build,
        effective::<PickerParameters>,
    ),
    (
        random_picker::TYPE,
        random_picker::build,
        effective::<PickerParameters>,
    ),
    (
        weighted_random_picker::TYPE,
        weighted_random_picker::build,
        effective::<PickerParameters>,
    ),
    // Profile handlers and P/D.
    (
        single_profile_handler::TYPE,
        single_profile_handler::build,
        effective::<NoParameters>,
    ),
    (
        single_profile_handler::LEGACY_TYPE,
        single_profile_handler::build,
        effective::<NoParameters>,
    ),
    (
        disagg_profile_handler::TYPE,
        disagg_profile_handler::build,
        effective::<disagg_profile_handler::Parameters>,
    ),
    (
        pd_profile_handler::TYPE,
        pd_profile_handler::build,
        effective::<pd_profile_handler::Parameters>,
    ),
    (
        prefix_based_pd_decider::TYPE,
        prefix_based_pd_decider::build,
        effective::<prefix_based_pd_decider::Parameters>,
    ),
    (
        always_disagg_pd_decider::TYPE,
        always_disagg_pd_decider::build,
        effective::<NoParameters>,
    ),
    (
        disagg_headers_handler::TYPE,
        disagg_headers_handler::build,
        effective::<disagg_headers_handler::Parameters>,
    ),
    (
        disagg_headers_handler::LEGACY_TYPE,
        disagg_headers_handler::build,
        effective::<disagg_headers_handler::Parameters>,
    ),
    // Saturation detectors (`saturationDetector.pluginRef`).
    (
        utilization_detector::TYPE,
        utilization_detector::build,
        effective::<utilization_detector::Parameters>,
    ),
    (
        concurrency_detector::TYPE,
        concurrency_detector::build,
        effective::<concurrency_detector::Parameters>,
    ),
];

/// The canonical type name (`&'static`) for a configured type, if known.
pub fn known_type(type_name: &str) -> Option<&'static str> {
    REGISTRY
        .iter()
        .find(|(name, _, _)| *name == type_name)
        .map(|(name, _, _)| *name)
}

pub fn all_types() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|(name, _, _)| *name)
}

/// Builds a plugin from its type and `parameters` (null when absent).
pub fn build(type_name: &str, parameters: &Value) -> Result<Plugin, String> {
    let (_, builder, _) = REGISTRY
        .iter()
        .find(|(name, _, _)| *name == type_name)
        .ok_or_else(|| format!("unknown plugin type {type_name:?}"))?;
    builder(parameters)
}

/// A plugin's parameters as the filter uses them: given values plus every default.
pub fn effective_parameters(type_name: &str, parameters: &Value) -> Result<Value, String> {
    let (_, _, effective) = REGISTRY
        .iter()
        .find(|(name, _, _)| *name == type_name)
        .ok_or_else(|| format!("unknown plugin type {type_name:?}"))?;
    effective(parameters)
}

fn effective<P: DeserializeOwned + serde::Serialize + Default>(
    value: &Value,
) -> Result<Value, String> {
    let parsed: P = parameters(value)?;
    serde_yaml::to_value(parsed).map_err(|error| error.to_string())
}

/// Deserializes a plugin's parameters; absent parameters mean all defaults.
pub fn parameters<P: DeserializeOwned + Default>(value: &Value) -> Result<P, String> {
    if value.is_null() {
        return Ok(P::default());
    }
    serde_yaml::from_value(value.clone()).map_err(|error| error.to_string())
}

/// The parameters of plugins that take none: any given key is an error.
#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct NoParameters {}

/// Checks that a plugin that takes no parameters was given none.
pub fn no_parameters(value: &Value) -> Result<(), String> {
    parameters::<NoParameters>(value).map(|_| ())
}

/// `maxNumOfEndpoints`, shared by every picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerParameters {
    pub max_num_of_endpoints: usize,
}

impl Default for PickerParameters {
    fn default() -> Self {
        PickerParameters {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerParameters {
    pub fn parse(value: &Value) -> Result<Self, String> {
        let parsed: PickerParameters = parameters(value)?;
        if parsed.max_num_of_endpoints == 0 {
            return Err("maxNumOfEndpoints must be at least 1".into());
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    /// Types that need parameters to mean anything.
    const NEED_PARAMETERS: &[&str] = &[
        prometheus_metric::TYPE,
        metric_scorer::TYPE,
        label_selector_filter::TYPE,
        label_selector_filter::ALIAS_TYPE,
        by_label::TYPE,
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
