//! Part 5, scale-out: 1, 2, 4 and 8 Envoy replicas, each `--concurrency 1` with its own
//! filter, in front of the same 8 pods, the client spreading requests over them as an L4
//! balancer would. Every replica runs the shipped configuration with `pool.replicas` set to
//! the fleet's size; the replicas never talk to each other.

use crate::chart::line_chart_on;
use crate::chart::YAxis;
use crate::load::{all_of, open_loop_balanced, sorted, Percentiles};
use crate::procfs::cpu_seconds;
use crate::quality::{prefix_hit_rate, ttft_cells, ERRORS, HIT_RATE, TTFT_P50, TTFT_P90, TTFT_P99};
use crate::report::{csv_table, goal, markdown_table, Cell, Chart, Column, Part, Row};
use crate::support::{free_port, shipped_picker_config, stop, with_endpoints, Envoy, Sim};
use crate::workloads::{best_hit_rate, multi_turn_sessions, shared_prefix_groups, QUALITY_SIM};
use inference_picker_core::hash::hash_bytes;
use inference_picker_core::scheduling::rng::Rng;
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};

/// How the client spreads requests over the replicas.
#[derive(Clone, Copy, PartialEq)]
enum Balancer {
    /// Request `n` to replica `n mod r`, as a round-robin L4 balancer does.
    RoundRobin,
    /// Every turn of a conversation to the replica its id hashes to, as a balancer hashing
    /// a session header does.
    SessionHash,
}

impl Balancer {
    fn name(self) -> &'static str {
        match self {
            Balancer::RoundRobin => "round robin",
            Balancer::SessionHash => "session hash",
        }
    }
}

const SHARED_PREFIX: &str = "shared prefix";
const MULTI_TURN: &str = "multi-turn";

/// A workload's requests, each with its session (what a session-hashing balancer keys on) and
/// its prefix group (the requests that share a prefix worth caching).
struct Workload {
    name: &'static str,
    requests: Vec<String>,
    sessions: Vec<usize>,
    groups: Vec<usize>,
}

/// Shared prefix: 32 groups of 32 chats (12 when quick); every chat is its own session.
fn shared_prefix(quick: bool) -> Workload {
    let per_group = if quick { 12 } else { 32 };
    let (groups, requests): (Vec<usize>, Vec<String>) =
        shared_prefix_groups(32, per_group, &mut Rng::new(5))
            .into_iter()
            .unzip();
    Workload {
        name: SHARED_PREFIX,
        sessions: (0..requests.len()).collect(),
        groups,
        requests,
    }
}

/// Multi-turn chat: 65 conversations of 8 turns (33 of 6 when quick). The count is odd so that
/// round robin does not pin a conversation to one replica: consecutive turns of a conversation
/// are that many requests apart, and `65 mod r = 1` for every swept `r`.
fn multi_turn(quick: bool) -> Workload {
    let (conversations, turns) = if quick { (33, 6) } else { (65, 8) };
    let (sessions, requests): (Vec<usize>, Vec<String>) =
        multi_turn_sessions(conversations, turns, &mut Rng::new(5))
            .into_iter()
            .unzip();
    Workload {
        name: MULTI_TURN,
        requests,
        groups: sessions.clone(),
        sessions,
    }
}

/// About where the 2-slot pods saturate on the shared-prefix workload (part 3's knee), and
/// half of it; the multi-turn workload runs just below its own knee.
const SATURATION_RATE: f64 = 60.0;
const HALF_RATE: f64 = 30.0;
const MULTI_TURN_RATE: f64 = 45.0;
const SEEDS: [u64; 2] = [11, 12];

/// One fleet run: the gateway fleet and what it was sent.
#[derive(Clone, Copy)]
struct Setup {
    replicas: usize,
    balancer: Balancer,
    rate: f64,
    seed: u64,
    /// Each replica's scrape interval when swept; `None`: the shipped refresh with
    /// `pool.replicas` set to the fleet size.
    scrape_interval_ms: Option<u64>,
    /// A busy loop in its own process beside the gateway while the load runs: the gateway's
    /// CPU contended, as on a busy node.
    cpu_hog: bool,
}

