//! The plugin catalog in a real Envoy: the example configs from `examples/configs/` run
//! unchanged (pool addresses replaced by the simulated pods') and route as they say.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use support::{completion, example_envoy, Envoy, Sim, MODEL};

fn gateway(config: &str, sims: &[&Sim], concurrency: u32) -> Envoy {
    let envoy = example_envoy(config, sims, concurrency);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

fn count_picks(envoy: &Envoy, bodies: impl Iterator<Item = String>) -> BTreeMap<String, usize> {
    let mut picks = BTreeMap::new();
    for body in bodies {
        let response = envoy.post("/v1/completions", &body);
        assert_eq!(response.status, 200, "{}", response.text());
        *picks.entry(response.pod()).or_insert(0) += 1;
    }
    picks
}

#[test]
fn seed_custom_metric_example_picks_the_least_running_llama_pod() {
    // Each pod reports llama-3-8b running requests in its own series; the series of another
    // model would reverse the order if it were not filtered out by the extractor's labels.
    let series = |llama: u32, other: u32| {
        format!(
            "vllm:num_requests_running{{model_name=\"llama-3-8b\"}} {llama}\\nvllm:num_requests_running{{model_name=\"other-model\"}} {other}\\n"
        )
    };
    let a = Sim::start("pod-a", &["--extra-metrics", &series(6, 0)]);
    let b = Sim::start("pod-b", &["--extra-metrics", &series(1, 45)]);
    let c = Sim::start("pod-c", &["--extra-metrics", &series(9, 0)]);
    let envoy = gateway("custom-metrics.yaml", &[&a, &b, &c], 2);
    let picks = count_picks(&envoy, (0..12).map(completion));
    assert_eq!(picks, BTreeMap::from([("pod-b".to_string(), 12)]));

    // The load moves: pod-c now runs the fewest llama-3-8b requests.
    let load = serde_json::json!({ "extra_metrics": series(0, 50).replace("\\n", "\n") });
    c.admin("load", &load.to_string());
    c.wait_for_scrapes(3);
    let picks = count_picks(&envoy, (100..112).map(completion));
    assert_eq!(picks, BTreeMap::from([("pod-c".to_string(), 12)]));
}

/// The seed's validation burst: 50 requests, 20 in flight at a time (20 clients start together,
/// each sends its next request when the last is answered). Returns each pod's share.
fn burst(envoy: &Envoy) -> BTreeMap<String, usize> {
    let picks = Mutex::new(BTreeMap::<String, usize>::new());
    let next = AtomicUsize::new(0);
    let start = Barrier::new(BURST_IN_FLIGHT);
    std::thread::scope(|scope| {
        for _ in 0..BURST_IN_FLIGHT {
            scope.spawn(|| {
                start.wait();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed) + 1;
                    if n > BURST_REQUESTS {
                        return;
                    }
                    let body =
                        format!(r#"{{"model":"{MODEL}","prompt":"hello","max_tokens":8,"n":{n}}}"#);
                    let response = envoy.post("/v1/completions", &body);
                    assert_eq!(response.status, 200, "{}", response.text());
                    *picks.lock().unwrap().entry(response.pod()).or_insert(0) += 1;
                }
            });
        }
    });
    picks.into_inner().unwrap()
}

const BURST_REQUESTS: usize = 50;
const BURST_IN_FLIGHT: usize = 20;
/// Sequences a pod runs at once (`--max-num-seqs`); the rest of what it holds waits.
const POD_SEQUENCES: usize = 4;

/// The most requests any pod may hold at once, running or waiting. The active-request scorer
/// sends each request to a pod with the fewest in flight, so the 20 in flight stay within one
/// of each other over the four pods: at most 5 on a pod, plus one it answered and has not yet
/// released (the simulator frees the slot after writing the answer). A picker that ignores
/// the scorer picks among tied pods uniformly at random: the 20 requests a burst starts with,
/// all at their pods at once (each decodes for 80 ms), then split multinomial(20; 1/4 each),
/// and every pod gets at most 6 of them with probability 0.2448 (summed exactly over every
/// split of 20 into four). The pods keep their peak over all the bursts, so such a picker
/// stays within the bound through [`BURSTS`] of them with probability at most
/// 0.2448^4 = 0.0036: it fails this test at least 99.6 % of the time.
const MAX_HELD: usize = 6;

