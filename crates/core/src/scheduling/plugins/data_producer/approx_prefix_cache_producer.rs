//! `approx-prefix-cache-producer` (llm-d-router): the approximate prefix index that feeds
//! `prefix-cache-scorer` and the *prefix* plugins. In the filter a prefix index is a
//! `prefix-cache-scorer`: the loader gives the scorer that names this producer its parameters,
//! or makes the producer an index of its own when no scorer reads it (see
//! `config::prefix_indexes`). Here its parameters are checked.

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "approx-prefix-cache-producer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .producing(&[Data::PrefixMatches]);

/// llm-d-router's defaults. Blocks below 64 tokens are raised to 64 when a request is hashed.
pub const DEFAULT_BLOCK_SIZE_TOKENS: u64 = 16;
pub const MIN_BLOCK_SIZE_TOKENS: u64 = 64;
/// Bounds the match in tokens; 0 falls back to `maxPrefixBlocksToMatch`.
pub const DEFAULT_MAX_PREFIX_TOKENS_TO_MATCH: u64 = 131_072;
pub const DEFAULT_MAX_PREFIX_BLOCKS_TO_MATCH: u64 = 2048;
pub const DEFAULT_LRU_CAPACITY_PER_SERVER: u64 = 31_250;

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
