//! `no-hit-lru-scorer`: when no candidate holds any of the prompt's prefix blocks (a cold
//! request), prefers the endpoints that took a cold request least recently, so new prefixes
//! spread over the pool instead of piling on one pod. Requests with a hit score 0.5 everywhere
//! and leave the choice to the other scorers.
//!
//! Cold scores are by recency rank: never used or oldest 1.0, most recent 0.0, linear between;
//! endpoints used equally recently score alike.

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "no-hit-lru-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::PrefixMatches])
    .ignoring(&[
        Ignored::PREFIX_PLUGIN_NAME,
        Ignored::PREFIX_PLUGIN_TYPE,
        Ignored::parameter(
            "lruSize",
            "the endpoints served are ordered by their last cold request, with no size bound beyond the pool",
        ),
        Ignored::PREFIX_PRODUCER,
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// Accepted for llm-d configs; the prefix matches come from `prefix-cache-scorer`.
    pub prefix_plugin_name: String,
    /// Accepted for llm-d configs; recency is kept per endpoint, so no size is needed.
    pub lru_size: usize,
    /// Accepted for llm-d configs, as `prefixPluginName`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_plugin_type: String,
    /// llm-d-router's producer instance to read from; accepted, since the filter keeps one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            prefix_plugin_name: super::prefix_cache_scorer::TYPE.into(),
            lru_size: 1024,
            prefix_plugin_type: String::new(),
            prefix_match_info_producer_name: String::new(),
        }
    }
}

const NEUTRAL: f64 = 0.5;

#[derive(Default)]
pub struct NoHitLruScorer {
    /// Per pool index: the clock value of its last cold pick (0 = never).
    last_cold_pick: Vec<u64>,
    clock: u64,
    order: Vec<(u64, usize)>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: Parameters = super::parameters(parameters)?;
    Ok(Plugin::Scorer(Box::new(NoHitLruScorer::default())))
}

fn is_cold(ctx: &SchedulingContext<'_>) -> bool {
    ctx.cycle
        .prefix
        .as_ref()
        .is_none_or(|p| p.matched_blocks.iter().all(|&m| m == 0))
}

impl Scorer for NoHitLruScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        if !is_cold(ctx) {
            scores.iter_mut().for_each(|s| *s = NEUTRAL);
            return;
        }
        self.order.clear();
        self.order.extend(
            candidates
                .iter()
                .enumerate()
                .map(|(slot, &i)| (self.last_cold_pick.get(i).copied().unwrap_or(0), slot)),
        );
        self.order.sort_unstable();
        // Candidates used equally recently (e.g. never) score alike: ranking them by position
        // would send every worker's cold requests to the same first pod.
        let last_rank = (self.order.len().max(2) - 1) as f64;
        let mut older = 0;
        let mut previous = None;
        for (position, &(stamp, slot)) in self.order.iter().enumerate() {
            if previous != Some(stamp) {
                older = position;
                previous = Some(stamp);
            }
            if let Some(score) = scores.get_mut(slot) {
                *score = 1.0 - older as f64 / last_rank;
            }
        }
    }

    fn on_picked(&mut self, ctx: &SchedulingContext<'_>, endpoint: usize) {
        if !is_cold(ctx) {
            return;
        }
        if self.last_cold_pick.len() <= endpoint {
            self.last_cold_pick.resize(endpoint + 1, 0);
        }
        self.clock += 1;
        if let Some(stamp) = self.last_cold_pick.get_mut(endpoint) {
            *stamp = self.clock;
        }
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
    fn cold_requests_rotate_through_the_least_recently_used() {
        let pool = queues(&[0.0, 0.0, 0.0]);
        let request = InferenceRequest::empty();
        let ctx = SchedulingContext::new(&request, &pool);
        let mut scorer = NoHitLruScorer::default();
        let mut scores = [0.0; 3];
        scorer.on_picked(&ctx, 1);
        scorer.on_picked(&ctx, 0);
        scorer.score(&ctx, &[0, 1, 2], &mut scores);
        // 2 never used (1.0), then 1 (0.5), then 0 most recent (0.0).
        assert_eq!(scores, [0.0, 0.5, 1.0]);
        let mut fresh = NoHitLruScorer::default();
        fresh.score(&ctx, &[0, 1, 2], &mut scores);
        assert_eq!(scores, [1.0, 1.0, 1.0], "never used: all alike");
        fresh.on_picked(&ctx, 2);
        fresh.score(&ctx, &[0, 1, 2], &mut scores);
        assert_eq!(scores, [1.0, 1.0, 0.0]);
    }

    #[test]
    fn a_hit_anywhere_makes_it_neutral() {
        let pool = queues(&[0.0, 0.0]);
        let request = InferenceRequest::empty();
        let cycle = prefix_cycle(vec![0, 3], 4, 16);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let mut scorer = NoHitLruScorer::default();
        let mut scores = [0.0; 2];
        scorer.score(&ctx, &[0, 1], &mut scores);
        assert_eq!(scores, [NEUTRAL, NEUTRAL]);
        scorer.on_picked(&ctx, 0);
        assert!(
            scorer.last_cold_pick.is_empty(),
            "warm picks are not recorded"
        );
    }
}
