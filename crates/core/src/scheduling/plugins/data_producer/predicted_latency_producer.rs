//! `predicted-latency-producer` (llm-d-router): each endpoint's predicted TTFT and TPOT for
//! the request, and their headroom to the request's SLOs (`x-llm-d-slo-ttft-ms`,
//! `x-llm-d-slo-tpot-ms`), for `latency-scorer`, `slo-headroom-tier-filter`,
//! `latency-slo-admitter` and the affinity filter's `ttftSource: latencyPredictor`.
//!
//! llm-d trains an XGBoost model in a sidecar from samples the EPP posts, and asks a second
//! sidecar for every request. Here nothing leaves Envoy: each pod's TTFT and TPOT are learned
//! from vLLM's own latency histograms on the scrapes the filter makes anyway (see
//! [`crate::latency`]), and a prediction is arithmetic on the pod's live queue, batch and
//! uncached prompt tokens.
//!
//! Without `streamingMode`, TPOT does not count (its headroom is 0), as in llm-d. A request
//! without an SLO has a negative headroom everywhere, so the scorer ranks pods by predicted
//! latency alone.

use crate::endpoint::Pool;
use crate::latency::SharedSlopes;
use crate::protocol::{SLO_TPOT_HEADER, SLO_TTFT_HEADER};
use crate::request::InferenceRequest;
use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec, Signal};
use crate::scheduling::{CycleState, Plugin, Prediction, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "predicted-latency-producer";

const NOT_NEEDED: &str = "the filter learns each pod's latency from vLLM's histograms, with no sidecar, sampling or context to keep";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<Parameters>)
    .consuming(&[
        Data::PrefixMatches,
        Data::InFlight,
        Data::Metric(Signal::WaitingQueue),
        Data::Metric(Signal::RunningRequests),
        Data::RequestHeader(SLO_TTFT_HEADER),
        Data::RequestHeader(SLO_TPOT_HEADER),
    ])
    .producing(&[Data::LatencyPredictions])
    .ignoring(&[
        Ignored::parameter("contextTTL", NOT_NEEDED),
        Ignored::parameter("samplingMean", NOT_NEEDED),
        Ignored::parameter("maxDecodeTokenSamplesForPrediction", NOT_NEEDED),
        Ignored::parameter(
            "endpointRoleLabel",
            "every pod is predicted alike, whatever its role",
        ),
        Ignored::parameter(
            "useEncoderCacheFeatures",
            "multimodal encoder caches are not modelled",
        ),
        Ignored::PREFIX_PRODUCER,
        Ignored::producer("inFlightLoadProducerName", "inflight-load-producer"),
        Ignored::producer(
            "encoderCacheMatchInfoProducerName",
            "mm-embeddings-cache-producer",
        ),
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// The TPOT SLO is multiplied by this before the headroom is taken.
    pub slo_buffer_factor: f64,
    /// Responses stream: TPOT is predicted and counts.
    pub streaming_mode: bool,
    /// false: llm-d's training-only mode, which predicts nothing.
    pub predict_in_produce: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_ttl: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub endpoint_role_label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_encoder_cache_features: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_decode_token_samples_for_prediction: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub in_flight_load_producer_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub encoder_cache_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            slo_buffer_factor: 1.0,
            streaming_mode: false,
            predict_in_produce: true,
            context_ttl: None,
            endpoint_role_label: String::new(),
            use_encoder_cache_features: None,
            sampling_mean: None,
            max_decode_token_samples_for_prediction: None,
            prefix_match_info_producer_name: String::new(),
            in_flight_load_producer_name: String::new(),
            encoder_cache_match_info_producer_name: String::new(),
        }
    }
}

pub struct PredictedLatencyProducer {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let factor = parameters.slo_buffer_factor;
    if !(factor > 0.0 && factor.is_finite()) {
        return Err(format!("sloBufferFactor {factor} must be above 0"));
    }
    Ok(Plugin::Scorer(Box::new(PredictedLatencyProducer {
        parameters,
    })))
}

impl PredictedLatencyProducer {
    fn predict_at(
        &self,
        request: &InferenceRequest,
        pool: &Pool,
        cycle: &CycleState,
        (index, shared): (usize, SharedSlopes),
    ) -> Option<Prediction> {
        let endpoint = pool.get(index).filter(|e| e.routable(pool.now_ms()))?;
        let (waiting, running) = (pool.waiting(index)?, pool.running(index)?);
        let uncached = f64::from(cycle.uncached_prompt_tokens(request, index));
        let ttft_ms =
            endpoint
                .latency
                .ttft_s(&endpoint.pace, (waiting, running), uncached, shared)?
                * 1000.0;
        let tpot_ms = endpoint.latency.tpot_s(running + 1.0).map(|s| s * 1000.0);
        let slo = |ms: Option<f64>| ms.filter(|v| v.is_finite() && *v > 0.0).unwrap_or(0.0);
        let tpot_headroom_ms = match tpot_ms {
            Some(tpot) if self.parameters.streaming_mode => {
                slo(request.headers.slo_tpot_ms) * self.parameters.slo_buffer_factor - tpot
            }
            _ => 0.0,
        };
        Some(Prediction {
            ttft_ms,
            tpot_ms: tpot_ms.unwrap_or(0.0),
            ttft_headroom_ms: slo(request.headers.slo_ttft_ms) - ttft_ms,
            tpot_headroom_ms,
            idle: endpoint.total_in_flight() == 0,
        })
    }
}

