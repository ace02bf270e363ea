//! Part 5, scale-out: one vs two Envoy replicas, each with its own filter, in front of the same
//! pods; what more replicas would do to prefix affinity.

use crate::load::Percentiles;
use crate::quality::{
    run_on, ttft_cells, ERRORS, HIT_RATE, PICKS_PER_POD, TTFT_P50, TTFT_P90, TTFT_P99,
};
use crate::report::{csv_table, markdown_table, Cell, Column, Part, Row};
use crate::setup::Gateway;
use crate::support::Sim;
use crate::workloads::{best_hit_rate, shared_prefix_workload, QUALITY_SIM};
use inference_picker_core::scheduling::rng::Rng;

struct ScaleoutRow {
    replicas: usize,
    ttft: Percentiles,
    errors: usize,
    hit_rate: f64,
    picks_per_pod: Vec<usize>,
    /// Requests to the busiest pod over the mean per pod.
    busiest_over_mean: f64,
}

impl Row for ScaleoutRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("replicas", "replicas"),
        TTFT_P50,
        TTFT_P90,
        TTFT_P99,
        ERRORS,
        HIT_RATE,
        PICKS_PER_POD,
        Column::both("busiest pod / mean", "busiest_over_mean"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![Cell::Count(self.replicas)];
        cells.extend(ttft_cells(&self.ttft));
        cells.extend([
            Cell::Count(self.errors),
            Cell::Percent(self.hit_rate),
            Cell::Counts(self.picks_per_pod.clone()),
            Cell::Measure(self.busiest_over_mean, 2),
        ]);
        cells
    }
}

/// The shared-prefix workload's groups, its arrival rate (req/s), and the picker config.
const GROUPS: usize = 16;
const RATE: f64 = 45.0;
const PICKER: &str = "prefix-and-load.yaml";

fn intro(per_group: usize) -> String {
    format!(
        "## 5. Scale-out: two Envoy replicas\n\nThe routing-quality pods and shared-prefix \
         workload ({GROUPS} groups x {per_group}) at {RATE} req/s, picker `{PICKER}`; with two \
         replicas each Envoy (`--concurrency 2`, its own filter, its own prefix index) takes \
         every other request, as behind a round-robin L4 balancer. Both replicas scrape the \
         same pods, so load metrics agree; what they do not share is where each sent which \
         prefix.\n\n"
    )
}

pub fn run(quick: bool) -> Part {
    println!("scale-out: one vs two Envoy replicas, each with its own filter, same pods");
    let per_group = if quick { 8 } else { 16 };
    let mut rng = Rng::new(5);
    let requests = shared_prefix_workload(GROUPS, per_group, &mut rng);
    let rows: Vec<ScaleoutRow> = [1usize, 2]
        .into_iter()
        .map(|replicas| measure(replicas, &requests))
        .collect();
    let hit_rates: Vec<f64> = rows.iter().map(|r| r.hit_rate).collect();
    let best = best_hit_rate(&Sim::start("oracle", &QUALITY_SIM), &requests);
    Part {
        markdown: format!(
            "{}{}{}",
            intro(per_group),
            markdown_table(&rows),
            expectation(per_group, best, &hit_rates)
        ),
        csv: csv_table(&rows),
        charts: Vec::new(),
    }
}

fn measure(replicas: usize, requests: &[String]) -> ScaleoutRow {
    let gateway = Gateway::Picker(PICKER);
    let run = run_on(gateway, replicas, &QUALITY_SIM, requests, RATE);
    let counts = run.picks_per_pod();
    let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
    let busiest = counts.iter().copied().max().unwrap_or(0) as f64 / mean.max(1e-9);
    let row = ScaleoutRow {
        replicas,
        ttft: Percentiles::of(&run.ttft),
        errors: run.errors,
        hit_rate: run.hit_rate,
        picks_per_pod: counts,
        busiest_over_mean: busiest,
    };
    println!(
        "  {replicas} replica(s): TTFT p90 {:.1} ms, hit {:.1} %, busiest/mean {busiest:.2}",
        row.ttft.p90,
        row.hit_rate * 100.0
    );
    row
}

/// Groups in the shared-prefix workload that a replica sees, expected: with `r` replicas
/// taking requests round-robin, a group's `k` requests reach about `r(1 - (1 - 1/r)^k)` of them,
/// and each replica that has not seen a group places it without knowing where the others did.
fn replicas_per_group(r: f64, k: f64) -> f64 {
    r * (1.0 - (1.0 - 1.0 / r).powf(k))
}

/// What to expect at 10 and 100 replicas, beside what one and two measured.
fn expectation(per_group: usize, best: f64, hit_rates: &[f64]) -> String {
    let k = per_group as f64;
    let ceiling = |r: f64| (k - replicas_per_group(r, k)).max(0.0) / k * best * k / (k - 1.0);
    format!(
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
        hit_rates.first().copied().unwrap_or(f64::NAN) * 100.0,
        hit_rates.get(1).copied().unwrap_or(f64::NAN) * 100.0,
    )
}
