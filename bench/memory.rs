//! Part 4, memory: Envoy's RSS and the VMs' memory at 8 / 256 / 1,024 endpoints as the prefix
//! index fills; and large pools (1,024 / 4,096 / 16,384 endpoints): configuration time, scrape
//! rounds against the interval, freshness, errors, memory and the admin port's responsiveness.

use crate::load::{closed_loop_over, percentile, sorted};
use crate::procfs::rss_mib;
use crate::report::{csv_table, goal, joined, markdown_table, Cell, Column, Part, Row};
use crate::setup::filter_stat;
use crate::support::{with_addresses, Envoy, EnvoyConfig, SimPool};
use crate::workloads::distinct_completions;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Prefix blocks each pod may hold in the picker's index for this run: small enough to fill
/// at 1,024 endpoints in seconds; the default (31,250) is extrapolated from the same figures.
const INDEX_CAPACITY: usize = 256;
/// Characters per prompt: 125 blocks of 64 characters (16 tokens of 4 characters).
const PROMPT_CHARS: usize = 8000;
const BLOCKS_PER_PROMPT: usize = PROMPT_CHARS / 64;
/// Each phase sends enough distinct prompts to fill every pod's share of the index twice.
const PHASES: usize = 5;
/// GIE's default `lruCapacityPerServer`.
const GIE_DEFAULT_CAPACITY: f64 = 31250.0;
const MIB: f64 = 1048576.0;

fn intro() -> String {
    format!(
        "## 4. Memory\n\nEnvoy `--concurrency 2` with the filter (queue, KV and prefix scorers), \
         N simulated pods (one process, `--listeners N`), scraped every second. The prefix index \
         holds at most {INDEX_CAPACITY} blocks per pod in this run (`lruCapacityPerServer`); \
         each request carries a distinct {PROMPT_CHARS}-character prompt ({BLOCKS_PER_PROMPT} blocks), and \
         each of {PHASES} phases sends enough of them to fill every pod's share twice \
         (picks are spread at random among equals, so some pods fill only in phase 2). VM \
         memory is the filter's `vm_memory_bytes` gauge (the linear memory of every VM of the \
         plugin, summed; wasm memory grows and never shrinks, so it is a high-water mark); per \
         VM divides by the VMs that route (the workers; the main thread's VM stays idle). If the \
         index were unbounded, the last phase would add as much as the first.\n\n"
    )
}

fn picker_config(capacity: usize) -> String {
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
  refreshMetricsInterval: 1s
  metricsStalenessThreshold: 5s
  endpoints: []
"
    )
}

struct MemoryRow {
    endpoints: usize,
    requests: usize,
    /// Idle, then after each phase: Envoy's RSS and the VMs' memory, MiB.
    rss: Vec<f64>,
    vm_total: Vec<f64>,
    vms: f64,
    errors: usize,
}

impl MemoryRow {
    /// Only the workers' VMs route and hold an index; the main thread's stays idle.
    fn routing_vms(&self) -> f64 {
        (self.vms - 1.0).max(1.0)
    }

    fn vm_at_end(&self) -> f64 {
        self.vm_total.last().copied().unwrap_or(f64::NAN)
    }

    /// What each phase added to the VMs' memory, MiB.
    fn growth_per_phase(&self) -> Vec<f64> {
        self.vm_total.windows(2).map(|w| w[1] - w[0]).collect()
    }
}

impl Row for MemoryRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("endpoints", "endpoints"),
        Column::both("requests", "requests"),
        Column::both(
            "Envoy RSS MiB: idle, after each phase",
            "rss_mib_idle_then_per_phase",
        )
        .left(),
        Column::both(
            "VM memory MiB (all VMs): idle, after each phase",
            "vm_mib_idle_then_per_phase",
        )
        .left(),
        Column::both("VMs", "vms"),
        Column::markdown("per routing VM MiB at the end"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Count(self.endpoints),
            Cell::Count(self.requests),
            Cell::Series(self.rss.clone(), 0),
            Cell::Series(self.vm_total.clone(), 1),
            Cell::Fixed(self.vms, 0),
            Cell::Fixed(self.vm_at_end() / self.routing_vms(), 1),
            Cell::Count(self.errors),
        ]
    }
}

