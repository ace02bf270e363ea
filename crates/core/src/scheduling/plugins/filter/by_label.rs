//! `by-label` (llm-d): keeps endpoints whose `label` has one of `validValues`; endpoints
//! without the label pass only with `allowsNoLabel`.

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Filter, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "by-label";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<Parameters>)
    .consuming(&[Data::EndpointLabels]);

#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub label: String,
    pub valid_values: Vec<String>,
    pub allows_no_label: bool,
}

pub struct ByLabel {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.label.is_empty() {
        return Err("label is required".into());
    }
    if parameters.valid_values.is_empty() && !parameters.allows_no_label {
        return Err("validValues is empty and allowsNoLabel is false: nothing could pass".into());
    }
    Ok(Plugin::Filter(Box::new(ByLabel { parameters })))
}

impl Filter for ByLabel {
    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        let p = &self.parameters;
        candidates.retain(|&i| match ctx.pool.get(i).and_then(|e| e.label(&p.label)) {
            Some(value) => p.valid_values.iter().any(|v| v == value),
            None => p.allows_no_label && ctx.pool.get(i).is_some(),
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
        let mut pool = queues(&[0.0; 3]);
        pool.endpoints[0]
            .labels
            .insert("tier".into(), "gold".into());
        pool.endpoints[1]
            .labels
            .insert("tier".into(), "bronze".into());
        let Ok(Plugin::Filter(mut filter)) = build(&serde_yaml::from_str(yaml).unwrap()) else {
            panic!("not a filter");
        };
        let request = InferenceRequest::empty();
        let mut candidates = vec![0, 1, 2];
        filter.filter(&SchedulingContext::new(&request, &pool), &mut candidates);
        candidates
    }

    #[test]
    fn valid_values_and_missing_labels() {
        assert_eq!(survivors("{label: tier, validValues: [gold]}"), [0]);
        assert_eq!(
            survivors("{label: tier, validValues: [gold], allowsNoLabel: true}"),
            [0, 2]
        );
        assert!(build(&serde_yaml::from_str("{label: tier}").unwrap()).is_err());
        assert!(build(&Value::Null).is_err());
    }
}
