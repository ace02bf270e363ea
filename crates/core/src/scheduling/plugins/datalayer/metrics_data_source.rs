//! `metrics-data-source`: where the custom-metric pipeline reads Prometheus text from. The
//! filter scrapes every pod once per `refreshMetricsInterval` through `pool.metricsCluster`;
//! this plugin's `path` is the path of that one scrape, shared with the built-in metrics.

use crate::scheduling::plugins::spec::{effective, Ignored, Kind, PluginSpec};
use crate::scheduling::{DataLayerPlugin, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "metrics-data-source";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::DataLayer, build, effective::<Parameters>)
    .ignoring(&[Ignored::parameter(
        "insecureSkipVerify",
        "TLS verification belongs to the metrics cluster's transport socket in Envoy",
    )]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub path: String,
    /// `http` or `https`; with `https` the metrics cluster must carry a TLS transport socket,
    /// since Envoy, not the filter, owns the connection.
    pub scheme: String,
    /// llm-d-router's TLS verification switch: accepted, since verification is the metrics
    /// cluster's transport socket's (see `scheme`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// llm-d-router's certificates, scrape port and period: refused with where they go here,
    /// since a scrape that silently used other ones would mislead.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ca_cert_path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub client_cert_path: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub client_key_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interval: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            path: "/metrics".into(),
            scheme: "http".into(),
            insecure_skip_verify: None,
            ca_cert_path: String::new(),
            client_cert_path: String::new(),
            client_key_path: String::new(),
            port: None,
            interval: String::new(),
        }
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !parameters.path.starts_with('/') {
        return Err(format!("path {:?} must start with '/'", parameters.path));
    }
    let certificates = [
        ("caCertPath", &parameters.ca_cert_path),
        ("clientCertPath", &parameters.client_cert_path),
        ("clientKeyPath", &parameters.client_key_path),
    ];
    if let Some((key, _)) = certificates.iter().find(|(_, path)| !path.is_empty()) {
        return Err(format!(
            "{key}: Envoy makes the scrape's TLS connection; put the certificates in the metrics cluster's transport socket (pool.metricsCluster)"
        ));
    }
    if parameters.port.is_some() {
        return Err("port: each pod is scraped at its endpoint's own address and port; a separate metrics port is not supported".into());
    }
    if !parameters.interval.is_empty() {
        return Err(format!(
            "interval {:?}: the scrape period is pool.refreshMetricsInterval",
            parameters.interval
        ));
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

    #[test]
    fn llm_d_router_parameters_are_accepted_or_refused_with_where_they_go() {
        let tls: Value =
            serde_yaml::from_str("{scheme: https, insecureSkipVerify: false}").unwrap();
        assert!(build(&tls).is_ok());
        for (given, needle) in [
            ("{caCertPath: /etc/ca.pem}", "transport socket"),
            ("{clientKeyPath: /etc/key.pem}", "transport socket"),
            ("{port: 9090}", "port"),
            ("{interval: 1s}", "pool.refreshMetricsInterval"),
        ] {
            let value: Value = serde_yaml::from_str(given).unwrap();
            let error = build(&value).unwrap_err();
            assert!(error.contains(needle), "{given}: {error}");
        }
    }
}
