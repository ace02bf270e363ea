//! `models-data-source`: learns which models (base and adapters) each pod serves from its
//! OpenAI `/v1/models` list, so a pool can serve the models its pods report instead of (or as
//! well as) the names its `models` lists. The scraping VM asks every pod once per
//! `refreshInterval` through `pool.metricsCluster`; every worker routes on what it learned.
//!
//! Consumes: each pod's `GET <path>` (`{"data": [{"id": ...}, ...]}`). Produces: the pool's
//! served model names, for choosing the pool by the request's model.

use crate::duration::serde_go;
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::{DataLayerPlugin, ModelsSource, Plugin};
use serde_yaml::Value;
use std::time::Duration;

pub const TYPE: &str = "models-data-source";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::DataLayer, build, effective::<Parameters>);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub path: String,
    /// Models change when a pod restarts or loads an adapter: seconds, not every scrape.
    #[serde(with = "serde_go")]
    pub refresh_interval: Duration,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            path: "/v1/models".into(),
            refresh_interval: Duration::from_secs(10),
        }
    }
}

/// The longest `/v1/models` answer read; a list of thousands of adapters fits.
pub const MAX_MODELS_BYTES: usize = 1 << 20;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters.path.starts_with('/') {
        return Err(format!("path {:?} must start with '/'", parameters.path));
    }
    let interval = parameters.refresh_interval;
    if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&interval) {
        return Err(format!(
            "refreshInterval {interval:?} must be between 100ms and 1h"
        ));
    }
    Ok(Plugin::DataLayer(DataLayerPlugin::Models(ModelsSource {
        path: parameters.path,
        refresh_interval: interval,
    })))
}

/// The model ids of a `/v1/models` answer, sorted and without duplicates; `None` when it is
/// not such a list.
pub fn served_models(body: &[u8]) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct List {
        data: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        id: String,
    }
    let list: List = serde_json::from_slice(body).ok()?;
    let mut ids: Vec<String> = list
        .data
        .into_iter()
        .map(|entry| entry.id)
        .filter(|id| !id.is_empty())
        .collect();
    ids.sort();
    ids.dedup();
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn defaults_and_validation() {
        let Ok(Plugin::DataLayer(DataLayerPlugin::Models(ModelsSource {
            path,
            refresh_interval,
        }))) = build(&Value::Null)
        else {
            panic!("not a models source");
        };
        assert_eq!(
            (path.as_str(), refresh_interval),
            ("/v1/models", Duration::from_secs(10))
        );
        let bad: Value = serde_yaml::from_str("{path: models}").unwrap();
        assert!(build(&bad).unwrap_err().contains("path"));
        let bad: Value = serde_yaml::from_str("{refreshInterval: 1ms}").unwrap();
        assert!(build(&bad).unwrap_err().contains("refreshInterval"));
    }

    #[test]
    fn reads_the_ids_of_an_openai_model_list() {
        let body = br#"{"object":"list","data":[{"id":"llama","object":"model"},{"id":"sql-lora","parent":"llama"},{"id":"llama"}]}"#;
        assert_eq!(
            served_models(body),
            Some(vec!["llama".into(), "sql-lora".into()])
        );
        assert_eq!(served_models(b"{\"data\":[]}"), Some(vec![]));
        assert_eq!(served_models(b"<html>"), None);
        assert_eq!(served_models(b"{\"object\":\"list\"}"), None);
    }
}
