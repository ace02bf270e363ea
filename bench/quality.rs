//! Part 3, routing quality: open-loop rate sweeps of 8 simulated pods behind every gateway, per
//! workload (shared prefix, multi-turn chat, hot prefix, mixed lengths, LoRA mix, a burst); per
//! cell TTFT, time per output token, throughput, errors, prefix-cache hit rate and balance;
//! goodput under TTFT SLOs, against the ceiling a perfect router would reach.

mod goals;
mod goodput;
mod slo;

use crate::chart::{bar_chart, line_chart};
use crate::load::{open_loop_with, sorted, Percentiles};
use crate::report::{csv_table, markdown_table, Cell, Chart, Column, Part, Row};
use crate::setup::Gateway;
use crate::support::Sim;
use crate::workloads::{
    flag_value, hot_prefix_workload, lora_workload, mixed_workload, multi_turn_workload,
    shared_prefix_workload, BATCHING_SIM, LORA_SIM, OUTPUT_TOKENS, QUALITY_SIM,
};
use goodput::{goodput_rows, points, Ceiling, GoodputRow, Point, SLOS_MS};
use inference_picker_core::scheduling::rng::Rng;
use std::collections::BTreeMap;
use std::time::Instant;

pub const SHARED_PREFIX: &str = "shared prefix";
pub const MULTI_TURN: &str = "multi-turn chat";
pub const HOT_PREFIX: &str = "hot prefix";
pub const MIXED: &str = "mixed lengths";
pub const LORA: &str = "LoRA mix";
pub const BURST: &str = "burst of 50";

/// The pods a sweep runs on.
pub struct Regime {
    /// As headings name it.
    pub name: &'static str,
    /// In file names and the CSV.
    pub slug: &'static str,
    /// Every pod's flags (a workload may add its own).
    pub sim: &'static [&'static str],
    /// Unscaled milliseconds to load a LoRA adapter: 40 ms once time-scaled on both regimes
    /// (in the batching engine the load holds up the whole step it happens in).
    pub lora_load_ms: &'static str,
    /// What the pods model, for the report, from their flags.
    pub description: fn(&[&str]) -> String,
}

impl Regime {
    pub fn batching(&self) -> bool {
        self.sim.contains(&"--batching")
    }
}

/// Both regimes, in running order; a workload's rates and knees are indexed alike.
const REGIMES: [Regime; 2] = [
    Regime {
        name: "scaled 2-slot pods",
        slug: "slots",
        sim: &QUALITY_SIM,
        lora_load_ms: "200",
        description: slots_description,
    },
    Regime {
        name: "the batching engine",
        slug: "batching",
        sim: &BATCHING_SIM,
        lora_load_ms: "13.333",
        description: batching_description,
    },
];

fn slots_description(sim: &[&str]) -> String {
    let flag = |name| flag_value(sim, name);
    format!(
        "8 simulated pods that run {} sequences at a time, each request timed on its own: \
         prefill {} µs per uncached token, then decode steps of {} ms slowed 2 % per running \
         sequence, time scale {}; a prefix cache of {} blocks of 16 tokens; {OUTPUT_TOKENS} \
         tokens out.",
        flag("--max-num-seqs"),
        flag("--prefill-us-per-token"),
        flag("--decode-ms-per-token"),
        flag("--time-scale"),
        flag("--kv-blocks"),
    )
}

fn batching_description(sim: &[&str]) -> String {
    let flag = |name| flag_value(sim, name);
    format!(
        "8 simulated pods running the simulator's batching engine: vLLM V1's continuous \
         batching of up to {} sequences, each step a budget of {} tokens shared by the decodes \
         (first) and prefill chunks, a step lasting {} ms + {} ms per token in it + {} ms per \
         context token its sequences attend to (an 8B model on one H100, from published vLLM \
         measurements cited in `examples/model-server-sim/batching.rs`), a KV cache of {} \
         blocks of 16 tokens taken as sequences grow, the newest running sequence preempted \
         and recomputed when none is left; time scale {}; {OUTPUT_TOKENS} tokens out, streamed \
         {} to a chunk.",
        flag("--max-num-seqs"),
        flag("--max-num-batched-tokens"),
        flag("--step-fixed-ms"),
        flag("--step-ms-per-token"),
        flag("--step-ms-per-context-token"),
        flag("--kv-blocks"),
        flag("--time-scale"),
        flag("--stream-interval"),
    )
}

