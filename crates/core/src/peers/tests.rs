//! Replicas, each its own process (shared data, callouts), wired to each other by hand: what one
//! calls, the other's `serve::reply` answers.

use super::*;
use crate::config::load;
use crate::harness::test;
use crate::host::fake::{FakeClock, FakeShared, FakeVm};
use crate::shared_keys::SharedKeys;
use crate::tick_driver::TickDriver;
use std::collections::BTreeSet;
use std::rc::Rc;

const SECRET: &str = "replicas-share-this-secret";
const PODS: usize = 8;

fn config(peers: &[&str]) -> String {
    let endpoints: Vec<String> = (1..=PODS)
        .map(|i| format!("{{address: '10.0.0.{i}:8000'}}"))
        .collect();
    let peers: Vec<String> = peers.iter().map(|p| format!("'{p}'")).collect();
    format!(
        "pool:\n  refreshMetricsInterval: 50ms\n  endpoints: [{}]\n  peers: {{port: 9100, secret: {SECRET}, syncInterval: 100ms, addresses: [{}]}}\n",
        endpoints.join(", "),
        peers.join(", ")
    )
}

struct Replica {
    address: String,
    host: FakeVm,
    driver: TickDriver,
    slot: PoolSlot,
}

impl Replica {
    fn new(address: &str, peers: &[&str], seed: u64, clock: &Rc<FakeClock>) -> Self {
        Replica::with_config(address, &config(peers), seed, clock)
    }

    fn with_config(address: &str, text: &str, seed: u64, clock: &Rc<FakeClock>) -> Self {
        let config = load(text, seed).unwrap();
        let peers = config.pool.peers.clone().map(Peers::new);
        let keys = SharedKeys::under("r");
        let coordinator = Coordinator::new(keys.clone(), seed, 50);
        let mut slot = PoolSlot::new("p".into(), config);
        slot.peer_keys = Some(keys.clone());
        Replica {
            address: address.into(),
            host: FakeVm::in_process(Rc::<FakeShared>::default(), Rc::clone(clock)),
            driver: TickDriver::new(Some(coordinator), peers),
            slot,
        }
    }

    fn tick(&mut self) {
        self.driver.on_tick(&self.host, &mut self.slot);
    }

    /// This replica's answer to a peer's call at `path`, as its peer listener gives it.
    fn serve(&self, path: &str, secret: &str) -> (u16, Vec<u8>) {
        let config = self.slot.data.settings().peers.as_ref().unwrap();
        let keys = self.slot.peer_keys.as_ref().unwrap();
        let reply = serve::reply(
            config,
            &*self.host.shared,
            keys,
            path,
            Some(9100),
            Some(secret),
        );
        (reply.status, reply.body)
    }

    /// Answers every scrape sent since the last call (an idle pod); the pods scraped.
    fn answer_scrapes(&mut self) -> Vec<String> {
        let scrapes: Vec<_> = {
            let mut sent = self.host.callouts.sent.borrow_mut();
            let (scrapes, peers) = sent
                .drain(..)
                .partition(|c| c.cluster != "inference_picker_peers");
            *sent = peers;
            scrapes
        };
        let mut pods = Vec::new();
        for call in scrapes {
            let cap = self.slot.data.body_cap(call.token).unwrap_or(0);
            let page = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n";
            let answer = self
                .host
                .callouts
                .answer(call.token, Some("200"), page, cap);
            self.driver
                .on_callout_response(&self.host, &mut self.slot, call.token, &answer);
            pods.extend(call.authority().map(str::to_owned));
        }
        pods
    }

