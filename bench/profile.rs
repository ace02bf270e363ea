//! Part 8, one request's cost, step by step: Envoy's CPU per request as the picker's work is
//! added one stage at a time, the host calls a request makes by kind, and where Envoy's CPU
//! goes (`perf`) with the filter on.

use crate::hop::{added_latency_goal, module_added_latency_goal};
use crate::load::{all_of, closed_loop, percentile, sorted};
use crate::procfs::cpu_seconds;
use crate::report::{csv_table, goal, markdown_table, Cell, Column, Part, Row};
use crate::setup::{ext_proc_envoy, filter_stat, plain_envoy, ExtProcPicker};
use crate::support::{
    repo, shipped_picker_config, static_cluster, with_endpoints, Edge, Envoy, EnvoyConfig, Sim,
};
use crate::workloads::padded_completion;
use inference_picker_core::datalayer::IDLE_AFTER_MS;
use inference_picker_core::host::HostCall;
use inference_picker_core::stats::GAUGE_PERIOD_MS;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INTRO: &str = "## 8. One request's cost, step by step\n\n\
     Envoy's CPU per request and the latency a request sees, as the picker's work is added one \
     step at a time. Two near-instant simulated pods; every gateway is Envoy `--concurrency 2`; \
     closed loop, one client over a keep-alive connection, `max_tokens: 1`; the gateways take \
     turns in eight rounds per body size. Rows (t1)-(f) run a stage filter \
     (`bench/profile-filter`): (t1) a 50 ms tick that does nothing and (t2) one that fetches \
     both pods' `/metrics` in every VM (the timer side alone, requests untouched); then one \
     step of the picker's request work at a time: (b) callbacks only, nothing paused, the \
     module with every export the proxy-wasm SDK makes, and (b2) with only the picker's (as \
     `make build` leaves the picker; the stage rows after it run that build too); (c) the \
     headers held until the body's end, as the picker does (Envoy buffers the body); (d) the \
     body copied into the VM; (e) parsed with the picker's own parser; (f) a header written. \
     (g)-(j) are the picker on a plain round-robin cluster (its header written, Envoy balancing \
     on its own): (g) a random pick, (h) the shipped scorers but the prefix one, (i) the \
     shipped plugins, (j) those scraping every second instead of every 50 ms. (k) adds the \
     shipped `override_host` cluster that follows the picker's header, (l) is the shipped \
     `envoy/envoy.yaml` (with its `header_to_metadata` step), (m) \
     `envoy/envoy-original-dst.yaml` (an ORIGINAL_DST cluster instead), (n) the same picker \
     as a native dynamic module, `envoy/envoy-module.yaml` (no `header_to_metadata` step: the \
     module writes `envoy.lb` itself). CPU = Envoy's \
     user+system seconds per 1,000 requests (every thread's schedstat); `x alone` divides it \
     by (a)'s; `±` is that CPU figure's standard error over the rounds (the rounds' standard \
     deviation over the square root of their number): differences between rows within their \
     `±` are this run's noise, not the step's cost.\n\n";

const MICRO: &str = "The picker's own work per request, with no host in the way: the same \
     code built as a plain wasm module (`bench/wasm-micro`: the shipped configuration over two \
     pods with fresh metrics, an in-memory host answering what Envoy would) and timed in \
     Node's V8, the engine Envoy embeds, and natively. Each request step includes the one \
     above it. What an Envoy row above costs beyond these is the host's: crossings into and \
     out of the VM, copies, Envoy's own work for the stream.\n\n";

/// Before the streamed table.
fn streamed_intro() -> String {
    format!(
        "Streamed responses: Envoy's CPU per response of {STREAM_TOKENS} tokens, each sent as \
         its own chunk (the pods decode a token every {STREAM_DECODE_MS} ms), closed loop, one \
         client, {STREAM_ROUNDS} interleaved rounds. Envoy calls into a VM for every response \
         chunk if the module exports `proxy_on_response_body`, as every proxy-wasm SDK module \
         does; `make build` drops that export and the other callbacks the picker never handles \
         (`tools/wasm-exports`). (b) and (b2) are the same stage filter with every export and \
         with the picker's.\n\n"
    )
}

const IDLE: &str =
    "Envoy's CPU with no request in flight (3 s per gateway, 1 s quick): the timer side, \
     which the per-request figures above also carry; first right after one request (the pool \
     in use), then once the pool counts as idle (no request for 10 s: the picker then scrapes each pod every \
     `pool.idleRefreshMetricsInterval`, 1 s by default, until the next request). (t1) and (t2) are the stage filter \
     ticking every 50 ms with nothing to do, and fetching both pods' `/metrics` on every tick \
     in every VM (the body copied in, not parsed); the picker fetches them from one VM. (x) \
     is the central design between requests: an Envoy with `ext_proc` in the filter's place \
     and the picker process it calls (part 2's, scraping the same pods at the shipped \
     interval), both processes' CPU. Per pod: the same over the pods scraped.\n\n";

const ROUNDS: usize = 8;
/// The shipped Envoy config; the dynamic module's row runs it with the module's filter swapped
/// in, which is `envoy/envoy-module.yaml` (tests/envoy_module.rs holds the two to it).
const SHIPPED: &str = "envoy/envoy.yaml";
const LARGE_BODY: usize = 220 * 1024;

/// A gateway of the profile: what it adds, and how to start it.
struct Step {
    name: &'static str,
    envoy: Envoy,
}