/// A workload of the sweep.
struct Workload {
    name: &'static str,
    /// Offered rates of the full run per regime, req/s, light load to past saturation
    /// (`INFINITY`: every request at once).
    rates: [&'static [f64]; 2],
    quick_rates: [&'static [f64]; 2],
    /// About where Envoy ROUND_ROBIN saturates per regime, req/s: past it a cell lasts as
    /// long as the pods take to drain it. For the time estimate only.
    knee: [f64; 2],
    /// Pods with LoRA adapters.
    lora: bool,
    /// The requests of one seed, in arrival order (64 tokens out); small for the quick run.
    requests: fn(quick: bool, rng: &mut Rng) -> Vec<String>,
}

impl Workload {
    /// Rates to run: `BENCH_RATES=30,60` replaces every finite sweep (for finding knees).
    fn rates(&self, regime: usize, quick: bool) -> Vec<f64> {
        let swept = if quick {
            self.quick_rates[regime]
        } else {
            self.rates[regime]
        };
        match std::env::var("BENCH_RATES") {
            Ok(list) if swept.iter().all(|r| r.is_finite()) => list
                .split(',')
                .filter_map(|r| r.trim().parse().ok())
                .collect(),
            _ => swept.to_vec(),
        }
    }

    fn sim_args(&self, regime: &Regime) -> Vec<&'static str> {
        let lora: &[&'static str] = if self.lora { &LORA_SIM } else { &[] };
        let load: &[&'static str] = if self.lora {
            &["--lora-load-ms", regime.lora_load_ms]
        } else {
            &[]
        };
        regime.sim.iter().chain(lora).chain(load).copied().collect()
    }
}

/// Every workload. Full cells hold 500 to 640 requests; quick ones about 150. The shared
/// prefix has 16 groups of 40 chats, so each group's first (cold) request is under 3 % of
/// them and cannot decide p90; its sweep starts at light load, where a router that keeps
/// groups on their pods meets the tight SLOs, and passes the perfect-router ceiling's rate
/// (the 95 %-of-ceiling goal needs a swept rate near it). The others run at two rates, below
/// and past ROUND_ROBIN's knee, to fit the time budget.
const WORKLOADS: [Workload; 6] = [
    Workload {
        name: SHARED_PREFIX,
        rates: [&[20.0, 50.0, 80.0, 100.0], &[20.0, 45.0, 65.0, 85.0]],
        quick_rates: [&[30.0, 90.0], &[30.0, 70.0]],
        knee: [62.0, 65.0],
        lora: false,
        requests: |quick, rng| shared_prefix_workload(16, if quick { 10 } else { 40 }, rng),
    },
    Workload {
        name: MULTI_TURN,
        rates: [&[45.0, 60.0], &[40.0, 60.0]],
        quick_rates: [&[60.0], &[60.0]],
        knee: [48.0, 55.0],
        lora: false,
        requests: |quick, rng| {
            let (conversations, turns) = if quick { (24, 6) } else { (32, 16) };
            multi_turn_workload(conversations, turns, rng)
        },
    },
    Workload {
        name: HOT_PREFIX,
        rates: [&[45.0, 65.0], &[40.0, 60.0]],
        quick_rates: [&[60.0], &[60.0]],
        knee: [62.0, 60.0],
        lora: false,
        requests: |quick, rng| hot_prefix_workload(16, if quick { 160 } else { 640 }, 0.3, rng),
    },
    Workload {
        name: MIXED,
        rates: [&[50.0, 75.0], &[35.0, 60.0]],
        quick_rates: [&[60.0], &[50.0]],
        knee: [75.0, 60.0],
        lora: false,
        requests: |quick, rng| mixed_workload(if quick { 150 } else { 600 }, rng),
    },
    Workload {
        name: LORA,
        rates: [&[40.0, 55.0], &[30.0, 50.0]],
        quick_rates: [&[45.0], &[40.0]],
        knee: [52.0, 50.0],
        lora: true,
        requests: |quick, rng| lora_workload(if quick { 150 } else { 600 }, rng),
    },
    Workload {
        name: BURST,
        rates: [&[f64::INFINITY], &[f64::INFINITY]],
        quick_rates: [&[f64::INFINITY], &[f64::INFINITY]],
        knee: [75.0, 60.0],
        lora: false,
        requests: |_, rng| mixed_workload(50, rng),
    },
];

/// Every gateway compared, in the order each (rate, seed) runs them, so drift hits them all
/// alike: the four the goals name on every cell of both regimes and both seeds, and
/// vllm-router (the vLLM project's router) on the shared prefix and the first seed. Other
/// gateways (Envoy RANDOM, other picker configs, SGLang round_robin) are not run here: the
/// full run's time budget leaves them out.
const CONTENDERS: &[(Gateway, Coverage)] = &[
    (Gateway::Envoy("ROUND_ROBIN"), Coverage::Every),
    (Gateway::Envoy("LEAST_REQUEST"), Coverage::Every),
    (Gateway::Picker("default"), Coverage::Every),
    (Gateway::Sglang("cache_aware"), Coverage::Every),
    (
        Gateway::VllmRouter("cache_aware"),
        Coverage::SharedPrefixFirstSeed,
    ),
];

/// Which cells a gateway runs.
#[derive(Clone, Copy, PartialEq)]
enum Coverage {
    Every,
    SharedPrefixFirstSeed,
}

impl Coverage {
    fn runs(self, workload: &str, seed: u64) -> bool {
        self == Coverage::Every || (workload == SHARED_PREFIX && seed == SEEDS[0])
    }
}

const SEEDS: [u64; 2] = [1, 2];

/// Seconds a cell spends besides sending its requests and draining the last ones: 8 pods and
/// a gateway started, the picker's first scrapes, everything stopped (measured: ~1 s for
/// plain Envoy, ~3 s for the picker).
const CELL_OVERHEAD_S: f64 = 2.0;

// The full run's time budget on 2 cores, as `estimate_seconds` works it out (a cell takes
// CELL_OVERHEAD_S + requests / min(rate, knee)): about 3 minutes per gateway, seed and
// regime, so 4 gateways x 2 seeds x 2 regimes take about 50 minutes; `run` prints its own
// estimate before it starts.

/// What one run of a workload measured.
pub struct QualityRun {
    /// Time to first token of each successful request, ms, sorted.
    pub ttft: Vec<f64>,
    /// Time per output token after the first of each successful request, ms, sorted.
    pub tpot: Vec<f64>,
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

/// Poisson arrivals at `rate` drawn from `seed`.
#[derive(Clone, Copy)]
struct Arrivals {
    rate: f64,
    seed: u64,
}

/// Fresh pods started with `sim_args`, the gateway in front of them, `requests` sent with
/// these arrivals; every request asks for [`OUTPUT_TOKENS`].
fn run_seeded(
    gateway: Gateway,
    sim_args: &[&str],
    requests: &[String],
    arrivals: Arrivals,
    headers: &[(&str, &str)],
) -> QualityRun {
    let sims: Vec<Sim> = (1..=8)
        .map(|i| Sim::start(&format!("pod-{i}"), sim_args))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let running = gateway.start(&refs);
    if let Gateway::Picker(_) = gateway {
        for sim in &refs {
            sim.wait_for_scrapes(2);
        }
    }
    let load = open_loop_with(
        &[running.address()],
        requests,
        arrivals.rate,
        arrivals.seed,
        headers,
    );
    let mut picks = BTreeMap::new();
    for e in &load.ok {
        *picks.entry(e.pod.clone()).or_insert(0) += 1;
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    // The client times the whole exchange (`total`) when the stream's last chunk is read,
    // right after the last token's: TPOT = (last byte - first token) / (tokens - 1).
    let per_token = |e: &crate::support::Exchange| {
        (ms(e.total) - ms(e.first_byte)) / (OUTPUT_TOKENS - 1) as f64
    };
    QualityRun {
        ttft: sorted(load.ok.iter().map(|e| ms(e.first_byte)).collect()),
        tpot: sorted(load.ok.iter().map(per_token).collect()),
        elapsed: load.elapsed,
        errors: load.errors,
        hit_rate: prefix_hit_rate(&refs),
        picks,
    }
}

/// Prompt tokens the pods served from their prefix caches over all they were asked for.
pub fn prefix_hit_rate(sims: &[&Sim]) -> f64 {
    let (hits, queries) = prefix_counts(sims);
    if queries > 0.0 {
        hits / queries
    } else {
        0.0
    }
}

/// The pods' prefix-cache counters so far, summed: (prompt tokens served from cache, prompt
/// tokens asked for).
pub fn prefix_counts(sims: &[&Sim]) -> (f64, f64) {
    let (mut hits, mut queries) = (0.0, 0.0);
    for sim in sims {
        let stats = sim.stats();
        hits += stats["prefix_hits"].as_f64().unwrap_or(0.0);
        queries += stats["prefix_queries"].as_f64().unwrap_or(0.0);
    }
    (hits, queries)
}

/// Columns shared with the scale-out table.
pub const TTFT_P50: Column = Column::both("TTFT p50 ms", "ttft_p50_ms");
pub const TTFT_P90: Column = Column::both("TTFT p90 ms", "ttft_p90_ms");
pub const TTFT_P99: Column = Column::both("TTFT p99 ms", "ttft_p99_ms");
pub const ERRORS: Column = Column::both("errors", "errors");
pub const HIT_RATE: Column = Column::both("hit rate", "hit_rate");

/// The cells of [`TTFT_P50`], [`TTFT_P90`] and [`TTFT_P99`].
pub fn ttft_cells(ttft: &Percentiles) -> [Cell; 3] {
    [
        Cell::Measure(ttft.p50, 1),
        Cell::Measure(ttft.p90, 1),
        Cell::Measure(ttft.p99, 1),
    ]
}

/// An offered rate as the tables show it.
pub fn rate_label(rate: f64) -> String {
    if rate.is_finite() {
        format!("{rate:.0}")
    } else {
        "at once".into()
    }
}

/// Requests to the busiest pod over the mean per pod (of all 8, served or not).
pub fn busiest_over_mean(picks_per_pod: &[usize]) -> f64 {
    let total: usize = picks_per_pod.iter().sum();
    let busiest = picks_per_pod.iter().copied().max().unwrap_or(0);
    busiest as f64 * 8.0 / total.max(1) as f64
}

/// One cell: a workload at one rate and seed on one gateway (the CSV's rows).
pub struct CellRow {
    pub regime: &'static str,
    pub workload: &'static str,
    pub rate: f64,
    pub seed: u64,
    pub gateway: String,
    pub sent: usize,
    pub ttft: Percentiles,
    pub tpot: Percentiles,
    pub throughput: f64,
    pub errors: usize,
    pub hit_rate: f64,
    pub picks_per_pod: Vec<usize>,
}

impl Row for CellRow {
    const COLUMNS: &'static [Column] = &[
        Column::csv("regime"),
        Column::csv("workload"),
        Column::csv("rate_per_s"),
        Column::csv("seed"),
        Column::csv("gateway"),
        Column::csv("requests"),
        Column::csv("ttft_p50_ms"),
        Column::csv("ttft_p90_ms"),
        Column::csv("ttft_p99_ms"),
        Column::csv("tpot_p50_ms"),
        Column::csv("tpot_p90_ms"),
        Column::csv("throughput_per_s"),
        Column::csv("errors"),
        Column::csv("hit_rate"),
        Column::csv("picks_per_pod"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.regime.into()),
            Cell::Text(self.workload.into()),
            Cell::Text(rate_label(self.rate)),
            Cell::Count(self.seed as usize),
            Cell::Text(self.gateway.clone()),
            Cell::Count(self.sent),
            Cell::Measure(self.ttft.p50, 1),
            Cell::Measure(self.ttft.p90, 1),
            Cell::Measure(self.ttft.p99, 1),
            Cell::Measure(self.tpot.p50, 2),
            Cell::Measure(self.tpot.p90, 2),
            Cell::Measure(self.throughput, 1),
            Cell::Count(self.errors),
            Cell::Percent(self.hit_rate),
            Cell::Counts(self.picks_per_pod.clone()),
        ]
    }
}

fn intro(quick: bool) -> String {
    let size = if quick {
        "this quick run: ~150 requests per cell, one seed"
    } else {
        "500 to 640 requests per cell, two seeds"
    };
    format!(
        "## 3. Routing quality\n\nTwo regimes of pods, each swept on every workload ({}); \
         every cell starts fresh pods and gateway. Open-loop Poisson arrivals from light load \
         to past saturation ({size}; a seed draws its own arrival times and request order); \
         for each rate and seed every gateway runs in turn. Streaming; TTFT = time to the \
         first token chunk; TPOT = (last byte - first token) / (tokens out - 1); hit rate = \
         prompt tokens served from the pods' prefix caches (their own counters) / prompt \
         tokens.\n\n\
         Workloads: **shared prefix** (groups of chats sharing a ~2,048-token system prompt, \
         ~128-token question each; 16 x 40 in the full run, shuffled); **multi-turn chat** (32 \
         conversations x 16 turns, each turn re-sending the whole history: one of 4 ~512-token \
         system prompts, ~64-token user and assistant messages; round by round, every \
         conversation in the same order); **hot prefix** (the shared-prefix chats over 16 \
         groups, Zipf-sized so one group carries 30 %: affinity alone overloads its pod); \
         **mixed lengths** (unique prompts of 64..3,072 tokens); **LoRA mix** (the same, each \
         for one of 12 adapters, pods with `--max-lora 2` and 40 ms (time-scaled) to load one); \
         **burst** (50 mixed prompts at once).\n\n\
         The tables show each (rate, gateway) over its seeds as the worse seed saw it (higher \
         TTFT and TPOT, lower throughput and hit rate, the more uneven picks); errors are over \
         every seed's requests; `bench/results/3-quality.csv` has every cell.\n\n",
        REGIMES.map(|r| r.name).join(" and ")
    )
}

pub fn run(quick: bool) -> Part {
    let seeds: &[u64] = if quick { &SEEDS[..1] } else { &SEEDS };
    // `BENCH_ONLY=substring` runs the cells whose "regime workload gateway" holds it (tuning).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let plan = plan(seeds, quick, &only);
    let whole = estimate_seconds(&self::plan(seeds, quick, ""), quick);
    println!(
        "quality: 8 pods, open-loop rate sweeps, {} cells of {} gateways on {} seed(s) and {} regimes; about {:.0} minutes (the whole part: {:.0})",
        plan.len(),
        CONTENDERS.len(),
        seeds.len(),
        REGIMES.len(),
        estimate_seconds(&plan, quick).max(0.0) / 60.0,
        whole / 60.0
    );
    let cells = sweep(&plan, quick);
    let mut markdown = intro(quick);
    let mut charts = Vec::new();
    for (index, regime) in REGIMES.iter().enumerate() {
        let mine: Vec<&CellRow> = cells.iter().filter(|c| c.regime == regime.slug).collect();
        if mine.is_empty() {
            continue;
        }
        let points = points(&mine);
        let ceiling = shared_prefix_ceiling(regime, quick);
        let goodput = goodput_rows(&points, &ceiling);
        markdown += &report(index, regime, &points, &goodput, &ceiling);
        charts.extend(regime_charts(regime, &points, &goodput, &ceiling));
    }
    markdown += PEERS;
    markdown += &slo::run(seeds, quick, &only);
    Part {
        markdown,
        csv: csv_table(&cells),
        charts,
    }
}

/// One cell to run: a workload at a rate and seed on a gateway, on one regime's pods.
struct Planned<'w> {
    regime: &'w Regime,
    workload: &'w Workload,
    rate: f64,
    seed: u64,
    gateway: Gateway,
}

/// The sweep's cells in running order: for each regime, workload, rate and seed, every
/// gateway in turn; those whose "regime workload gateway" holds `only`.
fn plan(seeds: &[u64], quick: bool, only: &str) -> Vec<Planned<'static>> {
    let mut cells = Vec::new();
    for (index, regime) in REGIMES.iter().enumerate() {
        for workload in &WORKLOADS {
            for rate in workload.rates(index, quick) {
                for &seed in seeds {
                    for &(gateway, coverage) in CONTENDERS {
                        let chosen =
                            format!("{} {} {}", regime.slug, workload.name, gateway.name());
                        if coverage.runs(workload.name, seed) && chosen.contains(only) {
                            cells.push(Planned {
                                regime,
                                workload,
                                rate,
                                seed,
                                gateway,
                            });
                        }
                    }
                }
            }
        }
    }
    cells
}

