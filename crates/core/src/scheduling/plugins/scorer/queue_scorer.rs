//! `queue-scorer`: prefers endpoints with shorter waiting queues, min-max normalised over the
//! candidates (GIE semantics).

use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec, Signal};
use crate::scheduling::{score_lower_is_better, Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "queue-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<NoParameters>)
    .consuming(&[Data::Metric(Signal::WaitingQueue), Data::InFlight]);

pub struct QueueScorer;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Scorer(Box::new(QueueScorer)))
}

impl Scorer for QueueScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let queue = |&i: &usize| ctx.pool.waiting(i);
        score_lower_is_better(candidates.iter().map(queue), scores);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;

    #[test]
    fn shortest_queue_scores_one() {
        let pool = queues(&[4.0, 0.0, 2.0, 8.0]);
        let request = InferenceRequest::empty();
        let ctx = SchedulingContext::new(&request, &pool);
        let mut scores = [0.0; 4];
        QueueScorer.score(&ctx, &[0, 1, 2, 3], &mut scores);
        assert_eq!(scores, [0.5, 1.0, 0.75, 0.0]);
        let mut scores = [0.0; 2];
        QueueScorer.score(&ctx, &[0, 2], &mut scores);
        assert_eq!(scores, [0.0, 1.0], "normalised over the candidates only");
    }
}
