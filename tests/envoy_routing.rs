//! The filter in a real Envoy (`envoy/envoy.yaml`, `--concurrency 2`) in front of simulated
//! vLLM pods on loopback.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;
use support::{
    completion, eventually, shipped_picker_config, with_endpoints, with_pool_keys, Envoy, Sim,
    MODEL,
};

fn gateway(sims: &[&Sim]) -> Envoy {
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), sims), 2);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

fn picks(envoy: &Envoy, count: usize) -> BTreeMap<String, usize> {
    let mut picks = BTreeMap::new();
    for n in 0..count {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        *picks.entry(response.pod()).or_insert(0) += 1;
    }
    picks
}

fn only(pod: &str, count: usize) -> BTreeMap<String, usize> {
    BTreeMap::from([(pod.to_string(), count)])
}

#[test]
fn shortest_queue_wins_and_kv_cache_breaks_ties() {
    let a = Sim::start("pod-a", &["--background-waiting", "6"]);
    let b = Sim::start("pod-b", &[]);
    let c = Sim::start("pod-c", &["--background-waiting", "3"]);
    let envoy = gateway(&[&a, &b, &c]);
    assert_eq!(picks(&envoy, 12), only("pod-b", 12));

    a.admin("load", r#"{"background_waiting":0,"background_kv":0.7}"#);
    b.admin("load", r#"{"background_waiting":0,"background_kv":0.6}"#);
    c.admin("load", r#"{"background_waiting":0,"background_kv":0.1}"#);
    for sim in [&a, &b, &c] {
        sim.wait_for_scrapes(3);
    }
    assert_eq!(picks(&envoy, 12), only("pod-c", 12));
}

/// Eight requests at once onto four idle pods, between two scrapes: every pick reads the same
/// scraped metrics, so on those alone they tie; the live load signals (the default) count each
/// placement at once, so the burst spreads two per pod.
#[test]
fn a_burst_between_two_scrapes_spreads_by_what_was_placed() {
    let sims: Vec<Sim> = (0..4)
        .map(|i| Sim::start(&format!("pod-{i}"), &["--time-scale", "1"]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let config = with_pool_keys(
        &with_endpoints(&shipped_picker_config(), &refs),
        "refreshMetricsInterval: 5s, metricsStalenessThreshold: 60s",
    );
    // One worker: the count is exact; across workers it is as of their last tick.
    let envoy = Envoy::start(&config, 1);
    for sim in &refs {
        sim.wait_for_scrapes(1);
    }
    // The pods counted the scrape; its answers reach the filter before the burst.
    eventually(
        "every pod's metrics to reach the filter",
        Duration::from_secs(5),
        || envoy.stat("wasmcustom.inference_picker.endpoints_fresh") == Some(4.0),
    );
    let scrapes_before: u64 = refs.iter().map(|sim| sim.metrics_scrapes()).sum();
    let body =
        |n: usize| format!(r#"{{"model":"{MODEL}","prompt":"burst request {n}","max_tokens":50}}"#);
    let pods: Vec<String> = std::thread::scope(|scope| {
        let requests: Vec<_> = (0..8)
            .map(|n| {
                let (envoy, body) = (&envoy, body(n));
                scope.spawn(move || envoy.post("/v1/completions", &body))
            })
            .collect();
        requests
            .into_iter()
            .map(|request| {
                let response = request.join().expect("request thread");
                assert_eq!(response.status, 200, "{}", response.text());
                response.pod()
            })
            .collect()
    });
    let scrapes_after: u64 = refs.iter().map(|sim| sim.metrics_scrapes()).sum();
    let mut picks = BTreeMap::new();
    for pod in pods {
        *picks.entry(pod).or_insert(0) += 1;
    }
    if scrapes_after == scrapes_before {
        let expected: BTreeMap<String, usize> = (0..4).map(|i| (format!("pod-{i}"), 2)).collect();
        assert_eq!(picks, expected);
    } else {
        // A scrape landed inside the burst (rare at 5 s): the KV usage it reports spreads the
        // rest, so no pod takes more than one extra.
        assert!(picks.values().all(|&n| n <= 3), "{picks:?}");
    }
}

#[test]
fn lora_requests_go_where_the_adapter_is_loaded() {
    let adapters = ["--adapters", "sql-lora,chat-lora,x,y,z", "--max-lora", "2"];
    let a = Sim::start(
        "pod-a",
        &[&adapters[..], &["--loaded-adapters", "chat-lora,x"]].concat(),
    );
    let b = Sim::start(
        "pod-b",
        &[&adapters[..], &["--loaded-adapters", "x,sql-lora"]].concat(),
    );
    let c = Sim::start(
        "pod-c",
        &[&adapters[..], &["--loaded-adapters", "y,z"]].concat(),
    );
    // A free adapter slot scores below a loaded adapter, whatever the cold-prompt spread says.
    let d = Sim::start(
        "pod-d",
        &[&adapters[..], &["--loaded-adapters", "y"]].concat(),
    );
    let envoy = gateway(&[&a, &b, &c, &d]);
    let mut served = BTreeMap::new();
    for n in 0..10 {
        let body = format!(r#"{{"model":"sql-lora","prompt":"lora request {n}","max_tokens":3}}"#);
        let response = envoy.post("/v1/completions", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        *served.entry(response.pod()).or_insert(0) += 1;
    }
    assert_eq!(served, only("pod-b", 10));
}

#[test]
fn every_openai_api_is_parsed_and_routed() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let envoy = gateway(&[&a, &b]);
    let cases = [
        (
            "/v1/completions",
            format!(r#"{{"model":"{MODEL}","prompt":["Hello","world"],"max_tokens":2}}"#),
            "text_completion",
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":[{{"type":"text","text":"Hi"}}]}}],"max_tokens":2}}"#
            ),
            "chat.completion",
        ),
        (
            "/v1/embeddings",
            format!(r#"{{"model":"{MODEL}","input":"embed me"}}"#),
            "list",
        ),
        (
            "/v1/responses",
            format!(
                r#"{{"model":"{MODEL}","instructions":"Be brief.","input":"Hi","max_output_tokens":2}}"#
            ),
            "response",
        ),
    ];
    for (path, body, object) in cases {
        let response = envoy.post(path, &body);
        assert_eq!(response.status, 200, "{path}: {}", response.text());
        assert!(
            ["pod-a", "pod-b"].contains(&response.pod().as_str()),
            "{path}"
        );
        assert_eq!(response.json()["object"], object, "{path}");
    }
    let models = envoy.get("/v1/models");
    assert_eq!(models.status, 200, "a request without a body is routed too");
    assert_eq!(models.json()["data"][0]["id"], MODEL);
}

#[test]
fn client_errors_are_openai_json_and_never_reach_a_pod() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway(&[&a]);
    let cases = [
        ("/v1/completions", "{not json".to_string(), "not valid"),
        (
            "/v1/completions",
            r#"{"prompt":"no model"}"#.to_string(),
            "\"model\"",
        ),
        (
            "/v1/chat/completions",
            format!(r#"{{"model":"{MODEL}","messages":{{}}}}"#),
            "not valid",
        ),
        ("/v1/completions", String::new(), "empty"),
    ];
    for (path, body, needle) in cases {
        let response = envoy.post(path, &body);
        assert_eq!(response.status, 400, "{body:?}: {}", response.text());
        assert_eq!(response.header("content-type"), Some("application/json"));
        let error = &response.json()["error"];
        assert_eq!(error["code"], 400);
        assert_eq!(error["type"], "invalid_request_error");
        assert!(
            error["message"].as_str().unwrap_or("").contains(needle),
            "{body:?}: {error}"
        );
    }
    assert_eq!(a.requests_total(), 0, "no bad request reached the pod");
}

#[test]
fn client_destination_header_is_overwritten_and_matches_envoy_lb_metadata() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let outsider = Sim::start("outsider", &[]);
    let envoy = gateway(&[&a, &b]);
    let count = 10;
    for n in 0..count {
        let headers = [
            ("content-type", "application/json"),
            ("x-gateway-destination-endpoint", outsider.address.as_str()),
        ];
        let response = envoy.post_with("/v1/completions", &headers, &completion(n));
        assert_eq!(response.status, 200);
        assert_ne!(response.pod(), "outsider");
    }
    assert_eq!(outsider.requests_total(), 0);
    let pool = [a.address.as_str(), b.address.as_str()];
    let lines = envoy.access_log(count);
    assert_eq!(lines.len(), count, "{lines:?}");
    for line in lines {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|part| part.strip_prefix(&format!("{name}=")))
                .unwrap_or("")
                .to_string()
        };
        // "primary,fallback": pool members only, the primary served.
        let destination = field("destination");
        let picks: Vec<&str> = destination.split(',').collect();
        assert!(picks.iter().all(|p| pool.contains(p)), "{line}");
        assert_eq!(field("envoy.lb"), destination, "{line}");
        assert_eq!(field("upstream"), picks[0], "{line}");
        assert_eq!(field("served"), picks[0], "{line}");
    }
}

#[test]
fn streaming_passes_through_byte_for_byte() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway(&[&a]);
    let body = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"stream please"}}],"max_tokens":24,"stream":true}}"#
    );
    let headers = [
        ("content-type", "application/json"),
        ("x-sim-response-id", "fixed-id"),
    ];
    let direct = support::request(
        &a.address,
        "POST",
        "/v1/chat/completions",
        &headers,
        body.as_bytes(),
    );
    let proxied = envoy.post_with("/v1/chat/completions", &headers, &body);
    assert_eq!(proxied.status, 200);
    assert_eq!(proxied.header("content-type"), Some("text/event-stream"));
    assert!(direct.body.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(direct.body.matches_count(b"data: "), 25);
    assert_eq!(proxied.text(), direct.text());
}

