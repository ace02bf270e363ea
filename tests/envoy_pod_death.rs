//! A pod dies under load behind the shipped `envoy/envoy.yaml`, three ways: killed (SIGKILL),
//! refusing new connections while its open ones still answer (scrapes included), and stopped
//! gracefully (SIGTERM: the simulator stops accepting, finishes what it holds, exits). Each
//! time no client sees an error (Envoy retries what the pod did not take on the picker's next
//! pick), the pod is not picked again while it is gone, and it is picked again once it is back.

mod support;

use std::time::{Duration, Instant};
use support::{
    eventually, shipped_picker_config, with_endpoints, with_pool_keys, BackgroundLoad, Envoy,
    Served, Sim,
};

/// Clients in flight through the gateway.
const CLIENTS: usize = 6;

/// The shipped configs with these pods; a short back-off keeps the test short.
fn gateway(sims: &[&Sim], backoff: &str) -> Envoy {
    let picker = with_pool_keys(
        &with_endpoints(&shipped_picker_config(), sims),
        &format!("passiveHealthBackoff: {backoff}"),
    );
    let envoy = Envoy::start(&picker, 2);
    for sim in sims {
        sim.wait_for_scrapes(3);
    }
    envoy
}

/// Several ticks (50 ms): a span in which every worker adds the picks it made to the counter.
const TICKS: Duration = Duration::from_millis(200);

/// Waits until no worker picks `address` any more and every pick made is counted: its counter
/// holds still for [`TICKS`]. Returns the count.
fn settled_picks(envoy: &Envoy, address: &str) -> u64 {
    let mut settled = 0;
    eventually(
        &format!("{address} to be no longer picked"),
        Duration::from_secs(3),
        || {
            let before = envoy.endpoint_picks(address);
            // A window, not a wait: the counter must not move during it.
            std::thread::sleep(TICKS);
            settled = envoy.endpoint_picks(address);
            settled == before
        },
    );
    settled
}

/// While the load runs, once the pod is no longer picked: its picks do not move for `window`
/// (it is not picked while it is gone). Returns the count.
fn not_picked_for(envoy: &Envoy, load: &BackgroundLoad, address: &str, window: Duration) -> u64 {
    let before = settled_picks(envoy, address);
    let answered = load.answered();
    // A time window, not a wait: the pod must stay unpicked all through it.
    std::thread::sleep(window);
    assert!(
        load.answered() > answered + 20,
        "requests kept flowing: {answered} -> {}",
        load.answered()
    );
    let after = settled_picks(envoy, address);
    assert_eq!(before, after, "{address} was picked while it was gone");
    after
}

/// Waits until the counter shows `address` picked again after `gone` picks.
fn picked_again(envoy: &Envoy, address: &str, gone: u64) {
    eventually(
        &format!("{address}'s picks to count again"),
        Duration::from_secs(5),
        || envoy.endpoint_picks(address) > gone,
    );
}

/// Waits until `pod` has served a request again since `back`.
fn served_again(load: &BackgroundLoad, pod: &str, back: Instant) {
    eventually(
        &format!("{pod} serves again"),
        Duration::from_secs(10),
        || load.any(|s| s.pod == pod && s.status == 200 && s.at > back),
    );
}

/// Every response a 200; some served by `pod` after `since`.
fn check(served: &[Served], pod: &str, since: Instant, envoy: &Envoy) {
    let errors: Vec<&Served> = served.iter().filter(|s| s.status != 200).collect();
    assert!(
        errors.is_empty(),
        "{} of {} requests failed: {:?}\n{}",
        errors.len(),
        served.len(),
        errors.iter().take(5).collect::<Vec<_>>(),
        envoy.log()
    );
    assert!(
        served.iter().any(|s| s.pod == pod && s.at > since),
        "{pod} served nothing after it came back"
    );
}

/// Pod-a is preferred (the others have queues) and dies under load (SIGKILL or SIGTERM):
/// what it held and what was picked for it before its scrape failed is retried elsewhere.
fn dies_under_load(stop: impl FnOnce(&mut Sim)) {
    let mut a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "3"]);
    let c = Sim::start("pod-c", &["--background-waiting", "3"]);
    let envoy = gateway(&[&a, &b, &c], "2s");
    let load = BackgroundLoad::start(&envoy.address(), CLIENTS);
    load.wait_for(100);
    // Every request answered so far is in the counters.
    envoy.wait_for_decisions(load.answered() as u64);
    assert!(envoy.endpoint_picks(&a.address) > 50, "pod-a is preferred");

    let (address, port) = (a.address.clone(), a.port());
    stop(&mut a);
    // Its next scrape (50 ms) fails and takes it out of rotation.
    envoy.wait_for_fresh_endpoints(2);
    let gone = not_picked_for(&envoy, &load, &address, Duration::from_millis(700));

    let back = Instant::now();
    let _a = Sim::start_at("pod-a", port, &[]);
    served_again(&load, "pod-a", back);
    picked_again(&envoy, &address, gone);
    check(&load.finish(), "pod-a", back, &envoy);
}

#[test]
fn a_killed_pod_costs_no_request() {
    dies_under_load(Sim::kill);
}

#[test]
fn a_pod_stopped_gracefully_costs_no_request() {
    dies_under_load(Sim::terminate);
}

#[test]
fn a_pod_refusing_new_connections_costs_no_request() {
    // pod-a has a queue, so the load goes to b and c: Envoy holds no request connection to
    // pod-a, only the scrapes' keep-alive one.
    let a = Sim::start("pod-a", &["--background-waiting", "3"]);
    let b = Sim::start("pod-b", &[]);
    let c = Sim::start("pod-c", &[]);
    let envoy = gateway(&[&a, &b, &c], "3s");
    let load = BackgroundLoad::start(&envoy.address(), CLIENTS);
    load.wait_for(100);

    // pod-a stops accepting connections for 3 s; its scrapes, on their open connection, still
    // say it is healthy, and now the best pod: b and c get longer queues.
    let refused_at = Instant::now();
    a.admin("fault", r#"{"mode":"refuse","for_ms":3000}"#);
    b.admin("load", r#"{"background_waiting":6}"#);
    c.admin("load", r#"{"background_waiting":6}"#);
    // Each worker picks it, cannot connect, retries on the next pick and avoids pod-a (for
    // the 3 s back-off, which outlasts the refusal).
    eventually("Envoy retried past pod-a", Duration::from_secs(5), || {
        envoy
            .log()
            .lines()
            .any(|l| l.contains("did not take a request") && l.contains(&a.address))
    });
    let gone = not_picked_for(&envoy, &load, &a.address, Duration::from_millis(700));
    assert!(
        refused_at.elapsed() < Duration::from_secs(3),
        "the check ended while pod-a still refused"
    );

    // It listens again; once the back-off ends it is the best pod again.
    let back = refused_at + Duration::from_secs(3);
    served_again(&load, "pod-a", back);
    picked_again(&envoy, &a.address, gone);
    check(&load.finish(), "pod-a", back, &envoy);
}
