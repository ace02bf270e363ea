//! Properties of the scoring core and the parsers, over generated pools, requests and inputs:
//! every scorer stays in [0, 1], one pod's metrics (NaN, infinities, negative, huge) never
//! disturb how the others compare, a pick is always a distinct subset of the candidates,
//! scaling every weight never changes a decision, and no input makes a parser panic.

use inference_picker_core::config::load;
use inference_picker_core::endpoint::{EndpointState, Health, Pool};
use inference_picker_core::metrics::{extract, CacheConfig, EndpointMetrics, Engine, LoraInfo};
use inference_picker_core::request::{parse_body, ApiKind, InferenceRequest, RequestHeaders};
use inference_picker_core::scheduling::plugins::spec::Kind;
use inference_picker_core::scheduling::plugins::{self, scorer::session_affinity_scorer};
use inference_picker_core::scheduling::rng::Rng;
use inference_picker_core::scheduling::{CycleState, Plugin, PrefixMatches, SchedulingContext};
use proptest::prelude::*;
use serde_yaml::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
struct PodSpec {
    waiting: f64,
    running: f64,
    kv: f64,
    in_flight: u32,
    tokens: u64,
    matched: usize,
    role: Option<&'static str>,
    lora: bool,
}

fn pod() -> impl Strategy<Value = PodSpec> {
    (
        0.0..200.0f64,
        0.0..200.0f64,
        0.0..=1.0f64,
        0u32..50,
        0u64..10_000_000,
        0usize..40,
        prop::option::of(prop::sample::select(vec![
            "decode", "prefill", "both", "encode",
        ])),
        any::<bool>(),
    )
        .prop_map(
            |(waiting, running, kv, in_flight, tokens, matched, role, lora)| PodSpec {
                waiting,
                running,
                kv,
                in_flight,
                tokens,
                matched,
                role,
                lora,
            },
        )
}

fn pool_of(specs: &[PodSpec]) -> Pool {
    let mut pool = Pool::new(
        specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let mut labels = BTreeMap::new();
                if let Some(role) = spec.role {
                    labels.insert("llm-d.ai/role".to_string(), role.to_string());
                }
                labels.insert(
                    "llm-d.ai/context-length-range".into(),
                    format!("0-{}", i * 500),
                );
                let mut endpoint =
                    EndpointState::new(format!("10.0.{}.{}:8000", i / 200, i % 200), labels);
                endpoint.metrics = EndpointMetrics {
                    waiting_queue: Some(spec.waiting),
                    running_requests: Some(spec.running),
                    kv_cache_usage: Some(spec.kv),
                    lora: spec.lora.then(|| LoraInfo {
                        max_lora: 2,
                        running: vec!["a".into()],
                        waiting: vec![],
                    }),
                    cache_config: Some(CacheConfig {
                        block_size: 16,
                        num_gpu_blocks: 1 + i as u64 * 100,
                    }),
                    custom: vec![Some(spec.running)],
                    work: None,
                    latency: None,
                };
                endpoint.health = Health::Fresh;
                endpoint.last_scrape_ok_ms = Some(0);
                endpoint.in_flight = spec.in_flight;
                endpoint.in_flight_tokens = spec.tokens;
                endpoint.placed_tokens_since_scrape = spec.tokens / 2;
                endpoint
            })
            .collect(),
    );
    pool.refresh_health(0, 1000);
    pool
}

/// The parameters a scorer type needs to build; every other one builds from none.
fn scorer_parameters(type_name: &str) -> Value {
    match type_name {
        "metric-scorer" => serde_yaml::from_str("{metricName: m, min: 0, max: 100}")
            .expect("metric-scorer parameters"),
        _ => Value::Null,
    }
}

/// Scorer types the properties leave out, with why: none. A scorer type that does not build
/// from [`scorer_parameters`] fails [`scorers`] until its parameters are added there (or it is
/// listed here with its reason), so no scorer drops out of the properties unnoticed.
const SCORERS_LEFT_OUT: &[&str] = &[];

/// Every scorer type, aliases included.
fn scorer_types() -> impl Iterator<Item = &'static str> {
    plugins::all_types()
        .filter(|type_name| plugins::spec(type_name).is_some_and(|spec| spec.kind == Kind::Scorer))
}

