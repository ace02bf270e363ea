//! The document's shape as written: `EndpointPickerConfig` keys, deserialized as they are.

use super::pool::PoolConfig;
use serde::Deserialize;
use serde_yaml::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawConfig {
    pub(super) api_version: Option<String>,
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) feature_gates: Vec<String>,
    #[serde(default)]
    pub(super) plugins: Vec<RawPlugin>,
    #[serde(default)]
    pub(super) scheduling_profiles: Vec<RawProfile>,
    pub(super) saturation_detector: Option<RawRef>,
    #[serde(alias = "data")]
    pub(super) data_layer: Option<RawDataLayer>,
    pub(super) pool: Option<PoolConfig>,
    pub(super) flow_control: Option<crate::config::flow_control::RawFlowControl>,
    /// llm-d-router's parser list; `parser` is its older single-parser form.
    pub(super) request_handler: Option<RawRequestHandler>,
    pub(super) parser: Option<RawRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequestHandler {
    #[serde(default)]
    pub(super) parsers: Vec<RawRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPlugin {
    pub(super) name: Option<String>,
    #[serde(rename = "type")]
    pub(super) type_name: String,
    #[serde(default)]
    pub(super) parameters: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub(super) name: String,
    #[serde(default)]
    pub(super) plugins: Vec<RawProfilePlugin>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawProfilePlugin {
    pub(super) plugin_ref: String,
    pub(super) weight: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawRef {
    pub(super) plugin_ref: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawDataLayer {
    #[serde(default)]
    pub(super) sources: Vec<RawSource>,
    /// llm-d injects a metrics source and the core extractor unless this is false; the
    /// filter's scrape reads the core metrics either way, so the value changes nothing.
    #[serde(rename = "injectDefaults")]
    pub(super) _inject_defaults: Option<bool>,
    /// llm-d's endpoint discovery plugin; here endpoints come from `pool`.
    pub(super) discovery: Option<RawRef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawSource {
    pub(super) plugin_ref: String,
    #[serde(default)]
    pub(super) extractors: Vec<RawRef>,
}
