//! `label-selector-filter` (also `by-label-selector`): keeps endpoints whose labels match a
//! Kubernetes label selector: `matchLabels` plus `matchExpressions` with `In`, `NotIn`,
//! `Exists` and `DoesNotExist`. The seed's backend preference is one of these on
//! `llm-d.ai/kv-backend: nvlink`.

use crate::label_selector::Selector;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "label-selector-filter";
/// The llm-d name.
pub const ALIAS_TYPE: &str = "by-label-selector";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Selector>)
    .with_aliases(&[ALIAS_TYPE])
    .consuming(&[Data::EndpointLabels]);

pub struct LabelSelectorFilter {
    selector: Selector,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let selector: Selector = super::parameters(parameters)?;
    selector.validate()?;
    Ok(Plugin::Filter(Box::new(LabelSelectorFilter { selector })))
}

impl Filter for LabelSelectorFilter {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        candidates.retain(|&i| {
            ctx.pool
                .get(i)
                .is_some_and(|e| self.selector.matches(&e.labels))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::queues;

    fn survivors(yaml: &str) -> Vec<usize> {
        let mut pool = queues(&[0.0; 4]);
        let labels = [
            &[("llm-d.ai/kv-backend", "nvlink"), ("zone", "a")][..],
            &[("llm-d.ai/kv-backend", "tcp"), ("zone", "b")][..],
            &[("zone", "a")][..],
            &[][..],
        ];
        for (endpoint, labels) in pool.endpoints.iter_mut().zip(labels) {
            for (k, v) in labels {
                endpoint.labels.insert((*k).into(), (*v).into());
            }
        }
        let Ok(Plugin::Filter(mut filter)) = build(&serde_yaml::from_str(yaml).unwrap()) else {
            panic!("not a filter: {yaml}");
        };
        let request = InferenceRequest::empty();
        let mut candidates = vec![0, 1, 2, 3];
        filter.filter(&SchedulingContext::new(&request, &pool), &mut candidates);
        candidates
    }

    #[test]
    fn match_labels_and_expressions() {
        assert_eq!(
            survivors("{matchLabels: {llm-d.ai/kv-backend: nvlink}}"),
            [0]
        );
        assert_eq!(
            survivors("{matchExpressions: [{key: zone, operator: In, values: [a, c]}]}"),
            [0, 2]
        );
        assert_eq!(
            survivors(
                "{matchExpressions: [{key: llm-d.ai/kv-backend, operator: NotIn, values: [tcp]}]}"
            ),
            [0, 2, 3]
        );
        assert_eq!(
            survivors("{matchExpressions: [{key: zone, operator: Exists}]}"),
            [0, 1, 2]
        );
        assert_eq!(
            survivors("{matchExpressions: [{key: zone, operator: DoesNotExist}]}"),
            [3]
        );
        assert_eq!(
            survivors("{matchLabels: {zone: a}, matchExpressions: [{key: llm-d.ai/kv-backend, operator: Exists}]}"),
            [0]
        );
    }

    #[test]
    fn invalid_selectors_are_rejected() {
        for yaml in [
            "{}",
            "{matchExpressions: [{key: zone, operator: In}]}",
            "{matchExpressions: [{key: zone, operator: Exists, values: [a]}]}",
            "{matchExpressions: [{key: zone, operator: Gt, values: ['1']}]}",
            "{matchLabel: {a: b}}",
        ] {
            assert!(
                build(&serde_yaml::from_str(yaml).unwrap()).is_err(),
                "{yaml}"
            );
        }
    }
}
