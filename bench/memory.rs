//! Part 4, memory: Envoy's RSS and the VMs' memory at 8 / 256 / 1,024 endpoints as the prefix
//! index fills; and large pools (1,024 / 4,096 / 16,384 endpoints): configuration time, scrape
//! rounds against the interval, freshness, errors, memory and the admin port's responsiveness.

use crate::load::{all_of, closed_loop_over, percentile, sorted};
use crate::procfs::rss_mib;
use crate::report::{csv_table, goal, joined, markdown_table, Cell, Column, Part, Row};
use crate::setup::filter_stat;
use crate::support::{with_addresses, Envoy, EnvoyConfig, SimPool};
use crate::workloads::{distinct_completions, distinct_completions_from};
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
/// The prefix scorer's counter of the most (block, pod) entries its index held.
const INDEX_ENTRIES_STAT: &str = "plugin.prefix-cache-scorer.index_entries_peak";
/// Issue 43's goals for the prefix index.
const MAX_BYTES_PER_ENTRY: f64 = 64.0;
const FULL_PHASE_SHARE: f64 = 0.01;
/// The budget row: pods, prompts of 1,000 blocks each (`maxPrefixBlocksToMatch` lets them
/// all count), and the largest `lruCapacityPerServer` the config accepts, so the pods'
/// capacities add up to 64 times the budget.
const BUDGET_ENDPOINTS: usize = 64;
const BUDGET_PROMPT_CHARS: usize = 64_000;
const BUDGET_PROMPT_BLOCKS: usize = BUDGET_PROMPT_CHARS / 64;
const BUDGET_CAPACITY: usize = inference_picker_core::limits::LRU_CAPACITY_PER_SERVER.max as usize;
const BUDGET: usize = inference_picker_core::limits::PREFIX_INDEX_ENTRIES;
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
         (picks are spread at random among equals, so some pods fill only in a later phase: \
         the index is full from the first phase after which the prefix scorer's \
         `index_entries_peak` counter reads every VM's whole share, and the goals judge \
         the phases after that one). VM \
         memory is the filter's `vm_memory_bytes` gauge (the linear memory of every VM of the \
         plugin, summed; wasm memory grows and never shrinks, so it is a high-water mark); per \
         VM divides by the VMs that route (the workers; the main thread's VM stays idle). If the \
         index were unbounded, every phase would add about as much as the first. The last \
         row is the budget's: {BUDGET_ENDPOINTS} pods at the largest `lruCapacityPerServer` \
         the config accepts ({BUDGET_CAPACITY}, so the pods could hold {BUDGET_ENDPOINTS} times \
         the index's budget of {BUDGET} entries per VM), prompts of {BUDGET_PROMPT_CHARS} \
         characters ({BUDGET_PROMPT_BLOCKS} blocks, all matched), each phase enough for twice \
         the budget.\n\n"
    )
}

fn picker_config(capacity: usize) -> String {
    picker_config_matching(capacity, 256)
}

fn picker_config_matching(capacity: usize, max_blocks: usize) -> String {
    format!(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  parameters: {{blockSizeTokens: 16, maxPrefixBlocksToMatch: {max_blocks}, lruCapacityPerServer: {capacity}, autoTune: false}}
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
    /// `lruCapacityPerServer` as configured.
    capacity: usize,
    /// The (block, pod) entries one VM's index holds when full: the pods' capacities, or the
    /// budget's share of each when they exceed it.
    full_per_vm: usize,
    requests: usize,
    /// Idle, then after each phase: Envoy's RSS and the VMs' memory, MiB.
    rss: Vec<f64>,
    vm_total: Vec<f64>,
    vms: f64,
    /// After each phase: (block, pod) entries the prefix indexes held at most, summed over
    /// the VMs.
    index_entries: Vec<f64>,
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

    fn entries_at_end(&self) -> f64 {
        self.index_entries.last().copied().unwrap_or(f64::NAN)
    }

    /// The phases after which every VM's index held all the blocks its pods may hold.
    fn full_after(&self) -> Option<usize> {
        full_after(&self.index_entries, self.full_per_vm as f64 * self.vms)
    }
}

/// The number of phases after which the entries counted reached `full` (1 for the first).
fn full_after(entries: &[f64], full: f64) -> Option<usize> {
    entries.iter().position(|&e| e >= full).map(|at| at + 1)
}

impl Row for MemoryRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("endpoints", "endpoints"),
        Column::both("lruCapacityPerServer", "lru_capacity_per_server"),
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
        Column::both(
            "index entries (all VMs) after each phase",
            "index_entries_per_phase",
        )
        .left(),
        Column::both("index full after phase", "full_after_phase"),
        Column::markdown("per routing VM MiB at the end"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Count(self.endpoints),
            Cell::Count(self.capacity),
            Cell::Count(self.requests),
            Cell::Series(self.rss.clone(), 0),
            Cell::Series(self.vm_total.clone(), 1),
            Cell::Fixed(self.vms, 0),
            Cell::Series(self.index_entries.clone(), 0),
            self.full_after()
                .map_or(Cell::Text("never".into()), Cell::Count),
            Cell::Fixed(self.vm_at_end() / self.routing_vms(), 1),
            Cell::Count(self.errors),
        ]
    }
}

