//! `make bench`: measurements, written to `bench/RESULTS.md` with CSV and SVG beside it.
//!
//! ```text
//! cargo run --release --example bench -- [schedule|hop|quality|memory|scaleout|all|quick]
//! ```
//! - `schedule`: one full pick (default plugins + prefix scorer) natively, over 8/64/256
//!   endpoints and 2k/8k/32k-character prompts, in ns per pick; body parsing per size.
//! - `hop`: added latency and CPU over Envoy routing with no filter, of the wasm filter and of
//!   an ext_proc picker running the same core (`bench/extproc`); same near-instant pods,
//!   bodies of 1 KB..1 MB, concurrency 1/16/64, interleaved.
//! - `quality`: 8 simulated pods with real prefill/decode timing behind Envoy's ROUND_ROBIN,
//!   LEAST_REQUEST and RANDOM and three picker configs; shared-prefix, mixed, LoRA-mix and
//!   burst workloads; TTFT, throughput, errors, prefix-cache hit rate, picks per pod.
//! - `memory`: Envoy RSS and the VMs' memory at 8/256/1,024 endpoints as the index fills.
//! - `scaleout`: one vs two Envoy replicas in front of the same pods.
//!
//! `BENCH_QUICK=1` runs any part small; `quick` runs them all small.
//!
//! Every run is bounded in requests and time; every process started is stopped.

#[path = "../tests/support/mod.rs"]
mod support;

use inference_picker::config::load;
use inference_picker::endpoint::Health;
use inference_picker::request::{parse_body, ApiKind};
use inference_picker::scheduling::rng::Rng;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{
    example_config, repo, shipped_picker_config, with_endpoints, Envoy, Exchange, KeepAlive, Sim,
    MODEL,
};

fn main() {
    // Decision lines cost a formatted string and a log write per request: measure without.
    std::env::set_var("INFERENCE_PICKER_WASM_LOG", "info");
    let part = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    // `quick` runs every part small (under five minutes) into results-quick/; BENCH_QUICK=1
    // makes any single part small.
    let quick = part == "quick" || std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let (dir, report) = if quick {
        ("bench/results-quick", "bench/RESULTS-quick.md")
    } else {
        ("bench/results", "bench/RESULTS.md")
    };
    let results = repo().join(dir);
    std::fs::create_dir_all(&results).expect("results directory");
    let header = machine_header();
    let all = part == "all" || part == "quick";
    if part == "schedule" || all {
        write_part(&results, "1-schedule", &header, &part, schedule_bench());
    }
    if part == "hop" || all {
        write_part(&results, "2-hop", &header, &part, hop_bench(quick));
    }
    if part == "quality" || all {
        write_part(&results, "3-quality", &header, &part, quality_bench(quick));
    }
    if part == "memory" || all {
        write_part(&results, "4-memory", &header, &part, memory_bench(quick));
    }
    if part == "scaleout" || all {
        write_part(
            &results,
            "5-scaleout",
            &header,
            &part,
            scaleout_bench(quick),
        );
    }
    assemble(&results, report);
}

/// A goal from the issue, with what was measured.
fn goal(text: &str, met: Option<bool>, measured: &str) -> String {
    let verdict = match met {
        Some(true) => "**met**",
        Some(false) => "**not met**",
        None => "**not measured**",
    };
    format!("- Goal: {text}: {verdict} ({measured})\n")
}

/// A part's report: markdown, CSV rows, and an optional SVG chart.
struct Part {
    markdown: String,
    csv: String,
    svg: Option<String>,
}

fn machine_header() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let envoy = std::process::Command::new(support::envoy_binary())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let version = envoy.split_whitespace().last().unwrap_or("?").to_string();
    format!("machine: {cores} cores; Envoy {version}")
}

fn write_part(dir: &Path, name: &str, header: &str, run: &str, part: Part) {
    let command = format!("cargo run --release --example bench -- {run}");
    let markdown = format!("_Command: `{command}`; {header}._\n\n{}", part.markdown);
    std::fs::write(dir.join(format!("{name}.md")), markdown).expect("write md");
    std::fs::write(dir.join(format!("{name}.csv")), part.csv).expect("write csv");
    if let Some(svg) = part.svg {
        std::fs::write(dir.join(format!("{name}.svg")), svg).expect("write svg");
    }
}

fn assemble(dir: &Path, report: &str) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("results")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .collect();
    names.sort();
    let folder = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("results");
    let mut out = format!(
        "# Benchmark results\n\nProduced by `make bench` (parts: `make bench-schedule`, `make bench-hop`, \
         `make bench-quality`, `make bench-memory`, `make bench-scaleout`; a small run: `make bench-quick`). Raw numbers are in `bench/{folder}/*.csv`, \
         charts in `bench/{folder}/*.svg`. How to read them: `bench/README.md`.\n\n"
    );
    for name in names {
        out.push_str(&std::fs::read_to_string(dir.join(&name)).unwrap_or_default());
        out.push('\n');
    }
    let out = out.replace("](results/", &format!("]({folder}/"));
    std::fs::write(repo().join(report), out).expect("report");
    println!("wrote {report}");
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

// ---------------------------------------------------------------- scheduling cost (native)

const SCHEDULE_CONFIG: &str = "pool:\n  endpoints:\n";

fn schedule_bench() -> Part {
    println!("schedule: one pick, default plugins + prefix scorer");
    let mut markdown = String::from(
        "## 1. Scheduling cost (native)\n\nOne full pick with GIE's default plugins \
         (queue 2, KV 2, prefix 3, max-score picker), chat prompt, fresh metrics; mean over \
         repeated picks of distinct prompts that share their first half.\n\n\
         | endpoints | prompt chars | ns per pick |\n|---:|---:|---:|\n",
    );
    let mut csv = String::from("endpoints,prompt_chars,ns_per_pick\n");
    for (endpoints, chars) in [(8, 8000), (64, 8000), (256, 8000), (64, 2000), (64, 32000)] {
        let ns = time_picks(endpoints, chars);
        println!("  {endpoints:>4} endpoints, {chars:>6} chars: {ns:>9.0} ns/pick");
        let _ = writeln!(markdown, "| {endpoints} | {chars} | {ns:.0} |");
        let _ = writeln!(csv, "{endpoints},{chars},{ns:.0}");
    }
    markdown.push_str(
        "\nThe pick is linear in endpoints (every scorer visits each candidate) and in prompt \
         length (the prompt is hashed once per request into blocks, up to the prefix scorer's \
         `maxPrefixBlocksToMatch`).\n\n\
         Parsing the request body (completions, one prompt string), natively:\n\n\
         | body | µs per parse |\n|---:|---:|\n",
    );
    for bytes in [1024usize, 32 * 1024, 220 * 1024, 1024 * 1024] {
        let us = time_parse(bytes);
        println!("  parse {:>5} KB: {us:>8.1} µs", bytes / 1024);
        let _ = writeln!(markdown, "| {} KB | {us:.1} |", bytes / 1024);
        let _ = writeln!(csv, "parse,{bytes},{:.0}", us * 1000.0);
    }
    Part {
        markdown,
        csv,
        svg: None,
    }
}

