//! Several Envoy replicas in front of the same pods, each with its own filter and nothing
//! shared between them (`envoy/envoy.yaml`, `--concurrency 1`, `pool.replicas` set to the
//! fleet's size): a prompt prefix lands on the same pod whichever replica takes it, and the
//! fleet scrapes each pod about as often as one Envoy would.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::{shipped_picker_config, with_endpoints, with_pool_keys, Envoy, Sim, MODEL};

const REPLICAS: usize = 3;

/// A chat whose system prompt (about 1,500 characters, past the home key's 16 blocks) is
/// tenant `tenant`'s and whose question is `question`'s.
fn chat(tenant: usize, question: usize) -> String {
    let system = format!("Tenant {tenant} system prompt. ").repeat(60);
    let user = format!("Question {question} of tenant {tenant}?");
    format!(
        r#"{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"{user}"}}]}}"#
    )
}

/// The fleet: one Envoy per member order (as discovery or separately edited configs may list
/// the pods), every one the shipped configuration with `pool.replicas: 3`.
fn fleet(sims: &[Sim]) -> Vec<Envoy> {
    let n = sims.len();
    let orders: [Vec<usize>; REPLICAS] = [
        (0..n).collect(),
        (0..n).rev().collect(),
        (0..n).map(|i| (i + 2) % n).collect(),
    ];
    orders
        .iter()
        .map(|order| {
            let members: Vec<&Sim> = order.iter().map(|&i| &sims[i]).collect();
            let config = with_pool_keys(
                &with_endpoints(&shipped_picker_config(), &members),
                &format!("replicas: {REPLICAS}"),
            );
            let envoy = Envoy::start(&config, 1);
            envoy.wait_for_fresh_endpoints(n);
            envoy
        })
        .collect()
}

#[test]
fn a_prefix_lands_on_the_same_pod_from_every_replica() {
    let sims: Vec<Sim> = (1..=6)
        .map(|i| Sim::start(&format!("pod-{i}"), &[]))
        .collect();
    let envoys = fleet(&sims);
    let mut homes = BTreeSet::new();
    for tenant in 0..12 {
        // Each replica sees the tenant's prefix for the first time, with its own question.
        let pods: Vec<String> = envoys
            .iter()
            .enumerate()
            .map(|(replica, envoy)| {
                let response = envoy.post("/v1/chat/completions", &chat(tenant, replica));
                assert_eq!(response.status, 200, "{}", response.text());
                response.pod()
            })
            .collect();
        assert!(
            pods.iter().all(|pod| *pod == pods[0]),
            "tenant {tenant} went to {pods:?}"
        );
        homes.insert(pods[0].clone());
    }
    assert!(
        homes.len() >= 3,
        "12 tenants' prefixes are spread over the pods, not all on one: {homes:?}"
    );
    for envoy in &envoys {
        let log = envoy.log();
        assert!(!log.contains("panicked"), "{log}");
    }
}

#[test]
fn three_replicas_scrape_each_pod_about_as_often_as_one_envoy() {
    let sims: Vec<Sim> = (1..=2)
        .map(|i| Sim::start(&format!("pod-{i}"), &[]))
        .collect();
    let _envoys = fleet(&sims);
    let window = Duration::from_secs(2);
    let before: Vec<u64> = sims.iter().map(Sim::metrics_scrapes).collect();
    let started = Instant::now();
    std::thread::sleep(window);
    let elapsed = started.elapsed().as_secs_f64();
    // One Envoy scrapes each pod once per refreshMetricsInterval (50ms); three replicas with
    // pool.replicas: 3 each once per 150ms, so the pod sees the same rate.
    let one_envoy = elapsed / 0.050;
    for (sim, before) in sims.iter().zip(before) {
        let scrapes = (sim.metrics_scrapes() - before) as f64;
        assert!(
            (0.5 * one_envoy..=1.5 * one_envoy).contains(&scrapes),
            "{}: {scrapes} scrapes in {elapsed:.2}s from {REPLICAS} replicas; one Envoy makes {one_envoy:.0}",
            sim.name
        );
    }
}