struct StepRow {
    step: &'static str,
    body_bytes: usize,
    p50_ms: f64,
    added_p50_us: f64,
    cpu_per_1000: f64,
    /// The standard error of `cpu_per_1000` over the rounds.
    cpu_se: f64,
    cpu_ratio: f64,
    errors: usize,
}

impl Row for StepRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("step", "step"),
        Column::both("body", "body_bytes"),
        Column::both("p50 ms", "p50_ms"),
        Column::both("p50 vs (a) µs", "added_p50_us"),
        Column::both("CPU s / 1k req", "cpu_s_per_1k"),
        Column::both("±", "cpu_se_s_per_1k"),
        Column::both("x alone", "cpu_ratio"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.step.to_string()),
            Cell::Kilobytes(self.body_bytes),
            Cell::Measure(self.p50_ms, 3),
            Cell::Fixed(self.added_p50_us, 0),
            Cell::Measure(self.cpu_per_1000, 3),
            Cell::Measure(self.cpu_se, 3),
            Cell::Fixed(self.cpu_ratio, 2),
            Cell::Count(self.errors),
        ]
    }
}

/// The stage filter as built (every callback the SDK has exported), or with only the
/// exports the shipped picker keeps (`make profile-filter` writes both).
#[derive(Clone, Copy, PartialEq)]
enum Exports {
    EverySdkCallback,
    ThePickers,
}

fn stage_wasm(exports: Exports) -> PathBuf {
    let file = match exports {
        Exports::EverySdkCallback => "profile_filter.wasm",
        Exports::ThePickers => "profile_filter_lean.wasm",
    };
    let path = repo()
        .join("target/profile-filter/wasm32-wasip1/release")
        .join(file);
    assert!(
        path.exists(),
        "{} is missing: run `make bench-profile`",
        path.display()
    );
    path
}

/// Envoy routing round robin to the pods (as `plain_envoy`) through the stage filter stopping
/// at `stage`.
fn stage_envoy(sims: &[&Sim], stage: &str, exports: Exports) -> Envoy {
    let picker = with_endpoints(&shipped_picker_config(), sims);
    round_robin_envoy(sims, &picker, Some((stage_wasm(exports), stage)))
}

/// The picker deciding as shipped, but Envoy balancing round robin over a plain cluster (the
/// destination header is written and ignored): the picker's own cost without the
/// override_host policy's.
fn picker_round_robin(sims: &[&Sim], picker: &str) -> Envoy {
    round_robin_envoy(sims, picker, None)
}

/// The shipped Envoy with only the wasm filter and the router, routing round robin over the
/// pods (the metrics cluster kept for scrapes); `stage` swaps the picker for the stage
/// filter with that configuration.
fn round_robin_envoy(sims: &[&Sim], picker: &str, stage: Option<(PathBuf, &str)>) -> Envoy {
    let mut cluster = static_cluster("pool", &addresses(sims));
    cluster["lb_policy"] = "ROUND_ROBIN".into();
    Envoy::start_with(picker, 2, move |config| {
        let mut listener = config.listener_mut(0);
        listener.http_filters_mut().retain(|f| {
            f["name"] == "envoy.filters.http.wasm" || f["name"] == "envoy.filters.http.router"
        });
        if let Some((wasm, stage)) = &stage {
            listener.set_wasm_file(wasm);
            listener.set_picker_config(stage);
        }
        listener.http_connection_manager_mut()["route_config"]["virtual_hosts"][0]["routes"][0]
            ["route"]["cluster"] = "pool".into();
        let metrics = config
            .clusters_mut()
            .iter()
            .find(|c| c["name"] == "inference_picker_metrics")
            .cloned();
        *config.clusters_mut() = vec![cluster.clone()];
        config.clusters_mut().extend(metrics);
    })
}

type Start<'a> = Box<dyn Fn() -> Envoy + 'a>;

/// The profile's gateways, in order, each started only if `chosen` keeps it.
fn steps(sims: &[&Sim], chosen: impl Fn(&str) -> bool) -> Vec<Step> {
    let picker = with_endpoints(&shipped_picker_config(), sims);
    let without_metadata = |config: &mut EnvoyConfig| {
        config
            .http_filters_mut()
            .retain(|f| f["name"] != "envoy.filters.http.header_to_metadata");
    };
    let original_dst = crate::support::picker_config_of("envoy/envoy-original-dst.yaml");
    let original_dst = with_endpoints(&original_dst, sims);
    let scrapes = format!("scrapes {}", addresses(sims).join(","));
    let stage = |config: &'static str| -> Start {
        Box::new(move || stage_envoy(sims, config, Exports::ThePickers))
    };
    let variant = |variant: Variant| -> Start {
        let config = picker_variant(&picker, variant);
        Box::new(move || picker_round_robin(sims, &config))
    };
    let all: Vec<(&'static str, Start)> = vec![
        (
            "(a) Envoy alone",
            Box::new(|| plain_envoy(sims, "ROUND_ROBIN")),
        ),
        ("(t1) + a 50 ms tick, idle", stage("ticks")),
        (
            "(t2) + 50 ms scrapes of both pods",
            Box::new(|| stage_envoy(sims, &scrapes, Exports::ThePickers)),
        ),
        (
            "(b) + filter callbacks, every SDK export",
            Box::new(|| stage_envoy(sims, "pass", Exports::EverySdkCallback)),
        ),
        (
            "(b2) + filter callbacks, the picker's exports",
            stage("pass"),
        ),
        ("(c) + held until the body", stage("pause")),
        ("(d) + body copied in", stage("read")),
        ("(e) + parsed", stage("parse")),
        ("(f) + a header written", stage("write")),
        ("(g) picker, a random pick", variant(Variant::RandomPick)),
        (
            "(h) picker, no prefix scorer",
            variant(Variant::NoPrefixScorer),
        ),
        ("(i) picker, shipped plugins", variant(Variant::Shipped)),
        ("(j) picker, 1 s scrapes", variant(Variant::SlowScrapes)),
        (
            "(k) picker + override_host",
            Box::new(|| Envoy::start_with(&picker, 2, without_metadata)),
        ),
        (
            "(l) picker, shipped Envoy",
            Box::new(|| Envoy::start_on(Edge::Wasm, SHIPPED, &picker, 2, |_| {})),
        ),
        (
            "(m) picker, ORIGINAL_DST",
            Box::new(|| {
                Envoy::start_from("envoy/envoy-original-dst.yaml", &original_dst, 2, |_| {})
            }),
        ),
        (
            "(n) picker as a dynamic module",
            Box::new(|| Envoy::start_on(Edge::Module, SHIPPED, &picker, 2, |_| {})),
        ),
    ];
    all.into_iter()
        .filter(|(name, _)| chosen(name))
        .map(|(name, start)| Step {
            name,
            envoy: start(),
        })
        .collect()
}

