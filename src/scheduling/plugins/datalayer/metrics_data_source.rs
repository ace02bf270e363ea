//! `metrics-data-source`: where the custom-metric pipeline reads Prometheus text from. The
//! filter scrapes every pod once per `refreshMetricsInterval` through `pool.metricsCluster`;
//! this plugin's `path` is the path of that one scrape, shared with the built-in metrics.

use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::{DataLayerPlugin, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "metrics-data-source";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::DataLayer, build, effective::<Parameters>);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub path: String,
    /// `http` or `https`; with `https` the metrics cluster must carry a TLS transport socket,
    /// since Envoy, not the filter, owns the connection.
    pub scheme: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            path: "/metrics".into(),
            scheme: "http".into(),
        }
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters.path.starts_with('/') {
        return Err(format!("path {:?} must start with '/'", parameters.path));
    }
    if parameters.scheme != "http" && parameters.scheme != "https" {
        return Err(format!(
            "scheme {:?} must be \"http\" or \"https\"",
            parameters.scheme
        ));
    }
    Ok(Plugin::DataLayer(DataLayerPlugin::Source {
        path: parameters.path,
        scheme: parameters.scheme,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn defaults_and_validation() {
        let Ok(Plugin::DataLayer(DataLayerPlugin::Source { path, scheme })) = build(&Value::Null)
        else {
            panic!("not a source");
        };
        assert_eq!((path.as_str(), scheme.as_str()), ("/metrics", "http"));
        let bad: Value = serde_yaml::from_str("{scheme: ftp}").unwrap();
        assert!(build(&bad).unwrap_err().contains("scheme"));
        let bad: Value = serde_yaml::from_str("{path: metrics}").unwrap();
        assert!(build(&bad).unwrap_err().contains("path"));
    }
}
