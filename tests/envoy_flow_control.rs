//! Flow control (`featureGates: [flowControl]`) in a real Envoy in front of simulated pods:
//! requests wait inside Envoy while the pool is saturated, leave by priority then fairness,
//! and are refused (429 / 503, JSON) when they cannot wait. The saturation detector here is
//! `concurrency-detector` with `maxConcurrency` equal to the pods' sequence slots, so "room"
//! means a free slot and every test can tell exactly when a request must wait.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::{eventually, free_port, with_endpoints, Envoy, Response, Sim, MODEL};

const DROPPED_REASON: &str = "x-llm-d-request-dropped-reason";

/// The GIE default scorers, the concurrency detector as flow control's gate, round-robin
/// fairness in band 0, and two objectives (priority 10 and sheddable -1). `flow` adds keys
/// to the `flowControl` section.
fn flow_config(sims: &[&Sim], max_concurrency: u32, flow: &str) -> String {
    with_endpoints(&flow_config_text(max_concurrency, flow), sims)
}

/// [`flow_config`] before the pool's addresses are filled in.
fn flow_config_text(max_concurrency: u32, flow: &str) -> String {
    format!(
        "featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: concurrency-detector
  parameters: {{maxConcurrency: {max_concurrency}}}
- {{type: round-robin-fairness-policy, name: rr}}
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
flowControl:
  saturationDetector: {{pluginRef: concurrency-detector}}
  defaultPriorityBand: {{fairnessPolicyRef: rr}}
{flow}
pool:
  objectives: [{{name: interactive, priority: 10}}, {{name: batch, priority: -1}}]
  endpoints: []
"
    )
}

/// A pod with `slots` sequence slots, in real time (10 ms per output token).
fn pod(name: &str, slots: u32) -> Sim {
    Sim::start(
        name,
        &["--max-num-seqs", &slots.to_string(), "--time-scale", "1"],
    )
}

fn start(config: &str, sims: &[&Sim], workers: u32) -> Envoy {
    let envoy = Envoy::start(config, workers);
    for sim in sims {
        sim.wait_for_scrapes(2);
    }
    envoy.wait_for_fresh_endpoints(sims.len());
    // The VM that scrapes hands the metrics to the routing workers on their next ticks (50
    // ms): until then a first request finds no endpoint and is held, which the tests'
    // counts of held requests would take for one of theirs.
    std::thread::sleep(Duration::from_millis(300));
    envoy
}

fn body(label: &str, max_tokens: u32) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":"flow control {label}","max_tokens":{max_tokens}}}"#)
}

fn post(envoy: &Envoy, label: &str, max_tokens: u32, headers: &[(&str, &str)]) -> Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    envoy.post_with("/v1/completions", &all, &body(label, max_tokens))
}

fn flow_stat(envoy: &Envoy, what: &str) -> f64 {
    envoy
        .stat(&format!("wasmcustom.inference_picker.flow_control.{what}"))
        .unwrap_or(0.0)
}

/// Waits until the filter holds `count` requests (its `held` counter).
fn wait_until_held(envoy: &Envoy, count: f64) {
    eventually(
        &format!("{count} held requests"),
        Duration::from_secs(10),
        || flow_stat(envoy, "held") >= count,
    );
}

fn peak_waiting(sim: &Sim) -> u64 {
    sim.stats()["peak_waiting"].as_u64().unwrap_or(u64::MAX)
}

/// Sends `count` requests at once; every one must succeed.
fn burst(envoy: &Envoy, count: usize, max_tokens: u32) {
    std::thread::scope(|scope| {
        let sent: Vec<_> = (0..count)
            .map(|n| scope.spawn(move || post(envoy, &format!("burst {n}"), max_tokens, &[])))
            .collect();
        for request in sent {
            let response = request.join().expect("request thread");
            assert_eq!(response.status, 200, "{}", response.text());
        }
    });
}

