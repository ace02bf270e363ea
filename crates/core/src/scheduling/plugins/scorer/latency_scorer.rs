//! `latency-scorer` (llm-d-router): scores candidates by their headroom to the request's
//! latency SLOs, from `predicted-latency-producer`'s predictions.
//! - Candidates that meet both SLOs (or have no prediction) are scored, the others get 0; with
//!   none meeting them, the idle ones; with none idle, the smallest violation's kind first
//!   (TPOT only, then TTFT only, then both).
//! - Within the scored bucket, each headroom is normalised over the bucket and the two are
//!   weighted (`ttftWeight`, `tpotWeight`): `least` favours the smallest headroom (packing
//!   requests onto pods just fast enough, keeping the fastest free), `most` the largest.
//! - With no prediction anywhere (nothing learned yet), a composite of free KV cache, queue
//!   and prefix share, each a pod's own (llm-d-router scales the queue by the longest).

use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec, Signal};
use crate::scheduling::{Plugin, Prediction, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "latency-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[
        Data::LatencyPredictions,
        Data::PrefixMatches,
        Data::Metric(Signal::KvCacheUsage),
        Data::Metric(Signal::WaitingQueue),
    ])
    .ignoring(&[
        Ignored::producer(
            "latencyPredictionInfoProducerName",
            "predicted-latency-producer",
        ),
        Ignored::PREFIX_PRODUCER,
    ]);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    Least,
    Most,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub ttft_weight: f64,
    pub tpot_weight: f64,
    pub headroom_selection_strategy: Strategy,
    #[serde(rename = "compositeKVWeight")]
    pub composite_kv_weight: f64,
    pub composite_queue_weight: f64,
    pub composite_prefix_weight: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub latency_prediction_info_producer_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            ttft_weight: 0.8,
            tpot_weight: 0.2,
            headroom_selection_strategy: Strategy::Least,
            composite_kv_weight: 1.0,
            composite_queue_weight: 1.0,
            composite_prefix_weight: 1.0,
            latency_prediction_info_producer_name: String::new(),
            prefix_match_info_producer_name: String::new(),
        }
    }
}

pub struct LatencyScorer {
    parameters: Parameters,
    /// TTFT's share of the two weights, normalised.
    ttft_share: f64,
    /// Candidate positions (into `candidates`) of the bucket being scored; reused.
    bucket: Vec<usize>,
    /// The candidates' predictions by position; reused.
    predicted: Vec<Option<Prediction>>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let p = &parameters;
    let weights = [
        ("ttftWeight", p.ttft_weight),
        ("tpotWeight", p.tpot_weight),
        ("compositeKVWeight", p.composite_kv_weight),
        ("compositeQueueWeight", p.composite_queue_weight),
        ("compositePrefixWeight", p.composite_prefix_weight),
    ];
    if let Some((key, w)) = weights.iter().find(|(_, w)| !(w.is_finite() && *w >= 0.0)) {
        return Err(format!("{key} {w} must be a number of at least 0"));
    }
    let sum = p.ttft_weight + p.tpot_weight;
    let ttft_share = if sum > 0.0 { p.ttft_weight / sum } else { 1.0 };
    Ok(Plugin::Scorer(Box::new(LatencyScorer {
        parameters,
        ttft_share,
        bucket: Vec::new(),
        predicted: Vec::new(),
    })))
}

/// Which candidates are scored when none meets its SLOs and none is idle: the first kind of
/// violation that some candidate has.
fn violation_rank(p: &Prediction) -> u8 {
    match (p.ttft_headroom_ms < 0.0, p.tpot_headroom_ms < 0.0) {
        (false, true) => 0,
        (true, false) => 1,
        _ => 2,
    }
}

