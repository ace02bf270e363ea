//! `prefix-based-pd-decider`: disaggregates when the decode endpoint would have to prefill at
//! least `nonCachedTokens` prompt tokens it does not hold (prompt tokens minus its prefix-cache
//! match). `nonCachedTokens: 0` (the default) never disaggregates. llm-d-router's
//! `promptTokens` also keeps prompts shorter than that on the decode pod.

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{PdDecider, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "prefix-based-pd-decider";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::PdDecider, build, effective::<Parameters>)
    .consuming(&[Data::PrefixMatches])
    .ignoring(&[
        Ignored::PREFIX_PLUGIN_NAME,
        Ignored::PREFIX_PLUGIN_TYPE,
        Ignored::PREFIX_PRODUCER,
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub non_cached_tokens: u32,
    /// Accepted for llm-d configs; the matches come from `prefix-cache-scorer`.
    pub prefix_plugin_name: String,
    /// Shortest prompt (estimated tokens) ever disaggregated; 0 = no such gate.
    pub prompt_tokens: u32,
    /// Accepted for llm-d configs, like `prefixPluginName`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_plugin_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            non_cached_tokens: 0,
            prefix_plugin_name: crate::scheduling::plugins::scorer::prefix_cache_scorer::TYPE
                .into(),
            prompt_tokens: 0,
            prefix_plugin_type: String::new(),
            prefix_match_info_producer_name: String::new(),
        }
    }
}

pub struct PrefixBasedPdDecider {
    pub non_cached_tokens: u32,
    pub prompt_tokens: u32,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    Ok(Plugin::PdDecider(Box::new(PrefixBasedPdDecider {
        non_cached_tokens: parameters.non_cached_tokens,
        prompt_tokens: parameters.prompt_tokens,
    })))
}

impl PdDecider for PrefixBasedPdDecider {
    fn disaggregate(&self, ctx: &SchedulingContext<'_>, decode_endpoint: usize) -> bool {
        if self.non_cached_tokens == 0 || ctx.request.prompt_tokens < self.prompt_tokens {
            return false;
        }
        ctx.cycle
            .uncached_prompt_tokens(ctx.request, decode_endpoint)
            >= self.non_cached_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::prefix_cycle;
    use crate::scheduling::test_support::queues;

    #[test]
    fn threshold_on_uncached_tokens() {
        let pool = queues(&[0.0, 0.0]);
        let request = InferenceRequest {
            prompt_tokens: 100,
            ..InferenceRequest::default()
        };
        // Endpoint 1 holds 64 of the 100 tokens.
        let cycle = prefix_cycle(vec![0, 4], 6, 16);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let decider = PrefixBasedPdDecider {
            non_cached_tokens: 50,
            prompt_tokens: 0,
        };
        assert!(decider.disaggregate(&ctx, 0), "100 uncached >= 50");
        assert!(!decider.disaggregate(&ctx, 1), "36 uncached < 50");
        let off = PrefixBasedPdDecider {
            non_cached_tokens: 0,
            prompt_tokens: 0,
        };
        assert!(!off.disaggregate(&ctx, 0));
        let long_prompts_only = PrefixBasedPdDecider {
            non_cached_tokens: 50,
            prompt_tokens: 101,
        };
        assert!(
            !long_prompts_only.disaggregate(&ctx, 0),
            "a 100-token prompt is under promptTokens"
        );
        let value: Value = serde_yaml::from_str(
            "{nonCachedTokens: 16, promptTokens: 256, prefixMatchInfoProducerName: approx-prefix-cache-producer}",
        )
        .unwrap();
        assert!(build(&value).is_ok());
    }
}