/// The picker's configurations behind the round-robin rows.
#[derive(Clone, Copy)]
enum Variant {
    /// A random pick among the pods: parsing and the request flow, no scorer.
    RandomPick,
    /// The shipped scorers but the prefix-cache one (no prompt hashing, no index).
    NoPrefixScorer,
    Shipped,
    /// The shipped plugins, scraping every second instead of every 50 ms.
    SlowScrapes,
}

fn picker_variant(picker: &str, variant: Variant) -> String {
    let mut config: serde_yaml::Value = serde_yaml::from_str(picker).expect("picker config");
    let (plugins, profile) = match variant {
        Variant::Shipped => return picker.to_owned(),
        Variant::SlowScrapes => {
            config["pool"]["refreshMetricsInterval"] = "1s".into();
            config["pool"]["metricsStalenessThreshold"] = "5s".into();
            return serde_yaml::to_string(&config).expect("yaml");
        }
        Variant::RandomPick => (
            "[{type: random-picker, parameters: {maxNumOfEndpoints: 3}}, \
             {type: single-profile-handler}]",
            "[{name: default, plugins: [{pluginRef: random-picker}]}]",
        ),
        Variant::NoPrefixScorer => (
            "[{type: queue-scorer}, {type: kv-cache-utilization-scorer}, \
             {type: lora-affinity-scorer}, \
             {type: max-score-picker, parameters: {maxNumOfEndpoints: 3}}, \
             {type: single-profile-handler}]",
            "[{name: default, plugins: [{pluginRef: queue-scorer, weight: 2}, \
             {pluginRef: kv-cache-utilization-scorer, weight: 2}, \
             {pluginRef: lora-affinity-scorer, weight: 1}, {pluginRef: max-score-picker}]}]",
        ),
    };
    config["plugins"] = serde_yaml::from_str(plugins).expect("plugins");
    config["schedulingProfiles"] = serde_yaml::from_str(profile).expect("profiles");
    serde_yaml::to_string(&config).expect("yaml")
}

#[derive(Default, Clone)]
struct Tally {
    latencies_ms: Vec<f64>,
    cpu: f64,
    sent: usize,
    /// Each round's CPU seconds per 1,000 requests.
    rounds_cpu_per_1000: Vec<f64>,
}

/// The standard error of the mean of `values`: their sample standard deviation over the
/// square root of their number; NaN for fewer than two.
fn standard_error(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    if values.len() < 2 {
        return f64::NAN;
    }
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (variance / n).sqrt()
}

/// Envoy's CPU per second with no request in flight: the filter's ticks (scrapes, shared
/// state, stats), which every request's CPU figure above also carries; then the central
/// design between requests: Envoy with `ext_proc` and the picker process, both counted. Each
/// row twice: between requests (one request just before), and once the pool counts as idle
/// (no request for [`IDLE_AFTER_MS`]).
fn idle_cpu_ms_per_s(steps: &[Step], sims: &[&Sim], quick: bool) -> String {
    let window = Duration::from_secs(if quick { 1 } else { 3 });
    let pods = sims.len().max(1) as f64;
    let measure = |pids: &[u32]| {
        let used = || pids.iter().map(|&pid| cpu_seconds(pid)).sum::<f64>();
        let before = used();
        std::thread::sleep(window);
        (used() - before) * 1000.0 / window.as_secs_f64()
    };
    let picker = ExtProcPicker::start(&with_endpoints(&shipped_picker_config(), sims));
    let envoy = ext_proc_envoy(sims, &picker, 2);
    for sim in sims {
        // Scraped by the picker process, as it scrapes in every row of part 2.
        sim.wait_for_scrapes(6);
    }
    let mut rows: Vec<(&str, String, Vec<u32>)> = steps
        .iter()
        .map(|step| (step.name, step.envoy.address(), vec![step.envoy.pid()]))
        .collect();
    rows.push((
        EXT_PROC_IDLE,
        envoy.address(),
        vec![envoy.pid(), picker.pid()],
    ));
    // Between requests: one request just before, so the pool counts as in use.
    let request = padded_completion(1024);
    let between: Vec<f64> = rows
        .iter()
        .map(|(_, address, pids)| {
            let _ = closed_loop(address, 1, 1, &request);
            measure(pids)
        })
        .collect();
    // The last request went before the first row above was measured.
    std::thread::sleep(Duration::from_millis(IDLE_AFTER_MS + 1000));
    let mut table = String::from(
        "| gateway | CPU ms per second between requests | per pod | CPU ms per second idle (no request for 10 s) | per pod |\n|---|---:|---:|---:|---:|\n",
    );
    for ((name, _, pids), between) in rows.iter().zip(between) {
        let idle = measure(pids);
        println!("  {name:<36} CPU {between:.1} ms/s between requests, {idle:.1} idle");
        table.push_str(&format!(
            "| {name} | {between:.1} | {:.2} | {idle:.1} | {:.2} |\n",
            between / pods,
            idle / pods
        ));
    }
    table
}