#[test]
fn a_saturated_pool_holds_requests_instead_of_piling_them_on_pods() {
    let sims = [pod("pod-a", 2), pod("pod-b", 2)];
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = start(&flow_config(&refs, 2, ""), &refs, 1);
    burst(&envoy, 16, 20);
    let peaks: Vec<u64> = sims.iter().map(peak_waiting).collect();
    assert!(
        peaks.iter().all(|&peak| peak <= 1),
        "pods queued {peaks:?} with flow control"
    );
    let held = flow_stat(&envoy, "held");
    assert!(
        held >= 8.0,
        "16 requests onto 4 slots: most wait in Envoy ({held})"
    );
    assert_eq!(
        flow_stat(&envoy, "dispatched"),
        held,
        "every held request went"
    );
    assert_eq!(flow_stat(&envoy, "band.0.queue_size"), 0.0);
    drop(envoy);

    // The same burst without the gate piles up inside the pods.
    let plain = [pod("pod-c", 2), pod("pod-d", 2)];
    let refs: Vec<&Sim> = plain.iter().collect();
    let ungated = with_endpoints(
        &flow_config_text(2, "").replace("featureGates: [flowControl]", ""),
        &refs,
    );
    let envoy = start(&ungated, &refs, 1);
    burst(&envoy, 16, 20);
    let peaks: u64 = plain.iter().map(peak_waiting).sum();
    assert!(peaks >= 6, "without flow control the pods queue ({peaks})");
}

#[test]
fn held_requests_leave_by_priority_then_take_turns_between_tenants() {
    let sim = pod("pod-a", 1);
    let envoy = start(&flow_config(&[&sim], 1, ""), &[&sim], 1);
    let finished = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let (envoy, finished) = (&envoy, &finished);
        let send = move |label: String, headers: Vec<(&'static str, &'static str)>| {
            scope.spawn(move || {
                let response = post(envoy, &label, 3, &headers);
                assert_eq!(response.status, 200, "{label}: {}", response.text());
                finished.lock().expect("lock").push(label);
            })
        };
        // One slot, taken for two seconds: everything after it waits.
        let blocker = scope.spawn(move || post(envoy, "blocker", 200, &[]));
        wait_until_in_flight(&sim);
        let mut held = 0.0;
        let mut queue = |label: String, headers| {
            send(label, headers);
            held += 1.0;
            wait_until_held(envoy, held);
        };
        // Ten times more from one tenant, all of it first.
        for n in 0..20 {
            queue(
                format!("loud-{n:02}"),
                vec![("x-llm-d-inference-fairness-id", "loud")],
            );
        }
        for n in 0..2 {
            queue(
                format!("quiet-{n:02}"),
                vec![("x-gateway-inference-fairness-id", "quiet")],
            );
        }
        queue(
            "vip".into(),
            vec![
                ("x-gateway-inference-objective", "interactive"),
                ("x-llm-d-inference-fairness-id", "loud"),
            ],
        );
        assert_eq!(blocker.join().expect("blocker").status, 200);
    });
    let order = finished.into_inner().expect("lock");
    assert_eq!(order.len(), 23);
    assert_eq!(order[0], "vip", "the higher band goes first: {order:?}");
    let tenants: Vec<&str> = order[1..5].iter().map(|l| &l[..l.len() - 3]).collect();
    assert_eq!(
        tenants,
        ["loud", "quiet", "loud", "quiet"],
        "half each while both wait, though loud sent ten times more: {order:?}"
    );
    assert!(order[5..].iter().all(|l| l.starts_with("loud")));
    let loud: Vec<&String> = order.iter().filter(|l| l.starts_with("loud")).collect();
    assert!(
        loud.windows(2).all(|w| w[0] < w[1]),
        "first come, first served within a flow: {order:?}"
    );
}

