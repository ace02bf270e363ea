//! Config tests of plugins: their parameters and defaults through the loader, the data layer,
//! profile handlers, the saturation detector, and what flow control and a default engine do
//! once loaded.

use super::*;
use crate::harness::test;

#[test]
fn plugin_counts_and_weights_are_bounded() {
    let picker = |n: &str| {
        error_text(&format!(
            "plugins:\n- type: max-score-picker\n  parameters: {{maxNumOfEndpoints: {n}}}\n"
        ))
    };
    assert!(picker("257").contains("maxNumOfEndpoints: 257 endpoints is above the maximum of 256"));
    assert_eq!(picker("256"), "loaded");
    let weight = |w: &str| {
        error_text(&format!(
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - {{pluginRef: queue-scorer, weight: {w}}}\n"
        ))
    };
    assert!(
        weight("1e300").contains("must be a number from 0 to 1000000"),
        "{}",
        weight("1e300")
    );
    assert!(weight(".nan").contains("must be a number from 0"));
    assert_eq!(weight("1000000"), "loaded");
    let span = error_text(&single_plugin(
        "metric-scorer",
        "{metricName: m, min: -1e308, max: 1e308}",
    ));
    assert!(span.contains("less than 1.7e308 apart"), "{span}");
}

/// One plugin declared alone with `parameters`, in a profile of its own when it can be.
fn single_plugin(type_name: &str, parameters: &str) -> String {
    format!(
        "featureGates: [dataLayer]\nplugins:\n- type: {type_name}\n  parameters: {parameters}\n"
    )
}

#[test]
fn every_plugin_parameter_is_checked_by_the_loader() {
    // (type, parameters that must be rejected, text the error must contain)
    let cases = [
        ("metrics-data-source", "{scheme: gopher}", "scheme"),
        ("prometheus-metric", "{labels: {a: b}}", "metricName"),
        (
            "metric-scorer",
            "{metricName: m, min: 3, max: 1}",
            "above min",
        ),
        (
            "metric-scorer",
            "{metricName: m, normalizationAlgo: Cubic}",
            "Cubic",
        ),
        ("active-request-scorer", "{maxBusyScore: 3}", "maxBusyScore"),
        ("active-request-scorer", "{requestTimeout: soon}", "soon"),
        ("load-aware-scorer", "{threshold: -1}", "threshold"),
        (
            "token-load-scorer",
            "{queueThresholdTokens: 0}",
            "queueThresholdTokens",
        ),
        ("session-affinity-scorer", "{ttl: 5}", "ttl"),
        ("no-hit-lru-scorer", "{lruSize: many}", "many"),
        ("context-length-aware", "{label: ''}", "label"),
        (
            "request-cost-scorer",
            "{defaultCapacityTokens: 0}",
            "defaultCapacityTokens",
        ),
        (
            "prefix-cache-scorer",
            "{blockSizeTokens: 0}",
            "blockSizeTokens",
        ),
        ("decode-filter", "{role: x}", "role"),
        ("prefill-filter", "{role: x}", "role"),
        ("encode-filter", "{role: x}", "role"),
        ("label-selector-filter", "{}", "matchLabels"),
        (
            "by-label-selector",
            "{matchExpressions: [{key: a, operator: In}]}",
            "needs values",
        ),
        ("by-label", "{label: tier}", "nothing could pass"),
        (
            "prefix-cache-affinity-filter",
            "{affinityThreshold: 1.5}",
            "affinityThreshold",
        ),
        ("header-based-testing-filter", "{header: x}", "header"),
        (
            "weighted-random-picker",
            "{maxNumOfEndpoints: 0}",
            "maxNumOfEndpoints",
        ),
        ("max-score-picker", "{maxNumOfEndpoints: -1}", "-1"),
        (
            "disagg-profile-handler",
            "{deciders: {encode: x}}",
            "encode",
        ),
        ("pd-profile-handler", "{threshold: -5}", "-5"),
        ("prefix-based-pd-decider", "{nonCachedTokens: lots}", "lots"),
        ("always-disagg-pd-decider", "{x: 1}", "x"),
        ("disagg-headers-handler", "{y: 1}", "y"),
    ];
    for (type_name, parameters, needle) in cases {
        let text = error_text(&single_plugin(type_name, parameters));
        assert!(
            text.contains("plugins[0].parameters") && text.contains(needle),
            "{type_name} {parameters}: {text}"
        );
    }
}

