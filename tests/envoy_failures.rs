//! When pods fail or the pool is saturated, and when clients send garbage: the filter keeps
//! serving, sheds only what may be shed, and never routes outside the pool.

mod support;

use std::time::Duration;
use support::{
    completion, eventually, request, shipped_picker_config, with_endpoints, with_pool_keys,
    BackgroundLoad, Envoy, Listener, Sim, MODEL,
};

/// The shipped picker config for these pods, with `pool` keys adjusted.
fn config(sims: &[&Sim], pool_extra: &str) -> String {
    with_pool_keys(&with_endpoints(&shipped_picker_config(), sims), pool_extra)
}

fn gateway(sims: &[&Sim], pool_extra: &str) -> Envoy {
    let envoy = Envoy::start(&config(sims, pool_extra), 2);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

const OBJECTIVES: &str =
    "objectives: [{name: interactive, priority: 10}, {name: batch, priority: -1}]";

fn post_objective(envoy: &Envoy, objective: Option<&str>, n: usize) -> support::Response {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(objective) = objective {
        headers.push(("x-gateway-inference-objective", objective));
    }
    envoy.post_with("/v1/completions", &headers, &completion(n))
}

#[test]
fn saturated_pool_sheds_only_sheddable_requests() {
    let a = Sim::start("pod-a", &["--background-waiting", "6"]);
    let b = Sim::start("pod-b", &["--background-waiting", "9"]);
    let envoy = gateway(&[&a, &b], OBJECTIVES);
    let shed = post_objective(&envoy, Some("batch"), 0);
    assert_eq!(shed.status, 429, "{}", shed.text());
    assert_eq!(shed.json()["error"]["type"], "rate_limit_exceeded");
    // llm-d's answer to a shed request, flow control or not.
    assert_eq!(
        shed.header("x-llm-d-request-dropped-reason"),
        Some("rejected-saturated")
    );
    assert!(shed.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("saturated"));
    for objective in [Some("interactive"), None, Some("unknown-objective")] {
        let response = post_objective(&envoy, objective, 1);
        assert_eq!(response.status, 200, "{objective:?}: {}", response.text());
    }
    assert!(envoy.wait_for_log_line("the pool is saturated").is_some());

    // One pod recovers: the pool is no longer saturated and batch requests flow again.
    a.admin("load", r#"{"background_waiting":0}"#);
    a.wait_for_scrapes(3);
    let served = post_objective(&envoy, Some("batch"), 2);
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.pod(), "pod-a");
}

#[test]
fn a_pod_that_fails_requests_is_avoided_before_its_next_scrape_says_so() {
    // pod-a has the shorter queue, so it is preferred, but it answers every request with 500
    // while its /metrics stays healthy.
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "2"]);
    a.admin(
        "fault",
        r#"{"mode":"error","status":500,"scope":"inference"}"#,
    );
    let envoy = gateway(&[&a, &b], "passiveHealthBackoff: 30s");
    let mut failures = 0;
    for n in 0..12 {
        let response = envoy.post("/v1/completions", &completion(n));
        match response.status {
            200 => assert_eq!(response.pod(), "pod-b"),
            500 => failures += 1,
            other => panic!("unexpected {other}: {}", response.text()),
        }
    }
    // Each Envoy worker learns it once (two workers).
    assert!((1..=2).contains(&failures), "{failures} failures");
    assert!(envoy
        .wait_for_log_line("answered 500; avoiding it")
        .is_some());
}

