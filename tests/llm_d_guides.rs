//! Every config of llm-d's well-lit-path guides and llm-d-router's well-known-configs test
//! (`tests/fixtures/llm-d-guides/`, sources in its `SOURCES.md`) loads with the filter's own
//! loader and routes, or is refused with an error naming what is missing; and the table of
//! them in `docs/llm-d-guides.md` says which, config by config, with the count the README
//! repeats.
//!
//! A config that loads warns only about parameters it sets that the filter does not apply,
//! naming each one: what llm-d does by default (a profile with no picker, producers the EPP
//! would create itself) loads silently.

#[path = "support/one_pool.rs"]
mod one_pool;

use inference_picker_core::config::load;
use inference_picker_core::request::{ApiKind, RequestHeaders};
use one_pool::OnePool;
use std::path::{Path, PathBuf};

/// llm-d takes its pods from the InferencePool; the filter needs them listed. Every role a
/// guide filters on is present.
const POOL: &str = "
pool:
  endpoints:
  - address: 10.0.0.1:8000
    labels: {llm-d.ai/role: prefill}
  - address: 10.0.0.2:8000
    labels: {llm-d.ai/role: decode}
  - address: 10.0.0.3:8000
    labels: {llm-d.ai/role: decode}
  - address: 10.0.0.4:8000
    labels: {llm-d.ai/role: encode}
  - address: 10.0.0.5:8000
    labels: {llm-d.ai/role: prefill-decode}
";

fn fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llm-d-guides");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn name_of(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name")
        .to_owned()
}

fn with_pool(path: &Path) -> (String, String) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let loaded = format!("{text}\n{POOL}");
    (text, loaded)
}

/// The document that holds the table of the guide configs.
const GUIDES_DOC: &str = "docs/llm-d-guides.md";

/// The section of `GUIDES_DOC` that lists the guide configs.
const GUIDES_HEADING: &str = "## The configs";

fn read_doc(relative: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(relative))
        .unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The table's row for each config: its status cell.
fn table_rows() -> Vec<(String, String)> {
    let doc = read_doc(GUIDES_DOC);
    assert!(
        doc.lines().any(|line| line == GUIDES_HEADING),
        "{GUIDES_DOC} has no {GUIDES_HEADING:?} section"
    );
    doc.lines()
        .skip_while(|line| *line != GUIDES_HEADING)
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let file = cells.get(1)?.strip_prefix('`')?.strip_suffix(".yaml`")?;
            Some((format!("{file}.yaml"), (*cells.get(2)?).to_owned()))
        })
        .collect()
}

/// Scrapes every pod once so that load-based plugins see fresh metrics.
fn fresh(director: &mut OnePool, pods: usize) {
    for i in 0..pods {
        director.scrape(
                i,
                1000,
                // vLLM's names, and TensorRT-LLM's for the config that reads pods as that.
                "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n\
                 trtllm_num_requests_waiting 0\ntrtllm_num_requests_running 0\n",
        );
    }
    director.on_tick(1000);
}

#[test]
fn every_guide_config_loads_and_routes_or_is_refused_as_the_table_says() {
    let rows = table_rows();
    let files = fixtures();
    assert!(files.len() >= 50, "the fixtures are missing");
    let mut loaded = 0;
    for path in &files {
        let name = name_of(path);
        let (text, config) = with_pool(path);
        let status = rows
            .iter()
            .find(|(file, _)| *file == name)
            .map(|(_, status)| status.as_str())
            .unwrap_or_else(|| {
                panic!("the llm-d guide table of {GUIDES_DOC} has no row for {name}")
            });
        match load(&config, 1) {
            Ok(config) => {
                assert!(
                    status.starts_with("loads"),
                    "{name} loads, {GUIDES_DOC} says {status:?}"
                );
                for warning in &config.warnings {
                    if warning.contains("is declared but no profile uses it") {
                        continue; // about the config itself: a plugin it never uses
                    }
                    let parameter = warning
                        .split_once("parameter \"")
                        .and_then(|(_, rest)| rest.split('"').next())
                        .unwrap_or_else(|| {
                            panic!("{name}: a warning that names no ignored parameter: {warning}")
                        });
                    assert!(
                        text.contains(parameter),
                        "{name}: warns of {parameter:?}, which it does not set: {warning}"
                    );
                }
                let mut director = OnePool::new(config);
                fresh(&mut director, 5);
                let routed = director
                    .route(
                        ApiKind::ChatCompletions,
                        Some(br#"{"model":"m","messages":[{"role":"user","content":"hello there"}]}"#),
                        RequestHeaders::default(),
                    )
                    .unwrap_or_else(|e| panic!("{name} loads but does not route: {e:?}"));
                assert!(
                    routed.destination.starts_with("10.0.0."),
                    "{name}: {}",
                    routed.destination
                );
                loaded += 1;
            }
            Err(error) => {
                let error = error.to_string();
                let named = status
                    .strip_prefix("refused: `")
                    .and_then(|rest| rest.split('`').next())
                    .unwrap_or_else(|| {
                        panic!("{name} is refused ({error}), {GUIDES_DOC} says {status:?}")
                    });
                assert!(
                    error.contains(named),
                    "{name}: {GUIDES_DOC} names `{named}`, the loader says: {error}"
                );
            }
        }
    }
    assert_eq!(
        rows.len(),
        files.len(),
        "the table of {GUIDES_DOC} lists a config that is not a fixture"
    );
    let count = format!("**{loaded} of {} load and route**", files.len());
    for doc in [GUIDES_DOC, "README.md"] {
        assert!(read_doc(doc).contains(&count), "{doc} must say {count}");
    }
}

/// llm-d's current default recipe declares the approximate producer and the affinity filter
/// and no prefix-cache-scorer: the producer is the index the filter reads, so a prompt sticks
/// to the pod that holds it although that pod has the most tokens in flight.
#[test]
fn the_optimized_baseline_sticks_to_the_pod_holding_the_prompt() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm-d-guides/llmd-optimized-baseline.yaml");
    let (_, text) = with_pool(&path);
    let mut director = OnePool::new(load(&text, 1).expect("loads"));
    fresh(&mut director, 5);
    let prompt = "Summarise the incident report in three lines. ".repeat(40);
    let body = format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{prompt}"}}]}}"#);
    let route = |director: &mut OnePool| {
        director
            .route(
                ApiKind::ChatCompletions,
                Some(body.as_bytes()),
                RequestHeaders::default(),
            )
            .expect("routes")
            .destination
    };
    let first = route(&mut director);
    for _ in 0..3 {
        assert_eq!(route(&mut director), first, "the warm pod keeps the prompt");
    }
}

