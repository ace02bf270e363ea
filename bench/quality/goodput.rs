//! From cells to what the sweep concludes: each (workload, gateway, rate) over its seeds, the
//! goodput under each TTFT SLO, and the ceiling a perfect router would reach.

use super::{
    busiest_over_mean, rate_label, ttft_cells, CellRow, Regime, SHARED_PREFIX, TTFT_P50, TTFT_P90,
    TTFT_P99,
};
use crate::load::Percentiles;
use crate::report::{Cell, Column, Row};
use crate::support::Sim;
use crate::workloads::{best_hit_rate_of, block_size, flag_value, prompt_tokens, OUTPUT_TOKENS};

/// TTFT p90 SLOs, ms, for goodput.
pub const SLOS_MS: [f64; 6] = [50.0, 100.0, 200.0, 300.0, 500.0, 1000.0];

/// A cell counts toward goodput only with fewer errors than this share of its requests.
pub const MAX_ERROR_SHARE: f64 = 0.01;

/// A (workload, gateway, rate) over its seeds, as the worse seed saw it.
#[derive(Clone)]
pub struct Point {
    pub workload: &'static str,
    pub gateway: String,
    pub rate: f64,
    pub seeds: usize,
    /// Each percentile the higher of the seeds'.
    pub ttft: Percentiles,
    pub tpot: Percentiles,
    /// The lower of the seeds'.
    pub throughput: f64,
    /// Requests sent and failed, all seeds together.
    pub sent: usize,
    pub errors: usize,
    /// The lower of the seeds'.
    pub hit_rate: f64,
    /// The higher of the seeds'.
    pub busiest_over_mean: f64,
}

impl Point {
    pub fn error_share(&self) -> f64 {
        self.errors as f64 / self.sent.max(1) as f64
    }

    /// Errors low enough for the cell to count.
    pub fn served(&self) -> bool {
        self.error_share() < MAX_ERROR_SHARE
    }

    /// Served with TTFT p90 under `slo_ms`.
    pub fn meets(&self, slo_ms: f64) -> bool {
        self.served() && self.ttft.p90 < slo_ms
    }
}

/// The cells grouped by (workload, gateway, rate), in the order they first ran.
pub fn points(cells: &[&CellRow]) -> Vec<Point> {
    let mut points: Vec<Point> = Vec::new();
    for cell in cells {
        let same = |p: &&mut Point| {
            p.workload == cell.workload && p.gateway == cell.gateway && p.rate == cell.rate
        };
        match points.iter_mut().find(same) {
            Some(point) => merge(point, cell),
            None => points.push(first_seed(cell)),
        }
    }
    points
}

fn first_seed(cell: &CellRow) -> Point {
    Point {
        workload: cell.workload,
        gateway: cell.gateway.clone(),
        rate: cell.rate,
        seeds: 1,
        ttft: cell.ttft,
        tpot: cell.tpot,
        throughput: cell.throughput,
        sent: cell.sent,
        errors: cell.errors,
        hit_rate: cell.hit_rate,
        busiest_over_mean: busiest_over_mean(&cell.picks_per_pod),
    }
}

/// Folds another seed's cell into `point`.
fn merge(point: &mut Point, cell: &CellRow) {
    point.seeds += 1;
    point.sent += cell.sent;
    point.errors += cell.errors;
    point.ttft = worse(point.ttft, cell.ttft);
    point.tpot = worse(point.tpot, cell.tpot);
    point.throughput = point.throughput.min(cell.throughput);
    point.hit_rate = point.hit_rate.min(cell.hit_rate);
    point.busiest_over_mean = point
        .busiest_over_mean
        .max(busiest_over_mean(&cell.picks_per_pod));
}

fn worse(a: Percentiles, b: Percentiles) -> Percentiles {
    Percentiles {
        p50: a.p50.max(b.p50),
        p90: a.p90.max(b.p90),
        p99: a.p99.max(b.p99),
    }
}

