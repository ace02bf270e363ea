//! One row: fresh pods, the gateway processes in front of them, the load (with the row's fault),
//! and what the pods and the gateway processes counted over it.

use super::{
    Fault, FleetRow, Gateway, Recovery, Setup, Workload, RECOVERY_POINTS, SAMPLE_EVERY_MS, WINDOW_S,
};
use crate::load::{open_loop_routed, sorted, OpenLoop, Percentiles};
use crate::procfs::cpu_seconds;
use crate::quality::{prefix_counts, prefix_hit_rate};
use crate::setup::{self, ext_proc_envoy, ExtProcPicker, Running};
use crate::support::{
    eventually, free_port, shipped_picker_config, stop, with_endpoints, Envoy, Sim,
};
use crate::workloads::flag_value;
use serde_yaml::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The filter's peer-sync counters in Envoy's stats.
const PEER_STATS: &str = "wasmcustom.inference_picker.peers";
/// Requests an Envoy is serving (the shipped listener's connection manager).
const ACTIVE_REQUESTS: &str = "http.inference_gateway.downstream_rq_active";
/// A replica leaving the fleet is killed after this even with requests in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// How often a waiting thread looks again.
const POLL: Duration = Duration::from_millis(5);

pub(super) fn run_row(setup: &Setup, workload: &Workload) -> FleetRow {
    let sims: Vec<Sim> = (1..=8)
        .map(|i| Sim::start(&format!("pod-{i}"), setup.regime.sim))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    // Every replica's peer port, the joining one's too: a fleet lists its members up front.
    let peer_ports: Vec<u16> = match setup.gateway {
        Gateway::Peers => (0..setup.replicas).map(|_| free_port()).collect(),
        _ => Vec::new(),
    };
    let mut fleet = Fleet::start(&refs, setup, &peer_ports);
    fleet.wait_until_serving(&refs, setup.gateway);
    let scrapes = || refs.iter().map(|s| s.metrics_scrapes()).sum::<u64>();
    let scrapes_before = scrapes();
    let hog = (setup.fault == Fault::CpuHog).then(CpuHog::start);
    let measured = measure(&mut fleet, &refs, setup, workload, &peer_ports);
    let scraped = scrapes() - scrapes_before;
    drop(hog);
    if let Some(at) = measured.changed_at {
        print_hit_rates_after(&measured.timeline, at);
    }
    fleet_row(setup, workload, &refs, &measured, scraped)
}

/// The gateway processes of one row.
struct Fleet {
    /// The Envoys the client sends to, in the balancer's order; none before SGLang's router.
    replicas: Vec<Envoy>,
    /// The one process every request also passes: the central ext_proc picker, or SGLang's
    /// router (which the client then sends to).
    central: Option<Central>,
}

enum Central {
    Picker(ExtProcPicker),
    Router(Running),
}

impl Central {
    fn pid(&self) -> u32 {
        match self {
            Central::Picker(picker) => picker.pid(),
            Central::Router(router) => router.pid(),
        }
    }
}

impl Fleet {
    fn start(sims: &[&Sim], setup: &Setup, peer_ports: &[u16]) -> Fleet {
        let replicas_alone = |replicas| Fleet {
            replicas,
            central: None,
        };
        match setup.gateway {
            Gateway::Peers => replicas_alone(start_all(setup.starting_replicas(), |index| {
                start_peer(sims, index, peer_ports)
            })),
            Gateway::HomesOnly => {
                let config = config_without_peers(sims, setup.replicas);
                replicas_alone(start_all(setup.replicas, |_| Envoy::start(&config, 1)))
            }
            Gateway::CentralExtProc => {
                let picker = ExtProcPicker::start(&config_without_peers(sims, 1));
                let replicas = start_all(setup.replicas, |_| ext_proc_envoy(sims, &picker, 1));
                Fleet {
                    replicas,
                    central: Some(Central::Picker(picker)),
                }
            }
            Gateway::SglangCacheAware => Fleet {
                replicas: Vec::new(),
                central: Some(Central::Router(
                    setup::Gateway::Sglang("cache_aware").start(sims),
                )),
            },
        }
    }

    /// Where the client sends: each replica, or the router.
    fn addresses(&self) -> Vec<String> {
        match &self.central {
            Some(Central::Router(router)) => vec![router.address()],
            _ => self.replicas.iter().map(Envoy::address).collect(),
        }
    }

