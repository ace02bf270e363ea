use super::*;
use crate::config::load;
use crate::datalayer::ModelsChange;
use crate::endpoint::{Health, Pool};
use crate::flow_control::queue::{Admission, Release};
use crate::flow_control::{Arrival, FlowControl};
use crate::harness::test;
use crate::host::fake::FakeCallouts;
use crate::host::SharedData;
use crate::metrics::ExtractError;
use crate::request::{ApiKind, RequestHeaders};
use crate::router::{Decided, PoolSlot};
use crate::scheduling::ExplainRow;
use crate::tick_driver::TickReport;

/// One pool's rooms, driven as the request path and the tick drive them; the callouts the
/// data layer sends go to the fake.
struct Rooms(PoolSlot, FakeCallouts);

impl Rooms {
    fn new(config: FilterConfig) -> Self {
        Rooms(
            PoolSlot::new("default".into(), config),
            FakeCallouts::default(),
        )
    }

    /// The endpoints the data layer scrapes when this VM ticks as the scraper now.
    fn take_scrape_targets(&mut self, out: &mut Vec<usize>) {
        let now = self.pool().now_ms();
        self.0.data.call_out(&self.1, now);
        out.clear();
        for call in self.1.take_sent() {
            let index = call.authority().and_then(|a| self.pool().index_of(a));
            out.push(index.expect("a scrape of a member"));
        }
    }

    fn pool(&self) -> &Pool {
        self.0.data.pool()
    }

    fn on_scrape_ok(&mut self, index: usize, now: u64, body: &str) -> Result<(), ExtractError> {
        self.0.data.scrape_answered(index, now, body)
    }

    fn on_scrape_failed(&mut self, index: usize) {
        self.0.data.scrape_failed(index);
    }

    fn on_tick(&mut self, now: u64) -> TickReport {
        let (transitions, all_unfresh) = self.0.data.refresh_health(now);
        let saturated = self.0.director.saturation_change(&self.0.data, now);
        TickReport {
            transitions,
            all_unfresh,
            saturated,
        }
    }

    fn prepare(
        &self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<Prepared, RequestError> {
        let keep = self.0.director.prompt_chars_needed();
        let mut prepared = parse_prepared(api, body, headers, keep)?;
        Director::complete_prepared(&self.0.data, &mut prepared)?;
        Ok(prepared)
    }

    fn route(
        &mut self,
        api: ApiKind,
        body: Option<&[u8]>,
        headers: RequestHeaders,
    ) -> Result<Routed, RequestError> {
        let prepared = self.prepare(api, body, headers)?;
        match self
            .0
            .decide(prepared, None, 0, &crate::host::fake::NoSharedData)
        {
            Decided::Routed(routed) => Ok(routed),
            Decided::Refused(error) => Err(error),
            Decided::Held => panic!("held without an arrival"),
        }
    }

    fn route_prepared(&mut self, prepared: Prepared) -> Result<Routed, RequestError> {
        self.0.director.route_prepared(&mut self.0.data, prepared)
    }

    fn release(&mut self, routed: &Routed) {
        self.0.director.request_ended(&mut self.0.data, routed);
    }

    fn report_response(&mut self, routed: &mut Routed, served: Option<&str>, failed: bool) {
        let slot = &mut self.0;
        slot.director
            .report_response(&mut slot.data, routed, served, failed);
    }

    fn take_learned(&mut self, out: &mut Vec<LearnedPrefix>) {
        self.0.director.take_learned(out);
    }

    fn explain_rows(&self) -> Vec<ExplainRow<'_>> {
        self.0.director.explain_rows(&self.0.data)
    }

    fn pool_saturation(&self, now: u64) -> Option<f64> {
        self.0.director.pool_saturation(&self.0.data, now)
    }

    fn flow_control(&self) -> Option<&FlowControl> {
        self.0.queue.as_ref().map(|queue| queue.control())
    }

    fn admit(
        &mut self,
        prepared: Prepared,
        arrival: Arrival,
        now: u64,
        store: &dyn SharedData,
    ) -> Admission {
        let slot = &mut self.0;
        let queue = slot.queue.as_mut().unwrap();
        queue.admit((&slot.director, &slot.data), prepared, arrival, now, store)
    }

