//! `token-load-scorer`: `1 - min(1, in-flight tokens / queueThresholdTokens)`. In-flight tokens
//! are those of the requests the filter routed there that have not ended (prompt not already
//! cached plus expected output), so long prompts weigh more than short ones.

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "token-load-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::InFlight])
    .ignoring(&[Ignored::producer(
        "inFlightLoadProducerName",
        "inflight-load-producer",
    )]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub queue_threshold_tokens: u64,
    /// llm-d-router's producer instance to read from; accepted, since the filter keeps one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub in_flight_load_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            queue_threshold_tokens: 4_194_304,
            in_flight_load_producer_name: String::new(),
        }
    }
}

pub struct TokenLoadScorer {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.queue_threshold_tokens == 0 {
        return Err("queueThresholdTokens must be at least 1".into());
    }
    Ok(Plugin::Scorer(Box::new(TokenLoadScorer { parameters })))
}

impl Scorer for TokenLoadScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let threshold = self.parameters.queue_threshold_tokens as f64;
        for (score, &i) in scores.iter_mut().zip(candidates) {
            let tokens = ctx.pool.get(i).map_or(0, |e| e.total_in_flight_tokens()) as f64;
            *score = 1.0 - (tokens / threshold).min(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;

    #[test]
    fn share_of_the_threshold() {
        let mut pool = queues(&[0.0, 0.0, 0.0]);
        for (endpoint, tokens) in pool.endpoints.iter_mut().zip([0, 250, 5000]) {
            endpoint.in_flight_tokens = tokens;
        }
        let request = InferenceRequest::empty();
        let mut scores = [0.0; 3];
        let value: Value = serde_yaml::from_str("{queueThresholdTokens: 1000}").unwrap();
        let mut scorer = TokenLoadScorer {
            parameters: crate::scheduling::plugins::parameters(&value).unwrap(),
        };
        scorer.score(
            &SchedulingContext::new(&request, &pool),
            &[0, 1, 2],
            &mut scores,
        );
        assert_eq!(scores, [1.0, 0.75, 0.0]);
        assert_eq!(Parameters::default().queue_threshold_tokens, 4_194_304);
    }
}