/// The central design's row of the idle table.
const EXT_PROC_IDLE: &str = "(x) Envoy + the ext_proc picker (both processes)";

fn measure(steps: &[Step], body_bytes: usize, quick: bool) -> Vec<StepRow> {
    let body = padded_completion(body_bytes);
    // Enough requests per gateway that a step of ~0.01 s per 1,000 stands out of the spread.
    let count = match (body_bytes >= LARGE_BODY, quick) {
        (false, false) => 4800,
        (false, true) => 400,
        (true, false) => 960,
        (true, true) => 100,
    };
    for step in steps {
        let _ = closed_loop(&step.envoy.address(), 1, 20, &body);
    }
    let mut tallies = vec![Tally::default(); steps.len()];
    for _ in 0..ROUNDS {
        for (tally, step) in tallies.iter_mut().zip(steps) {
            let before = cpu_seconds(step.envoy.pid());
            let results = closed_loop(&step.envoy.address(), 1, count / ROUNDS, &body);
            let cpu = cpu_seconds(step.envoy.pid()) - before;
            tally.cpu += cpu;
            tally.sent += count / ROUNDS;
            tally
                .rounds_cpu_per_1000
                .push(cpu * 1000.0 / (count / ROUNDS).max(1) as f64);
            tally.latencies_ms.extend(
                results
                    .iter()
                    .filter(|e| e.status == 200)
                    .map(|e| e.total.as_secs_f64() * 1000.0),
            );
        }
    }
    let per_1000 = |tally: &Tally| tally.cpu * 1000.0 / tally.sent.max(1) as f64;
    // Every row is against Envoy alone, (a); without it (BENCH_STEPS) there is no baseline.
    let base = steps
        .iter()
        .position(|step| step.name.starts_with("(a)"))
        .map(|a| &tallies[a]);
    let base_p50 = base.map_or(f64::NAN, |a| {
        percentile(&sorted(a.latencies_ms.clone()), 50.0)
    });
    let base_cpu = base.map_or(f64::NAN, per_1000);
    steps
        .iter()
        .zip(tallies)
        .map(|(step, tally)| {
            let cpu = per_1000(&tally);
            let latencies = sorted(tally.latencies_ms);
            let p50_ms = percentile(&latencies, 50.0);
            let row = StepRow {
                step: step.name,
                body_bytes,
                p50_ms,
                added_p50_us: (p50_ms - base_p50) * 1000.0,
                cpu_per_1000: cpu,
                cpu_se: standard_error(&tally.rounds_cpu_per_1000),
                cpu_ratio: cpu / base_cpu,
                errors: tally.sent - latencies.len(),
            };
            println!(
                "  {:<30} {:>4} KB p50 {:.3} ms ({:+.0} µs) CPU {:.3} s/1k ({:.2}x)",
                row.step,
                body_bytes / 1024,
                row.p50_ms,
                row.added_p50_us,
                row.cpu_per_1000,
                row.cpu_ratio
            );
            row
        })
        .collect()
}

/// Tokens each streamed response carries, the pods' decode step for them (ms per token), and
/// the rounds the gateways take turns in.
const STREAM_TOKENS: usize = 64;
const STREAM_DECODE_MS: &str = "0.2";
const STREAM_ROUNDS: usize = 4;

struct StreamRow {
    gateway: &'static str,
    cpu_per_1000: f64,
    cpu_ratio: f64,
    errors: usize,
}

impl Row for StreamRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("gateway", "gateway"),
        Column::both("CPU s / 1k streamed responses", "cpu_s_per_1k"),
        Column::both("x alone", "cpu_ratio"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.gateway.to_string()),
            Cell::Measure(self.cpu_per_1000, 3),
            Cell::Fixed(self.cpu_ratio, 2),
            Cell::Count(self.errors),
        ]
    }
}