#[test]
fn plugin_defaults_through_the_loader() {
    let config = load_with_pool(
        "plugins:\n- type: active-request-scorer\n- type: load-aware-scorer\n- type: token-load-scorer\n- type: request-cost-scorer\n- type: no-hit-lru-scorer\n- type: weighted-random-picker\n",
    )
    .unwrap();
    let types: Vec<&str> = config
        .scheduler
        .plugins()
        .iter()
        .map(|p| p.type_name)
        .collect();
    assert_eq!(
        types,
        [
            "active-request-scorer",
            "load-aware-scorer",
            "token-load-scorer",
            "request-cost-scorer",
            "no-hit-lru-scorer",
            "weighted-random-picker",
            // no-hit-lru-scorer reads prefix matches: llm-d's default producer is created.
            "approx-prefix-cache-producer",
            "single-profile-handler",
            "utilization-detector"
        ]
    );
    let profile = &config.scheduler.profiles()[0];
    assert_eq!(profile.scorers.len(), 5);
    assert!(profile.scorers.iter().all(|s| s.weight == 1.0));
    assert_eq!(
        config.scheduler.plugins()[profile.picker].type_name,
        "weighted-random-picker"
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

const DATA_LAYER: &str = "
featureGates: [dataLayer]
plugins:
- {name: src, type: metrics-data-source, parameters: {path: /stats}}
- {name: running, type: prometheus-metric, parameters: {metricName: 'vllm:num_requests_running', labels: {model_name: a}}}
- {name: temp, type: prometheus-metric, parameters: {metricName: gpu_temp}}
- {name: by-running, type: metric-scorer, parameters: {metricName: 'vllm:num_requests_running', max: 50}}
- {name: by-temp, type: metric-scorer, parameters: {metricName: gpu_temp, optimizationMode: Minimize, min: 30, max: 90}}
- {type: max-score-picker}
data:
  sources:
  - pluginRef: src
    extractors: [{pluginRef: running}, {pluginRef: temp}]
";

#[test]
fn data_layer_wires_extractors_in_order_and_sets_the_path() {
    let config = load_with_pool(DATA_LAYER).unwrap();
    let names: Vec<&str> = config
        .metric_selectors
        .iter()
        .map(|s| s.metric_name.as_str())
        .collect();
    assert_eq!(names, ["vllm:num_requests_running", "gpu_temp"]);
    assert_eq!(
        config.metric_selectors[0].labels,
        [("model_name".into(), "a".into())]
    );
    assert_eq!(config.pool.metrics_path, "/stats");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let json = load_with_pool(&DATA_LAYER.replace("data:", "dataLayer:")).unwrap();
    assert_eq!(json.metric_selectors.len(), 2);
}

#[test]
fn data_layer_rejections_and_warnings() {
    // llm-d runs the data layer without its gate now.
    let ungated = load_with_pool(&DATA_LAYER.replace("featureGates: [dataLayer]", "")).unwrap();
    assert_eq!(ungated.metric_selectors.len(), 2);
    let cases = [
        (
            DATA_LAYER.replace("pluginRef: src", "pluginRef: nope"),
            "dataLayer.sources[0].pluginRef",
        ),
        (
            DATA_LAYER.replace("pluginRef: src", "pluginRef: temp"),
            "not a data source",
        ),
        (
            DATA_LAYER.replace("{pluginRef: temp}", "{pluginRef: src}"),
            "dataLayer.sources[0].extractors[1].pluginRef",
        ),
        (
            DATA_LAYER.replace(
                "[{pluginRef: running}, {pluginRef: temp}]",
                "[{pluginRef: running}]",
            ),
            "gpu_temp",
        ),
    ];
    for (body, needle) in cases {
        let text = error_text(&body);
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let unwired = DATA_LAYER.replace("- {name: by-temp", "# ").replace(
        "[{pluginRef: running}, {pluginRef: temp}]",
        "[{pluginRef: running}]",
    );
    let config = load_with_pool(&unwired).unwrap();
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("\"temp\"") && w.contains("not wired")),
        "{:?}",
        config.warnings
    );
    let ambiguous = DATA_LAYER
        .replace(
            "- {name: temp,",
            "- {name: running-b, type: prometheus-metric, parameters: {metricName: 'vllm:num_requests_running', labels: {model_name: b}}}\n- {name: temp,",
        )
        .replace("{pluginRef: temp}]", "{pluginRef: temp}, {pluginRef: running-b}]");
    let text = error_text(&ambiguous);
    assert!(text.contains("name one with `extractor`"), "{text}");
    let chosen = ambiguous.replace("max: 50}", "max: 50, extractor: running-b}");
    let config = load_with_pool(&chosen).unwrap();
    assert_eq!(config.metric_selectors.len(), 3);
}

#[test]
fn profile_handlers_resolve_profiles_and_deciders() {
    let pd = "
plugins:
- {type: prefill-filter}
- {type: decode-filter}
- {name: decider, type: prefix-based-pd-decider, parameters: {nonCachedTokens: 8}}
- {type: disagg-profile-handler, parameters: {deciders: {prefill: decider}}}
schedulingProfiles:
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
";
    let config = load_with_pool(pd).unwrap();
    assert_eq!(config.scheduler.profiles().len(), 2);
    assert!(
        error_text(&pd.replace("prefill: decider", "prefill: decode-filter"))
            .contains("no P/D decider")
    );
    assert!(error_text(&pd.replace("name: decode,", "name: main,")).contains("\"decode\""));
    let two_handlers = pd.replace(
        "- {type: disagg-profile-handler",
        "- {type: single-profile-handler}\n- {type: disagg-profile-handler",
    );
    assert!(error_text(&two_handlers).contains("more than one profile handler"));
    assert!(
        error_text(&pd.replace("pluginRef: prefill-filter}]", "pluginRef: decider}]"))
            .contains("not a filter, scorer or picker")
    );
}

#[test]
fn saturation_detector_reference_is_resolved() {
    let config = load_with_pool(
        "plugins:\n- {name: cap, type: concurrency-detector, parameters: {maxConcurrency: 2}}\n- type: queue-scorer\nsaturationDetector: {pluginRef: cap}\n",
    )
    .unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert!(error_text(
        "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: queue-scorer}\n"
    )
    .contains("not a saturation detector"));
    assert!(error_text("saturationDetector: {pluginRef: nothing}\n")
        .contains("saturationDetector.pluginRef"));
}