#[test]
fn bad_input_is_refused_with_json_and_nothing_reaches_a_pod() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway(&[&a], "maxRequestBodyBytes: 2000");
    let nested = format!(
        r#"{{"model":"{MODEL}","prompt":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let big = format!(r#"{{"model":"{MODEL}","prompt":"{}"}}"#, "y".repeat(3000));
    let cases: [(&str, Vec<u8>, u16, &str); 6] = [
        ("/v1/completions", big.into_bytes(), 413, "2000"),
        ("/v1/completions", nested.into_bytes(), 400, "invalid type"),
        (
            "/v1/completions",
            b"{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}".to_vec(),
            400,
            "not valid",
        ),
        (
            "/v1/completions",
            br#"{"model":5,"prompt":"x"}"#.to_vec(),
            400,
            "invalid type",
        ),
        (
            "/v1/chat/completions",
            br#"{"model":"m","messages":"hi"}"#.to_vec(),
            400,
            "not valid",
        ),
        (
            "/v1/embeddings",
            br#"{"model":"m"}"#.to_vec(),
            400,
            "\"input\"",
        ),
    ];
    for (path, body, status, needle) in cases {
        let response = request(
            &envoy.address(),
            "POST",
            path,
            &[("content-type", "application/json")],
            &body,
        );
        assert_eq!(response.status, status, "{path}: {}", response.text());
        let error = &response.json()["error"];
        assert_eq!(error["code"], status);
        assert!(
            error["message"].as_str().unwrap_or("").contains(needle),
            "{error}"
        );
    }
    assert_eq!(a.requests_total(), 0);
    // And the filter is still serving.
    assert_eq!(envoy.post("/v1/completions", &completion(1)).status, 200);
}

#[test]
fn nothing_a_client_sends_routes_outside_the_pool() {
    let a = Sim::start("pod-a", &[]);
    let outsider = Sim::start("outsider", &[]);
    let envoy = gateway(&[&a], "");
    let token =
        inference_picker_core::scheduling::plugins::scorer::session_affinity_scorer::token_for(
            &outsider.address,
        );
    let steering = [
        ("x-gateway-destination-endpoint", outsider.address.as_str()),
        (
            "x-gateway-destination-endpoint-fallback",
            outsider.address.as_str(),
        ),
        ("x-prefiller-host-port", outsider.address.as_str()),
        ("x-session-token", token.as_str()),
        ("test-epp-endpoint-selection", outsider.address.as_str()),
    ];
    for n in 0..5 {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend_from_slice(&steering);
        let response = envoy.post_with("/v1/completions", &headers, &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "pod-a");
        let models = request(&envoy.address(), "GET", "/v1/models", &steering, b"");
        assert_eq!(models.pod(), "pod-a");
    }
    assert_eq!(outsider.requests_total(), 0);
}

#[test]
fn a_pod_answering_503_is_retried_on_the_next_pick() {
    // pod-a is preferred (shorter queue) but says 503 to every request; pod-b is the next
    // pick. A 1 ms back-off makes every request try pod-a first.
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "2"]);
    let outsider = Sim::start("outsider", &[]);
    a.admin(
        "fault",
        r#"{"mode":"error","status":503,"scope":"inference"}"#,
    );
    let envoy = gateway(&[&a, &b], "passiveHealthBackoff: 1ms");
    for n in 0..6 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "pod-b");
    }
    // The first attempts went to pod-a (its faults are not counted as requests), the retries
    // to pod-b, which the GIE "served" metadata names.
    let log = envoy.access_log(6).join("\n");
    assert!(log.contains("attempts=2"), "{log}");
    assert!(log.contains(&format!("served={}", b.address)), "{log}");
    // A client naming an address outside the pool gets nowhere near it.
    let response = envoy.post_with(
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-destination-endpoint", outsider.address.as_str()),
        ],
        &completion(9),
    );
    assert_eq!(response.status, 200);
    assert_eq!(outsider.requests_total(), 0);
}