/// Bursts run one after another (see [`MAX_HELD`]).
const BURSTS: usize = 4;

#[test]
fn seed_validation_burst_spreads_over_every_healthy_pod() {
    // Slow pods (real-time decode, 10 ms per token, four sequences at a time): each request is
    // at its pod for at least 80 ms, so a burst's first 20 are all there at once.
    let sequences = POD_SEQUENCES.to_string();
    let slow = ["--time-scale", "1", "--max-num-seqs", sequences.as_str()];
    let sims: Vec<Sim> = ["pod-a", "pod-b", "pod-c", "pod-d"]
        .iter()
        .map(|name| Sim::start(name, &slow))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    // One worker: the in-flight counts the scorer reads are exact. Across workers each adds
    // the others' as of their last tick (envoy_shared_state tests that sharing).
    let envoy = gateway("active-request.yaml", &refs, 1);
    for round in 1..=BURSTS {
        let picks = burst(&envoy);
        assert_eq!(
            picks.values().sum::<usize>(),
            BURST_REQUESTS,
            "burst {round}"
        );
        assert_eq!(
            picks.len(),
            4,
            "burst {round}: every healthy pod takes part: {picks:?}"
        );
    }
    // The most each pod held at once over the bursts: its sequences plus its longest queue.
    let held: BTreeMap<&str, usize> = refs
        .iter()
        .map(|sim| {
            let queue = sim.stats()["peak_waiting"].as_u64().expect("peak_waiting");
            (sim.name.as_str(), POD_SEQUENCES + queue as usize)
        })
        .collect();
    assert!(
        held.values().all(|&most| most <= MAX_HELD),
        "a pod held more than {MAX_HELD} of the {BURST_IN_FLIGHT} in flight at once: {held:?}"
    );
}

#[test]
fn shared_system_prompt_sticks_to_the_pod_that_served_it_first() {
    // One worker: each Envoy worker keeps its own prefix index until state is shared.
    let sims: Vec<Sim> = ["pod-a", "pod-b", "pod-c"]
        .iter()
        .map(|name| Sim::start(name, &[]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = gateway("prefix-and-load.yaml", &refs, 1);
    let system = "You are a meticulous assistant for the billing team. ".repeat(40);
    let body = |n: usize| {
        format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {n}"}}],"max_tokens":4}}"#
        )
    };
    let first = envoy.post("/v1/chat/completions", &body(0));
    assert_eq!(first.status, 200, "{}", first.text());
    let home = first.pod();
    for n in 1..12 {
        let response = envoy.post("/v1/chat/completions", &body(n));
        assert_eq!(response.pod(), home, "request {n} left the warm pod");
    }
    // The pod's own prefix cache confirms the hits.
    let stats = refs.iter().find(|s| s.name == home).unwrap().stats();
    assert!(stats["prefix_hits"].as_u64().unwrap() > 0, "{stats}");
    // A different system prompt has its own home (which may be the same pod: 1 in 3 here),
    // and its later requests follow it there.
    let other = "Answer as a pirate would, always. ".repeat(40);
    let cold = |n: usize| {
        format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{other}"}},{{"role":"user","content":"hi {n}"}}],"max_tokens":4}}"#
        )
    };
    let pirate_home = envoy.post("/v1/chat/completions", &cold(0)).pod();
    for n in 1..4 {
        assert_eq!(
            envoy.post("/v1/chat/completions", &cold(n)).pod(),
            pirate_home
        );
    }
}

#[test]
fn session_token_is_returned_and_honoured() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let c = Sim::start("pod-c", &[]);
    let envoy = gateway("session-affinity.yaml", &[&a, &b, &c], 2);
    let first = envoy.post("/v1/completions", &completion(0));
    let token = first
        .header("x-session-token")
        .expect("token on the response")
        .to_string();
    let home = first.pod();
    // Make the home pod the most loaded: the session still wins.
    let home_sim = [&a, &b, &c].into_iter().find(|s| s.name == home).unwrap();
    home_sim.admin("load", r#"{"background_waiting":5}"#);
    home_sim.wait_for_scrapes(3);
    for n in 1..10 {
        let response = envoy.post_with(
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-session-token", &token),
            ],
            &completion(n),
        );
        assert_eq!(response.pod(), home);
        assert_eq!(response.header("x-session-token"), Some(token.as_str()));
    }
    // Without the token the loaded pod is avoided.
    assert_ne!(envoy.post("/v1/completions", &completion(99)).pod(), home);
}

