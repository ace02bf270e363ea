//! Part 5, scale-out: 1, 2, 4 and 8 Envoy replicas, each `--concurrency 1` with its own
//! filter, in front of the same 8 pods (part 3's 2-slot and batching pods), the client
//! spreading requests over them as an L4 balancer would. Every replica runs the shipped
//! configuration as a user deploys it, `pool.peers` listing the fleet, so the replicas share
//! what they learn. Beside them, in the same run: the same Envoys calling one central ext_proc
//! picker (GIE's and llm-d's shape), SGLang's router, the replicas that never talk (prefix
//! homes only), and the fleet losing a peer and gaining a replica mid-run.

mod fleet;
mod goals;

use crate::chart::{line_chart_on, YAxis};
use crate::load::Percentiles;
use crate::quality::{ttft_cells, ERRORS, HIT_RATE, TTFT_P50, TTFT_P90, TTFT_P99};
use crate::report::{csv_table, markdown_table, Cell, Chart, Column, Part, Row};
use crate::support::Sim;
use crate::workloads::{
    best_hit_rate, flag_value, multi_turn_sessions, shared_prefix_groups, BATCHING_SIM, QUALITY_SIM,
};
use inference_picker_core::hash::hash_bytes;
use inference_picker_core::scheduling::rng::Rng;
use std::time::Instant;

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

    /// The replica that takes request `n` of `workload` while `replicas` take requests.
    fn replica(self, workload: &Workload, n: usize, replicas: usize) -> usize {
        let replicas = replicas.max(1);
        match self {
            Balancer::RoundRobin => n % replicas,
            Balancer::SessionHash => {
                let session = workload.sessions.get(n).copied().unwrap_or(n) as u64;
                (hash_bytes(0, &session.to_le_bytes()) % replicas as u64) as usize
            }
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

/// The pods a row runs on: part 3's two regimes.
#[derive(Clone, Copy, PartialEq)]
struct Regime {
    /// As tables and goals name it.
    name: &'static str,
    /// In chart file names.
    slug: &'static str,
    sim: &'static [&'static str],
}

const TWO_SLOT: Regime = Regime {
    name: "2-slot",
    slug: "slots",
    sim: &QUALITY_SIM,
};
const BATCHING: Regime = Regime {
    name: "batching",
    slug: "batching",
    sim: &BATCHING_SIM,
};

/// What stands between the client and the pods.
#[derive(Clone, Copy, PartialEq)]
enum Gateway {
    /// Envoy replicas with the shipped configuration, `pool.peers` listing every replica.
    Peers,
    /// The previous design: Envoy replicas that never talk (no `pool.peers`), `pool.replicas`
    /// set to the fleet's size, so each scrapes its share and sends a prefix to its home pod.
    HomesOnly,
    /// Envoy replicas with `ext_proc` in the filter's place, all calling one picker process.
    CentralExtProc,
    /// SGLang's router with `--policy cache_aware`: one process the client sends everything to.
    SglangCacheAware,
}

impl Gateway {
    fn name(self) -> &'static str {
        match self {
            Gateway::Peers => "peers",
            Gateway::HomesOnly => "homes only",
            Gateway::CentralExtProc => "central ext_proc",
            Gateway::SglangCacheAware => "SGLang cache_aware",
        }
    }

    /// How many gateway processes the client sends to when it stands in for `fleet` replicas.
    fn replicas_for(self, fleet: usize) -> usize {
        match self {
            Gateway::SglangCacheAware => 1,
            _ => fleet,
        }
    }
}

/// What happens beside the load.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Steady,
    /// At half of the requests' schedule the client stops sending to the last replica, which is
    /// killed once it finished what it was sent.
    PeerKilled,
    /// The last replica (listed in every replica's peers from the start) is started at half of
    /// the schedule and sent its share once Envoy is ready.
    ReplicaJoining,
    /// A busy loop in its own process beside the gateway for the whole load: its CPU
    /// contended, as on a busy node.
    CpuHog,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Steady => "none",
            Fault::PeerKilled => "peer killed",
            Fault::ReplicaJoining => "replica joining",
            Fault::CpuHog => "CPU hog beside",
        }
    }
}