#[test]
fn when_every_pick_fails_the_client_gets_503_and_no_other_pod_is_tried() {
    // Both picks answer 503; pod-c, which the picker leaves out (a label filter), is never
    // tried: past the end of the picker's list Envoy chooses no host (the third attempt ends
    // in Envoy's own 503).
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let c = Sim::start("pod-c", &[]);
    for sim in [&a, &b] {
        sim.admin(
            "fault",
            r#"{"mode":"error","status":503,"scope":"inference"}"#,
        );
    }
    // No back-off: every request tries both picks again, with no wait for one to expire.
    let picker = config(&[&a, &b, &c], "passiveHealthBackoff: 0s");
    let mut picker: serde_yaml::Value = serde_yaml::from_str(&picker).unwrap();
    let filter =
        "{type: label-selector-filter, parameters: {matchLabels: {llm-d.ai/role: decode}}}";
    let plugins = picker["plugins"].as_sequence_mut().unwrap();
    plugins.push(serde_yaml::from_str(filter).unwrap());
    let profile = picker["schedulingProfiles"][0]["plugins"]
        .as_sequence_mut()
        .unwrap();
    profile.insert(
        0,
        serde_yaml::from_str("{pluginRef: label-selector-filter}").unwrap(),
    );
    picker["pool"]["endpoints"][2]["labels"] =
        serde_yaml::from_str("{llm-d.ai/role: prefill}").unwrap();
    let envoy = Envoy::start(&serde_yaml::to_string(&picker).unwrap(), 2);
    a.wait_for_scrapes(3);
    for n in 0..4 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 503, "{}", response.text());
    }
    assert_eq!(c.requests_total(), 0, "pod-c is not among the picks");
    let lines = envoy.access_log(4);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for line in lines {
        assert!(line.contains(" 503 "), "{line}");
        assert!(!line.contains(&c.address), "{line}");
        assert!(
            line.contains(&format!("upstream={}", a.address))
                || line.contains(&format!("upstream={}", b.address)),
            "{line}"
        );
    }
}

#[test]
fn a_pod_that_hangs_does_not_delay_the_others_and_costs_at_most_a_request_per_worker() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "3"]);
    let envoy = gateway(&[&a, &b], "metricsTimeout: 300ms");
    a.admin("fault", r#"{"mode":"hang"}"#);
    let before = b.metrics_scrapes();
    // A measuring window: pod-b's scrapes while pod-a's hang.
    std::thread::sleep(Duration::from_millis(1600));
    let scraped = b.metrics_scrapes() - before;
    assert!(scraped >= 20, "pod-b scraped only {scraped} times in 1.6 s");
    // pod-a's late scrapes only age its metrics: once they are stale it is still a
    // candidate, read as the idle pod it last reported. The request each worker sends it is
    // not answered (the client gives up) and nothing more goes there.
    envoy.wait_for_fresh_endpoints(1);
    let mut outcomes = Vec::new();
    for n in 0..8 {
        let headers = [("content-type", "application/json")];
        let body = completion(n);
        let address = envoy.address();
        let answer = support::http1::exchange(
            &address,
            "POST",
            "/v1/completions",
            &headers,
            body.as_bytes(),
            Duration::from_millis(1500),
        );
        outcomes.push(match answer {
            Ok(response) => format!("{} {}", response.status, response.pod()),
            Err(_) => "no answer".to_owned(),
        });
    }
    let lost = outcomes.iter().filter(|o| *o == "no answer").count();
    assert!(lost <= 2, "one per worker at most: {outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o == "no answer" || o == "200 pod-b"),
        "{outcomes:?}"
    );
    // Which worker takes which connection is the kernel's choice, so a worker's one loss
    // may come late; the last request still finds pod-b.
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("200 pod-b"),
        "{outcomes:?}"
    );
}

#[test]
fn a_pod_whose_metrics_answer_in_3_s_keeps_its_share_while_another_is_loaded() {
    // pod-a serves promptly but its /metrics takes 3 s (three times metricsTimeout); pod-b
    // has a queue.
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "4"]);
    let envoy = gateway(&[&a, &b], "");
    a.admin(
        "fault",
        r#"{"mode":"slow","delay_ms":3000,"scope":"metrics"}"#,
    );
    // Its metrics go stale: a late reading is missing, not a verdict.
    envoy.wait_for_fresh_endpoints(1);
    let load = BackgroundLoad::start(&envoy.address(), 4);
    std::thread::sleep(Duration::from_millis(2500));
    let served = load.finish();
    assert!(served.len() > 20, "load ran: {}", served.len());
    assert!(served.iter().all(|s| s.status == 200));
    let at_a = served.iter().filter(|s| s.pod == "pod-a").count();
    assert!(
        at_a * 10 >= served.len() * 8,
        "the idle pod took {at_a} of {}",
        served.len()
    );
    let stale = envoy
        .wait_for_log_line("stale_metrics_age_ms=")
        .expect("the decision line says its metrics are late");
    assert!(stale.contains(&a.address), "{stale}");
}