pub fn run(quick: bool) -> Part {
    println!("memory: Envoy RSS and wasm VM memory with 8 / 256 / 1,024 endpoints");
    // `BENCH_POOLS=4096` runs only those large pools (a trial: main writes no report).
    let only: Vec<usize> = std::env::var("BENCH_POOLS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    // `BENCH_INDEX_POOLS=256,budget` runs only those index rows (a trial too).
    let index_trial = std::env::var("BENCH_INDEX_POOLS").unwrap_or_default();
    let index_only: Vec<usize> = index_trial
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let sizes: &[usize] = match (only.is_empty(), quick) {
        _ if !index_trial.is_empty() => &index_only,
        (false, _) => &[],
        (true, true) => &[8, 256],
        (true, false) => &[8, 256, 1024],
    };
    let mut rows: Vec<MemoryRow> = sizes.iter().map(|&n| measure(n)).collect();
    let index_goals = bounded_index_goal(&rows)
        + &compact_index_goals(&rows)
        + &rows.last().map(cost_per_block).unwrap_or_default();
    let run_budget = if index_trial.is_empty() {
        only.is_empty() && !quick
    } else {
        index_trial.split(',').any(|t| t.trim() == "budget")
    };
    let budget = run_budget.then(measure_budget);
    let budget_text = budget_goal(budget.as_ref().map(|(row, log)| (row, log.as_str())));
    rows.extend(budget.map(|(row, _)| row));
    println!("memory: large pools");
    let trial = !only.is_empty() || !index_trial.is_empty();
    let pools: Vec<usize> = if !index_trial.is_empty() {
        Vec::new()
    } else if !only.is_empty() {
        only
    } else if quick {
        LARGE_POOLS[..1].to_vec()
    } else {
        LARGE_POOLS.to_vec()
    };
    // The quick run lets the pool settle for less, so `make bench-quick` stays short.
    let settle = if quick { SETTLE / 3 } else { SETTLE };
    let mut large: Vec<PoolRow> = pools
        .iter()
        .map(|&n| measure_pool(n, SimPool::PER_PROCESS, settle))
        .collect();
    // The same pool in one simulator process, as it was first tried: what the process adds.
    if !quick && !trial && pools.contains(&PACED_AT) {
        large.push(measure_pool(PACED_AT, PACED_AT, settle));
    }
    let (large_table, large_csv) = (markdown_table(&large), csv_table(&large));
    let (spread, one_process): (Vec<PoolRow>, Vec<PoolRow>) =
        large.into_iter().partition(PoolRow::spread);
    Part {
        markdown: format!(
            "{}{}\n{}{}{}{}\n{}{}",
            intro(),
            markdown_table(&rows),
            index_goals,
            budget_text,
            large_intro(settle),
            large_table,
            large_pool_goals(&spread),
            under_load_goal(&spread, &one_process)
        ),
        csv: csv_table(&rows) + "\n" + &large_csv,
        charts: Vec::new(),
    }
}

/// How the large pools are measured; `settle` is the scraping before the requests.
fn large_intro(settle: Duration) -> String {
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|text| text.trim().parse::<usize>().ok());
    let limit = pid_max.map_or("an unknown number of".to_string(), |n| n.to_string());
    format!(
        "\n### Large pools\n\nThe shipped `envoy/envoy.yaml` (scrapes through their own \
         `inference_picker_metrics` cluster, `maxScrapesInFlight` 128), Envoy \
         `--concurrency 2`, the picker above scraping every second (staleness threshold 5 s), N \
         simulated pods spread over processes of {} (as pods on several nodes would be; the \
         full run adds {PACED_AT} pods in one process, as the pool was first tried, to show \
         what one simulator process adds). After Envoy is ready, {} s of scraping, then \
         {POOL_REQUESTS} requests (8 clients, distinct 200-character prompts); all along the \
         admin port is asked for `GET /stats` every {} s, and the filter's gauges are read. \
         Configure: the slowest VM's own `configured with N endpoints in X ms` log line \
         (loading, building, defining the stats). All fresh: from Envoy ready until every \
         endpoint had fresh metrics. Round: the `scrape_round_ms` gauge (the last complete \
         round, from its tick to its last answer), median and max of the samples once a round \
         completed. Fresh: the `endpoints_fresh` gauge over N, lowest sample after all were \
         fresh and at the end. Scrape failures: the endpoints' `scrape_failure` counters summed \
         (`unsent`: refused by the host); overflows: the metrics cluster's \
         `upstream_cx_overflow` and `upstream_rq_pending_overflow`. Warning lines: the filter's \
         warnings in Envoy's log for the whole run. Beyond {KEEP_ALIVE_LIMIT} endpoints the \
         metrics cluster closes each scrape's connection (`max_requests_per_connection: 1`): \
         the simulator runs a thread per listener and per connection, so N kept-alive scrape \
         connections take 2N threads, against this machine's limit of {limit} tasks \
         (`kernel.pid_max`); the shipped config keeps them alive.\n\n",
        SimPool::PER_PROCESS,
        settle.as_secs(),
        ADMIN_EVERY.as_secs(),
    )
}