/// Envoy's CPU per streamed response of [`STREAM_TOKENS`] tokens, each its own chunk (pods
/// that decode a token every 0.2 ms): every chunk is a callback into a VM that exports
/// `proxy_on_response_body`, which the shipped build does not.
fn streamed(quick: bool) -> Vec<StreamRow> {
    let paced = [
        "--time-scale",
        "1",
        "--decode-ms-per-token",
        STREAM_DECODE_MS,
        "--prefill-us-per-token",
        "0",
    ];
    let sims: Vec<Sim> = (1..=2)
        .map(|i| Sim::start(&format!("stream-{i}"), &paced))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let picker = with_endpoints(&shipped_picker_config(), &refs);
    let gateways: [(&'static str, Envoy); 4] = [
        ("(a) Envoy alone", plain_envoy(&refs, "ROUND_ROBIN")),
        (
            "(b) + filter callbacks, every SDK export",
            stage_envoy(&refs, "pass", Exports::EverySdkCallback),
        ),
        (
            "(b2) + filter callbacks, the picker's exports",
            stage_envoy(&refs, "pass", Exports::ThePickers),
        ),
        ("(l) picker, shipped Envoy", Envoy::start(&picker, 2)),
    ];
    for sim in &refs {
        sim.wait_for_scrapes(6);
    }
    let body = format!(
        r#"{{"model":"{}","prompt":"hello","max_tokens":{STREAM_TOKENS},"stream":true}}"#,
        crate::support::MODEL
    );
    let count = if quick { 80 } else { 1200 };
    let rounds = STREAM_ROUNDS;
    // Per gateway: CPU seconds and responses that came back whole.
    let mut tallies = vec![(0.0, 0); gateways.len()];
    for _ in 0..rounds {
        for ((cpu, ok), (_, envoy)) in tallies.iter_mut().zip(&gateways) {
            let before = cpu_seconds(envoy.pid());
            let results = closed_loop(&envoy.address(), 1, count / rounds, &body);
            *cpu += cpu_seconds(envoy.pid()) - before;
            *ok += results.iter().filter(|e| e.status == 200).count();
        }
    }
    let sent = count / rounds * rounds;
    let per_1000 = |cpu: f64| cpu * 1000.0 / sent as f64;
    let alone = per_1000(tallies[0].0);
    gateways
        .iter()
        .zip(&tallies)
        .map(|((gateway, _), &(cpu, ok))| {
            let row = StreamRow {
                gateway,
                cpu_per_1000: per_1000(cpu),
                cpu_ratio: per_1000(cpu) / alone,
                errors: sent - ok,
            };
            println!(
                "  streamed: {gateway:<46} CPU {:.3} s/1k ({:.2}x)",
                row.cpu_per_1000, row.cpu_ratio
            );
            row
        })
        .collect()
}

/// Host calls per request by kind, through the picker (the filter's own `host_calls`
/// counters over `count` requests, less what its ticks make meanwhile).
fn host_calls_per_request(envoy: &Envoy, count: usize) -> (String, f64) {
    let read = || -> Vec<f64> {
        HostCall::ALL
            .iter()
            .map(|call| filter_stat(envoy, &format!("host_calls.{}", call.name())))
            .map(|v| if v.is_nan() { 0.0 } else { v })
            .collect()
    };
    // Every VM reports its counters on the first tick of each clock second: a reading taken
    // just after the counters moved, and a tick later (the other VMs' reports of that second),
    // covers whole seconds for all of them.
    let after_report = |last: &[f64]| -> (Vec<f64>, Instant) {
        let deadline = Instant::now() + Duration::from_millis(3 * GAUGE_PERIOD_MS);
        while read().as_slice() == last && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let reported = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        (read(), reported)
    };
    let (idle_before, idle_from) = after_report(&read());
    std::thread::sleep(Duration::from_millis(2 * GAUGE_PERIOD_MS));
    let (idle_after, idle_to) = after_report(&read());
    let body = padded_completion(1024);
    let _ = closed_loop(&envoy.address(), 1, count, &body);
    // Every VM has reported since the loop ended, then the next report.
    std::thread::sleep(Duration::from_millis(GAUGE_PERIOD_MS + 200));
    let (after, reported) = after_report(&read());
    let idle_seconds = (idle_to - idle_from).as_secs_f64().max(1e-3);
    let idle_rate: Vec<f64> = idle_after
        .iter()
        .zip(&idle_before)
        .map(|(a, b)| (a - b) / idle_seconds)
        .collect();
    let busy = (reported - idle_to).as_secs_f64();
    let idle: Vec<String> = HostCall::ALL
        .iter()
        .zip(&idle_rate)
        .filter(|(_, rate)| **rate >= 0.5)
        .map(|(call, rate)| format!("{} {rate:.0}/s", call.name()))
        .collect();
    println!("  host calls while idle: {}", idle.join(", "));
    let mut total = 0.0;
    let mut rows = String::from("| host call | per request |\n|---|---:|\n");
    for ((call, after), (before, idle)) in HostCall::ALL
        .iter()
        .zip(&after)
        .zip(idle_after.iter().zip(&idle_rate))
    {
        let per_request = ((after - before - idle * busy) / count as f64).max(0.0);
        if per_request >= 0.05 {
            total += per_request;
            rows.push_str(&format!("| `{}` | {per_request:.1} |\n", call.name()));
        }
    }
    rows.push_str(&format!("| all | {total:.1} |\n"));
    println!("  host calls per request: {total:.1}");
    (rows, total)
}

/// Envoy's CPU samples by shared object while the shipped picker serves 220 KB requests:
/// V8's compiled wasm has no symbols, so it shows as anonymous memory.
fn perf_profile(envoy: &Envoy, quick: bool) -> String {
    let dir = std::env::temp_dir().join(format!("profile-perf-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let data = dir.join("perf.data");
    let seconds = if quick { 3 } else { 8 };
    let recorder = Command::new("perf")
        .args(["record", "-F", "999", "-o"])
        .arg(&data)
        .args([
            "-p",
            &envoy.pid().to_string(),
            "--",
            "sleep",
            &seconds.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut recorder) = recorder else {
        return "`perf` is not available here: no profile.\n".into();
    };
    let body = padded_completion(LARGE_BODY);
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        let _ = closed_loop(&envoy.address(), 1, 20, &body);
    }
    let _ = recorder.wait();
    let report = Command::new("perf")
        .args(["report", "--stdio", "--sort", "dso", "-i"])
        .arg(&data)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let Ok(report) = report else {
        return "`perf report` failed: no profile.\n".into();
    };
    let text = String::from_utf8_lossy(&report.stdout);
    let mut table =
        String::from("| where Envoy's CPU went (perf, by object) | share |\n|---|---:|\n");
    for line in text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .take(8)
    {
        let mut parts = line.split_whitespace();
        let (Some(share), Some(object)) = (parts.next(), parts.next()) else {
            continue;
        };
        table.push_str(&format!("| `{object}` | {share} |\n"));
    }
    table
}

struct MicroRow {
    step: &'static str,
    body_bytes: Option<usize>,
    v8_us: f64,
    native_us: f64,
}

impl Row for MicroRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("step (wasm, no host)", "step"),
        Column::both("body", "body_bytes"),
        Column::both("V8 µs", "v8_us"),
        Column::both("native µs", "native_us"),
        Column::markdown("V8 / native"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.step.to_string()),
            self.body_bytes
                .map_or(Cell::Text("-".into()), Cell::Kilobytes),
            Cell::Fixed(self.v8_us, 1),
            Cell::Fixed(self.native_us, 1),
            Cell::Fixed(self.v8_us / self.native_us, 1),
        ]
    }
}