/// An Envoy whose listener comes from file-based LDS, so a test can update its picker
/// configuration while requests flow.
struct LdsGateway {
    envoy: Envoy,
    /// The listener as written for the wasm filter (the module's form is derived on writing).
    listener: serde_yaml::Value,
    path: String,
    workers: u32,
    _dir: support::TempDir,
}

impl LdsGateway {
    fn start(sims: &[&Sim], workers: u32) -> LdsGateway {
        let dir = support::TempDir::new("lds");
        let path = dir.0.join("lds.yaml").display().to_string();
        let kept = std::sync::Mutex::new(serde_yaml::Value::Null);
        let envoy = Envoy::start_with(&config(sims, ""), workers, |config| {
            let listener = config.take_listeners().remove(0);
            write_lds(&listener, &path);
            *kept.lock().unwrap() = listener;
            config["node"] = serde_yaml::from_str("{id: gateway, cluster: inference}").unwrap();
            config["dynamic_resources"] = serde_yaml::from_str(&format!(
                "{{lds_config: {{path_config_source: {{path: '{path}'}}, resource_api_version: V3}}}}"
            ))
            .unwrap();
        });
        let listener = kept.into_inner().unwrap();
        LdsGateway {
            envoy,
            listener,
            path,
            workers,
            _dir: dir,
        }
    }

    /// Serves the listener with `change` made to its picker configuration, and waits until
    /// every worker has taken it.
    fn update(&mut self, change: impl FnOnce(&str) -> String) {
        let mut listener = Listener(self.listener.clone());
        let before = listener.picker_config();
        let updated = change(&before);
        assert_ne!(updated, before, "the update changes the configuration");
        listener.set_picker_config(&updated);
        self.listener = listener.value().clone();
        let taken_before = listeners_taken(&self.envoy);
        write_lds(&self.listener, &self.path);
        eventually(
            "every worker to take the updated listener",
            Duration::from_secs(10),
            || listeners_taken(&self.envoy) >= taken_before + f64::from(self.workers),
        );
    }
}