    fn peer_calls(&self) -> Vec<(u32, String, String)> {
        let sent = self.host.callouts.sent.borrow();
        sent.iter()
            .filter(|c| c.cluster == "inference_picker_peers")
            .map(|c| {
                let header = |name: &str| {
                    c.headers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                (c.token, header(":authority"), header(":path"))
            })
            .collect()
    }

    /// The token of this replica's latest call to `address`.
    fn latest_call_to(&self, address: &str) -> u32 {
        let calls = self.peer_calls();
        calls.iter().rev().find(|(_, a, _)| a == address).unwrap().0
    }

    fn deliver(&mut self, token: u32, status: u16, body: Vec<u8>) {
        let answer = CalloutAnswer {
            status: Some(status.to_string().into_bytes()),
            body_size: body.len(),
            body: Ok(body),
        };
        self.driver
            .on_callout_response(&self.host, &mut self.slot, token, &answer);
    }

    /// The pods this replica scrapes, as of its last tick.
    fn owned(&self) -> usize {
        let peers = self.driver.peers().unwrap();
        peers.share.iter().filter(|&&ours| ours).count()
    }

    fn in_flight(&self, index: usize) -> u32 {
        self.slot.data.pool().get(index).unwrap().total_in_flight()
    }
}

/// A state from origin 9 claiming `in_flight` at the first pods, in order.
fn claiming(in_flight: Vec<(u32, u64)>) -> Vec<u8> {
    let state = wire::ReplicaState {
        origin: 9,
        seq: 1,
        newest_batch: 0,
        pods: (1..=in_flight.len())
            .map(|i| format!("10.0.0.{i}:8000"))
            .collect(),
        in_flight,
        ..wire::ReplicaState::default()
    };
    wire::frame(&state, &[])
}

fn clock_at(ms: u64) -> Rc<FakeClock> {
    Rc::new(FakeClock(std::cell::Cell::new(ms)))
}

/// Every replica answers every call the others (and itself) sent.
fn sync(replicas: &mut [Replica]) {
    let calls: Vec<(usize, u32, String, String)> = replicas
        .iter()
        .enumerate()
        .flat_map(|(from, r)| {
            let calls = r.peer_calls();
            r.host
                .callouts
                .sent
                .borrow_mut()
                .retain(|c| c.cluster != "inference_picker_peers");
            calls.into_iter().map(move |(t, a, p)| (from, t, a, p))
        })
        .collect();
    for (from, token, address, path) in calls {
        let to = replicas.iter().position(|r| r.address == address);
        let (status, body) = match to {
            Some(to) => replicas[to].serve(&path, SECRET),
            None => (503, Vec::new()),
        };
        replicas[from].deliver(token, status, body);
    }
}

fn fleet(n: usize, clock: &Rc<FakeClock>) -> Vec<Replica> {
    let addresses: Vec<String> = (1..=n).map(|i| format!("10.1.0.{i}:9100")).collect();
    let listed: Vec<&str> = addresses.iter().map(String::as_str).collect();
    addresses
        .iter()
        .enumerate()
        .map(|(i, a)| Replica::new(a, &listed, 100 + i as u64, clock))
        .collect()
}

/// Ticks every replica, answers its scrapes and syncs them, `rounds` sync intervals; the pods
/// each replica scraped.
fn run(replicas: &mut [Replica], clock: &FakeClock, rounds: usize) -> Vec<Vec<String>> {
    let mut scraped = vec![Vec::new(); replicas.len()];
    for _ in 0..rounds {
        for (replica, scraped) in replicas.iter_mut().zip(&mut scraped) {
            replica.tick();
            scraped.extend(replica.answer_scrapes());
        }
        sync(replicas);
        clock.advance(100);
    }
    scraped
}

#[test]
fn replicas_split_the_scrapes_and_each_pod_is_scraped_once() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(3, &clock);
    run(&mut replicas, &clock, 3);
    for replica in &replicas {
        assert_eq!(replica.driver.peers().unwrap().live(clock.0.get()), 2);
    }
    // Once every replica knows the others, ten intervals: each pod ten times, by one replica.
    let scraped = run(&mut replicas, &clock, 10);
    let mut owners: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
    for (replica, pods) in scraped.iter().enumerate() {
        for pod in pods {
            owners.entry(pod.as_str()).or_default().push(replica);
        }
    }
    assert_eq!(owners.len(), PODS, "{owners:?}");
    for (pod, by) in &owners {
        assert!(by.iter().all(|&r| r == by[0]), "{pod} scraped by {by:?}");
        assert!(
            (9..=11).contains(&by.len()),
            "{pod} scraped {} times",
            by.len()
        );
    }
    let shares: Vec<usize> = scraped.iter().map(|pods| pods.len()).collect();
    assert!(
        shares.iter().all(|&n| n < PODS * 10),
        "the scrapes are split: {shares:?}"
    );
    // Every replica sees every pod fresh, its own share and the others'.
    for replica in &replicas {
        let fresh = replica
            .slot
            .data
            .pool()
            .endpoints
            .iter()
            .filter(|e| e.last_scrape_ok_ms.is_some())
            .count();
        assert_eq!(fresh, PODS, "{}", replica.address);
    }
}

