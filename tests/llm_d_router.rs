//! Configs written for llm-d-router (`tests/fixtures/llm-d-router/`) load with the filter's
//! own loader, or fail with an error that names the plugin and what to use instead; and
//! llm-d-router's spellings of the parameters we share reach the same behaviour as ours.

#[path = "support/one_pool.rs"]
mod one_pool;

use inference_picker_core::config::load;
use inference_picker_core::director::Routed;
use inference_picker_core::request::{ApiKind, RequestHeaders};
use one_pool::OnePool;
use std::path::Path;

/// llm-d-router takes its pods from the InferencePool; the filter needs them listed.
const POOL: &str = "
pool:
  endpoints:
  - address: 10.0.0.1:8000
    labels: {llm-d.ai/role: prefill}
  - address: 10.0.0.2:8000
    labels: {llm-d.ai/role: decode}
  - address: 10.0.0.3:8000
    labels: {llm-d.ai/role: decode}
";

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm-d-router")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn with_pool(config: &str) -> String {
    format!("{config}\n{POOL}")
}

fn error_of(config: &str) -> String {
    match load(&with_pool(config), 1) {
        Ok(_) => "loaded".into(),
        Err(error) => error.to_string(),
    }
}

fn fresh(director: &mut OnePool) {
    for i in 0..3 {
        director.scrape(
            i,
            1000,
            "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n",
        );
    }
    director.on_tick(1000);
}

fn route(director: &mut OnePool, api: ApiKind, body: &str) -> Routed {
    director
        .route(api, Some(body.as_bytes()), RequestHeaders::default())
        .unwrap_or_else(|e| panic!("{body}: {e:?}"))
}

