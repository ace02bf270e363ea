//! A whole worker VM against the in-memory host: what the proxy-wasm edge forwards (ticks,
//! callout answers, stream callbacks) and what the VM has the host do.

use super::*;
use crate::harness::test;
use crate::host::fake::FakeVm;
use crate::protocol::DESTINATION_HEADER;

const ROOT: u32 = 1;
const INTERVAL_MS: u64 = 50;
const TWO_PODS: &str = "pool:
  refreshMetricsInterval: 50ms
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}]
";
/// The same pods behind two Envoy replicas: prefix homes apply.
const TWO_PODS_TWO_REPLICAS: &str = "pool:
  refreshMetricsInterval: 50ms
  replicas: 2
  endpoints: [{address: '10.0.0.1:8000'}, {address: '10.0.0.2:8000'}]
";
/// One pod that takes one request at a time; others wait up to a second.
const ONE_SLOT: &str = "
featureGates: [flowControl]
plugins:
- {type: concurrency-detector, parameters: {maxConcurrency: 1}}
- {type: round-robin-fairness-policy, name: rr}
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
  defaultRequestTTL: 1s
  priorityBands: [{priority: 0, fairnessPolicyRef: rr}]
pool: {refreshMetricsInterval: 50ms, endpoints: [{address: '10.0.0.1:8000'}]}
";
const BODY: &str = r#"{"model":"m","prompt":"hello"}"#;

fn configured(config: &str) -> (FakeVm, WorkerVm<FakeVm>) {
    let host = FakeVm::default();
    host.clock.0.set(1_000_000);
    let vm = WorkerVm::configure(host.clone(), ROOT, config.as_bytes()).unwrap();
    (host, vm)
}

/// One interval later, a tick; every scrape it sent is answered with the pod's waiting queue
/// (in pool order).
fn scrape_round(host: &FakeVm, vm: &mut WorkerVm<FakeVm>, waiting: &[u32]) {
    host.clock.advance(INTERVAL_MS);
    vm.on_tick();
    answer_scrapes(host, vm, waiting);
}

/// Answers every scrape sent so far with the pod's waiting queue (in pool order).
fn answer_scrapes(host: &FakeVm, vm: &mut WorkerVm<FakeVm>, waiting: &[u32]) {
    for call in host.callouts.take_sent() {
        let pod = call
            .authority()
            .and_then(|value| value.strip_prefix("10.0.0."));
        let index: usize = pod.and_then(|p| p.split(':').next()?.parse().ok()).unwrap();
        let body = format!("vllm:num_requests_waiting {}\n", waiting[index - 1]);
        answer(host, vm, call.token, Some("200"), &body);
    }
}

/// Reads the answer to call `token` with the VM's cap, as an edge does, and hands it over.
fn answer(host: &FakeVm, vm: &mut WorkerVm<FakeVm>, token: u32, status: Option<&str>, body: &str) {
    let cap = vm.callout_body_cap(token).unwrap();
    let answer = host.callouts.answer(token, status, body, cap);
    vm.on_callout_response(token, answer);
}

/// A completions request on stream `id`, headers then body, as Envoy calls them.
fn send(host: &FakeVm, vm: &mut WorkerVm<FakeVm>, id: u32) -> (RequestDriver, Next) {
    send_body(host, vm, id, BODY)
}

fn send_body(
    host: &FakeVm,
    vm: &mut WorkerVm<FakeVm>,
    id: u32,
    body: &str,
) -> (RequestDriver, Next) {
    send_to(host, vm, id, "/v1/completions", body)
}

fn send_to(
    host: &FakeVm,
    vm: &mut WorkerVm<FakeVm>,
    id: u32,
    path: &str,
    body: &str,
) -> (RequestDriver, Next) {
    let headers = [(":path", path), (":method", "POST")];
    host.open_stream(id, &headers, body);
    let mut request = RequestDriver::new(id);
    assert_eq!(vm.on_request_headers(&mut request, false), Next::Pause);
    let flow = vm.on_request_body(&mut request, body.len(), true);
    (request, flow)
}

fn destination(host: &FakeVm, id: u32) -> Option<String> {
    let value = host.stream(id)?.request_header(DESTINATION_HEADER)?;
    String::from_utf8(value).ok()
}