trait CountMatches {
    fn matches_count(&self, needle: &[u8]) -> usize;
}

impl CountMatches for Vec<u8> {
    fn matches_count(&self, needle: &[u8]) -> usize {
        self.windows(needle.len()).filter(|w| *w == needle).count()
    }
}

/// The first answer in JSON, from the filter (no pod is alive to give one). A worker reads the
/// pool's health on its tick: until then it may still pick a dead pod, and Envoy, having tried
/// them all, answers its own plain-text 503.
fn json_answer(envoy: &Envoy) -> support::Response {
    let mut answer = None;
    eventually("an answer from the filter", Duration::from_secs(5), || {
        let response = envoy.post("/v1/completions", &completion(99));
        let json = response.header("content-type") == Some("application/json");
        answer = Some(response);
        json
    });
    answer.expect("an answer")
}

/// Sends `count` requests (each answered 200) and returns how many of them the filter picked
/// `pod` for first, by its own pick counters once they count all `count` (`pool`: the address
/// of every pod it may pick). The answers cannot tell: a request picked for a dead pod is
/// retried on its fallback and answered by another.
fn picks_of(envoy: &Envoy, pod: &str, pool: &[String], count: usize) -> u64 {
    let counted = || -> u64 { pool.iter().map(|a| envoy.endpoint_picks(a)).sum() };
    let (before, pod_before) = (counted(), envoy.endpoint_picks(pod));
    picks(envoy, count);
    eventually(
        &format!("the filter to count the {count} picks"),
        Duration::from_secs(5),
        || counted() >= before + count as u64,
    );
    envoy.endpoint_picks(pod) - pod_before
}