/// Every scorer type, built with [`scorer_parameters`]; fails naming any that does not build
/// and is not in [`SCORERS_LEFT_OUT`].
fn scorers() -> Vec<(&'static str, Plugin)> {
    let mut built = Vec::new();
    let mut unbuilt: Vec<(&str, String)> = Vec::new();
    for type_name in scorer_types() {
        match plugins::build(type_name, &scorer_parameters(type_name)) {
            Ok(plugin @ Plugin::Scorer(_)) => built.push((type_name, plugin)),
            Ok(_) => unbuilt.push((type_name, "not built as a scorer".into())),
            Err(error) => unbuilt.push((type_name, error)),
        }
    }
    let left_out: Vec<&str> = unbuilt.iter().map(|(type_name, _)| *type_name).collect();
    assert_eq!(
        left_out, SCORERS_LEFT_OUT,
        "scorer types the properties could not build: {unbuilt:?}"
    );
    built
}

#[test]
fn every_scorer_type_builds_for_the_properties() {
    let built: Vec<&str> = scorers()
        .into_iter()
        .map(|(type_name, _)| type_name)
        .collect();
    for type_name in ["queue-scorer", "metric-scorer", "prefix-cache-scorer"] {
        assert!(built.contains(&type_name), "{type_name}: {built:?}");
    }
}

/// Any value a pod could report or a snapshot could hold: valid, unknown, absurd.
fn any_value() -> impl Strategy<Value = Option<f64>> {
    prop::option::of(prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MAX),
        Just(f64::MIN),
        Just(1e308),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        -1e6..1e6f64,
        0.0..=1.0f64,
        any::<f64>(),
    ])
}

/// Values that are unknown: absent, not finite, or negative.
fn unknown_value() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        Just(None),
        Just(Some(f64::NAN)),
        Just(Some(f64::INFINITY)),
        Just(Some(f64::NEG_INFINITY)),
        (-1e308..-1e-300f64).prop_map(Some),
    ]
}

fn hostile_metrics(
    values: (Option<f64>, Option<f64>, Option<f64>, Option<f64>),
    cache: Option<(u32, u64)>,
) -> EndpointMetrics {
    let (waiting, running, kv, custom) = values;
    EndpointMetrics {
        waiting_queue: waiting,
        running_requests: running,
        kv_cache_usage: kv,
        lora: None,
        cache_config: cache.map(|(block_size, num_gpu_blocks)| CacheConfig {
            block_size,
            num_gpu_blocks,
        }),
        custom: vec![custom],
        work: None,
        latency: None,
    }
}

/// Scores of every scorer type over `candidates`, each from a fresh instance.
fn all_scores(
    pool: &Pool,
    candidates: &[usize],
    matched: &[usize],
) -> Vec<(&'static str, Vec<f64>)> {
    let request = InferenceRequest {
        model: "a".into(),
        prompt_tokens: 600,
        ..InferenceRequest::default()
    };
    let cycle = CycleState {
        prefix: Some(PrefixMatches {
            matched_blocks: matched.to_vec(),
            total_blocks: 40,
            block_tokens: 16,
        }),
        ..CycleState::default()
    };
    let ctx = SchedulingContext {
        request: &request,
        pool,
        cycle: &cycle,
    };
    scorers()
        .into_iter()
        .filter_map(|(type_name, plugin)| {
            let Plugin::Scorer(mut scorer) = plugin else {
                return None;
            };
            let mut scores = vec![0.0; candidates.len()];
            scorer.score(&ctx, candidates, &mut scores);
            Some((type_name, scores))
        })
        .collect()
}

/// Scorers that read scraped metrics: an unknown value elsewhere must not move their scores.
const METRIC_SCORERS: &[&str] = &[
    "queue-scorer",
    "running-requests-size-scorer",
    "kv-cache-utilization-scorer",
    "load-aware-scorer",
    "request-cost-scorer",
    "metric-scorer",
];

