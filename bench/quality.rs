//! Part 3, routing quality: 8 simulated pods behind Envoy's balancers and picker configs, over
//! shared-prefix, mixed, LoRA-mix and burst workloads.

use crate::chart::bar_chart;
use crate::load::{open_loop, sorted, Percentiles};
use crate::report::{csv_table, goal, markdown_table, Cell, Column, Part, Row};
use crate::setup::Gateway;
use crate::support::Sim;
use crate::workloads::{
    best_hit_rate, lora_workload, mixed_workload, shared_prefix_workload, LORA_SIM, QUALITY_SIM,
};
use inference_picker::scheduling::rng::Rng;
use std::collections::BTreeMap;

const INTRO: &str = "## 3. Routing quality\n\n8 simulated pods (`max-num-seqs 2`, prefill 400 µs per \
     uncached token, decode 10 ms per token, time scale 0.2, prefix cache of 1024 blocks of 16 tokens, room for about 7 of the 16 system prompts); \
     each run starts fresh pods. Shared prefix: 16 groups x 16 prompts, ~2048-token system \
     prompt + ~128-token question, 64 tokens out, shuffled. Mixed: 200 unique prompts of \
     64..3072 tokens. LoRA mix: 200 unique prompts of 64..3072 tokens, each for one of 12 \
     adapters (`lora-0`..`lora-11`, uniformly), pods with `--max-lora 2` and 200 ms (scaled: \
     40 ms) to load an adapter that is not resident. Burst: 50 mixed prompts sent at the \
     same instant (the seed's validation burst). Open-loop Poisson arrivals; streaming; \
     TTFT = time to the first token chunk. Hit rate = prompt tokens served from the pods' \
     prefix caches / prompt tokens.\n\n";

const SATURATED: &str = "shared prefix, 45 req/s";
const NO_SHARED_PREFIX: &str = "mixed lengths, 20 req/s";

/// What one run of a workload measured.
pub struct QualityRun {
    /// Time to first token of each successful request, ms, sorted.
    pub ttft: Vec<f64>,
    pub elapsed: f64,
    pub errors: usize,
    pub hit_rate: f64,
    /// Requests served per pod, by pod name.
    pub picks: BTreeMap<String, usize>,
}

impl QualityRun {
    pub fn picks_per_pod(&self) -> Vec<usize> {
        self.picks.values().copied().collect()
    }
}

/// Fresh pods started with `sim_args`, `replicas` gateways in front of them sharing the load.
pub fn run_on(
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
    let gateways: Vec<_> = (0..replicas).map(|_| gateway.start(&refs)).collect();
    if let Gateway::Picker(_) = gateway {
        for sim in &refs {
            sim.wait_for_scrapes(2 * replicas as u64);
        }
    }
    let addresses: Vec<String> = gateways.iter().map(|g| g.address()).collect();
    let load = open_loop(&addresses, requests, rate, 11);
    let mut picks = BTreeMap::new();
    for e in &load.ok {
        *picks.entry(e.pod.clone()).or_insert(0) += 1;
    }
    QualityRun {
        ttft: sorted(
            load.ok
                .iter()
                .map(|e| e.first_byte.as_secs_f64() * 1000.0)
                .collect(),
        ),
        elapsed: load.elapsed,
        errors: load.errors,
        hit_rate: prefix_hit_rate(&refs),
        picks,
    }
}

/// Prompt tokens the pods served from their prefix caches over all they were asked for.
fn prefix_hit_rate(sims: &[&Sim]) -> f64 {
    let (mut hits, mut queries) = (0.0, 0.0);
    for sim in sims {
        let stats = sim.stats();
        hits += stats["prefix_hits"].as_f64().unwrap_or(0.0);
        queries += stats["prefix_queries"].as_f64().unwrap_or(0.0);
    }
    if queries > 0.0 {
        hits / queries
    } else {
        0.0
    }
}

/// Columns shared with the scale-out table.
pub const TTFT_P50: Column = Column::both("TTFT p50 ms", "ttft_p50_ms");
pub const TTFT_P90: Column = Column::both("TTFT p90 ms", "ttft_p90_ms");
pub const TTFT_P99: Column = Column::both("TTFT p99 ms", "ttft_p99_ms");
pub const ERRORS: Column = Column::both("errors", "errors");
pub const HIT_RATE: Column = Column::both("hit rate", "hit_rate");
pub const PICKS_PER_POD: Column = Column::markdown("picks per pod").left();

