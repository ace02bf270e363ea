//! `prometheus-metric`: an extractor that keeps one Prometheus series per pod, chosen by name
//! and, optionally, by labels (series selection). Several matching series are summed.

use crate::metrics::MetricSelector;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{DataLayerPlugin, Plugin};
use serde_yaml::Value;
use std::collections::BTreeMap;

pub const TYPE: &str = "prometheus-metric";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::DataLayer, build, effective::<Parameters>)
    .producing(&[Data::CustomMetric]);

#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub metric_name: String,
    pub labels: BTreeMap<String, String>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.metric_name.trim().is_empty() {
        return Err("metricName is required".into());
    }
    if let Some((name, _)) = parameters.labels.iter().find(|(name, _)| name.is_empty()) {
        return Err(format!("label name {name:?} must not be empty"));
    }
    Ok(Plugin::DataLayer(DataLayerPlugin::Extractor(
        MetricSelector {
            metric_name: parameters.metric_name,
            labels: parameters.labels.into_iter().collect(),
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn selector_from_parameters() {
        let value: Value = serde_yaml::from_str(
            "{metricName: 'vllm:num_requests_running', labels: {model_name: llama-3-8b}}",
        )
        .unwrap();
        let Ok(Plugin::DataLayer(DataLayerPlugin::Extractor(selector))) = build(&value) else {
            panic!("not an extractor");
        };
        assert_eq!(selector.metric_name, "vllm:num_requests_running");
        assert_eq!(
            selector.labels,
            [("model_name".to_string(), "llama-3-8b".to_string())]
        );
        assert!(build(&Value::Null).unwrap_err().contains("metricName"));
    }
}