const MICRO_STEPS: [(&str, &str); 4] = [
    ("parse", "parse the body, choose the pool"),
    ("decide", "+ prefix hashing, scoring, picking, release"),
    (
        "request",
        "+ the request flow's callbacks (headers, body, response, end)",
    ),
    (
        "tick",
        "a scraping tick: both pods' real vLLM 0.32 `/metrics` (55 KB) read",
    ),
];

/// The picker's own work per step, in Node's V8 (`bench/wasm-micro`, the engine Envoy embeds,
/// with no host call in the way) and natively: what the Envoy rows above cost beyond it is
/// the host's.
fn micro_steps() -> Vec<MicroRow> {
    let wasm = repo().join("target/wasm-micro/wasm32-unknown-unknown/release/wasm_micro.wasm");
    let sizes = [1024, LARGE_BODY];
    let output = Command::new("node")
        .arg(repo().join("bench/wasm-micro/run.js"))
        .arg(&wasm)
        .args(sizes.iter().map(|size| size.to_string()))
        .output();
    let Some(output) = output.ok().filter(|o| o.status.success()) else {
        println!("  node could not time the wasm steps (make wasm-micro?)");
        return Vec::new();
    };
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let v8_ns = |body: Option<usize>, step: &str| {
        lines
            .iter()
            .find(|line| match body {
                Some(body) => line["body"] == body,
                None => line.get("tick_ns").is_some(),
            })
            .and_then(|line| match body {
                Some(_) => line["ns"][step].as_f64(),
                None => line["tick_ns"].as_f64(),
            })
            .unwrap_or(f64::NAN)
    };
    let mut rows = Vec::new();
    for (step, name) in MICRO_STEPS {
        let bodies: Vec<Option<usize>> = if step == "tick" {
            vec![None]
        } else {
            sizes.iter().copied().map(Some).collect()
        };
        for body in bodies {
            let native_ns = native_ns(step, body);
            let row = MicroRow {
                step: name,
                body_bytes: body,
                v8_us: v8_ns(body, step) / 1000.0,
                native_us: native_ns / 1000.0,
            };
            println!(
                "  {step:<8} {:>4} KB: V8 {:.1} µs, native {:.1} µs",
                body.unwrap_or(0) / 1024,
                row.v8_us,
                row.native_us
            );
            rows.push(row);
        }
    }
    rows
}