pub fn run(quick: bool) -> Part {
    println!("memory: Envoy RSS and wasm VM memory with 8 / 256 / 1,024 endpoints");
    let sizes: &[usize] = if quick { &[8, 256] } else { &[8, 256, 1024] };
    let rows: Vec<MemoryRow> = sizes.iter().map(|&n| measure(n)).collect();
    println!("memory: large pools");
    let pools: &[usize] = if quick { &[1024] } else { &[1024, 4096, 16384] };
    // The quick run lets the pool settle for less, so `make bench-quick` stays short.
    let settle = if quick { SETTLE / 3 } else { SETTLE };
    let large: Vec<PoolRow> = pools.iter().map(|&n| measure_pool(n, settle)).collect();
    Part {
        markdown: format!(
            "{}{}\n{}{}{}{}\n{}",
            intro(),
            markdown_table(&rows),
            bounded_index_goal(&rows),
            rows.last().map(cost_per_block).unwrap_or_default(),
            LARGE_INTRO,
            markdown_table(&large),
            large_pool_goals(&large)
        ),
        csv: csv_table(&rows) + "\n" + &csv_table(&large),
        charts: Vec::new(),
    }
}

const LARGE_INTRO: &str = "\n### Large pools\n\nThe shipped `envoy/envoy.yaml` (scrapes through \
     their own `inference_picker_metrics` cluster, `maxScrapesInFlight` 128), Envoy \
     `--concurrency 2`, the picker above scraping every second (staleness threshold 5 s), N \
     simulated pods in processes of 4,096. After Envoy is ready, 30 s of scraping, then \
     2,000 requests (8 clients, distinct 200-character prompts); all along the admin port is \
     asked for `GET /stats` every 2 s, and the filter's gauges are read. Configure: the slowest VM's own `configured with N \
     endpoints in X ms` log line (loading, building, defining the stats). All fresh: from \
     Envoy ready until every endpoint had fresh metrics. Round: the `scrape_round_ms` gauge \
     (the last complete round, from its tick to its last answer), median and max of the \
     samples once a round completed. Fresh: the `endpoints_fresh` gauge over N, lowest sample after all were fresh \
     and at the end. Scrape failures: the endpoints' `scrape_failure` counters summed \
     (`unsent`: refused by the host); overflows: the metrics cluster's `upstream_cx_overflow` \
     and `upstream_rq_pending_overflow`. Warning lines: the filter's warnings in Envoy's log \
     for the whole run. At 16,384 the metrics cluster closes each scrape's connection \
     (`max_requests_per_connection: 1`): the simulator runs a thread per listener and per \
     connection, and 16,384 kept-alive scrape connections would pass this machine's 32,768 \
     tasks; the shipped config keeps them alive.\n\n";

/// What the pods' Envoy does between start and the end of the load.
const SETTLE: Duration = Duration::from_secs(30);
/// How often the admin port is asked for `/stats` (each answer lists five stats per endpoint).
const ADMIN_EVERY: Duration = Duration::from_secs(2);
const POOL_REQUESTS: usize = 2000;
/// Beyond this many pods, scrape connections are closed after each scrape (see LARGE_INTRO).
const KEEP_ALIVE_LIMIT: usize = 8192;

struct PoolRow {
    endpoints: usize,
    keep_alive: bool,
    configure_ms: f64,
    ready_s: f64,
    all_fresh_s: f64,
    round_ms: Vec<f64>,
    fresh_min: f64,
    fresh_end: f64,
    requests: usize,
    errors: usize,
    scrape_failures: f64,
    unsent: f64,
    overflows: f64,
    vm_total_mib: f64,
    vms: f64,
    rss_mib: f64,
    stats_ms: Vec<f64>,
    stats_kb: usize,
    warning_lines: usize,
}

impl PoolRow {
    fn round_median(&self) -> f64 {
        percentile(&sorted(self.round_ms.clone()), 50.0)
    }
    fn round_max(&self) -> f64 {
        self.round_ms.iter().copied().fold(f64::NAN, f64::max)
    }
    fn stats_p50(&self) -> f64 {
        percentile(&sorted(self.stats_ms.clone()), 50.0)
    }
    fn stats_max(&self) -> f64 {
        self.stats_ms.iter().copied().fold(f64::NAN, f64::max)
    }
}