/// The cells of [`TTFT_P50`], [`TTFT_P90`] and [`TTFT_P99`].
pub fn ttft_cells(ttft: &Percentiles) -> [Cell; 3] {
    [
        Cell::Measure(ttft.p50, 1),
        Cell::Measure(ttft.p90, 1),
        Cell::Measure(ttft.p99, 1),
    ]
}

struct QualityRow {
    workload: &'static str,
    gateway: String,
    ttft: Percentiles,
    throughput: f64,
    errors: usize,
    hit_rate: f64,
    picks_per_pod: Vec<usize>,
}

impl Row for QualityRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("workload", "workload").left(),
        Column::both("gateway", "gateway").left(),
        TTFT_P50,
        TTFT_P90,
        TTFT_P99,
        Column::both("throughput req/s", "throughput"),
        ERRORS,
        HIT_RATE,
        PICKS_PER_POD,
    ];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![
            Cell::Text(self.workload.into()),
            Cell::Text(self.gateway.clone()),
        ];
        cells.extend(ttft_cells(&self.ttft));
        cells.extend([
            Cell::Measure(self.throughput, 1),
            Cell::Count(self.errors),
            Cell::Percent(self.hit_rate),
            Cell::Counts(self.picks_per_pod.clone()),
        ]);
        cells
    }
}

/// A workload: its name, its requests, arrivals per second, the pods' flags.
struct Workload<'a> {
    name: &'static str,
    requests: &'a [String],
    rate: f64,
    sim_args: &'a [&'a str],
}

/// Every gateway compared (a quick run compares three).
fn gateways(quick: bool) -> &'static [Gateway] {
    if quick {
        &[
            Gateway::Envoy("ROUND_ROBIN"),
            Gateway::Envoy("LEAST_REQUEST"),
            Gateway::Picker("prefix-and-load.yaml"),
            Gateway::Sglang("cache_aware"),
            Gateway::Sglang("round_robin"),
            Gateway::VllmRouter("cache_aware"),
        ]
    } else {
        &[
            Gateway::Envoy("ROUND_ROBIN"),
            Gateway::Envoy("LEAST_REQUEST"),
            Gateway::Envoy("RANDOM"),
            Gateway::Picker("default"),
            Gateway::Picker("prefix-and-load.yaml"),
            Gateway::Picker("request-cost.yaml"),
            Gateway::Sglang("cache_aware"),
            Gateway::Sglang("round_robin"),
            Gateway::VllmRouter("cache_aware"),
        ]
    }
}

pub fn run(quick: bool) -> Part {
    println!("quality: 8 pods, open-loop Poisson arrivals");
    let per_group = if quick { 8 } else { 16 };
    // Drawn in this order from one generator, quick or not, so each workload is the same.
    let mut rng = Rng::new(5);
    let shared = shared_prefix_workload(16, per_group, &mut rng);
    let mixed = mixed_workload(if quick { 60 } else { 200 }, &mut rng);
    let lora = lora_workload(200, &mut rng);
    let burst = mixed_workload(50, &mut rng);
    let lora_sim: Vec<&str> = QUALITY_SIM.iter().copied().chain(LORA_SIM).collect();
    let workload = |name, requests, rate, sim_args| Workload {
        name,
        requests,
        rate,
        sim_args,
    };
    // The burst arrives all at once.
    let workloads = if quick {
        vec![
            workload(SATURATED, &shared, 45.0, &QUALITY_SIM),
            workload("burst of 50", &burst, 1e9, &QUALITY_SIM),
        ]
    } else {
        vec![
            workload("shared prefix, 10 req/s", &shared, 10.0, &QUALITY_SIM),
            workload(SATURATED, &shared, 45.0, &QUALITY_SIM),
            workload(NO_SHARED_PREFIX, &mixed, 20.0, &QUALITY_SIM),
            workload("LoRA mix, 20 req/s", &lora, 20.0, &lora_sim),
            workload("burst of 50", &burst, 1e9, &QUALITY_SIM),
        ]
    };
    let rows = measure(&workloads, gateways(quick));
    let best_hit = best_hit_rate(&Sim::start("oracle", &QUALITY_SIM), &shared);
    let names: Vec<String> = gateways(quick).iter().map(|g| g.name()).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Part {
        markdown: format!(
            "{INTRO}{}\n{}\n![TTFT p90 per gateway](results/3-quality.svg)\n",
            markdown_table(&rows),
            quality_goals(&rows, best_hit)
        ),
        csv: csv_table(&rows),
        svg: Some(bar_chart(
            "TTFT p90 (ms)",
            &names,
            &p90_bars(&workloads, &rows),
        )),
    }
}

