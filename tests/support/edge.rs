//! Which of the picker's two edges the Envoy tests run: the proxy-wasm filter (the default) or
//! the native dynamic module (`INFERENCE_PICKER_EDGE=module`). Every test config is written for
//! the wasm filter; for the module, [`to_module_edge`] swaps the filter the way
//! `envoy/envoy-module.yaml` differs from `envoy/envoy.yaml` (a test holds the two to it), so one
//! suite runs against both.

use super::processes::repo;
use serde_yaml::Value;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    Wasm,
    Module,
}

pub const EDGE_VARIABLE: &str = "INFERENCE_PICKER_EDGE";
pub const MODULE_FILTER: &str = "envoy.filters.http.dynamic_modules";
const WASM_FILTER: &str = "envoy.filters.http.wasm";
const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

impl Edge {
    /// The edge this test run uses.
    pub fn current() -> Edge {
        match std::env::var(EDGE_VARIABLE).as_deref() {
            Ok("module") => Edge::Module,
            Ok("wasm") | Err(_) => Edge::Wasm,
            Ok(other) => panic!("{EDGE_VARIABLE}={other}: expected wasm or module"),
        }
    }

    /// Envoy's logger for the picker's lines.
    pub fn log_component(self) -> &'static str {
        match self {
            Edge::Wasm => "wasm",
            Edge::Module => "dynamic_modules",
        }
    }
}

/// The value of a series (`name{labels}`) in `/stats/prometheus` text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The directory Envoy loads `libinference_picker_module.so` from.
pub fn module_dir() -> PathBuf {
    let dir = repo().join("target/release-module");
    let module = dir.join("libinference_picker_module.so");
    assert!(
        module.exists(),
        "{} is missing: run `make build` (make test does it)",
        module.display()
    );
    dir
}

/// The runtime envoy/envoy-module.yaml sets: Envoy 1.40 strips a dynamic module's
/// `metrics_namespace` in `/stats/prometheus` only with this flag on.
fn module_runtime() -> Value {
    let yaml = r#"
layers:
- name: static
  static_layer:
    envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix: true
- name: admin
  admin_layer: {}
"#;
    serde_yaml::from_str(yaml).expect("the runtime parses")
}

/// The module's filter carrying `picker_config`, as envoy/envoy-module.yaml writes it.
fn module_filter(picker_config: &Value) -> Value {
    let yaml = r#"
name: envoy.filters.http.dynamic_modules
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
  dynamic_module_config:
    name: inference_picker_module
    do_not_close: true
    metrics_namespace: wasmcustom
  filter_name: inference_picker
  filter_config:
    "@type": type.googleapis.com/google.protobuf.StringValue
"#;
    let mut filter: Value = serde_yaml::from_str(yaml).expect("the module filter parses");
    filter["typed_config"]["filter_config"]["value"] = picker_config.clone();
    filter
}

/// `config` (an Envoy bootstrap written for the wasm filter) for the module: each listener's
/// wasm filter becomes the module's, with the same picker configuration; the
/// header_to_metadata step the module does itself goes; the pool clusters' override_host reads
/// the metadata the module writes instead of the header; the runtime flag that gives the
/// module's series the wasm filter's names in `/stats/prometheus` is on.
pub fn to_module_edge(config: &mut Value) {
    if let Some(bootstrap) = config.as_mapping_mut() {
        bootstrap.insert("layered_runtime".into(), module_runtime());
    }
    for listener in items(config, &["static_resources", "listeners"]) {
        for chain in items(listener, &["filter_chains"]) {
            for network_filter in items(chain, &["filters"]) {
                swap_http_filters(network_filter);
            }
        }
    }
    for cluster in items(config, &["static_resources", "clusters"]) {
        for policy in items(cluster, &["load_balancing_policy", "policies"]) {
            let path = [
                "typed_extension_config",
                "typed_config",
                "override_host_sources",
            ];
            for source in items(policy, &path) {
                read_destination_from_metadata(source);
            }
        }
    }
}

/// The list at `path` under `value`, empty when there is none (nothing is inserted).
fn items<'a>(value: &'a mut Value, path: &[&str]) -> std::slice::IterMut<'a, Value> {
    let mut at = Some(value);
    for key in path {
        at = at.and_then(|value| value.get_mut(*key));
    }
    match at.and_then(Value::as_sequence_mut) {
        Some(list) => list.iter_mut(),
        None => [].iter_mut(),
    }
}

fn swap_http_filters(network_filter: &mut Value) {
    let Some(filters) = network_filter
        .get_mut("typed_config")
        .and_then(|config| config.get_mut("http_filters"))
        .and_then(Value::as_sequence_mut)
    else {
        return;
    };
    filters.retain(|filter| !copies_destination_to_metadata(filter));
    for filter in filters.iter_mut() {
        if filter["name"] == WASM_FILTER {
            *filter = module_filter(&filter["typed_config"]["config"]["configuration"]["value"]);
        }
    }
}

/// A header_to_metadata filter that only copies the picker's destination headers.
fn copies_destination_to_metadata(filter: &Value) -> bool {
    filter["name"] == "envoy.filters.http.header_to_metadata"
        && filter["typed_config"]["request_rules"]
            .as_sequence()
            .is_some_and(|rules| {
                rules.iter().all(|rule| {
                    rule["header"]
                        .as_str()
                        .is_some_and(|header| header.starts_with(DESTINATION_HEADER))
                })
            })
}

fn read_destination_from_metadata(source: &mut Value) {
    if source
        .get("header")
        .is_some_and(|header| header == DESTINATION_HEADER)
    {
        *source = serde_yaml::from_str(
            "{metadata: {key: envoy.lb, path: [{key: x-gateway-destination-endpoint}]}}",
        )
        .expect("the metadata source parses");
    }
}
