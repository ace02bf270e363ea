//! One picker per Envoy: with four workers (five VMs with the main thread) each pod is still
//! scraped about once per interval, and every worker schedules with the whole Envoy's load.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{example_config, shipped_picker_config, with_endpoints, Envoy, Sim, MODEL};

#[test]
fn each_pod_is_scraped_about_once_per_interval_with_four_workers() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a, &b]), 4);
    a.wait_for_scrapes(5);
    let window = Duration::from_secs(2);
    let (start_a, start_b) = (a.metrics_scrapes(), b.metrics_scrapes());
    let started = Instant::now();
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
    let envoy = Arc::new(Envoy::start(
        &with_endpoints(&example_config("active-request.yaml"), &refs),
        4,
    ));
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
