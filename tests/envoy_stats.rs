//! The filter's stats in Envoy's own `/stats/prometheus`, tagged so one query gives
//! per-endpoint picks and decisions by outcome.

mod support;

use support::{completion, sample, shipped_picker_config, with_endpoints, Envoy, Sim};

#[test]
fn picks_decisions_and_scrapes_are_envoy_stats() {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &["--background-waiting", "4"]);
    let envoy = Envoy::start(&with_endpoints(&shipped_picker_config(), &[&a, &b]), 2);
    a.wait_for_scrapes(3);
    for n in 0..7 {
        assert_eq!(envoy.post("/v1/completions", &completion(n)).status, 200);
    }
    assert_eq!(envoy.post("/v1/completions", "{oops").status, 400);
    envoy.wait_for_decisions(8);
    let text = envoy.admin_get("/stats/prometheus").text();
    let picks_a = format!(
        "inference_picker_endpoint_picks{{endpoint=\"{}\"}}",
        a.address
    );
    let picks_b = format!(
        "inference_picker_endpoint_picks{{endpoint=\"{}\"}}",
        b.address
    );
    assert_eq!(sample(&text, &picks_a), Some(7.0), "{text}");
    assert_eq!(sample(&text, &picks_b), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, "inference_picker_decisions{outcome=\"routed\"}"),
        Some(7.0)
    );
    assert_eq!(
        sample(&text, "inference_picker_decisions{outcome=\"400\"}"),
        Some(1.0)
    );
    let scrapes = format!(
        "inference_picker_endpoint_scrape_success{{endpoint=\"{}\"}}",
        a.address
    );
    assert!(sample(&text, &scrapes).unwrap_or(0.0) >= 3.0, "{text}");
    let age = format!(
        "inference_picker_endpoint_metrics_age_ms{{endpoint=\"{}\"}}",
        a.address
    );
    assert!(sample(&text, &age).is_some_and(|ms| ms < 2000.0), "{text}");
    assert!(
        text.contains("inference_picker_scheduling_time_us_bucket"),
        "{text}"
    );
    // Pool-wide scrape health: both fresh, a round's duration, nothing refused by the host.
    assert_eq!(
        sample(&text, "inference_picker_endpoints_fresh{}"),
        Some(2.0),
        "{text}"
    );
    assert!(
        sample(&text, "inference_picker_scrape_round_ms{}").is_some(),
        "{text}"
    );
    assert_eq!(
        sample(&text, "inference_picker_scrapes_unsent{}"),
        Some(0.0),
        "{text}"
    );
    // The scrapes went through their own cluster, the requests through theirs.
    let scrapes = sample(
        &text,
        "envoy_cluster_upstream_rq_completed{envoy_cluster_name=\"inference_picker_metrics\"}",
    );
    assert!(scrapes.unwrap_or(0.0) >= 3.0, "{text}");
    // The prefix scorer's own counters, labelled with the plugin's name.
    for counter in ["home_picks", "home_spills"] {
        let series = format!("inference_picker_plugin_{counter}{{plugin=\"prefix-cache-scorer\"}}");
        assert!(sample(&text, &series).is_some(), "{series}: {text}");
    }
}