#[test]
fn dead_pods_get_no_traffic_and_an_empty_pool_is_503() {
    let a = Sim::start("pod-a", &[]);
    let mut b = Sim::start("pod-b", &[]);
    let mut c = Sim::start("pod-c", &[]);
    // No passive back-off: a pick of the dead pod would otherwise keep it out for 5 s, as
    // if the picker had read its health.
    let config = with_pool_keys(
        &with_endpoints(&shipped_picker_config(), &[&a, &b, &c]),
        "passiveHealthBackoff: 0s",
    );
    let envoy = Envoy::start(&config, 2);
    for sim in [&a, &b, &c] {
        sim.wait_for_scrapes(3);
    }
    let pool = [&a, &b, &c].map(|sim| sim.address.clone());
    let dead = b.address.clone();
    b.kill();
    // Its next scrape (50 ms) fails and takes pod-b out of rotation; a worker that does not
    // scrape reads that on its next tick.
    envoy.wait_for_fresh_endpoints(2);
    eventually(
        "every worker to stop picking the dead pod-b",
        Duration::from_secs(5),
        || picks_of(&envoy, &dead, &pool, 6) == 0,
    );
    let picked = picks_of(&envoy, &dead, &pool, 20);
    assert_eq!(
        picked, 0,
        "the filter picked the dead pod-b for {picked} of 20 requests"
    );

    c.kill();
    drop(a);
    envoy.wait_for_fresh_endpoints(0);
    let response = json_answer(&envoy);
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(
        response.header("x-llm-d-request-dropped-reason"),
        Some("rejected-no-endpoints")
    );
    let error = &response.json()["error"];
    assert_eq!(error["code"], 503);
    assert!(
        error["message"]
            .as_str()
            .unwrap_or("")
            .contains("reachable"),
        "{error}"
    );
}