/// With several bands and no usage limit configured, band 0 leaves free the slots the
/// interactive band needs at the rate it is arriving: an interactive request then starts at
/// once while band 0's wait.
#[test]
fn by_default_a_lower_band_keeps_slots_free_for_a_higher_band_that_is_sending() {
    let sim = pod("pod-a", 8);
    let envoy = start(&flow_config(&[&sim], 8, ""), &[&sim], 1);
    let interactive = [("x-gateway-inference-objective", "interactive")];
    for n in 0..6 {
        let response = post(&envoy, &format!("interactive {n}"), 1, &interactive);
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let running = || sim.stats()["running"].as_u64().unwrap_or(0);
    std::thread::scope(|scope| {
        let envoy = &envoy;
        let standard: Vec<_> = (0..8)
            .map(|n| scope.spawn(move || post(envoy, &format!("standard {n}"), 150, &[])))
            .collect();
        // Half the arrivals were interactive: two of the 8 slots stay free (the cap, a
        // quarter of the pool), so 6 standard requests run and 2 wait in Envoy.
        eventually("6 running and 2 held", Duration::from_secs(5), || {
            running() == 6 && flow_stat(envoy, "band.0.queue_size") == 2.0
        });
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(running(), 6, "the kept slots stay free");
        let started = Instant::now();
        let response = post(envoy, "interactive late", 1, &interactive);
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the interactive request took a kept slot at once ({:?}), not one freed by the \
             1.5 s standard requests",
            started.elapsed()
        );
        for request in standard {
            let response = request.join().expect("request thread");
            assert_eq!(response.status, 200, "{}", response.text());
        }
    });
}

/// Waits until the pod runs a request.
fn wait_until_in_flight(sim: &Sim) {
    eventually("the blocker to start", Duration::from_secs(10), || {
        sim.stats()["running"].as_u64().unwrap_or(0) > 0
    });
}

