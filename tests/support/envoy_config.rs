//! Envoy and picker configuration rendering: the repository's Envoy YAML files read through
//! typed accessors ([`EnvoyConfig`], [`Listener`]) rather than deep `["static_resources"]...`
//! indexing, and the picker configuration with its pool rewritten to the test's pods.

use super::processes::{repo, Sim};
use serde_yaml::{Mapping, Value};
use std::borrow::{Borrow, BorrowMut};
use std::ops::{Deref, DerefMut};
use std::path::Path;

/// The wasm filter's name in the repository's Envoy configs.
pub const WASM_FILTER: &str = "envoy.filters.http.wasm";

/// One Envoy bootstrap document. Derefs to the YAML value for anything without an accessor.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyConfig(Value);

impl EnvoyConfig {
    /// A config file of the repository, e.g. `envoy/envoy.yaml`.
    pub fn load(relative: &str) -> EnvoyConfig {
        let text = std::fs::read_to_string(repo().join(relative)).expect(relative);
        EnvoyConfig::parse(&text)
    }

    pub fn parse(text: &str) -> EnvoyConfig {
        EnvoyConfig(serde_yaml::from_str(text).expect("the Envoy config parses"))
    }

    pub fn render(&self) -> String {
        serde_yaml::to_string(&self.0).expect("render the Envoy config")
    }

    pub fn set_admin_port(&mut self, port: u16) {
        self.0["admin"]["address"]["socket_address"]["port_value"] = port.into();
    }

    /// `static_resources.listeners`.
    pub fn listeners(&self) -> &Vec<Value> {
        sequence(&self.0["static_resources"]["listeners"], "listeners")
    }

    /// `static_resources.listeners[i]`.
    pub fn listener(&self, i: usize) -> Listener<&Value> {
        Listener(&self.listeners()[i])
    }

    pub fn listener_mut(&mut self, i: usize) -> Listener<&mut Value> {
        let listeners = sequence_mut(&mut self.0["static_resources"]["listeners"], "listeners");
        Listener(&mut listeners[i])
    }

    /// Removes the static listeners (e.g. to serve them through LDS instead).
    pub fn take_listeners(&mut self) -> Vec<Value> {
        let removed = self.0["static_resources"]
            .as_mapping_mut()
            .and_then(|resources| resources.remove("listeners"));
        match removed {
            Some(Value::Sequence(listeners)) => listeners,
            _ => Vec::new(),
        }
    }

    /// The first listener's HTTP filter chain.
    pub fn http_filters(&self) -> &Vec<Value> {
        self.listener(0).into_http_filters()
    }

    pub fn http_filters_mut(&mut self) -> &mut Vec<Value> {
        self.listener_mut(0).into_http_filters_mut()
    }

    /// The first listener's wasm filter `config` (`vm_config`, `configuration`, ...).
    pub fn wasm_config(&self) -> &Value {
        self.listener(0).into_wasm_config()
    }

    pub fn wasm_config_mut(&mut self) -> &mut Value {
        self.listener_mut(0).into_wasm_config_mut()
    }

    /// The picker configuration the first listener's wasm filter carries.
    pub fn picker_config(&self) -> String {
        self.listener(0).picker_config()
    }

    /// `static_resources.clusters`.
    pub fn clusters(&self) -> &Vec<Value> {
        sequence(&self.0["static_resources"]["clusters"], "clusters")
    }

    pub fn clusters_mut(&mut self) -> &mut Vec<Value> {
        sequence_mut(&mut self.0["static_resources"]["clusters"], "clusters")
    }

    pub fn cluster(&self, name: &str) -> &Value {
        self.clusters()
            .iter()
            .find(|cluster| cluster["name"] == name)
            .unwrap_or_else(|| panic!("no cluster {name}"))
    }

    /// The clusters that route on the picker's header with Envoy's override_host policy: the
    /// pool as Envoy knows it.
    pub fn pool_clusters_mut(&mut self) -> impl Iterator<Item = &mut Value> {
        self.clusters_mut()
            .iter_mut()
            .filter(|cluster| is_pool_cluster(cluster))
    }