    fn releases(&mut self, now: u64, store: &dyn SharedData, out: &mut Vec<Release>) {
        let slot = &mut self.0;
        let queue = slot.queue.as_mut().unwrap();
        queue.releases((&mut slot.director, &mut slot.data), now, store, out);
    }

    fn queue(&mut self) -> &mut crate::flow_control::queue::Queue {
        self.0.queue.as_mut().unwrap()
    }
}

const CONFIG: &str = "
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
pool:
  endpoints:
  - address: 10.0.0.1:8000
  - address: 10.0.0.2:8000
  - address: 10.0.0.3:8000
";

fn director() -> Rooms {
    Rooms::new(load(CONFIG, 7).unwrap())
}

fn scrape(director: &mut Rooms, index: usize, queue: u32, kv: f64) {
    let body = format!("vllm:num_requests_waiting {queue}\nvllm:kv_cache_usage_perc {kv}\n");
    director.on_scrape_ok(index, 1000, &body).unwrap();
}

const BODY: &[u8] = br#"{"model":"m","prompt":"hi"}"#;

fn route(director: &mut Rooms, api: ApiKind, body: Option<&[u8]>) -> Result<Routed, RequestError> {
    director.route(api, body, RequestHeaders::default())
}

#[test]
fn routes_to_shortest_queue_with_fallback_list() {
    let mut director = director();
    scrape(&mut director, 0, 5, 0.1);
    scrape(&mut director, 1, 0, 0.9);
    scrape(&mut director, 2, 2, 0.1);
    director.on_tick(1000);
    let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    // queue: 0.0, 1.0, 0.6; kv: 0.9, 0.1, 0.9 -> totals 0.9, 1.1, 1.5
    assert_eq!(routed.destination, "10.0.0.3:8000");
    assert_eq!(routed.fallbacks, "10.0.0.2:8000");
    assert_eq!(routed.primary, 2);
    assert_eq!(director.pool().endpoints[2].in_flight, 1);
    assert_eq!(director.pool().endpoints[2].in_flight_tokens, 1 + 256);
    director.release(&routed);
    assert_eq!(director.pool().endpoints[2].in_flight, 0);
}

#[test]
fn the_decision_line_shows_the_load_each_pod_was_scored_at() {
    let mut director = director();
    for (index, waiting) in [(0, 5), (1, 0), (2, 2)] {
        let body = format!("vllm:num_requests_running 1\nvllm:num_requests_waiting {waiting}\nvllm:kv_cache_usage_perc 0.1\n");
        director.on_scrape_ok(index, 1000, &body).unwrap();
    }
    director.on_tick(1000);
    let first = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert_eq!(first.primary, 1);
    let loads = |director: &Rooms| -> Vec<(Option<f64>, Option<f64>)> {
        director
            .explain_rows()
            .iter()
            .map(|row| (row.running, row.waiting))
            .collect()
    };
    // As scored: before this request was placed.
    assert_eq!(
        loads(&director),
        [
            (Some(1.0), Some(5.0)),
            (Some(1.0), Some(0.0)),
            (Some(1.0), Some(2.0))
        ]
    );
    route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert_eq!(
        loads(&director)[1],
        (Some(2.0), Some(0.0)),
        "the first request counted"
    );
    let line = director.0.director.explain_last(&director.0.data);
    assert!(line.contains("10.0.0.1:8000 total="), "{line}");
    assert!(line.contains("running=1.0 waiting=5.0"), "{line}");
}

fn with_subset(subset: &[&str]) -> RequestHeaders {
    RequestHeaders {
        subset_hint: Some(subset.iter().map(|a| a.to_string()).collect()),
        ..RequestHeaders::default()
    }
}

