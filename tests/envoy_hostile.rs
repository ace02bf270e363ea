//! Hostile or broken pods, in real Envoy: an oversized `/metrics` page fails that pod's scrape
//! without being read into the VM, and a pod reporting an infinite queue cannot switch the
//! queue scorer off for the others. And configurations with absurd values or unroutable
//! addresses are refused at load, the key named.

mod support;

use std::time::Duration;
use support::{
    completion, eventually, sample, shipped_picker_config, with_addresses, with_endpoints,
    with_pool_keys, Envoy, Sim,
};

/// A picker series' value in `/stats/prometheus` (0 when absent).
fn stat(envoy: &Envoy, series: &str) -> f64 {
    sample(&envoy.admin_get("/stats/prometheus").text(), series).unwrap_or(0.0)
}

fn scrape_failures(envoy: &Envoy, sim: &Sim) -> f64 {
    stat(
        envoy,
        &format!(
            "inference_picker_endpoint_scrape_failure{{endpoint=\"{}\"}}",
            sim.address
        ),
    )
}

/// Over `pool.maxMetricsBytes` (4 MiB by default): the pod is a failed scrape, the others keep
/// routing, its page never reaches the VM's memory, one warning says so, and the pod returns
/// once its page fits again.
#[test]
fn an_oversized_metrics_page_fails_that_pod_only_and_is_never_read() {
    // pod-a is preferred (pod-b has a queue) until its page grows past the cap.
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "3"]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a, &b]), 2);
    a.wait_for_scrapes(3);
    b.wait_for_scrapes(3);
    assert_eq!(envoy.post("/v1/completions", &completion(0)).pod(), "pod-a");
    let memory = |envoy: &Envoy| stat(envoy, "inference_picker_vm_memory_bytes");
    let before = memory(&envoy);
    assert!(before > 0.0);

    a.admin("load", r#"{"metrics_padding_bytes": 8388608}"#);
    let failures = scrape_failures(&envoy, &a);
    // A failing pod is re-probed with back-off (1, 2, 4... intervals): five failures take
    // about 1.6 s at the shipped 50 ms interval.
    eventually(
        "pod-a's oversized scrapes to fail",
        Duration::from_secs(10),
        || scrape_failures(&envoy, &a) >= failures + 5.0,
    );
    for n in 1..10 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "pod-b");
    }
    let warning = format!(
        "/metrics of {} is 8388",
        a.address // 8388608 bytes and a few more
    );
    assert!(
        envoy.wait_for_log_line(&warning).is_some(),
        "{}",
        envoy.log()
    );
    assert!(envoy
        .log()
        .contains("over pool.maxMetricsBytes (4194304): not read, counted as a failed scrape"));
    // Once per VM that held the scrape lease meanwhile (the main thread's and two workers'),
    // not once per scrape.
    let warnings = envoy.log().matches(&warning).count();
    let failed = scrape_failures(&envoy, &a) - failures;
    assert!(
        (1..=3).contains(&warnings) && failed >= 5.0,
        "warned {warnings} times for {failed} failed scrapes"
    );
    // Five 8 MiB pages copied in would have grown the VMs' memory by far more than this.
    let after = memory(&envoy);
    assert!(
        after - before < 4.0 * 1048576.0,
        "VM memory grew from {before} to {after} bytes"
    );

    a.admin("load", r#"{"metrics_padding_bytes": 0}"#);
    eventually("pod-a to return", Duration::from_secs(10), || {
        envoy.post("/v1/completions", &completion(99)).pod() == "pod-a"
    });
}

/// Two 1e308 series sum to +Inf: the pod's queue is unknown (worst), and the queue scorer still
/// ranks the others (before, its min-max turned NaN and scored every pod 0).
#[test]
fn an_infinite_queue_on_one_pod_does_not_disable_the_queue_scorer_for_the_others() {
    let hostile = "vllm:num_requests_waiting{engine=\"1\",model_name=\"x\"} 1e308\\nvllm:num_requests_waiting{engine=\"2\",model_name=\"y\"} 1e308";
    let a = Sim::start("pod-a", &["--extra-metrics", hostile]);
    let b = Sim::start("pod-b", &["--background-waiting", "5"]);
    let c = Sim::start("pod-c", &["--background-waiting", "1"]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a, &b, &c]), 2);
    for sim in [&a, &b, &c] {
        sim.wait_for_scrapes(3);
    }
    for n in 0..12 {
        let response = envoy.post("/v1/completions", &completion(n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "pod-c", "the shortest known queue wins");
    }
    let decision = envoy
        .wait_for_log_line("decision request_id=")
        .expect("a decision line");
    let score = |sim: &Sim| {
        let candidates = &decision[decision.find("candidates=[").expect("candidates")..];
        let at = candidates.find(&sim.address).expect("candidate listed");
        let rest = &candidates[at..];
        let queue = rest.find("queue-scorer=").expect("queue score") + "queue-scorer=".len();
        rest[queue..queue + 5].to_string()
    };
    assert_eq!(score(&a), "0.000", "unknown: the worst: {decision}");
    assert_eq!(score(&b), "0.000", "{decision}");
    assert_eq!(score(&c), "1.000", "{decision}");
    // The hostile pod is still a pod: it answers, it is just never preferred on its queue.
    assert!(
        scrape_failures(&envoy, &a) == 0.0,
        "an unknown value is not a failed scrape"
    );
}

/// Absurd values and unroutable addresses never load: Envoy refuses the configuration and the
/// log names the key and the limit.
#[test]
fn absurd_values_and_unroutable_addresses_are_refused_at_load() {
    let a = Sim::start("pod-a", &[]);
    let base = with_endpoints(&shipped_picker_config(), &[&a]);
    for (keys, needle) in [
        (
            "metricsTimeout: 1000h",
            "'pool.metricsTimeout': 3600000s is above the maximum of 60s",
        ),
        (
            "maxMetricsBytes: 1",
            "'pool.maxMetricsBytes': 1 bytes is below the minimum of 4096 bytes",
        ),
    ] {
        let log = Envoy::refused(&with_pool_keys(&base, keys));
        assert!(log.contains(needle), "{keys}: {log}");
    }
    for address in ["0.0.0.0:0", "127.0.0.1:0", "[::]:9"] {
        let log = Envoy::refused(&with_addresses(&shipped_picker_config(), &[address]));
        assert!(
            log.contains("'pool.endpoints[0].address'")
                && log.contains("is not a routable pod address"),
            "{address}: {log}"
        );
    }
}