    /// Lists the picker configuration's `pool.endpoints` as the members of every pool cluster,
    /// as a deployment lists them in both places.
    pub fn set_pool_members(&mut self, picker_config: &str) {
        let picker: Value = serde_yaml::from_str(picker_config).expect("picker config parses");
        let members_of = |pool: &Value| -> Vec<Value> {
            pool["endpoints"]
                .as_sequence()
                .map(|endpoints| {
                    endpoints
                        .iter()
                        .filter_map(|e| e["address"].as_str())
                        .map(lb_endpoint)
                        .collect()
                })
                .unwrap_or_default()
        };
        // Many pools: cluster `pool_<name>` holds pool <name>'s members, any other every
        // pool's.
        let pools = picker["pools"].as_sequence().cloned().unwrap_or_default();
        for cluster in self.pool_clusters_mut() {
            let name = cluster["name"].as_str().unwrap_or_default().to_owned();
            let own = pools.iter().find(|pool| {
                pool["name"].as_str().map(|n| format!("pool_{n}")).as_ref() == Some(&name)
            });
            let members = match own {
                _ if pools.is_empty() => members_of(&picker["pool"]),
                Some(pool) => members_of(pool),
                None => pools.iter().flat_map(members_of).collect(),
            };
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = Value::Sequence(members);
        }
    }

    pub fn cluster_mut(&mut self, name: &str) -> &mut Value {
        self.clusters_mut()
            .iter_mut()
            .find(|cluster| cluster["name"] == name)
            .unwrap_or_else(|| panic!("no cluster {name}"))
    }
}

impl Deref for EnvoyConfig {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.0
    }
}

impl DerefMut for EnvoyConfig {
    fn deref_mut(&mut self) -> &mut Value {
        &mut self.0
    }
}

/// One listener, held by reference into an [`EnvoyConfig`] or owned (a listener served by LDS).
/// Assumes the repository's shape: one filter chain whose first filter is the HTTP connection
/// manager.
pub struct Listener<T>(pub T);

impl<T: Borrow<Value>> Listener<T> {
    pub fn value(&self) -> &Value {
        self.0.borrow()
    }

    /// The HTTP connection manager's `typed_config`.
    pub fn http_connection_manager(&self) -> &Value {
        &self.value()["filter_chains"][0]["filters"][0]["typed_config"]
    }

    pub fn port(&self) -> Option<u64> {
        self.value()["address"]["socket_address"]["port_value"].as_u64()
    }

    pub fn http_filters(&self) -> &Vec<Value> {
        sequence(
            &self.http_connection_manager()["http_filters"],
            "http_filters",
        )
    }

    pub fn http_filter(&self, name: &str) -> Option<&Value> {
        self.http_filters().iter().find(|f| f["name"] == name)
    }

    /// The wasm filter's `config`.
    pub fn wasm_config(&self) -> &Value {
        &self
            .http_filter(WASM_FILTER)
            .expect("the listener has the wasm filter")["typed_config"]["config"]
    }

    pub fn picker_config(&self) -> String {
        self.wasm_config()["configuration"]["value"]
            .as_str()
            .expect("picker configuration string")
            .to_string()
    }
}

impl<'a> Listener<&'a Value> {
    fn into_http_filters(self) -> &'a Vec<Value> {
        sequence(
            &self.0["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"],
            "http_filters",
        )
    }

    fn into_wasm_config(self) -> &'a Value {
        &self
            .into_http_filters()
            .iter()
            .find(|f| f["name"] == WASM_FILTER)
            .expect("the listener has the wasm filter")["typed_config"]["config"]
    }
}

impl<'a> Listener<&'a mut Value> {
    fn into_http_filters_mut(self) -> &'a mut Vec<Value> {
        sequence_mut(
            &mut self.0["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"],
            "http_filters",
        )
    }

    fn into_wasm_config_mut(self) -> &'a mut Value {
        &mut self
            .into_http_filters_mut()
            .iter_mut()
            .find(|f| f["name"] == WASM_FILTER)
            .expect("the listener has the wasm filter")["typed_config"]["config"]
    }
}