/// Nanoseconds per call of a micro step natively: best of five batches after a warm-up.
fn native_ns(step: &str, body: Option<usize>) -> f64 {
    use crate::micro_steps as micro;
    // The batch sizes `run.js` uses.
    let batch = body.map_or(200, |bytes| (64_000_000 / bytes).clamp(20, 20_000));
    let mut run: Box<dyn FnMut(usize) -> usize> = match body {
        None => {
            let Some(mut ticks) = micro::Ticks::new() else {
                return f64::NAN;
            };
            Box::new(move |n| ticks.run(n))
        }
        Some(bytes) => {
            let (Some(mut picker), Some(index)) = (
                micro::shipped_picker(),
                micro::STEPS.iter().position(|s| *s == step),
            ) else {
                return f64::NAN;
            };
            let host = micro::BenchHost::new(&micro::padded_completion(bytes));
            Box::new(move |n| micro::run(&mut picker, &host, index, n))
        }
    };
    run(batch);
    (0..5)
        .map(|_| {
            let started = std::time::Instant::now();
            let done = run(batch);
            assert!(done > 0, "micro step {step} did nothing");
            started.elapsed().as_nanos() as f64 / batch as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Issue 17's CPU goal ("Envoy CPU per request with the filter: ≤ 1.25x Envoy alone at 1 KB,
/// ≤ 1.5x at 220 KB"): the body size and its ceiling.
const CPU_GOALS: [(usize, f64); 2] = [(1024, 1.25), (LARGE_BODY, 1.5)];
/// Issue 28's for the dynamic module ("Envoy CPU per request at most 1.15x Envoy alone at 1 KB
/// and 1.3x at 220 KB").
const MODULE_CPU_GOALS: [(usize, f64); 2] = [(1024, 1.15), (LARGE_BODY, 1.3)];

/// A row of the table by its letter and body size.
fn row_of<'r>(rows: &'r [StepRow], letter: &str, body: usize) -> Option<&'r StepRow> {
    rows.iter()
        .find(|r| r.body_bytes == body && r.step.starts_with(letter))
}

/// `value` at most `ceiling`; not measured when there is no figure (no row, or Envoy alone's
/// CPU was zero, which makes the ratio infinite or NaN).
fn at_most(value: f64, ceiling: f64) -> Option<bool> {
    value.is_finite().then_some(value <= ceiling)
}

/// Issue 17's goals, judged on the shipped picker, row (l), and issue 28's, on the dynamic
/// module, row (n), each against Envoy alone, row (a).
fn goals(rows: &[StepRow]) -> String {
    let added = |letter: &str| row_of(rows, letter, 1024).map_or(f64::NAN, |r| r.added_p50_us);
    format!(
        "{}{}{}{}",
        added_latency_goal(added("(l)"), "(l) - (a)"),
        cpu_goal(
            rows,
            "(l)",
            &CPU_GOALS,
            "Envoy CPU per request with the filter: "
        ),
        module_added_latency_goal(added("(n)"), "(n) - (a)"),
        cpu_goal(
            rows,
            "(n)",
            &MODULE_CPU_GOALS,
            "dynamic module: Envoy CPU per request at most "
        ),
    )
}

/// A CPU goal on row `letter` against (a): each body size's ratio at most its ceiling, worded
/// as its issue words it ("≤ 1.25x Envoy alone at 1 KB, ≤ 1.5x at 220 KB"; "at most 1.15x
/// Envoy alone at 1 KB and 1.3x at 220 KB").
fn cpu_goal(rows: &[StepRow], letter: &str, ceilings: &[(usize, f64)], lead: &str) -> String {
    let ratios: Vec<(usize, f64, f64)> = ceilings
        .iter()
        .map(|&(body, ceiling)| {
            let ratio = row_of(rows, letter, body).map_or(f64::NAN, |r| r.cpu_ratio);
            (body, ceiling, ratio)
        })
        .collect();
    let module = letter == "(n)";
    let wording: Vec<String> = ratios
        .iter()
        .enumerate()
        .map(|(i, (body, ceiling, _))| {
            let against = if i == 0 { " Envoy alone" } else { "" };
            let sign = if module { "" } else { "≤ " };
            format!("{sign}{ceiling}x{against} at {} KB", body / 1024)
        })
        .collect();
    let joined = if module {
        wording.join(" and ")
    } else {
        wording.join(", ")
    };
    let measured: Vec<String> = ratios
        .iter()
        .map(|(body, _, ratio)| format!("{} KB: {ratio:.2}x", body / 1024))
        .collect();
    goal(
        &format!("{lead}{joined}"),
        all_of(
            ratios
                .iter()
                .map(|&(_, ceiling, ratio)| at_most(ratio, ceiling)),
        ),
        &format!("{}, {letter} over (a)", measured.join("; ")),
    )
}

/// `value` with `decimals` and `unit`, or "not measured".
fn figure(value: f64, decimals: usize, unit: &str) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}{unit}")
    } else {
        "not measured".to_string()
    }
}

/// What this run measured that bears on the goals: the stage filter that only has callbacks,
/// the host calls the picker makes, and the picker's own work with no host.
fn context(rows: &[StepRow], micro: &[MicroRow], host_calls: f64) -> String {
    let ratio = |letter: &str| {
        let ratio = row_of(rows, letter, 1024).map_or(f64::NAN, |r| r.cpu_ratio);
        figure(ratio, 2, "x")
    };
    let v8 = |body: usize| {
        let us = micro
            .iter()
            .find(|r| r.step == MICRO_STEPS[2].1 && r.body_bytes == Some(body))
            .map_or(f64::NAN, |r| r.v8_us);
        figure(us, 1, " µs")
    };
    format!(
        "- Beside the CPU goal at 1 KB (≤ {}x), in this run: the stage filter that only has \
         callbacks, (b) with every SDK export {}, (b2) with the picker's exports {}; the \
         shipped picker, (l), {}, with {} host calls per request (table below). The picker's \
         own work per request with no host (V8, table below): {} at 1 KB, {} at {} KB.\n",
        CPU_GOALS[0].1,
        ratio("(b)"),
        ratio("(b2)"),
        ratio("(l)"),
        figure(host_calls, 1, ""),
        v8(1024),
        v8(LARGE_BODY),
        LARGE_BODY / 1024,
    )
}

