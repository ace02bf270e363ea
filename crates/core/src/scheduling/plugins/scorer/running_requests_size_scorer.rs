//! `running-requests-size-scorer`: prefers endpoints running fewer requests, min-max
//! normalised over the candidates.

use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec, Signal};
use crate::scheduling::{score_lower_is_better, Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "running-requests-size-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<NoParameters>)
    .consuming(&[Data::Metric(Signal::RunningRequests), Data::InFlight]);

pub struct RunningRequestsSizeScorer;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Scorer(Box::new(RunningRequestsSizeScorer)))
}

impl Scorer for RunningRequestsSizeScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let running = |&i: &usize| ctx.pool.running(i);
        score_lower_is_better(candidates.iter().map(running), scores);
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
    fn fewest_running_scores_one() {
        let running = |r| EndpointMetrics {
            running_requests: r,
            ..EndpointMetrics::idle()
        };
        let pool = pool_with(vec![
            running(Some(10.0)),
            running(Some(2.0)),
            running(Some(6.0)),
            running(None),
        ]);
        let request = InferenceRequest::empty();
        let ctx = SchedulingContext::new(&request, &pool);
        let mut scores = [0.0; 4];
        RunningRequestsSizeScorer.score(&ctx, &[0, 1, 2, 3], &mut scores);
        assert_eq!(scores, [0.0, 1.0, 0.5, 0.0], "unknown scores worst");
    }
}