/// A workload at an offered rate.
#[derive(Clone, Copy, PartialEq)]
struct Offered {
    workload: &'static str,
    rate: f64,
}

/// About where the 2-slot pods saturate on the shared-prefix workload (part 3's knee), and
/// half of it; the multi-turn workload runs just below its own knee.
const SATURATION_RATE: f64 = 60.0;
const HALF_RATE: f64 = 30.0;
const MULTI_TURN_RATE: f64 = 45.0;
const SATURATED: Offered = Offered {
    workload: SHARED_PREFIX,
    rate: SATURATION_RATE,
};
const HALF_SATURATED: Offered = Offered {
    workload: SHARED_PREFIX,
    rate: HALF_RATE,
};
const CHAT: Offered = Offered {
    workload: MULTI_TURN,
    rate: MULTI_TURN_RATE,
};
const SEEDS: [u64; 2] = [11, 12];

/// The fleet the goals compare with one Envoy, and that the central designs stand in for.
const FLEET: usize = 8;

/// During a fleet change the pods' prefix counters are read this often ...
const SAMPLE_EVERY_MS: u64 = 250;
/// ... and the hit rate taken over windows this long.
const WINDOW_S: f64 = 1.0;
/// A window whose hit rate is at most this many points under the run's mean has recovered.
const RECOVERY_POINTS: f64 = 2.0;

/// One row's run.
#[derive(Clone, Copy, PartialEq)]
struct Setup {
    regime: Regime,
    gateway: Gateway,
    /// Gateway processes the client sends to (with a fault: the fleet's full size).
    replicas: usize,
    balancer: Balancer,
    offered: Offered,
    seed: u64,
    fault: Fault,
}

impl Setup {
    /// A row of the replica sweep: peers, round robin, nothing beside the load.
    fn sweep(regime: Regime, offered: Offered, seed: u64, replicas: usize) -> Setup {
        Setup {
            regime,
            gateway: Gateway::Peers,
            replicas,
            balancer: Balancer::RoundRobin,
            offered,
            seed,
            fault: Fault::Steady,
        }
    }

    /// The same load and pods through `gateway` standing in for `FLEET` replicas.
    fn through(self, gateway: Gateway) -> Setup {
        Setup {
            gateway,
            replicas: gateway.replicas_for(FLEET),
            ..self
        }
    }

    fn with_fault(self, fault: Fault) -> Setup {
        Setup { fault, ..self }
    }

    /// Replicas running when the load starts: the joining one starts later.
    fn starting_replicas(&self) -> usize {
        match self.fault {
            Fault::ReplicaJoining => self.replicas.saturating_sub(1),
            _ => self.replicas,
        }
    }

    /// "shared prefix 60 req/s seed 11, peers x8", and the balancer or fault if not the usual.
    fn label(&self) -> String {
        let mut label = format!(
            "{} {} req/s seed {}, {} x{}",
            self.offered.workload,
            self.offered.rate,
            self.seed,
            self.gateway.name(),
            self.replicas
        );
        if self.balancer != Balancer::RoundRobin {
            label += &format!(", {}", self.balancer.name());
        }
        if self.fault != Fault::Steady {
            label += &format!(", {}", self.fault.name());
        }
        label
    }
}

/// What a run covers.
struct Coverage {
    regimes: &'static [Regime],
    seeds: &'static [u64],
    offered: &'static [Offered],
    /// Replica counts of the peers' sweep.
    replicas: &'static [usize],
    /// The designs run beside the sweep's largest fleet on every offered load.
    centrals: &'static [Gateway],
    /// Rows at `FLEET` replicas on the shared prefix near saturation.
    saturated: &'static [(Gateway, Fault)],
    /// One Envoy with a CPU hog, and session hashing at `FLEET` replicas on multi-turn chat,
    /// on the 2-slot pods only: neither depends on the pods' engine.
    two_slot_extras: bool,
}