/// Scores pods 1.. with and without pod 0 among the candidates and checks that pod 0 changes
/// nothing in how they compare: every score finite in [0, 1], no pair of the others swapped,
/// no tie broken; with `unknown`, metric scorers give the others exactly the same scores.
fn check_others_undisturbed(
    pool: &Pool,
    matched: &[usize],
    unknown: bool,
) -> Result<(), TestCaseError> {
    let everyone: Vec<usize> = (0..pool.len()).collect();
    let others: Vec<usize> = (1..pool.len()).collect();
    let with = all_scores(pool, &everyone, matched);
    let without = all_scores(pool, &others, matched);
    for ((type_name, with), (_, without)) in with.iter().zip(&without) {
        for score in with.iter().chain(without) {
            prop_assert!(
                score.is_finite() && (0.0..=1.0).contains(score),
                "{type_name}: {score}"
            );
        }
        let with_others = &with[1..];
        // The prefix score weighs a hit by the queue beyond the shortest candidate's, so a
        // candidate with a shorter (known) queue legitimately re-weighs the others' hits
        // (`affinityQueueLimit`; its own unit tests pin that). Unknown values must not.
        let prefix_scorer = inference_picker_core::scheduling::plugins::spec(type_name)
            .is_some_and(|spec| spec.type_name == "prefix-cache-scorer");
        if prefix_scorer && !unknown {
            continue;
        }
        for i in 0..without.len() {
            for j in 0..without.len() {
                if without[i] > without[j] {
                    prop_assert!(
                        with_others[i] >= with_others[j],
                        "{type_name}: pods {} and {} swapped: {with:?} vs {without:?}",
                        i + 1,
                        j + 1
                    );
                } else if without[i] == without[j] {
                    prop_assert_eq!(with_others[i], with_others[j], "{}: tie broken", type_name);
                }
            }
        }
        if unknown && METRIC_SCORERS.contains(type_name) {
            prop_assert_eq!(with_others, without.as_slice(), "{}", type_name);
            prop_assert_eq!(with[0], 0.0, "{}: unknown must score worst", type_name);
        }
    }
    Ok(())
}