impl Setup {
    /// One of the rows that sweep the replica count: round robin, the fleet's shared
    /// refresh, no CPU hog (the rows the goals and the chart compare).
    fn in_replica_sweep(&self) -> bool {
        self.balancer == Balancer::RoundRobin && self.scrape_interval_ms.is_none() && !self.cpu_hog
    }
}

struct FleetRow {
    workload: &'static str,
    setup: Setup,
    scrape_interval_ms: u64,
    ttft: Percentiles,
    errors: usize,
    hit_rate: f64,
    /// Distinct pods that served each prefix group, averaged over the groups: 1 is a group
    /// cached in one place, more is its prefill repeated and the caches crowded.
    pods_per_group: f64,
    busiest_over_mean: f64,
    scrapes_per_pod_second: f64,
    envoy_cpu_ms_per_request: f64,
}

impl Row for FleetRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("workload", "workload").left(),
        Column::both("balancer", "balancer").left(),
        Column::both("replicas", "replicas"),
        Column::both("rate req/s", "rate"),
        Column::both("seed", "seed"),
        Column::both("scrape interval per replica ms", "scrape_interval_ms"),
        Column::both("CPU hog beside", "cpu_hog"),
        TTFT_P50,
        TTFT_P90,
        TTFT_P99,
        ERRORS,
        HIT_RATE,
        Column::both("pods per group", "pods_per_group"),
        Column::both("busiest pod / mean", "busiest_over_mean"),
        Column::both("scrapes per pod per s", "scrapes_per_pod_second"),
        Column::both("fleet Envoy CPU ms per request", "envoy_cpu_ms_per_request"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let mut cells = vec![
            Cell::Text(self.workload.into()),
            Cell::Text(self.setup.balancer.name().into()),
            Cell::Count(self.setup.replicas),
            Cell::Fixed(self.setup.rate, 0),
            Cell::Count(self.setup.seed as usize),
            Cell::Count(self.scrape_interval_ms as usize),
            Cell::Text(if self.setup.cpu_hog { "yes" } else { "no" }.into()),
        ];
        cells.extend(ttft_cells(&self.ttft));
        cells.extend([
            Cell::Count(self.errors),
            Cell::Percent(self.hit_rate),
            Cell::Measure(self.pods_per_group, 2),
            Cell::Measure(self.busiest_over_mean, 2),
            Cell::Measure(self.scrapes_per_pod_second, 1),
            Cell::Measure(self.envoy_cpu_ms_per_request, 2),
        ]);
        cells
    }
}

/// The shipped configuration for these pods as replica `own` of a fleet with these peer
/// ports deploys it (`pool.peers` listing the fleet), or with a swept interval and no peers.
fn picker_config(sims: &[&Sim], setup: &Setup, own: u16, fleet: &[u16]) -> String {
    let mut config: Value =
        serde_yaml::from_str(&with_endpoints(&shipped_picker_config(), sims)).expect("config");
    let pool = &mut config["pool"];
    match setup.scrape_interval_ms {
        Some(ms) => {
            pool["refreshMetricsInterval"] = format!("{ms}ms").into();
            if let Some(map) = pool.as_mapping_mut() {
                map.remove("peers");
            }
        }
        None => {
            pool["peers"]["port"] = u64::from(own).into();
            let addresses: Vec<Value> = fleet
                .iter()
                .map(|port| format!("127.0.0.1:{port}").into())
                .collect();
            pool["peers"]["addresses"] = Value::Sequence(addresses);
        }
    }
    if setup.scrape_interval_ms.is_some() && setup.replicas > 1 {
        // `pool.replicas` stays 1 so that the interval is each replica's own; the prefix
        // homes it would turn on are asked for instead.
        let plugins = config["plugins"].as_sequence_mut().expect("plugins");
        for plugin in plugins {
            if plugin["type"].as_str() == Some("prefix-cache-scorer") {
                plugin["parameters"]["homeAffinity"] = true.into();
            }
        }
    }
    serde_yaml::to_string(&config).expect("config")
}