#[test]
fn the_subset_hint_narrows_the_pick_and_an_empty_one_is_503() {
    let mut director = director();
    for index in 0..3 {
        scrape(&mut director, index, index as u32, 0.1);
    }
    director.on_tick(1000);
    let api = ApiKind::Completions;
    // The best (shortest queue) is 10.0.0.1; the hint leaves only 10.0.0.3 and an address
    // outside the pool, which never becomes a candidate.
    let hint = with_subset(&["10.0.0.3:8000", "10.9.9.9:8000"]);
    let routed = director.route(api, Some(BODY), hint).unwrap();
    assert_eq!(routed.destination, "10.0.0.3:8000");
    assert_eq!(routed.fallbacks, "", "no fallback outside the subset");
    director.release(&routed);
    let error = director
        .route(api, Some(BODY), with_subset(&[]))
        .unwrap_err();
    assert_eq!(error.status(), 503);
    let outside = director.route(api, Some(BODY), with_subset(&["10.9.9.9:8000"]));
    assert_eq!(outside.unwrap_err().status(), 503);
    assert!(director.pool().endpoints.iter().all(|e| e.in_flight == 0));
    // Stale metrics everywhere: the pick still stays within the hint.
    director.on_tick(1_000_000);
    let routed = director
        .route(api, Some(BODY), with_subset(&["10.0.0.2:8000"]))
        .unwrap();
    assert_eq!(routed.destination, "10.0.0.2:8000");
    director.release(&routed);
    // No metrics yet anywhere: the degraded pick stays within the hint too.
    let mut unscraped = self::director();
    unscraped.on_tick(1000);
    let routed = unscraped
        .route(api, Some(BODY), with_subset(&["10.0.0.2:8000"]))
        .unwrap();
    assert!(routed.degraded);
    assert_eq!(routed.destination, "10.0.0.2:8000");
}