impl LatencyScorer {
    /// Fills `bucket` with the positions to score and says which strategy applies.
    fn choose_bucket(&mut self, predicted: &[Option<Prediction>]) -> Strategy {
        self.bucket.clear();
        let positive = |p: &Option<Prediction>| p.as_ref().is_none_or(Prediction::positive);
        if predicted.iter().any(positive) {
            self.bucket
                .extend((0..predicted.len()).filter(|&i| predicted.get(i).is_some_and(positive)));
            return self.parameters.headroom_selection_strategy;
        }
        let idle = |p: &Option<Prediction>| p.as_ref().is_some_and(|p| p.idle);
        if predicted.iter().any(idle) {
            self.bucket
                .extend((0..predicted.len()).filter(|&i| predicted.get(i).is_some_and(idle)));
            return self.parameters.headroom_selection_strategy;
        }
        let rank = |i: usize| {
            predicted
                .get(i)
                .and_then(Option::as_ref)
                .map(violation_rank)
        };
        let best = (0..predicted.len()).filter_map(rank).min();
        self.bucket
            .extend((0..predicted.len()).filter(|&i| best.is_some() && rank(i) == best));
        Strategy::Least
    }

    fn score_bucket(
        &self,
        predicted: &[Option<Prediction>],
        strategy: Strategy,
        scores: &mut [f64],
    ) {
        let headroom = |i: usize, ttft: bool| {
            predicted.get(i).and_then(Option::as_ref).map_or(0.0, |p| {
                if ttft {
                    p.ttft_headroom_ms.abs()
                } else {
                    p.tpot_headroom_ms.abs()
                }
            })
        };
        let range = |ttft: bool| {
            self.bucket
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &i| {
                    let h = headroom(i, ttft);
                    (lo.min(h), hi.max(h))
                })
        };
        let (ttft_range, tpot_range) = (range(true), range(false));
        let spread = |(lo, hi): (f64, f64)| hi - lo > 0.0;
        let ttft_share = match (spread(ttft_range), spread(tpot_range)) {
            (true, false) => 1.0,
            (false, true) => 0.0,
            _ => self.ttft_share,
        };
        let normal = |h: f64, (lo, hi): (f64, f64)| {
            if hi - lo > 0.0 {
                (h - lo) / (hi - lo)
            } else {
                0.5
            }
        };
        for &i in &self.bucket {
            let combined = ttft_share * normal(headroom(i, true), ttft_range)
                + (1.0 - ttft_share) * normal(headroom(i, false), tpot_range);
            let favoured = match strategy {
                Strategy::Least => 1.0 - combined,
                Strategy::Most => combined,
            };
            if let Some(score) = scores.get_mut(i) {
                *score = (((favoured * 100.0).floor() + 1.0) / 100.0).min(1.0);
            }
        }
    }

    /// Nothing predicted anywhere: free KV cache, a short queue and a long prefix match. The
    /// queue term is `1 / (1 + queue)`, where llm-d-router scales each queue by the longest:
    /// one pod's queue (a hostile page's) must not reorder the others.
    fn composite(&self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let p = &self.parameters;
        let total = p.composite_kv_weight + p.composite_queue_weight + p.composite_prefix_weight;
        if total <= 0.0 {
            return;
        }
        for (score, &c) in scores.iter_mut().zip(candidates) {
            let free_kv = 1.0 - ctx.pool.kv_usage(c).unwrap_or(1.0);
            let queue = ctx
                .pool
                .waiting(c)
                .map_or(0.0, |q| 1.0 / (1.0 + q.max(0.0)));
            let sum = p.composite_kv_weight * free_kv
                + p.composite_queue_weight * queue
                + p.composite_prefix_weight * ctx.cycle.hit_ratio(c);
            *score = ((sum / total) * 100.0).round() / 100.0;
        }
    }
}

