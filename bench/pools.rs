//! Part 7, pool count: what serving 100 pools from one filter costs a request, against one pool.

use crate::load::{closed_loop, percentile, sorted};
use crate::procfs::cpu_seconds;
use crate::report::{csv_table, markdown_table, Cell, Column, Part, Row};
use crate::support::{shipped_picker_config, Envoy, Sim, SimPool, MODEL};
use crate::workloads::padded_completion;
use inference_picker_core::router::ModelRouter;
use std::time::Duration;

const INTRO: &str = "## 7. Many pools in one filter: 1 vs 100 pools\n\n\
     The same near-instant simulated pod serves the requests' model behind three Envoys \
     (`envoy/envoy.yaml`, `--concurrency 2`, the shipped plugins): (a) one pool holding that \
     pod; (b) 100 pools of one pod each, the requests' model listed by name in the last pool; \
     (c) the same 100 pools listing a glob each, the requests' model matching only the last \
     (99 globs tried first: the worst case of the pool choice). The 99 other pods are real \
     simulated pods, scraped every 50 ms like the first. Closed loop over keep-alive \
     connections, 1 KB bodies, `max_tokens: 1`, the gateways taking turns in four rounds per \
     cell. CPU = Envoy's user+system seconds per 1,000 requests with its idle rate (the \
     scraping of its pools, measured for 3 s with no requests) taken out; the idle rate is \
     shown beside it.\n\n";

const GATEWAY_NAMES: [&str; 3] = ["(a) 1 pool", "(b) 100 pools, exact", "(c) 100 pools, globs"];
const ROUNDS: usize = 4;
const POOLS: usize = 100;
/// Closed-loop clients of each cell.
const CLIENTS: [usize; 2] = [1, 16];

struct PoolsRow {
    gateway: &'static str,
    clients: usize,
    p50_ms: f64,
    p99_ms: f64,
    added_p50_us: f64,
    cpu_per_1000: f64,
    idle_cores: f64,
    errors: usize,
}

impl Row for PoolsRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("gateway", "gateway"),
        Column::both("clients", "clients"),
        Column::both("p50 ms", "p50_ms"),
        Column::both("p99 ms", "p99_ms"),
        Column::both("p50 vs (a) µs", "added_p50_us"),
        Column::both("CPU s / 1k req", "cpu_s_per_1k"),
        Column::both("idle CPU (cores)", "idle_cores"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.gateway.to_string()),
            Cell::Count(self.clients),
            Cell::Measure(self.p50_ms, 3),
            Cell::Measure(self.p99_ms, 3),
            Cell::Fixed(self.added_p50_us, 0),
            Cell::Measure(self.cpu_per_1000, 3),
            Cell::Measure(self.idle_cores, 3),
            Cell::Count(self.errors),
        ]
    }
}

/// The shipped plugins with `pools` in place of `pool`: 99 pools of the other pods, then the
/// target pod's pool, naming the requests' model exactly or by a glob.
fn many_pools(target: &Sim, others: &SimPool, globs: bool) -> String {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&shipped_picker_config()).expect("shipped config");
    let mapping = config.as_mapping_mut().expect("a mapping");
    let pool = mapping.remove("pool").expect("a pool section");
    let pool_with = |name: String, models: Vec<String>, address: &str| {
        let mut entry = pool.clone();
        entry["name"] = name.into();
        entry["models"] = models.into_iter().map(serde_yaml::Value::from).collect();
        entry["endpoints"] =
            serde_yaml::from_str(&format!("[{{address: '{address}'}}]")).expect("endpoints");
        entry
    };
    let mut pools: Vec<serde_yaml::Value> = others
        .addresses
        .iter()
        .take(POOLS - 1)
        .enumerate()
        .map(|(i, address)| {
            let model = if globs {
                format!("family-{i:03}/*")
            } else {
                format!("model-{i:03}")
            };
            pool_with(format!("pool-{i:03}"), vec![model], address)
        })
        .collect();
    let (family, model) = MODEL.split_once('/').unwrap_or(("", MODEL));
    let target_model = if globs {
        format!("{family}/*{}", &model[model.len() - 3..])
    } else {
        MODEL.to_string()
    };
    pools.push(pool_with(
        "target".into(),
        vec![target_model],
        &target.address,
    ));
    mapping.insert("pools".into(), pools.into());
    serde_yaml::to_string(&config).expect("serialize")
}

fn single_pool(target: &Sim) -> String {
    crate::support::with_endpoints(&shipped_picker_config(), &[target])
}

/// Envoy's CPU rate with no requests: the scraping of its pools.
fn idle_cores(envoy: &Envoy) -> f64 {
    let window = Duration::from_secs(3);
    let before = cpu_seconds(envoy.pid());
    std::thread::sleep(window);
    (cpu_seconds(envoy.pid()) - before) / window.as_secs_f64()
}

#[derive(Default)]
struct Tally {
    latencies_ms: Vec<f64>,
    cpu: f64,
    seconds: f64,
    sent: usize,
}

/// Nanoseconds per pool choice (`ModelRouter::route`), natively: the part of a request that
/// depends on the number of pools.
fn route_ns(pools: &[Option<Vec<String>>], model: &str) -> f64 {
    let router = ModelRouter::new(pools);
    let rounds = 200_000;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(router.route(std::hint::black_box(model)));
    }
    started.elapsed().as_nanos() as f64 / rounds as f64
}

