//! `pd-profile-handler`: the older llm-d P/D handler. Same flow as `disagg-profile-handler`
//! with its decision built in: disaggregate when the decode endpoint would have to prefill at
//! least `threshold` uncached prompt tokens; `threshold: 0` always disaggregates.

use super::disagg_profile_handler::{Decision, DisaggProfileHandler};
use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{PdDecider, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "pd-profile-handler";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::ProfileHandler, build, effective::<Parameters>)
        .consuming(&[Data::PrefixMatches])
        .ignoring(&[
            Ignored::parameter(
                "hashBlockSize",
                "prefix matches come from the prefix index and its own block size",
            ),
            Ignored::PREFIX_PLUGIN_NAME,
            Ignored::PREFIX_PLUGIN_TYPE,
            Ignored::parameter(
                "primaryPort",
                "the destination is the picked endpoint's own address and port",
            ),
            Ignored::PREFIX_PRODUCER,
        ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub threshold: u32,
    /// Accepted for llm-d configs; the prefix matches come from `prefix-cache-scorer`.
    pub hash_block_size: Option<usize>,
    pub prefix_plugin_name: Option<String>,
    pub decode_profile: String,
    pub prefill_profile: String,
    /// Accepted for llm-d configs: the decode pod's port is part of its pool address.
    pub primary_port: Option<u16>,
    /// llm-d-router's decider plugin: when set it decides instead of `threshold`, as with
    /// `disagg-profile-handler`'s `deciders.prefill`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub decider_plugin_name: String,
    /// Accepted for llm-d configs, like `prefixPluginName`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_plugin_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            threshold: 0,
            hash_block_size: None,
            prefix_plugin_name: None,
            decode_profile: "decode".into(),
            prefill_profile: "prefill".into(),
            primary_port: None,
            decider_plugin_name: String::new(),
            prefix_plugin_type: String::new(),
            prefix_match_info_producer_name: String::new(),
        }
    }
}

struct UncachedThreshold(u32);

impl PdDecider for UncachedThreshold {
    fn disaggregate(&self, ctx: &SchedulingContext<'_>, decode_endpoint: usize) -> bool {
        ctx.cycle
            .uncached_prompt_tokens(ctx.request, decode_endpoint)
            >= self.0
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let decision = if parameters.decider_plugin_name.is_empty() {
        Decision::BuiltIn(Box::new(UncachedThreshold(parameters.threshold)))
    } else {
        Decision::Plugin {
            name: parameters.decider_plugin_name,
            index: usize::MAX,
        }
    };
    Ok(Plugin::ProfileHandler(Box::new(DisaggProfileHandler::new(
        parameters.decode_profile,
        parameters.prefill_profile,
        decision,
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Pool;
    use crate::harness::test;
    use crate::request::InferenceRequest;

    #[test]
    fn threshold_on_uncached_prompt_tokens() {
        let pool = Pool::default();
        let short = InferenceRequest {
            prompt_tokens: 5,
            ..InferenceRequest::default()
        };
        let ctx = SchedulingContext::new(&short, &pool);
        assert!(!UncachedThreshold(10).disaggregate(&ctx, 0));
        assert!(UncachedThreshold(5).disaggregate(&ctx, 0));
        assert!(UncachedThreshold(0).disaggregate(&ctx, 0));
        let value: Value = serde_yaml::from_str("{threshold: 10, hashBlockSize: 16}").unwrap();
        assert!(build(&value).is_ok());
    }
}