#[test]
fn with_a_models_source_only_pods_reporting_the_model_are_candidates() {
    let config = "featureGates: [dataLayer]\nplugins: [{type: queue-scorer}, {type: max-score-picker}, {type: models-data-source}]\npool: {endpoints: [{address: 10.0.0.1:8000}, {address: 10.0.0.2:8000}]}";
    let mut director = Rooms::new(load(config, 1).unwrap());
    scrape(&mut director, 0, 0, 0.1);
    scrape(&mut director, 1, 5, 0.1);
    director.on_tick(1000);
    director.0.data.models_answered(0, vec!["base".into()]);
    let change = director
        .0
        .data
        .models_answered(1, vec!["base".into(), "lora-x".into()]);
    assert_eq!(
        change,
        ModelsChange {
            pod: true,
            pool: true
        }
    );
    let same = director
        .0
        .data
        .models_answered(1, vec!["base".into(), "lora-x".into()]);
    assert_eq!(same, ModelsChange::default());
    assert_eq!(director.0.data.models().served(), ["base", "lora-x"]);
    let body = |model: &str| format!(r#"{{"model":"{model}","prompt":"hi"}}"#);
    let route = |director: &mut Rooms, model: &str| {
        let routed = director
            .route(
                ApiKind::Completions,
                Some(body(model).as_bytes()),
                RequestHeaders::default(),
            )
            .unwrap();
        director.release(&routed);
        routed.destination
    };
    assert_eq!(
        route(&mut director, "base"),
        "10.0.0.1:8000",
        "shortest queue"
    );
    assert_eq!(
        route(&mut director, "lora-x"),
        "10.0.0.2:8000",
        "the only pod with it"
    );
    // Another VM applies what this one learned, pod by pod.
    let reported: Vec<(String, Vec<String>)> = director
        .0
        .data
        .models()
        .reported(director.pool())
        .into_iter()
        .map(|(a, m)| (a.to_owned(), m.to_vec()))
        .collect();
    let mut follower = Rooms::new(load(config, 2).unwrap());
    assert!(follower.0.data.apply_reported_models(&reported).pool);
    assert_eq!(follower.0.data.models().served(), ["base", "lora-x"]);
    assert!(follower.0.data.models().narrows("lora-x"));
    let serving: Vec<bool> = (0..2)
        .map(|i| follower.0.data.models().reports(i, "lora-x"))
        .collect();
    assert_eq!(serving, [false, true]);
    assert!(
        !follower.0.data.models().narrows("unlisted"),
        "no pod reports it: no restriction"
    );
}

#[test]
fn a_request_served_by_a_fallback_teaches_the_prefix_to_the_server() {
    let config = "plugins: [{type: prefix-cache-scorer}, {type: queue-scorer}, {type: max-score-picker, parameters: {maxNumOfEndpoints: 2}}]\npool: {emitEndpointScores: true, endpoints: [{address: 10.0.0.1:8000}, {address: 10.0.0.2:8000}]}";
    let mut director = Rooms::new(load(config, 1).unwrap());
    scrape(&mut director, 0, 0, 0.1);
    scrape(&mut director, 1, 3, 0.1);
    director.on_tick(1000);
    let prompt = "a long shared system prompt ".repeat(40);
    let body = format!(r#"{{"model":"m","prompt":"{prompt}"}}"#);
    let mut routed = director
        .route(
            ApiKind::Completions,
            Some(body.as_bytes()),
            RequestHeaders::default(),
        )
        .unwrap();
    assert_eq!(
        (routed.primary, routed.fallbacks.as_str()),
        (0, "10.0.0.2:8000")
    );
    let scores: serde_json::Value =
        serde_json::from_str(routed.scores.as_deref().unwrap()).unwrap();
    assert!(scores["10.0.0.1:8000"].as_f64().unwrap() > scores["10.0.0.2:8000"].as_f64().unwrap());
    let mut learned = Vec::new();
    director.take_learned(&mut learned);
    assert!(
        learned.iter().all(|l| l.endpoint == 0),
        "the pick taught the primary"
    );
    // Envoy retried it on the fallback, which answered.
    director.report_response(&mut routed, Some("10.0.0.2:8000"), false);
    assert_eq!(routed.primary, 1);
    director.take_learned(&mut learned);
    let served = learned
        .iter()
        .find(|l| l.endpoint == 1)
        .expect("the server learned it");
    assert!(!served.hashes.is_empty());
    assert_eq!(
        director.pool().endpoints[1].in_flight,
        1,
        "in flight where it is served"
    );
    assert_eq!(director.pool().endpoints[0].in_flight, 0);
}

#[test]
fn scrape_failures_and_staleness_remove_endpoints() {
    let mut director = director();
    scrape(&mut director, 0, 0, 0.0);
    scrape(&mut director, 1, 9, 0.9);
    director.on_scrape_failed(2);
    director.on_tick(1000);
    for _ in 0..20 {
        let mut routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
        assert!(
            !routed.destination.contains("10.0.0.3"),
            "{}",
            routed.destination
        );
        director.report_response(&mut routed, None, false);
        director.release(&routed);
    }
    // All metrics stale (late, not failed): still scored from the last readings, never to
    // the pod whose scrape failed.
    let report = director.on_tick(10_000);
    assert_eq!(report.all_unfresh, Some(true));
    let mut routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert!(!routed.degraded);
    assert_eq!(routed.primary, 0, "the shorter queue at the last reading");
    // While that request is owed and the pod gave no answer lately, it may hang; once it
    // answers it is a candidate again.
    let next = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert_eq!(next.primary, 1);
    director.release(&next);
    director.report_response(&mut routed, None, false);
    let next = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert_eq!(next.primary, 0);
    director.release(&next);
    director.release(&routed);
    director.on_scrape_failed(0);
    director.on_scrape_failed(1);
    director.on_tick(10_000);
    let error = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap_err();
    assert_eq!(error.status(), 503);
}

#[test]
fn bad_bodies_are_client_errors_and_take_no_slot() {
    let mut director = director();
    scrape(&mut director, 0, 0, 0.0);
    director.on_tick(1000);
    assert_eq!(
        route(&mut director, ApiKind::ChatCompletions, Some(b"{"))
            .unwrap_err()
            .status(),
        400
    );
    assert_eq!(
        route(&mut director, ApiKind::ChatCompletions, None)
            .unwrap_err()
            .status(),
        400
    );
    assert!(director.pool().endpoints.iter().all(|e| e.in_flight == 0));
    assert!(
        route(&mut director, ApiKind::Other, None).is_ok(),
        "GET /v1/models is routed"
    );
}

#[test]
fn non_model_server_scrape_counts_as_failure() {
    let mut director = director();
    assert!(director.on_scrape_ok(0, 1000, "up 1\n").is_err());
    director.on_tick(1000);
    assert_eq!(director.pool().endpoints[0].health, Health::Unreachable);
}

#[test]
fn an_infinite_queue_on_one_pod_leaves_the_queue_scorer_working_for_the_others() {
    let mut director = director();
    // Two 1e308 series: the sum overflows to +Inf.
    let hostile = "vllm:num_requests_waiting{m=\"a\"} 1e308\nvllm:num_requests_waiting{m=\"b\"} 1e308\nvllm:kv_cache_usage_perc 0.5\n";
    director.on_scrape_ok(0, 1000, hostile).unwrap();
    scrape(&mut director, 1, 7, 0.1);
    scrape(&mut director, 2, 1, 0.1);
    director.on_tick(1000);
    let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
    assert_eq!(routed.destination, "10.0.0.3:8000");
    assert_eq!(
        routed.fallbacks, "10.0.0.2:8000",
        "the unknown queue ranks last"
    );
    let queue_scores: Vec<(&str, f64)> = director
        .explain_rows()
        .iter()
        .map(|row| (row.address, row.scores[0].1))
        .collect();
    assert_eq!(
        queue_scores,
        [
            ("10.0.0.1:8000", 0.0),
            ("10.0.0.2:8000", 0.0),
            ("10.0.0.3:8000", 1.0)
        ]
    );
}

#[test]
fn a_body_over_max_metrics_bytes_is_not_parsed_past_the_cap() {
    let mut director = Rooms::new(load(&format!("{CONFIG}  maxMetricsBytes: 4096\n"), 7).unwrap());
    let mut body = String::from("vllm:num_requests_waiting 0\n");
    body.push_str(&"# padding\n".repeat(410));
    assert!(body.len() > 4096);
    assert_eq!(
        director.on_scrape_ok(0, 1000, &body).unwrap_err(),
        ExtractError::TooLarge { limit: 4096 }
    );
    director.on_tick(1000);
    assert_eq!(director.pool().endpoints[0].health, Health::Unreachable);
}

#[test]
fn scrape_targets_skip_pending_ones() {
    let mut director = director();
    let mut targets = Vec::new();
    director.take_scrape_targets(&mut targets);
    assert_eq!(targets, [0, 1, 2]);
    scrape(&mut director, 1, 0, 0.0);
    director.take_scrape_targets(&mut targets);
    assert_eq!(targets, [1]);
}

#[test]
fn with_replicas_each_pod_is_scraped_once_per_replicas_ticks() {
    let config = CONFIG.replace("pool:\n", "pool:\n  replicas: 4\n");
    let mut director = Rooms::new(load(&config, 7).unwrap());
    let mut targets = Vec::new();
    director.on_tick(1000);
    director.take_scrape_targets(&mut targets);
    assert_eq!(targets, [0, 1, 2]);
    for index in 0..3 {
        scrape(&mut director, index, 0, 0.0);
    }
    // Ticks every 50ms; each pod is due again 4 x 50ms after its scrape was sent.
    for now in [1050, 1100, 1150] {
        director.on_tick(now);
        director.take_scrape_targets(&mut targets);
        assert!(targets.is_empty(), "{now}: {targets:?}");
    }
    director.on_tick(1200);
    director.take_scrape_targets(&mut targets);
    assert_eq!(targets, [0, 1, 2]);
}

#[test]
fn discovery_adds_and_removes_but_keeps_static_endpoints() {
    let mut director = director();
    let labels = std::collections::BTreeMap::new;
    let found = vec![
        ("10.0.0.9:8000".to_string(), labels()),
        ("10.0.0.8:8000".to_string(), labels()),
    ];
    let (added, removed) = director.0.data.set_discovered(&found);
    assert_eq!(added, ["10.0.0.9:8000", "10.0.0.8:8000"]);
    assert!(removed.is_empty());
    assert_eq!(director.pool().len(), 5);
    for index in 0..4 {
        scrape(&mut director, index, 5, 0.5);
    }
    scrape(&mut director, 4, 0, 0.0);
    director.on_tick(1000);
    assert_eq!(
        route(&mut director, ApiKind::Completions, Some(BODY))
            .unwrap()
            .destination,
        "10.0.0.8:8000",
        "the idle discovered endpoint wins while it is listed"
    );
    let (added, removed) = director.0.data.set_discovered(&found[..1]);
    assert!(added.is_empty());
    assert_eq!(
        removed,
        ["10.0.0.8:8000"],
        "the three static endpoints stay"
    );
    let mut targets = Vec::new();
    director.take_scrape_targets(&mut targets);
    assert_eq!(targets, [0, 1, 2, 3], "removed endpoints are not scraped");
    // Another worker applies the list and ends up with the same indices.
    let mut other = self::director();
    other.0.data.apply_members(&director.0.data.members());
    assert_eq!(other.0.data.members(), director.0.data.members());
    director.on_tick(1000);
    for _ in 0..10 {
        let routed = route(&mut director, ApiKind::Completions, Some(BODY)).unwrap();
        assert_ne!(routed.destination, "10.0.0.8:8000");
    }
}

#[test]
fn a_saturation_change_is_announced_once_it_holds_for_two_ticks() {
    let mut director = director();
    let load_all = |director: &mut Rooms, queue: u32, now: u64| {
        for index in 0..3 {
            director
                .on_scrape_ok(
                    index,
                    now,
                    &format!("vllm:num_requests_waiting {queue}\nvllm:kv_cache_usage_perc 0.1\n"),
                )
                .unwrap();
        }
        director.on_tick(now).saturated
    };
    assert_eq!(load_all(&mut director, 0, 1000), None);
    assert_eq!(
        load_all(&mut director, 9, 1010),
        None,
        "one tick saturated: not yet"
    );
    assert_eq!(
        load_all(&mut director, 0, 1020),
        None,
        "and it passed: nothing said"
    );
    assert_eq!(load_all(&mut director, 9, 1030), None);
    assert_eq!(
        load_all(&mut director, 9, 1040),
        Some(true),
        "held two ticks"
    );
    assert_eq!(load_all(&mut director, 9, 1050), None);
    assert_eq!(load_all(&mut director, 0, 1060), None);
    assert_eq!(load_all(&mut director, 0, 1070), Some(false));
}

const FLOW: &str = "
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
- {type: round-robin-fairness-policy, name: rr}
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
  defaultRequestTTL: 1s
  priorityBands: [{priority: 5, fairnessPolicyRef: rr}]
pool:
  objectives: [{name: batch, priority: -1}]
  endpoints:
  - address: 10.0.0.1:8000
";

fn flow_arrival(id: u32) -> Arrival {
    Arrival {
        id,
        request_id: format!("r{id}"),
        priority: 0,
        fairness_id: "t".into(),
        bytes: BODY.len() as u64,
        slo_ttft_ms: None,
    }
}

#[test]
fn flow_control_holds_while_saturated_and_releases_as_requests_end() {
    let store = crate::host::fake::FakeShared::default();
    let mut director = Rooms::new(load(FLOW, 7).unwrap());
    scrape(&mut director, 0, 0, 0.0);
    director.on_tick(1000);
    let prepare = |director: &mut Rooms| {
        let headers = RequestHeaders {
            objective: Some("batch".into()),
            ..RequestHeaders::default()
        };
        director
            .prepare(ApiKind::Completions, Some(BODY), headers)
            .unwrap()
    };
    let prepared = prepare(&mut director);
    let first = match director.admit(prepared, flow_arrival(1), 1000, &store) {
        Admission::Now(prepared) => director.route_prepared(*prepared).unwrap(),
        other => panic!("room: routed at once, got {other:?}"),
    };
    assert_eq!(
        first.priority, -1,
        "sheddable, yet not refused with flow control on"
    );
    for id in [2, 3] {
        let prepared = prepare(&mut director);
        let admitted = director.admit(prepared, flow_arrival(id), 1010, &store);
        assert_eq!(admitted, Admission::Held, "saturated: held");
    }
    let mut out = Vec::new();
    director.releases(1020, &store, &mut out);
    assert!(out.is_empty(), "still saturated: nothing leaves");
    director.release(&first);
    director.releases(1030, &store, &mut out);
    let [Release::Routed {
        id: 2,
        waited_ms: 20,
        routed,
        ..
    }] = &out[..]
    else {
        panic!("the first held goes when the slot frees: {out:?}");
    };
    director.queue().record_dispatched(2, (**routed).clone());
    out.clear();
    director.releases(2011, &store, &mut out);
    let [Release::Refused { id: 3, error, .. }] = &out[..] else {
        panic!("the other expires after its TTL: {out:?}");
    };
    assert_eq!(error.status(), 429);
    assert!(director.queue().take_dispatched(2).is_some());
    assert_eq!(
        director.queue().abandon(3, 2100, &store),
        None,
        "already gone"
    );
}

/// A request of `priority` through flow control: routed if it may go now, `None` if held.
fn admit_flow(
    director: &mut Rooms,
    store: &dyn SharedData,
    id: u32,
    priority: i32,
    now: u64,
) -> Option<Routed> {
    let prepared = director
        .prepare(ApiKind::Completions, Some(BODY), RequestHeaders::default())
        .unwrap();
    let arrival = Arrival {
        priority,
        ..flow_arrival(id)
    };
    match director.admit(prepared, arrival, now, store) {
        Admission::Now(prepared) => Some(director.route_prepared(*prepared).unwrap()),
        _ => None,
    }
}

#[test]
fn holdback_keeps_the_last_capacity_for_the_higher_band() {
    let store = crate::host::fake::FakeShared::default();
    let config = FLOW
        .replace("maxConcurrency: 1", "maxConcurrency: 4")
        .replace(
            "- {type: round-robin-fairness-policy, name: rr}",
            "- {type: round-robin-fairness-policy, name: rr}\n- type: priority-holdback-policy\n  parameters: {minCeiling: 0.5}",
        )
        .replace(
            "  defaultRequestTTL: 1s",
            "  defaultRequestTTL: 1s\n  usageLimitPolicyPluginRef: priority-holdback-policy",
        );
    let mut director = Rooms::new(load(&config, 7).unwrap());
    scrape(&mut director, 0, 0, 0.0);
    director.on_tick(1000);
    let ceilings: Vec<(i32, f64)> = director
        .flow_control()
        .unwrap()
        .config()
        .bands
        .iter()
        .map(|b| (b.priority, b.ceiling))
        .collect();
    assert_eq!(ceilings, vec![(5, 1.0), (0, 0.75), (-1, 0.5)]);
    let admit = |director: &mut Rooms, id: u32, priority: i32| {
        admit_flow(director, &store, id, priority, 1000)
    };
    // Band 0 stops at 3 of 4 slots (0.75); band 5 may take the fourth.
    for id in 1..=3 {
        assert!(
            admit(&mut director, id, 0).is_some(),
            "band 0 under its ceiling"
        );
    }
    assert!(
        admit(&mut director, 4, 0).is_none(),
        "band 0 at its ceiling waits"
    );
    assert!(
        admit(&mut director, 5, 5).is_some(),
        "band 5 takes the held-back slot"
    );
}

/// The default usage limit with several bands keeps free the slots the higher band needs at
/// the rate it arrives, and runs every slot while only the lower band sends.
#[test]
fn the_default_reserve_keeps_slots_for_a_higher_band_only_while_it_arrives() {
    let store = crate::host::fake::FakeShared::default();
    let config = FLOW.replace("maxConcurrency: 1", "maxConcurrency: 16");
    let fresh = || {
        let mut director = Rooms::new(load(&config, 7).unwrap());
        scrape(&mut director, 0, 0, 0.0);
        director.on_tick(1000);
        director
    };
    let admit = |director: &mut Rooms, id: u32, priority: i32, now: u64| {
        admit_flow(director, &store, id, priority, now)
    };
    let taken_by_band_0 = |director: &mut Rooms, now: u64| {
        (100..)
            .take(17)
            .take_while(|&id| admit(director, id, 0, now).is_some())
            .count()
    };
    // Only band 0 has sent: every slot is its.
    let mut quiet = fresh();
    assert_eq!(taken_by_band_0(&mut quiet, 1000), 16);
    // One request in three is band 5 (each served at once): band 0 keeps two slots free
    // (one would be taken a quarter of the time, two 8 %).
    let mut mixed = fresh();
    let mut now = 1000;
    for id in 1..=60 {
        now += 10;
        let priority = if id % 3 == 0 { 5 } else { 0 };
        let routed = admit(&mut mixed, id, priority, now).unwrap();
        mixed.release(&routed);
    }
    assert_eq!(taken_by_band_0(&mut mixed, now), 14);
    assert_eq!(mixed.queue().last_kept(), 2, "the held line says why");
    assert!(admit(&mut mixed, 200, 5, now).is_some());
    assert!(admit(&mut mixed, 201, 5, now).is_some());
    assert!(admit(&mut mixed, 202, 5, now).is_none(), "the pool is full");
}

/// `body` with a pool of two endpoints.
fn load_with_pool(body: &str) -> Result<FilterConfig, crate::config::ConfigError> {
    let pool = "pool:\n  endpoints:\n  - address: 10.0.0.1:8000\n  - address: 10.0.0.2:8000\n";
    load(&format!("{body}\n{pool}"), 1)
}

/// Flow control waits only while no pod can take a request: a pod queued past its limit does
/// not hide another pod's free slots from the gate.
#[test]
fn the_flow_control_gate_sees_room_on_any_pod() {
    let config = load_with_pool(
        "plugins:\n- {type: concurrency-detector, parameters: {maxConcurrency: 2}}\n- {type: queue-scorer}\nsaturationDetector: {pluginRef: concurrency-detector}\n",
    )
    .unwrap();
    let mut director = Rooms::new(config);
    for i in 0..2 {
        director
            .on_scrape_ok(i, 1000, "vllm:num_requests_waiting 0\n")
            .unwrap();
    }
    director.on_tick(1000);
    for _ in 0..6 {
        director.0.data.add_in_flight(0, 0);
    }
    let saturation = director.pool_saturation(1000).unwrap();
    assert!(saturation < 1.0, "pod 1 is idle: {saturation}");
    for _ in 0..2 {
        director.0.data.add_in_flight(1, 0);
    }
    assert_eq!(director.pool_saturation(1000), Some(1.0), "both full");
}

/// What flow control lets go goes to a pod with room, not behind a full pod that scores
/// better on another signal.
#[test]
fn flow_control_sends_a_request_to_a_pod_with_room() {
    let config = load_with_pool(
        "featureGates: [flowControl]\nplugins:\n- {type: concurrency-detector, parameters: {maxConcurrency: 2}}\n- {type: queue-scorer}\nsaturationDetector: {pluginRef: concurrency-detector}\n",
    )
    .unwrap();
    let mut director = Rooms::new(config);
    director
        .on_scrape_ok(0, 1000, "vllm:num_requests_waiting 0\n")
        .unwrap();
    director
        .on_scrape_ok(1, 1000, "vllm:num_requests_waiting 3\n")
        .unwrap();
    director.on_tick(1000);
    for _ in 0..2 {
        director.0.data.add_in_flight(0, 0);
    }
    let body = br#"{"model":"m","prompt":"hello"}"#;
    let routed = director
        .route(ApiKind::Completions, Some(body), RequestHeaders::default())
        .unwrap();
    assert_eq!(routed.destination, "10.0.0.2:8000", "pod 0 has no room");
}

/// `core-metrics-extractor`'s `defaultEngine` reads an unlabelled pod's page by that engine's
/// metric names; a labelled pod keeps its label's.
#[test]
fn a_default_engine_reads_unlabelled_pods_by_its_metric_names() {
    let config = load(
        "plugins:\n- {type: core-metrics-extractor, parameters: {defaultEngine: trtllm-serve}}\n- {type: queue-scorer}\npool:\n  endpoints:\n  - address: 10.0.0.1:8000\n  - address: 10.0.0.2:8000\n    labels: {inference.networking.k8s.io/engine-type: vllm}\n",
        1,
    )
    .unwrap();
    assert_eq!(config.default_engine.as_deref(), Some("trtllm-serve"));
    let mut director = Rooms::new(config);
    let trtllm = "trtllm_num_requests_waiting 3\ntrtllm_num_requests_running 1\n";
    assert!(director.on_scrape_ok(0, 1000, trtllm).is_ok());
    assert_eq!(director.pool().waiting(0), Some(3.0));
    assert!(
        director.on_scrape_ok(1, 1000, trtllm).is_err(),
        "the labelled pod is read as vLLM"
    );
    assert!(load_with_pool(
        "plugins:\n- {type: core-metrics-extractor, parameters: {defaultEngine: tgi}}\n"
    )
    .is_err());
}
