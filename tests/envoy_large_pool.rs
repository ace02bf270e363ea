//! A pool larger than Envoy's default circuit breakers (1,024 connections and requests per
//! cluster), in real Envoy with the shipped config: every endpoint is scraped, through the
//! scrapes' own cluster without overflow, requests are served, and the log stays short. The
//! figures at 1,024 to 16,384 endpoints are the benchmark's (`make bench-memory`), not a test's.

mod support;

use std::time::{Duration, Instant};
use support::{completion, shipped_picker_config, with_addresses, with_pool_keys, Envoy, SimPool};

const ENDPOINTS: usize = 2048;

#[test]
fn every_endpoint_of_a_pool_beyond_the_default_breakers_is_scraped() {
    let pods = SimPool::start(ENDPOINTS);
    let addresses: Vec<&str> = pods.addresses.iter().map(String::as_str).collect();
    let picker = with_pool_keys(
        &with_addresses(&shipped_picker_config(), &addresses),
        "refreshMetricsInterval: 1s, metricsStalenessThreshold: 10s",
    );
    let envoy = Envoy::start(&picker, 2);
    let deadline = Instant::now() + Duration::from_secs(60);
    let fresh = loop {
        let fresh = envoy
            .stat("wasmcustom.inference_picker.endpoints_fresh")
            .unwrap_or(0.0);
        if fresh as usize == ENDPOINTS || Instant::now() > deadline {
            break fresh;
        }
        // The polling interval of a wait for every endpoint, sparing the admin thread.
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(fresh as usize, ENDPOINTS, "endpoints with fresh metrics");
    assert_eq!(
        envoy.stat("wasmcustom.inference_picker.scrapes_unsent"),
        Some(0.0)
    );
    for overflow in ["upstream_cx_overflow", "upstream_rq_pending_overflow"] {
        assert_eq!(
            envoy.stat(&format!("cluster.inference_picker_metrics.{overflow}")),
            Some(0.0),
            "{overflow}"
        );
    }
    for n in 0..20 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    // The first round turned 2,048 endpoints Fresh: a summary line, not one per endpoint.
    let log = envoy.log();
    let lines = log
        .lines()
        .filter(|line| line.contains("inference-picker:") && line.contains("[warning]"))
        .count();
    assert!(lines < 20, "{lines} warning lines:\n{log}");
}