impl<T: BorrowMut<Value>> Listener<T> {
    pub fn value_mut(&mut self) -> &mut Value {
        self.0.borrow_mut()
    }

    pub fn http_connection_manager_mut(&mut self) -> &mut Value {
        &mut self.value_mut()["filter_chains"][0]["filters"][0]["typed_config"]
    }

    pub fn set_port(&mut self, port: u16) {
        self.value_mut()["address"]["socket_address"]["port_value"] = port.into();
    }

    /// The path of the connection manager's (first) access log.
    pub fn set_access_log_path(&mut self, path: &Path) {
        self.http_connection_manager_mut()["access_log"][0]["typed_config"]["path"] =
            path.display().to_string().into();
    }

    pub fn http_filters_mut(&mut self) -> &mut Vec<Value> {
        sequence_mut(
            &mut self.http_connection_manager_mut()["http_filters"],
            "http_filters",
        )
    }

    pub fn http_filter_mut(&mut self, name: &str) -> Option<&mut Value> {
        self.http_filters_mut()
            .iter_mut()
            .find(|f| f["name"] == name)
    }

    pub fn wasm_config_mut(&mut self) -> &mut Value {
        &mut self
            .http_filter_mut(WASM_FILTER)
            .expect("the listener has the wasm filter")["typed_config"]["config"]
    }

    /// Points the wasm VM at a module file.
    pub fn set_wasm_file(&mut self, path: &Path) {
        self.wasm_config_mut()["vm_config"]["code"]["local"]["filename"] =
            path.display().to_string().into();
    }

    /// The listener's peer address (`additional_addresses`, `pool.peers.port`) on `port`;
    /// none without one.
    pub fn set_peer_port(&mut self, port: Option<u16>) {
        let listener = self.value_mut();
        let Some(map) = listener.as_mapping_mut() else {
            return;
        };
        match port {
            Some(port) => {
                let address = format!(
                    "{{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}"
                );
                let address: Value = serde_yaml::from_str(&address).expect("address");
                map.insert(
                    "additional_addresses".into(),
                    Value::Sequence(vec![address]),
                );
            }
            None => {
                map.remove("additional_addresses");
            }
        }
    }

    pub fn set_picker_config(&mut self, picker_config: &str) {
        self.wasm_config_mut()["configuration"]["value"] = picker_config.into();
    }
}

fn sequence<'a>(value: &'a Value, what: &str) -> &'a Vec<Value> {
    value
        .as_sequence()
        .unwrap_or_else(|| panic!("{what} is not a list"))
}

fn sequence_mut<'a>(value: &'a mut Value, what: &str) -> &'a mut Vec<Value> {
    if value.is_null() {
        *value = Value::Sequence(Vec::new());
    }
    value
        .as_sequence_mut()
        .unwrap_or_else(|| panic!("{what} is not a list"))
}

/// A cluster with Envoy's override_host load-balancing policy.
pub fn is_pool_cluster(cluster: &Value) -> bool {
    cluster["load_balancing_policy"]["policies"]
        .as_sequence()
        .is_some_and(|policies| {
            policies.iter().any(|p| {
                p["typed_extension_config"]["name"] == "envoy.load_balancing_policies.override_host"
            })
        })
}

/// The `ip:port` members of a STATIC cluster, in order.
pub fn cluster_members(cluster: &Value) -> Vec<String> {
    cluster["load_assignment"]["endpoints"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|locality| locality["lb_endpoints"].as_sequence().into_iter().flatten())
        .map(|e| {
            let socket = &e["endpoint"]["address"]["socket_address"];
            let host = socket["address"].as_str().unwrap_or("");
            let port = socket["port_value"].as_u64().unwrap_or(0);
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        })
        .collect()
}

