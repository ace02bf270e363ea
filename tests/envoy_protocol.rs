//! The GIE protocol's 2026 additions in a real Envoy (`envoy/envoy.yaml`): the proxy's subset
//! hint (filter metadata `envoy.lb_subset_hint`) narrows the pick, the endpoint Envoy actually
//! served a retried request from learns its prompt, and the optional per-endpoint scores.

mod support;

use serde_yaml::Value;
use support::{
    shipped_picker_config, with_endpoints, with_pool_keys, Envoy, EnvoyConfig, Sim, MODEL,
};

/// Sets the subset hint the way a gateway does, ahead of the picker: a `set_metadata` filter
/// writing the list into `envoy.lb_subset_hint`.
fn with_subset_hint(addresses: &[&str]) -> impl Fn(&mut EnvoyConfig) {
    let list: Vec<String> = addresses.iter().map(|a| format!("'{a}'")).collect();
    let filter: Value = serde_yaml::from_str(&format!(
        "name: envoy.filters.http.set_metadata
typed_config:
  '@type': type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
  metadata:
  - metadata_namespace: envoy.lb_subset_hint
    value: {{x-gateway-destination-endpoint-subset: [{}]}}",
        list.join(", ")
    ))
    .expect("set_metadata filter");
    move |config: &mut EnvoyConfig| config.http_filters_mut().insert(0, filter.clone())
}

fn gateway(sims: &[&Sim], pool_keys: &str, adjust: impl Fn(&mut EnvoyConfig)) -> Envoy {
    let config = with_pool_keys(&with_endpoints(&shipped_picker_config(), sims), pool_keys);
    let envoy = Envoy::start_with(&config, 2, adjust);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

fn prompt(text: &str, n: usize) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":"{text} {n}","max_tokens":2}}"#)
}

#[test]
fn the_subset_hint_restricts_the_pick_and_an_empty_one_is_a_503() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "4"]);
    let c = Sim::start("pod-c", &["--background-waiting", "8"]);
    let envoy = gateway(
        &[&a, &b, &c],
        "passiveHealthBackoff: 5s",
        with_subset_hint(&[&b.address, &c.address]),
    );
    for n in 0..8 {
        let response = envoy.post("/v1/completions", &prompt("hello", n));
        assert_eq!(response.status, 200, "{}", response.text());
        // pod-a, the best by load, is outside the hint; pod-b is the best inside it.
        assert_eq!(response.pod(), "pod-b");
    }
    assert_eq!(a.requests_total(), 0);
    drop(envoy);

    let envoy = gateway(&[&a, &b, &c], "", with_subset_hint(&[]));
    let response = envoy.post("/v1/completions", &prompt("hello", 0));
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.json()["error"]["code"], 503);
    drop(envoy);

    // A hint naming only addresses outside the pool leaves no candidate either.
    let outsider = Sim::start("outsider", &[]);
    let envoy = gateway(&[&a, &b], "", with_subset_hint(&[&outsider.address]));
    let response = envoy.post("/v1/completions", &prompt("hello", 0));
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(outsider.requests_total(), 0);
}

/// A request picked for pod-a that pod-a refuses (503) is served by the fallback pod-b: the
/// prompt's blocks are learned for pod-b, so the next request sharing the prompt goes there,
/// even when another pod has the shorter queue (without it, the prefix index would point at
/// pod-a, which is now avoided, and the queue alone would decide).
#[test]
fn the_pod_that_served_a_retried_request_learns_its_prompt() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "1"]);
    let c = Sim::start("pod-c", &["--background-waiting", "2"]);
    a.admin(
        "fault",
        r#"{"mode":"error","status":503,"scope":"inference"}"#,
    );
    // Prefix homes off: this is about the learned index, and a home would pick the first pod
    // by the prompt rather than by the queues the test sets.
    let config = shipped_picker_config().replacen(
        "- type: prefix-cache-scorer\n",
        "- type: prefix-cache-scorer\n  parameters: {homeAffinity: false}\n",
        1,
    );
    assert!(config.contains("homeAffinity: false"));
    let envoy = Envoy::start(&with_endpoints(&config, &[&a, &b, &c]), 2);
    for sim in [&a, &b, &c] {
        sim.wait_for_scrapes(3);
    }
    let shared = "You are a careful assistant who answers in one short sentence. ".repeat(30);
    let response = envoy.post("/v1/completions", &prompt(&shared, 0));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.pod(), "pod-b", "retried on the first fallback");
    // Now pod-c has the shortest queue (pod-a is avoided after its 503); pod-b's is one
    // longer, within what prefix affinity tolerates.
    c.admin("load", r#"{"background_waiting":0}"#);
    for sim in [&b, &c] {
        sim.wait_for_scrapes(3);
    }
    let unrelated = envoy.post("/v1/completions", &prompt("an unrelated question", 1));
    assert_eq!(unrelated.pod(), "pod-c", "by load alone pod-c wins");
    let again = envoy.post("/v1/completions", &prompt(&shared, 2));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        again.pod(),
        "pod-b",
        "the prompt's blocks were learned where it was served"
    );
}

#[test]
fn scores_are_written_for_every_scored_endpoint_when_asked() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "5"]);
    // The scores header goes into envoy.lb as the GIE protocol reads it.
    let copy_scores = |config: &mut EnvoyConfig| {
        let filters = config.http_filters_mut();
        let metadata = filters
            .iter_mut()
            .find(|f| f["name"] == "envoy.filters.http.header_to_metadata")
            .expect("header_to_metadata");
        let rule: Value = serde_yaml::from_str(
            "{header: x-gateway-destination-endpoint-scores, on_header_present: {metadata_namespace: envoy.lb, key: x-gateway-destination-endpoint-scores, type: STRING}, remove: false}",
        )
        .unwrap();
        metadata["typed_config"]["request_rules"]
            .as_sequence_mut()
            .unwrap()
            .push(rule);
        let mut listener = config.listener_mut(0);
        let format = &mut listener.value_mut()["filter_chains"][0]["filters"][0]["typed_config"]
            ["access_log"][0]["typed_config"]["log_format"]["text_format_source"]["inline_string"];
        *format = "scores=%DYNAMIC_METADATA(envoy.lb:x-gateway-destination-endpoint-scores)% header=%REQ(x-gateway-destination-endpoint-scores)%\n".into();
    };
    let envoy = gateway(&[&a, &b], "emitEndpointScores: true", copy_scores);
    let response = envoy.post("/v1/completions", &prompt("hello", 0));
    assert_eq!(response.status, 200, "{}", response.text());
    let line = envoy.access_log(1).join("\n");
    let metadata = line
        .split("scores=")
        .nth(1)
        .and_then(|rest| rest.split(" header=").next())
        .unwrap_or_default();
    let scores: serde_json::Value =
        serde_json::from_str(metadata).unwrap_or_else(|e| panic!("{e}: {line}"));
    let score = |sim: &Sim| scores[&sim.address].as_f64().unwrap_or(f64::NAN);
    assert!(score(&a) > score(&b), "{line}");
    assert!(line.contains("header={"), "the pod received it too: {line}");
}