#[test]
fn in_flight_counts_and_placements_reach_every_replica() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(3, &clock);
    run(&mut replicas, &clock, 2);
    replicas[0].slot.data.add_in_flight(4, 100);
    replicas[0].slot.data.add_in_flight(4, 100);
    replicas[1].slot.data.add_in_flight(4, 10);
    let placement = LearnedPrefix {
        endpoint: 6,
        hashes: vec![11, 22, 33],
    };
    // Another worker VM of replica 2 placed it and shares it with its lease holder.
    let keys = SharedKeys::under("r");
    let mut worker = Coordinator::new(keys.clone(), 77, 50);
    let mut worker_slot = PoolSlot::new("p".into(), load(&config(&["10.1.0.3:9100"]), 77).unwrap());
    let store = &*replicas[2].host.shared;
    worker
        .exchange_load(store, &mut worker_slot, clock.0.get())
        .unwrap();
    worker
        .exchange_prefixes(store, std::slice::from_ref(&placement))
        .unwrap();
    // One tick publishes, one sync carries it, the next tick hands it to every VM.
    run(&mut replicas, &clock, 2);
    for replica in &replicas {
        assert_eq!(replica.in_flight(4), 3, "{}", replica.address);
    }
    for replica in &replicas[..2] {
        let placements = relayed_placements(&replica.host.shared, &keys);
        assert_eq!(placements, vec![placement.clone()], "{}", replica.address);
    }
}

#[test]
fn a_dead_peer_stops_counting_and_its_pods_are_taken_over() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(2, &clock);
    run(&mut replicas, &clock, 2);
    replicas[1].slot.data.add_in_flight(0, 10);
    run(&mut replicas, &clock, 2);
    assert_eq!(replicas[0].in_flight(0), 1);
    assert!(replicas[0].owned() < PODS);
    // Replica 1 dies: its calls go unanswered (Envoy answers 503, no healthy upstream).
    let mut alone = vec![replicas.remove(0)];
    for _ in 0..3 {
        alone[0].tick();
        sync(&mut alone);
        clock.advance(100);
    }
    alone[0].tick();
    let peers = alone[0].driver.peers().unwrap();
    assert_eq!(peers.live(clock.0.get()), 0);
    assert_eq!(alone[0].owned(), PODS, "every pod is scraped again");
    assert_eq!(alone[0].in_flight(0), 0, "the dead peer's requests expired");
    assert!(peers.counts().failed >= 1);
}

#[test]
fn forged_and_oversized_answers_are_refused_and_counted() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(2, &clock);
    run(&mut replicas, &clock, 1);
    replicas[0].tick();
    clock.advance(100);
    replicas[0].tick();
    let token = replicas[0].latest_call_to("10.1.0.2:9100");
    replicas[0].deliver(token, 200, claiming(vec![(u32::MAX, 0)]));
    assert_eq!(replicas[0].in_flight(0), 0, "nothing of it was believed");
    let peers = replicas[0].driver.peers().unwrap();
    assert_eq!(peers.counts().refused, 1);
    // A body over maxStateBytes is never read: the edge hands over an empty body.
    clock.advance(100);
    replicas[0].tick();
    let token = replicas[0].latest_call_to("10.1.0.2:9100");
    let answer = CalloutAnswer {
        status: Some(b"200".to_vec()),
        body_size: 50 << 20,
        body: Ok(Vec::new()),
    };
    let first = &mut replicas[0];
    first
        .driver
        .on_callout_response(&first.host, &mut first.slot, token, &answer);
    assert_eq!(replicas[0].driver.peers().unwrap().counts().refused, 2);
}

#[test]
fn a_restarted_peer_is_a_new_origin_and_a_late_state_changes_nothing() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(2, &clock);
    run(&mut replicas, &clock, 2);
    // Replica 1 restarts: a new process, a new origin, at the same address.
    let listed = ["10.1.0.1:9100", "10.1.0.2:9100"];
    replicas[1] = Replica::new("10.1.0.2:9100", &listed, 999, &clock);
    replicas[1].slot.data.add_in_flight(2, 5);
    run(&mut replicas, &clock, 3);
    assert_eq!(
        replicas[0].in_flight(2),
        1,
        "the new origin's counts are taken"
    );
    assert_eq!(replicas[0].driver.peers().unwrap().live(clock.0.get()), 1);
}

