//! Several Envoy replicas in front of the same pods, each `--concurrency 1` with the shipped
//! configuration and `pool.peers` listing the fleet: they share what they learn through their
//! peer ports, so a prefix lands on the same pod whichever replica takes it, each pod is
//! scraped about as often as one Envoy would, a replica that dies stops counting and one that
//! joins learns from the others; and the peer path is a wall.

mod support;

use serde_yaml::Value;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{
    eventually, free_port, request, shipped_picker_config, with_endpoints, BackgroundLoad, Envoy,
    Sim, MODEL,
};

const SECRET: &str = "replicas-test-peer-secret";
const PEERS: &str = "wasmcustom.inference_picker.peers";

/// A chat whose system prompt (about 1,500 characters) is tenant `tenant`'s and whose
/// question is `question`'s.
fn chat(tenant: usize, question: usize) -> String {
    let system = format!("Tenant {tenant} system prompt. ").repeat(60);
    let user = format!("Question {question} of tenant {tenant}?");
    format!(
        r#"{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
    )
}

/// The shipped picker config for these pods (in this order), with this replica's peer port
/// and the fleet's peer addresses.
fn replica_config(sims: &[&Sim], own_port: u16, fleet: &[u16]) -> String {
    let mut config: Value =
        serde_yaml::from_str(&with_endpoints(&shipped_picker_config(), sims)).expect("yaml");
    let addresses: Vec<String> = fleet.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let peers = format!(
        "{{port: {own_port}, secret: {SECRET}, addresses: [{}]}}",
        addresses.join(", ")
    );
    config["pool"]["peers"] = serde_yaml::from_str(&peers).expect("peers");
    serde_yaml::to_string(&config).expect("yaml")
}

/// Replica `index` of a fleet with these peer ports, its pods in the order `order`.
fn start_replica(sims: &[Sim], order: &[usize], index: usize, ports: &[u16]) -> Envoy {
    let members: Vec<&Sim> = order.iter().map(|&i| &sims[i]).collect();
    Envoy::start(&replica_config(&members, ports[index], ports), 1)
}

/// Three member orders, as discovery or separately edited configs may list the pods.
fn orders(n: usize) -> [Vec<usize>; 3] {
    [
        (0..n).collect(),
        (0..n).rev().collect(),
        (0..n).map(|i| (i + 2) % n).collect(),
    ]
}

fn wait_for_live_peers(envoy: &Envoy, live: usize) {
    eventually(
        &format!("{live} live peers"),
        Duration::from_secs(10),
        || envoy.stat(&format!("{PEERS}.live")) == Some(live as f64),
    );
}

/// One chat of `tenant` to every replica at the same moment (question `wave`); the pods.
fn concurrently(envoys: &[Envoy], tenant: usize, wave: usize) -> Vec<String> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = envoys
            .iter()
            .enumerate()
            .map(|(replica, envoy)| {
                scope.spawn(move || {
                    let body = chat(tenant, wave * envoys.len() + replica);
                    let response = envoy.post("/v1/chat/completions", &body);
                    assert_eq!(response.status, 200, "{}", response.text());
                    response.pod()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    })
}

/// The replica's last `n` decision lines, with their scores, for a failure message.
fn last_decisions(envoy: &Envoy, n: usize) -> String {
    let log = envoy.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("decision request_id") || l.contains("scores"))
        .collect();
    lines[lines.len().saturating_sub(n * 2)..].join("\n")
}

fn start_pods(n: usize) -> Vec<Sim> {
    (1..=n)
        .map(|i| Sim::start(&format!("pod-{i}"), &[]))
        .collect()
}