    /// Until whatever reads the pods' metrics has scraped each twice and, with peers, every
    /// replica counts all the others live: a fleet in its steady state.
    fn wait_until_serving(&self, sims: &[&Sim], gateway: Gateway) {
        if gateway == Gateway::SglangCacheAware {
            // It reads no metrics, and started once it counted every pod healthy.
            return;
        }
        for sim in sims {
            sim.wait_for_scrapes(2);
        }
        if gateway == Gateway::Peers {
            let others = self.replicas.len().saturating_sub(1) as f64;
            for replica in &self.replicas {
                eventually("every other replica live", Duration::from_secs(10), || {
                    replica.stat(&format!("{PEER_STATS}.live")) == Some(others)
                });
            }
        }
    }
}

/// `count` Envoys started side by side, as a Deployment rolls out its pods.
fn start_all(count: usize, start: impl Fn(usize) -> Envoy + Sync) -> Vec<Envoy> {
    let start = &start;
    std::thread::scope(|scope| {
        let started: Vec<_> = (0..count)
            .map(|index| scope.spawn(move || start(index)))
            .collect();
        started
            .into_iter()
            .map(|handle| handle.join().expect("an Envoy replica started"))
            .collect()
    })
}

/// Replica `index` of the fleet with these peer ports, as a user deploys it.
fn start_peer(sims: &[&Sim], index: usize, peer_ports: &[u16]) -> Envoy {
    let own = peer_ports
        .get(index)
        .copied()
        .expect("a peer port per replica");
    Envoy::start(&config_with_peers(sims, own, peer_ports), 1)
}

/// The shipped configuration for these pods, `pool.peers` with this replica's own port and
/// every replica's address (its own included).
fn config_with_peers(sims: &[&Sim], own: u16, fleet: &[u16]) -> String {
    let mut config = shipped_config(sims);
    let peers = &mut config["pool"]["peers"];
    peers["port"] = u64::from(own).into();
    let addresses = fleet
        .iter()
        .map(|port| format!("127.0.0.1:{port}").into())
        .collect();
    peers["addresses"] = Value::Sequence(addresses);
    serde_yaml::to_string(&config).expect("config")
}

/// The shipped configuration for these pods with no `pool.peers` and `pool.replicas` set:
/// replicas that never talk, or (1) the central picker.
fn config_without_peers(sims: &[&Sim], replicas: usize) -> String {
    let mut config = shipped_config(sims);
    let pool = &mut config["pool"];
    if let Some(map) = pool.as_mapping_mut() {
        map.remove("peers");
    }
    pool["replicas"] = (replicas as u64).into();
    serde_yaml::to_string(&config).expect("config")
}

fn shipped_config(sims: &[&Sim]) -> Value {
    serde_yaml::from_str(&with_endpoints(&shipped_picker_config(), sims)).expect("config")
}

/// What a gateway process has used so far.
#[derive(Clone, Copy)]
struct Usage {
    at: Instant,
    cpu_seconds: f64,
    /// Peer-sync calls made (answered, failed or refused).
    sync_calls: f64,
    /// Bytes of peer answers read.
    sync_bytes: f64,
}

impl Usage {
    fn of_replica(envoy: &Envoy) -> Usage {
        let peers = |what: &str| envoy.stat(&format!("{PEER_STATS}.{what}")).unwrap_or(0.0);
        Usage {
            sync_calls: peers("synced") + peers("failed") + peers("refused"),
            sync_bytes: peers("bytes"),
            ..Usage::of_process(envoy.pid())
        }
    }

    fn of_process(pid: u32) -> Usage {
        Usage {
            at: Instant::now(),
            cpu_seconds: cpu_seconds(pid),
            sync_calls: 0.0,
            sync_bytes: 0.0,
        }
    }
}

/// A process's usage from when it entered the measurement to when it left it.
struct Span {
    first: Usage,
    last: Usage,
    /// An Envoy the client sends to (the sync rates are per replica).
    replica: bool,
}

/// What the fleet used over the load, summed over its processes.
#[derive(Default)]
struct Used {
    cpu_seconds: f64,
    sync_calls: f64,
    sync_bytes: f64,
    replica_seconds: f64,
}

impl Used {
    fn of(spans: &[Span]) -> Used {
        let mut used = Used::default();
        for span in spans {
            used.cpu_seconds += span.last.cpu_seconds - span.first.cpu_seconds;
            used.sync_calls += span.last.sync_calls - span.first.sync_calls;
            used.sync_bytes += span.last.sync_bytes - span.first.sync_bytes;
            if span.replica {
                used.replica_seconds += (span.last.at - span.first.at).as_secs_f64();
            }
        }
        used
    }
}