impl Row for PoolRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("endpoints", "endpoints"),
        Column::both("scrape connections", "scrape_connections").left(),
        Column::both("configure ms (per VM)", "configure_ms"),
        Column::both("Envoy ready s", "ready_s"),
        Column::both("all fresh after s", "all_fresh_s"),
        Column::both(
            "round ms: median / max (interval 1,000)",
            "round_ms_median_max",
        )
        .left(),
        Column::both("fresh: lowest / end", "fresh_lowest_end").left(),
        Column::both("requests", "requests"),
        Column::both("errors", "errors"),
        Column::both("scrape failures (unsent)", "scrape_failures_unsent").left(),
        Column::both("breaker overflows", "overflows"),
        Column::both("VM MiB: all VMs / per VM", "vm_mib_all_per_vm").left(),
        Column::both("Envoy RSS MiB", "rss_mib"),
        Column::both("GET /stats ms: p50 / max", "stats_ms_p50_max").left(),
        Column::both("/stats KB", "stats_kb"),
        Column::both("warning lines", "warning_lines"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let per_vm = self.vm_total_mib / self.vms.max(1.0);
        vec![
            Cell::Count(self.endpoints),
            Cell::Text(if self.keep_alive { "kept" } else { "closed" }.into()),
            Cell::Fixed(self.configure_ms, 0),
            Cell::Fixed(self.ready_s, 1),
            Cell::Fixed(self.all_fresh_s, 1),
            Cell::Series(vec![self.round_median(), self.round_max()], 0),
            Cell::Text(format!(
                "{:.1} % / {:.1} %",
                self.fresh_min * 100.0,
                self.fresh_end * 100.0
            )),
            Cell::Count(self.requests),
            Cell::Count(self.errors),
            Cell::Text(format!("{:.0} ({:.0})", self.scrape_failures, self.unsent)),
            Cell::Fixed(self.overflows, 0),
            Cell::Series(vec![self.vm_total_mib, per_vm], 1),
            Cell::Fixed(self.rss_mib, 0),
            Cell::Series(vec![self.stats_p50(), self.stats_max()], 0),
            Cell::Count(self.stats_kb),
            Cell::Count(self.warning_lines),
        ]
    }
}