#[test]
fn configuring_starts_the_tick_at_the_pool_interval_and_a_bad_config_says_why() {
    let (host, vm) = configured(TWO_PODS);
    assert_eq!(host.tick_period_ms.get(), Some(50));
    assert_eq!(vm.period_ms(), 50);
    let error = WorkerVm::configure(FakeVm::default(), ROOT, b"pool: [")
        .err()
        .unwrap();
    assert!(!error.is_empty());
    let error = WorkerVm::configure(FakeVm::default(), ROOT, &[0xff, 0xfe])
        .err()
        .unwrap();
    assert!(error.contains("UTF-8"), "{error}");
}

#[test]
fn scrape_answers_reach_the_pick_and_the_stats() {
    let (host, mut vm) = configured(TWO_PODS);
    scrape_round(&host, &mut vm, &[6, 0]);
    scrape_round(&host, &mut vm, &[6, 0]);
    let (request, flow) = send(&host, &mut vm, 10);
    assert_eq!(flow, Next::Continue);
    assert!(matches!(request.outcome, Outcome::Routed(_)));
    assert_eq!(destination(&host, 10).as_deref(), Some("10.0.0.2:8000"));
    // Per-request counts reach Envoy's counters on the next tick, in one call per stat.
    assert_eq!(
        host.metrics.value("inference_picker.decisions.routed"),
        None
    );
    scrape_round(&host, &mut vm, &[0, 6]);
    assert_eq!(
        host.metrics.value("inference_picker.decisions.routed"),
        Some(1)
    );
    assert_eq!(
        host.metrics.value("inference_picker.endpoints_fresh"),
        Some(2)
    );
    let (_, flow) = send(&host, &mut vm, 11);
    assert_eq!(flow, Next::Continue);
    assert_eq!(destination(&host, 11).as_deref(), Some("10.0.0.1:8000"));
}

#[test]
fn the_prefix_scorers_home_picks_reach_its_own_counters() {
    let (host, mut vm) = configured(TWO_PODS_TWO_REPLICAS);
    scrape_round(&host, &mut vm, &[0, 0]);
    scrape_round(&host, &mut vm, &[0, 0]);
    let shared = "a system prompt every request shares ".repeat(8);
    for id in 10..13 {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{shared}"}},{{"role":"user","content":"question {id}"}}]}}"#
        );
        let (_, flow) = send_to(&host, &mut vm, id, "/v1/chat/completions", &body);
        assert_eq!(flow, Next::Continue);
    }
    let homes: Vec<Option<String>> = (10..13).map(|id| destination(&host, id)).collect();
    assert!(homes.iter().all(|home| *home == homes[0]), "{homes:?}");
    scrape_round(&host, &mut vm, &[0, 0]);
    let counter = |name: &str| {
        host.metrics.value(&format!(
            "inference_picker.plugin.prefix-cache-scorer.{name}"
        ))
    };
    assert_eq!(counter("home_picks"), Some(3));
    assert_eq!(counter("home_spills").unwrap_or(0), 0);
    // The three requests' blocks, on one pod: the index's size, as the stats show it.
    let entries = counter("index_entries_peak").unwrap_or(0);
    assert!((1..=64).contains(&entries), "{entries}");
}

#[test]
fn a_scrape_that_times_out_reads_no_body() {
    let (host, mut vm) = configured(TWO_PODS);
    host.clock.advance(INTERVAL_MS);
    vm.on_tick();
    let sent = host.callouts.take_sent();
    assert_eq!(sent.len(), 2);
    for call in &sent {
        answer(
            &host,
            &mut vm,
            call.token,
            None,
            "vllm:num_requests_waiting 0\n",
        );
    }
    assert_eq!(host.callouts.body_bytes_read.get(), 0);
    for pod in ["10.0.0.1:8000", "10.0.0.2:8000"] {
        let failures = format!("inference_picker.endpoint.{pod}.scrape_failure");
        assert_eq!(host.metrics.value(&failures), Some(1), "{failures}");
    }
}

