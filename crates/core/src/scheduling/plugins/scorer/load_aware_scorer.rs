//! `load-aware-scorer` (llm-d): an empty queue scores 0.5; a queue of `q` scores
//! `0.5 * (1 - min(q, threshold) / threshold)`, so a full queue scores 0.

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec, Signal};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "load-aware-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::Metric(Signal::WaitingQueue), Data::InFlight]);

#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub threshold: f64,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters { threshold: 128.0 }
    }
}

pub struct LoadAwareScorer {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !(parameters.threshold.is_finite() && parameters.threshold > 0.0) {
        return Err(format!(
            "threshold {} must be above 0",
            parameters.threshold
        ));
    }
    Ok(Plugin::Scorer(Box::new(LoadAwareScorer { parameters })))
}

fn load_score(queue: f64, threshold: f64) -> f64 {
    if queue <= 0.0 {
        0.5
    } else {
        0.5 * (1.0 - queue.min(threshold) / threshold)
    }
}

impl Scorer for LoadAwareScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        for (score, &i) in scores.iter_mut().zip(candidates) {
            // An unknown queue scores as a full one.
            *score = ctx
                .pool
                .waiting(i)
                .map_or(0.0, |queue| load_score(queue, self.parameters.threshold));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn formula() {
        assert_eq!(load_score(0.0, 128.0), 0.5);
        assert_eq!(load_score(64.0, 128.0), 0.25);
        assert_eq!(load_score(500.0, 128.0), 0.0);
        assert_eq!(load_score(2.0, 8.0), 0.375);
    }

    #[test]
    fn an_unknown_queue_scores_as_a_full_one() {
        use crate::metrics::EndpointMetrics;
        use crate::request::InferenceRequest;
        use crate::scheduling::test_support::pool_with;
        let queue = |q| EndpointMetrics {
            waiting_queue: q,
            ..EndpointMetrics::idle()
        };
        let pool = pool_with(vec![queue(Some(0.0)), queue(None), queue(Some(f64::NAN))]);
        let request = InferenceRequest::empty();
        let mut scores = [1.0; 3];
        LoadAwareScorer {
            parameters: Parameters::default(),
        }
        .score(
            &SchedulingContext::new(&request, &pool),
            &[0, 1, 2],
            &mut scores,
        );
        assert_eq!(scores, [0.5, 0.0, 0.0]);
    }

    #[test]
    fn parameters() {
        let value: Value = serde_yaml::from_str("{threshold: 10}").unwrap();
        assert!(build(&value).is_ok());
        let bad: Value = serde_yaml::from_str("{threshold: 0}").unwrap();
        assert!(build(&bad).is_err());
    }
}