/// What the pods' Envoy does between start and the end of the load.
const SETTLE: Duration = Duration::from_secs(30);
/// How often the admin port is asked for `/stats` (each answer lists five stats per endpoint).
const ADMIN_EVERY: Duration = Duration::from_secs(2);
const POOL_REQUESTS: usize = 2000;
/// Beyond this many pods, scrape connections are closed after each scrape (see `large_intro`).
const KEEP_ALIVE_LIMIT: usize = 8192;

struct PoolRow {
    endpoints: usize,
    /// Pods per simulator process.
    per_process: usize,
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
    fn sim_processes(&self) -> usize {
        self.endpoints.div_ceil(self.per_process.max(1))
    }

    /// Pods spread as on several nodes: the rows the goals judge.
    fn spread(&self) -> bool {
        self.per_process == SimPool::PER_PROCESS
    }

    /// When every endpoint was first fresh, the lowest share after, and the share at the end.
    fn freshness(&self) -> String {
        let reached = if self.all_fresh_s.is_nan() {
            "never all fresh".to_string()
        } else {
            format!(
                "all fresh after {:.1} s, lowest {:.1} % after",
                self.all_fresh_s,
                self.fresh_min * 100.0
            )
        };
        format!("{reached}, end {:.1} %", self.fresh_end * 100.0)
    }

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
        Column::both("simulator processes", "sim_processes"),
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
            Cell::Count(self.sim_processes()),
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

/// Issue 12's large pools ("1,024, 4,096 and 16,384 endpoints: ... errors (goal: 0)"), its
/// pool size for "all scraped and none starved", and its configuration goal: the pool size
/// and the reading of "well under a second" (ms).
const LARGE_POOLS: [usize; 3] = [1024, 4096, 16384];
const PACED_AT: usize = 4096;
const CONFIGURED_AT: usize = 20_000;
const CONFIGURE_GOAL_MS: f64 = 500.0;

/// Scraped and never starved: every endpoint fresh within the settle time, and every sample
/// after that and the last one all fresh.
fn paced_verdict(row: &PoolRow) -> Option<bool> {
    if row.all_fresh_s.is_nan() {
        return Some(false);
    }
    if !(row.fresh_min.is_finite() && row.fresh_end.is_finite()) {
        return None;
    }
    Some(row.fresh_min >= 1.0 && row.fresh_end >= 1.0)
}

/// Configuring [`CONFIGURED_AT`] endpoints under [`CONFIGURE_GOAL_MS`]: judged on pools that
/// large; a smaller pool already over it misses it too (configuring grows with the endpoints);
/// otherwise not measured.
fn configure_verdict(rows: &[PoolRow]) -> Option<bool> {
    let under = |r: &PoolRow| {
        r.configure_ms
            .is_finite()
            .then_some(r.configure_ms < CONFIGURE_GOAL_MS)
    };
    let large: Vec<&PoolRow> = rows
        .iter()
        .filter(|r| r.endpoints >= CONFIGURED_AT)
        .collect();
    if rows
        .iter()
        .any(|r| r.endpoints < CONFIGURED_AT && under(r) == Some(false))
    {
        return Some(false);
    }
    if large.is_empty() {
        return None;
    }
    all_of(large.into_iter().map(under))
}

/// No errors at any of [`LARGE_POOLS`]: not measured where a size did not run or its scrape
/// counters were missing.
fn errors_verdict(rows: &[PoolRow]) -> Option<bool> {
    all_of(LARGE_POOLS.iter().map(|&n| {
        let row = rows.iter().find(|r| r.endpoints == n)?;
        row.scrape_failures
            .is_finite()
            .then_some(row.errors == 0 && row.scrape_failures == 0.0)
    }))
}

/// "N, M not run; " for the sizes a goal names that this run did not measure.
fn not_run(rows: &[PoolRow], sizes: &[usize]) -> String {
    let missing: Vec<String> = sizes
        .iter()
        .filter(|&&n| rows.iter().all(|r| r.endpoints != n))
        .map(usize::to_string)
        .collect();
    if missing.is_empty() {
        String::new()
    } else {
        format!("{} not run; ", missing.join(", "))
    }
}

/// Issue 26's: "4,096 endpoints with the shipped Envoy config under request load: no request
/// lost, every endpoint fresh", judged on the pods spread over processes; the same pool in one
/// simulator process (how it was first tried) follows, to tell the simulator's share from ours.
fn under_load_goal(spread: &[PoolRow], one_process: &[PoolRow]) -> String {
    let outcome = |r: &PoolRow| {
        format!(
            "{} simulator process(es): {} of {} requests lost, {}, scrape rounds {:.0} ms median",
            r.sim_processes(),
            r.errors,
            r.requests,
            r.freshness(),
            r.round_median()
        )
    };
    let row = spread.iter().find(|r| r.endpoints == PACED_AT);
    // A lost request misses the goal whatever the freshness figures say.
    let verdict = row.and_then(|r| {
        if r.errors > 0 {
            Some(false)
        } else {
            paced_verdict(r)
        }
    });
    let mut text = goal(
        &format!(
            "{PACED_AT} endpoints with the shipped Envoy config under request load: no request \
             lost, every endpoint fresh"
        ),
        verdict,
        &row.map_or(format!("{PACED_AT} not run"), outcome),
    );
    for r in one_process.iter().filter(|r| r.endpoints == PACED_AT) {
        text += &format!(
            "- The same {PACED_AT} pods in one simulator process (the first reproduction): {}; \
             Envoy, its config and the picker are the same as in the goal's row: only how the pods \
             are split over simulator processes differs.\n",
            outcome(r)
        );
    }
    text
}

fn large_pool_goals(rows: &[PoolRow]) -> String {
    let listed = |f: &dyn Fn(&PoolRow) -> String| -> String {
        rows.iter()
            .map(|r| format!("{}: {}", r.endpoints, f(r)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let errors = goal(
        &format!(
            "errors: 0 (client requests and scrapes) at {} and {} endpoints",
            LARGE_POOLS[..2]
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            LARGE_POOLS[2]
        ),
        errors_verdict(rows),
        &format!(
            "{}{}",
            not_run(rows, &LARGE_POOLS),
            listed(&|r| {
                format!(
                    "{} request errors, {:.0} scrape failures",
                    r.errors, r.scrape_failures
                )
            })
        ),
    );
    let paced = rows.iter().find(|r| r.endpoints == PACED_AT);
    let fresh = goal(
        &format!("{PACED_AT} endpoints are all scraped and none is starved"),
        paced.and_then(paced_verdict),
        &format!(
            "{}{}",
            not_run(rows, &[PACED_AT]),
            listed(&PoolRow::freshness)
        ),
    );
    let configure = goal(
        &format!(
            "configuring {CONFIGURED_AT} endpoints takes well under a second per VM (read as under {CONFIGURE_GOAL_MS:.0} ms)"
        ),
        configure_verdict(rows),
        &format!(
            "{}{}",
            match (
                rows.iter().any(|r| r.endpoints >= CONFIGURED_AT),
                configure_verdict(rows),
            ) {
                (true, _) => String::new(),
                (false, Some(false)) => format!(
                    "{CONFIGURED_AT} not configured in Envoy in this run, a smaller pool already \
                     took longer; "
                ),
                (false, _) => format!("{CONFIGURED_AT} not configured in Envoy in this run; "),
            },
            listed(&|r| format!("{:.0} ms", r.configure_ms))
        ),
    );
    format!("{errors}{fresh}{configure}")
}

/// A filter counter or gauge summed over every endpoint (`/stats?filter=...<suffix>$`); NaN
/// when Envoy lists none (no figure, not zero).
fn endpoint_stat_sum(envoy: &Envoy, suffix: &str) -> f64 {
    let values: Vec<f64> = envoy
        .admin_get(&format!(
            "/stats?filter=inference_picker\\.endpoint\\..*\\.{suffix}$"
        ))
        .text()
        .lines()
        .filter_map(|l| {
            l.rsplit_once(": ")
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        })
        .collect();
    if values.is_empty() {
        f64::NAN
    } else {
        values.iter().sum()
    }
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

fn measure_pool(endpoints: usize, per_process: usize, settle: Duration) -> PoolRow {
    let pods = SimPool::start_in(endpoints, per_process);
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
    if errors > 0 {
        let mut statuses = std::collections::BTreeMap::new();
        for result in results.iter().filter(|e| e.status != 200) {
            *statuses.entry(result.status).or_insert(0) += 1;
        }
        println!("  {endpoints} endpoints, failed requests by status: {statuses:?}");
    }
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
    let log = envoy.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[warning]") && l.contains("inference-picker"))
        .collect();
    let warning_lines = warnings.len();
    // The first few, on the console: the table counts them, the reader wants to know what.
    for line in warnings.iter().take(3) {
        println!("  {endpoints} endpoints, warning: {line}");
    }
    let overflows = ["upstream_cx_overflow", "upstream_rq_pending_overflow"]
        .iter()
        .map(|o| envoy_stat(&envoy, &format!("cluster.inference_picker_metrics.{o}")))
        .sum();
    let row = PoolRow {
        endpoints,
        per_process,
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
    // Enough distinct prompts to fill every pod's share of the index, twice over.
    let per_phase = (endpoints * INDEX_CAPACITY).div_ceil(BLOCKS_PER_PROMPT) * 2;
    fill(Fill {
        endpoints,
        capacity: INDEX_CAPACITY,
        full_per_vm: endpoints * INDEX_CAPACITY,
        max_blocks: 256,
        prompt_chars: PROMPT_CHARS,
        per_phase,
    })
    .0
}

/// The budget row: the pods' configured capacities far above the budget; each phase sends
/// prompts enough for twice the budget. Also returns Envoy's log.
fn measure_budget() -> (MemoryRow, String) {
    fill(Fill {
        endpoints: BUDGET_ENDPOINTS,
        capacity: BUDGET_CAPACITY,
        full_per_vm: BUDGET / BUDGET_ENDPOINTS * BUDGET_ENDPOINTS,
        max_blocks: BUDGET_PROMPT_BLOCKS,
        prompt_chars: BUDGET_PROMPT_CHARS,
        per_phase: BUDGET.div_ceil(BUDGET_PROMPT_BLOCKS) * 2,
    })
}

/// One index row's run: `PHASES` phases of `per_phase` distinct prompts.
struct Fill {
    endpoints: usize,
    capacity: usize,
    full_per_vm: usize,
    max_blocks: usize,
    prompt_chars: usize,
    per_phase: usize,
}

fn fill(run: Fill) -> (MemoryRow, String) {
    let pods = SimPool::start(run.endpoints);
    let addresses: Vec<&str> = pods.addresses.iter().map(String::as_str).collect();
    let envoy = Envoy::start(
        &with_addresses(
            &picker_config_matching(run.capacity, run.max_blocks),
            &addresses,
        ),
        2,
    );
    // Two scrape rounds, so every endpoint has metrics and stats.
    std::thread::sleep(Duration::from_millis(2500));
    let (mut rss, mut vm_total, mut index_entries) = (Vec::new(), Vec::new(), Vec::new());
    let mut record = |(r, v): (f64, f64)| {
        rss.push(r);
        vm_total.push(v);
    };
    record(snapshot(&envoy));
    let mut errors = 0;
    for phase in 0..PHASES {
        // One phase's prompts at a time: the budget row's are hundreds of megabytes.
        let bodies =
            distinct_completions_from(phase * run.per_phase, run.per_phase, run.prompt_chars);
        let results = closed_loop_over(&envoy.address(), 8, bodies.len(), &|n| bodies[n].as_str());
        errors += bodies.len() - results.iter().filter(|e| e.status == 200).count();
        record(snapshot(&envoy));
        index_entries.push(filter_stat(&envoy, INDEX_ENTRIES_STAT));
    }
    let row = MemoryRow {
        endpoints: run.endpoints,
        capacity: run.capacity,
        full_per_vm: run.full_per_vm,
        requests: run.per_phase * PHASES,
        rss,
        vm_total,
        vms: filter_stat(&envoy, "vms"),
        index_entries,
        errors,
    };
    println!(
        "  {:>5} endpoints, capacity {}: RSS {:.0?} MiB; VM memory {:.1?} MiB over {} VMs; index entries {:.0?}",
        row.endpoints, row.capacity, row.rss, row.vm_total, row.vms, row.index_entries
    );
    (row, envoy.log())
}

/// Issue 5's goal ("the index is bounded by its configured capacity"), judged on what each
/// phase added to the VMs' memory: once every pod's share is full (after `full_after`
/// phases), each later phase adds under a tenth of what the first added. Not measured with
/// an index never full, no phase after it, a missing figure, or nothing added at all (zero
/// against zero).
fn bounded_verdict(growth: &[f64], full_after: Option<usize>) -> Option<bool> {
    bounded_within(growth, full_after, 0.1)
}

/// As [`bounded_verdict`], each later phase under `share` of what the first added.
fn bounded_within(growth: &[f64], full_after: Option<usize>, share: f64) -> Option<bool> {
    let (Some(&first), Some(later)) = (growth.first(), growth.get(full_after?..)) else {
        return None;
    };
    if later.is_empty() || growth.iter().any(|g| !g.is_finite()) {
        return None;
    }
    if first == 0.0 && later.iter().all(|&g| g == 0.0) {
        return None;
    }
    Some(later.iter().all(|&g| g < first * share))
}

/// Issue 43's goals for the prefix index: bytes per indexed (block, pod) entry at 1,024
/// endpoints (all the VMs grew by, over the entries their indexes held: an upper figure, as
/// everything else the VMs allocated counts too), no growth once full, and the budget.
fn compact_index_goals(rows: &[MemoryRow]) -> String {
    let at_1024 = rows.iter().find(|r| r.endpoints == 1024);
    let per_entry = at_1024.map(|r| {
        let grown = r.vm_at_end() - r.vm_total.first().copied().unwrap_or(f64::NAN);
        (grown * MIB / r.entries_at_end(), r.entries_at_end())
    });
    let bytes = match per_entry {
        Some((bytes, entries)) if bytes.is_finite() && entries > 0.0 => format!(
            "{bytes:.0} bytes per entry: the VMs grew by {:.1} MiB for {entries:.0} entries",
            at_1024.map_or(f64::NAN, |r| r.vm_at_end()
                - r.vm_total.first().copied().unwrap_or(f64::NAN))
        ),
        _ => "1024 endpoints not run or no entries counted".into(),
    };
    let bytes_met = per_entry
        .filter(|(bytes, entries)| bytes.is_finite() && *entries > 0.0)
        .map(|(bytes, _)| bytes <= MAX_BYTES_PER_ENTRY);
    let growth: Vec<String> = rows
        .iter()
        .map(|r| {
            let growth = r.growth_per_phase();
            format!(
                "{} endpoints: {} MiB (1 % of the first: {:.2})",
                r.endpoints,
                joined(&growth, 1, ", "),
                growth
                    .first()
                    .map_or(f64::NAN, |first| first * FULL_PHASE_SHARE)
            )
        })
        .collect();
    goal(
        &format!("Prefix index: <= {MAX_BYTES_PER_ENTRY:.0} bytes per indexed (block, pod) entry at 1,024 endpoints"),
        bytes_met,
        &bytes,
    ) + &goal(
        "once full, each phase adds < 1 % of the first phase's growth",
        all_of(
            rows.iter()
                .map(|r| bounded_within(&r.growth_per_phase(), r.full_after(), FULL_PHASE_SHARE)),
        ),
        &growth.join("; "),
    )
}

fn bounded_index_goal(rows: &[MemoryRow]) -> String {
    let figures: Vec<String> = rows
        .iter()
        .map(|r| {
            let growth = r.growth_per_phase();
            format!(
                "{} endpoints, growth per phase: {} MiB (a tenth of the first: {:.2})",
                r.endpoints,
                joined(&growth, 1, ", "),
                growth.first().map_or(f64::NAN, |first| first / 10.0)
            )
        })
        .collect();
    goal(
        "the prefix index is bounded by its configured capacity (every phase after the \
         index is full adds under a tenth of what the first added)",
        all_of(
            rows.iter()
                .map(|r| bounded_verdict(&r.growth_per_phase(), r.full_after())),
        ),
        &figures.join("; "),
    )
}

/// Issue 43's budget goal, from the budget row: every VM's index stopped at the budget (and
/// reached it, or nothing was tested), memory stopped growing once it did, and the log named
/// both the budget and the configured capacity. Not measured without the row or a full index.
fn budget_goal(run: Option<(&MemoryRow, &str)>) -> String {
    const TITLE: &str = "the budget holds whatever the config says";
    let Some((row, log)) = run else {
        return goal(TITLE, None, "the budget row did not run");
    };
    let per_vm = row.entries_at_end() / row.vms;
    let growth = row.growth_per_phase();
    let warned = log.contains(&format!("holds at most {BUDGET} blocks per VM"))
        && log.contains(&format!("lruCapacityPerServer {}", row.capacity));
    let held = per_vm <= BUDGET as f64;
    let stopped = bounded_within(&growth, row.full_after(), FULL_PHASE_SHARE);
    let verdict = stopped.map(|stopped| stopped && held && warned);
    let figures = format!(
        "{} pods at lruCapacityPerServer {} ask for {} entries; each VM's index held at most \
         {per_vm:.0} (budget {BUDGET}), full after phase {}; growth per phase {} MiB (1 % of \
         the first: {:.2}); {:.1} MiB per routing VM at the end; the log's warning naming both: {}",
        row.endpoints,
        row.capacity,
        row.endpoints * row.capacity,
        row.full_after()
            .map_or("never".to_string(), |phase| phase.to_string()),
        joined(&growth, 1, ", "),
        growth
            .first()
            .map_or(f64::NAN, |first| first * FULL_PHASE_SHARE),
        row.vm_at_end() / row.routing_vms(),
        if warned { "present" } else { "absent" },
    );
    goal(TITLE, verdict, &figures)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(endpoints: usize, configure_ms: f64, fresh: (f64, f64, f64)) -> PoolRow {
        PoolRow {
            endpoints,
            per_process: SimPool::PER_PROCESS,
            keep_alive: true,
            configure_ms,
            ready_s: 1.0,
            all_fresh_s: fresh.0,
            round_ms: vec![100.0],
            fresh_min: fresh.1,
            fresh_end: fresh.2,
            requests: POOL_REQUESTS,
            errors: 0,
            scrape_failures: 0.0,
            unsent: 0.0,
            overflows: 0.0,
            vm_total_mib: 1.0,
            vms: 3.0,
            rss_mib: 100.0,
            stats_ms: vec![1.0],
            stats_kb: 1,
            warning_lines: 0,
        }
    }

    #[test]
    fn a_bounded_index_is_judged_on_every_phase_after_the_fill() {
        let full = Some(2);
        assert_eq!(
            bounded_verdict(&[10.0, 8.0, 0.5, 0.9, 0.0], full),
            Some(true)
        );
        // The last phase alone is not enough: the fourth still grew.
        assert_eq!(
            bounded_verdict(&[17.3, 10.6, 4.8, 22.6, 0.0], full),
            Some(false)
        );
        // No floor: a small pool's growth is judged against its own first phase.
        assert_eq!(
            bounded_verdict(&[0.4, 0.6, 0.3, 0.2, 0.2], full),
            Some(false)
        );
        // Zero against zero is not measured; growth after none is not bounded.
        assert_eq!(bounded_verdict(&[0.0, 0.0, 0.0, 0.0, 0.0], full), None);
        assert_eq!(
            bounded_verdict(&[0.0, 0.0, 0.0, 0.1, 0.0], full),
            Some(false)
        );
        assert_eq!(bounded_verdict(&[1.0, f64::NAN, 0.0], full), None);
        assert_eq!(bounded_verdict(&[1.0, 0.5], full), None);
        // Judged from the phase the index is full, and not at all if it never is.
        assert_eq!(
            bounded_verdict(&[10.0, 8.0, 5.0, 0.5, 0.0], Some(3)),
            Some(true)
        );
        assert_eq!(bounded_verdict(&[10.0, 8.0, 5.0, 0.5, 0.0], None), None);
        assert_eq!(bounded_verdict(&[10.0, 8.0, 5.0, 0.5, 0.0], Some(5)), None);
    }

    #[test]
    fn the_index_is_full_from_the_first_phase_its_entries_reach_every_share() {
        assert_eq!(full_after(&[90.0, 99.0, 100.0, 100.0], 100.0), Some(3));
        assert_eq!(full_after(&[100.0, 100.0], 100.0), Some(1));
        assert_eq!(full_after(&[90.0, f64::NAN], 100.0), None);
        assert_eq!(full_after(&[], 100.0), None);
    }

    fn budget_row(entries: f64, vm_total: Vec<f64>) -> MemoryRow {
        MemoryRow {
            endpoints: BUDGET_ENDPOINTS,
            capacity: BUDGET_CAPACITY,
            full_per_vm: BUDGET,
            requests: 100,
            rss: vec![1.0; vm_total.len()],
            index_entries: vec![entries; vm_total.len() - 1],
            vm_total,
            vms: 3.0,
            errors: 0,
        }
    }

    #[test]
    fn the_budget_holds_when_the_index_stops_at_it_memory_stops_and_the_log_says_so() {
        let warning = format!(
            "the prefix index holds at most {BUDGET} blocks per VM; with 64 pods each holds at \
             most 32768 rather than lruCapacityPerServer {BUDGET_CAPACITY}"
        );
        let full = BUDGET as f64 * 3.0;
        let steady = budget_row(full, vec![4.0, 200.0, 200.0, 200.5, 200.5]);
        assert!(budget_goal(Some((&steady, &warning))).contains("**met**"));
        assert!(budget_goal(Some((&steady, "no warning"))).contains("**not met**"));
        let growing = budget_row(full, vec![4.0, 200.0, 210.0, 220.0, 230.0]);
        assert!(budget_goal(Some((&growing, &warning))).contains("**not met**"));
        let over = budget_row(full * 2.0, vec![4.0, 200.0, 200.0, 200.0, 200.0]);
        assert!(budget_goal(Some((&over, &warning))).contains("**not met**"));
        // An index never full tested nothing.
        let short = budget_row(full / 2.0, vec![4.0, 200.0, 200.0, 200.0, 200.0]);
        assert!(budget_goal(Some((&short, &warning))).contains("**not measured**"));
        assert!(budget_goal(None).contains("**not measured**"));
    }

    #[test]
    fn the_bounded_goal_is_not_met_on_no_rows() {
        assert!(bounded_index_goal(&[]).contains("**not measured**"));
    }

    #[test]
    fn configuring_is_judged_at_the_size_the_issue_names() {
        let fast = |n| pool(n, 100.0, (1.0, 1.0, 1.0));
        assert_eq!(configure_verdict(&[fast(1024), fast(16384)]), None);
        assert_eq!(
            configure_verdict(&[fast(1024), pool(16384, 886.0, (1.0, 1.0, 1.0))]),
            Some(false)
        );
        assert_eq!(configure_verdict(&[fast(1024), fast(20_000)]), Some(true));
        assert_eq!(
            configure_verdict(&[pool(20_000, f64::NAN, (1.0, 1.0, 1.0))]),
            None
        );
    }

    #[test]
    fn under_load_a_lost_request_or_a_stale_pod_misses_and_one_process_is_only_shown() {
        let clean = pool(4096, 1.0, (4.1, 1.0, 1.0));
        let met = under_load_goal(std::slice::from_ref(&clean), &[]);
        assert!(met.contains("**met**"), "{met}");
        let mut lost = pool(4096, 1.0, (4.1, 1.0, 1.0));
        lost.errors = 3;
        let missed = under_load_goal(&[lost], &[]);
        assert!(missed.contains("**not met**"), "{missed}");
        let mut one = pool(4096, 1.0, (f64::NAN, f64::NAN, 0.9));
        one.per_process = 4096;
        one.errors = 3000;
        let both = under_load_goal(&[clean], &[one]);
        assert!(both.contains("**met**"), "{both}");
        assert!(both.contains("1 simulator process(es): 3000 of"), "{both}");
        let none = under_load_goal(&[], &[]);
        assert!(none.contains("**not measured**"), "{none}");
    }

    #[test]
    fn paced_scrapes_stay_fresh_throughout() {
        assert_eq!(paced_verdict(&pool(4096, 1.0, (4.1, 1.0, 1.0))), Some(true));
        assert_eq!(
            paced_verdict(&pool(4096, 1.0, (4.1, 0.99, 1.0))),
            Some(false)
        );
        assert_eq!(
            paced_verdict(&pool(4096, 1.0, (f64::NAN, f64::NAN, 0.75))),
            Some(false)
        );
        let quick = large_pool_goals(&[pool(1024, 1.0, (1.0, 1.0, 1.0))]);
        assert!(
            quick.contains("4096 endpoints are all scraped and none is starved: **not measured**"),
            "{quick}"
        );
    }

    #[test]
    fn errors_are_judged_at_every_size_the_issue_names() {
        let clean = |n| pool(n, 1.0, (1.0, 1.0, 1.0));
        assert_eq!(
            errors_verdict(&[clean(1024), clean(4096), clean(16384)]),
            Some(true)
        );
        assert_eq!(errors_verdict(&[clean(1024)]), None);
        let mut failing = clean(4096);
        failing.errors = 1;
        assert_eq!(errors_verdict(&[clean(1024), failing]), Some(false));
        let mut uncounted = clean(16384);
        uncounted.scrape_failures = f64::NAN;
        assert_eq!(errors_verdict(&[clean(1024), clean(4096), uncounted]), None);
    }
}