fn time_parse(bytes: usize) -> f64 {
    let body = format!(
        r#"{{"model":"{MODEL}","prompt":"{}","max_tokens":1}}"#,
        "x".repeat(bytes.saturating_sub(64))
    );
    let iterations = (64 * 1024 * 1024 / bytes).clamp(20, 20_000);
    let started = Instant::now();
    for _ in 0..iterations {
        let parsed = parse_body(ApiKind::Completions, body.as_bytes()).expect("body");
        std::hint::black_box(parsed);
    }
    started.elapsed().as_secs_f64() * 1e6 / iterations as f64
}

fn time_picks(endpoints: usize, chars: usize) -> f64 {
    let mut yaml = String::from(SCHEDULE_CONFIG);
    for i in 0..endpoints {
        let _ = writeln!(
            yaml,
            "  - address: 10.{}.{}.{}:8000",
            i / 65536,
            (i / 256) % 256,
            i % 256
        );
    }
    let mut picker = inference_picker::director::Director::new(load(&yaml, 7).expect("config"));
    let mut rng = Rng::new(3);
    for i in 0..endpoints {
        let body = format!(
            "vllm:num_requests_waiting {}\nvllm:kv_cache_usage_perc {}\n",
            rng.below(10),
            rng.unit()
        );
        picker.on_scrape_ok(i, 0, &body).expect("metrics");
    }
    picker.on_tick(0);
    assert!(picker
        .pool()
        .endpoints
        .iter()
        .all(|e| e.health == Health::Fresh));
    let shared = "s".repeat(chars / 2);
    let bodies: Vec<Vec<u8>> = (0..64)
        .map(|n| {
            let tail = format!("{n:04}").repeat(chars / 8);
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{shared}{tail}"}}]}}"#)
                .into_bytes()
        })
        .collect();
    let requests: Vec<_> = bodies
        .iter()
        .map(|b| parse_body(ApiKind::ChatCompletions, b).expect("body"))
        .collect();
    let iterations = (400_000 / endpoints.max(1)).clamp(200, 5000);
    for request in requests.iter().take(16) {
        let _ = picker.route_parsed(request);
    }
    let started = Instant::now();
    for i in 0..iterations {
        let routed = picker
            .route_parsed(&requests[i % requests.len()])
            .expect("routed");
        picker.release(&routed);
    }
    started.elapsed().as_nanos() as f64 / iterations as f64
}

// ---------------------------------------------------------------- hop cost

/// Envoy CPU seconds (user + system) so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

/// Envoy with no filter, round-robin over a STATIC cluster of the pods.
fn plain_envoy(sims: &[&Sim], lb_policy: &'static str) -> Envoy {
    let endpoints: Vec<serde_yaml::Value> = sims
        .iter()
        .map(|sim| {
            let (host, port) = sim.address.rsplit_once(':').expect("address");
            serde_yaml::from_str(&format!(
                "endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}}}"
            ))
            .expect("endpoint")
        })
        .collect();
    let picker = with_endpoints(&shipped_picker_config(), sims);
    Envoy::start_with(&picker, 2, move |config| {
        let filters = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]
            ["filters"][0]["typed_config"]["http_filters"];
        if let serde_yaml::Value::Sequence(list) = filters {
            list.retain(|f| f["name"] == "envoy.filters.http.router");
        }
        let route = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
            [0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
        route["cluster"] = "pool".into();
        let cluster: serde_yaml::Value = serde_yaml::from_str(&format!(
            "{{name: pool, type: STATIC, connect_timeout: 1s, lb_policy: {lb_policy}, \
             load_assignment: {{cluster_name: pool, endpoints: [{{lb_endpoints: []}}]}}}}"
        ))
        .expect("cluster");
        config["static_resources"]["clusters"] = serde_yaml::Value::Sequence(vec![cluster]);
        config["static_resources"]["clusters"][0]["load_assignment"]["endpoints"][0]
            ["lb_endpoints"] = serde_yaml::Value::Sequence(endpoints.clone());
    })
}

/// Closed loop: `clients` keep-alive connections sending `count` requests in all.
fn closed_loop(address: &str, clients: usize, count: usize, body: &str) -> Vec<Exchange> {
    closed_loop_over(address, clients, count, &|_| body)
}

/// Closed loop where request `n` carries `body(n)`.
fn closed_loop_over<'b>(
    address: &str,
    clients: usize,
    count: usize,
    body: &(dyn Fn(usize) -> &'b str + Sync),
) -> Vec<Exchange> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(count));
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let mut client = KeepAlive::new(address);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count || Instant::now() > deadline {
                        return;
                    }
                    if let Ok(exchange) = client.post("/v1/completions", body(n)) {
                        results.lock().expect("results").push(exchange);
                    }
                }
            });
        }
    });
    results.into_inner().expect("results")
}

struct HopCell {
    p50_ms: f64,
    p99_ms: f64,
    /// Envoy's CPU seconds per 1,000 requests, and the out-of-process picker's if there is one.
    cpu_per_1000: f64,
    picker_cpu_per_1000: f64,
    errors: usize,
}

/// A gateway under test: Envoy, plus the process it calls out to, if any.
struct HopGateway<'a> {
    envoy: &'a Envoy,
    sidecar: Option<u32>,
}

