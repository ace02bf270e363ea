//! `token-producer` (older `tokenizer`, llm-d-router): the prompt's token ids for the plugins
//! that count tokens. Its default `estimate` backend is what the filter does on its own
//! (characters / 4, token ids counted exactly), so that backend only has to load. The `vllm`
//! backend asks vLLM to render every prompt: the filter makes no call in a request's path, so
//! a config that selects it is refused rather than silently estimated.

use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "token-producer";
/// The name llm-d-router deprecated in v0.9.0.
pub const LEGACY_TYPE: &str = "tokenizer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .with_aliases(&[LEGACY_TYPE])
    .done_by(
        "the filter estimates prompt tokens itself (characters / 4; token ids are counted exactly)",
    )
    .ignoring(&[
        Ignored::parameter(
            "estimate",
            "prompt tokens are estimated from text (characters / 4); image and video estimates are not added",
        ),
    ]);

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// The estimate backend's settings (image and video token estimates): accepted.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub estimate: Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub vllm: Value,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model_name: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub uds_tokenizer_config: Value,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters.vllm.is_null() || !parameters.model_name.is_empty() {
        return Err("its vllm backend (vllm, modelName) calls vLLM's render endpoint for every request, and the filter makes no call in a request's path; remove vllm and modelName to use the estimate backend, which the filter has built in".into());
    }
    if !parameters.uds_tokenizer_config.is_null() {
        return Err("udsTokenizerConfig needs a tokenizer sidecar the filter cannot reach; remove it to use the estimate backend, which the filter has built in".into());
    }
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn the_estimate_backend_loads_and_the_vllm_backend_is_refused() {
        assert!(matches!(build(&Value::Null), Ok(Plugin::BuiltIn(_))));
        let estimate: Value = serde_yaml::from_str("{estimate: {image: {mode: static}}}").unwrap();
        assert!(build(&estimate).is_ok());
        for vllm in [
            "{modelName: m, vllm: {url: 'http://localhost:8000'}}",
            "{modelName: m}",
            "{udsTokenizerConfig: {socketFile: /tmp/t.sock}}",
        ] {
            let given: Value = serde_yaml::from_str(vllm).unwrap();
            let error = build(&given).unwrap_err();
            assert!(error.contains("estimate backend"), "{vllm}: {error}");
        }
    }
}
