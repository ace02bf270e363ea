//! `request-cost-scorer` (ours): the request-cost model. It predicts how full each endpoint's
//! KV cache will be once this request runs there, counting work the metrics cannot show yet,
//! and prefers the endpoint with the most headroom.
//!
//! Per candidate `e`, in tokens:
//! - capacity `C = kv_tokens(e) * capacity_label(e)` (`kv_tokens` from `vllm:cache_config_info`,
//!   else `defaultCapacityTokens`; the label weighs heterogeneous pods, default 1);
//! - load `L = kv_usage * kv_tokens + waiting * queuedRequestTokens + placed since last scrape`
//!   (what the filter routed there after the metrics were taken is assumed to be running);
//! - request `R = (prompt tokens - tokens cached on e) + output tokens` (`max_tokens`, else
//!   `defaultOutputTokens`);
//! - predicted utilisation `u = (L + R) / C`, score `1 / (1 + u)`: 1 when idle, 0.5 when the
//!   request would just fill the pod, and still ordered past that, where clamping would make
//!   every overloaded pod tie.

use crate::endpoint::EndpointState;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec, Signal};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "request-cost-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[
        Data::PrefixMatches,
        Data::Metric(Signal::KvCacheUsage),
        Data::Metric(Signal::WaitingQueue),
        Data::Metric(Signal::CacheConfig),
        Data::InFlight,
        Data::EndpointLabels,
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub default_output_tokens: u32,
    pub default_capacity_tokens: u64,
    pub queued_request_tokens: u64,
    pub capacity_label: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            default_output_tokens: crate::request::DEFAULT_OUTPUT_TOKENS,
            default_capacity_tokens: 65_536,
            queued_request_tokens: 1024,
            capacity_label: "inference-picker.io/capacity".into(),
        }
    }
}

pub struct RequestCostScorer {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.default_capacity_tokens == 0 {
        return Err("defaultCapacityTokens must be at least 1".into());
    }
    Ok(Plugin::Scorer(Box::new(RequestCostScorer { parameters })))
}

impl RequestCostScorer {
    fn kv_tokens(&self, endpoint: &EndpointState) -> f64 {
        endpoint
            .metrics
            .cache_config
            .map(|c| c.num_gpu_blocks.saturating_mul(u64::from(c.block_size)))
            .filter(|&tokens| tokens > 0)
            .unwrap_or(self.parameters.default_capacity_tokens) as f64
    }

    fn capacity_factor(&self, endpoint: &EndpointState) -> f64 {
        endpoint
            .label(&self.parameters.capacity_label)
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f > 0.0)
            .unwrap_or(1.0)
    }

    /// Predicted utilisation of `endpoint` once the request runs there; infinite (the worst)
    /// when its KV usage or queue is unknown.
    pub fn predicted_utilisation(&self, ctx: &SchedulingContext<'_>, index: usize) -> f64 {
        let Some(endpoint) = ctx.pool.get(index) else {
            return f64::INFINITY;
        };
        let (Some(kv_usage), Some(waiting)) =
            (endpoint.metrics.kv_usage(), endpoint.metrics.waiting())
        else {
            return f64::INFINITY;
        };
        let kv_tokens = self.kv_tokens(endpoint);
        let load = kv_usage * kv_tokens
            + waiting * self.parameters.queued_request_tokens as f64
            + endpoint.placed_tokens_since_scrape as f64;
        let request = ctx.request;
        let uncached = ctx.cycle.uncached_prompt_tokens(request, index);
        let output = request
            .max_tokens
            .unwrap_or(self.parameters.default_output_tokens);
        let cost = f64::from(uncached) + f64::from(output);
        (load + cost) / (kv_tokens * self.capacity_factor(endpoint))
    }
}