fn run_fleet(workload: &Workload, setup: Setup) -> FleetRow {
    let sims: Vec<Sim> = (1..=8)
        .map(|i| Sim::start(&format!("pod-{i}"), &QUALITY_SIM))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let ports: Vec<u16> = (0..setup.replicas).map(|_| free_port()).collect();
    let fleet: Vec<Envoy> = ports
        .iter()
        .map(|&own| Envoy::start(&picker_config(&refs, &setup, own, &ports), 1))
        .collect();
    for sim in &refs {
        sim.wait_for_scrapes(2);
    }
    let addresses: Vec<String> = fleet.iter().map(Envoy::address).collect();
    let cpu = || fleet.iter().map(|e| cpu_seconds(e.pid())).sum::<f64>();
    let scrapes = || refs.iter().map(|s| s.metrics_scrapes()).sum::<u64>();
    let hog = setup.cpu_hog.then(CpuHog::start);
    let (cpu_before, scrapes_before) = (cpu(), scrapes());
    let replicas = setup.replicas;
    let balance = |n: usize| match setup.balancer {
        Balancer::RoundRobin => n % replicas,
        Balancer::SessionHash => {
            let session = workload.sessions.get(n).copied().unwrap_or(n) as u64;
            (hash_bytes(0, &session.to_le_bytes()) % replicas as u64) as usize
        }
    };
    let load = open_loop_balanced(
        &addresses,
        &workload.requests,
        setup.rate,
        setup.seed,
        &balance,
        &[],
    );
    let (cpu_used, scraped) = (cpu() - cpu_before, scrapes() - scrapes_before);
    let peer_stat = |what: &str| -> f64 {
        fleet
            .iter()
            .map(|e| {
                e.stat(&format!("wasmcustom.inference_picker.peers.{what}"))
                    .unwrap_or(0.0)
            })
            .sum()
    };
    println!(
        "    peers: synced {} failed {} refused {} bytes {}",
        peer_stat("synced"),
        peer_stat("failed"),
        peer_stat("refused"),
        peer_stat("bytes")
    );
    drop(hog);
    let mut picks: BTreeMap<&str, usize> = BTreeMap::new();
    let mut group_pods: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (exchange, &n) in load.ok.iter().zip(&load.ok_requests) {
        *picks.entry(exchange.pod.as_str()).or_default() += 1;
        let group = workload.groups.get(n).copied().unwrap_or(n);
        group_pods.entry(group).or_default().insert(&exchange.pod);
    }
    let pods_per_group = group_pods.values().map(BTreeSet::len).sum::<usize>() as f64
        / group_pods.len().max(1) as f64;
    let mean = load.ok.len() as f64 / refs.len() as f64;
    let busiest = picks.values().copied().max().unwrap_or(0) as f64;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let shipped_refresh_ms = 50;
    let row = FleetRow {
        workload: workload.name,
        setup,
        scrape_interval_ms: setup
            .scrape_interval_ms
            .unwrap_or(shipped_refresh_ms * replicas as u64),
        ttft: Percentiles::of(&sorted(load.ok.iter().map(|e| ms(e.first_byte)).collect())),
        errors: load.errors,
        hit_rate: prefix_hit_rate(&refs),
        pods_per_group,
        busiest_over_mean: busiest / mean.max(1e-9),
        scrapes_per_pod_second: scraped as f64 / refs.len() as f64 / load.elapsed.max(1e-9),
        envoy_cpu_ms_per_request: cpu_used * 1000.0 / workload.requests.len().max(1) as f64,
    };
    println!(
        "  {} {} x{}{} {} req/s seed {}: TTFT p50 {:.1} p90 {:.1} ms, hit {:.1} %, {:.2} pods per group, {:.1} scrapes/pod/s",
        row.workload,
        setup.balancer.name(),
        replicas,
        if setup.cpu_hog { " with a CPU hog" } else { "" },
        setup.rate,
        setup.seed,
        row.ttft.p50,
        row.ttft.p90,
        row.hit_rate * 100.0,
        row.pods_per_group,
        row.scrapes_per_pod_second
    );
    row
}