const FULL: Coverage = Coverage {
    regimes: &[TWO_SLOT, BATCHING],
    seeds: &SEEDS,
    offered: &[SATURATED, HALF_SATURATED, CHAT],
    replicas: &[1, 2, 4, FLEET],
    centrals: &[Gateway::CentralExtProc, Gateway::SglangCacheAware],
    saturated: &[
        (Gateway::HomesOnly, Fault::Steady),
        (Gateway::Peers, Fault::PeerKilled),
        (Gateway::Peers, Fault::ReplicaJoining),
    ],
    two_slot_extras: true,
};

/// Well within three minutes on 2 cores.
const QUICK: Coverage = Coverage {
    regimes: &[TWO_SLOT],
    seeds: &[SEEDS[0]],
    offered: &[SATURATED],
    replicas: &[1, FLEET],
    centrals: &[Gateway::CentralExtProc],
    saturated: &[(Gateway::Peers, Fault::PeerKilled)],
    two_slot_extras: false,
};

/// Every row of the run, in order: per regime and seed, each offered load swept over the
/// replica counts with the central designs right after (so drift hits them alike), then the
/// rows beside the fleet at saturation.
fn plan(coverage: &Coverage) -> Vec<Setup> {
    let mut all = Vec::new();
    for &regime in coverage.regimes {
        for &seed in coverage.seeds {
            for &offered in coverage.offered {
                let sweep = |replicas| Setup::sweep(regime, offered, seed, replicas);
                all.extend(coverage.replicas.iter().map(|&r| sweep(r)));
                all.extend(coverage.centrals.iter().map(|&g| sweep(FLEET).through(g)));
            }
            let saturated = Setup::sweep(regime, SATURATED, seed, FLEET);
            all.extend(
                coverage
                    .saturated
                    .iter()
                    .map(|&(gateway, fault)| saturated.through(gateway).with_fault(fault)),
            );
            if coverage.two_slot_extras && regime == TWO_SLOT {
                all.push(Setup::sweep(regime, SATURATED, seed, 1).with_fault(Fault::CpuHog));
                all.push(Setup {
                    balancer: Balancer::SessionHash,
                    ..Setup::sweep(regime, CHAT, seed, FLEET)
                });
            }
        }
    }
    all
}

/// Seconds a row spends besides sending its requests: the pods started and scraped, the last
/// requests drained, everything stopped. From part 5's last full run before peers (31 rows,
/// 12.9 minutes, 10.2 of them sending): about 3 s a row and 0.5 s per Envoy started.
const ROW_OVERHEAD_S: f64 = 3.0;
const ENVOY_START_S: f64 = 0.5;
/// SGLang's router until it reports every pod healthy (a Python process).
const ROUTER_START_S: f64 = 3.0;

/// How long the planned rows take: their requests at their rate (every rate is under the pods'
/// knee) plus each row's overhead.
fn estimate_seconds(plan: &[Setup], workloads: &[Workload]) -> f64 {
    plan.iter()
        .map(|setup| {
            let requests = workloads
                .iter()
                .find(|w| w.name == setup.offered.workload)
                .map_or(0, |w| w.requests.len());
            let starting = match setup.gateway {
                Gateway::SglangCacheAware => ROUTER_START_S,
                _ => ENVOY_START_S * setup.replicas as f64,
            };
            ROW_OVERHEAD_S + starting + requests as f64 / setup.offered.rate
        })
        .sum()
}

/// How the hit rate came back after a fleet change, from the pods' counters.
#[derive(Clone, Copy)]
struct Recovery {
    /// The lowest hit rate over a window starting at or after the change.
    worst_window: f64,
    /// Seconds from the change to the end of the first such window within
    /// [`RECOVERY_POINTS`] of the run's mean hit rate; `None`: no window was.
    back_after_s: Option<f64>,
}

#[derive(Clone)]
struct FleetRow {
    setup: Setup,
    ttft: Percentiles,
    errors: usize,
    hit_rate: f64,
    /// Rows whose fleet changed mid-run.
    recovery: Option<Recovery>,
    /// Distinct pods that served each prefix group, averaged over the groups: 1 is a group
    /// cached in one place, more is its prefill repeated and the caches crowded.
    pods_per_group: f64,
    busiest_over_mean: f64,
    /// Requests sent to a full pod while another had a free slot (see `fleet::full_pod_share`).
    full_pod_share: f64,
    scrapes_per_pod_second: f64,
    /// Peer-sync calls each replica made, per second it ran.
    sync_requests_per_replica_second: f64,
    /// Peer answers each replica read, KB per second it ran.
    sync_kb_per_replica_second: f64,
    /// Every gateway process's CPU over the load (the central picker's or router's too), per
    /// request sent.
    cpu_ms_per_request: f64,
}

