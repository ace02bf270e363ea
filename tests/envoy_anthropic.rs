//! Anthropic's Messages API (`POST /v1/messages`) through a real Envoy in front of simulated
//! pods: parsed for scheduling like chat, streamed through untouched, refused in Anthropic's
//! error shape.

mod support;

use serde_json::Value;
use support::{example_envoy, shipped_picker_config, with_endpoints, Envoy, Sim, MODEL};

fn gateway(sims: &[&Sim]) -> Envoy {
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), sims), 2);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

fn messages_body(system: &Value, question: &str, extra: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","max_tokens":4,"system":{system},"messages":[{{"role":"user","content":[{{"type":"text","text":"{question}"}},{{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}}}]}}]{extra}}}"#
    )
}

#[test]
fn a_shared_system_prompt_keeps_messages_requests_on_the_warm_pod() {
    // One worker: each Envoy worker keeps its own prefix index until state is shared.
    let sims: Vec<Sim> = ["pod-a", "pod-b", "pod-c"]
        .iter()
        .map(|name| Sim::start(name, &[]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = example_envoy("prefix-and-load.yaml", &refs, 1);
    for sim in &refs {
        sim.wait_for_scrapes(3);
    }
    let system = "You are a meticulous assistant for the billing team. ".repeat(40);
    // The system prompt as a string first, then as text blocks: the same prompt either way.
    let as_string = Value::String(system.clone());
    let as_blocks = serde_json::json!([{"type": "text", "text": system}]);
    let first = envoy.post("/v1/messages", &messages_body(&as_string, "question 0", ""));
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["type"], "message");
    let home = first.pod();
    for n in 1..10 {
        let system = if n % 2 == 0 { &as_string } else { &as_blocks };
        let response = envoy.post(
            "/v1/messages",
            &messages_body(system, &format!("question {n}"), ""),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), home, "request {n} left the warm pod");
    }
    let stats = refs.iter().find(|s| s.name == home).unwrap().stats();
    assert!(stats["prefix_hits"].as_u64().unwrap() > 0, "{stats}");
    // A chat request with the same system prompt renders the same prefix, so it goes there too.
    let chat = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"from chat"}}],"max_tokens":4}}"#
    );
    assert_eq!(envoy.post("/v1/chat/completions", &chat).pod(), home);
    // Another system prompt has its own home (possibly the same pod), and its next request
    // follows it there.
    let other = Value::String("Answer as a pirate would, always. ".repeat(40));
    let cold = envoy.post("/v1/messages", &messages_body(&other, "hi", ""));
    assert_eq!(cold.status, 200, "{}", cold.text());
    let again = envoy.post("/v1/messages", &messages_body(&other, "hello", ""));
    assert_eq!(again.pod(), cold.pod());
}

#[test]
fn a_streamed_messages_response_arrives_with_its_events_intact() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway(&[&a]);
    let body = messages_body(
        &Value::String("Be brief.".into()),
        "stream",
        r#","stream":true"#,
    );
    let headers = [
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
        ("x-sim-response-id", "msg_fixed"),
    ];
    let direct = support::request(
        &a.address,
        "POST",
        "/v1/messages",
        &headers,
        body.as_bytes(),
    );
    let proxied = envoy.post_with("/v1/messages", &headers, &body);
    assert_eq!(proxied.status, 200, "{}", proxied.text());
    assert_eq!(proxied.header("content-type"), Some("text/event-stream"));
    assert_eq!(proxied.text(), direct.text(), "byte for byte");
    let text = proxied.text();
    let events: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("event: "))
        .collect();
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(["content_block_delta"; 4]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(events, expected);
    let data: Vec<Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).expect("each event's data is JSON"))
        .collect();
    assert_eq!(data[0]["message"]["id"], "msg_fixed");
    assert_eq!(data[2]["delta"]["type"], "text_delta");
    assert_eq!(data[7]["delta"]["stop_reason"], "max_tokens");
    assert_eq!(data[7]["usage"]["output_tokens"], 4);
}

#[test]
fn bad_messages_requests_get_anthropic_errors_and_never_reach_a_pod() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway(&[&a]);
    let cases = [
        ("{not json".to_string(), "not valid"),
        (
            format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}]}}"#),
            "\"max_tokens\"",
        ),
        (
            format!(r#"{{"model":"{MODEL}","max_tokens":4,"messages":[]}}"#),
            "at least one message",
        ),
    ];
    for (body, needle) in cases {
        let response = envoy.post("/v1/messages", &body);
        assert_eq!(response.status, 400, "{body:?}: {}", response.text());
        assert_eq!(response.header("content-type"), Some("application/json"));
        let json = response.json();
        assert_eq!(json["type"], "error", "{json}");
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(needle),
            "{body:?}: {json}"
        );
    }
    assert_eq!(a.requests_total(), 0, "no bad request reached the pod");
    // The OpenAI paths keep OpenAI's shape.
    let openai = envoy.post("/v1/chat/completions", "{not json").json();
    assert_eq!(openai["error"]["code"], 400, "{openai}");
    assert!(openai.get("type").is_none(), "{openai}");
    // A good one is answered in Anthropic's shape by the pod it was routed to.
    let good = envoy.post(
        "/v1/messages",
        &messages_body(&Value::String("Be brief.".into()), "hi", ""),
    );
    assert_eq!(good.status, 200, "{}", good.text());
    let message = good.json();
    assert_eq!(
        (&message["role"], &message["content"][0]["type"]),
        (&Value::from("assistant"), &Value::from("text"))
    );
    assert_eq!(message["usage"]["output_tokens"], 4);
    assert!(message["usage"]["input_tokens"].as_u64().unwrap() > 0);
}