#[test]
fn a_request_held_behind_a_busy_pod_goes_when_the_slot_frees() {
    let (host, mut vm) = configured(ONE_SLOT);
    scrape_round(&host, &mut vm, &[0]);
    let (mut first, flow) = send(&host, &mut vm, 10);
    assert_eq!(flow, Next::Continue);
    let (mut second, flow) = send(&host, &mut vm, 11);
    assert_eq!((flow, &second.outcome), (Next::Pause, &Outcome::Held));
    assert_eq!(destination(&host, 11), None, "nothing written while held");
    // The tick sees requests waiting and speeds up.
    vm.on_tick();
    assert_eq!(host.tick_period_ms.get(), Some(FLOW_TICK_MS));
    // The first stream ends: in its own callback the held one is routed and resumed.
    vm.on_stream_done(&mut first);
    assert_eq!(host.resumed.borrow().as_slice(), &[11]);
    assert_eq!(destination(&host, 11).as_deref(), Some("10.0.0.1:8000"));
    // The resumed stream's response takes its decision back; its end frees the slot.
    vm.on_response_headers(&mut second);
    assert!(second.was_routed());
    vm.on_stream_done(&mut second);
    let (_, flow) = send(&host, &mut vm, 12);
    assert_eq!(flow, Next::Continue, "the slot is free again");
    // Nothing waits any more: within a pool interval, the tick slows down to it again.
    for _ in 0..INTERVAL_MS / u64::from(FLOW_TICK_MS) {
        host.clock.advance(u64::from(FLOW_TICK_MS));
        vm.on_tick();
    }
    assert_eq!(host.tick_period_ms.get(), Some(50));
}

#[test]
fn a_released_request_whose_stream_is_gone_gives_its_slot_back() {
    let (host, mut vm) = configured(ONE_SLOT);
    scrape_round(&host, &mut vm, &[0]);
    let (mut first, _) = send(&host, &mut vm, 10);
    let (_, flow) = send(&host, &mut vm, 11);
    assert_eq!(flow, Next::Pause);
    // Stream 11 is reset before its end reaches the VM; the release finds it gone.
    host.close_stream(11);
    vm.on_stream_done(&mut first);
    assert!(host.resumed.borrow().is_empty());
    let (_, flow) = send(&host, &mut vm, 12);
    assert_eq!(
        flow,
        Next::Continue,
        "the pick for the gone stream was given back"
    );
}

#[test]
fn a_refusal_found_in_a_stream_callback_is_sent_from_the_next_tick() {
    let (host, mut vm) = configured(ONE_SLOT);
    scrape_round(&host, &mut vm, &[0]);
    let (_first, _) = send(&host, &mut vm, 10);
    let (_, flow) = send(&host, &mut vm, 11);
    assert_eq!(flow, Next::Pause);
    // Past the TTL, another request's callback finds stream 11 expired: a local reply sent
    // from that callback would confuse Envoy about the current stream, so it waits.
    host.clock.advance(1_500);
    let (_, flow) = send(&host, &mut vm, 12);
    assert_eq!(flow, Next::Pause);
    assert_eq!(
        host.stream_reply(11),
        None,
        "not answered from stream 12's callback"
    );
    vm.on_tick();
    assert_eq!(host.stream_reply(11), Some(429));
    assert!(host.resumed.borrow().is_empty());
}

#[test]
fn a_request_before_the_configuration_is_answered_503_in_its_api_shape() {
    let host = FakeVm::default();
    host.open_stream(3, &[(":path", "/v1/chat/completions")], "");
    answer_unavailable(&host.stream(3).unwrap());
    assert_eq!(host.stream_reply(3), Some(503));
}

#[test]
fn the_vm_reports_its_memory_once_a_second_not_on_every_tick() {
    let (host, mut vm) = configured(TWO_PODS);
    let gauge = "inference_picker.vm_memory_bytes";
    host.memory_bytes.set(4 << 20);
    vm.on_tick();
    assert_eq!(
        host.metrics.value(gauge),
        Some(4 << 20),
        "the first tick reports"
    );
    host.memory_bytes.set(5 << 20);
    for _ in 0..(1_000 / INTERVAL_MS - 1) {
        host.clock.advance(INTERVAL_MS);
        vm.on_tick();
    }
    assert_eq!(
        host.metrics.value(gauge),
        Some(4 << 20),
        "the ticks within the second make no report"
    );
    host.clock.advance(INTERVAL_MS);
    vm.on_tick();
    assert_eq!(host.metrics.value(gauge), Some(5 << 20), "a second on");
}