/// Every gateway on one cell, alternating in rounds so drift on a shared machine hits all.
fn hop_cell(gateways: &[HopGateway<'_>], clients: usize, count: usize, body: &str) -> Vec<HopCell> {
    const ROUNDS: usize = 4;
    let n = gateways.len();
    let mut latencies = vec![Vec::new(); n];
    let mut cpu = vec![(0.0f64, 0.0f64); n];
    let mut sent = vec![0usize; n];
    for gateway in gateways {
        let _ = closed_loop(&gateway.envoy.address(), clients, clients * 4, body);
    }
    let sidecar_cpu = |pid: Option<u32>| pid.map_or(0.0, cpu_seconds);
    for _ in 0..ROUNDS {
        for (g, gateway) in gateways.iter().enumerate() {
            let before = (
                cpu_seconds(gateway.envoy.pid()),
                sidecar_cpu(gateway.sidecar),
            );
            let results = closed_loop(&gateway.envoy.address(), clients, count / ROUNDS, body);
            cpu[g].0 += cpu_seconds(gateway.envoy.pid()) - before.0;
            cpu[g].1 += sidecar_cpu(gateway.sidecar) - before.1;
            sent[g] += count / ROUNDS;
            latencies[g].extend(
                results
                    .iter()
                    .filter(|e| e.status == 200)
                    .map(|e| e.total.as_secs_f64() * 1000.0),
            );
        }
    }
    (0..n)
        .map(|g| {
            let sorted = sorted(std::mem::take(&mut latencies[g]));
            let per_1000 = 1000.0 / sent[g].max(1) as f64;
            HopCell {
                p50_ms: percentile(&sorted, 50.0),
                p99_ms: percentile(&sorted, 99.0),
                cpu_per_1000: cpu[g].0 * per_1000,
                picker_cpu_per_1000: cpu[g].1 * per_1000,
                errors: sent[g] - sorted.len(),
            }
        })
        .collect()
}

/// The ext_proc baseline: `extproc-picker` (bench/extproc), our scheduling core behind gRPC.
struct ExtProcPicker {
    child: std::process::Child,
    address: String,
    _dir: support::TempDir,
}

impl ExtProcPicker {
    fn start(picker_config: &str) -> ExtProcPicker {
        use std::io::BufRead as _;
        let binary = repo().join("target/release/extproc-picker");
        assert!(
            binary.exists(),
            "run `make extproc` first (make bench does it)"
        );
        let dir = support::TempDir::new("extproc");
        let config = dir.0.join("picker.yaml");
        std::fs::write(&config, picker_config).expect("picker config");
        let mut child = std::process::Command::new(binary)
            .args(["--port", "0", "--config"])
            .arg(&config)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start extproc-picker");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("extproc-picker prints its address");
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .expect("address line")
            .to_string();
        ExtProcPicker {
            child,
            address,
            _dir: dir,
        }
    }
}

impl Drop for ExtProcPicker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Envoy with the `ext_proc` filter in the wasm filter's place, calling `picker` over gRPC the
/// way Envoy calls GIE's endpoint picker: headers and the whole body streamed to it
/// (`FULL_DUPLEX_STREAMED`), response headers too, so it knows when a request ends.
fn ext_proc_envoy(sims: &[&Sim], picker: &ExtProcPicker) -> Envoy {
    let (host, port) = picker.address.rsplit_once(':').expect("address");
    let filter: serde_yaml::Value = serde_yaml::from_str(
        r#"
name: envoy.filters.http.ext_proc
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service:
    envoy_grpc: {cluster_name: endpoint_picker}
    timeout: 10s
  failure_mode_allow: false
  message_timeout: 10s
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SEND
    request_body_mode: FULL_DUPLEX_STREAMED
    request_trailer_mode: SEND
    response_body_mode: NONE
    response_trailer_mode: SKIP
"#,
    )
    .expect("ext_proc filter");
    let cluster: serde_yaml::Value = serde_yaml::from_str(&format!(
        r#"
name: endpoint_picker
type: STATIC
connect_timeout: 1s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {{http2_protocol_options: {{}}}}
load_assignment:
  cluster_name: endpoint_picker
  endpoints:
  - lb_endpoints:
    - endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}}}
"#
    ))
    .expect("picker cluster");
    let picker_config = with_endpoints(&shipped_picker_config(), sims);
    Envoy::start_with(&picker_config, 2, move |config| {
        let filters = &mut config["static_resources"]["listeners"][0]["filter_chains"][0]
            ["filters"][0]["typed_config"]["http_filters"];
        if let serde_yaml::Value::Sequence(list) = filters {
            for entry in list.iter_mut() {
                if entry["name"] == "envoy.filters.http.wasm" {
                    *entry = filter.clone();
                }
            }
        }
        if let serde_yaml::Value::Sequence(clusters) = &mut config["static_resources"]["clusters"] {
            clusters.push(cluster.clone());
        }
    })
}

