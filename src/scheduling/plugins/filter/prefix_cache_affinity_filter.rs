//! `prefix-cache-affinity-filter`: when some candidates probably hold at least
//! `affinityThreshold` of the prompt's prefix blocks, keeps only those; otherwise keeps all.
//! The matches come from `prefix-cache-scorer` through the cycle state.

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "prefix-cache-affinity-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Parameters>)
    .consuming(&[Data::PrefixMatches]);

#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub affinity_threshold: f64,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            affinity_threshold: 0.80,
        }
    }
}

pub struct PrefixCacheAffinityFilter {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    let t = parameters.affinity_threshold;
    if !(t > 0.0 && t <= 1.0) {
        return Err(format!("affinityThreshold {t} must be within (0, 1]"));
    }
    Ok(Plugin::Filter(Box::new(PrefixCacheAffinityFilter {
        parameters,
    })))
}

impl Filter for PrefixCacheAffinityFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let threshold = self.parameters.affinity_threshold;
        let warm = |&i: &usize| ctx.cycle.hit_ratio(i) >= threshold;
        if candidates.iter().any(warm) {
            candidates.retain(warm);
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

    fn survivors(matched: Vec<usize>) -> Vec<usize> {
        let pool = queues(&[0.0; 3]);
        let request = InferenceRequest::empty();
        let cycle = prefix_cycle(matched, 10, 16);
        let ctx = SchedulingContext {
            request: &request,
            pool: &pool,
            cycle: &cycle,
        };
        let Ok(Plugin::Filter(mut filter)) = build(&Value::Null) else {
            panic!("not a filter");
        };
        let mut candidates = vec![0, 1, 2];
        filter.filter(&ctx, &mut candidates);
        candidates
    }

    #[test]
    fn keeps_only_the_warm_when_any_is_warm() {
        assert_eq!(survivors(vec![8, 9, 2]), [0, 1]);
        assert_eq!(survivors(vec![7, 0, 2]), [0, 1, 2], "nobody reaches 0.8");
        assert!(build(&serde_yaml::from_str("{affinityThreshold: 1.5}").unwrap()).is_err());
    }
}