/// Runs the planned cells, the requests of each (regime, workload, seed) built once.
fn sweep(plan: &[Planned<'_>], quick: bool) -> Vec<CellRow> {
    let mut requests: BTreeMap<(&str, &str, u64), Vec<String>> = BTreeMap::new();
    plan.iter()
        .map(|cell| {
            let requests = requests
                .entry((cell.regime.slug, cell.workload.name, cell.seed))
                .or_insert_with(|| (cell.workload.requests)(quick, &mut Rng::new(cell.seed)));
            let started = Instant::now();
            let sim_args = cell.workload.sim_args(cell.regime);
            let arrivals = Arrivals {
                rate: cell.rate,
                seed: 10 + cell.seed,
            };
            let run = run_seeded(cell.gateway, &sim_args, requests, arrivals, &[]);
            let row = cell_row(cell, &run);
            print_cell(&row, started.elapsed().as_secs_f64());
            row
        })
        .collect()
}

fn cell_row(cell: &Planned<'_>, run: &QualityRun) -> CellRow {
    CellRow {
        regime: cell.regime.slug,
        workload: cell.workload.name,
        rate: cell.rate,
        seed: cell.seed,
        gateway: cell.gateway.name(),
        sent: run.ttft.len() + run.errors,
        ttft: Percentiles::of(&run.ttft),
        tpot: Percentiles::of(&run.tpot),
        throughput: run.ttft.len() as f64 / run.elapsed,
        errors: run.errors,
        hit_rate: run.hit_rate,
        picks_per_pod: run.picks_per_pod(),
    }
}

/// One line per cell as it finishes, with the seconds it took.
fn print_cell(row: &CellRow, seconds: f64) {
    println!(
        "  {:<8} {:<16} {:>7} seed {} {:<20} TTFT p50 {:>6.0} p90 {:>6.0} p99 {:>6.0} ms  TPOT p50 {:>4.1} ms  {:>5.1} req/s  err {:>3}  hit {:>5.1} %  busiest/mean {:.2}  {seconds:.0} s",
        row.regime,
        row.workload,
        rate_label(row.rate),
        row.seed,
        row.gateway,
        row.ttft.p50,
        row.ttft.p90,
        row.ttft.p99,
        row.tpot.p50,
        row.throughput,
        row.errors,
        row.hit_rate * 100.0,
        busiest_over_mean(&row.picks_per_pod)
    );
}

/// How long the planned cells take: [`CELL_OVERHEAD_S`] each plus its requests sent at its
/// rate, or drained at the workload's knee past it.
fn estimate_seconds(plan: &[Planned<'_>], quick: bool) -> f64 {
    let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
    plan.iter()
        .map(|cell| {
            let workload = cell.workload;
            let regime = REGIMES.iter().position(|r| r.slug == cell.regime.slug);
            let knee = workload.knee[regime.unwrap_or(0)];
            let requests = *sizes
                .entry(workload.name)
                .or_insert_with(|| (workload.requests)(quick, &mut Rng::new(1)).len());
            CELL_OVERHEAD_S + requests as f64 / cell.rate.min(knee)
        })
        .sum()
}

/// What a perfect router could serve on the shared-prefix workload (the first seed's order)
/// on `regime`'s pods.
fn shared_prefix_ceiling(regime: &Regime, quick: bool) -> Ceiling {
    let requests = (WORKLOADS[0].requests)(quick, &mut Rng::new(SEEDS[0]));
    Ceiling::of(&Sim::start("oracle", regime.sim), &requests, regime)
}

/// One regime's section: its pods, a table per workload, goodput, the goals.
fn report(
    index: usize,
    regime: &Regime,
    points: &[Point],
    goodput: &[GoodputRow],
    ceiling: &Ceiling,
) -> String {
    let letter = ['a', 'b'].get(index).copied().unwrap_or('x');
    let mut out = format!(
        "### 3{letter}. On {}\n\n{}\n\n",
        regime.name,
        (regime.description)(regime.sim)
    );
    for workload in &WORKLOADS {
        let rows: Vec<Point> = points
            .iter()
            .filter(|p| p.workload == workload.name)
            .cloned()
            .collect();
        if !rows.is_empty() {
            out += &format!(
                "#### {}, {}\n\n{}\n",
                workload.name,
                regime.slug,
                markdown_table(&rows)
            );
            if has_rate_chart(points, workload.name) {
                out += &format!(
                    "![TTFT p90 against rate, {0}, {2}](results/3-quality-{3}-p90-{1}.svg)\n\n",
                    workload.name,
                    slug(workload.name),
                    regime.name,
                    regime.slug
                );
            }
        }
    }
    out += &format!(
        "#### Goodput, {0}\n\nGoodput: the highest swept rate at which the gateway kept TTFT p90 \
         under the SLO with errors under 1 %, at that rate and every lower one; per rate the \
         worse of the seeds' p90 counts. 0: not even the lowest rate.\n\n{1}\n{2}\n\n{3}\n\
         ![Goodput, shared prefix, {4}](results/3-quality-{0}-goodput.svg)\n\n#### Goals, {0}\n\n{5}\n",
        regime.slug,
        ceiling.explanation,
        goodput::ceiling_note(),
        markdown_table(goodput),
        regime.name,
        goals::all(points, goodput, ceiling)
    );
    out
}

/// What the peers do that the picker does not, and the reverse: design facts, not figures.
const PEERS: &str = "### What the peers do differently\n\n\
    SGLang's router and vllm-router (a fork of it) keep a radix tree of the request text each \
    worker was sent and route to the longest match above 30 % of the text, otherwise to the \
    worker with the fewest requests in flight, counted exactly by the router itself; they read \
    no engine metrics. Their balance rule switches to the least-loaded worker only when \
    `max - min > 64` requests and `max > 1.5 x min` (their documented defaults, which they ran \
    with here): thresholds sized for engines that run hundreds of sequences, which the \
    batching pods do and the 2-slot pods never reach. The picker reads each pod's queue, \
    running count, KV usage and adapters from its metrics, corrected between scrapes by what \
    every Envoy worker placed and saw end (`pool.loadSignals: live`), keeps a prefix index of \
    block hashes learned from its own picks, and lets a prefix go when its pod queues well \
    beyond the shortest candidate (`affinityQueueLimit`), so a hot prefix spills and gets \
    cached on a second pod; a prompt no pod holds any prefix of goes where such a prompt went \
    least recently (`no-hit-lru-scorer` in the shipped configuration); it runs inside Envoy, \
    with no hop, one picker per Envoy across workers. It has no KV-event feed (vllm-router's `kv_aware` needs vLLM's ZMQ events and \
    the model's tokenizer) and no session-hash policy.\n";

fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// One regime's charts: the goodput bars of the shared-prefix workload, and TTFT p90 against
/// rate per workload.
fn regime_charts(
    regime: &Regime,
    points: &[Point],
    goodput: &[GoodputRow],
    ceiling: &Ceiling,
) -> Vec<Chart> {
    let shared: Vec<&GoodputRow> = goodput
        .iter()
        .filter(|g| g.workload == SHARED_PREFIX)
        .collect();
    let names: Vec<&str> = shared.iter().map(|g| g.gateway.as_str()).collect();
    let groups: Vec<(String, Vec<f64>)> = SLOS_MS
        .iter()
        .enumerate()
        .map(|(i, slo)| {
            (
                format!("p90 < {slo:.0} ms"),
                shared.iter().map(|g| g.goodput[i]).collect(),
            )
        })
        .collect();
    let title = format!(
        "Goodput (req/s), shared prefix, {}, by TTFT p90 SLO; perfect-router ceiling {:.0} req/s",
        regime.name, ceiling.rate
    );
    let goodput_chart = bar_chart(&title, &names, &groups);
    let mut charts = vec![Chart::named(
        &format!("-{}-goodput", regime.slug),
        goodput_chart,
    )];
    for workload in &WORKLOADS {
        if has_rate_chart(points, workload.name) {
            let series = p90_by_gateway(points, workload.name);
            let title = format!(
                "TTFT p90 against offered rate, {}, {}",
                workload.name, regime.name
            );
            let svg = line_chart(
                &title,
                "offered rate (req/s)",
                "TTFT p90 (ms, log scale)",
                &series,
            );
            let suffix = format!("-{}-p90-{}", regime.slug, slug(workload.name));
            charts.push(Chart::named(&suffix, svg));
        }
    }
    charts
}

/// Some gateway ran `workload` at more than one rate.
fn has_rate_chart(points: &[Point], workload: &str) -> bool {
    p90_by_gateway(points, workload)
        .iter()
        .any(|(_, line)| line.len() > 1)
}

/// (rate, TTFT p90) per gateway on `workload`, in rate order.
fn p90_by_gateway(points: &[Point], workload: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in points
        .iter()
        .filter(|p| p.workload == workload && p.rate.is_finite())
    {
        match series.iter_mut().find(|(name, _)| *name == p.gateway) {
            Some((_, line)) => line.push((p.rate, p.ttft.p90)),
            None => series.push((p.gateway.clone(), vec![(p.rate, p.ttft.p90)])),
        }
    }
    for (_, line) in &mut series {
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}
