//! `core-metrics-extractor` (llm-d-router): reads the engine's queue, running, KV-cache, LoRA
//! and cache-config series from each scrape. The filter's scrape does exactly that itself, by
//! the engine's own metric names (`metrics.rs`), so this plugin only has to load. Remapping
//! those names is not possible here, so `engineConfigs` is refused; extra series are what
//! `prometheus-metric` is for.

use crate::endpoint::ENGINE_TYPE_LABEL;
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "core-metrics-extractor";

/// `defaultEngine` values: the engine a pod without the engine label is read as ("" is vLLM).
const ENGINES: [&str; 5] = ["", "vllm", "sglang", "trtllm-serve", "trtllm"];

/// The `defaultEngine` of a `core-metrics-extractor`'s parameters, when one is set.
pub fn default_engine(parameters: &Value) -> Option<String> {
    let parameters: Parameters = super::parameters(parameters).ok()?;
    (!parameters.default_engine.is_empty()).then_some(parameters.default_engine)
}

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .done_by("the filter's scrape reads each engine's queue, running, KV-cache, LoRA and cache-config series itself (vLLM, SGLang and TensorRT-LLM names, chosen by the pod's inference.networking.k8s.io/engine-type label)");

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub engine_label_key: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default_engine: String,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub engine_configs: Value,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters.engine_label_key.is_empty() && parameters.engine_label_key != ENGINE_TYPE_LABEL {
        return Err(format!(
            "engineLabelKey {:?}: the filter reads the engine from the {ENGINE_TYPE_LABEL} label only",
            parameters.engine_label_key
        ));
    }
    if !ENGINES.contains(&parameters.default_engine.as_str()) {
        return Err(format!(
            "defaultEngine {:?} must be one of {:?} (the engines whose metric names are built in)",
            parameters.default_engine,
            &ENGINES[1..]
        ));
    }
    if !parameters.engine_configs.is_null() {
        return Err("engineConfigs: the engines' metric names are built in (vLLM, SGLang, TensorRT-LLM); declare other series with prometheus-metric and score them with metric-scorer".into());
    }
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn loads_as_built_in_and_refuses_what_it_cannot_honour() {
        assert!(matches!(build(&Value::Null), Ok(Plugin::BuiltIn(_))));
        let ours: Value = serde_yaml::from_str(&format!(
            "{{engineLabelKey: {ENGINE_TYPE_LABEL}, defaultEngine: vllm}}"
        ))
        .unwrap();
        assert!(build(&ours).is_ok());
        for (given, needle) in [
            ("{engineLabelKey: llm-d.ai/engine-type}", "engineLabelKey"),
            ("{defaultEngine: tgi}", "defaultEngine"),
            ("{engineConfigs: [{name: x}]}", "prometheus-metric"),
        ] {
            let value: Value = serde_yaml::from_str(given).unwrap();
            assert!(build(&value).unwrap_err().contains(needle), "{given}");
        }
    }
}