/// A STATIC cluster `name` with one endpoint per `host:port` address.
pub fn static_cluster(name: &str, addresses: &[&str]) -> Value {
    let endpoints: Vec<Value> = addresses.iter().map(|a| lb_endpoint(a)).collect();
    let mut cluster: Value = serde_yaml::from_str(&format!(
        "{{name: {name}, type: STATIC, connect_timeout: 1s, \
          load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: []}}]}}}}"
    ))
    .expect("cluster");
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = Value::Sequence(endpoints);
    cluster
}

/// One `lb_endpoints` entry for a `host:port` address.
pub fn lb_endpoint(address: &str) -> Value {
    let (host, port) = address.rsplit_once(':').expect("host:port");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    serde_yaml::from_str(&format!(
        "endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}}}"
    ))
    .expect("endpoint")
}

// ---------------------------------------------------------------- picker configuration

/// The shipped `envoy/envoy.yaml`.
pub fn shipped_envoy_config() -> EnvoyConfig {
    EnvoyConfig::load("envoy/envoy.yaml")
}

/// The picker configuration inside one of the repository's Envoy configs.
pub fn picker_config_of(relative: &str) -> String {
    EnvoyConfig::load(relative).picker_config()
}

/// The picker configuration shipped in `envoy/envoy.yaml`.
pub fn shipped_picker_config() -> String {
    shipped_envoy_config().picker_config()
}

/// A config from `examples/configs/`.
pub fn example_config(name: &str) -> String {
    std::fs::read_to_string(repo().join("examples/configs").join(name)).expect("example config")
}

/// `picker_config` with its `pool.endpoints` addresses replaced by the given pods, in order;
/// the labels of the i-th configured endpoint stay with the i-th pod.
pub fn with_endpoints(picker_config: &str, sims: &[&Sim]) -> String {
    let addresses: Vec<&str> = sims.iter().map(|sim| sim.address.as_str()).collect();
    with_addresses(picker_config, &addresses)
}

/// `with_endpoints` from addresses.
pub fn with_addresses(picker_config: &str, addresses: &[&str]) -> String {
    let mut config: Value = serde_yaml::from_str(picker_config).expect("picker config parses");
    let configured = config["pool"]["endpoints"].clone();
    let endpoints: Vec<Value> = addresses
        .iter()
        .enumerate()
        .map(|(i, address)| {
            let mut endpoint = Mapping::new();
            endpoint.insert("address".into(), (*address).into());
            if let Some(labels) = configured.get(i).and_then(|e| e.get("labels")) {
                endpoint.insert("labels".into(), labels.clone());
            }
            Value::Mapping(endpoint)
        })
        .collect();
    config["pool"]["endpoints"] = Value::Sequence(endpoints);
    serde_yaml::to_string(&config).expect("serialize picker config")
}

/// `picker_config` with the endpoints of its `pools[]` entry named `pool` replaced by these pods.
pub fn with_pool_endpoints(picker_config: &str, pool: &str, sims: &[&Sim]) -> String {
    let mut config: Value = serde_yaml::from_str(picker_config).expect("picker config parses");
    let entries = config["pools"].as_sequence_mut().expect("a pools list");
    let entry = entries
        .iter_mut()
        .find(|entry| entry["name"] == pool)
        .unwrap_or_else(|| panic!("no pool {pool}"));
    let endpoints: Vec<Value> = sims
        .iter()
        .map(|sim| {
            serde_yaml::from_str(&format!("{{address: '{}'}}", sim.address)).expect("endpoint")
        })
        .collect();
    entry["endpoints"] = Value::Sequence(endpoints);
    serde_yaml::to_string(&config).expect("serialize picker config")
}

/// `picker_config` with keys of its `pool` section set from a YAML mapping (`"a: 1, b: 2"`).
pub fn with_pool_keys(picker_config: &str, keys: &str) -> String {
    let mut config: Value = serde_yaml::from_str(picker_config).expect("picker config parses");
    let extra: Mapping = serde_yaml::from_str(&format!("{{{keys}}}")).expect("pool keys");
    for (key, value) in extra {
        config["pool"][key] = value;
    }
    serde_yaml::to_string(&config).expect("serialize picker config")
}
