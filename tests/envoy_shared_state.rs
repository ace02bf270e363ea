//! One picker per Envoy: with four workers (five VMs with the main thread) each pod is still
//! scraped about once per interval, and every worker schedules with the whole Envoy's load.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{example_envoy, shipped_picker_config, with_endpoints, Envoy, Sim, MODEL};

/// Envoy configures its workers' VMs at once, and two can read the same time: each VM's id
/// still differs (two with one id count each other's requests in flight as their own and never
/// see them, so flow control and the scorers read half the load).
#[test]
fn every_vm_of_an_envoy_has_its_own_id() {
    let a = Sim::start("pod-a", &[]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a]), 4);
    a.wait_for_scrapes(3);
    let log = envoy.log();
    let ids: Vec<&str> = log
        .lines()
        .filter_map(|line| line.split_once(", VM id ").map(|(_, id)| id.trim()))
        .collect();
    assert!(!ids.is_empty(), "{log}");
    let mut distinct = ids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "{ids:?}");
}

#[test]
fn each_pod_is_scraped_about_once_per_interval_with_four_workers() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a, &b]), 4);
    a.wait_for_scrapes(5);
    let window = Duration::from_secs(2);
    let (start_a, start_b) = (a.metrics_scrapes(), b.metrics_scrapes());
    let started = Instant::now();
    // A measuring window: the scrapes each pod gets in it.
    std::thread::sleep(window);
    let elapsed = started.elapsed().as_secs_f64();
    let one_scraper = elapsed / 0.050; // refreshMetricsInterval: 50ms
    for (sim, start) in [(&a, start_a), (&b, start_b)] {
        let hits = (sim.metrics_scrapes() - start) as f64;
        assert!(
            hits <= 1.5 * one_scraper && hits >= 0.5 * one_scraper,
            "{}: {hits} scrapes in {elapsed:.2}s, one scraper would make {one_scraper:.0}",
            sim.name
        );
    }
    // Every worker still routes with fresh metrics.
    for n in 0..20 {
        let response = envoy.post("/v1/completions", &support::completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert!(
        !envoy.log().contains("no endpoint has fresh metrics"),
        "{}",
        envoy.log()
    );
}

#[test]
fn every_worker_sees_the_requests_the_others_placed() {
    let slow = ["--time-scale", "1"];
    let sims: Vec<Sim> = ["pod-a", "pod-b", "pod-c", "pod-d"]
        .iter()
        .map(|name| Sim::start(name, &slow))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = Arc::new(example_envoy("active-request.yaml", &refs, 4));
    for sim in &refs {
        sim.wait_for_scrapes(3);
    }
    // Four long requests (about 1.2 s each), one every 150 ms: each new connection may land on
    // any worker, and only with the workers' in-flight counts shared does each one find the
    // pod nobody is using. Without sharing, four distinct pods would happen about 1 time in 10.
    for round in 0..2 {
        let picks = Arc::new(Mutex::new(Vec::new()));
        let mut requests = Vec::new();
        for n in 0..4 {
            let (envoy, picks) = (envoy.clone(), picks.clone());
            requests.push(std::thread::spawn(move || {
                let body = format!(
                    r#"{{"model":"{MODEL}","prompt":"round {round} request {n}","max_tokens":120}}"#
                );
                let response = envoy.post("/v1/completions", &body);
                assert_eq!(response.status, 200, "{}", response.text());
                picks.lock().unwrap().push(response.pod());
            }));
            // Pacing, not a wait: one request every 150 ms (three ticks), as said above.
            std::thread::sleep(Duration::from_millis(150));
        }
        for request in requests {
            request.join().expect("request thread");
        }
        let mut picks = picks.lock().unwrap().clone();
        picks.sort();
        picks.dedup();
        assert_eq!(picks.len(), 4, "round {round}: {picks:?}");
    }
}

#[test]
fn shared_system_prompt_sticks_with_four_workers() {
    let sims: Vec<Sim> = ["pod-a", "pod-b", "pod-c"]
        .iter()
        .map(|name| Sim::start(name, &[]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = example_envoy("prefix-and-load.yaml", &refs, 4);
    for sim in &refs {
        sim.wait_for_scrapes(3);
    }
    let system = "You answer questions about the quarterly billing report. ".repeat(40);
    let body = |n: usize| {
        format!(
            r#"{{"model":"{MODEL}","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"question {n}"}}],"max_tokens":4}}"#
        )
    };
    let home = envoy.post("/v1/chat/completions", &body(0)).pod();
    // The other workers replay the pick on their next tick (50 ms). A time window, not a
    // wait: no stat tells what each worker has replayed, and that bound is part of what is
    // checked.
    std::thread::sleep(Duration::from_millis(150));
    for n in 1..16 {
        let response = envoy.post("/v1/chat/completions", &body(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), home, "request {n} left the warm pod");
    }
}

/// The whole Envoy's in-flight requests per endpoint, from the filter's gauge.
fn in_flight(envoy: &Envoy) -> u64 {
    envoy
        .admin_get("/stats/prometheus")
        .text()
        .lines()
        .filter(|line| line.starts_with("inference_picker_endpoint_in_flight{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn wait_for_in_flight(envoy: &Envoy, wanted: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = in_flight(envoy);
        if now == wanted || Instant::now() > deadline {
            return now;
        }
        // The polling interval of a wait for `wanted`.
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn aborted_streams_give_their_slots_back() {
    use std::io::{Read, Write};
    let slow = ["--time-scale", "1"];
    let sims: Vec<Sim> = ["pod-a", "pod-b"]
        .iter()
        .map(|name| Sim::start(name, &slow))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &refs), 4);
    for sim in &refs {
        sim.wait_for_scrapes(3);
    }
    // Six streaming requests of ~3 s each; read the first bytes, then hang up.
    let mut streams = Vec::new();
    for n in 0..6 {
        let body = format!(
            r#"{{"model":"{MODEL}","prompt":"stream {n}","max_tokens":300,"stream":true}}"#
        );
        let mut stream = std::net::TcpStream::connect(envoy.address()).unwrap();
        write!(
            stream,
            "POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut first = [0u8; 64];
        stream.read_exact(&mut first).unwrap();
        streams.push(stream);
    }
    assert_eq!(
        wait_for_in_flight(&envoy, 6),
        6,
        "all six counted while open"
    );
    drop(streams);
    assert_eq!(
        wait_for_in_flight(&envoy, 0),
        0,
        "every aborted stream released"
    );
    // And the pool still serves.
    assert_eq!(
        envoy
            .post("/v1/completions", &support::completion(1))
            .status,
        200
    );
}