/// Every workload on every gateway; `BENCH_ONLY=substring` limits the runs (by "workload
/// gateway") while tuning.
fn measure(workloads: &[Workload<'_>], gateways: &[Gateway]) -> Vec<QualityRow> {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let mut rows = Vec::new();
    for workload in workloads {
        for &gateway in gateways {
            if format!("{} {}", workload.name, gateway.name()).contains(&only) {
                rows.push(measure_one(workload, gateway));
            }
        }
    }
    rows
}

fn measure_one(workload: &Workload<'_>, gateway: Gateway) -> QualityRow {
    let run = run_on(
        gateway,
        1,
        workload.sim_args,
        workload.requests,
        workload.rate,
    );
    let row = QualityRow {
        workload: workload.name,
        gateway: gateway.name(),
        ttft: Percentiles::of(&run.ttft),
        throughput: run.ttft.len() as f64 / run.elapsed,
        errors: run.errors,
        hit_rate: run.hit_rate,
        picks_per_pod: run.picks_per_pod(),
    };
    println!(
        "  {:<26} {:<28} TTFT p90 {:>8.1} ms  hit {:>5.1} %",
        row.workload,
        row.gateway,
        row.ttft.p90,
        row.hit_rate * 100.0
    );
    row
}

/// TTFT p90 of each gateway run, per workload.
fn p90_bars(workloads: &[Workload<'_>], rows: &[QualityRow]) -> Vec<(String, Vec<f64>)> {
    workloads
        .iter()
        .map(|w| {
            let p90s = rows
                .iter()
                .filter(|r| r.workload == w.name)
                .map(|r| r.ttft.p90)
                .collect();
            (w.name.to_string(), p90s)
        })
        .collect()
}

/// The routing-quality goals, judged on the best picker configuration of each workload.
fn quality_goals(rows: &[QualityRow], best_hit: f64) -> String {
    saturation_goals(rows, best_hit) + &no_shared_prefix_goal(rows)
}

fn row_of<'r>(rows: &'r [QualityRow], workload: &str, gateway: &str) -> Option<&'r QualityRow> {
    rows.iter()
        .find(|r| r.workload == workload && r.gateway == gateway)
}

/// The picker configuration with the lowest TTFT p90 on `workload`.
fn best_picker<'r>(rows: &'r [QualityRow], workload: &str) -> Option<&'r QualityRow> {
    rows.iter()
        .filter(|r| r.workload == workload && r.gateway.starts_with("picker"))
        .min_by(|a, b| a.ttft.p90.total_cmp(&b.ttft.p90))
}

fn saturation_goals(rows: &[QualityRow], best_hit: f64) -> String {
    let (Some(best), Some(rr), Some(lr)) = (
        best_picker(rows, SATURATED),
        row_of(rows, SATURATED, "Envoy ROUND_ROBIN"),
        row_of(rows, SATURATED, "Envoy LEAST_REQUEST"),
    ) else {
        return goal("near-saturation goals", None, "workload not run");
    };
    let (picker, p90, hit) = (&best.gateway, best.ttft.p90, best.hit_rate);
    let (rr, lr) = (rr.ttft.p90, lr.ttft.p90);
    goal(
        "near saturation, TTFT p90 at least 5x lower than ROUND_ROBIN",
        Some(rr / p90 >= 5.0),
        &format!("{picker}: {p90:.0} ms vs {rr:.0} ms, {:.1}x", rr / p90),
    ) + &goal(
        "near saturation, TTFT p90 at least 3x lower than LEAST_REQUEST",
        Some(lr / p90 >= 3.0),
        &format!("{picker}: {p90:.0} ms vs {lr:.0} ms, {:.1}x", lr / p90),
    ) + &goal(
        "prefix-cache hit rate within 10 % of the best achievable",
        Some(hit >= 0.9 * best_hit),
        &format!(
            "{:.1} % vs {:.1} % achievable",
            hit * 100.0,
            best_hit * 100.0
        ),
    )
}

fn no_shared_prefix_goal(rows: &[QualityRow]) -> String {
    match (
        best_picker(rows, NO_SHARED_PREFIX),
        row_of(rows, NO_SHARED_PREFIX, "Envoy LEAST_REQUEST"),
    ) {
        (Some(best), Some(lr)) => {
            let (picker, p90, lr) = (&best.gateway, best.ttft.p90, lr.ttft.p90);
            goal(
                "no shared prefix: no worse than LEAST_REQUEST (TTFT p90 within 5 %)",
                Some(p90 <= lr * 1.05),
                &format!("{picker}: {p90:.0} ms vs {lr:.0} ms"),
            )
        }
        _ => goal(
            "no shared prefix: no worse than LEAST_REQUEST",
            None,
            "workload not run",
        ),
    }
}
