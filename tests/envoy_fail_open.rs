//! The fail-open path: `envoy/envoy-fail-open.yaml` is `envoy/envoy.yaml` with the three
//! changes it documents, and with it a filter VM that fails mid-traffic leaves the pool
//! serving; with the shipped fail-closed config the same failure is a 503.
//!
//! The VM is made to fail with the filter built with its `fault-injection` feature
//! (`make fault-filter`): a request carrying `x-inference-picker-fault: trap` aborts it, as a
//! bug would. The shipped artefact has no such switch.

mod support;

use serde_yaml::Value;
use std::path::PathBuf;
use support::{completion, repo, shipped_picker_config, with_endpoints, Envoy, Sim};

const FAIL_OPEN: &str = "envoy/envoy-fail-open.yaml";
const FAULT_HEADER: &str = "x-inference-picker-fault";

fn fault_wasm() -> PathBuf {
    let path = repo().join("target/faults/wasm32-wasip1/release/inference_picker.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make fault-filter` (make test does it)",
        path.display()
    );
    path
}

fn yaml(relative: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(relative)).expect(relative);
    serde_yaml::from_str(&text).expect("parses")
}

fn http_filters(config: &mut Value) -> &mut Vec<Value> {
    let filters = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    match filters {
        Value::Sequence(filters) => filters,
        other => panic!("http_filters is not a list: {other:?}"),
    }
}

fn pool_cluster(config: &mut Value) -> &mut Value {
    let Value::Sequence(clusters) = &mut config["static_resources"]["clusters"] else {
        panic!("no clusters");
    };
    clusters
        .iter_mut()
        .find(|c| c["name"] == "inference_pool")
        .expect("the inference_pool cluster")
}

#[test]
fn the_fail_open_config_is_the_shipped_one_with_its_three_changes() {
    let mut shipped = yaml("envoy/envoy.yaml");
    let mut fail_open = yaml(FAIL_OPEN);
    // 2: the client's destination headers are removed ahead of the filter.
    let strip = http_filters(&mut fail_open).remove(0);
    assert_eq!(strip["name"], "envoy.filters.http.header_mutation");
    let removed: Vec<&str> = strip["typed_config"]["mutations"]["request_mutations"]
        .as_sequence()
        .expect("request mutations")
        .iter()
        .filter_map(|m| m["remove"].as_str())
        .collect();
    assert_eq!(
        removed,
        [
            "x-gateway-destination-endpoint",
            "x-gateway-destination-endpoint-fallback"
        ]
    );
    // 1: the failure policy.
    let wasm = |config: &mut Value| {
        let filter = http_filters(config)
            .iter_mut()
            .find(|f| f["name"] == "envoy.filters.http.wasm")
            .expect("the wasm filter");
        filter["typed_config"]["config"]["failure_policy"].clone()
    };
    assert_eq!(wasm(&mut shipped), "FAIL_CLOSED");
    assert_eq!(wasm(&mut fail_open), "FAIL_OPEN");
    // 3: the balancer past the picks.
    let fallback = |config: &mut Value| {
        pool_cluster(config)["load_balancing_policy"]["policies"][0]["typed_extension_config"]
            ["typed_config"]["fallback_policy"]
            .clone()
    };
    let open_fallback = fallback(&mut fail_open);
    assert_eq!(
        open_fallback["policies"][0]["typed_extension_config"]["name"],
        "envoy.load_balancing_policies.least_request"
    );
    // Nothing else differs.
    let set = |config: &mut Value, failure: &str, lb: &Value| {
        let filter = http_filters(config)
            .iter_mut()
            .find(|f| f["name"] == "envoy.filters.http.wasm")
            .expect("the wasm filter");
        filter["typed_config"]["config"]["failure_policy"] = Value::from(failure);
        pool_cluster(config)["load_balancing_policy"]["policies"][0]["typed_extension_config"]
            ["typed_config"]["fallback_policy"] = lb.clone();
    };
    set(&mut fail_open, "FAIL_CLOSED", &fallback(&mut shipped));
    assert!(
        fail_open == shipped,
        "envoy-fail-open.yaml differs from envoy.yaml beyond its three changes"
    );
}