/// Serves `listener` (written for the wasm filter, in this run's edge) through Envoy's
/// file-based LDS: written aside, then moved into place.
fn write_lds(listener: &serde_yaml::Value, path: &str) {
    let mut bootstrap: serde_yaml::Value = serde_yaml::from_str("{static_resources: {}}").unwrap();
    bootstrap["static_resources"]["listeners"] =
        serde_yaml::Value::Sequence(vec![listener.clone()]);
    if support::Edge::current() == support::Edge::Module {
        support::to_module_edge(&mut bootstrap);
    }
    let mut resource = bootstrap["static_resources"]["listeners"][0].clone();
    resource["@type"] = "type.googleapis.com/envoy.config.listener.v3.Listener".into();
    let document = serde_yaml::Value::Mapping(
        [(
            "resources".into(),
            serde_yaml::Value::Sequence(vec![resource]),
        )]
        .into_iter()
        .collect(),
    );
    let staging = format!("{path}.new");
    std::fs::write(&staging, serde_yaml::to_string(&document).unwrap()).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

/// Listeners (first ones and updates) Envoy's workers have taken: one per worker each time.
fn listeners_taken(envoy: &Envoy) -> f64 {
    envoy
        .stat("listener_manager.listener_create_success")
        .unwrap_or(0.0)
}

/// Requests sent one after another until stopped (20 s at most): how many, how many failed.
struct SteadyLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    failed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl SteadyLoad {
    fn start(address: String) -> SteadyLoad {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let thread = {
            let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                    let response = support::try_request(
                        &address,
                        "POST",
                        "/v1/completions",
                        &[("content-type", "application/json")],
                        completion(n).as_bytes(),
                    );
                    sent.fetch_add(1, Ordering::Relaxed);
                    if !response.is_ok_and(|r| r.status == 200) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                }
            })
        };
        SteadyLoad {
            stop,
            sent,
            failed,
            thread,
        }
    }

    fn sent(&self) -> usize {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits until `more` requests beyond those sent so far went out.
    fn wait_for_more(&self, more: usize, what: &str) {
        let from = self.sent();
        eventually(what, Duration::from_secs(10), || self.sent() >= from + more);
    }

    /// Stops it: (sent, failed).
    fn finish(self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// Two pods behind an LDS-served gateway (two workers), requests flowing.
fn two_pods_under_load() -> (Sim, Sim, LdsGateway, SteadyLoad) {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let gateway = LdsGateway::start(&[&a, &b], 2);
    a.wait_for_scrapes(3);
    let load = SteadyLoad::start(gateway.envoy.address());
    load.wait_for_more(20, "requests to flow before the update");
    (a, b, gateway, load)
}

#[test]
fn a_config_update_keeps_serving_throughout() {
    let (a, b, mut gateway, load) = two_pods_under_load();
    let window = Duration::from_secs(2);
    let before = scrape_rate(&[&a, &b], window);
    let memory = |envoy: &Envoy| envoy.stat("wasmcustom.inference_picker.vm_memory_bytes");
    let memory_before = memory(&gateway.envoy).expect("vm_memory_bytes");
    // A new picker configuration (another scrape interval), applied while requests flow.
    gateway.update(|config| {
        config.replace(
            "refreshMetricsInterval: 50ms",
            "refreshMetricsInterval: 40ms",
        )
    });
    assert!(
        gateway
            .envoy
            .wait_for_log_line("scraping every 40ms")
            .is_some(),
        "the new configuration was applied:\n{}",
        gateway.envoy.log()
    );
    load.wait_for_more(20, "requests to keep flowing after the update");
    // Once the old listener has drained (2 s in tests), its VMs leave the shared state: the
    // pods are scraped by the new configuration alone.
    eventually(
        "the old configuration to retire",
        Duration::from_secs(15),
        || gateway.envoy.log().contains("configuration retired"),
    );
    let after = scrape_rate(&[&a, &b], window);
    let (sent, failed) = load.finish();
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed across the update"
    );
    // The new configuration's VMs live in the same VMs (the same process for the module):
    // the memory they share is counted once, not once per configuration.
    let memory_after = memory(&gateway.envoy).expect("vm_memory_bytes");
    assert!(
        memory_after < memory_before * 1.5,
        "vm_memory_bytes {memory_after} after the update against {memory_before} before"
    );
    // 40 ms instead of 50: 1.25 times the scrapes; both configurations would make 2.25.
    assert!(
        after <= before * 1.25 * 1.2,
        "scrapes per second after the drain: {after:.1} against {before:.1} before the update"
    );
}

/// The pods' scrapes per second, over both pods, counted at the pods for `window`.
fn scrape_rate(pods: &[&Sim], window: Duration) -> f64 {
    let count = || pods.iter().map(|pod| pod.metrics_scrapes()).sum::<u64>();
    let before = count();
    // A time window, not a wait: the rate is what the pods saw during it.
    std::thread::sleep(window);
    (count() - before) as f64 / window.as_secs_f64()
}

/// An update that changes only how the picker weighs its scorers keeps the pool's shared state:
/// the old configuration (alive while its listener drains: 2 s in tests, ten minutes by
/// default) and the new one share it, so the pods are scraped once, not once per configuration.
#[test]
fn a_reweighing_update_shares_the_pool_state_and_scrapes_once() {
    let (a, b, mut gateway, load) = two_pods_under_load();
    let before = scrape_rate(&[&a, &b], Duration::from_secs(2));
    gateway.update(|config| config.replace("weight: 0.15", "weight: 0.1"));
    // Measured at once, while both configurations are alive (the old one has not retired).
    let during = scrape_rate(&[&a, &b], Duration::from_secs(1));
    assert!(
        !gateway.envoy.log().contains("configuration retired"),
        "the window must fall within the drain"
    );
    load.wait_for_more(20, "requests to flow after the update");
    let (sent, failed) = load.finish();
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed across the update"
    );
    assert!(
        during <= before * 1.2,
        "scrapes per second while the old configuration drains: {during:.1} against {before:.1} before the update"
    );
}