impl Row for Point {
    const COLUMNS: &'static [Column] = &[
        Column::markdown("rate req/s"),
        Column::markdown("gateway").left(),
        TTFT_P50,
        TTFT_P90,
        TTFT_P99,
        Column::markdown("TPOT p50 ms"),
        Column::markdown("TPOT p90 ms"),
        Column::markdown("throughput req/s"),
        Column::markdown("errors"),
        Column::markdown("hit rate"),
        Column::markdown("busiest pod / mean"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![
            Cell::Text(rate_label(self.rate)),
            Cell::Text(self.gateway.clone()),
        ];
        cells.extend(ttft_cells(&self.ttft));
        cells.extend([
            Cell::Measure(self.tpot.p50, 2),
            Cell::Measure(self.tpot.p90, 2),
            Cell::Measure(self.throughput, 1),
            Cell::Percent(self.error_share()),
            Cell::Percent(self.hit_rate),
            Cell::Measure(self.busiest_over_mean, 2),
        ]);
        cells
    }
}

/// The highest swept rate of `points` (one workload and gateway) at which the gateway, there and
/// at every lower rate, kept TTFT p90 under `slo_ms` with errors under 1 %; 0 if none.
pub fn goodput(points: &[&Point], slo_ms: f64) -> f64 {
    let mut by_rate: Vec<&&Point> = points.iter().filter(|p| p.rate.is_finite()).collect();
    by_rate.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    by_rate
        .iter()
        .take_while(|p| p.meets(slo_ms))
        .last()
        .map_or(0.0, |p| p.rate)
}

/// A gateway's goodput on a workload at every SLO.
pub struct GoodputRow {
    pub workload: &'static str,
    pub gateway: String,
    /// Per [`SLOS_MS`].
    pub goodput: Vec<f64>,
    /// The goodput at 500 ms over the ceiling (shared prefix only).
    pub ceiling_share: Option<f64>,
}

impl GoodputRow {
    /// The goodput at `slo_ms`, one of [`SLOS_MS`].
    pub fn at(&self, slo_ms: f64) -> f64 {
        SLOS_MS
            .iter()
            .position(|&s| s == slo_ms)
            .map_or(f64::NAN, |i| self.goodput[i])
    }
}

/// The SLO whose goodput is compared with the ceiling.
pub const CEILING_SLO_MS: f64 = 500.0;

impl Row for GoodputRow {
    const COLUMNS: &'static [Column] = &[
        Column::markdown("workload").left(),
        Column::markdown("gateway").left(),
        Column::markdown("p90 < 50 ms"),
        Column::markdown("< 100 ms"),
        Column::markdown("< 200 ms"),
        Column::markdown("< 300 ms"),
        Column::markdown("< 500 ms"),
        Column::markdown("< 1 s"),
        Column::markdown("share of ceiling at 500 ms"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![
            Cell::Text(self.workload.into()),
            Cell::Text(self.gateway.clone()),
        ];
        cells.extend(self.goodput.iter().map(|&g| Cell::Fixed(g, 0)));
        cells.push(match self.ceiling_share {
            Some(share) => Cell::Percent(share),
            None => Cell::Text(String::new()),
        });
        cells
    }
}