/// The pods' prefix-cache counters at one moment of the load.
#[derive(Clone, Copy)]
struct HitSample {
    /// Seconds into the load.
    at: f64,
    hits: f64,
    queries: f64,
}

/// What a load measured besides each request's exchange.
struct Measured {
    load: OpenLoop,
    used: Used,
    /// The pods' prefix counters through the load.
    timeline: Vec<HitSample>,
    /// Seconds into the load the fleet changed (a peer died, a replica took its first request).
    changed_at: Option<f64>,
}

/// How the fleet changed mid-run.
enum Change {
    Left { span: Span, at: f64 },
    Joined { envoy: Envoy, first: Usage, at: f64 },
}

/// Runs the load. A fleet change waits for the request at half of the schedule: from then on
/// the client spreads over the replicas left, or over all of them once the joining one is up.
fn measure(
    fleet: &mut Fleet,
    sims: &[&Sim],
    setup: &Setup,
    workload: &Workload,
    peer_ports: &[u16],
) -> Measured {
    let addresses = fleet.addresses();
    let central_first = fleet.central.as_ref().map(|c| Usage::of_process(c.pid()));
    let mut firsts: Vec<Usage> = fleet.replicas.iter().map(Usage::of_replica).collect();
    let leaving = match setup.fault {
        Fault::PeerKilled => fleet.replicas.pop().zip(firsts.pop()),
        _ => None,
    };
    let half = workload.requests.len() / 2;
    let (half_sent, done) = (AtomicBool::new(false), AtomicBool::new(false));
    let joined: OnceLock<String> = OnceLock::new();
    let started = Instant::now();
    let route = |n: usize| {
        if n >= half {
            half_sent.store(true, Ordering::SeqCst);
        }
        let joiner = joined.get();
        let taking = match setup.fault {
            Fault::PeerKilled if half_sent.load(Ordering::SeqCst) => addresses.len() - 1,
            Fault::ReplicaJoining if joiner.is_some() => addresses.len() + 1,
            _ => addresses.len(),
        };
        let index = setup.balancer.replica(workload, n, taking);
        addresses
            .get(index)
            .or(joiner)
            .cloned()
            .expect("an address for every replica taking requests")
    };
    let (half_sent, joined) = (&half_sent, &joined);
    let join = || start_peer(sims, setup.replicas - 1, peer_ports);
    let (load, (spans, changed_at), timeline) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| sample_hits(sims, started, &done));
        let change = scope.spawn(move || match (setup.fault, leaving) {
            (Fault::PeerKilled, Some((envoy, first))) => {
                Some(kill_at_half(envoy, first, half_sent, started))
            }
            (Fault::ReplicaJoining, _) => Some(join_at_half(join, half_sent, started, joined)),
            _ => None,
        });
        let load = open_loop_routed(
            &workload.requests,
            setup.offered.rate,
            setup.seed,
            &route,
            &[],
        );
        done.store(true, Ordering::SeqCst);
        // The change settled long before the load ended: every process's usage is read now,
        // not after the sampler's last reading.
        let change = change.join().expect("the fleet change");
        let spans = spans_until_now(fleet, firsts, central_first, change);
        (load, spans, sampler.join().expect("the sampler"))
    });
    Measured {
        load,
        used: Used::of(&spans),
        timeline,
        changed_at,
    }
}

/// Every process's span in the measurement, those still running ending now; and when the
/// fleet changed, if it did.
fn spans_until_now(
    fleet: &Fleet,
    firsts: Vec<Usage>,
    central_first: Option<Usage>,
    change: Option<Change>,
) -> (Vec<Span>, Option<f64>) {
    let replica = |first, last| Span {
        first,
        last,
        replica: true,
    };
    let mut spans: Vec<Span> = firsts
        .into_iter()
        .zip(&fleet.replicas)
        .map(|(first, envoy)| replica(first, Usage::of_replica(envoy)))
        .collect();
    if let (Some(first), Some(central)) = (central_first, &fleet.central) {
        spans.push(Span {
            first,
            last: Usage::of_process(central.pid()),
            replica: false,
        });
    }
    let changed_at = change.map(|change| match change {
        Change::Left { span, at } => {
            spans.push(span);
            at
        }
        Change::Joined { envoy, first, at } => {
            spans.push(replica(first, Usage::of_replica(&envoy)));
            at
        }
    });
    (spans, changed_at)
}