impl Row for FleetRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("regime", "regime").left(),
        Column::both("gateway", "gateway").left(),
        Column::both("workload", "workload").left(),
        Column::both("balancer", "balancer").left(),
        Column::both("replicas", "replicas"),
        Column::both("rate req/s", "rate"),
        Column::both("seed", "seed"),
        Column::both("fault", "fault").left(),
        TTFT_P50,
        TTFT_P90,
        TTFT_P99,
        ERRORS,
        HIT_RATE,
        Column::both("worst window's hit rate after it", "worst_window_hit_rate"),
        Column::both("s until back near the mean", "recovered_after_s"),
        Column::both("pods per group", "pods_per_group"),
        Column::both("busiest pod / mean", "busiest_over_mean"),
        Column::both(
            "sent to a full pod while one had a free slot",
            "full_pod_share",
        ),
        Column::both("scrapes per pod per s", "scrapes_per_pod_second"),
        Column::both(
            "sync requests per replica per s",
            "sync_requests_per_replica_second",
        ),
        Column::both("sync KB per replica per s", "sync_kb_per_replica_second"),
        Column::both("fleet CPU ms per request", "fleet_cpu_ms_per_request"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let setup = &self.setup;
        let mut cells = vec![
            Cell::Text(setup.regime.name.into()),
            Cell::Text(setup.gateway.name().into()),
            Cell::Text(setup.offered.workload.into()),
            Cell::Text(setup.balancer.name().into()),
            Cell::Count(setup.replicas),
            Cell::Fixed(setup.offered.rate, 0),
            Cell::Count(setup.seed as usize),
            Cell::Text(setup.fault.name().into()),
        ];
        cells.extend(ttft_cells(&self.ttft));
        cells.extend([Cell::Count(self.errors), Cell::Percent(self.hit_rate)]);
        cells.extend(recovery_cells(self.recovery));
        cells.extend([
            Cell::Measure(self.pods_per_group, 2),
            Cell::Measure(self.busiest_over_mean, 2),
            Cell::Percent(self.full_pod_share),
            Cell::Measure(self.scrapes_per_pod_second, 1),
            Cell::Measure(self.sync_requests_per_replica_second, 1),
            Cell::Measure(self.sync_kb_per_replica_second, 1),
            Cell::Measure(self.cpu_ms_per_request, 2),
        ]);
        cells
    }
}

/// "-" where the fleet did not change; "never" where the hit rate did not come back.
fn recovery_cells(recovery: Option<Recovery>) -> [Cell; 2] {
    let none = || Cell::Text("-".into());
    match recovery {
        None => [none(), none()],
        Some(recovery) => [
            Cell::Percent(recovery.worst_window),
            recovery
                .back_after_s
                .map_or(Cell::Text("never".into()), |s| Cell::Measure(s, 2)),
        ],
    }
}