fn large_pool_goals(rows: &[PoolRow]) -> String {
    let listed = |f: &dyn Fn(&PoolRow) -> String| -> String {
        rows.iter()
            .map(|r| format!("{}: {}", r.endpoints, f(r)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let errors = goal(
        "zero errors at every size (client requests and scrapes)",
        Some(
            rows.iter()
                .all(|r| r.errors == 0 && r.scrape_failures == 0.0),
        ),
        &listed(&|r| {
            format!(
                "{} request errors, {:.0} scrape failures",
                r.errors, r.scrape_failures
            )
        }),
    );
    let fresh = goal(
        "every endpoint scraped and none starved (all fresh, and still all fresh at the end)",
        Some(
            rows.iter()
                .all(|r| r.all_fresh_s.is_finite() && r.fresh_end >= 1.0),
        ),
        &listed(&|r| {
            format!(
                "lowest {:.1} %, end {:.1} %",
                r.fresh_min * 100.0,
                r.fresh_end * 100.0
            )
        }),
    );
    let configure = goal(
        "configuring takes well under a second per VM",
        Some(rows.iter().all(|r| r.configure_ms < 500.0)),
        &listed(&|r| format!("{:.0} ms", r.configure_ms)),
    );
    format!("{errors}{fresh}{configure}")
}

/// A filter counter or gauge summed over every endpoint (`/stats?filter=...<suffix>$`).
fn endpoint_stat_sum(envoy: &Envoy, suffix: &str) -> f64 {
    envoy
        .admin_get(&format!(
            "/stats?filter=inference_picker\\.endpoint\\..*\\.{suffix}$"
        ))
        .text()
        .lines()
        .filter_map(|l| {
            l.rsplit_once(": ")
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// One of Envoy's own stats by its exact name.
fn envoy_stat(envoy: &Envoy, name: &str) -> f64 {
    envoy
        .admin_get(&format!("/stats?filter=^{name}$"))
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn measure_pool(endpoints: usize, settle: Duration) -> PoolRow {
    let pods = SimPool::start(endpoints);
    let addresses: Vec<&str> = pods.addresses.iter().map(String::as_str).collect();
    let picker = with_addresses(&picker_config(INDEX_CAPACITY), &addresses);
    let keep_alive = endpoints <= KEEP_ALIVE_LIMIT;
    let started = Instant::now();
    let envoy = Envoy::start_with(&picker, 2, |config: &mut EnvoyConfig| {
        if !keep_alive {
            let options: serde_yaml::Value = serde_yaml::from_str(
                r#"
envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
  "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
  common_http_protocol_options: {max_requests_per_connection: 1}
  explicit_http_config: {http_protocol_options: {}}
"#,
            )
            .expect("protocol options");
            config.cluster_mut("inference_picker_metrics")["typed_extension_protocol_options"] =
                options;
        }
    });
    let ready_s = started.elapsed().as_secs_f64();
    let ready = Instant::now();
    let fresh = || filter_stat(&envoy, "endpoints_fresh") / endpoints as f64;
    let samples = Mutex::new((Vec::new(), Vec::new(), Vec::new()));
    let mut all_fresh_s = f64::NAN;
    let mut stats_kb = 0;
    // Sample the gauges and time the admin port until every endpoint is fresh and the settle time passed.
    let mut sample = |all_fresh: bool| {
        let asked = Instant::now();
        let text = envoy.admin_get("/stats").text();
        let took = asked.elapsed().as_secs_f64() * 1e3;
        let mut samples = samples.lock().expect("samples");
        samples.0.push(took);
        stats_kb = stats_kb.max(text.len() / 1024);
        // Once a round completed (the gauge is 0 before), whether or not all are fresh.
        let round = filter_stat(&envoy, "scrape_round_ms");
        if round > 0.0 {
            samples.1.push(round);
        }
        if all_fresh {
            samples.2.push(fresh());
        }
    };
    let mut last_sample: Option<Instant> = None;
    while ready.elapsed() < settle {
        if all_fresh_s.is_nan() && fresh() >= 1.0 {
            all_fresh_s = ready.elapsed().as_secs_f64();
        }
        if last_sample.is_none_or(|at| at.elapsed() >= ADMIN_EVERY) {
            last_sample = Some(Instant::now());
            sample(!all_fresh_s.is_nan());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let bodies = distinct_completions(POOL_REQUESTS, 200);
    let done = AtomicBool::new(false);
    let results = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                sample(!all_fresh_s.is_nan());
                std::thread::sleep(ADMIN_EVERY);
            }
        });
        let results = closed_loop_over(&envoy.address(), 8, POOL_REQUESTS, &|n| bodies[n].as_str());
        done.store(true, Ordering::Relaxed);
        results
    });
    let errors = POOL_REQUESTS - results.iter().filter(|e| e.status == 200).count();
    let (stats_ms, round_ms, fresh_samples) = samples.into_inner().expect("samples");
    let configure_ms = envoy
        .log()
        .lines()
        .filter_map(|l| {
            l.split_once("endpoints in ")?
                .1
                .split_once("ms")?
                .0
                .parse::<f64>()
                .ok()
        })
        .fold(f64::NAN, f64::max);
    let warning_lines = envoy
        .log()
        .lines()
        .filter(|l| l.contains("[warning]") && l.contains("inference-picker"))
        .count();
    let overflows = ["upstream_cx_overflow", "upstream_rq_pending_overflow"]
        .iter()
        .map(|o| envoy_stat(&envoy, &format!("cluster.inference_picker_metrics.{o}")))
        .sum();
    let row = PoolRow {
        endpoints,
        keep_alive,
        configure_ms,
        ready_s,
        all_fresh_s,
        fresh_min: fresh_samples.iter().copied().fold(f64::NAN, f64::min),
        fresh_end: fresh(),
        round_ms,
        requests: POOL_REQUESTS,
        errors,
        scrape_failures: endpoint_stat_sum(&envoy, "scrape_failure"),
        unsent: filter_stat(&envoy, "scrapes_unsent"),
        overflows,
        vm_total_mib: filter_stat(&envoy, "vm_memory_bytes") / MIB,
        vms: filter_stat(&envoy, "vms"),
        rss_mib: rss_mib(envoy.pid()),
        stats_ms,
        stats_kb,
        warning_lines,
    };
    println!(
        "  {:>5} endpoints: configure {:.0} ms, all fresh after {:.1} s, round {:.0} ms (max {:.0}), \
         fresh {:.3}..{:.3}, {} errors, {:.0} scrape failures, RSS {:.0} MiB, VMs {:.1} MiB, \
         /stats p50 {:.0} ms max {:.0} ms, {} warning lines",
        row.endpoints,
        row.configure_ms,
        row.all_fresh_s,
        row.round_median(),
        row.round_max(),
        row.fresh_min,
        row.fresh_end,
        row.errors,
        row.scrape_failures,
        row.rss_mib,
        row.vm_total_mib,
        row.stats_p50(),
        row.stats_max(),
        row.warning_lines
    );
    row
}

/// Envoy's and the VMs' memory (MiB) after the next scrape.
fn snapshot(envoy: &Envoy) -> (f64, f64) {
    std::thread::sleep(Duration::from_millis(1200));
    (
        rss_mib(envoy.pid()),
        filter_stat(envoy, "vm_memory_bytes") / MIB,
    )
}

fn measure(endpoints: usize) -> MemoryRow {
    let pods = SimPool::start(endpoints);
    let addresses: Vec<&str> = pods.addresses.iter().map(String::as_str).collect();
    let envoy = Envoy::start(
        &with_addresses(&picker_config(INDEX_CAPACITY), &addresses),
        2,
    );
    // Two scrape rounds, so every endpoint has metrics and stats.
    std::thread::sleep(Duration::from_millis(2500));
    let (mut rss, mut vm_total) = (Vec::new(), Vec::new());
    let mut record = |(r, v): (f64, f64)| {
        rss.push(r);
        vm_total.push(v);
    };
    record(snapshot(&envoy));
    // Enough distinct prompts to fill every pod's share of the index, twice over.
    let per_phase = (endpoints * INDEX_CAPACITY).div_ceil(BLOCKS_PER_PROMPT) * 2;
    let bodies = distinct_completions(per_phase * PHASES, PROMPT_CHARS);
    let mut errors = 0;
    for phase in bodies.chunks(per_phase) {
        let results = closed_loop_over(&envoy.address(), 8, phase.len(), &|n| phase[n].as_str());
        errors += phase.len() - results.iter().filter(|e| e.status == 200).count();
        record(snapshot(&envoy));
    }
    let row = MemoryRow {
        endpoints,
        requests: per_phase * PHASES,
        rss,
        vm_total,
        vms: filter_stat(&envoy, "vms"),
        errors,
    };
    println!(
        "  {:>5} endpoints: RSS {:.0?} MiB; VM memory {:.1?} MiB over {} VMs",
        row.endpoints, row.rss, row.vm_total, row.vms
    );
    row
}

/// Bounded index: the last phase adds at most a tenth of what the first added.
fn bounded_index_goal(rows: &[MemoryRow]) -> String {
    let bounded: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} endpoints, growth per phase: {} MiB",
                r.endpoints,
                joined(&r.growth_per_phase(), 1, ", ")
            )
        })
        .collect();
    let met = rows.iter().all(|r| {
        let growth = r.growth_per_phase();
        match (growth.first(), growth.last()) {
            (Some(first), Some(last)) => *last <= (first * 0.1).max(0.5),
            _ => false,
        }
    });
    goal(
        "the prefix index stays within its configured capacity (the last phase adds under a tenth of the first)",
        Some(met),
        &bounded.join("; "),
    )
}

/// Cost per block from the largest pool, extrapolated to GIE's default capacity.
fn cost_per_block(largest: &MemoryRow) -> String {
    let blocks = (largest.endpoints * INDEX_CAPACITY) as f64;
    let grown = largest.vm_at_end() - largest.vm_total.first().copied().unwrap_or(f64::NAN);
    let per_vm_growth = grown / largest.routing_vms();
    let bytes_per_block = per_vm_growth * MIB / blocks;
    let full_index_mib = |endpoints: f64| bytes_per_block * endpoints * GIE_DEFAULT_CAPACITY / MIB;
    format!(
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
        full_index_mib(8.0),
        full_index_mib(256.0),
    )
}