#[test]
fn concurrent_replicas_in_different_member_orders_converge_on_the_same_pods() {
    let sims = start_pods(6);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let envoys: Vec<Envoy> = orders(sims.len())
        .iter()
        .enumerate()
        .map(|(i, order)| start_replica(&sims, order, i, &ports))
        .collect();
    for envoy in &envoys {
        envoy.wait_for_fresh_endpoints(sims.len());
        wait_for_live_peers(envoy, 2);
    }
    let mut homes = BTreeSet::new();
    for tenant in 0..12 {
        // Every replica takes one of the tenant's chats at the same moment: they may race.
        let first = concurrently(&envoys, tenant, 0);
        // Once the replicas synced, whichever takes the tenant's next chats sends them where
        // one of the first went, all to the same pod.
        for envoy in &envoys {
            let synced = envoy.stat(&format!("{PEERS}.synced")).unwrap_or(0.0);
            eventually("two more syncs", Duration::from_secs(5), || {
                envoy.stat(&format!("{PEERS}.synced")).unwrap_or(0.0) >= synced + 4.0
            });
        }
        let mut next = concurrently(&envoys, tenant, 1);
        next.extend(concurrently(&envoys, tenant, 2));
        if next.iter().any(|pod| *pod != next[0]) || !first.contains(&next[0]) {
            let why: Vec<String> = envoys.iter().map(|e| last_decisions(e, 2)).collect();
            panic!(
                "tenant {tenant} went to {first:?}, then {next:?}:\n{}",
                why.join("\n")
            );
        }
        homes.insert(next[0].clone());
    }
    assert!(
        homes.len() >= 3,
        "12 tenants spread over the pods: {homes:?}"
    );
    for envoy in &envoys {
        assert!(envoy.stat(&format!("{PEERS}.synced")).unwrap_or(0.0) > 0.0);
        assert_eq!(envoy.stat(&format!("{PEERS}.refused")), Some(0.0));
        assert!(!envoy.log().contains("panicked"), "{}", envoy.log());
    }
}

#[test]
fn three_replicas_scrape_each_pod_about_as_often_as_one() {
    let sims = start_pods(6);
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let order: Vec<usize> = (0..sims.len()).collect();
    let envoys: Vec<Envoy> = (0..3)
        .map(|i| start_replica(&sims, &order, i, &ports))
        .collect();
    for envoy in &envoys {
        wait_for_live_peers(envoy, 2);
    }
    let before: Vec<u64> = sims.iter().map(Sim::metrics_scrapes).collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let seconds = started.elapsed().as_secs_f64();
    // One Envoy scrapes each pod every refreshMetricsInterval (50 ms): 20 a second. Three
    // that never split would scrape 60.
    for (sim, before) in sims.iter().zip(before) {
        let rate = (sim.metrics_scrapes() - before) as f64 / seconds;
        assert!(
            (10.0..=30.0).contains(&rate),
            "{} scraped {rate:.1}/s",
            sim.address
        );
    }
    // Every replica still sees every pod fresh: its own share and the others'.
    for envoy in &envoys {
        envoy.wait_for_fresh_endpoints(sims.len());
    }
}

#[test]
fn a_killed_replica_stops_counting_and_a_joining_one_learns_from_the_others() {
    let sims = start_pods(6);
    let ports: Vec<u16> = (0..4).map(|_| free_port()).collect();
    let order: Vec<usize> = (0..sims.len()).collect();
    // Replica 3 is listed from the start and joins later.
    let mut envoys: Vec<Envoy> = (0..3)
        .map(|i| start_replica(&sims, &order, i, &ports))
        .collect();
    for envoy in &envoys {
        wait_for_live_peers(envoy, 2);
    }
    let homes: Vec<String> = (0..6)
        .map(|tenant| {
            envoys[0]
                .post("/v1/chat/completions", &chat(tenant, 0))
                .pod()
        })
        .collect();
    let load = BackgroundLoad::start(&envoys[1].address(), 2);
    std::thread::sleep(Duration::from_millis(300));
    // Killed by its pid: no goodbye to its peers.
    drop(envoys.remove(2));
    for envoy in &envoys {
        wait_for_live_peers(envoy, 1);
    }
    std::thread::sleep(Duration::from_millis(300));
    let served = load.finish();
    assert!(served.len() > 10, "load ran: {}", served.len());
    let failed: Vec<_> = served.iter().filter(|s| s.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed",
        failed.len(),
        served.len()
    );
    // The joiner: within a second of coming up it sends every tenant's next chat where the
    // others did. Two answers from each peer: the VM that speaks to the peers merged them and
    // its Envoy's other VMs took them on their next tick.
    let joiner = start_replica(&sims, &order, 3, &ports);
    let up = Instant::now();
    wait_for_live_peers(&joiner, 2);
    while joiner.stat(&format!("{PEERS}.synced")).unwrap_or(0.0) < 4.0
        && up.elapsed() < Duration::from_secs(1)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (tenant, home) in homes.iter().enumerate() {
        let pod = joiner.post("/v1/chat/completions", &chat(tenant, 1)).pod();
        assert_eq!(&pod, home, "tenant {tenant} from the joiner");
    }
}