pub fn run(quick: bool) -> Part {
    let coverage = if quick { &QUICK } else { &FULL };
    let workloads = [shared_prefix(quick), multi_turn(quick)];
    // `BENCH_ONLY=a|b` runs the rows whose "regime label" holds a or b, `a$` ends with a
    // (tuning; writes nothing).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let planned: Vec<Setup> = plan(coverage)
        .into_iter()
        .filter(|setup| {
            let name = format!("{} {}", setup.regime.name, setup.label());
            only.is_empty()
                || only.split('|').any(|part| match part.strip_suffix('$') {
                    Some(end) => name.ends_with(end),
                    None => name.contains(part),
                })
        })
        .collect();
    let full = estimate_seconds(&plan(&FULL), &[shared_prefix(false), multi_turn(false)]);
    println!(
        "scale-out: {} rows of 1 to {FLEET} Envoy replicas sharing what they learn, beside one central picker; about {:.0} minutes (the full part: {:.0})",
        planned.len(),
        estimate_seconds(&planned, &workloads) / 60.0,
        full / 60.0
    );
    let best: Vec<f64> = workloads
        .iter()
        .map(|w| best_hit_rate(&Sim::start("oracle", &QUALITY_SIM), &w.requests))
        .collect();
    let rows: Vec<FleetRow> = planned
        .iter()
        .filter_map(|setup| {
            let workload = workloads
                .iter()
                .find(|w| w.name == setup.offered.workload)?;
            let started = Instant::now();
            let row = fleet::run_row(setup, workload);
            print_row(&row, started.elapsed().as_secs_f64());
            Some(row)
        })
        .collect();
    let mut markdown = intro(quick, coverage, &best);
    let mut charts = Vec::new();
    for (index, regime) in coverage.regimes.iter().enumerate() {
        let mine: Vec<FleetRow> = rows
            .iter()
            .filter(|r| r.setup.regime == *regime)
            .cloned()
            .collect();
        markdown += &regime_section(index, regime, &mine);
        charts.push(Chart::named(
            &format!("-{}", regime.slug),
            chart(regime, &mine),
        ));
    }
    Part {
        markdown,
        csv: csv_table(&rows),
        charts,
    }
}

/// One line per row as it finishes, with the seconds it took.
fn print_row(row: &FleetRow, seconds: f64) {
    let recovery = row.recovery.map_or(String::new(), |r| {
        let back = r
            .back_after_s
            .map_or("never".into(), |s| format!("after {s:.2} s"));
        format!(
            ", worst window {:.1} %, back {back}",
            r.worst_window * 100.0
        )
    });
    println!(
        "  {} {}: TTFT p50 {:.0} p90 {:.0} ms, err {}, hit {:.1} %{recovery}, {:.2} pods per group, {:.1} % to a full pod, {:.1} scrapes/pod/s, sync {:.1} req/s {:.1} KB/s per replica, CPU {:.2} ms/request  {seconds:.0} s",
        row.setup.regime.name,
        row.setup.label(),
        row.ttft.p50,
        row.ttft.p90,
        row.errors,
        row.hit_rate * 100.0,
        row.pods_per_group,
        row.full_pod_share * 100.0,
        row.scrapes_per_pod_second,
        row.sync_requests_per_replica_second,
        row.sync_kb_per_replica_second,
        row.cpu_ms_per_request
    );
}

/// One regime's table, chart and goals.
fn regime_section(index: usize, regime: &Regime, rows: &[FleetRow]) -> String {
    let letter = ['a', 'b'].get(index).copied().unwrap_or('x');
    format!(
        "### 5{letter}. {0} pods\n\n{1}\n![Replicas against hit rate and TTFT p90, {0} pods](results/5-scaleout-{2}.svg)\n\n#### Goals, {0} pods\n\n{3}\n",
        regime.name,
        markdown_table(rows),
        regime.slug,
        goals::goals(rows, regime)
    )
}

