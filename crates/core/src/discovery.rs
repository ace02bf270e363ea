//! Kubernetes discovery, as GIE's InferencePool does it: the pods matching a label selector,
//! each at its IP and every target port, with the pod's labels as endpoint labels. The filter
//! polls the API server's pod list through an Envoy cluster; this module builds the request
//! and reads the answer.

use crate::duration::serde_go;
use crate::endpoint::canonical_address;
use crate::label_selector::{Operator, Selector};
use crate::limits;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// `pool.discovery`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DiscoveryConfig {
    /// Envoy cluster that reaches the Kubernetes API server.
    pub cluster: String,
    /// `:authority` of the API calls; defaults to the cluster name.
    #[serde(default)]
    pub authority: Option<String>,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The InferencePool's `spec.selector`.
    pub selector: Selector,
    /// The InferencePool's `spec.targetPorts`.
    pub target_ports: Vec<u16>,
    /// Sent as `authorization: Bearer ...` (a service-account token).
    #[serde(default)]
    pub bearer_token: Option<String>,
    #[serde(default = "default_interval", with = "serde_go")]
    pub interval: Duration,
    /// `pods` (default: ready pods, each with its own labels) or `endpointslices` (ready
    /// endpoints of the matching EndpointSlices, labelled with their slice's labels).
    #[serde(default)]
    pub resource: Resource,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    #[default]
    Pods,
    EndpointSlices,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_interval() -> Duration {
    Duration::from_secs(5)
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.cluster.trim().is_empty() {
            return Err("cluster must name an Envoy cluster".into());
        }
        if self.target_ports.is_empty() || self.target_ports.contains(&0) {
            return Err("targetPorts needs at least one port, none of them 0".into());
        }
        limits::TARGET_PORTS
            .check_usize(self.target_ports.len())
            .map_err(|reason| format!("targetPorts: {reason}"))?;
        limits::DISCOVERY_INTERVAL
            .check(self.interval)
            .map_err(|reason| format!("interval: {reason}"))?;
        if self.namespace.is_empty() {
            return Err("namespace must not be empty".into());
        }
        for (key, value) in [
            ("authority", self.authority.as_deref()),
            ("bearerToken", self.bearer_token.as_deref()),
        ] {
            let Some(value) = value else { continue };
            limits::HEADER_VALUE_BYTES
                .check_usize(value.len())
                .map_err(|reason| format!("{key}: {reason}"))?;
            if !limits::is_token(value) {
                return Err(format!(
                    "{key} must be visible ASCII without spaces (it is sent as a header value)"
                ));
            }
        }
        self.selector.validate()
    }

    /// The list request path, e.g. `/api/v1/namespaces/{ns}/pods?labelSelector=...`.
    pub fn list_path(&self) -> String {
        let collection = match self.resource {
            Resource::Pods => "api/v1",
            Resource::EndpointSlices => "apis/discovery.k8s.io/v1",
        };
        let kind = match self.resource {
            Resource::Pods => "pods",
            Resource::EndpointSlices => "endpointslices",
        };
        format!(
            "/{collection}/namespaces/{}/{kind}?labelSelector={}",
            percent_encode(&self.namespace),
            percent_encode(&label_selector(&self.selector))
        )
    }

    /// The ready endpoints in the API's answer to [`DiscoveryConfig::list_path`]. Addresses
    /// no pod can have (`0.0.0.0`, `::`, multicast, ...) are left out, as in `pool.endpoints`;
    /// an answer with more endpoints than the pool may hold is refused whole.
    pub fn endpoints(&self, body: &[u8]) -> Result<Vec<Discovered>, String> {
        let found = match self.resource {
            Resource::Pods => ready_endpoints(body, &self.target_ports),
            Resource::EndpointSlices => ready_slice_endpoints(body, &self.target_ports),
        }?;
        limits::ENDPOINTS
            .check_usize(found.len().max(1))
            .map_err(|reason| format!("the answer lists {reason}"))?;
        Ok(found)
    }
}

