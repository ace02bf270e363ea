//! Part 4, memory: Envoy's RSS and the VMs' memory at 8 / 256 / 1,024 endpoints as the prefix
//! index fills.

use crate::load::closed_loop_over;
use crate::procfs::rss_mib;
use crate::report::{csv_table, goal, joined, markdown_table, Cell, Column, Part, Row};
use crate::setup::filter_stat;
use crate::support::{with_addresses, Envoy, SimPool};
use crate::workloads::distinct_completions;
use std::time::Duration;

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
  metricsCluster: original_destination_cluster
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
    Part {
        markdown: format!(
            "{}{}\n{}{}",
            intro(),
            markdown_table(&rows),
            bounded_index_goal(&rows),
            rows.last().map(cost_per_block).unwrap_or_default()
        ),
        csv: csv_table(&rows),
        svg: None,
    }
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
