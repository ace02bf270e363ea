//! `kv-cache-utilization-scorer`: `1 - kv`, preferring endpoints with free KV cache.

use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec, Signal};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "kv-cache-utilization-scorer";
/// The name older GIE configs use.
pub const LEGACY_TYPE: &str = "kv-cache-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<NoParameters>)
    .with_aliases(&[LEGACY_TYPE])
    .consuming(&[Data::Metric(Signal::KvCacheUsage), Data::InFlight]);

pub struct KvCacheUtilizationScorer;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Scorer(Box::new(KvCacheUtilizationScorer)))
}

impl Scorer for KvCacheUtilizationScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        for (score, &i) in scores.iter_mut().zip(candidates) {
            // Unknown usage counts as a full cache.
            *score = 1.0 - ctx.pool.kv_usage(i).unwrap_or(1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::metrics::EndpointMetrics;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::pool_with;

    #[test]
    fn free_cache_scores_higher() {
        let kv = |k| EndpointMetrics {
            kv_cache_usage: k,
            ..EndpointMetrics::idle()
        };
        let pool = pool_with(vec![kv(Some(0.25)), kv(Some(0.0)), kv(Some(1.0)), kv(None)]);
        let request = InferenceRequest::empty();
        let ctx = SchedulingContext::new(&request, &pool);
        let mut scores = [0.0; 4];
        KvCacheUtilizationScorer.score(&ctx, &[0, 1, 2, 3], &mut scores);
        assert_eq!(scores, [0.75, 1.0, 0.0, 0.0], "unknown is a full cache");
    }
}