/// Once the request at half of the schedule is sent (the client sends the leaving replica
/// nothing more), lets the replica finish what it was sent and kills it by its pid, with no
/// goodbye to its peers.
fn kill_at_half(envoy: Envoy, first: Usage, half_sent: &AtomicBool, started: Instant) -> Change {
    wait_for(half_sent);
    // A request routed to it just before may still be on its way in.
    std::thread::sleep(POLL * 4);
    let deadline = Instant::now() + DRAIN_LIMIT;
    while envoy.stat(ACTIVE_REQUESTS) != Some(0.0) && Instant::now() < deadline {
        std::thread::sleep(POLL);
    }
    let last = Usage::of_replica(&envoy);
    drop(envoy);
    Change::Left {
        span: Span {
            first,
            last,
            replica: true,
        },
        at: started.elapsed().as_secs_f64(),
    }
}

/// Once the request at half of the schedule is sent, starts the joining replica and, once
/// Envoy is ready, gives the client its address.
fn join_at_half(
    start: impl FnOnce() -> Envoy,
    half_sent: &AtomicBool,
    started: Instant,
    address: &OnceLock<String>,
) -> Change {
    wait_for(half_sent);
    let envoy = start();
    let first = Usage::of_replica(&envoy);
    let _ = address.set(envoy.address());
    Change::Joined {
        envoy,
        first,
        at: started.elapsed().as_secs_f64(),
    }
}

fn wait_for(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        std::thread::sleep(POLL);
    }
}

/// The pods' prefix counters every [`SAMPLE_EVERY_MS`] until `done`, and once more then.
fn sample_hits(sims: &[&Sim], started: Instant, done: &AtomicBool) -> Vec<HitSample> {
    let sample = || {
        let at = started.elapsed().as_secs_f64();
        let (hits, queries) = prefix_counts(sims);
        HitSample { at, hits, queries }
    };
    let mut samples = Vec::new();
    while !done.load(Ordering::SeqCst) {
        samples.push(sample());
        std::thread::sleep(Duration::from_millis(SAMPLE_EVERY_MS));
    }
    samples.push(sample());
    samples
}

/// `(window end, hit rate)` of every [`WINDOW_S`] window of the samples starting at or after
/// `from`, in order; windows in which no prompt reached the pods are left out.
fn windows_from(samples: &[HitSample], from: f64) -> Vec<(f64, f64)> {
    samples
        .iter()
        .enumerate()
        .filter(|(_, start)| start.at >= from)
        .filter_map(|(i, start)| {
            let end = samples[i..].iter().find(|s| s.at >= start.at + WINDOW_S)?;
            let queries = end.queries - start.queries;
            (queries > 0.0).then(|| (end.at, (end.hits - start.hits) / queries))
        })
        .collect()
}

/// How the hit rate came back after the change at `changed_at` against the run's `mean`; `None`
/// if no window followed it.
fn recovery(samples: &[HitSample], changed_at: f64, mean: f64) -> Option<Recovery> {
    let windows = windows_from(samples, changed_at);
    let worst_window = windows.iter().map(|&(_, rate)| rate).reduce(f64::min)?;
    let back_after_s = windows
        .iter()
        .find(|&&(_, rate)| rate >= mean - RECOVERY_POINTS / 100.0)
        .map(|&(end, _)| end - changed_at);
    Some(Recovery {
        worst_window,
        back_after_s,
    })
}

fn fleet_row(
    setup: &Setup,
    workload: &Workload,
    sims: &[&Sim],
    measured: &Measured,
    scraped: u64,
) -> FleetRow {
    let load = &measured.load;
    let used = &measured.used;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let hit_rate = prefix_hit_rate(sims);
    let (pods_per_group, busiest_over_mean) = spread(workload, load, sims.len());
    // Zero where no replica syncs (no peers, or SGLang's router alone).
    let per_replica_second = |total: f64| total / used.replica_seconds.max(1e-9);
    FleetRow {
        setup: *setup,
        ttft: Percentiles::of(&sorted(load.ok.iter().map(|e| ms(e.first_byte)).collect())),
        errors: load.errors,
        hit_rate,
        recovery: measured
            .changed_at
            .and_then(|at| recovery(&measured.timeline, at, hit_rate)),
        pods_per_group,
        busiest_over_mean,
        full_pod_share: full_pod_share(load, sims, flag_value(setup.regime.sim, "--max-num-seqs")),
        scrapes_per_pod_second: scraped as f64 / sims.len() as f64 / load.elapsed.max(1e-9),
        sync_requests_per_replica_second: per_replica_second(used.sync_calls),
        sync_kb_per_replica_second: per_replica_second(used.sync_bytes) / 1024.0,
        cpu_ms_per_request: used.cpu_seconds * 1000.0 / workload.requests.len().max(1) as f64,
    }
}

