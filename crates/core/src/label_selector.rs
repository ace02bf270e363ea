//! Kubernetes label selectors (`matchLabels` plus `matchExpressions` with `In`, `NotIn`,
//! `Exists`, `DoesNotExist`): the InferencePool's pod selector and `label-selector-filter`.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Expression {
    pub key: String,
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Expression>,
}

impl Expression {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        let needs_values = matches!(self.operator, Operator::In | Operator::NotIn);
        match (needs_values, self.values.is_empty()) {
            (true, true) => Err(format!(
                "{:?} on {:?} needs values",
                self.operator, self.key
            )),
            (false, false) => Err(format!(
                "{:?} on {:?} takes no values",
                self.operator, self.key
            )),
            _ => Ok(()),
        }
    }
}

impl Selector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
            && self.match_expressions.iter().all(|e| e.matches(labels))
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.match_labels.is_empty() && self.match_expressions.is_empty() {
            return Err("the selector needs matchLabels or matchExpressions".into());
        }
        self.match_expressions
            .iter()
            .try_for_each(Expression::validate)
    }
}