impl Scorer for LatencyScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let Some(predictions) = ctx.cycle.latency.as_ref() else {
            self.composite(ctx, candidates, scores);
            return;
        };
        if !candidates.iter().any(|&c| predictions.get(c).is_some()) {
            self.composite(ctx, candidates, scores);
            return;
        }
        // Predictions by candidate position, in a buffer kept between requests.
        let mut predicted = std::mem::take(&mut self.predicted);
        predicted.clear();
        predicted.extend(candidates.iter().map(|&c| predictions.get(c).copied()));
        let strategy = self.choose_bucket(&predicted);
        self.score_bucket(&predicted, strategy, scores);
        self.predicted = predicted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;
    use crate::scheduling::{CycleState, LatencyPredictions};

    fn prediction(ttft_headroom_ms: f64, tpot_headroom_ms: f64, idle: bool) -> Option<Prediction> {
        Some(Prediction {
            ttft_ms: 100.0,
            tpot_ms: 10.0,
            ttft_headroom_ms,
            tpot_headroom_ms,
            idle,
        })
    }

    fn scores(parameters: &str, predictions: Vec<Option<Prediction>>) -> Vec<f64> {
        let pool = queues(&vec![0.0; predictions.len()]);
        let request = InferenceRequest::empty();
        let cycle = CycleState {
            latency: Some(LatencyPredictions {
                endpoints: predictions.clone(),
            }),
            ..CycleState::default()
        };
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let Ok(Plugin::Scorer(mut scorer)) = build(&serde_yaml::from_str(parameters).unwrap())
        else {
            panic!("not a scorer");
        };
        let candidates: Vec<usize> = (0..predictions.len()).collect();
        let mut out = vec![0.0; candidates.len()];
        scorer.score(&ctx, &candidates, &mut out);
        out
    }

    #[test]
    fn least_packs_onto_the_pod_just_within_the_slo_and_zeroes_the_misses() {
        let out = scores(
            "{}",
            vec![
                prediction(50.0, 0.0, false),
                prediction(500.0, 0.0, false),
                prediction(-20.0, 0.0, false),
            ],
        );
        assert!(out[0] > out[1], "{out:?}");
        assert_eq!(out[2], 0.0, "{out:?}");
        let most = scores(
            "{headroomSelectionStrategy: most}",
            vec![prediction(50.0, 0.0, false), prediction(500.0, 0.0, false)],
        );
        assert!(most[1] > most[0], "{most:?}");
    }

    #[test]
    fn with_every_slo_missed_idle_pods_then_the_smallest_violation_win() {
        let idle = scores(
            "{}",
            vec![prediction(-20.0, 0.0, false), prediction(-900.0, 0.0, true)],
        );
        assert_eq!(idle[0], 0.0, "{idle:?}");
        assert!(idle[1] > 0.0, "{idle:?}");
        let busy = scores(
            "{}",
            vec![
                prediction(-20.0, 0.0, false),
                prediction(-900.0, 0.0, false),
            ],
        );
        assert!(busy[0] > busy[1], "the smaller violation: {busy:?}");
        let kinds = scores(
            "{}",
            vec![
                prediction(-20.0, -5.0, false),
                prediction(10.0, -50.0, false),
            ],
        );
        assert_eq!(kinds[0], 0.0, "TPOT-only violations go first: {kinds:?}");
        assert!(kinds[1] > 0.0, "{kinds:?}");
    }

    #[test]
    fn without_predictions_a_composite_of_load_and_prefix() {
        let mut pool = queues(&[0.0, 4.0]);
        for endpoint in &mut pool.endpoints {
            endpoint.metrics.kv_cache_usage = Some(0.5);
        }
        let request = InferenceRequest::empty();
        let cycle = CycleState::default();
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let Ok(Plugin::Scorer(mut scorer)) = build(&Value::Null) else {
            panic!("not a scorer");
        };
        let mut out = vec![0.0; 2];
        scorer.score(&ctx, &[0, 1], &mut out);
        assert!(out[0] > out[1], "{out:?}");
        assert!(build(&serde_yaml::from_str("{ttftWeight: -1}").unwrap()).is_err());
    }
}
