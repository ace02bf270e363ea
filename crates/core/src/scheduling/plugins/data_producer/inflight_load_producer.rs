//! `inflight-load-producer` (llm-d-router): each endpoint's requests and tokens in flight, for
//! `active-request-scorer`, `token-load-scorer` and `concurrency-detector`. The filter counts
//! those itself at every pick and stream end, Envoy-wide, so this producer only has to load.

use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "inflight-load-producer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .done_by("the filter counts each endpoint's in-flight requests and tokens (uncached prompt plus max_tokens) itself, across Envoy's workers")
    .ignoring(&[
        Ignored::parameter(
            "addEstimatedOutputTokens",
            "the filter counts max_tokens as the output of every request in flight",
        ),
        Ignored::parameter(
            "outputRatio",
            "the filter counts max_tokens as the output of every request in flight",
        ),
        Ignored::parameter(
            "maxEstimatedOutputTokens",
            "the filter counts max_tokens as the output of every request in flight",
        ),
        Ignored::PREFIX_PRODUCER,
        Ignored::parameter(
            "syncCrossReplicaState",
            "replicas never talk; each counts its own placements, times pool.replicas",
        ),
    ]);

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub add_estimated_output_tokens: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_estimated_output_tokens: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_cross_replica_state: Option<bool>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters
        .output_ratio
        .is_some_and(|r| !(r >= 0.0 && r.is_finite()))
    {
        return Err("outputRatio must be a non-negative number".into());
    }
    if parameters
        .max_estimated_output_tokens
        .is_some_and(|m| m < 0)
    {
        return Err("maxEstimatedOutputTokens must not be negative".into());
    }
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn its_parameters_are_checked() {
        let given: Value =
            serde_yaml::from_str("{addEstimatedOutputTokens: true, outputRatio: 1.5}").unwrap();
        assert!(matches!(build(&given), Ok(Plugin::BuiltIn(_))));
        let bad: Value = serde_yaml::from_str("{outputRatio: -1}").unwrap();
        assert!(build(&bad).unwrap_err().contains("outputRatio"));
        let bad: Value = serde_yaml::from_str("{maxEstimatedOutputTokens: -1}").unwrap();
        assert!(build(&bad)
            .unwrap_err()
            .contains("maxEstimatedOutputTokens"));
    }
}
