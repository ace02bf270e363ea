//! Every plugin type the filter knows, registered in one place. Each plugin lives in a file
//! named after its config `type` and carries its parameters, defaults and tests.

pub mod kv_cache_utilization_scorer;
pub mod lora_affinity_scorer;
pub mod max_score_picker;
pub mod prefix_cache_scorer;
pub mod queue_scorer;
pub mod random_picker;
pub mod running_requests_size_scorer;
pub mod single_profile_handler;

use super::Plugin;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

type Builder = fn(&Value) -> Result<Plugin, String>;

/// `(type, builder)`; older names users still write are listed as their own entries.
const REGISTRY: &[(&str, Builder)] = &[
    (queue_scorer::TYPE, queue_scorer::build),
    (
        kv_cache_utilization_scorer::TYPE,
        kv_cache_utilization_scorer::build,
    ),
    (
        kv_cache_utilization_scorer::LEGACY_TYPE,
        kv_cache_utilization_scorer::build,
    ),
    (
        running_requests_size_scorer::TYPE,
        running_requests_size_scorer::build,
    ),
    (lora_affinity_scorer::TYPE, lora_affinity_scorer::build),
    (prefix_cache_scorer::TYPE, prefix_cache_scorer::build),
    (prefix_cache_scorer::LEGACY_TYPE, prefix_cache_scorer::build),
    (max_score_picker::TYPE, max_score_picker::build),
    (max_score_picker::LEGACY_TYPE, max_score_picker::build),
    (random_picker::TYPE, random_picker::build),
    (single_profile_handler::TYPE, single_profile_handler::build),
    (
        single_profile_handler::LEGACY_TYPE,
        single_profile_handler::build,
    ),
];

/// The canonical type name (`&'static`) for a configured type, if known.
pub fn known_type(type_name: &str) -> Option<&'static str> {
    REGISTRY
        .iter()
        .find(|(name, _)| *name == type_name)
        .map(|(name, _)| *name)
}

pub fn all_types() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|(name, _)| *name)
}

/// Builds a plugin from its type and `parameters` (null when absent).
pub fn build(type_name: &str, parameters: &Value) -> Result<Plugin, String> {
    let (_, builder) = REGISTRY
        .iter()
        .find(|(name, _)| *name == type_name)
        .ok_or_else(|| format!("unknown plugin type {type_name:?}"))?;
    builder(parameters)
}

/// Deserializes a plugin's parameters; absent parameters mean all defaults.
pub fn parameters<P: DeserializeOwned + Default>(value: &Value) -> Result<P, String> {
    if value.is_null() {
        return Ok(P::default());
    }
    serde_yaml::from_value(value.clone()).map_err(|error| error.to_string())
}

/// `maxNumOfEndpoints`, shared by every picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
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

    #[test]
    fn every_type_builds_with_defaults() {
        for type_name in all_types() {
            assert!(build(type_name, &Value::Null).is_ok(), "{type_name}");
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