#[test]
fn the_peer_path_is_a_wall_on_the_clients_port_and_to_a_wrong_secret() {
    let sims = start_pods(2);
    let port = free_port();
    let members: Vec<&Sim> = sims.iter().collect();
    let envoy = Envoy::start(&replica_config(&members, port, &[port]), 1);
    envoy.wait_for_fresh_endpoints(2);
    let path = "/inference-picker/peers";
    let peer = format!("127.0.0.1:{port}");
    let on_client_port = request(
        &envoy.address(),
        "GET",
        path,
        &[("x-inference-picker-peer-secret", SECRET)],
        b"",
    );
    assert_eq!(on_client_port.status, 404, "{}", on_client_port.text());
    let http2ish = request(
        &envoy.address(),
        "POST",
        &format!("{path}?since=0"),
        &[("x-inference-picker-peer-secret", SECRET)],
        b"{}",
    );
    assert_eq!(http2ish.status, 404);
    let no_secret = request(&peer, "GET", path, &[], b"");
    assert_eq!(no_secret.status, 403);
    let wrong = request(
        &peer,
        "GET",
        path,
        &[(
            "x-inference-picker-peer-secret",
            "replicas-test-peer-secreT",
        )],
        b"",
    );
    assert_eq!(wrong.status, 403);
    let served = request(
        &peer,
        "GET",
        path,
        &[("x-inference-picker-peer-secret", SECRET)],
        b"",
    );
    assert_eq!(served.status, 200);
    assert!(served.body.starts_with(b"IPR1"), "a replica state");
    eventually("callers refused counted", Duration::from_secs(5), || {
        envoy.stat(&format!("{PEERS}.callers_refused")) == Some(4.0)
    });
    // None of it reached a pod.
    let requests: u64 = sims.iter().map(Sim::requests_total).sum();
    assert_eq!(requests, 0);
}

/// A peer that answers whatever `answer` says, over HTTP/1.1, until stopped.
struct FakePeer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakePeer {
    fn start(answer: fn(usize) -> Vec<u8>) -> FakePeer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut served = 0;
            while !stopping.load(Ordering::Relaxed) && Instant::now() < deadline {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let mut buffer = [0u8; 4096];
                let _ = stream.read(&mut buffer);
                let _ = stream.write_all(&answer(served));
                served += 1;
            }
        });
        FakePeer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn http_answer(body: &[u8]) -> Vec<u8> {
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(body);
    answer
}

#[test]
fn forged_and_oversized_peer_answers_are_refused_and_counted() {
    let sims = start_pods(2);
    // One peer forges a state (a pod outside the pool with a huge load); the other sends 50 MB.
    let forger = FakePeer::start(|n| {
        let json = br#"{"origin":7,"seq":SEQ,"pods":["10.9.9.9:8000"],"inFlight":[[4000000000,0]],"scrapes":[]}"#;
        let json = String::from_utf8_lossy(json).replace("SEQ", &(n + 1).to_string());
        let mut body = b"IPR1".to_vec();
        body.extend_from_slice(&(json.len() as u32).to_le_bytes());
        body.extend_from_slice(json.as_bytes());
        http_answer(&body)
    });
    let flooder = FakePeer::start(|_| http_answer(&vec![b'x'; 50 << 20]));
    let port = free_port();
    let members: Vec<&Sim> = sims.iter().collect();
    let config = replica_config(&members, port, &[port, forger.port, flooder.port]);
    let envoy = Envoy::start(&config, 1);
    envoy.wait_for_fresh_endpoints(2);
    eventually("both peers refused", Duration::from_secs(10), || {
        envoy.stat(&format!("{PEERS}.refused")).unwrap_or(0.0) >= 4.0
    });
    assert_eq!(envoy.stat(&format!("{PEERS}.live")), Some(0.0));
    // Routing goes on as if alone.
    for question in 0..4 {
        let response = envoy.post("/v1/chat/completions", &chat(0, question));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let log = envoy.log();
    assert!(log.contains("refused peer"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