/// A selector in the API's `labelSelector` syntax.
pub fn label_selector(selector: &Selector) -> String {
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    for expression in &selector.match_expressions {
        let values = expression.values.join(",");
        terms.push(match expression.operator {
            Operator::In => format!("{} in ({values})", expression.key),
            Operator::NotIn => format!("{} notin ({values})", expression.key),
            Operator::Exists => expression.key.clone(),
            Operator::DoesNotExist => format!("!{}", expression.key),
        });
    }
    terms.join(",")
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pod {
    #[serde(default)]
    metadata: PodMetadata,
    #[serde(default)]
    status: PodStatus,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodMetadata {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    #[serde(default)]
    phase: String,
    #[serde(default, rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default)]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct Condition {
    #[serde(rename = "type")]
    kind: String,
    status: String,
}

#[derive(Deserialize)]
struct SliceList {
    #[serde(default)]
    items: Vec<Slice>,
}

#[derive(Deserialize)]
struct Slice {
    #[serde(default)]
    metadata: PodMetadata,
    #[serde(default)]
    endpoints: Vec<SliceEndpoint>,
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
}

#[derive(Deserialize)]
struct SliceEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: SliceConditions,
}

#[derive(Default, Deserialize)]
struct SliceConditions {
    /// Absent means ready (the API's convention).
    ready: Option<bool>,
    terminating: Option<bool>,
}

#[derive(Deserialize)]
struct SlicePort {
    port: Option<u16>,
}

/// Ready endpoints of EndpointSlices at the target ports the slices expose.
pub fn ready_slice_endpoints(body: &[u8], target_ports: &[u16]) -> Result<Vec<Discovered>, String> {
    let list: SliceList = serde_json::from_slice(body)
        .map_err(|error| format!("not an EndpointSlice list: {error}"))?;
    let mut endpoints = Vec::new();
    for slice in list.items {
        let exposed: Vec<u16> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| p.port)
            .collect();
        for endpoint in slice.endpoints {
            let ready = endpoint.conditions.ready.unwrap_or(true)
                && !endpoint.conditions.terminating.unwrap_or(false);
            if !ready {
                continue;
            }
            for ip in &endpoint.addresses {
                let host = if ip.contains(':') {
                    format!("[{ip}]")
                } else {
                    ip.clone()
                };
                for port in target_ports
                    .iter()
                    .filter(|p| exposed.is_empty() || exposed.contains(p))
                {
                    if let Ok(address) = canonical_address(&format!("{host}:{port}")) {
                        endpoints.push((address, slice.metadata.labels.clone()));
                    }
                }
            }
        }
    }
    endpoints.sort_by(|a, b| a.0.cmp(&b.0));
    endpoints.dedup_by(|a, b| a.0 == b.0);
    Ok(endpoints)
}

/// One discovered endpoint: canonical `ip:port` and the pod's labels.
pub type Discovered = (String, BTreeMap<String, String>);