/// Starts `base` on the filter built with fault injection, one worker (one VM to fail).
fn gateway(base: &str, sims: &[&Sim]) -> Envoy {
    let wasm = fault_wasm();
    let envoy = Envoy::start_from(
        base,
        &with_endpoints(&shipped_picker_config(), sims),
        1,
        |config| config.listener_mut(0).set_wasm_file(&wasm),
    );
    envoy.wait_for_fresh_endpoints(sims.len());
    envoy
}

/// Aborts the VM with one request, and waits for Envoy to say so.
fn fail_the_vm(envoy: &Envoy) {
    let trapped = envoy.post_with(
        "/v1/completions",
        &[("content-type", "application/json"), (FAULT_HEADER, "trap")],
        &completion(0),
    );
    assert_ne!(trapped.status, 200, "the trapping request is not served");
    assert!(
        envoy
            .wait_for_log_line("fault injection: aborting the VM")
            .is_some(),
        "{}",
        envoy.log()
    );
}

/// The value of `name=` in an access-log line (`envoy.yaml`'s format), "" if it has none.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(key.as_str()))
        .unwrap_or("")
}

/// Requests sent once the VM has failed, to each config.
const AFTER_FAILURE: usize = 12;

#[test]
fn with_the_vm_failed_fail_open_keeps_the_pool_serving_and_fail_closed_refuses() {
    let (a, b) = (Sim::start("pod-a", &[]), Sim::start("pod-b", &[]));
    let pool = [a.address.as_str(), b.address.as_str()];
    let envoy = gateway(FAIL_OPEN, &[&a, &b]);
    let picked = envoy.post("/v1/completions", &completion(1));
    assert_eq!(picked.status, 200, "{}", picked.text());
    envoy.wait_for_decisions(1);

    fail_the_vm(&envoy);
    // Every later request is served by a pool member, with no pick, whatever pod it names.
    let mut pods = Vec::new();
    for n in 0..AFTER_FAILURE {
        let response = envoy.post_with(
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-gateway-destination-endpoint", a.address.as_str()),
            ],
            &completion(n + 2),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        pods.push(response.pod());
    }
    assert!(
        pods.iter().any(|p| p == "pod-b"),
        "a client's destination header steered every request: {pods:?}"
    );
    // One line per request (one worker: in order): the picked one, the trapping one, then
    // those served with the VM failed.
    let lines = envoy.access_log(2 + AFTER_FAILURE);
    assert_eq!(lines.len(), 2 + AFTER_FAILURE, "{lines:#?}");
    let picks = field(&lines[0], "destination");
    assert!(
        picks.split(',').all(|pick| pool.contains(&pick)),
        "the live filter wrote its picks: {}",
        lines[0]
    );
    for line in &lines[2..] {
        assert_eq!(
            field(line, "destination"),
            "-",
            "the failed filter picked nothing: {line}"
        );
        assert!(
            pool.contains(&field(line, "upstream")),
            "the balancer sent it to a pool member: {line}"
        );
    }

    // The shipped config, same failure: every request refused, none reaches a pod.
    let closed = gateway("envoy/envoy.yaml", &[&a, &b]);
    fail_the_vm(&closed);
    let served = a.requests_total() + b.requests_total();
    let statuses: Vec<u16> = (0..AFTER_FAILURE)
        .map(|n| closed.post("/v1/completions", &completion(20 + n)).status)
        .collect();
    assert!(
        statuses.iter().all(|&status| status == 503),
        "fail-closed answers: {statuses:?}"
    );
    assert_eq!(
        a.requests_total() + b.requests_total(),
        served,
        "a refused request reached a pod"
    );
}