#[test]
fn a_pd_config_loads_and_disaggregates_long_uncached_prompts() {
    let config = load(&with_pool(&fixture("pd-approx-prefix.yaml")), 1).expect("loads");
    // Declaring the producers and parsers llm-d's EPP would create itself is silent.
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let mut director = OnePool::new(config);
    fresh(&mut director);
    let short = route(
        &mut director,
        ApiKind::ChatCompletions,
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(short.prefill, None, "a few tokens < nonCachedTokens 32");
    assert_ne!(
        short.destination, "10.0.0.1:8000",
        "prefill pods do not decode"
    );
    let long = format!(
        r#"{{"model":"m","max_tokens":8,"system":"{}","messages":[{{"role":"user","content":"hi"}}]}}"#,
        "Answer with care. ".repeat(20)
    );
    let long = route(&mut director, ApiKind::Messages, &long);
    assert_eq!(long.prefill.as_deref(), Some("10.0.0.1:8000"));
}

/// The forwarded body's `priority` for a chat with `client_priority` under `objective`, and
/// the pod it went to.
fn forwarded_priority(
    director: &mut OnePool,
    objective: Option<&str>,
    client_priority: Option<i64>,
) -> (Option<i64>, String) {
    let mut body =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let Some(priority) = client_priority {
        body["priority"] = priority.into();
    }
    let headers = RequestHeaders {
        objective: objective.map(str::to_owned),
        ..RequestHeaders::default()
    };
    let text = body.to_string();
    let routed = director
        .route(ApiKind::ChatCompletions, Some(text.as_bytes()), headers)
        .expect("routed");
    director.release(&routed);
    let forwarded = routed.rewritten_body.expect("the body is rewritten");
    let forwarded: serde_json::Value = serde_json::from_slice(&forwarded).expect("JSON");
    assert_eq!(forwarded["messages"], body["messages"], "the rest is kept");
    (forwarded["priority"].as_i64(), routed.destination)
}

#[test]
fn the_integration_default_config_loads_routes_and_hands_the_priority_to_the_engine() {
    let pool = "
pool:
  objectives: [{name: critical, priority: 100}, {name: batch, priority: -10}]
  endpoints:
  - address: 10.0.0.1:8000
    labels: {inference.networking.k8s.io/engine-type: vllm}
  - address: 10.0.0.2:8000
    labels: {inference.networking.k8s.io/engine-type: sglang}
";
    let text = format!("{}\n{pool}", fixture("integration-default.yaml"));
    let config = load(&text, 1).expect("loads");
    let mut director = OnePool::new(config);
    // The vLLM pod has the shorter queue, then the SGLang one.
    let scrape = |director: &mut OnePool, queues: [u32; 2]| {
        director.scrape(
            0,
            1000,
            &format!("vllm:num_requests_waiting {}\n", queues[0]),
        );
        director.scrape(1, 1000, &format!("sglang:num_queue_reqs {}\n", queues[1]));
        director.on_tick(1000);
    };
    scrape(&mut director, [0, 5]);
    // vLLM runs lower values first: the objective's priority, negated; the client's is gone.
    assert_eq!(
        forwarded_priority(&mut director, Some("critical"), Some(-7)),
        (Some(-100), "10.0.0.1:8000".into())
    );
    assert_eq!(
        forwarded_priority(&mut director, Some("batch"), None),
        (Some(10), "10.0.0.1:8000".into())
    );
    assert_eq!(
        forwarded_priority(&mut director, None, Some(3)),
        (Some(0), "10.0.0.1:8000".into()),
        "no objective: the default priority, not the client's"
    );
    scrape(&mut director, [5, 0]);
    // SGLang runs higher values first, as objectives rank them.
    assert_eq!(
        forwarded_priority(&mut director, Some("critical"), Some(-7)),
        (Some(100), "10.0.0.2:8000".into())
    );
    // Without propagatePriority the body is forwarded as the client sent it.
    let plain = text.replace("  parameters:\n    propagatePriority: true\n", "");
    assert_ne!(plain, text);
    let mut director = OnePool::new(load(&plain, 1).expect("loads"));
    scrape(&mut director, [0, 5]);
    let routed = director
        .route(
            ApiKind::ChatCompletions,
            Some(br#"{"model":"m","priority":3,"messages":[{"role":"user","content":"hi"}]}"#),
            RequestHeaders::default(),
        )
        .expect("routed");
    assert_eq!(routed.rewritten_body, None);
    let error = error_of("plugins: [{type: openai-parser, parameters: {propagatePriorty: true}}]");
    assert!(error.contains("propagatePriorty"), "{error}");
}

#[test]
fn a_config_needing_vllm_events_and_tokens_fails_naming_the_plugin_and_the_alternative() {
    let config = fixture("precise-prefix-vllm-tokens.yaml");
    let error = error_of(&config);
    assert!(
        error.contains("token-producer") && error.contains("estimate backend"),
        "{error}"
    );
    // With the tokens estimated, the next refusal is the event-driven index.
    let estimated = config.replace(
        "  parameters:\n    modelName: meta-llama/Llama-3.1-8B-Instruct\n    vllm:\n      url: http://localhost:8000\n",
        "",
    );
    assert_ne!(
        estimated, config,
        "the fixture's token-producer block changed"
    );
    let error = error_of(&estimated);
    assert!(
        error.contains("\"precise-prefix-cache-producer\" is not supported")
            && error.contains("use prefix-cache-scorer"),
        "{error}"
    );
}

#[test]
fn llm_d_router_parameter_spellings_load() {
    let header = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
    // The flat decider key and the profile map select the same handler as `deciders.prefill`.
    let flat = format!(
        "{header}plugins:
- type: prefix-cache-scorer
- type: prefix-based-pd-decider
  name: pd
  parameters: {{nonCachedTokens: 8, promptTokens: 4}}
- type: disagg-profile-handler
  parameters:
    profiles: {{decode: d, prefill: p}}
    prefillDeciderPluginName: pd
- type: prefill-filter
- type: decode-filter
schedulingProfiles:
- name: p
  plugins: [{{pluginRef: prefill-filter}}, {{pluginRef: prefix-cache-scorer}}]
- name: d
  plugins: [{{pluginRef: decode-filter}}, {{pluginRef: prefix-cache-scorer}}]
"
    );
    let mut director = OnePool::new(load(&with_pool(&flat), 1).expect("flat keys load"));
    fresh(&mut director);
    let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(200));
    let routed = route(&mut director, ApiKind::Completions, &body);
    assert_eq!(routed.prefill.as_deref(), Some("10.0.0.1:8000"));
    let short = route(
        &mut director,
        ApiKind::Completions,
        r#"{"model":"m","prompt":"x"}"#,
    );
    assert_eq!(short.prefill, None, "the named decider, not always");
    // The older handler with a named decider instead of its threshold.
    let legacy = flat.replace(
        "- type: disagg-profile-handler\n  parameters:\n    profiles: {decode: d, prefill: p}\n    prefillDeciderPluginName: pd\n",
        "- type: pd-profile-handler\n  parameters: {decodeProfile: d, prefillProfile: p, deciderPluginName: pd}\n",
    );
    assert_ne!(legacy, flat);
    let mut director = OnePool::new(load(&with_pool(&legacy), 1).expect("pd handler loads"));
    fresh(&mut director);
    let short = route(
        &mut director,
        ApiKind::Completions,
        r#"{"model":"m","prompt":"x"}"#,
    );
    assert_eq!(short.prefill, None, "under the decider's promptTokens");
    let error = error_of(&flat.replace(
        "prefillDeciderPluginName: pd",
        "prefillDeciderPluginName: pd\n    deciders: {encode: pd}",
    ));
    assert!(error.contains("encode disaggregation"), "{error}");
}

#[test]
fn request_handler_parsers_must_name_declared_parsers() {
    let header = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n";
    let config = |parsers: &str| {
        format!("{header}plugins:\n- type: queue-scorer\n- type: openai-parser\n- type: vllmhttp-parser\n{parsers}")
    };
    let listed = config("requestHandler:\n  parsers:\n  - pluginRef: vllmhttp-parser\n  - pluginRef: openai-parser\n");
    let loaded = load(&with_pool(&listed), 1).expect("parsers load");
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("/inference/v1/generate")),
        "{:?}",
        loaded.warnings
    );
    let single = config("parser: {pluginRef: openai-parser}\n");
    assert!(load(&with_pool(&single), 1).is_ok());
    let missing = error_of(&config(
        "requestHandler: {parsers: [{pluginRef: anthropic-parser}]}\n",
    ));
    assert!(
        missing.contains("requestHandler.parsers[0].pluginRef")
            && missing.contains("anthropic-parser"),
        "{missing}"
    );
    let not_a_parser = error_of(&config(
        "requestHandler: {parsers: [{pluginRef: queue-scorer}]}\n",
    ));
    assert!(
        not_a_parser.contains("is not a request parser"),
        "{not_a_parser}"
    );
    let grpc = error_of(&format!("{header}plugins:\n- type: vllmgrpc-parser\n"));
    assert!(
        grpc.contains("vllmgrpc-parser") && grpc.contains("openai-parser"),
        "{grpc}"
    );
}