/// A process that spins on one core until dropped.
struct CpuHog(std::process::Child);

impl CpuHog {
    fn start() -> CpuHog {
        let child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("start the CPU hog");
        CpuHog(child)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        stop(&mut self.0);
    }
}

/// Every run of the part, in order: the fleet sweep on both workloads, the session-hashing
/// balancer, and the scrape-interval sweep at the largest fleet.
fn setups(quick: bool) -> Vec<(&'static str, Setup)> {
    let replica_counts: &[usize] = if quick { &[1, 4] } else { &[1, 2, 4, 8] };
    let seeds: &[u64] = if quick { &SEEDS[..1] } else { &SEEDS };
    let rates: &[f64] = if quick {
        &[SATURATION_RATE]
    } else {
        &[SATURATION_RATE, HALF_RATE]
    };
    let largest = replica_counts.last().copied().unwrap_or(1);
    let setup = |replicas, balancer, rate, seed, scrape_interval_ms| Setup {
        replicas,
        balancer,
        rate,
        seed,
        scrape_interval_ms,
        cpu_hog: false,
    };
    let mut all = Vec::new();
    for &seed in seeds {
        for &rate in rates {
            for &r in replica_counts {
                all.push((
                    SHARED_PREFIX,
                    setup(r, Balancer::RoundRobin, rate, seed, None),
                ));
            }
        }
        for &r in replica_counts {
            let round_robin = setup(r, Balancer::RoundRobin, MULTI_TURN_RATE, seed, None);
            all.push((MULTI_TURN, round_robin));
        }
        let hashed = setup(largest, Balancer::SessionHash, MULTI_TURN_RATE, seed, None);
        all.push((MULTI_TURN, hashed));
        let contended = Setup {
            cpu_hog: true,
            ..setup(1, Balancer::RoundRobin, SATURATION_RATE, seed, None)
        };
        all.push((SHARED_PREFIX, contended));
    }
    let intervals: &[u64] = if quick { &[1000] } else { &[50, 200, 1000] };
    for &ms in intervals {
        let swept = setup(
            largest,
            Balancer::RoundRobin,
            SATURATION_RATE,
            SEEDS[0],
            Some(ms),
        );
        all.push((SHARED_PREFIX, swept));
    }
    all
}

pub fn run(quick: bool) -> Part {
    println!("scale-out: 1 to 8 Envoy replicas with their own filters in front of the same pods");
    let workloads = [shared_prefix(quick), multi_turn(quick)];
    let best = workloads
        .iter()
        .map(|w| best_hit_rate(&Sim::start("oracle", &QUALITY_SIM), &w.requests))
        .collect::<Vec<f64>>();
    let rows: Vec<FleetRow> = setups(quick)
        .into_iter()
        .filter_map(|(name, setup)| {
            let workload = workloads.iter().find(|w| w.name == name)?;
            Some(run_fleet(workload, setup))
        })
        .collect();
    Part {
        markdown: format!(
            "{}{}\n{}",
            intro(quick, &best),
            markdown_table(&rows),
            goals(&rows)
        ),
        csv: csv_table(&rows),
        charts: vec![Chart::main(chart(&rows))],
    }
}