#[test]
fn peers_found_through_discovery_are_called_and_dropped_when_gone() {
    let clock = clock_at(1_000);
    let text = config(&[]).replace(
        "addresses: []",
        "discovery: {cluster: k8s, selector: {matchLabels: {app: gateway}}, targetPorts: [9100]}",
    );
    let mut replica = Replica::with_config("10.1.0.1:9100", &text, 5, &clock);
    replica.tick();
    let list = |ips: &[&str]| {
        let pods: Vec<String> = ips
            .iter()
            .map(|ip| format!(r#"{{"metadata":{{"name":"{ip}"}},"status":{{"phase":"Running","podIP":"{ip}","conditions":[{{"type":"Ready","status":"True"}}]}}}}"#))
            .collect();
        format!(r#"{{"items":[{}]}}"#, pods.join(",")).into_bytes()
    };
    let discovery = |replica: &Replica| {
        let sent = replica.host.callouts.sent.borrow();
        sent.iter().find(|c| c.cluster == "k8s").map(|c| c.token)
    };
    let token = discovery(&replica).expect("a discovery call");
    replica.host.callouts.sent.borrow_mut().clear();
    replica.deliver(token, 200, list(&["10.1.0.1", "10.1.0.2", "10.1.0.3"]));
    clock.advance(100);
    replica.tick();
    let called: BTreeSet<String> = replica
        .peer_calls()
        .into_iter()
        .map(|(_, a, _)| a)
        .collect();
    let expected = ["10.1.0.1:9100", "10.1.0.2:9100", "10.1.0.3:9100"];
    assert_eq!(called, expected.iter().map(|a| a.to_string()).collect());
    // A replica scaled away is no longer called.
    clock.advance(10_000);
    replica.host.callouts.sent.borrow_mut().clear();
    replica.tick();
    let token = discovery(&replica).expect("discovery again");
    replica.deliver(token, 200, list(&["10.1.0.1", "10.1.0.3"]));
    clock.advance(100);
    replica.host.callouts.sent.borrow_mut().clear();
    replica.tick();
    let called: BTreeSet<String> = replica
        .peer_calls()
        .into_iter()
        .map(|(_, a, _)| a)
        .collect();
    assert!(!called.contains("10.1.0.2:9100"), "{called:?}");
    assert!(called.contains("10.1.0.3:9100"), "{called:?}");
}

#[test]
fn replicas_whose_clocks_disagree_by_an_hour_still_share_fresh_scrapes() {
    let (slow, fast) = (clock_at(1_000), clock_at(3_601_000));
    let listed = ["10.1.0.1:9100", "10.1.0.2:9100"];
    let mut replicas = vec![
        Replica::new(listed[0], &listed, 1, &slow),
        Replica::new(listed[1], &listed, 2, &fast),
    ];
    for _ in 0..6 {
        for replica in replicas.iter_mut() {
            replica.tick();
            replica.answer_scrapes();
        }
        sync(&mut replicas);
        slow.advance(100);
        fast.advance(100);
    }
    for replica in &replicas {
        let peers = replica.driver.peers().unwrap();
        assert_eq!(
            peers.live(replica.host.clock.0.get()),
            1,
            "{}",
            replica.address
        );
        // Each sees every pod fresh: its own share, and the other's by age, not by stamp.
        let pool = replica.slot.data.pool();
        let fresh = pool
            .endpoints
            .iter()
            .filter(|e| e.health == crate::endpoint::Health::Fresh)
            .count();
        assert_eq!(fresh, PODS, "{}", replica.address);
    }
}

#[test]
fn a_peers_in_flight_claim_counts_only_up_to_what_the_pod_reports() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(2, &clock);
    run(&mut replicas, &clock, 2);
    clock.advance(100);
    replicas[0].tick();
    let token = replicas[0].latest_call_to("10.1.0.2:9100");
    // Well-formed, under the wire's bound, and far beyond the idle pods' report (0 running,
    // 0 waiting): believed only up to that report plus what a fleet places between scrapes.
    let claimed = claiming(vec![(50_000, 50_000 * 1_000), (3, 3_000)]);
    replicas[0].deliver(token, 200, claimed);
    clock.advance(100);
    replicas[0].tick();
    assert_eq!(replicas[0].in_flight(0), CLAIM_BEYOND_REPORT);
    assert_eq!(
        replicas[0].in_flight(1),
        3,
        "a plausible claim counts whole"
    );
    let peers = replicas[0].driver.peers().unwrap();
    assert_eq!(peers.counts().refused, 0, "bounded, not refused");
}

/// Peer calls each replica made in the last round, by replica.
/// The placements the lease holder relayed to the Envoy's other VMs, from every kept slot.
fn relayed_placements(shared: &FakeShared, keys: &SharedKeys) -> Vec<LearnedPrefix> {
    let mut placements = Vec::new();
    for slot in 0..crate::shared_state::BATCH_SLOTS {
        if let Some((bytes, _)) = shared
            .get(&keys.prefix(crate::shared_state::PEERS_RELAY, slot))
            .unwrap()
        {
            crate::placement_batches::decode_batches(&bytes, 0, &mut placements);
        }
    }
    placements
}

fn calls_per_replica(replicas: &[Replica]) -> Vec<usize> {
    replicas.iter().map(|r| r.peer_calls().len()).collect()
}

/// Ticks every replica once and counts the peer calls sent, without answering them yet.
fn tick_and_count(replicas: &mut [Replica]) -> Vec<usize> {
    for replica in replicas.iter_mut() {
        replica.tick();
        replica.answer_scrapes();
    }
    calls_per_replica(replicas)
}

#[test]
fn eight_replicas_sync_through_one_hub_with_two_calls_per_peer_an_interval() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(8, &clock);
    run(&mut replicas, &clock, 3);
    let calls = tick_and_count(&mut replicas);
    // The first address calls the 7 others; each of them calls only it: 2 (N - 1), not
    // N (N - 1).
    assert_eq!(calls, vec![7, 1, 1, 1, 1, 1, 1, 1]);
    sync(&mut replicas);
    clock.advance(100);
    assert!(replicas[0].driver.peers().unwrap().is_hub());
    // Replica 7's request and placement reach replica 4, two hops away.
    replicas[7].slot.data.add_in_flight(3, 100);
    let placement = LearnedPrefix {
        endpoint: 5,
        hashes: vec![41, 42],
    };
    let keys = SharedKeys::under("r");
    let mut worker = Coordinator::new(keys.clone(), 77, 50);
    let mut worker_slot = PoolSlot::new("p".into(), load(&config(&["10.1.0.8:9100"]), 77).unwrap());
    let store = &*replicas[7].host.shared;
    worker
        .exchange_prefixes(store, std::slice::from_ref(&placement))
        .unwrap();
    worker
        .exchange_load(store, &mut worker_slot, clock.0.get())
        .unwrap();
    run(&mut replicas, &clock, 3);
    for replica in &replicas {
        assert_eq!(replica.in_flight(3), 1, "{}", replica.address);
        assert_eq!(
            replica.driver.peers().unwrap().live(clock.0.get()),
            7,
            "{}",
            replica.address
        );
    }
    let placements = relayed_placements(&replicas[4].host.shared, &keys);
    assert!(placements.contains(&placement), "{placements:?}");
    // The hub relays it once: replica 4 passes nothing on.
    assert!(!replicas[4].driver.peers().unwrap().is_hub());
}

#[test]
fn when_the_hub_dies_the_next_address_takes_over_and_nobody_counts_the_dead_one() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(4, &clock);
    run(&mut replicas, &clock, 3);
    replicas[0].slot.data.add_in_flight(2, 10);
    run(&mut replicas, &clock, 2);
    assert_eq!(replicas[3].in_flight(2), 1);
    // The hub dies: its address answers nothing (Envoy: 503, no healthy upstream).
    replicas.remove(0);
    run(&mut replicas, &clock, 5);
    assert!(
        replicas[0].driver.peers().unwrap().is_hub(),
        "10.1.0.2 is the hub now"
    );
    let calls = tick_and_count(&mut replicas);
    // The new hub still checks the dead address ahead of it now and then; the others call
    // the new hub, and sometimes the dead address.
    assert!(
        calls[0] >= 2 && calls[1..].iter().all(|&n| n <= 2),
        "{calls:?}"
    );
    sync(&mut replicas);
    clock.advance(100);
    run(&mut replicas, &clock, 2);
    for replica in &replicas {
        let now = clock.0.get();
        assert_eq!(
            replica.driver.peers().unwrap().live(now),
            2,
            "{}",
            replica.address
        );
        assert_eq!(
            replica.in_flight(2),
            0,
            "{}: the dead hub's requests expired",
            replica.address
        );
        assert!(replica.owned() < PODS);
    }
}

#[test]
fn a_replica_that_comes_back_ahead_of_the_hub_becomes_the_hub_again() {
    let clock = clock_at(1_000);
    let mut replicas = fleet(3, &clock);
    run(&mut replicas, &clock, 3);
    let first = replicas.remove(0);
    run(&mut replicas, &clock, 4);
    assert!(replicas[0].driver.peers().unwrap().is_hub());
    // A new process at the first address (a new origin).
    let listed = ["10.1.0.1:9100", "10.1.0.2:9100", "10.1.0.3:9100"];
    drop(first);
    replicas.insert(0, Replica::new(listed[0], &listed, 555, &clock));
    run(&mut replicas, &clock, 6);
    let hubs: Vec<bool> = replicas
        .iter()
        .map(|r| r.driver.peers().unwrap().is_hub())
        .collect();
    assert_eq!(hubs, vec![true, false, false]);
    for replica in &replicas {
        assert_eq!(
            replica.driver.peers().unwrap().live(clock.0.get()),
            2,
            "{}",
            replica.address
        );
    }
}