/// The coordinator guide sends each stage of a request to the gateway with `epp-profile`
/// naming the stage's profile: each lands on a pod of that role; without the header, decode.
#[test]
fn the_coordinator_guide_routes_each_stage_by_its_header() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm-d-guides/llmd-coord-disaggregation.yaml");
    let (_, text) = with_pool(&path);
    let mut director = OnePool::new(load(&text, 1).expect("loads"));
    fresh(&mut director, 5);
    let body = br#"{"model":"m","messages":[{"role":"user","content":"describe the image"}]}"#;
    let mut route = |profile: Option<&str>| {
        let headers = RequestHeaders {
            profile: profile.map(str::to_owned),
            ..RequestHeaders::default()
        };
        director
            .route(ApiKind::ChatCompletions, Some(body), headers)
            .expect("routes")
            .destination
    };
    let prefill = route(Some("prefill"));
    assert!(
        ["10.0.0.1:8000", "10.0.0.5:8000"].contains(&prefill.as_str()),
        "a prefill or prefill-decode pod: {prefill}"
    );
    assert_eq!(route(Some("encode")), "10.0.0.4:8000");
    let decode = route(None);
    assert!(
        ["10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.5:8000"].contains(&decode.as_str()),
        "{decode}"
    );
}

/// A vLLM page with the latency and work counters a pod reports after `served` requests,
/// each with the given TTFT, 100 computed prompt tokens (10 ms of prefill) and 20 tokens out
/// at 20 ms apart.
fn page_after(served: f64, ttft_s: f64, waiting: f64) -> String {
    format!(
        "vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.3\n\
         vllm:request_success_total {served}\nvllm:request_prefill_time_seconds_sum {}\n\
         vllm:prompt_tokens_by_source_total{{source=\"local_compute\"}} {}\n\
         vllm:time_to_first_token_seconds_sum {}\nvllm:time_to_first_token_seconds_count {served}\n\
         vllm:inter_token_latency_seconds_sum {}\nvllm:inter_token_latency_seconds_count {}\n",
        served * 0.01,
        served * 100.0,
        served * ttft_s,
        served * 20.0 * 0.02,
        served * 20.0,
    )
}

/// The predicted-latency guide loads with no sidecar and routes by what the pods' own TTFT
/// histograms taught it: a request with a TTFT SLO never goes to the pod predicted to miss
/// it while others meet it.
#[test]
fn the_predicted_latency_guide_routes_by_learned_ttft_against_the_slo() {
    // Pod 4 answers its first token in 900 ms with a queue, the others in 40 ms.
    assert_eq!(
        requests_to_pod_4((0.9, 6.0)),
        0,
        "predicted to miss a 300 ms SLO"
    );
    // The same pods all alike: pod 4 takes its share.
    assert!(requests_to_pod_4((0.04, 0.0)) > 3);
}

/// Of 60 requests with a 300 ms TTFT SLO, those the guide sends to pod 4 once every pod
/// reported its TTFT for 4 s, pod 4 with `(ttft_s, waiting)`.
fn requests_to_pod_4(pod_4: (f64, f64)) -> usize {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm-d-guides/llmd-predicted-latency.yaml");
    let (_, text) = with_pool(&path);
    let config = load(&text, 7).expect("loads");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let mut director = OnePool::new(config);
    for (second, served) in [(1u64, 0.0), (2, 20.0), (3, 40.0), (4, 60.0)] {
        for pod in 0..5 {
            let (ttft, waiting) = if pod == 4 { pod_4 } else { (0.04, 0.0) };
            director.scrape(pod, second * 1000, &page_after(served, ttft, waiting));
        }
        director.on_tick(second * 1000);
    }
    let mut to_pod_4 = 0;
    for n in 0..60 {
        let headers = RequestHeaders {
            slo_ttft_ms: Some(300.0),
            ..RequestHeaders::default()
        };
        let body =
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"question {n}"}}]}}"#);
        let routed = director
            .route(ApiKind::ChatCompletions, Some(body.as_bytes()), headers)
            .expect("routes");
        to_pod_4 += usize::from(routed.destination == "10.0.0.5:8000");
        director.release(&routed);
    }
    to_pod_4
}