/// `best`: the best hit rate any router could reach on each workload.
fn intro(quick: bool, best: &[f64]) -> String {
    let (groups, conversations) = if quick {
        ("32 groups x 12 chats", "33 conversations x 6 turns")
    } else {
        ("32 groups x 32 chats", "65 conversations x 8 turns")
    };
    format!(
        "## 5. Scale-out: Envoy replicas that never talk\n\nThe routing-quality pods (8, two \
         sequence slots each) behind 1 to 8 Envoy replicas, each `--concurrency 1` with its \
         own filter, prefix index and scrapes; the client sends request `n` to replica \
         `n mod r`, as a round-robin L4 balancer does, or (session hash) every turn of a \
         conversation to one replica. Every replica runs the shipped `envoy.yaml` \
         configuration with `pool.replicas` set to the fleet size, so each scrapes every pod \
         once per `r x 50 ms`, except in the rows that sweep the scrape interval \
         (`refreshMetricsInterval` set per replica, `pool.replicas` left at 1, and the prefix \
         scorer's `homeAffinity: true`, which more than one replica turns on); in the rows with a \
         CPU hog a busy loop spins in its own process beside the one Envoy for the whole load \
         (one of the machine's cores, which the pods and the client share too). Workloads: \
         shared prefix ({groups}) at {SATURATION_RATE} req/s (about the pods' saturation) and \
         {HALF_RATE}; multi-turn chat ({conversations}) at {MULTI_TURN_RATE} req/s. Fleet \
         Envoy CPU is every replica's process CPU over the load, per request sent. The best \
         hit rate any router could reach (every request where all earlier ones of its prefix \
         went, nothing evicted): {:.1} % on the shared prefix, {:.1} % on multi-turn chat.\n\n",
        best.first().copied().unwrap_or(f64::NAN) * 100.0,
        best.get(1).copied().unwrap_or(f64::NAN) * 100.0,
    )
}

/// The round-robin row of `workload` at `replicas`, `rate` and `seed` with the fleet's refresh.
fn find<'a>(
    rows: &'a [FleetRow],
    workload: &str,
    replicas: usize,
    rate: f64,
    seed: u64,
) -> Option<&'a FleetRow> {
    rows.iter().find(|r| {
        r.workload == workload
            && r.setup.in_replica_sweep()
            && r.setup.replicas == replicas
            && r.setup.rate == rate
            && r.setup.seed == seed
    })
}

/// Replicas the goals compare with one.
const FLEET: usize = 8;

/// One comparison of the 8-replica row with the 1-replica row: `(verdict, what was measured)`.
fn compare(
    rows: &[FleetRow],
    workload: &str,
    rate: f64,
    seed: u64,
    test: &dyn Fn(&FleetRow, &FleetRow) -> (bool, String),
) -> (Option<bool>, String) {
    let at = format!("{workload} {rate} req/s seed {seed}");
    match (
        find(rows, workload, 1, rate, seed),
        find(rows, workload, FLEET, rate, seed),
    ) {
        (Some(one), Some(fleet)) => {
            let (met, text) = test(one, fleet);
            (Some(met), format!("{at}: {text}"))
        }
        _ => (None, format!("{at}: not measured")),
    }
}

fn judged(text: &str, outcomes: Vec<(Option<bool>, String)>) -> (Option<bool>, String) {
    let verdict = all_of(outcomes.iter().map(|(v, _)| *v));
    let measured: Vec<String> = outcomes.into_iter().map(|(_, m)| m).collect();
    (verdict, goal(text, verdict, &measured.join("; ")))
}