/// The ready pods of a pod list, at every target port, in a stable (address) order.
pub fn ready_endpoints(body: &[u8], target_ports: &[u16]) -> Result<Vec<Discovered>, String> {
    let list: PodList =
        serde_json::from_slice(body).map_err(|error| format!("not a pod list: {error}"))?;
    let mut endpoints = Vec::new();
    for pod in list.items {
        let ready = pod.status.phase == "Running"
            && pod.metadata.deletion_timestamp.is_none()
            && pod
                .status
                .conditions
                .iter()
                .any(|c| c.kind == "Ready" && c.status == "True");
        let Some(ip) = pod.status.pod_ip.filter(|_| ready) else {
            continue;
        };
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip
        };
        for port in target_ports {
            if let Ok(address) = canonical_address(&format!("{host}:{port}")) {
                endpoints.push((address, pod.metadata.labels.clone()));
            }
        }
    }
    endpoints.sort_by(|a, b| a.0.cmp(&b.0));
    endpoints.dedup_by(|a, b| a.0 == b.0);
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn config(yaml: &str) -> DiscoveryConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn path_carries_the_selector() {
        let discovery = config(
            "{cluster: k8s, namespace: llm, targetPorts: [8000], selector: {matchLabels: {app: vllm}, matchExpressions: [{key: tier, operator: In, values: [a, b]}, {key: canary, operator: DoesNotExist}]}}",
        );
        assert_eq!(
            discovery.list_path(),
            "/api/v1/namespaces/llm/pods?labelSelector=app%3Dvllm%2Ctier%20in%20%28a%2Cb%29%2C%21canary"
        );
        assert_eq!(discovery.interval, Duration::from_secs(5));
        assert!(discovery.validate().is_ok());
        assert!(
            config("{cluster: k8s, targetPorts: [], selector: {matchLabels: {a: b}}}")
                .validate()
                .is_err()
        );
        assert!(config("{cluster: k8s, targetPorts: [80], selector: {}}")
            .validate()
            .is_err());
    }

    #[test]
    fn only_ready_running_pods_count() {
        let body = br#"{"kind":"PodList","items":[
          {"metadata":{"name":"a","labels":{"app":"vllm","llm-d.ai/role":"decode"}},
           "status":{"phase":"Running","podIP":"10.0.0.2","conditions":[{"type":"Ready","status":"True"}]}},
          {"metadata":{"name":"b","labels":{"app":"vllm"}},
           "status":{"phase":"Running","podIP":"10.0.0.3","conditions":[{"type":"Ready","status":"False"}]}},
          {"metadata":{"name":"c","labels":{"app":"vllm"},"deletionTimestamp":"2026-01-01T00:00:00Z"},
           "status":{"phase":"Running","podIP":"10.0.0.4","conditions":[{"type":"Ready","status":"True"}]}},
          {"metadata":{"name":"d"},"status":{"phase":"Pending"}},
          {"metadata":{"name":"e"},"status":{"phase":"Running","podIP":"fd00::5","conditions":[{"type":"Ready","status":"True"}]}}
        ]}"#;
        let endpoints = ready_endpoints(body, &[8000, 8001]).unwrap();
        let addresses: Vec<&str> = endpoints.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(
            addresses,
            [
                "10.0.0.2:8000",
                "10.0.0.2:8001",
                "[fd00::5]:8000",
                "[fd00::5]:8001"
            ]
        );
        assert_eq!(endpoints[0].1["llm-d.ai/role"], "decode");
        assert!(ready_endpoints(b"<html>", &[80]).is_err());
    }

    #[test]
    fn unroutable_pod_addresses_are_left_out() {
        let pod = |ip: &str| {
            format!(
                r#"{{"metadata":{{"name":"{ip}"}},"status":{{"phase":"Running","podIP":"{ip}","conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
            )
        };
        let body = format!(
            r#"{{"items":[{}]}}"#,
            ["0.0.0.0", "::", "10.0.0.2", "224.0.0.1", "0.0.0.7"]
                .map(pod)
                .join(",")
        );
        let endpoints = ready_endpoints(body.as_bytes(), &[8000]).unwrap();
        let addresses: Vec<&str> = endpoints.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.2:8000"]);
        let slices = br#"{"items":[{"ports":[{"port":8000}],"endpoints":[{"addresses":["0.0.0.0","::","10.0.0.3"]}]}]}"#;
        let endpoints = ready_slice_endpoints(slices, &[8000]).unwrap();
        let addresses: Vec<&str> = endpoints.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.3:8000"]);
    }

    #[test]
    fn bounds_on_interval_ports_and_header_values() {
        let base = "cluster: k8s\nselector: {matchLabels: {a: b}}\n";
        for (extra, expected) in [
            (
                "targetPorts: [80]\ninterval: 50ms",
                "interval: 50ms is below the minimum of 100ms",
            ),
            (
                "targetPorts: [80]\ninterval: 1000h",
                "interval: 3600000s is above the maximum of 3600s",
            ),
            ("targetPorts: [0]", "none of them 0"),
            (
                "targetPorts: [80]\nbearerToken: 'a b'",
                "bearerToken must be visible ASCII",
            ),
            (
                "targetPorts: [80]\nauthority: \"k8s\\r\\nx: y\"",
                "authority must be visible ASCII",
            ),
            (
                "targetPorts: [80]\nnamespace: ''",
                "namespace must not be empty",
            ),
        ] {
            let error = config(&format!("{base}{extra}")).validate().unwrap_err();
            assert!(error.contains(expected), "{extra}: {error}");
        }
        let ports: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        let error = config(&format!("{base}targetPorts: [{}]", ports.join(",")))
            .validate()
            .unwrap_err();
        assert!(
            error.contains("65 ports is above the maximum of 64 ports"),
            "{error}"
        );
        assert!(config(&format!("{base}targetPorts: [80]\ninterval: 1h"))
            .validate()
            .is_ok());
    }

    #[test]
    fn an_answer_over_the_endpoint_bound_is_refused() {
        let discovery =
            config("{cluster: k8s, targetPorts: [1, 2], selector: {matchLabels: {a: b}}}");
        let count = limits::ENDPOINTS.max / 2 + 1;
        let items: Vec<String> = (0..count)
            .map(|i| {
                format!(
                    r#"{{"status":{{"phase":"Running","podIP":"10.{}.{}.{}","conditions":[{{"type":"Ready","status":"True"}}]}}}}"#,
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                )
            })
            .collect();
        let body = format!(r#"{{"items":[{}]}}"#, items.join(","));
        let error = discovery.endpoints(body.as_bytes()).unwrap_err();
        assert!(
            error.contains("65538 endpoints is above the maximum of 65536"),
            "{error}"
        );
    }

    #[test]
    fn endpoint_slices() {
        let discovery = config(
            "{cluster: k8s, namespace: llm, targetPorts: [8000], resource: endpointslices, selector: {matchLabels: {kubernetes.io/service-name: vllm}}}",
        );
        assert_eq!(
            discovery.list_path(),
            "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dvllm"
        );
        let body = br#"{"kind":"EndpointSliceList","items":[{"metadata":{"labels":{"kubernetes.io/service-name":"vllm"}},
          "ports":[{"name":"http","port":8000}],
          "endpoints":[{"addresses":["10.0.0.2"],"conditions":{"ready":true}},
                       {"addresses":["10.0.0.3"],"conditions":{"ready":false}},
                       {"addresses":["10.0.0.4"]},
                       {"addresses":["10.0.0.5"],"conditions":{"ready":true,"terminating":true}}]}]}"#;
        let endpoints = discovery.endpoints(body).unwrap();
        let addresses: Vec<&str> = endpoints.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.2:8000", "10.0.0.4:8000"]);
        assert_eq!(endpoints[0].1["kubernetes.io/service-name"], "vllm");
    }
}
