//! Every config in `examples/configs/` loads with the filter's own loader, without warnings,
//! and routes as its comment says (checked natively through the picker with scraped metrics).

#[path = "support/one_pool.rs"]
mod one_pool;

use inference_picker_core::config::{load, load_set};
use inference_picker_core::director::Routed;
use inference_picker_core::request::{ApiKind, RequestHeaders};
use one_pool::OnePool as Example;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs")
}

fn text(name: &str) -> String {
    std::fs::read_to_string(config_dir().join(name)).expect("example config exists")
}

fn picker(name: &str) -> Example {
    let config = load(&text(name), 42).unwrap_or_else(|e| panic!("{name}: {e}"));
    Example::new(config)
}

/// A vLLM scrape body with the given queue, running and KV usage, plus extra lines.
fn scrape(picker: &mut Example, index: usize, waiting: u32, running: u32, kv: f64, extra: &str) {
    let body = format!(
        "vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         vllm:num_requests_running{{model_name=\"m\"}} {running}\n\
         vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n{extra}"
    );
    picker.scrape(index, 1000, &body);
}

fn fresh(picker: &mut Example, count: usize) {
    for i in 0..count {
        scrape(picker, i, 0, 0, 0.0, "");
    }
    picker.on_tick(1000);
}

fn route(picker: &mut Example, body: &str, headers: RequestHeaders) -> Routed {
    picker
        .route(ApiKind::Completions, Some(body.as_bytes()), headers)
        .unwrap_or_else(|e| panic!("{body}: {e:?}"))
}