fn goals(rows: &[FleetRow]) -> String {
    let hit_and_p90 = |one: &FleetRow, fleet: &FleetRow| {
        let hit = fleet.hit_rate >= 0.95 * one.hit_rate;
        let p90 = fleet.ttft.p90 <= 1.1 * one.ttft.p90;
        (
            hit && p90,
            format!(
                "hit {:.1} % vs {:.1} %, p90 {:.1} vs {:.1} ms",
                fleet.hit_rate * 100.0,
                one.hit_rate * 100.0,
                fleet.ttft.p90,
                one.ttft.p90
            ),
        )
    };
    let p90 = |one: &FleetRow, fleet: &FleetRow| {
        (
            fleet.ttft.p90 <= 1.1 * one.ttft.p90,
            format!("p90 {:.1} vs {:.1} ms", fleet.ttft.p90, one.ttft.p90),
        )
    };
    let scrapes = |one: &FleetRow, fleet: &FleetRow| {
        (
            fleet.scrapes_per_pod_second <= 1.25 * one.scrapes_per_pod_second,
            format!(
                "{:.1} vs {:.1} scrapes per pod per s",
                fleet.scrapes_per_pod_second, one.scrapes_per_pod_second
            ),
        )
    };
    let mut shared = Vec::new();
    let mut chat = Vec::new();
    let mut scraped = Vec::new();
    for seed in SEEDS {
        for rate in [SATURATION_RATE, HALF_RATE] {
            shared.push(compare(rows, SHARED_PREFIX, rate, seed, &hit_and_p90));
            scraped.push(compare(rows, SHARED_PREFIX, rate, seed, &scrapes));
        }
        chat.push(compare(rows, MULTI_TURN, MULTI_TURN_RATE, seed, &p90));
    }
    let (shared_met, shared_text) = judged(
        "shared prefix at 8 replicas: hit rate at least 95 % of one replica's, TTFT p90 within \
         1.1x of one replica's, at a rate near the pool's saturation and at half of it (two seeds)",
        shared,
    );
    let (chat_met, chat_text) = judged(
        "multi-turn chat at 8 replicas: TTFT p90 within 1.1x of one replica's (two seeds)",
        chat,
    );
    // The scrape goal holds only with the goals above still met.
    let (scrape_met, _) = judged("", scraped.clone());
    let with_others = all_of([scrape_met, shared_met, chat_met]);
    let measured: Vec<String> = scraped.into_iter().map(|(_, m)| m).collect();
    let scrape_text = goal(
        "scrapes per pod per second at 8 replicas no more than 1.25x one replica's, with the \
         goals above still met",
        with_others,
        &measured.join("; "),
    );
    format!(
        "{shared_text}{chat_text}{scrape_text}{}",
        contended_goal(rows)
    )
}

/// One Envoy with a CPU hog beside it against the same Envoy alone, per seed.
fn contended_goal(rows: &[FleetRow]) -> String {
    let outcomes = SEEDS
        .iter()
        .map(|&seed| {
            let alone = find(rows, SHARED_PREFIX, 1, SATURATION_RATE, seed);
            let contended = rows.iter().find(|r| {
                r.setup.cpu_hog && r.setup.seed == seed && r.setup.rate == SATURATION_RATE
            });
            let at = format!("seed {seed}");
            match (alone, contended) {
                (Some(alone), Some(contended)) => {
                    let drop = (alone.hit_rate - contended.hit_rate) * 100.0;
                    (
                        Some(drop <= 5.0),
                        format!(
                            "{at}: hit {:.1} % with the hog vs {:.1} % without",
                            contended.hit_rate * 100.0,
                            alone.hit_rate * 100.0
                        ),
                    )
                }
                _ => (None, format!("{at}: not measured")),
            }
        })
        .collect();
    judged(
        &format!(
            "one Envoy, shared prefix at {SATURATION_RATE} req/s, a CPU hog beside it: hit rate \
             drops by no more than 5 points"
        ),
        outcomes,
    )
    .1
}

/// Hit rate and TTFT p90 against the replica count, shared prefix near saturation, first seed.
fn chart(rows: &[FleetRow]) -> String {
    let series = |label: &str, value: &dyn Fn(&FleetRow) -> f64| {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| {
                r.workload == SHARED_PREFIX
                    && r.setup.in_replica_sweep()
                    && r.setup.rate == SATURATION_RATE
                    && r.setup.seed == SEEDS[0]
            })
            .map(|r| (r.setup.replicas as f64, value(r)))
            .collect();
        (label.to_string(), points)
    };
    line_chart_on(
        YAxis::Linear,
        &format!("Shared prefix at {SATURATION_RATE} req/s: replicas vs hit rate and TTFT p90"),
        "Envoy replicas",
        "hit rate % / TTFT p90 ms",
        &[
            series("hit rate %", &|r| r.hit_rate * 100.0),
            series("TTFT p90 ms", &|r| r.ttft.p90),
        ],
    )
}
