//! `envoy/examples/<name>.yaml` is `envoy/envoy.yaml` with the picker configuration of
//! `examples/configs/<name>.yaml` in place of the shipped one and its endpoints as the pool
//! cluster's members, comments kept. This test keeps the files in step (run with
//! `UPDATE_ENVOY_EXAMPLES=1` to rewrite them); the Envoy plugin tests start Envoy from these
//! files. Every shipped config lists the same pool twice, once for the picker and once for
//! Envoy: a test checks that the lists agree.

mod support;

use support::{cluster_members, is_pool_cluster, repo, EnvoyConfig};

/// The addresses of a picker configuration's `pool.endpoints`.
fn pool_endpoints(picker: &str) -> Vec<String> {
    let picker: serde_yaml::Value = serde_yaml::from_str(picker).unwrap();
    picker["pool"]["endpoints"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|e| e["address"].as_str().map(String::from))
        .collect()
}

/// `envoy.yaml`'s text with the indented block under `value: |` replaced by `picker`, and the
/// pool cluster's `lb_endpoints` by the picker's endpoints.
fn render(envoy: &str, picker: &str) -> String {
    let mut out = String::new();
    let mut lines = envoy.lines().peekable();
    while let Some(line) = lines.next() {
        out.push_str(line);
        out.push('\n');
        if line.trim() == "- lb_endpoints:" {
            let indent = " ".repeat(line.len() - line.trim_start().len() + 2);
            while lines
                .peek()
                .is_some_and(|next| next.starts_with(&format!("{indent}- endpoint:")))
            {
                lines.next();
            }
            for address in pool_endpoints(picker) {
                let (host, port) = address.rsplit_once(':').unwrap();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                out.push_str(&format!(
                    "{indent}- endpoint: {{address: {{socket_address: {{address: {host}, port_value: {port}}}}}}}\n"
                ));
            }
        }
        if line.trim() == "value: |" {
            let indent = " ".repeat(line.len() - line.trim_start().len() + 2);
            while lines
                .peek()
                .is_some_and(|next| next.starts_with(&indent) || next.trim().is_empty())
            {
                lines.next();
            }
            for picker_line in picker.lines() {
                if picker_line.trim().is_empty() {
                    out.push('\n');
                } else {
                    out.push_str(&format!("{indent}{picker_line}\n"));
                }
            }
        }
    }
    out
}

