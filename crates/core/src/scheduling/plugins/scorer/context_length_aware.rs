//! `context-length-aware` (llm-d): endpoints declare the prompt lengths they are sized for in a
//! label (`llm-d.ai/context-length-range: 0-8192`, several ranges comma-separated). A request
//! whose estimated prompt tokens fall in a declared range scores 1, outside 0, and an endpoint
//! without the label 0.5. With `enableFiltering` it also drops endpoints whose ranges exclude
//! the request (unlabelled ones stay).

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "context-length-aware";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::EndpointLabels]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub label: String,
    pub enable_filtering: bool,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            label: "llm-d.ai/context-length-range".into(),
            enable_filtering: false,
        }
    }
}

pub struct ContextLengthAware {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.label.is_empty() {
        return Err("label must not be empty".into());
    }
    Ok(Plugin::Scorer(Box::new(ContextLengthAware { parameters })))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fit {
    Inside,
    Outside,
    Undeclared,
}

/// Whether `tokens` falls in any `min-max` range of `label`.
fn fit(label: Option<&str>, tokens: u32) -> Fit {
    let Some(label) = label else {
        return Fit::Undeclared;
    };
    let mut declared = false;
    for range in label.split(',') {
        let Some((low, high)) = range.trim().split_once('-') else {
            continue;
        };
        let (Ok(low), Ok(high)) = (low.trim().parse::<u32>(), high.trim().parse::<u32>()) else {
            continue;
        };
        declared = true;
        if (low..=high).contains(&tokens) {
            return Fit::Inside;
        }
    }
    if declared {
        Fit::Outside
    } else {
        Fit::Undeclared
    }
}

impl ContextLengthAware {
    fn fit_of(&self, ctx: &SchedulingContext<'_>, endpoint: usize) -> Fit {
        let label = ctx
            .pool
            .get(endpoint)
            .and_then(|e| e.label(&self.parameters.label));
        fit(label, ctx.request.prompt_tokens)
    }
}

impl Scorer for ContextLengthAware {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        for (score, &i) in scores.iter_mut().zip(candidates) {
            *score = match self.fit_of(ctx, i) {
                Fit::Inside => 1.0,
                Fit::Undeclared => 0.5,
                Fit::Outside => 0.0,
            };
        }
    }

    fn filters(&self) -> bool {
        self.parameters.enable_filtering
    }

    fn filter(&mut self, ctx: &SchedulingContext<'_>, candidates: &mut Vec<usize>) {
        candidates.retain(|&i| self.fit_of(ctx, i) != Fit::Outside);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn ranges() {
        assert_eq!(fit(Some("0-2048"), 100), Fit::Inside);
        assert_eq!(fit(Some("0-2048"), 4000), Fit::Outside);
        assert_eq!(fit(Some("0-512, 4096-131072"), 5000), Fit::Inside);
        assert_eq!(fit(Some("2048-131072"), 2048), Fit::Inside);
        assert_eq!(fit(Some("garbage"), 5), Fit::Undeclared);
        assert_eq!(fit(None, 5), Fit::Undeclared);
    }

    #[test]
    fn filtering_is_opt_in() {
        let Ok(Plugin::Scorer(plain)) = build(&Value::Null) else {
            panic!("not a scorer");
        };
        assert!(!plain.filters());
        let value: Value = serde_yaml::from_str("{enableFiltering: true, label: size}").unwrap();
        let Ok(Plugin::Scorer(filtering)) = build(&value) else {
            panic!("not a scorer");
        };
        assert!(filtering.filters());
    }
}