/// `best`: the best hit rate any router could reach on each workload.
fn intro(quick: bool, coverage: &Coverage, best: &[f64]) -> String {
    let (groups, conversations) = if quick {
        ("32 groups x 12 chats", "33 conversations x 6 turns")
    } else {
        ("32 groups x 32 chats", "65 conversations x 8 turns")
    };
    let slots = |flag| flag_value(&QUALITY_SIM, flag);
    let batching = |flag| flag_value(&BATCHING_SIM, flag);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let covered = if quick {
        format!(
            "This quick run: the 2-slot pods, seed {}, 1 and {FLEET} replicas, the shared \
             prefix at {SATURATION_RATE} req/s, the central ext_proc picker and a peer killed.",
            SEEDS[0]
        )
    } else {
        format!(
            "Not run: 16 replicas. On this machine's {cores} cores, 16 Envoys beside 8 pods and \
             the client would measure the CPU they fight over, not the design. Nothing else \
             was cut."
        )
    };
    format!(
        "## 5. Scale-out: Envoy replicas that share what they learn\n\n\
         Part 3's two regimes of 8 pods: 2-slot pods ({} sequences at a time, each timed on \
         its own) and the batching engine (continuous batching of up to {} sequences); part 3 \
         describes both. In front of them, 1 to {FLEET} Envoy replicas, each `--concurrency 1` \
         with its own filter, deployed as the shipped `envoy.yaml` tells a user to: its picker \
         configuration unchanged but for `pool.peers`, whose `port` is the replica's own peer \
         port and whose `addresses` list every replica's peer address, its own included \
         (`syncInterval` and the rest at their defaults). Through those ports the replicas \
         share their requests in flight, their prefix placements and their share of the \
         scrapes, by way of one of them, the hub (the first address whose replica is up), \
         which calls every other replica and relays what each told it. The client sends request `n` to replica `n mod r`, as a round-robin L4 \
         balancer does, or (session hash) every turn of a conversation to the replica its id \
         hashes to. Every row starts fresh pods and gateways.\n\n\
         Beside them, on the same pods, loads and arrival seeds, each right after the sweep of \
         its load: the architecture this design must beat, the same {FLEET} Envoys \
         (`--concurrency 1`, `ext_proc` in the filter's place) all calling one central ext_proc \
         picker (`bench/extproc`: this scheduling core behind gRPC, GIE's and llm-d's shape) \
         whose one brain sees every placement at the price of a hop; SGLang's router \
         (`--policy cache_aware`) as the one router in front of the pods; and, at {FLEET} \
         replicas on the shared prefix at {SATURATION_RATE} req/s, the previous design (homes \
         only: no `pool.peers`, `pool.replicas: {FLEET}`, each replica scraping every pod once \
         per `{FLEET} x refreshMetricsInterval` and sending a shared prefix to its home pod).\n\n\
         Faults, at {FLEET} replicas on the shared prefix at {SATURATION_RATE} req/s: **peer \
         killed**: when the client sends the request at half of the schedule it stops sending \
         to replica {FLEET}, which is killed by its pid (no goodbye to its peers) once its \
         requests in flight ended, as an L4 balancer drains it; **replica joining**: {} \
         replicas run, every one's `pool.peers` listing all {FLEET}, the last is started at \
         half of the schedule and sent its share once Envoy is ready. In both, the pods' prefix \
         counters are read every {SAMPLE_EVERY_MS} ms: the worst window's hit rate is the \
         lowest over any {WINDOW_S} s window starting at or after the change, and the seconds \
         until back near the mean run from the change to the end of the first such window \
         whose hit rate is at most {RECOVERY_POINTS} points under the row's (the run's mean). \
         **CPU hog beside**: one Envoy with a busy loop spinning in its own process for the \
         whole load (one of the machine's cores, which the pods and the client share too).\n\n\
         Workloads: shared prefix ({groups}) at {SATURATION_RATE} req/s (about the 2-slot \
         pods' saturation) and {HALF_RATE}; multi-turn chat ({conversations}) at \
         {MULTI_TURN_RATE} req/s; seeds {}. Hit rate: prompt tokens the pods served from their \
         prefix caches (their own counters) over prompt tokens. Sent to a full pod while one \
         had a free slot: the requests that reached a pod with as many requests in progress as \
         it runs at once (sent and not finished, as the client saw them) while another pod \
         had fewer; each waited in a queue a better-informed choice would have spared it, \
         which is how two rows with one hit rate differ in TTFT. Scrapes per pod per second \
         are counted at the pods. Sync requests (calls made) and KB (answers read) per replica per \
         second come from the replicas' `peers.*` counters, over the seconds each replica ran. \
         Fleet CPU per request is the process CPU of every gateway process (the replicas, plus \
         the central picker or SGLang's router) over the load, per request sent. The best hit \
         rate any router could reach (every request where all earlier ones of its prefix went, \
         nothing evicted): {:.1} % on the shared prefix, {:.1} % on multi-turn chat.\n\n\
         {covered}\n\n",
        slots("--max-num-seqs"),
        batching("--max-num-seqs"),
        FLEET - 1,
        coverage
            .seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        best.first().copied().unwrap_or(f64::NAN) * 100.0,
        best.get(1).copied().unwrap_or(f64::NAN) * 100.0,
    )
}