impl Scorer for PredictedLatencyProducer {
    fn predict(&mut self, request: &InferenceRequest, pool: &Pool, cycle: &mut CycleState) {
        if !self.parameters.predict_in_produce {
            cycle.latency = None;
            return;
        }
        let mut predictions = cycle.latency.take().unwrap_or_default();
        predictions.endpoints.clear();
        // Pods share hardware and engine: how TTFT grows with the load is learned over all
        // of them, for a pod whose own load varied too little to tell.
        let shared = SharedSlopes::of(pool.endpoints.iter().map(|e| &e.latency));
        for index in 0..pool.len() {
            let prediction = self.predict_at(request, pool, cycle, (index, shared));
            predictions.endpoints.push(prediction);
        }
        cycle.latency = Some(predictions);
    }

    /// A producer, in no profile's scores.
    fn score(&mut self, _ctx: &SchedulingContext<'_>, _candidates: &[usize], _scores: &mut [f64]) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::latency::LatencyTotals;
    use crate::metrics::EndpointMetrics;
    use crate::pace::WorkTotals;
    use crate::scheduling::test_support::pool_with;

    /// Two pods that served the same traffic; pod 1 now has a queue.
    fn learned_pool() -> Pool {
        let metrics = |waiting: f64| EndpointMetrics {
            waiting_queue: Some(waiting),
            running_requests: Some(2.0),
            kv_cache_usage: Some(0.3),
            ..EndpointMetrics::default()
        };
        let mut pool = pool_with(vec![metrics(0.0), metrics(0.0)]);
        for index in 0..2 {
            for (at, done) in [(0u64, 0.0), (1000, 2.0), (2000, 4.0)] {
                let mut page = metrics(0.0);
                page.work = Some(WorkTotals {
                    finished: done,
                    prefill_seconds: done * 0.01,
                    computed_prompt_tokens: done * 100.0,
                });
                page.latency = Some(LatencyTotals {
                    ttft_seconds: done * 0.03,
                    first_tokens: done,
                    inter_token_seconds: done * 0.5,
                    inter_tokens: done * 50.0,
                });
                pool.record_scrape_ok(index, at, page);
            }
        }
        let mut queued = metrics(4.0);
        queued.work = pool.get(1).and_then(|e| e.metrics.work);
        queued.latency = pool.get(1).and_then(|e| e.metrics.latency);
        pool.record_scrape_ok(1, 2000, queued);
        pool
    }

    #[test]
    fn a_queue_raises_the_predicted_ttft_and_an_slo_sets_the_headroom() {
        let pool = learned_pool();
        let Ok(Plugin::Scorer(mut producer)) =
            build(&serde_yaml::from_str("{streamingMode: true}").unwrap())
        else {
            panic!("not a producer");
        };
        let mut request = InferenceRequest::empty();
        request.prompt_tokens = 100;
        request.headers.slo_ttft_ms = Some(500.0);
        request.headers.slo_tpot_ms = Some(50.0);
        let mut cycle = CycleState::default();
        producer.predict(&request, &pool, &mut cycle);
        let predictions = cycle.latency.expect("predictions");
        let (idle, queued) = (predictions.get(0).unwrap(), predictions.get(1).unwrap());
        assert!(
            queued.ttft_ms > idle.ttft_ms + 1000.0,
            "{idle:?} {queued:?}"
        );
        assert!(idle.meets_slos(), "{idle:?}");
        assert!(!queued.meets_slos(), "{queued:?}");
        assert!((idle.tpot_ms - 10.0).abs() < 1.0, "{idle:?}");
    }

    #[test]
    fn without_an_slo_every_headroom_is_negative_and_training_only_predicts_nothing() {
        let pool = learned_pool();
        let Ok(Plugin::Scorer(mut producer)) = build(&Value::Null) else {
            panic!("not a producer");
        };
        let mut cycle = CycleState::default();
        producer.predict(&InferenceRequest::empty(), &pool, &mut cycle);
        let predictions = cycle.latency.expect("predictions");
        assert!(predictions
            .endpoints
            .iter()
            .flatten()
            .all(|p| !p.positive()));
        assert!(
            predictions
                .endpoints
                .iter()
                .flatten()
                .all(|p| p.tpot_headroom_ms == 0.0),
            "TPOT does not count without streamingMode"
        );
        let Ok(Plugin::Scorer(mut off)) =
            build(&serde_yaml::from_str("{predictInProduce: false}").unwrap())
        else {
            panic!("not a producer");
        };
        let mut cycle = CycleState::default();
        off.predict(&InferenceRequest::empty(), &pool, &mut cycle);
        assert_eq!(cycle.latency, None);
        assert!(build(&serde_yaml::from_str("{sloBufferFactor: 0}").unwrap()).is_err());
    }
}