fn completion(prompt: &str) -> String {
    format!(r#"{{"model":"m","prompt":"{prompt}","max_tokens":16}}"#)
}

#[test]
fn every_example_loads_without_warnings() {
    let mut names: Vec<String> = std::fs::read_dir(config_dir())
        .expect("examples/configs")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    for name in names {
        let set = load_set(&text(&name), 1, false).unwrap_or_else(|e| panic!("{name}: {e}"));
        for pool in set.pools {
            let warnings = pool.config.warnings;
            assert!(warnings.is_empty(), "{name} ({}): {warnings:?}", pool.name);
        }
    }
}

#[test]
fn custom_metric_example_routes_on_the_selected_series_only() {
    let mut picker = picker("custom-metrics.yaml");
    // Pod 1 runs the fewest llama-3-8b requests; pod 2 runs none of another model but many
    // llama-3-8b ones; pod 0 lacks the series entirely (worst).
    scrape(&mut picker, 0, 0, 0, 0.0, "");
    scrape(
        &mut picker,
        1,
        0,
        0,
        0.0,
        "vllm:num_requests_running{model_name=\"llama-3-8b\"} 1\nvllm:num_requests_running{model_name=\"other\"} 40\n",
    );
    scrape(
        &mut picker,
        2,
        0,
        0,
        0.0,
        "vllm:num_requests_running{model_name=\"llama-3-8b\"} 9\nvllm:num_requests_running{model_name=\"other\"} 0\n",
    );
    picker.on_tick(1000);
    for n in 0..10 {
        let routed = route(
            &mut picker,
            &completion(&format!("q{n}")),
            RequestHeaders::default(),
        );
        assert_eq!(
            routed.destination,
            "127.0.0.1:8002",
            "{}",
            picker.explain_last()
        );
        picker.release(&routed);
    }
}

#[test]
fn active_request_example_spreads_a_burst() {
    let mut picker = picker("active-request.yaml");
    fresh(&mut picker, 4);
    let mut picks = BTreeMap::new();
    let mut held = Vec::new();
    for n in 0..20 {
        let routed = route(
            &mut picker,
            &completion(&format!("{n}")),
            RequestHeaders::default(),
        );
        *picks.entry(routed.destination.clone()).or_insert(0) += 1;
        held.push(routed);
    }
    assert_eq!(picks.len(), 4, "{picks:?}");
    assert!(picks.values().all(|&n| n == 5), "{picks:?}");
    for routed in &held {
        picker.release(routed);
    }
    assert!(picker
        .pool()
        .endpoints
        .iter()
        .all(|e| e.in_flight == 0 && e.in_flight_tokens == 0));
}

#[test]
fn backend_preference_never_leaves_nvlink() {
    let mut picker = picker("backend-preference.yaml");
    fresh(&mut picker, 3);
    for n in 0..12 {
        let routed = route(
            &mut picker,
            &completion(&format!("{n}")),
            RequestHeaders::default(),
        );
        assert_ne!(routed.destination, "127.0.0.1:8002");
    }
}

#[test]
fn pd_example_adds_a_prefill_endpoint_for_long_uncached_prompts() {
    let mut picker = picker("pd-disaggregation.yaml");
    fresh(&mut picker, 3);
    let short = route(&mut picker, &completion("hi"), RequestHeaders::default());
    assert_eq!(short.prefill, None, "2 tokens < nonCachedTokens 32");
    assert_ne!(
        short.destination, "127.0.0.1:8001",
        "prefill pods do not decode"
    );
    let long_prompt = "lorem ipsum dolor sit amet ".repeat(20);
    let long = route(
        &mut picker,
        &completion(&long_prompt),
        RequestHeaders::default(),
    );
    assert_eq!(long.prefill.as_deref(), Some("127.0.0.1:8001"));
    assert_ne!(long.destination, "127.0.0.1:8001");
    // The same prompt again: the decode pod now holds it, so no prefill is needed.
    let again = route(
        &mut picker,
        &completion(&long_prompt),
        RequestHeaders::default(),
    );
    assert_eq!(again.destination, long.destination, "prefix affinity");
    assert_eq!(again.prefill, None, "{}", picker.explain_last());
}

#[test]
fn pd_legacy_example_uses_its_threshold() {
    let mut picker = picker("pd-legacy.yaml");
    fresh(&mut picker, 2);
    let short = route(&mut picker, &completion("hi"), RequestHeaders::default());
    assert_eq!(
        (short.destination.as_str(), short.prefill.as_deref()),
        ("127.0.0.1:8002", None)
    );
    let long = route(
        &mut picker,
        &completion(&"x".repeat(200)),
        RequestHeaders::default(),
    );
    assert_eq!(long.prefill.as_deref(), Some("127.0.0.1:8001"));
}

#[test]
fn session_affinity_example_sticks_to_the_token() {
    let mut picker = picker("session-affinity.yaml");
    fresh(&mut picker, 3);
    let first = route(&mut picker, &completion("a"), RequestHeaders::default());
    let token = first.session_token.clone().expect("token issued");
    for n in 0..10 {
        let headers = RequestHeaders {
            session_token: Some(token.clone()),
            ..RequestHeaders::default()
        };
        let routed = route(&mut picker, &completion(&format!("{n}")), headers);
        assert_eq!(routed.destination, first.destination);
    }
}

#[test]
fn request_cost_example_weighs_capacity_and_priorities() {
    let mut picker = picker("request-cost.yaml");
    // Same KV usage everywhere; pod 0 is labelled with twice the capacity.
    for i in 0..3 {
        scrape(&mut picker, i, 0, 0, 0.5, "");
    }
    picker.on_tick(1000);
    let headers = RequestHeaders {
        objective: Some("batch".into()),
        ..RequestHeaders::default()
    };
    let routed = route(&mut picker, &completion("a"), headers);
    assert_eq!(routed.destination, "127.0.0.1:8001");
    assert_eq!(routed.priority, -1);
    // Work placed since the last scrape counts: a burst of large requests moves on.
    let big = r#"{"model":"m","prompt":"b","max_tokens":60000}"#;
    let mut picks = BTreeMap::new();
    for _ in 0..4 {
        let routed = route(&mut picker, big, RequestHeaders::default());
        *picks.entry(routed.destination).or_insert(0) += 1;
    }
    assert!(picks.len() >= 2, "{picks:?}");
}

#[test]
fn filters_example_keeps_the_selected_pods_and_returns_a_fallback() {
    let mut picker = picker("filters-and-pickers.yaml");
    fresh(&mut picker, 3);
    // Pod 3 is in zone-c; a short prompt fits pod 1's range, not pod 2's.
    for n in 0..10 {
        let routed = route(
            &mut picker,
            &completion(&format!("{n}")),
            RequestHeaders::default(),
        );
        assert_eq!(
            routed.destination, "127.0.0.1:8001",
            "only one pod qualifies"
        );
    }
    let long = completion(&"y".repeat(40_000));
    let routed = route(&mut picker, &long, RequestHeaders::default());
    assert_eq!(
        routed.destination, "127.0.0.1:8002",
        "10k tokens fit only pod 2's range"
    );
    let headers = RequestHeaders {
        test_endpoint_selection: Some("127.0.0.1:8002".into()),
        ..RequestHeaders::default()
    };
    let error = picker
        .route(
            ApiKind::Completions,
            Some(completion("z").as_bytes()),
            headers,
        )
        .unwrap_err();
    assert_eq!(
        error.status(),
        429,
        "the testing filter only narrows the pool"
    );
}

#[test]
fn plugin_table_lists_every_registered_type() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/plugins.md"))
            .expect("docs/plugins.md");
    let table: Vec<&str> = doc
        .lines()
        .skip_while(|line| !line.starts_with("### Plugins"))
        .skip(1)
        .take_while(|line| !line.starts_with("### "))
        .filter(|line| line.starts_with("| `"))
        .collect();
    for type_name in inference_picker_core::scheduling::plugins::all_types() {
        let named = format!("`{type_name}`");
        assert!(
            table
                .iter()
                .any(|row| row.split('|').nth(1).is_some_and(|c| c.contains(&named))),
            "docs/plugins.md plugin table has no row for {type_name}"
        );
    }
    for row in &table {
        let first = row.split('`').nth(1).unwrap_or("");
        assert!(
            inference_picker_core::scheduling::plugins::known_type(first).is_some(),
            "docs/plugins.md lists {first}, which is not registered"
        );
    }
}
