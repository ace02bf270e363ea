use super::*;
use crate::config::load;
use crate::flow_control::queue::Release;
use crate::harness::test;
use crate::host::fake::{FakeHost, FakeShared};
use crate::vm::releases::{carry_out, Carried};
use std::cell::RefCell;

fn host(path: &str, body: &str) -> FakeHost {
    let host = FakeHost {
        body: RefCell::new(body.as_bytes().to_vec()),
        ..FakeHost::default()
    };
    host.headers
        .borrow_mut()
        .insert(":path".into(), path.into());
    host.headers
        .borrow_mut()
        .insert(DESTINATION_HEADER.into(), "6.6.6.6:22".into());
    host
}

/// No endpoint of the one pool has a request in flight.
fn nothing_in_flight(router: &PoolRouter) -> bool {
    let endpoints = &only(router).data.pool().endpoints;
    endpoints.iter().all(|e| e.in_flight == 0)
}

/// The one pool of a test picker.
fn only(router: &PoolRouter) -> &PoolSlot {
    router.slot(0).unwrap()
}

/// A pool of `config`, each endpoint scraped at time 0 with the waiting queue `waiting[i]`.
fn scraped_slot(name: &str, config: crate::config::FilterConfig, waiting: &[u32]) -> PoolSlot {
    let mut slot = PoolSlot::new(name.into(), config);
    for (index, waiting) in waiting.iter().enumerate() {
        let body = format!("vllm:num_requests_waiting {waiting}\n");
        slot.data.scrape_answered(index, 0, &body).unwrap();
    }
    slot.data.refresh_health(0);
    slot
}

fn director() -> PoolRouter {
    let config = load("pool: {endpoints: [{address: '127.0.0.1:8001'}]}", 1).unwrap();
    PoolRouter::new(vec![(scraped_slot("default", config, &[0]), None)], None)
}

#[test]
fn body_is_buffered_then_routed_and_client_header_overwritten() {
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut director = director();
    let mut flow = RequestDriver::default();
    assert_eq!(flow.on_headers(&host, &mut director, false), Next::Pause);
    assert_eq!(flow.on_body(&host, &mut director, 5, false), Next::Pause);
    assert_eq!(
        flow.on_body(&host, &mut director, host.body.borrow().len(), true),
        Next::Continue
    );
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
    assert_eq!(only(&director).data.pool().endpoints[0].in_flight, 1);
    flow.on_done(&mut director, 0, &FakeShared::default());
    flow.on_done(&mut director, 0, &FakeShared::default());
    assert_eq!(
        only(&director).data.pool().endpoints[0].in_flight,
        0,
        "released exactly once"
    );
}

#[test]
fn trailers_end_the_stream_and_the_request_is_decided_there() {
    let body = r#"{"model":"m","prompt":"x"}"#;
    let host = host("/v1/%63ompletions", body);
    let mut director = director();
    let mut flow = RequestDriver::default();
    assert_eq!(flow.on_headers(&host, &mut director, false), Next::Pause);
    assert_eq!(
        flow.on_body(&host, &mut director, body.len(), false),
        Next::Pause
    );
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "6.6.6.6:22");
    assert_eq!(flow.on_trailers(&host, &mut director), Next::Continue);
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
    assert_eq!(
        flow.on_trailers(&host, &mut director),
        Next::Continue,
        "decided once"
    );
    assert_eq!(only(&director).data.pool().endpoints[0].in_flight, 1);
}

#[test]
fn trailers_without_data_get_the_body_error() {
    let host = host("/v1/chat/completions", "");
    let mut director = director();
    let mut flow = RequestDriver::default();
    assert_eq!(flow.on_headers(&host, &mut director, false), Next::Pause);
    assert_eq!(flow.on_trailers(&host, &mut director), Next::Pause);
    assert_eq!(host.reply.borrow().as_ref().unwrap().0, 400);
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "6.6.6.6:22");
}