#[test]
fn every_example_has_its_envoy_config() {
    let envoy = std::fs::read_to_string(repo().join("envoy/envoy.yaml")).unwrap();
    let update = std::env::var_os("UPDATE_ENVOY_EXAMPLES").is_some();
    std::fs::create_dir_all(repo().join("envoy/examples")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(repo().join("examples/configs"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    for name in names {
        let picker = std::fs::read_to_string(repo().join("examples/configs").join(&name)).unwrap();
        if let Some(envoy_file) = hand_written(&name) {
            let config = EnvoyConfig::load(envoy_file);
            assert_eq!(
                config.picker_config().trim_end(),
                picker.trim_end(),
                "{envoy_file}"
            );
            continue;
        }
        let header = format!(
            "# Generated from envoy/envoy.yaml with the picker configuration of\n\
             # examples/configs/{name} (its endpoints are the pool cluster's members);\n\
             # `UPDATE_ENVOY_EXAMPLES=1 cargo test --test envoy_examples` rewrites it. The tests\n\
             # run Envoy from this file.\n"
        );
        let rendered = format!("{header}{}", render(&envoy, &picker));
        let target = repo().join("envoy/examples").join(&name);
        if update {
            std::fs::write(&target, &rendered).unwrap();
        }
        let committed = std::fs::read_to_string(&target)
            .unwrap_or_else(|_| panic!("{} is missing", target.display()));
        assert_eq!(
            committed, rendered,
            "{name} is stale: UPDATE_ENVOY_EXAMPLES=1 cargo test --test envoy_examples"
        );
        // The embedded configuration is the example's, byte for byte.
        let config = EnvoyConfig::parse(&committed);
        assert_eq!(
            config.picker_config().trim_end(),
            picker.trim_end(),
            "{name}"
        );
        assert!(is_pool_cluster(config.cluster("inference_pool")), "{name}");
    }
}

/// Examples whose Envoy config is written by hand rather than generated from envoy.yaml (one
/// cluster per pool): the Envoy file must embed the example unchanged.
fn hand_written(example: &str) -> Option<&'static str> {
    (example == "multi-pool.yaml").then_some("envoy/envoy-multi-pool.yaml")
}

/// Every pool cluster of the multi-pool config lists exactly its pool's endpoints.
#[test]
fn each_pool_cluster_lists_its_pools_endpoints() {
    let config = EnvoyConfig::load("envoy/envoy-multi-pool.yaml");
    let picker: serde_yaml::Value = serde_yaml::from_str(&config.picker_config()).unwrap();
    let pools = picker["pools"].as_sequence().unwrap();
    assert_eq!(pools.len(), 3);
    for pool in pools {
        let name = pool["name"].as_str().unwrap();
        let endpoints = pool_endpoints(
            &serde_yaml::to_string(&serde_yaml::Value::Mapping(
                [("pool".into(), pool.clone())].into_iter().collect(),
            ))
            .unwrap(),
        );
        let cluster = config.cluster(&format!("pool_{name}"));
        assert!(is_pool_cluster(cluster), "pool_{name}");
        assert_eq!(cluster_members(cluster), endpoints, "pool_{name}");
    }
}

#[test]
fn the_pool_cluster_lists_the_pickers_endpoints() {
    let mut files = vec!["envoy/envoy.yaml".to_string()];
    for entry in std::fs::read_dir(repo().join("envoy/examples")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        files.push(format!("envoy/examples/{name}"));
    }
    for file in files {
        let config = EnvoyConfig::load(&file);
        let members = cluster_members(config.cluster("inference_pool"));
        assert_eq!(members, pool_endpoints(&config.picker_config()), "{file}");
    }
}

/// The scrapes' cluster of a shipped Envoy config: the one the picker's `pool.metricsCluster`
/// names (or its default), which no route uses and whose circuit breakers leave room for a
/// large pool (Envoy's defaults, 1,024, overflow from about 1,024 endpoints on).
fn check_metrics_cluster(file: &str) {
    let config = EnvoyConfig::load(file);
    let set = inference_picker_core::config::load_set(&config.picker_config(), 1, false)
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    // Pools sharing a metrics cluster share its breakers.
    let mut in_flight_by_cluster: std::collections::BTreeMap<&str, usize> = Default::default();
    for pool in &set.pools {
        let settings = &pool.config.pool;
        *in_flight_by_cluster
            .entry(settings.metrics_cluster.as_str())
            .or_default() += settings.max_scrapes_in_flight;
    }
    let listener = config.listener(0);
    let routes = &listener.http_connection_manager()["route_config"]["virtual_hosts"];
    let routed: Vec<&str> = routes
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|host| host["routes"].as_sequence().into_iter().flatten())
        .filter_map(|route| route["route"]["cluster"].as_str())
        .collect();
    assert!(!routed.is_empty(), "{file}: no routed cluster found");
    for (name, in_flight) in in_flight_by_cluster {
        let cluster = config.cluster(name);
        assert!(
            !routed.contains(&name),
            "{file}: client requests must not share {name} with the scrapes"
        );
        let limits = &cluster["circuit_breakers"]["thresholds"][0];
        let limit = |key: &str| limits[key].as_u64().unwrap_or(1024) as usize;
        assert!(limit("max_requests") >= 2 * in_flight, "{file}: {limits:?}");
        assert!(
            limit("max_pending_requests") >= 2 * in_flight,
            "{file}: {limits:?}"
        );
        assert!(limit("max_connections") >= 16384, "{file}: {limits:?}");
        // Hosts dropped between two scrapes would be re-created every round, each time an
        // update of the whole host set on Envoy's main thread.
        let cleanup = cluster["cleanup_interval"].as_str().unwrap_or("5s");
        let seconds: u64 = cleanup.trim_end_matches('s').parse().unwrap_or(0);
        assert!(seconds >= 60, "{file}: cleanup_interval {cleanup}");
    }
}

#[test]
fn every_shipped_config_scrapes_through_a_cluster_of_its_own() {
    check_metrics_cluster("envoy/envoy.yaml");
    check_metrics_cluster("envoy/envoy-original-dst.yaml");
    check_metrics_cluster("envoy/envoy-multi-pool.yaml");
    for entry in std::fs::read_dir(repo().join("envoy/examples")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        check_metrics_cluster(&format!("envoy/examples/{name}"));
    }
}