pub fn run(quick: bool) -> Part {
    println!("profile: one request's cost, step by step");
    let sims: Vec<Sim> = (1..=2)
        .map(|i| Sim::start(&format!("pod-{i}"), &["--time-scale", "0"]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    // BENCH_STEPS=a,f,l,s runs only those rows (and `s`, the streamed table) for trying a
    // change; the report wants them all.
    let only = std::env::var("BENCH_STEPS").unwrap_or_default();
    let chosen = |name: &str| {
        only.is_empty()
            || only
                .split(',')
                .any(|letter| name.starts_with(&format!("({})", letter.trim())))
    };
    let steps = steps(&refs, chosen);
    // The picker's rows start measuring with fresh metrics.
    if steps.iter().any(|step| step.name.contains("picker")) {
        for sim in &refs {
            sim.wait_for_scrapes(6);
        }
    }
    let idle = idle_cpu_ms_per_s(&steps, &refs, quick);
    let mut rows = measure(&steps, 1024, quick);
    rows.extend(measure(&steps, LARGE_BODY, quick));
    let micro = micro_steps();
    // `s` in BENCH_STEPS names the streamed-responses table.
    let streamed = if chosen("(s)") {
        streamed(quick)
    } else {
        Vec::new()
    };
    let Some(shipped) = steps.iter().find(|step| step.name.starts_with("(l)")) else {
        return Part {
            markdown: format!("{INTRO}{}", markdown_table(&rows)),
            csv: csv_table(&rows),
            charts: Vec::new(),
        };
    };
    let shipped = &shipped.envoy;
    let (calls, calls_total) = host_calls_per_request(shipped, if quick { 200 } else { 1000 });
    let perf = perf_profile(shipped, quick);
    let goals = goals(&rows);
    let context = context(&rows, &micro, calls_total);
    let streamed_intro = streamed_intro();
    Part {
        markdown: format!(
            "{INTRO}{}\n{goals}{context}\n{MICRO}{}\n{streamed_intro}{}\n{IDLE}{idle}\nHost calls a request makes through \
             the shipped picker, by kind (the filter's `host_calls` counters over the requests of a closed loop, less what its \
             ticks make meanwhile):\n\n{calls}\nWhere Envoy's CPU goes with the shipped picker \
             serving 220 KB requests (`perf record` on the Envoy process, by object; the \
             wasm code V8 compiled has no symbols and shows as anonymous memory or \
             `[unknown]`):\n\n{perf}",
            markdown_table(&rows),
            markdown_table(&micro),
            markdown_table(&streamed),
        ),
        csv: csv_table(&rows),
        charts: Vec::new(),
    }
}

fn addresses<'s>(sims: &[&'s Sim]) -> Vec<&'s str> {
    sims.iter().map(|sim| sim.address.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: &'static str, body_bytes: usize, added_p50_us: f64, cpu_ratio: f64) -> StepRow {
        StepRow {
            step,
            body_bytes,
            p50_ms: 0.1,
            added_p50_us,
            cpu_per_1000: 0.1,
            cpu_se: 0.0,
            cpu_ratio,
            errors: 0,
        }
    }

    #[test]
    fn goals_are_issue_17s_judged_on_the_shipped_picker() {
        let rows = [
            row("(l) picker, shipped Envoy", 1024, 25.0, 1.2),
            row("(l) picker, shipped Envoy", LARGE_BODY, 200.0, 1.5),
        ];
        let text = goals(&rows);
        assert!(
            text.contains("p50 ≤ 30 µs over Envoy alone: **met**"),
            "{text}"
        );
        assert!(
            text.contains("≤ 1.25x Envoy alone at 1 KB, ≤ 1.5x at 220 KB: **met**"),
            "{text}"
        );
        let over = [
            row("(l) picker, shipped Envoy", 1024, 25.0, 1.2),
            row("(l) picker, shipped Envoy", LARGE_BODY, 200.0, 1.51),
        ];
        assert!(goals(&over).contains("220 KB: **not met**"));
    }

    #[test]
    fn the_modules_goals_are_issue_28s_judged_on_its_row() {
        let rows = [
            row("(l) picker, shipped Envoy", 1024, 25.0, 1.2),
            row("(n) picker as a dynamic module", 1024, 15.0, 1.1),
            row("(n) picker as a dynamic module", LARGE_BODY, 30.0, 1.31),
        ];
        let text = goals(&rows);
        assert!(
            text.contains("dynamic module: +20 µs or less p50 at 1 KB, 1 client: **met**"),
            "{text}"
        );
        assert!(
            text.contains(
                "dynamic module: Envoy CPU per request at most 1.15x Envoy alone at 1 KB and 1.3x at 220 KB: **not met**"
            ),
            "{text}"
        );
        // The filter's CPU goal has no 220 KB row here: not measured, whatever the module did.
        assert!(
            text.contains("≤ 1.5x at 220 KB: **not measured**"),
            "{text}"
        );
    }

    #[test]
    fn zero_cpu_against_zero_is_not_measured() {
        let nothing = f64::NAN;
        let rows = [
            row("(l) picker, shipped Envoy", 1024, f64::NAN, nothing),
            row("(l) picker, shipped Envoy", LARGE_BODY, f64::NAN, 1.0 / 0.0),
        ];
        let text = goals(&rows);
        // The filter's two goals, and the module's two (no (n) rows).
        assert_eq!(text.matches("**not measured**").count(), 4, "{text}");
        // No rows at all: nothing is met.
        assert_eq!(goals(&[]).matches("**not measured**").count(), 4);
    }

    #[test]
    fn the_standard_error_needs_two_rounds() {
        assert!(standard_error(&[1.0]).is_nan());
        assert_eq!(standard_error(&[2.0, 2.0, 2.0]), 0.0);
        assert!((standard_error(&[1.0, 3.0]) - 1.0).abs() < 1e-12);
    }
}