#[test]
fn get_without_body_is_routed_at_headers() {
    let host = host("/v1/models", "");
    let mut director = director();
    let mut flow = RequestDriver::default();
    assert_eq!(flow.on_headers(&host, &mut director, true), Next::Continue);
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
}

#[test]
fn errors_become_json_replies() {
    let mut director = director();
    for (path, body, end_at_headers, status) in [
        ("/v1/chat/completions", "{oops", false, 400),
        ("/v1/completions", r#"{"prompt":"x"}"#, false, 400),
        ("/v1/completions", "", true, 400),
    ] {
        let host = host(path, body);
        let mut flow = RequestDriver::default();
        if flow.on_headers(&host, &mut director, end_at_headers) == Next::Pause && !end_at_headers {
            flow.on_body(&host, &mut director, body.len(), true);
        }
        let (got, json) = host.reply.borrow().clone().unwrap();
        assert_eq!(got, status, "{path} {body}");
        let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(parsed["error"]["code"], status);
        assert_eq!(
            host.headers.borrow()[DESTINATION_HEADER],
            "6.6.6.6:22",
            "never forwarded"
        );
    }
    assert_eq!(only(&director).data.pool().endpoints[0].in_flight, 0);
}

#[test]
fn oversized_body_is_413_before_buffering_completes() {
    let host = host("/v1/completions", "");
    let mut director = director();
    let mut flow = RequestDriver::default();
    flow.on_headers(&host, &mut director, false);
    let limit = only(&director).data.settings().max_request_body_bytes;
    assert_eq!(
        flow.on_body(&host, &mut director, limit + 1, false),
        Next::Pause
    );
    assert_eq!(host.reply.borrow().as_ref().unwrap().0, 413);
}

#[test]
fn failing_to_set_the_header_refuses_and_releases() {
    let mut host = host("/v1/models", "");
    host.fail_set_header = true;
    let mut director = director();
    let mut flow = RequestDriver::default();
    flow.on_headers(&host, &mut director, true);
    assert_eq!(host.reply.borrow().as_ref().unwrap().0, 503);
    assert_eq!(only(&director).data.pool().endpoints[0].in_flight, 0);
}

fn routed(host: &FakeHost, director: &mut PoolRouter) -> RequestDriver {
    let mut flow = RequestDriver::default();
    if flow.on_headers(host, director, false) == Next::Pause {
        let size = host.body.borrow().len();
        assert_eq!(flow.on_body(host, director, size, true), Next::Continue);
    }
    flow
}

#[test]
fn request_id_is_added_only_when_absent() {
    let mut director = director();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let flow = routed(&host, &mut director);
    let id = host.headers.borrow()[REQUEST_ID_HEADER].clone();
    assert_eq!(id.len(), 36, "{id}");
    assert_eq!(flow.request_id, id);
    let host = host_with(
        "/v1/completions",
        r#"{"model":"m","prompt":"x"}"#,
        &[(REQUEST_ID_HEADER, "abc")],
    );
    let flow = routed(&host, &mut director);
    assert_eq!(flow.request_id, "abc");
    assert_eq!(host.headers.borrow()[REQUEST_ID_HEADER], "abc");
}

#[test]
fn model_rewrite_changes_the_forwarded_body() {
    let mut director = director();
    let body = r#"{"model":"m","prompt":"x","max_tokens":2}"#;
    let host = host_with(
        "/v1/completions",
        body,
        &[("x-gateway-model-name-rewrite", "m-v2")],
    );
    let flow = routed(&host, &mut director);
    let forwarded: serde_json::Value = serde_json::from_slice(&host.body.borrow()).unwrap();
    assert_eq!(forwarded["model"], "m-v2");
    assert_eq!(forwarded["max_tokens"], 2);
    assert_eq!(
        host.headers.borrow()["content-length"],
        host.body.borrow().len().to_string()
    );
    let Outcome::Routed(routed) = &flow.outcome else {
        panic!("not routed: {:?}", flow.outcome);
    };
    assert_eq!(routed.model, "m-v2");
}

#[test]
fn client_prefiller_header_is_removed() {
    let mut director = director();
    let host = host_with(
        "/v1/completions",
        r#"{"model":"m","prompt":"x"}"#,
        &[(PREFILLER_HEADER, "6.6.6.6:1")],
    );
    routed(&host, &mut director);
    assert!(!host.headers.borrow().contains_key(PREFILLER_HEADER));
}

fn host_with(path: &str, body: &str, extra: &[(&str, &str)]) -> FakeHost {
    let host = host(path, body);
    for (name, value) in extra {
        host.headers
            .borrow_mut()
            .insert((*name).into(), (*value).into());
    }
    host
}

#[test]
fn a_5xx_answer_backs_the_pod_off() {
    let mut director = director();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut flow = routed(&host, &mut director);
    host.response_headers
        .borrow_mut()
        .insert(":status".into(), "503".into());
    let Outcome::Routed(routed_to) = &flow.outcome else {
        panic!("routed");
    };
    *host.upstream.borrow_mut() = Some(routed_to.destination.clone());
    flow.on_response_headers(&host, &mut director);
    flow.on_done(&mut director, 0, &FakeShared::default());
    assert!(only(&director).data.pool().endpoints[0].backoff_until_ms > 0);
    // The only pod is backing off: the request still goes somewhere (degraded).
    let flow = routed(&host, &mut director);
    let Outcome::Routed(routed) = &flow.outcome else {
        panic!("{:?}", flow.outcome);
    };
    assert!(routed.degraded);
}

/// Three pods, pod 0 preferred (shortest queue), with two fallbacks in the header.
fn director_with_fallbacks() -> PoolRouter {
    let config = "plugins: [{type: queue-scorer}, {type: max-score-picker, parameters: {maxNumOfEndpoints: 3}}]\n\
                  pool: {destinationList: true, endpoints: [{address: '127.0.0.1:8001'}, {address: '127.0.0.1:8002'}, {address: '127.0.0.1:8003'}]}";
    let slot = scraped_slot("default", load(config, 1).unwrap(), &[0, 1, 2]);
    PoolRouter::new(vec![(slot, None)], None)
}

fn respond(
    host: &FakeHost,
    flow: &mut RequestDriver,
    director: &mut PoolRouter,
    status: &str,
    served: &str,
) {
    host.response_headers
        .borrow_mut()
        .insert(":status".into(), status.into());
    *host.upstream.borrow_mut() = Some(served.into());
    flow.on_response_headers(host, director);
}

fn backing_off(director: &PoolRouter) -> Vec<bool> {
    only(director)
        .data
        .pool()
        .endpoints
        .iter()
        .map(|e| e.backoff_until_ms > 0)
        .collect()
}

#[test]
fn a_request_envoy_retried_on_a_fallback_backs_the_skipped_pods_off() {
    let mut director = director_with_fallbacks();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut flow = routed(&host, &mut director);
    assert_eq!(
        host.headers.borrow()[DESTINATION_HEADER],
        "127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003"
    );
    // The primary refused the connection; the first fallback answered.
    respond(&host, &mut flow, &mut director, "200", "127.0.0.1:8002");
    assert_eq!(backing_off(&director), [true, false, false]);
    let in_flight: Vec<u32> = only(&director)
        .data
        .pool()
        .endpoints
        .iter()
        .map(|e| e.in_flight)
        .collect();
    assert_eq!(
        in_flight,
        [0, 1, 0],
        "the count moved to the pod serving it"
    );
    flow.on_done(&mut director, 0, &FakeShared::default());
    assert!(nothing_in_flight(&director));
    // The next request is not offered to the pod that could not take the last one.
    let host = host_with("/v1/completions", r#"{"model":"m","prompt":"y"}"#, &[]);
    routed(&host, &mut director);
    assert_eq!(
        host.headers.borrow()[DESTINATION_HEADER],
        "127.0.0.1:8002,127.0.0.1:8003"
    );
}

#[test]
fn served_by_the_primary_backs_nothing_off_and_a_last_503_backs_every_attempt_off() {
    let mut director = director_with_fallbacks();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut flow = routed(&host, &mut director);
    respond(&host, &mut flow, &mut director, "200", "127.0.0.1:8001");
    assert_eq!(backing_off(&director), [false, false, false]);
    flow.on_done(&mut director, 0, &FakeShared::default());
    // Every attempt failed; Envoy's 503 comes after the last one, on the third address.
    let mut flow = routed(&host, &mut director);
    respond(&host, &mut flow, &mut director, "503", "127.0.0.1:8003");
    assert_eq!(backing_off(&director), [true, true, true]);
    flow.on_done(&mut director, 0, &FakeShared::default());
    assert!(nothing_in_flight(&director));
}

#[test]
fn a_503_envoy_made_without_reaching_a_pod_backs_nothing_off() {
    let mut director = director_with_fallbacks();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut flow = routed(&host, &mut director);
    // No healthy upstream: Envoy answers itself and the property is absent.
    host.response_headers
        .borrow_mut()
        .insert(":status".into(), "503".into());
    *host.upstream.borrow_mut() = None;
    flow.on_response_headers(&host, &mut director);
    assert_eq!(backing_off(&director), [false, false, false]);
    flow.on_done(&mut director, 0, &FakeShared::default());
    // The same 503 after reaching the pick is the pick's.
    let mut flow = routed(&host, &mut director);
    respond(&host, &mut flow, &mut director, "503", "127.0.0.1:8001");
    assert_eq!(backing_off(&director), [true, false, false]);
    flow.on_done(&mut director, 0, &FakeShared::default());
}

#[test]
fn an_address_outside_the_list_says_nothing_about_the_listed_pods() {
    let mut director = director_with_fallbacks();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    let mut flow = routed(&host, &mut director);
    respond(&host, &mut flow, &mut director, "200", "10.9.9.9:80");
    assert_eq!(backing_off(&director), [false, false, false]);
    flow.on_done(&mut director, 0, &FakeShared::default());
    assert!(nothing_in_flight(&director));
}

#[test]
fn the_request_headers_are_read_in_one_host_call() {
    let mut director = director();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    routed(&host, &mut director);
    let reads = host.reads.borrow().clone();
    assert_eq!(reads, ["*"], "one snapshot, no header read one by one");
}

#[test]
fn protocol_headers_a_client_sent_are_removed_and_absent_ones_left_alone() {
    let mut director = director();
    let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
    for name in [FALLBACK_HEADER, FALLBACKS_HEADER, PREFILLER_HEADER] {
        host.headers
            .borrow_mut()
            .insert(name.into(), "6.6.6.6:22".into());
    }
    routed(&host, &mut director);
    let headers = host.headers.borrow();
    for name in [FALLBACK_HEADER, FALLBACKS_HEADER, PREFILLER_HEADER] {
        assert!(!headers.contains_key(name), "{name} survived");
    }
    assert_eq!(headers[DESTINATION_HEADER], "127.0.0.1:8001");
    // Without a snapshot every one of them counts as sent.
    assert_eq!(
        ClientSent::default(),
        ClientSent {
            fallback: true,
            fallbacks: true,
            prefiller: true
        }
    );
}

#[test]
fn a_refusal_is_sent_only_from_a_root_callback() {
    let mut director = director();
    let refusal = || Release::Refused {
        id: 7,
        request_id: "r".into(),
        error: RequestError::Dropped(crate::error_response::Dropped::TtlExpired),
        waited_ms: 5,
    };
    let host = host("/v1/completions", "");
    assert_eq!(
        carry_out(&host, director.slot_mut(0).unwrap(), refusal(), false),
        Carried::Deferred(refusal())
    );
    assert!(
        host.reply.borrow().is_none(),
        "nothing sent from a stream callback"
    );
    assert_eq!(
        carry_out(&host, director.slot_mut(0).unwrap(), refusal(), true),
        Carried::Answered
    );
    assert_eq!(host.reply.borrow().as_ref().map(|r| r.0), Some(429));
}

fn two_pools() -> PoolRouter {
    let text = "poolHeader: x-gateway-inference-pool\npools:\n\
                - {name: llama, models: [llama-3, sql-lora], endpoints: [{address: '127.0.0.1:8001'}]}\n\
                - {name: qwen, models: ['qwen-*'], endpoints: [{address: '127.0.0.1:8002'}]}\n";
    let set = crate::config::load_set(text, 1, false).unwrap();
    let header = set.pool_header.clone();
    let slots = set
        .pools
        .into_iter()
        .map(|pool| {
            let models = pool.router_models();
            (scraped_slot(&pool.name, pool.config, &[0]), models)
        })
        .collect();
    PoolRouter::new(slots, header)
}

#[test]
fn the_model_picks_the_pool_and_its_name_is_written() {
    let mut router = two_pools();
    for (model, endpoint, pool) in [
        ("qwen-7b", "127.0.0.1:8002", "qwen"),
        ("sql-lora", "127.0.0.1:8001", "llama"),
    ] {
        let host = host(
            "/v1/completions",
            &format!(r#"{{"model":"{model}","prompt":"x"}}"#),
        );
        let mut flow = routed(&host, &mut router);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], endpoint);
        assert_eq!(host.headers.borrow()["x-gateway-inference-pool"], pool);
        assert_eq!(router.slots()[flow.pool()].name, pool);
        flow.on_done(&mut router, 0, &FakeShared::default());
    }
    let in_flight = |p: usize| router.slot(p).unwrap().data.pool().endpoints[0].in_flight;
    assert_eq!(
        (in_flight(0), in_flight(1)),
        (0, 0),
        "each released in its own pool"
    );
}

#[test]
fn a_model_no_pool_serves_is_a_404_naming_it() {
    let mut router = two_pools();
    let host = host(
        "/v1/chat/completions",
        r#"{"model":"mistral","messages":[]}"#,
    );
    let mut flow = RequestDriver::default();
    flow.on_headers(&host, &mut router, false);
    flow.on_body(&host, &mut router, host.body.borrow().len(), true);
    let (status, body) = host.reply.borrow().clone().unwrap();
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("`mistral` does not exist"));
    assert_eq!(
        host.headers.borrow()[DESTINATION_HEADER],
        "6.6.6.6:22",
        "never routed"
    );
}