#[test]
fn disaggregated_requests_carry_the_prefill_endpoint() {
    let prefill = Sim::start("prefill-a", &[]);
    let decode_b = Sim::start("decode-b", &[]);
    let decode_c = Sim::start("decode-c", &[]);
    let envoy = gateway(
        "pd-disaggregation.yaml",
        &[&prefill, &decode_b, &decode_c],
        2,
    );
    // Distinct from the first character on, so no decode pod holds any of them.
    let long = |n: usize| {
        format!(
            r#"{{"model":"{MODEL}","prompt":"{n} {}","max_tokens":4}}"#,
            "a long document to summarise ".repeat(30)
        )
    };
    for n in 0..4 {
        let response = envoy.post_with(
            "/v1/completions",
            &[
                ("content-type", "application/json"),
                ("x-prefiller-host-port", "6.6.6.6:1"),
            ],
            &long(n),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(response.pod().starts_with("decode-"), "{}", response.pod());
    }
    let short = envoy.post_with(
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-prefiller-host-port", "6.6.6.6:1"),
        ],
        &completion(1),
    );
    assert!(short.pod().starts_with("decode-"));
    let mut seen = BTreeMap::new();
    for sim in [&decode_b, &decode_c] {
        if let Some(map) = sim.stats()["prefillers_seen"].as_object() {
            for (address, count) in map {
                *seen.entry(address.clone()).or_insert(0) += count.as_u64().unwrap();
            }
        }
    }
    // Every long request named the prefill pod; the client's value never got through.
    assert_eq!(seen, BTreeMap::from([(prefill.address.clone(), 4)]));
    assert_eq!(
        prefill.requests_total(),
        0,
        "the prefill pod is not a decode target"
    );
}

#[test]
fn model_rewrite_header_changes_the_served_model() {
    let a = Sim::start("pod-a", &[]);
    let envoy = gateway("active-request.yaml", &[&a], 2);
    let body = r#"{"model":"alias-of-llama","prompt":"hi","max_tokens":2}"#;
    let plain = envoy.post("/v1/completions", body);
    assert_eq!(plain.status, 404, "the pod does not know the alias");
    let rewritten = envoy.post_with(
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-model-name-rewrite", MODEL),
        ],
        body,
    );
    assert_eq!(rewritten.status, 200, "{}", rewritten.text());
    assert_eq!(rewritten.json()["model"], MODEL);
}

/// llm-d-router's integration default config (its shape, `tests/fixtures/llm-d-router`) loads
/// in Envoy and routes, and its `openai-parser` hands the request's priority to the pod: the
/// objective's, negated for vLLM, in place of the client's.
#[test]
fn llm_d_routers_integration_default_config_hands_the_priority_to_the_pod() {
    let a = Sim::start("pod-a", &[]);
    let fixture = std::fs::read_to_string(
        support::repo().join("tests/fixtures/llm-d-router/integration-default.yaml"),
    )
    .expect("fixture");
    let config = format!(
        "{fixture}\npool:\n  objectives: [{{name: critical, priority: 100}}]\n  endpoints: [{{address: '{}'}}]\n",
        a.address
    );
    let envoy = Envoy::start(&config, 1);
    envoy.wait_for_fresh_endpoints(1);
    let body = format!(r#"{{"model":"{MODEL}","prompt":"hi","max_tokens":2,"priority":5}}"#);
    let critical = envoy.post_with(
        "/v1/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-inference-objective", "critical"),
        ],
        &body,
    );
    assert_eq!(critical.status, 200, "{}", critical.text());
    let plain = envoy.post("/v1/completions", &body);
    assert_eq!(plain.status, 200, "{}", plain.text());
    let seen = &a.stats()["priorities_seen"];
    assert_eq!(seen["-100"], 1, "{seen}");
    assert_eq!(seen["0"], 1, "{seen}");
    assert!(
        seen.get("5").is_none(),
        "the client's priority is replaced: {seen}"
    );
}