/// Goodput rows of every swept workload and gateway.
pub fn goodput_rows(points: &[Point], ceiling: &Ceiling) -> Vec<GoodputRow> {
    let mut pairs: Vec<(&'static str, &str)> = Vec::new();
    for p in points.iter().filter(|p| p.rate.is_finite()) {
        if !pairs.contains(&(p.workload, p.gateway.as_str())) {
            pairs.push((p.workload, &p.gateway));
        }
    }
    pairs
        .into_iter()
        .map(|(workload, gateway)| {
            let mine: Vec<&Point> = points
                .iter()
                .filter(|p| p.workload == workload && p.gateway == gateway)
                .collect();
            let goodput: Vec<f64> = SLOS_MS
                .iter()
                .map(|&slo| self::goodput(&mine, slo))
                .collect();
            let at_500 = goodput[SLOS_MS
                .iter()
                .position(|&s| s == CEILING_SLO_MS)
                .unwrap_or(0)];
            GoodputRow {
                workload,
                gateway: gateway.to_string(),
                ceiling_share: (workload == SHARED_PREFIX).then(|| at_500 / ceiling.rate),
                goodput,
            }
        })
        .collect()
}

/// Decode steps slow down by this share per running sequence (the simulator's
/// `decode_step`, `examples/model-server-sim/server.rs`; not a flag).
const BATCH_SLOWDOWN: f64 = 0.02;

/// Pods behind every gateway.
const PODS: f64 = 8.0;

/// The rate the pods could serve on a workload under a perfect router, from the simulator's
/// timing model and the regime's pod flags: every request prefills only what the best
/// achievable hit rate leaves uncached, and every pod runs as many sequences as it can.
pub struct Ceiling {
    pub rate: f64,
    pub best_hit: f64,
    /// How the rate was worked out, with this run's figures.
    pub explanation: String,
}

impl Ceiling {
    /// The ceiling on `requests`, tokenized by `sim` (a pod like the regime's).
    pub fn of(sim: &Sim, requests: &[String], regime: &Regime) -> Ceiling {
        let prompts = prompt_tokens(sim, requests);
        let best_hit = best_hit_rate_of(&prompts, block_size(sim));
        let total: usize = prompts.iter().map(Vec::len).sum();
        let prompt = total as f64 / prompts.len().max(1) as f64;
        let uncached = prompt * (1.0 - best_hit);
        let (rate, working) = if regime.batching() {
            batching_rate(regime.sim, prompt, uncached, OUTPUT_TOKENS as f64)
        } else {
            slots_rate(regime.sim, uncached, OUTPUT_TOKENS as f64)
        };
        let explanation = format!(
            "**Ceiling** (shared prefix): a perfect router serves {:.1} % of prompt tokens from \
             cache (the best achievable: each group's first request misses), so a request of \
             {prompt:.0} prompt tokens on average prefills {uncached:.0} of them; {working} = \
             **{rate:.1} req/s**.\n",
            best_hit * 100.0,
        );
        Ceiling {
            rate,
            best_hit,
            explanation,
        }
    }
}

/// Slot pods: every slot busy, a request's uncached prefill then its decode steps, each as
/// slow as with every slot busy.
fn slots_rate(flags: &[&str], uncached: f64, output: f64) -> (f64, String) {
    let flag = |name| flag_value(flags, name);
    let (scale, slots) = (flag("--time-scale"), flag("--max-num-seqs"));
    let prefill_ms = uncached * flag("--prefill-us-per-token") / 1000.0 * scale;
    let step_ms = flag("--decode-ms-per-token") * (1.0 + BATCH_SLOWDOWN * slots) * scale;
    let request_ms = prefill_ms + output * step_ms;
    let rate = PODS * slots * 1000.0 / request_ms;
    let working = format!(
        "prefill {prefill_ms:.1} ms, then {output:.0} tokens at {step_ms:.2} ms each (every slot \
         busy, time-scaled): {request_ms:.1} ms a request, {PODS:.0} pods x {slots:.0} slots / that"
    );
    (rate, working)
}

/// Batching pods: a full batch of B sequences (`--max-num-seqs`, or fewer if their
/// unshared KV does not fit) where each step samples one token for every sequence and
/// also prefills the uncached prompt tokens of the requests that replace finished ones,
/// so a step lasts `fixed + per token x B (1 + uncached / output) + per context token x B x
/// mean context` (context: the prompt and half the output).
fn batching_rate(flags: &[&str], prompt: f64, uncached: f64, output: f64) -> (f64, String) {
    let flag = |name| flag_value(flags, name);
    let kv_tokens = flag("--kv-blocks") * 16.0;
    let batch = flag("--max-num-seqs").min((kv_tokens / (uncached + output)).floor());
    let context = prompt + output / 2.0;
    let step_ms = flag("--step-fixed-ms")
        + batch
            * (flag("--step-ms-per-token") * (1.0 + uncached / output)
                + flag("--step-ms-per-context-token") * context);
    let scaled_ms = step_ms * flag("--time-scale");
    let rate = PODS * batch * 1000.0 / (output * scaled_ms);
    let working = format!(
        "batches of {batch:.0} sequences, steps of {scaled_ms:.1} ms (time-scaled) each sampling \
         a token for every sequence, {output:.0} steps a request: {PODS:.0} pods x {batch:.0} / \
         ({output:.0} x {scaled_ms:.1} ms)"
    );
    (rate, working)
}

/// What the ceiling leaves out.
pub fn ceiling_note() -> &'static str {
    "It leaves out queueing (Poisson arrivals at a pod's capacity queue without bound), the \
     time between a slot freeing and the next request arriving, and HTTP and Envoy overheads, \
     so no router reaches it under a TTFT SLO; goodput is also a swept rate, so the share shows \
     the highest rate swept below the ceiling at best."
}