fn hop_bench(quick: bool) -> Part {
    println!("hop: Envoy alone vs Envoy + the wasm filter vs Envoy + ext_proc picker");
    let instant = ["--time-scale", "0"];
    let sims: Vec<Sim> = (1..=2)
        .map(|i| Sim::start(&format!("pod-{i}"), &instant))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let picker_config = with_endpoints(&shipped_picker_config(), &refs);
    let plain = plain_envoy(&refs, "ROUND_ROBIN");
    let filter = Envoy::start(&picker_config, 2);
    let ext_proc = ExtProcPicker::start(&picker_config);
    let ext_proc_gateway = ext_proc_envoy(&refs, &ext_proc);
    for sim in &refs {
        sim.wait_for_scrapes(6);
    }
    let gateways = [
        HopGateway {
            envoy: &plain,
            sidecar: None,
        },
        HopGateway {
            envoy: &filter,
            sidecar: None,
        },
        HopGateway {
            envoy: &ext_proc_gateway,
            sidecar: Some(ext_proc.child.id()),
        },
    ];
    let mut markdown = String::from(
        "## 2. Hop cost: the filter inside Envoy vs an ext_proc picker vs Envoy alone\n\n\
         Same two near-instant simulated pods, three gateways, each Envoy `--concurrency 2`: \
         (a) Envoy routing round-robin with no filter (the floor); (b) Envoy with the wasm \
         filter (default plugins); (c) Envoy with the `ext_proc` filter calling `extproc-picker` \
         (`bench/extproc`: the same scheduling core and config, natively, behind gRPC, in GIE's \
         shape: request headers and body streamed to it with `FULL_DUPLEX_STREAMED`, the body \
         streamed back, the destination header returned, response headers sent so it can \
         release the request). The gateways alternate in four rounds per cell; closed loop \
         over keep-alive connections, `max_tokens: 1`; the wasm log at `info` (no per-request \
         decision line). Added = (b) - (a) and (c) - (a). CPU = user+system seconds per \
         1,000 requests: Envoy's, and for (c) the picker process's as well.\n\n\
         | body | clients | (a) p50 ms | (b) added p50 µs | (c) added p50 µs | (a) p99 ms | (b) added p99 µs | (c) added p99 µs | (a) CPU | (b) CPU | (c) Envoy CPU | (c) picker CPU | errors |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut csv = String::from(
        "body_bytes,clients,a_p50_ms,b_p50_ms,c_p50_ms,a_p99_ms,b_p99_ms,c_p99_ms,a_cpu_s_per_1k,b_cpu_s_per_1k,c_envoy_cpu_s_per_1k,c_picker_cpu_s_per_1k,errors\n",
    );
    let mut bars = Vec::new();
    let bodies: &[usize] = if quick {
        &[1024, 220 * 1024]
    } else {
        &[1024, 32 * 1024, 220 * 1024, 1024 * 1024]
    };
    let concurrency: &[usize] = if quick { &[1, 16] } else { &[1, 16, 64] };
    let mut small_added_p50 = f64::NAN;
    // (clients, filter added p50, ext_proc added p50) at 220 KB.
    let mut large = Vec::new();
    for &body_bytes in bodies {
        let prompt = "x".repeat(body_bytes.saturating_sub(64));
        let body = format!(r#"{{"model":"{MODEL}","prompt":"{prompt}","max_tokens":1}}"#);
        for &clients in concurrency {
            let count = match body_bytes {
                b if b >= 1024 * 1024 => 160,
                b if b >= 220 * 1024 => 400,
                _ => 1600,
            } / if quick { 4 } else { 1 };
            let cells = hop_cell(&gateways, clients, count, &body);
            let [a, b, c] = [&cells[0], &cells[1], &cells[2]];
            let added = |x: &HopCell, p99: bool| {
                if p99 {
                    (x.p99_ms - a.p99_ms) * 1000.0
                } else {
                    (x.p50_ms - a.p50_ms) * 1000.0
                }
            };
            if body_bytes == 1024 && clients == 1 {
                small_added_p50 = added(b, false);
            }
            if body_bytes == 220 * 1024 {
                large.push((clients, added(b, false), added(c, false)));
            }
            println!(
                "  {:>5} KB x{clients:<3} p50 {:.3} ms; filter +{:.0} µs; ext_proc +{:.0} µs",
                body_bytes / 1024,
                a.p50_ms,
                added(b, false),
                added(c, false)
            );
            let errors = a.errors + b.errors + c.errors;
            let _ = writeln!(
                markdown,
                "| {} KB | {clients} | {:.3} | {:.0} | {:.0} | {:.3} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {errors} |",
                body_bytes / 1024,
                a.p50_ms,
                added(b, false),
                added(c, false),
                a.p99_ms,
                added(b, true),
                added(c, true),
                a.cpu_per_1000,
                b.cpu_per_1000,
                c.cpu_per_1000,
                c.picker_cpu_per_1000,
            );
            let _ = writeln!(
                csv,
                "{body_bytes},{clients},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{errors}",
                a.p50_ms,
                b.p50_ms,
                c.p50_ms,
                a.p99_ms,
                b.p99_ms,
                c.p99_ms,
                a.cpu_per_1000,
                b.cpu_per_1000,
                c.cpu_per_1000,
                c.picker_cpu_per_1000,
            );
            if clients == 1 {
                bars.push((
                    format!("{} KB", body_bytes / 1024),
                    vec![a.p50_ms, b.p50_ms, c.p50_ms],
                ));
            }
        }
    }
    // Histograms reach the admin page on Envoy's stats flush (every 5 s).
    std::thread::sleep(Duration::from_millis(5500));
    let histogram = filter
        .admin_get("/stats?filter=scheduling_time_us")
        .text()
        .lines()
        .find(|l| l.contains("scheduling_time_us") && l.contains("P50"))
        .map(|l| l.trim().to_string())
        .unwrap_or_default();
    println!("  in-filter decision time: {histogram}");
    let _ = write!(
        markdown,
        "\nTime inside the filter, from the last request callback to the decision (body read, \
         parse, prefix hashing, scheduling), over all cells, from the filter's own histogram \
         (µs): `{histogram}`.\n"
    );
    markdown.push('\n');
    markdown.push_str(&goal(
        "the filter adds at most 50 µs at p50 with a 1 KB body",
        Some(small_added_p50 <= 50.0),
        &format!("{small_added_p50:.0} µs at 1 client"),
    ));
    markdown.push_str(&hop_ratio_goal(&large));
    markdown.push_str("\n![p50 latency at 1 client](results/2-hop.svg)\n");
    Part {
        markdown,
        csv,
        svg: Some(bar_chart(
            "p50 latency, 1 client (ms)",
            &[
                "(a) Envoy alone",
                "(b) Envoy + wasm filter",
                "(c) Envoy + ext_proc picker",
            ],
            &bars,
        )),
    }
}

/// Judged at one client, where the added time is the hop itself rather than queueing; the
/// ratios under load are reported beside it.
fn hop_ratio_goal(large: &[(usize, f64, f64)]) -> String {
    let ratios: Vec<String> = large
        .iter()
        .map(|(clients, filter, ext_proc)| {
            format!(
                "{clients} client(s): filter +{filter:.0} µs, ext_proc +{ext_proc:.0} µs, {:.1}x",
                ext_proc / filter.max(1.0)
            )
        })
        .collect();
    let met = large
        .iter()
        .find(|(clients, ..)| *clients == 1)
        .map(|(_, filter, ext_proc)| *ext_proc >= 10.0 * filter.max(0.0));
    goal(
        "at 220 KB the filter adds at least 10x less than an ext_proc picker (p50, 1 client)",
        met,
        &ratios.join("; "),
    )
}

// ---------------------------------------------------------------- routing quality

#[derive(Clone, Copy)]
enum Gateway {
    Envoy(&'static str),
    Picker(&'static str),
}

impl Gateway {
    fn name(self) -> String {
        match self {
            Gateway::Envoy(policy) => format!("Envoy {policy}"),
            Gateway::Picker(config) => format!("picker {}", config.trim_end_matches(".yaml")),
        }
    }

    fn start(self, sims: &[&Sim]) -> Envoy {
        match self {
            Gateway::Envoy(policy) => plain_envoy(sims, policy),
            Gateway::Picker(config) => {
                let text = if config == "default" {
                    shipped_picker_config()
                } else {
                    example_config(config)
                };
                Envoy::start(&with_endpoints(&text, sims), 2)
            }
        }
    }
}

const QUALITY_SIM: [&str; 10] = [
    "--max-num-seqs",
    "2",
    "--time-scale",
    "0.2",
    "--prefill-us-per-token",
    "400",
    "--decode-ms-per-token",
    "10",
    "--kv-blocks",
    "1024",
];

/// The requests of one workload, in arrival order: (path, body).
fn shared_prefix_workload(groups: usize, per_group: usize, rng: &mut Rng) -> Vec<String> {
    let mut requests = Vec::new();
    for g in 0..groups {
        // ~2048 tokens of system prompt per group, ~128 of question, 64 out.
        let system = format!("Group {g} system prompt. ").repeat(8192 / 24);
        for q in 0..per_group {
            let question = format!("Question {q} of group {g}: ").repeat(512 / 24);
            requests.push(format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{question}"}}],"max_tokens":64,"stream":true}}"#
            ));
        }
    }
    rng.shuffle(&mut requests);
    requests
}

/// Pod flags for the LoRA workload: 12 adapters, room for 2, loading one takes 200 ms.
const LORA_SIM: [&str; 6] = [
    "--adapters",
    "lora-0,lora-1,lora-2,lora-3,lora-4,lora-5,lora-6,lora-7,lora-8,lora-9,lora-10,lora-11",
    "--max-lora",
    "2",
    "--lora-load-ms",
    "200",
];

fn lora_workload(count: usize, rng: &mut Rng) -> Vec<String> {
    mixed_workload(count, rng)
        .into_iter()
        .map(|body| body.replacen(MODEL, &format!("lora-{}", rng.below(12)), 1))
        .collect()
}

fn mixed_workload(count: usize, rng: &mut Rng) -> Vec<String> {
    (0..count)
        .map(|n| {
            let tokens = [64usize, 256, 1024, 3072][rng.below(4)];
            let prompt = format!("{n} unique prompt text ").repeat(tokens * 4 / 22);
            format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{prompt}"}}],"max_tokens":64,"stream":true}}"#
            )
        })
        .collect()
}

struct QualityRun {
    ttft: Vec<f64>,
    elapsed: f64,
    errors: usize,
    hit_rate: f64,
    picks: BTreeMap<String, usize>,
}

/// Open loop: Poisson arrivals at `rate` per second, one thread per request in flight; request
/// `n` goes to `addresses[n % len]` (several gateways behind a round-robin L4 balancer).
fn open_loop(
    addresses: &[String],
    requests: &[String],
    rate: f64,
    seed: u64,
) -> (Vec<Exchange>, usize, f64) {
    let mut rng = Rng::new(seed);
    let results = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(0usize));
    let started = Instant::now();
    let mut at = 0.0f64;
    let mut threads = Vec::new();
    for (n, body) in requests.iter().enumerate() {
        at += -(1.0 - rng.unit()).ln() / rate;
        let wait = Duration::from_secs_f64(at).saturating_sub(started.elapsed());
        std::thread::sleep(wait);
        let (results, errors) = (results.clone(), errors.clone());
        let address = addresses[n % addresses.len()].clone();
        let body = body.clone();
        threads.push(std::thread::spawn(move || {
            match KeepAlive::new(&address).post("/v1/chat/completions", &body) {
                Ok(e) if e.status == 200 => results.lock().expect("results").push(e),
                _ => *errors.lock().expect("errors") += 1,
            }
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let results = results.lock().expect("results").clone();
    let errors = *errors.lock().expect("errors");
    (results, errors, elapsed)
}

/// Fresh pods started with `sim_args`, `replicas` gateways in front of them sharing the load.
fn quality_run_on(
    gateway: Gateway,
    replicas: usize,
    sim_args: &[&str],
    requests: &[String],
    rate: f64,
) -> QualityRun {
    let sims: Vec<Sim> = (1..=8)
        .map(|i| Sim::start(&format!("pod-{i}"), sim_args))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let gateways: Vec<Envoy> = (0..replicas).map(|_| gateway.start(&refs)).collect();
    if let Gateway::Picker(_) = gateway {
        for sim in &refs {
            sim.wait_for_scrapes(2 * replicas as u64);
        }
    }
    let addresses: Vec<String> = gateways.iter().map(Envoy::address).collect();
    let (results, errors, elapsed) = open_loop(&addresses, requests, rate, 11);
    let (mut hits, mut queries) = (0.0, 0.0);
    for sim in &refs {
        let stats = sim.stats();
        hits += stats["prefix_hits"].as_f64().unwrap_or(0.0);
        queries += stats["prefix_queries"].as_f64().unwrap_or(0.0);
    }
    let mut picks = BTreeMap::new();
    for e in &results {
        *picks.entry(e.pod.clone()).or_insert(0) += 1;
    }
    QualityRun {
        ttft: sorted(
            results
                .iter()
                .map(|e| e.first_byte.as_secs_f64() * 1000.0)
                .collect(),
        ),
        elapsed,
        errors,
        hit_rate: if queries > 0.0 { hits / queries } else { 0.0 },
        picks,
    }
}

/// Best achievable share of prompt tokens served from cache on the shared-prefix workload:
/// each group's first request misses; the others hit the system prompt, not the question.
fn best_hit_rate(per_group: usize) -> f64 {
    let (system, question) = (2048.0, 128.0);
    (per_group - 1) as f64 / per_group as f64 * system / (system + question)
}

fn quality_bench(quick: bool) -> Part {
    println!("quality: 8 pods, open-loop Poisson arrivals");
    let gateways: &[Gateway] = if quick {
        &[
            Gateway::Envoy("ROUND_ROBIN"),
            Gateway::Envoy("LEAST_REQUEST"),
            Gateway::Picker("prefix-and-load.yaml"),
        ]
    } else {
        &[
            Gateway::Envoy("ROUND_ROBIN"),
            Gateway::Envoy("LEAST_REQUEST"),
            Gateway::Envoy("RANDOM"),
            Gateway::Picker("default"),
            Gateway::Picker("prefix-and-load.yaml"),
            Gateway::Picker("request-cost.yaml"),
        ]
    };
    let per_group = if quick { 8 } else { 16 };
    let mut rng = Rng::new(5);
    let shared = shared_prefix_workload(16, per_group, &mut rng);
    let mixed = mixed_workload(if quick { 60 } else { 200 }, &mut rng);
    let lora = lora_workload(200, &mut rng);
    let burst = mixed_workload(50, &mut rng);
    let lora_sim: Vec<&str> = QUALITY_SIM.iter().copied().chain(LORA_SIM).collect();
    // (name, requests, arrivals per second, pod flags); the burst arrives all at once.
    let workloads: Vec<(&str, &[String], f64, &[&str])> = if quick {
        vec![
            ("shared prefix, 45 req/s", &shared, 45.0, &QUALITY_SIM),
            ("burst of 50", &burst, 1e9, &QUALITY_SIM),
        ]
    } else {
        vec![
            ("shared prefix, 10 req/s", &shared, 10.0, &QUALITY_SIM),
            ("shared prefix, 45 req/s", &shared, 45.0, &QUALITY_SIM),
            ("mixed lengths, 20 req/s", &mixed, 20.0, &QUALITY_SIM),
            ("LoRA mix, 20 req/s", &lora, 20.0, &lora_sim),
            ("burst of 50", &burst, 1e9, &QUALITY_SIM),
        ]
    };
    // (workload, gateway) -> (p90, hit rate), for the goals.
    let mut measured: BTreeMap<(String, String), (f64, f64)> = BTreeMap::new();
    let mut markdown = String::from(
        "## 3. Routing quality\n\n8 simulated pods (`max-num-seqs 2`, prefill 400 µs per \
         uncached token, decode 10 ms per token, time scale 0.2, prefix cache of 1024 blocks of 16 tokens, room for about 7 of the 16 system prompts); \
         each run starts fresh pods. Shared prefix: 16 groups x 16 prompts, ~2048-token system \
         prompt + ~128-token question, 64 tokens out, shuffled. Mixed: 200 unique prompts of \
         64..3072 tokens. LoRA mix: 200 unique prompts of 64..3072 tokens, each for one of 12 \
         adapters (`lora-0`..`lora-11`, uniformly), pods with `--max-lora 2` and 200 ms (scaled: \
         40 ms) to load an adapter that is not resident. Burst: 50 mixed prompts sent at the \
         same instant (the seed's validation burst). Open-loop Poisson arrivals; streaming; \
         TTFT = time to the first token chunk. Hit rate = prompt tokens served from the pods' \
         prefix caches / prompt tokens.\n\n\
         | workload | gateway | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | throughput req/s | errors | hit rate | picks per pod |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let mut csv = String::from(
        "workload,gateway,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,throughput,errors,hit_rate\n",
    );
    let mut bars = Vec::new();
    // BENCH_ONLY=substring limits the runs (by "workload gateway") while tuning.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    for &(name, requests, rate, sim_args) in &workloads {
        let mut p90s = Vec::new();
        for &gateway in gateways {
            if !format!("{name} {}", gateway.name()).contains(&only) {
                continue;
            }
            let run = quality_run_on(gateway, 1, sim_args, requests, rate);
            let (p50, p90, p99) = (
                percentile(&run.ttft, 50.0),
                percentile(&run.ttft, 90.0),
                percentile(&run.ttft, 99.0),
            );
            let throughput = run.ttft.len() as f64 / run.elapsed;
            println!(
                "  {name:<26} {:<28} TTFT p90 {p90:>8.1} ms  hit {:>5.1} %",
                gateway.name(),
                run.hit_rate * 100.0
            );
            let picks: Vec<String> = run.picks.values().map(ToString::to_string).collect();
            let _ = writeln!(
                markdown,
                "| {name} | {} | {p50:.1} | {p90:.1} | {p99:.1} | {throughput:.1} | {} | {:.1} % | {} |",
                gateway.name(),
                run.errors,
                run.hit_rate * 100.0,
                picks.join(" / ")
            );
            let _ = writeln!(
                csv,
                "{name},{},{p50:.2},{p90:.2},{p99:.2},{throughput:.2},{},{:.4}",
                gateway.name(),
                run.errors,
                run.hit_rate
            );
            p90s.push(p90);
            measured.insert((name.to_string(), gateway.name()), (p90, run.hit_rate));
        }
        bars.push((name.to_string(), p90s));
    }
    markdown.push('\n');
    markdown.push_str(&quality_goals(&measured, best_hit_rate(per_group)));
    markdown.push_str("\n![TTFT p90 per gateway](results/3-quality.svg)\n");
    let names: Vec<String> = gateways.iter().map(|g| g.name()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Part {
        markdown,
        csv,
        svg: Some(bar_chart("TTFT p90 (ms)", &names, &bars)),
    }
}

/// The issue's routing-quality goals, judged on the best picker configuration of each workload.
fn quality_goals(measured: &BTreeMap<(String, String), (f64, f64)>, best_hit: f64) -> String {
    let of = |workload: &str, gateway: &str| {
        measured
            .get(&(workload.to_string(), gateway.to_string()))
            .copied()
    };
    let best_picker = |workload: &str| {
        measured
            .iter()
            .filter(|((w, g), _)| w == workload && g.starts_with("picker"))
            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
            .map(|((_, g), &v)| (g.clone(), v))
    };
    let mut out = String::new();
    let heavy = "shared prefix, 45 req/s";
    match (
        best_picker(heavy),
        of(heavy, "Envoy ROUND_ROBIN"),
        of(heavy, "Envoy LEAST_REQUEST"),
    ) {
        (Some((picker, (p90, hit))), Some((rr, _)), Some((lr, _))) => {
            out.push_str(&goal(
                "near saturation, TTFT p90 at least 5x lower than ROUND_ROBIN",
                Some(rr / p90 >= 5.0),
                &format!("{picker}: {p90:.0} ms vs {rr:.0} ms, {:.1}x", rr / p90),
            ));
            out.push_str(&goal(
                "near saturation, TTFT p90 at least 3x lower than LEAST_REQUEST",
                Some(lr / p90 >= 3.0),
                &format!("{picker}: {p90:.0} ms vs {lr:.0} ms, {:.1}x", lr / p90),
            ));
            out.push_str(&goal(
                "prefix-cache hit rate within 10 % of the best achievable",
                Some(hit >= 0.9 * best_hit),
                &format!(
                    "{:.1} % vs {:.1} % achievable",
                    hit * 100.0,
                    best_hit * 100.0
                ),
            ));
        }
        _ => out.push_str(&goal("near-saturation goals", None, "workload not run")),
    }
    let mixed = "mixed lengths, 20 req/s";
    match (best_picker(mixed), of(mixed, "Envoy LEAST_REQUEST")) {
        (Some((picker, (p90, _))), Some((lr, _))) => out.push_str(&goal(
            "no shared prefix: no worse than LEAST_REQUEST (TTFT p90 within 5 %)",
            Some(p90 <= lr * 1.05),
            &format!("{picker}: {p90:.0} ms vs {lr:.0} ms"),
        )),
        _ => out.push_str(&goal(
            "no shared prefix: no worse than LEAST_REQUEST",
            None,
            "workload not run",
        )),
    }
    out
}

// ---------------------------------------------------------------- scale-out

/// Groups in the shared-prefix workload that a replica sees, expected: with `r` replicas
/// taking requests round-robin, a group's `k` requests reach about `r(1 - (1 - 1/r)^k)` of them,
/// and each replica that has not seen a group places it without knowing where the others did.
fn replicas_per_group(r: f64, k: f64) -> f64 {
    r * (1.0 - (1.0 - 1.0 / r).powf(k))
}

fn scaleout_bench(quick: bool) -> Part {
    println!("scale-out: one vs two Envoy replicas, each with its own filter, same pods");
    let per_group = if quick { 8 } else { 16 };
    let mut rng = Rng::new(5);
    let requests = shared_prefix_workload(16, per_group, &mut rng);
    let gateway = Gateway::Picker("prefix-and-load.yaml");
    let mut markdown = format!(
        "## 5. Scale-out: two Envoy replicas\n\nThe routing-quality pods and shared-prefix \
         workload (16 groups x {per_group}) at 45 req/s, picker `prefix-and-load`; with two \
         replicas each Envoy (`--concurrency 2`, its own filter, its own prefix index) takes \
         every other request, as behind a round-robin L4 balancer. Both replicas scrape the \
         same pods, so load metrics agree; what they do not share is where each sent which \
         prefix.\n\n\
         | replicas | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | errors | hit rate | picks per pod | busiest pod / mean |\n\
         |---:|---:|---:|---:|---:|---:|---|---:|\n"
    );
    let mut csv = String::from(
        "replicas,ttft_p50_ms,ttft_p90_ms,ttft_p99_ms,errors,hit_rate,busiest_over_mean\n",
    );
    let mut hits = Vec::new();
    for replicas in [1usize, 2] {
        let run = quality_run_on(gateway, replicas, &QUALITY_SIM, &requests, 45.0);
        let (p50, p90, p99) = (
            percentile(&run.ttft, 50.0),
            percentile(&run.ttft, 90.0),
            percentile(&run.ttft, 99.0),
        );
        let counts: Vec<usize> = run.picks.values().copied().collect();
        let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
        let busiest = counts.iter().copied().max().unwrap_or(0) as f64 / mean.max(1e-9);
        println!(
            "  {replicas} replica(s): TTFT p90 {p90:.1} ms, hit {:.1} %, busiest/mean {busiest:.2}",
            run.hit_rate * 100.0
        );
        let picks: Vec<String> = counts.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            markdown,
            "| {replicas} | {p50:.1} | {p90:.1} | {p99:.1} | {} | {:.1} % | {} | {busiest:.2} |",
            run.errors,
            run.hit_rate * 100.0,
            picks.join(" / ")
        );
        let _ = writeln!(
            csv,
            "{replicas},{p50:.2},{p90:.2},{p99:.2},{},{:.4},{busiest:.3}",
            run.errors, run.hit_rate
        );
        hits.push(run.hit_rate);
    }
    let k = per_group as f64;
    let best = best_hit_rate(per_group);
    let ceiling = |r: f64| (k - replicas_per_group(r, k)).max(0.0) / k * best * k / (k - 1.0);
    let _ = write!(
        markdown,
        "\nWhat to expect with more replicas. Load spreading scales: every replica reads the \
         same pod metrics, and the pods' own queues and KV usage steer all of them; the cost is \
         herding between scrapes (each replica counts only its own requests in flight), bounded \
         by requests per replica per `refreshMetricsInterval`. Prefix affinity does not scale \
         the same way: each replica learns prefixes only from its own picks, so a group whose \
         requests reach `m` replicas can be prefilled cold up to `m` times and cached on up to \
         `m` pods. With round-robin in front, `m = r(1 - (1 - 1/r)^k)` for `k` requests per \
         group: here `k = {per_group}`, so `m` = {:.1} at 2 replicas, {:.1} at 10 and {:.1} at \
         100, and the hit-rate ceiling falls from {:.1} % (1 replica) to {:.1} %, {:.1} % and \
         {:.1} %. Measured above: {:.1} % with one replica, {:.1} % with two. At 10 or 100 \
         replicas, keep prefix affinity by sending a conversation or tenant to the same replica \
         (hash on a session or tenant header at the balancer in front: `k` per replica goes \
         back up) or run fewer, larger Envoys (`--concurrency`: the workers of one Envoy do \
         share their index).\n",
        replicas_per_group(2.0, k),
        replicas_per_group(10.0, k),
        replicas_per_group(100.0, k),
        ceiling(1.0) * 100.0,
        ceiling(2.0) * 100.0,
        ceiling(10.0) * 100.0,
        ceiling(100.0) * 100.0,
        hits.first().copied().unwrap_or(f64::NAN) * 100.0,
        hits.get(1).copied().unwrap_or(f64::NAN) * 100.0,
    );
    Part {
        markdown,
        csv,
        svg: None,
    }
}

// ---------------------------------------------------------------- memory

/// Many simulated pods in one process (`model-server-sim --listeners N`).
struct SimPool {
    child: std::process::Child,
    addresses: Vec<String>,
}

impl SimPool {
    fn start(count: usize) -> SimPool {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(support::sim_binary())
            .args(["--port", "0", "--name", "pod", "--time-scale", "0"])
            .args(["--listeners", &count.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start model-server-sim");
        let stdout = child.stdout.take().expect("sim stdout");
        let addresses = std::io::BufReader::new(stdout)
            .lines()
            .take(count)
            .map(|line| {
                line.expect("sim address line")
                    .trim()
                    .strip_prefix("listening on ")
                    .expect("sim address line")
                    .to_string()
            })
            .collect();
        SimPool { child, addresses }
    }
}

impl Drop for SimPool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prefix blocks each pod may hold in the picker's index for this run: small enough to fill
/// at 1,024 endpoints in seconds; the default (31,250) is extrapolated from the same figures.
const MEMORY_INDEX_CAPACITY: usize = 256;
/// Characters per prompt: 125 blocks of 64 characters (16 tokens of 4 characters).
const MEMORY_PROMPT_CHARS: usize = 8000;
/// Each phase sends enough distinct prompts to fill every pod's share of the index twice.
const MEMORY_PHASES: usize = 5;

fn memory_config(capacity: usize) -> String {
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters: {{blockSizeTokens: 16, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: {capacity}, autoTune: false}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
  - {{pluginRef: max-score-picker}}
pool:
  metricsCluster: original_destination_cluster
  refreshMetricsInterval: 1s
  metricsStalenessThreshold: 5s
  endpoints: []
"
    )
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A gauge or counter of the filter, from Envoy's admin page.
fn filter_stat(envoy: &Envoy, name: &str) -> f64 {
    envoy
        .admin_get(&format!("/stats?filter=inference_picker.{name}$"))
        .text()
        .lines()
        .find_map(|l| l.split_once(": ").map(|(_, v)| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

struct MemoryRow {
    endpoints: usize,
    requests: usize,
    /// Idle, then after each phase.
    rss: Vec<f64>,
    vm_total: Vec<f64>,
    vms: f64,
    errors: usize,
}

fn memory_row(endpoints: usize) -> MemoryRow {
    let pods = SimPool::start(endpoints);
    let addresses: Vec<&str> = pods.addresses.iter().map(String::as_str).collect();
    let envoy = Envoy::start(
        &support::with_addresses(&memory_config(MEMORY_INDEX_CAPACITY), &addresses),
        2,
    );
    // Two scrape rounds, so every endpoint has metrics and stats.
    std::thread::sleep(Duration::from_millis(2500));
    let snapshot = |envoy: &Envoy| {
        std::thread::sleep(Duration::from_millis(1200));
        (
            rss_mib(envoy.pid()),
            filter_stat(envoy, "vm_memory_bytes") / 1048576.0,
        )
    };
    let (mut rss, mut vm_total) = (Vec::new(), Vec::new());
    let (r, v) = snapshot(&envoy);
    rss.push(r);
    vm_total.push(v);
    // Enough distinct prompts to fill every pod's share of the index, twice over.
    let blocks_per_prompt = MEMORY_PROMPT_CHARS / 64;
    let per_phase = (endpoints * MEMORY_INDEX_CAPACITY).div_ceil(blocks_per_prompt) * 2;
    let filler = "lorem ipsum dolor sit amet ".repeat(MEMORY_PROMPT_CHARS / 27 + 1);
    let bodies: Vec<String> = (0..per_phase * MEMORY_PHASES)
        .map(|n| {
            let prompt = format!("{n:09} {filler}");
            let prompt = &prompt[..MEMORY_PROMPT_CHARS];
            format!(r#"{{"model":"{MODEL}","prompt":"{prompt}","max_tokens":1}}"#)
        })
        .collect();
    let mut errors = 0;
    let mut phase = |range: std::ops::Range<usize>| {
        let start = range.start;
        let results = closed_loop_over(&envoy.address(), 8, range.len(), &|n| {
            bodies[start + n].as_str()
        });
        errors += range.len() - results.iter().filter(|e| e.status == 200).count();
    };
    for k in 0..MEMORY_PHASES {
        phase(per_phase * k..per_phase * (k + 1));
        let (r, v) = snapshot(&envoy);
        rss.push(r);
        vm_total.push(v);
    }
    MemoryRow {
        endpoints,
        requests: per_phase * MEMORY_PHASES,
        rss,
        vm_total,
        vms: filter_stat(&envoy, "vms"),
        errors,
    }
}

fn memory_bench(quick: bool) -> Part {
    println!("memory: Envoy RSS and wasm VM memory with 8 / 256 / 1,024 endpoints");
    let sizes: &[usize] = if quick { &[8, 256] } else { &[8, 256, 1024] };
    let mut markdown = format!(
        "## 4. Memory\n\nEnvoy `--concurrency 2` with the filter (queue, KV and prefix scorers), \
         N simulated pods (one process, `--listeners N`), scraped every second. The prefix index \
         holds at most {MEMORY_INDEX_CAPACITY} blocks per pod in this run (`lruCapacityPerServer`); \
         each request carries a distinct {MEMORY_PROMPT_CHARS}-character prompt ({} blocks), and \
         each of {MEMORY_PHASES} phases sends enough of them to fill every pod's share twice \
         (picks are spread at random among equals, so some pods fill only in phase 2). VM \
         memory is the filter's `vm_memory_bytes` gauge (the linear memory of every VM of the \
         plugin, summed; wasm memory grows and never shrinks, so it is a high-water mark); per \
         VM divides by the VMs that route (the workers; the main thread's VM stays idle). If the \
         index were unbounded, the last phase would add as much as the first.\n\n\
         | endpoints | requests | Envoy RSS MiB: idle, after each phase | VM memory MiB (all VMs): idle, after each phase | VMs | per routing VM MiB at the end | errors |\n\
         |---:|---:|---|---|---:|---:|---:|\n",
        MEMORY_PROMPT_CHARS / 64
    );
    let mut csv = String::from(
        "endpoints,requests,rss_mib_idle_then_per_phase,vm_mib_idle_then_per_phase,vms,errors\n",
    );
    let mut rows = Vec::new();
    for &endpoints in sizes {
        let row = memory_row(endpoints);
        println!(
            "  {:>5} endpoints: RSS {:.0?} MiB; VM memory {:.1?} MiB over {} VMs",
            row.endpoints, row.rss, row.vm_total, row.vms
        );
        let _ = writeln!(
            markdown,
            "| {} | {} | {} | {} | {} | {:.1} | {} |",
            row.endpoints,
            row.requests,
            joined(&row.rss, 0, " / "),
            joined(&row.vm_total, 1, " / "),
            row.vms,
            row.vm_total.last().copied().unwrap_or(f64::NAN) / (row.vms - 1.0).max(1.0),
            row.errors
        );
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{}",
            row.endpoints,
            row.requests,
            joined(&row.rss, 1, " "),
            joined(&row.vm_total, 2, " "),
            row.vms,
            row.errors
        );
        rows.push(row);
    }
    markdown.push('\n');
    markdown.push_str(&memory_findings(&rows));
    Part {
        markdown,
        csv,
        svg: None,
    }
}

fn joined(values: &[f64], decimals: usize, separator: &str) -> String {
    let texts: Vec<String> = values.iter().map(|v| format!("{v:.decimals$}")).collect();
    texts.join(separator)
}

/// Bounded index: the last phase adds at most a tenth of what the first added. Cost per block from the
/// largest pool, extrapolated to GIE's default capacity.
fn memory_findings(rows: &[MemoryRow]) -> String {
    let mut out = String::new();
    let bounded: Vec<String> = rows
        .iter()
        .map(|r| {
            let growth: Vec<f64> = r.vm_total.windows(2).map(|w| w[1] - w[0]).collect();
            format!(
                "{} endpoints, growth per phase: {} MiB",
                r.endpoints,
                joined(&growth, 1, ", ")
            )
        })
        .collect();
    let met = rows.iter().all(|r| {
        let growth: Vec<f64> = r.vm_total.windows(2).map(|w| w[1] - w[0]).collect();
        match (growth.first(), growth.last()) {
            (Some(first), Some(last)) => *last <= (first * 0.1).max(0.5),
            _ => false,
        }
    });
    out.push_str(&goal(
        "the prefix index stays within its configured capacity (the last phase adds under a tenth of the first)",
        Some(met),
        &bounded.join("; "),
    ));
    if let Some(largest) = rows.last() {
        let blocks = (largest.endpoints * MEMORY_INDEX_CAPACITY) as f64;
        // Only the workers' VMs route and hold an index; the main thread's stays idle.
        let grown = largest.vm_total.last().copied().unwrap_or(f64::NAN)
            - largest.vm_total.first().copied().unwrap_or(f64::NAN);
        let per_vm_growth = grown / (largest.vms - 1.0).max(1.0);
        let bytes_per_block = per_vm_growth * 1048576.0 / blocks;
        let _ = write!(
            out,
            "\nAt {} endpoints a full index of {:.0} blocks grew each VM by {:.1} MiB: about \
             {:.0} bytes per block (wasm memory grows in pages and hash tables double, so this \
             is an upper figure). With GIE's default `lruCapacityPerServer: 31250`, a full index \
             would take about {:.0} MiB per VM at 8 endpoints and {:.0} MiB at 256: size \
             `lruCapacityPerServer` to the pods' real KV capacity (`autoTune: true` reads it from \
             their metrics) rather than leaving the default on large pools.\n",
            largest.endpoints,
            blocks,
            per_vm_growth,
            bytes_per_block,
            bytes_per_block * 8.0 * 31250.0 / 1048576.0,
            bytes_per_block * 256.0 * 31250.0 / 1048576.0,
        );
    }
    out
}

// ---------------------------------------------------------------- charts

/// A grouped bar chart: one group per `(label, values)`, one bar per series.
fn bar_chart(title: &str, series: &[&str], groups: &[(String, Vec<f64>)]) -> String {
    const COLORS: [&str; 6] = [
        "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
    ];
    let (width, height, left, bottom, top) = (900.0, 420.0, 60.0, 60.0, 40.0);
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let plot_w = width - left - 20.0;
    let plot_h = height - bottom - top;
    let group_w = plot_w / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{left}\" y=\"24\" font-size=\"15\">{title}</text>\n",
        height + 20.0 * series.len() as f64
    );
    for k in 0..=4 {
        let value = max * k as f64 / 4.0;
        let y = top + plot_h - plot_h * k as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value:.1}</text>",
            left + plot_w,
            left - 6.0,
            y + 4.0
        );
    }
    for (g, (label, values)) in groups.iter().enumerate() {
        let x0 = left + group_w * g as f64 + group_w * 0.1;
        for (s, value) in values.iter().enumerate() {
            let h = if value.is_finite() {
                plot_h * value / max
            } else {
                0.0
            };
            let _ = writeln!(
                svg,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{}: {value:.2}</title></rect>",
                x0 + bar_w * s as f64,
                top + plot_h - h,
                bar_w * 0.95,
                COLORS[s % COLORS.len()],
                series.get(s).unwrap_or(&"")
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            x0 + group_w * 0.4,
            top + plot_h + 18.0
        );
    }
    for (s, name) in series.iter().enumerate() {
        let y = height - 10.0 + 20.0 * s as f64;
        let _ = writeln!(
            svg,
            "<rect x=\"{left}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{y:.1}\">{name}</text>",
            y - 10.0,
            COLORS[s % COLORS.len()],
            left + 18.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}
