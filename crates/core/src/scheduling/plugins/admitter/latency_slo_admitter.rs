//! `latency-slo-admitter` (llm-d-router): refuses a sheddable request (priority below 0) that
//! carries a latency SLO when no endpoint is predicted to meet it, none is idle and none is
//! cold (KV cache almost empty). Without predictions it admits everything. llm-d answers the
//! refusal with a 500; here it is the shed answer, 429 with `x-llm-d-request-dropped-reason:
//! rejected-saturated`, since the request is refused for load.

use crate::endpoint::Pool;
use crate::request::InferenceRequest;
use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, CycleState, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "latency-slo-admitter";

/// KV-cache usage below which a pod counts as cold (llm-d's).
const COLD_KV_USAGE: f64 = 0.02;

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Admitter, build, effective::<Parameters>)
    .ignoring(&[Ignored::producer(
        "latencyPredictionInfoProducerName",
        "predicted-latency-producer",
    )]);

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub latency_prediction_info_producer_name: String,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: Parameters = super::super::parameters(parameters)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}

/// Whether the request is scheduled.
pub fn admits(request: &InferenceRequest, pool: &Pool, cycle: &CycleState) -> bool {
    let has_slo = [request.headers.slo_ttft_ms, request.headers.slo_tpot_ms]
        .iter()
        .any(|slo| slo.is_some_and(|ms| ms > 0.0));
    if request.priority >= 0 || !has_slo {
        return true;
    }
    let Some(predictions) = cycle.latency.as_ref().filter(|p| p.any()) else {
        return true;
    };
    let endpoints = predictions.endpoints.iter().enumerate();
    endpoints
        .filter_map(|(i, p)| Some((i, p.as_ref()?)))
        .any(|(i, prediction)| {
            prediction.meets_slos()
                || prediction.idle
                || pool.kv_usage(i).is_some_and(|kv| kv < COLD_KV_USAGE)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::scheduling::test_support::queues;
    use crate::scheduling::{LatencyPredictions, Prediction};

    fn prediction(ttft_headroom_ms: f64, idle: bool) -> Option<Prediction> {
        Some(Prediction {
            ttft_ms: 100.0,
            tpot_ms: 10.0,
            ttft_headroom_ms,
            tpot_headroom_ms: 0.0,
            idle,
        })
    }

    #[test]
    fn refuses_only_a_sheddable_request_no_busy_warm_pod_can_serve_in_time() {
        let mut pool = queues(&[1.0, 1.0]);
        for endpoint in &mut pool.endpoints {
            endpoint.metrics.kv_cache_usage = Some(0.5);
        }
        let cycle = |predictions: Vec<Option<Prediction>>| CycleState {
            latency: Some(LatencyPredictions {
                endpoints: predictions,
            }),
            ..CycleState::default()
        };
        let mut request = InferenceRequest::empty();
        request.priority = -1;
        request.headers.slo_ttft_ms = Some(200.0);
        let missed = cycle(vec![prediction(-50.0, false), prediction(-10.0, false)]);
        assert!(!admits(&request, &pool, &missed));
        let met = cycle(vec![prediction(-50.0, false), prediction(10.0, false)]);
        assert!(admits(&request, &pool, &met));
        let idle = cycle(vec![prediction(-50.0, true), prediction(-10.0, false)]);
        assert!(admits(&request, &pool, &idle));
        assert!(
            admits(&request, &pool, &cycle(vec![None, None])),
            "no predictions"
        );
        request.priority = 0;
        assert!(admits(&request, &pool, &missed), "not sheddable");
        request.priority = -1;
        request.headers.slo_ttft_ms = None;
        assert!(admits(&request, &pool, &missed), "no SLO");
        request.headers.slo_ttft_ms = Some(200.0);
        if let Some(cold) = pool.endpoints.get_mut(1) {
            cold.metrics.kv_cache_usage = Some(0.01);
        }
        assert!(admits(&request, &pool, &missed), "a cold pod");
    }
}