fn assert_refused(response: &Response, status: u16, reason: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(response.header(DROPPED_REASON), Some(reason));
    assert_eq!(response.header("content-type"), Some("application/json"));
    let json = response.json();
    assert_eq!(json["error"]["code"], u64::from(status), "{json}");
    assert!(json["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[test]
fn a_request_held_past_its_ttl_gets_429() {
    let sim = pod("pod-a", 1);
    let envoy = start(
        &flow_config(&[&sim], 1, "  defaultRequestTTL: 300ms"),
        &[&sim],
        1,
    );
    std::thread::scope(|scope| {
        let blocker = scope.spawn(|| post(&envoy, "blocker", 150, &[]));
        wait_until_in_flight(&sim);
        let started = Instant::now();
        let response = post(&envoy, "late", 3, &[]);
        let waited = started.elapsed();
        assert_refused(&response, 429, "rejected-ttl-expired");
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_millis(1200),
            "refused after its TTL, not the blocker's end ({waited:?})"
        );
        assert_eq!(blocker.join().expect("blocker").status, 200);
    });
    assert_eq!(flow_stat(&envoy, "expired"), 1.0);
    assert_eq!(
        sim.requests_total(),
        1,
        "the expired request never reached the pod"
    );
}

#[test]
fn a_full_queue_refuses_at_once_and_the_held_request_still_goes() {
    let sim = pod("pod-a", 1);
    let envoy = start(&flow_config(&[&sim], 1, "  maxRequests: 1"), &[&sim], 1);
    std::thread::scope(|scope| {
        let blocker = scope.spawn(|| post(&envoy, "blocker", 60, &[]));
        wait_until_in_flight(&sim);
        let held = scope.spawn(|| post(&envoy, "held", 3, &[]));
        wait_until_held(&envoy, 1.0);
        let started = Instant::now();
        let refused = post(&envoy, "one too many", 3, &[]);
        assert_refused(&refused, 429, "rejected-saturated");
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "refused without waiting"
        );
        assert_eq!(blocker.join().expect("blocker").status, 200);
        assert_eq!(held.join().expect("held").status, 200);
    });
    assert_eq!(flow_stat(&envoy, "rejected"), 1.0);
    assert_eq!(flow_stat(&envoy, "dispatched"), 1.0);
}

#[test]
fn with_no_endpoint_a_request_waits_no_endpoint_ttl_then_gets_503() {
    // The pool's only pod never answers: it never has fresh metrics, so no endpoint.
    let closed = free_port();
    let config = flow_config(&[], 1, "  noEndpointRequestTTL: 400ms").replace(
        "endpoints: []",
        &format!("endpoints: [{{address: '127.0.0.1:{closed}'}}]"),
    );
    let envoy = Envoy::start(&config, 1);
    let started = Instant::now();
    let response = post(&envoy, "nowhere", 3, &[]);
    let waited = started.elapsed();
    assert_refused(&response, 503, "rejected-no-endpoints");
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn a_client_that_disconnects_while_held_leaves_the_queue() {
    let sim = pod("pod-a", 1);
    let envoy = start(&flow_config(&[&sim], 1, ""), &[&sim], 1);
    std::thread::scope(|scope| {
        let blocker = scope.spawn(|| post(&envoy, "blocker", 80, &[]));
        wait_until_in_flight(&sim);
        let body = body("gone", 3);
        let mut client = TcpStream::connect(envoy.address()).expect("connect");
        write!(
            client,
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        wait_until_held(&envoy, 1.0);
        drop(client);
        eventually(
            "the held request to leave the queue",
            Duration::from_secs(5),
            || flow_stat(&envoy, "abandoned") >= 1.0,
        );
        assert_eq!(
            flow_stat(&envoy, "band.0.queue_size"),
            0.0,
            "no count leaks"
        );
        let prometheus = envoy.admin_get("/stats/prometheus").text();
        assert!(
            prometheus.contains("inference_picker_flow_control_band_queue_size{priority=\"0\"} 0"),
            "the band is a label"
        );
        assert_eq!(blocker.join().expect("blocker").status, 200);
    });
    // The blocker's slot frees when Envoy logs its stream, just after its client has the
    // response: on a loaded machine the next request could otherwise still find it taken.
    // Envoy counts the stream out and logs it in one step on its one worker.
    eventually(
        "Envoy to close the blocker's stream",
        Duration::from_secs(5),
        || envoy.stat("http.inference_gateway.downstream_rq_active") == Some(0.0),
    );
    let after = post(&envoy, "after", 3, &[]);
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(
        flow_stat(&envoy, "held"),
        1.0,
        "the next request went straight through"
    );
    assert_eq!(
        sim.requests_total(),
        2,
        "the abandoned request never reached the pod"
    );
}

#[test]
fn with_four_workers_the_queue_and_its_limit_are_envoy_wide() {
    let sim = pod("pod-a", 1);
    let envoy = start(&flow_config(&[&sim], 1, "  maxRequests: 3"), &[&sim], 4);
    let envoy = &envoy;
    let statuses = std::thread::scope(|scope| {
        let blocker = scope.spawn(|| post(envoy, "blocker", 100, &[]));
        wait_until_in_flight(&sim);
        // Workers see each other's in-flight counts as of their last tick (50 ms). A time
        // window, not a wait: no stat tells what each worker has seen. Eight ticks, as a
        // worker's tick runs late while other tests load the machine's two cores.
        std::thread::sleep(Duration::from_millis(400));
        let sent: Vec<_> = (0..8)
            .map(|n| scope.spawn(move || post(envoy, &format!("w{n}"), 3, &[]).status))
            .collect();
        let mut statuses: Vec<u16> = sent
            .into_iter()
            .map(|s| s.join().expect("request"))
            .collect();
        assert_eq!(blocker.join().expect("blocker").status, 200);
        statuses.sort_unstable();
        statuses
    });
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 429],
        "three wait Envoy-wide, whichever worker took them"
    );
    assert!(
        peak_waiting(&sim) <= 1,
        "the pod never queued more than one"
    );
}
