//! `approx-prefix-cache-producer` (llm-d-router): the approximate prefix index that feeds
//! `prefix-cache-scorer` and the *prefix* plugins. In the filter `prefix-cache-scorer` keeps
//! that index itself, so this producer only has to load; its parameters are checked and named
//! in the warning, since they are not applied.

use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "approx-prefix-cache-producer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .done_by("prefix-cache-scorer keeps the prefix index itself; set blockSizeTokens, maxPrefixBlocksToMatch, lruCapacityPerServer and autoTune on prefix-cache-scorer (this producer's values are not applied)");

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_tune: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size_tokens: Option<u64>,
    /// The older block size in characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prefix_blocks_to_match: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_prefix_tokens_to_match: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lru_capacity_per_server: Option<u64>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: Parameters = super::parameters(parameters)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn its_parameters_are_checked() {
        let given: Value =
            serde_yaml::from_str("{maxPrefixTokensToMatch: 16384, lruCapacityPerServer: 31250}")
                .unwrap();
        assert!(matches!(build(&given), Ok(Plugin::BuiltIn(_))));
        let typo: Value = serde_yaml::from_str("{maxPrefixTokenToMatch: 1}").unwrap();
        assert!(build(&typo).unwrap_err().contains("maxPrefixTokenToMatch"));
        let negative: Value = serde_yaml::from_str("{blockSizeTokens: -4}").unwrap();
        assert!(build(&negative).is_err());
    }
}