#[test]
fn a_configuration_update_adds_only_new_memory_to_the_shared_gauge() {
    let (host, mut vm) = configured(TWO_PODS);
    host.memory_bytes.set(4 << 20);
    vm.on_tick();
    let gauge = "inference_picker.vm_memory_bytes";
    assert_eq!(host.metrics.value(gauge), Some(4 << 20));
    // Envoy's next configuration: a new root context in the same address space.
    let mut updated = WorkerVm::configure(host.clone(), ROOT + 1, TWO_PODS.as_bytes()).unwrap();
    host.memory_bytes.set(5 << 20);
    host.clock.advance(INTERVAL_MS);
    updated.on_tick();
    assert_eq!(
        host.metrics.value(gauge),
        Some(5 << 20),
        "the first 4 MiB counted once"
    );
    assert_eq!(
        host.metrics.value("inference_picker.vms"),
        Some(1),
        "still one VM"
    );
}

/// Envoy's main thread and one worker: the main VM takes the lease first (it ticks first), and
/// routes nothing.
fn main_and_worker() -> ((FakeVm, WorkerVm<FakeVm>), (FakeVm, WorkerVm<FakeVm>)) {
    let (main_host, mut main) = configured(TWO_PODS);
    let worker_host = main_host.beside();
    let mut worker =
        WorkerVm::configure(worker_host.clone(), ROOT + 1, TWO_PODS.as_bytes()).unwrap();
    main.on_tick();
    worker.on_tick();
    ((main_host, main), (worker_host, worker))
}

#[test]
fn a_vm_that_routes_nothing_ticks_slowly_and_catches_up_when_a_request_comes() {
    let ((main_host, mut main), (worker_host, mut worker)) = main_and_worker();
    let interval = Some(INTERVAL_MS as u32);
    assert_eq!(
        main_host.tick_period_ms.get(),
        interval,
        "the lease holder scrapes"
    );
    assert_eq!(
        worker_host.tick_period_ms.get(),
        Some(IDLE_TICK_MS),
        "the follower idles"
    );
    // The holder's round (pod 1 queues 40 requests, pod 2 none) lands after the worker's tick.
    answer_scrapes(&main_host, &mut main, &[40, 0]);

    // A request before the worker's next slow tick: it is decided on the round just published.
    worker_host.clock.advance(INTERVAL_MS);
    let (mut request, _) = send(&worker_host, &mut worker, 7);
    assert_eq!(
        destination(&worker_host, 7).as_deref(),
        Some("10.0.0.2:8000")
    );
    let Outcome::Routed(routed) = &request.outcome else {
        panic!("routed");
    };
    assert!(!routed.degraded, "the pods' metrics count as fresh");
    assert_eq!(
        worker_host.tick_period_ms.get(),
        interval,
        "it ticks at the interval again"
    );

    // Quiet for ROUTING_MS after its request ended, it idles again; the holder never does.
    worker.on_stream_done(&mut request);
    for _ in 0..(ROUTING_MS / INTERVAL_MS) {
        worker_host.clock.advance(INTERVAL_MS);
        worker.on_tick();
        main.on_tick();
        assert_eq!(
            worker_host.tick_period_ms.get(),
            interval,
            "a lull is not idleness"
        );
    }
    worker_host.clock.advance(INTERVAL_MS);
    worker.on_tick();
    main.on_tick();
    assert_eq!(worker_host.tick_period_ms.get(), Some(IDLE_TICK_MS));
    assert_eq!(main_host.tick_period_ms.get(), interval);
}

#[test]
fn a_vm_with_a_request_in_flight_keeps_ticking_at_the_interval() {
    let ((main_host, mut main), (worker_host, mut worker)) = main_and_worker();
    let (_request, _) = send(&worker_host, &mut worker, 7);
    // Long after ROUTING_MS, the stream (a long generation) still runs: its in-flight count
    // must stay fresh for the other VMs.
    for _ in 0..=(ROUTING_MS / INTERVAL_MS) {
        main_host.clock.advance(INTERVAL_MS);
        main.on_tick();
        worker.on_tick();
    }
    assert_eq!(worker_host.tick_period_ms.get(), Some(INTERVAL_MS as u32));
}