impl Scorer for RequestCostScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        for (score, &i) in scores.iter_mut().zip(candidates) {
            let utilisation = self.predicted_utilisation(ctx, i);
            *score = if utilisation.is_nan() {
                0.0
            } else {
                1.0 / (1.0 + utilisation)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::metrics::{CacheConfig, EndpointMetrics};
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::pool_with;
    use crate::scheduling::test_support::prefix_cycle;

    fn metrics(kv: f64, waiting: f64) -> EndpointMetrics {
        EndpointMetrics {
            kv_cache_usage: Some(kv),
            waiting_queue: Some(waiting),
            cache_config: Some(CacheConfig {
                block_size: 16,
                num_gpu_blocks: 1000,
            }),
            ..EndpointMetrics::default()
        }
    }

    #[test]
    fn hand_computed_utilisation() {
        // C = 16,000 tokens on both; pod 1 is labelled twice as capable.
        let mut pool = pool_with(vec![
            metrics(0.25, 1.0),
            metrics(0.25, 1.0),
            metrics(0.0, 0.0),
        ]);
        pool.endpoints[1]
            .labels
            .insert("inference-picker.io/capacity".into(), "2".into());
        pool.endpoints[2].placed_tokens_since_scrape = 12_000;
        let request = InferenceRequest {
            prompt_tokens: 1000,
            max_tokens: Some(200),
            ..InferenceRequest::default()
        };
        // Pod 0 holds 640 of the prompt's tokens (10 blocks of 64).
        let cycle = prefix_cycle(vec![10, 0, 0], 15, 64);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let scorer = RequestCostScorer {
            parameters: Parameters::default(),
        };
        // L = 0.25 * 16000 + 1 * 1024 = 5024; R0 = 360 + 200 = 560; u0 = 5584 / 16000.
        let u0 = scorer.predicted_utilisation(&ctx, 0);
        assert!((u0 - 0.349).abs() < 1e-9, "{u0}");
        // R1 = 1200; u1 = 6224 / 32000.
        let u1 = scorer.predicted_utilisation(&ctx, 1);
        assert!((u1 - 0.1945).abs() < 1e-9, "{u1}");
        // Placed but not yet scraped work counts: u2 = (12000 + 1200) / 16000.
        let u2 = scorer.predicted_utilisation(&ctx, 2);
        assert!((u2 - 0.825).abs() < 1e-9, "{u2}");
        let mut scorer = scorer;
        let mut scores = [0.0; 3];
        scorer.score(&ctx, &[0, 1, 2], &mut scores);
        assert!((scores[0] - 1.0 / 1.349).abs() < 1e-9);
        assert!(scores[1] > scores[0] && scores[0] > scores[2], "{scores:?}");
    }

    #[test]
    fn unknown_usage_or_queue_is_the_worst_cost() {
        let mut unknown_kv = metrics(0.0, 0.0);
        unknown_kv.kv_cache_usage = None;
        let mut unknown_queue = metrics(0.0, 0.0);
        unknown_queue.waiting_queue = Some(f64::INFINITY);
        let pool = pool_with(vec![metrics(0.9, 50.0), unknown_kv, unknown_queue]);
        let request = InferenceRequest::empty();
        let mut scores = [1.0; 3];
        RequestCostScorer {
            parameters: Parameters::default(),
        }
        .score(
            &SchedulingContext::new(&request, &pool),
            &[0, 1, 2],
            &mut scores,
        );
        assert!(scores[0] > 0.0, "{scores:?}");
        assert_eq!(&scores[1..], [0.0, 0.0]);
    }

    #[test]
    fn defaults_without_cache_config() {
        let pool = pool_with(vec![EndpointMetrics::idle()]);
        let request = InferenceRequest {
            prompt_tokens: 100,
            ..InferenceRequest::default()
        };
        let scorer = RequestCostScorer {
            parameters: Parameters::default(),
        };
        let u = scorer.predicted_utilisation(&SchedulingContext::new(&request, &pool), 0);
        assert_eq!(u, (100.0 + 256.0) / 65_536.0);
    }
}