#[test]
fn the_rewritten_model_picks_the_pool() {
    let mut router = two_pools();
    let host = host("/v1/completions", r#"{"model":"llama-3","prompt":"x"}"#);
    host.headers
        .borrow_mut()
        .insert(MODEL_REWRITE_HEADER.into(), "qwen-14b".into());
    routed(&host, &mut router);
    assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8002");
}

#[test]
fn messages_api_refusals_are_anthropic_shaped() {
    let anthropic = |host: &FakeHost| {
        let (status, json) = host.reply.borrow().clone().unwrap();
        let body: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(body["type"], "error", "{body}");
        (
            status,
            body["error"]["type"].as_str().unwrap_or("").to_owned(),
        )
    };
    let mut director = director();
    let bad = host("/v1//messages/", "{oops");
    let mut flow = RequestDriver::default();
    flow.on_headers(&bad, &mut director, false);
    flow.on_body(&bad, &mut director, 5, true);
    assert_eq!(anthropic(&bad), (400, "invalid_request_error".into()));
    let held = host("/v1/messages", "");
    let refusal = Release::Refused {
        id: 7,
        request_id: "r".into(),
        error: RequestError::Dropped(crate::error_response::Dropped::QueueFullNoEndpoints),
        waited_ms: 5,
    };
    carry_out(&held, director.slot_mut(0).unwrap(), refusal, true);
    assert_eq!(anthropic(&held), (503, "overloaded_error".into()));
}
