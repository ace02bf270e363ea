//! `disagg-headers-handler` (older name `prefill-header-handler`): in llm-d this plugin writes
//! `x-prefiller-host-port` after a P/D pick. The filter always does that itself (and removes a
//! client's own value), so the plugin only has to load.

use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "disagg-headers-handler";
pub const LEGACY_TYPE: &str = "prefill-header-handler";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .with_aliases(&[LEGACY_TYPE])
    .ignoring(&[Ignored::parameter(
        "prefillProfile",
        "the prefill header names the profile handler's prefill pick",
    )]);

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Parameters {
    /// Accepted for llm-d configs: the prefill profile is the profile handler's.
    #[serde(default)]
    pub prefill_profile: Option<String>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: Parameters = super::parameters(parameters)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}
