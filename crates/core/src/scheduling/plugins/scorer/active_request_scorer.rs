//! `active-request-scorer`: prefers endpoints with fewer requests in flight, counted by the
//! filter itself (+1 at the pick, -1 when the response ends or the stream is reset), so it
//! reacts within a burst, before any scrape could show the load.
//!
//! `count <= idleThreshold` scores 1; otherwise `maxBusyScore * (max - count) / max`, with
//! `max` the highest count among the candidates.

use crate::duration::serde_go;
use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;
use std::time::Duration;

pub const TYPE: &str = "active-request-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::InFlight])
    .ignoring(&[
        Ignored::parameter(
            "requestTimeout",
            "a request counts until its stream ends or is reset, which Envoy reports for every request",
        ),
        Ignored::producer("inFlightLoadProducerName", "inflight-load-producer"),
    ]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub idle_threshold: u32,
    pub max_busy_score: f64,
    /// Accepted for llm-d configs. The filter needs no expiry: Envoy ends every stream
    /// (complete, reset or timed out) with a callback that releases the count.
    #[serde(with = "serde_go")]
    pub request_timeout: Duration,
    /// llm-d-router's producer instance to read from; accepted, since the filter keeps one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub in_flight_load_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            idle_threshold: 0,
            max_busy_score: 1.0,
            request_timeout: Duration::from_secs(120),
            in_flight_load_producer_name: String::new(),
        }
    }
}

pub struct ActiveRequestScorer {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !(0.0..=1.0).contains(&parameters.max_busy_score) {
        return Err(format!(
            "maxBusyScore {} must be within [0, 1]",
            parameters.max_busy_score
        ));
    }
    Ok(Plugin::Scorer(Box::new(ActiveRequestScorer { parameters })))
}

impl Scorer for ActiveRequestScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let count = |i: usize| ctx.pool.get(i).map_or(0, |e| e.total_in_flight());
        let max = candidates.iter().map(|&i| count(i)).max().unwrap_or(0);
        for (score, &i) in scores.iter_mut().zip(candidates) {
            let c = count(i);
            *score = if c <= self.parameters.idle_threshold || max == 0 {
                1.0
            } else {
                self.parameters.max_busy_score * f64::from(max - c) / f64::from(max)
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;

    fn scores(parameters: Parameters, in_flight: &[u32]) -> Vec<f64> {
        let mut pool = queues(&vec![0.0; in_flight.len()]);
        for (endpoint, &n) in pool.endpoints.iter_mut().zip(in_flight) {
            endpoint.in_flight = n;
        }
        let request = InferenceRequest::empty();
        let candidates: Vec<usize> = (0..in_flight.len()).collect();
        let mut out = vec![0.0; in_flight.len()];
        ActiveRequestScorer { parameters }.score(
            &SchedulingContext::new(&request, &pool),
            &candidates,
            &mut out,
        );
        out
    }

    #[test]
    fn idle_scores_one_busy_scale_down_from_the_busiest() {
        assert_eq!(
            scores(Parameters::default(), &[0, 2, 4, 1]),
            [1.0, 0.5, 0.0, 0.75]
        );
        let parameters = Parameters {
            idle_threshold: 1,
            max_busy_score: 0.5,
            ..Parameters::default()
        };
        assert_eq!(scores(parameters, &[1, 2, 4]), [1.0, 0.25, 0.0]);
    }

    #[test]
    fn other_workers_requests_count_too() {
        let mut pool = queues(&[0.0, 0.0]);
        pool.endpoints[0].in_flight = 1;
        pool.endpoints[1].remote_in_flight = 2;
        let request = InferenceRequest::empty();
        let mut out = [0.0; 2];
        ActiveRequestScorer {
            parameters: Parameters::default(),
        }
        .score(&SchedulingContext::new(&request, &pool), &[0, 1], &mut out);
        assert_eq!(out, [0.5, 0.0]);
    }

    #[test]
    fn parameters_from_yaml() {
        let value: Value =
            serde_yaml::from_str("{idleThreshold: 2, maxBusyScore: 0.9, requestTimeout: 30s}")
                .unwrap();
        assert!(build(&value).is_ok());
        let bad: Value = serde_yaml::from_str("{maxBusyScore: 2}").unwrap();
        assert!(build(&bad).is_err());
    }
}