/// A `/metrics` page of hostile series for pod 0, with at least one engine series (a page
/// without any is refused whole, and leaves nothing to check).
fn hostile_page() -> impl Strategy<Value = String> {
    const ENGINE_SERIES: [&str; 3] = [
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
    ];
    let any_name = prop::sample::select(vec![
        ENGINE_SERIES[0],
        ENGINE_SERIES[1],
        ENGINE_SERIES[2],
        "m",
    ]);
    let value = || {
        prop_oneof![
            Just("NaN".to_owned()),
            Just("+Inf".to_owned()),
            Just("-Inf".to_owned()),
            Just("1e308".to_owned()),
            Just("1.7976931348623157e308".to_owned()),
            Just("-1".to_owned()),
            Just("0".to_owned()),
            any::<f64>().prop_map(|v| format!("{v:e}")),
            (0.0..50.0f64).prop_map(|v| v.to_string()),
        ]
    };
    let engine_line = (
        prop::sample::select(ENGINE_SERIES.to_vec()),
        0u8..4,
        value(),
    );
    let other_lines = prop::collection::vec((any_name, 0u8..4, value()), 0..9);
    (engine_line, other_lines, any::<prop::sample::Index>()).prop_map(
        |(engine_line, mut lines, at)| {
            lines.insert(at.index(lines.len() + 1), engine_line);
            lines
                .into_iter()
                .map(|(name, model, value)| format!("{name}{{model_name=\"{model}\"}} {value}\n"))
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn one_pods_metrics_never_disturb_the_others(
        specs in prop::collection::vec(pod(), 3..10),
        values in (any_value(), any_value(), any_value(), any_value()),
        cache in prop::option::of((any::<u32>(), any::<u64>())),
    ) {
        let mut pool = pool_of(&specs);
        pool.endpoints[0].metrics = hostile_metrics(values, cache);
        let matched: Vec<usize> = specs.iter().map(|s| s.matched).collect();
        check_others_undisturbed(&pool, &matched, false)?;
    }

    #[test]
    fn unknown_values_leave_the_others_scores_exactly_as_they_were(
        specs in prop::collection::vec(pod(), 3..10),
        values in (unknown_value(), unknown_value(), unknown_value(), prop_oneof![Just(None), Just(Some(f64::NAN)), Just(Some(f64::INFINITY))]),
    ) {
        let mut pool = pool_of(&specs);
        pool.endpoints[0].metrics = hostile_metrics(values, None);
        let matched: Vec<usize> = specs.iter().map(|s| s.matched).collect();
        check_others_undisturbed(&pool, &matched, true)?;
    }

    #[test]
    fn a_hostile_page_never_makes_a_score_or_total_nan(
        specs in prop::collection::vec(pod(), 3..10),
        page in hostile_page(),
        seed in any::<u64>(),
    ) {
        let mut pool = pool_of(&specs);
        let selector = inference_picker_core::metrics::MetricSelector { metric_name: "m".into(), labels: vec![] };
        // Every page holds an engine series, so every one is read (none is skipped).
        let (metrics, _, _) = extract(Engine::Vllm, &page, &[selector])
            .map_err(|error| TestCaseError::fail(format!("{error}: {page}")))?;
        // Stored as read: only known values, never NaN, infinite or negative.
        for value in [metrics.waiting_queue, metrics.running_requests, metrics.kv_cache_usage].into_iter().flatten() {
            prop_assert!(value.is_finite() && value >= 0.0, "{page}");
        }
        pool.endpoints[0].metrics = metrics;
        let matched: Vec<usize> = specs.iter().map(|s| s.matched).collect();
        check_others_undisturbed(&pool, &matched, false)?;
        let config = "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: running-requests-size-scorer\n- type: load-aware-scorer\n- type: request-cost-scorer\n\
                      pool:\n  endpoints: [{address: '10.0.0.1:1'}]\n";
        let mut scheduler = load(config, seed).unwrap().scheduler;
        scheduler.schedule(&InferenceRequest::empty(), &pool).unwrap();
        for row in scheduler.explain_rows(&pool) {
            prop_assert!(row.total.is_finite(), "{row:?}");
            for (name, score, _) in &row.scores {
                prop_assert!(score.is_finite() && (0.0..=1.0).contains(score), "{name}: {score}");
            }
        }
    }

    #[test]
    fn every_scorer_stays_within_zero_and_one(
        specs in prop::collection::vec(pod(), 1..12),
        prompt_tokens in 0u32..200_000,
        max_tokens in prop::option::of(0u32..100_000),
        session in any::<bool>(),
    ) {
        let pool = pool_of(&specs);
        let mut request = InferenceRequest {
            model: "a".into(),
            prompt_tokens,
            max_tokens,
            headers: RequestHeaders {
                session_token: session.then(|| session_affinity_scorer::token_for("10.0.0.0:8000")),
                ..RequestHeaders::default()
            },
            ..InferenceRequest::default()
        };
        request.prompt = "x".repeat(prompt_tokens as usize % 3000);
        let cycle = CycleState {
            prefix: Some(PrefixMatches {
                matched_blocks: specs.iter().map(|s| s.matched).collect(),
                total_blocks: 40,
                block_tokens: 16,
            }),
            ..CycleState::default()
        };
        let ctx = SchedulingContext { request: &request, pool: &pool, cycle: &cycle };
        let candidates: Vec<usize> = (0..specs.len()).collect();
        for (type_name, plugin) in scorers() {
            let Plugin::Scorer(mut scorer) = plugin else { continue };
            let mut scores = vec![0.0; candidates.len()];
            scorer.score(&ctx, &candidates, &mut scores);
            for score in scores {
                prop_assert!((0.0..=1.0).contains(&score), "{type_name}: {score}");
            }
        }
    }

    #[test]
    fn a_pick_is_a_distinct_subset_of_the_candidates(
        totals in prop::collection::vec(prop_oneof![Just(0.0), 0.0..10.0f64], 1..20),
        max in 1usize..6,
        seed in any::<u64>(),
    ) {
        let candidates: Vec<usize> = (0..totals.len()).map(|i| i * 3 + 1).collect();
        let parameters: Value = serde_yaml::from_str(&format!("{{maxNumOfEndpoints: {max}}}")).unwrap();
        for type_name in ["max-score-picker", "random-picker", "weighted-random-picker"] {
            let Ok(Plugin::Picker(picker)) = plugins::build(type_name, &parameters) else {
                panic!("{type_name} is a picker");
            };
            let mut picked = Vec::new();
            picker.pick(&candidates, &totals, &mut Rng::new(seed), &mut picked);
            prop_assert!(!picked.is_empty(), "{type_name}");
            prop_assert!(picked.len() <= max.min(candidates.len()));
            prop_assert!(picked.iter().all(|p| candidates.contains(p)));
            let mut distinct = picked.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), picked.len());
            if type_name == "max-score-picker" {
                let best = totals.iter().cloned().fold(f64::MIN, f64::max);
                let first = candidates.iter().position(|&c| c == picked[0]).unwrap();
                prop_assert_eq!(totals[first], best);
            }
        }
    }

    #[test]
    fn scaling_every_weight_never_changes_a_decision(
        specs in prop::collection::vec(pod(), 2..10),
        scale in 0.1..50.0f64,
        seed in any::<u64>(),
    ) {
        let config = |k: f64| format!(
            "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: active-request-scorer\n- type: load-aware-scorer\n\
             schedulingProfiles:\n- name: default\n  plugins:\n  - {{pluginRef: queue-scorer, weight: {}}}\n  - {{pluginRef: kv-cache-utilization-scorer, weight: {}}}\n  - {{pluginRef: active-request-scorer, weight: {}}}\n  - {{pluginRef: load-aware-scorer, weight: {}}}\n\
             pool:\n  endpoints: [{{address: '10.0.0.1:1'}}]\n",
            2.0 * k, 1.0 * k, 3.0 * k, 0.5 * k
        );
        let pool = pool_of(&specs);
        let request = InferenceRequest::empty();
        let mut base = load(&config(1.0), seed).unwrap().scheduler;
        let mut scaled = load(&config(scale), seed).unwrap().scheduler;
        for _ in 0..5 {
            let a = base.schedule(&request, &pool).unwrap();
            let b = scaled.schedule(&request, &pool).unwrap();
            prop_assert_eq!(a.targets(), b.targets());
        }
    }

    #[test]
    fn no_body_panics_the_parser(body in prop::collection::vec(any::<u8>(), 0..400)) {
        for kind in [ApiKind::Completions, ApiKind::ChatCompletions, ApiKind::Embeddings, ApiKind::Responses, ApiKind::Messages] {
            let _ = parse_body(kind, &body);
        }
    }

    #[test]
    fn no_json_shaped_body_panics_the_parser(body in r#"\{("(model|prompt|messages|input|max_tokens|role|content|text|system|type)":(\[|\{|"[a-z]*"|[0-9]+|null|true|,|\]|\})*)*\}"#) {
        for kind in [ApiKind::Completions, ApiKind::ChatCompletions, ApiKind::Embeddings, ApiKind::Responses, ApiKind::Messages] {
            let _ = parse_body(kind, body.as_bytes());
        }
    }

    #[test]
    fn no_text_panics_the_prometheus_parser(text in r#"([a-z_:]{0,12}(\{([a-z_]{0,5}="([^"\\]|\\.){0,6}",?){0,3}\})? ?(-?[0-9.e+]{0,8}|NaN|\+Inf|-Inf)( [0-9]{0,13})?\n|#[^\n]{0,20}\n|[^\n]{0,30}\n){0,20}"#) {
        let mut count = 0usize;
        inference_picker_core::prometheus::for_each_sample(&text, |_| count += 1);
        for engine in ["vllm", "sglang", "trtllm-serve"] {
            let engine = inference_picker_core::metrics::Engine::from_label(Some(engine));
            let _ = inference_picker_core::metrics::extract(engine, &text, &[]);
        }
    }

    #[test]
    fn no_document_panics_the_config_loader(text in r#"(plugins|schedulingProfiles|pool|endpoints|type|parameters|weight|pluginRef|name|address|- |: |\{|\}|\[|\]|\n|  |queue-scorer|max-score-picker|10\.0\.0\.1:80|[0-9]{1,3}|featureGates|dataLayer){0,40}"#) {
        let _ = load(&text, 1);
    }
}