/// The hit rate of about back-to-back windows from the change on, for the log.
fn print_hit_rates_after(samples: &[HitSample], changed_at: f64) {
    let samples_per_window = (WINDOW_S * 1000.0 / SAMPLE_EVERY_MS as f64)
        .round()
        .max(1.0);
    let rates: Vec<String> = windows_from(samples, changed_at)
        .into_iter()
        .step_by(samples_per_window as usize)
        .map(|(_, rate)| format!("{:.1}", rate * 100.0))
        .collect();
    println!(
        "    hit rate % per {WINDOW_S} s window from the change at {changed_at:.1} s: {}",
        rates.join(" ")
    );
}

/// Distinct pods per prefix group (averaged over the groups), and the busiest pod's requests
/// over the mean per pod.
fn spread(workload: &Workload, load: &OpenLoop, pods: usize) -> (f64, f64) {
    let mut picks: BTreeMap<&str, usize> = BTreeMap::new();
    let mut group_pods: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (exchange, &n) in load.ok.iter().zip(&load.ok_requests) {
        *picks.entry(exchange.pod.as_str()).or_default() += 1;
        let group = workload.groups.get(n).copied().unwrap_or(n);
        group_pods.entry(group).or_default().insert(&exchange.pod);
    }
    let pods_per_group = group_pods.values().map(BTreeSet::len).sum::<usize>() as f64
        / group_pods.len().max(1) as f64;
    let mean = load.ok.len() as f64 / pods.max(1) as f64;
    let busiest = picks.values().copied().max().unwrap_or(0) as f64;
    (pods_per_group, busiest / mean.max(1e-9))
}

/// The share of the requests sent to a pod that was full (as many requests in progress as it
/// runs at once, as the client saw them: sent and not finished) while another pod had a free
/// slot: each waited in a queue a better-informed choice would have spared it. Hit rates can
/// be equal and TTFT far apart; this says why.
fn full_pod_share(load: &OpenLoop, sims: &[&Sim], slots: f64) -> f64 {
    let spans: Vec<(&str, f64, f64)> = load
        .ok
        .iter()
        .zip(&load.ok_sent_at)
        .map(|(e, &at)| (e.pod.as_str(), at, at + e.total.as_secs_f64()))
        .collect();
    let in_progress = |pod: &str, at: f64, except: usize| {
        spans
            .iter()
            .enumerate()
            .filter(|&(j, &(p, from, to))| j != except && p == pod && from <= at && at < to)
            .count() as f64
    };
    let full_with_free_elsewhere = spans
        .iter()
        .enumerate()
        .filter(|&(i, &(pod, at, _))| {
            in_progress(pod, at, i) >= slots
                && sims.iter().any(|sim| in_progress(&sim.name, at, i) < slots)
        })
        .count();
    full_with_free_elsewhere as f64 / spans.len().max(1) as f64
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

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(points: &[(f64, f64, f64)]) -> Vec<HitSample> {
        points
            .iter()
            .map(|&(at, hits, queries)| HitSample { at, hits, queries })
            .collect()
    }

    #[test]
    fn the_hit_rate_recovers_at_the_end_of_the_first_window_near_the_mean() {
        // From 5 s: a window at 50 %, then windows at 90 %.
        let timeline = samples(&[
            (4.0, 0.0, 0.0),
            (5.0, 0.0, 0.0),
            (6.0, 50.0, 100.0),
            (7.0, 140.0, 200.0),
            (8.0, 230.0, 300.0),
        ]);
        let recovered = recovery(&timeline, 5.0, 0.9).expect("windows after the change");
        assert_eq!(recovered.worst_window, 0.5);
        assert_eq!(recovered.back_after_s, Some(2.0));
        let never = recovery(&timeline, 5.0, 0.95).expect("windows after the change");
        assert_eq!(never.back_after_s, None);
        assert!(
            recovery(&timeline, 7.5, 0.9).is_none(),
            "no window after 7.5 s"
        );
    }
}