fn routing_cost() -> String {
    let listed = |count: usize, glob: bool| -> Vec<Option<Vec<String>>> {
        (0..count)
            .map(|i| {
                let model = if glob {
                    format!("family-{i:03}/*")
                } else {
                    format!("model-{i:03}")
                };
                Some(vec![model])
            })
            .chain(std::iter::once(Some(vec![if glob {
                "meta-llama/*uct".to_string()
            } else {
                MODEL.to_string()
            }])))
            .collect()
    };
    let cases = [
        ("1 pool, exact name", route_ns(&listed(0, false), MODEL)),
        (
            "100 pools, exact name",
            route_ns(&listed(POOLS - 1, false), MODEL),
        ),
        (
            "100 pools, 99 globs tried first",
            route_ns(&listed(POOLS - 1, true), MODEL),
        ),
    ];
    let mut table = String::from("| pool choice (native) | ns per request |\n|---|---:|\n");
    for (name, ns) in cases {
        println!("  {name}: {ns:.0} ns");
        table.push_str(&format!("| {name} | {ns:.0} |\n"));
    }
    table
}

pub fn run(quick: bool) -> Part {
    println!("pools: 1 vs {POOLS} pools in one filter");
    let native = routing_cost();
    let target = Sim::start("target", &["--time-scale", "0"]);
    let others = SimPool::start(POOLS - 1);
    let configs = [
        single_pool(&target),
        many_pools(&target, &others, false),
        many_pools(&target, &others, true),
    ];
    let envoys: Vec<Envoy> = configs
        .iter()
        .map(|config| Envoy::start(config, 2))
        .collect();
    target.wait_for_scrapes(20);
    let idle: Vec<f64> = envoys.iter().map(idle_cores).collect();
    let body = padded_completion(1024);
    let count = if quick { 400 } else { 1600 };
    let mut rows = Vec::new();
    for clients in CLIENTS {
        for envoy in &envoys {
            let _ = closed_loop(&envoy.address(), clients, clients * 8, &body);
        }
        let mut tallies: [Tally; 3] = Default::default();
        for _ in 0..ROUNDS {
            for ((tally, envoy), idle) in tallies.iter_mut().zip(&envoys).zip(&idle) {
                let before = cpu_seconds(envoy.pid());
                let started = std::time::Instant::now();
                let results = closed_loop(&envoy.address(), clients, count / ROUNDS, &body);
                let seconds = started.elapsed().as_secs_f64();
                tally.cpu += cpu_seconds(envoy.pid()) - before - idle * seconds;
                tally.seconds += seconds;
                tally.sent += count / ROUNDS;
                tally.latencies_ms.extend(
                    results
                        .iter()
                        .filter(|e| e.status == 200)
                        .map(|e| e.total.as_secs_f64() * 1000.0),
                );
            }
        }
        let base_p50 = percentile(&sorted(tallies[0].latencies_ms.clone()), 50.0);
        for ((tally, name), idle) in tallies.into_iter().zip(GATEWAY_NAMES).zip(&idle) {
            let latencies = sorted(tally.latencies_ms);
            let p50_ms = percentile(&latencies, 50.0);
            let row = PoolsRow {
                gateway: name,
                clients,
                p50_ms,
                p99_ms: percentile(&latencies, 99.0),
                added_p50_us: (p50_ms - base_p50) * 1000.0,
                cpu_per_1000: tally.cpu * 1000.0 / tally.sent.max(1) as f64,
                idle_cores: *idle,
                errors: tally.sent - latencies.len(),
            };
            println!(
                "  {name:<22} x{clients:<2} p50 {:.3} ms ({:+.0} µs), p99 {:.3} ms, CPU {:.3} s/1k, idle {:.3} cores",
                row.p50_ms, row.added_p50_us, row.p99_ms, row.cpu_per_1000, row.idle_cores
            );
            rows.push(row);
        }
    }
    Part {
        markdown: format!(
            "{INTRO}{}\n{}\nThe pool choice itself, natively (`router::ModelRouter`, the only \
             per-request step that depends on the number of pools):\n\n{native}",
            markdown_table(&rows),
            summary(&rows)
        ),
        csv: csv_table(&rows),
        charts: Vec::new(),
    }
}

fn summary(rows: &[PoolsRow]) -> String {
    let added = |clients: usize, gateway: usize| {
        rows.iter()
            .find(|r| r.clients == clients && r.gateway == GATEWAY_NAMES[gateway])
            .map_or(f64::NAN, |r| r.added_p50_us)
    };
    let idle = |gateway: usize| {
        rows.iter()
            .find(|r| r.gateway == GATEWAY_NAMES[gateway])
            .map_or(f64::NAN, |r| r.idle_cores)
    };
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    format!(
        "At {} client, {POOLS} pools measured {:+.0} µs at p50 against one pool with the model \
         named exactly and {:+.0} µs with {} globs tried first; at {} clients {:+.0} µs and \
         {:+.0} µs. The pool choice itself costs the nanoseconds in the table below. What \
         {POOLS} pools cost with no request at all is their scraping (one scrape per pod per \
         interval, as for one pool of as many pods): {:.3} cores idle against {:.3} for one \
         pool, on this machine's {cores} cores that the requests share.\n",
        CLIENTS[0],
        added(CLIENTS[0], 1),
        added(CLIENTS[0], 2),
        POOLS - 1,
        CLIENTS[1],
        added(CLIENTS[1], 1),
        added(CLIENTS[1], 2),
        idle(1),
        idle(0),
    )
}