/// Hit rate and TTFT p90 against the replica count for peers on the shared prefix near
/// saturation, first seed; the central ext_proc picker's as flat lines across the same range.
fn chart(regime: &Regime, rows: &[FleetRow]) -> String {
    let sweep: Vec<&FleetRow> = rows
        .iter()
        .filter(|r| r.setup == Setup::sweep(*regime, SATURATED, SEEDS[0], r.setup.replicas))
        .collect();
    let central = rows.iter().find(|r| {
        r.setup
            == Setup::sweep(*regime, SATURATED, SEEDS[0], FLEET).through(Gateway::CentralExtProc)
    });
    let replicas: Vec<f64> = sweep.iter().map(|r| r.setup.replicas as f64).collect();
    let span = [
        replicas.iter().copied().fold(f64::INFINITY, f64::min),
        replicas.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    ];
    let peers = |label: &str, value: fn(&FleetRow) -> f64| {
        let points = sweep
            .iter()
            .map(|r| (r.setup.replicas as f64, value(r)))
            .collect();
        (label.to_string(), points)
    };
    let flat = |label: &str, value: fn(&FleetRow) -> f64| {
        let points = central
            .filter(|_| span[0] <= span[1])
            .map_or(Vec::new(), |c| {
                span.iter().map(|&x| (x, value(c))).collect()
            });
        (label.to_string(), points)
    };
    let hit = |r: &FleetRow| r.hit_rate * 100.0;
    let p90 = |r: &FleetRow| r.ttft.p90;
    line_chart_on(
        YAxis::Linear,
        &format!(
            "{} pods, shared prefix at {SATURATION_RATE} req/s, seed {}: replicas vs hit rate and TTFT p90",
            regime.name, SEEDS[0]
        ),
        "Envoy replicas",
        "hit rate % / TTFT p90 ms",
        &[
            peers("peers: hit rate %", hit),
            peers("peers: TTFT p90 ms", p90),
            flat("central ext_proc: hit rate %", hit),
            flat("central ext_proc: TTFT p90 ms", p90),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minutes(coverage: &Coverage, quick: bool) -> f64 {
        let workloads = [shared_prefix(quick), multi_turn(quick)];
        estimate_seconds(&plan(coverage), &workloads) / 60.0
    }

    #[test]
    fn the_full_part_runs_every_row_in_under_forty_minutes() {
        let rows = plan(&FULL);
        let count = |wanted: &dyn Fn(&Setup) -> bool| rows.iter().filter(|s| wanted(s)).count();
        // 2 regimes x 2 seeds x 3 loads x (4 fleet sizes + the central picker + SGLang).
        assert_eq!(
            count(&|s| s.fault == Fault::Steady
                && s.balancer == Balancer::RoundRobin
                && s.gateway != Gateway::HomesOnly),
            72
        );
        assert_eq!(count(&|s| s.fault == Fault::PeerKilled), 4);
        assert_eq!(count(&|s| s.fault == Fault::ReplicaJoining), 4);
        assert_eq!(count(&|s| s.gateway == Gateway::HomesOnly), 4);
        assert_eq!(count(&|s| s.fault == Fault::CpuHog), 2);
        assert_eq!(count(&|s| s.balancer == Balancer::SessionHash), 2);
        let full = minutes(&FULL, false);
        println!(
            "the full part: about {full:.1} minutes, {} rows",
            rows.len()
        );
        assert!(full < 40.0, "{full:.1} minutes");
    }

    #[test]
    fn the_quick_part_runs_the_sweep_ends_the_central_picker_and_a_killed_peer() {
        let rows = plan(&QUICK);
        let gateways: Vec<(&str, usize, &str)> = rows
            .iter()
            .map(|s| (s.gateway.name(), s.replicas, s.fault.name()))
            .collect();
        assert_eq!(
            gateways,
            [
                ("peers", 1, "none"),
                ("peers", FLEET, "none"),
                ("central ext_proc", FLEET, "none"),
                ("peers", FLEET, "peer killed"),
            ]
        );
        let quick = minutes(&QUICK, true);
        println!("the quick part: about {quick:.1} minutes");
        assert!(quick < 3.0, "{quick:.1} minutes");
    }
}
