//! `make demo`: a real Envoy (`envoy/envoy.yaml`, `--concurrency 2`) with the filter in front
//! of four simulated vLLM pods in different states; every request's routing decision is shown
//! with the scores behind it, then a per-pod summary. Everything started is stopped at the end.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Instant;
use support::{shipped_picker_config, with_endpoints, Envoy, Sim, MODEL};

const ADAPTERS: &[&str] = &[
    "--adapters",
    "sql-lora,chat-lora",
    "--max-lora",
    "2",
    "--time-scale",
    "0.2",
];

fn main() {
    println!("inference-picker demo: Envoy 1.40 + the wasm filter + 4 simulated vLLM pods\n");
    let pods = [
        ("pod-1", vec!["--loaded-adapters", "chat-lora"], "idle"),
        (
            "pod-2",
            vec!["--background-waiting", "4"],
            "4 requests queued from elsewhere",
        ),
        (
            "pod-3",
            vec!["--loaded-adapters", "sql-lora"],
            "has sql-lora loaded",
        ),
        ("pod-4", vec!["--background-kv", "0.6"], "KV cache 60% full"),
    ];
    let sims: Vec<Sim> = pods
        .iter()
        .map(|(name, args, _)| Sim::start(name, &[ADAPTERS, args.as_slice()].concat()))
        .collect();
    let names: BTreeMap<String, String> = sims
        .iter()
        .map(|s| (s.address.clone(), s.name.clone()))
        .collect();
    for ((name, _, state), sim) in pods.iter().zip(&sims) {
        println!("  {name} at {:<16} {state}", sim.address);
    }
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &refs), 2);
    println!(
        "\nEnvoy listening on {} (admin {}), --concurrency 2",
        envoy.address(),
        envoy.admin_port
    );
    for sim in &sims {
        sim.wait_for_scrapes(3);
    }

    let system = "You are a meticulous SQL assistant. ".repeat(12);
    let chat = |question: &str| {
        format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{question}"}}],"max_tokens":8}}"#
        )
    };
    let requests: Vec<(&str, &str, String)> = vec![
        (
            "completion",
            "/v1/completions",
            format!(
                r#"{{"model":"{MODEL}","prompt":"Write a haiku about gateways.","max_tokens":8}}"#
            ),
        ),
        (
            "completion",
            "/v1/completions",
            format!(r#"{{"model":"{MODEL}","prompt":"Name three prime numbers.","max_tokens":8}}"#),
        ),
        (
            "chat, long system prompt",
            "/v1/chat/completions",
            chat("List the tables."),
        ),
        (
            "chat, same system prompt",
            "/v1/chat/completions",
            chat("Count the rows."),
        ),
        (
            "chat, streaming",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"Stream a reply."}}],"max_tokens":8,"stream":true}}"#
            ),
        ),
        (
            "LoRA adapter sql-lora",
            "/v1/completions",
            r#"{"model":"sql-lora","prompt":"SELECT","max_tokens":8}"#.to_string(),
        ),
        (
            "embeddings",
            "/v1/embeddings",
            format!(r#"{{"model":"{MODEL}","input":"embed this sentence"}}"#),
        ),
        (
            "bad request (no model)",
            "/v1/completions",
            r#"{"prompt":"who am I for?"}"#.to_string(),
        ),
    ];
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for (n, (label, path, body)) in requests.iter().enumerate() {
        let request_id = format!("demo-{n}");
        let headers = [
            ("content-type", "application/json"),
            ("x-request-id", request_id.as_str()),
        ];
        let start = Instant::now();
        let response = envoy.post_with(path, &headers, body);
        let elapsed = start.elapsed().as_millis();
        println!(
            "\n#{n} {label:<26} {path:<22} -> {} {} ({elapsed} ms)",
            response.status,
            response.pod()
        );
        if response.status == 200 {
            *served.entry(response.pod()).or_insert(0) += 1;
        } else {
            println!("    error body: {}", response.text());
        }
        if let Some(line) = envoy.wait_for_log_line(&format!("request_id={request_id} ")) {
            print_decision(&line, &names);
        }
    }

    println!("\nburst: 16 concurrent completions");
    let burst: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..16)
            .map(|n| {
                let envoy = &envoy;
                scope.spawn(move || {
                    let body = format!(
                        r#"{{"model":"{MODEL}","prompt":"burst request {n}","max_tokens":32}}"#
                    );
                    envoy.post("/v1/completions", &body).pod()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut burst_counts: BTreeMap<String, usize> = BTreeMap::new();
    for pod in burst {
        *burst_counts.entry(pod.clone()).or_insert(0) += 1;
        *served.entry(pod).or_insert(0) += 1;
    }
    println!("  picks: {burst_counts:?}");

    println!("\nper-pod summary");
    println!(
        "  {:<6} {:>8} {:>15} {:>14}",
        "pod", "routed", "served (pod)", "/metrics hits"
    );
    for sim in &sims {
        let stats = sim.stats();
        println!(
            "  {:<6} {:>8} {:>15} {:>14}",
            sim.name,
            served.get(&sim.name).copied().unwrap_or(0),
            stats["requests_total"].as_u64().unwrap_or(0),
            stats["metrics_scrapes"].as_u64().unwrap_or(0)
        );
    }
    drop(envoy);
    drop(sims);
    println!("\nstopped Envoy and the pods.");
}

/// Prints one decision log line as a small table: each candidate's total and scores.
fn print_decision(line: &str, names: &BTreeMap<String, String>) {
    let rename = |text: &str| {
        names.iter().fold(text.to_string(), |acc, (address, name)| {
            acc.replace(address, name)
        })
    };
    if let Some(rejected) = line.split("rejected ").nth(1) {
        println!("    rejected by the filter: {rejected}");
        return;
    }
    let picked = line
        .split("picked=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or("?");
    println!("    picked {} because:", rename(picked));
    let candidates = line
        .split("candidates=[")
        .nth(1)
        .unwrap_or("")
        .trim_end_matches(']');
    for candidate in candidates.split("), ") {
        let candidate = rename(candidate.trim_end_matches(')'));
        let (head, scores) = candidate.split_once(" (").unwrap_or((&candidate, ""));
        println!(
            "      {head:<18} {}",
            scores.replace("-scorer", "").replace("-utilization", "")
        );
    }
}
