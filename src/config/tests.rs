use super::*;
use crate::scheduling::Plugin;

const POOL: &str = "
pool:
  endpoints:
  - address: 10.0.0.1:8000
  - address: 10.0.0.2:8000
    labels: {llm-d.ai/role: decode}
";

fn load_with_pool(body: &str) -> Result<FilterConfig, ConfigError> {
    load(&format!("{body}\n{POOL}"), 1)
}

fn error_text(body: &str) -> String {
    match load_with_pool(body) {
        Ok(_) => String::from("loaded"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn empty_document_gets_gie_defaults() {
    let config = load_with_pool("").unwrap();
    let profiles = config.scheduler.profiles();
    assert_eq!(profiles.len(), 1);
    assert_eq!(profiles[0].name, "default");
    let plugins = config.scheduler.plugins();
    let scorers: Vec<(&str, f64)> = profiles[0]
        .scorers
        .iter()
        .map(|s| (plugins[s.plugin].type_name, s.weight))
        .collect();
    assert_eq!(
        scorers,
        [
            ("queue-scorer", 2.0),
            ("kv-cache-utilization-scorer", 2.0),
            ("prefix-cache-scorer", 3.0)
        ]
    );
    assert_eq!(plugins[profiles[0].picker].type_name, "max-score-picker");
    assert_eq!(
        config.pool.refresh_metrics_interval,
        std::time::Duration::from_millis(50)
    );
    assert_eq!(
        config.pool.metrics_staleness_threshold,
        std::time::Duration::from_secs(2)
    );
    assert_eq!(config.pool.metrics_cluster, "original_destination_cluster");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn full_document_loads() {
    let config = load_with_pool(
        "
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- name: kv
  type: kv-cache-utilization-scorer
- type: lora-affinity-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 3
  - pluginRef: kv
  - pluginRef: lora-affinity-scorer
    weight: 0.5
  - pluginRef: max-score-picker
",
    )
    .unwrap();
    let profile = &config.scheduler.profiles()[0];
    let weights: Vec<f64> = profile.scorers.iter().map(|s| s.weight).collect();
    assert_eq!(weights, [3.0, 1.0, 0.5]);
}

#[test]
fn json_documents_load_too() {
    let json = r#"{"plugins":[{"type":"random-picker"}],"pool":{"endpoints":[{"address":"[::1]:9000"}],"refreshMetricsInterval":"100ms"}}"#;
    let config = load(json, 1).unwrap();
    assert_eq!(
        config.pool.refresh_metrics_interval,
        std::time::Duration::from_millis(100)
    );
    let plugins = config.scheduler.plugins();
    assert_eq!(
        plugins[config.scheduler.profiles()[0].picker].type_name,
        "random-picker"
    );
}

#[test]
fn profiles_default_to_every_declared_plugin_and_a_picker() {
    let config =
        load_with_pool("plugins:\n- type: queue-scorer\n- type: running-requests-size-scorer\n")
            .unwrap();
    let profile = &config.scheduler.profiles()[0];
    assert_eq!(profile.scorers.len(), 2);
    let plugins = config.scheduler.plugins();
    assert!(matches!(plugins[profile.picker].plugin, Plugin::Picker(_)));
}

#[test]
fn legacy_type_names_load() {
    let config = load_with_pool(
        "plugins:\n- type: kv-cache-scorer\n- type: prefix-cache\n  parameters: {hashBlockSize: 5}\n- type: max-score\n- type: single-profile\n",
    );
    assert!(config.is_ok());
}

#[test]
fn rejections_name_the_key() {
    let cases = [
        ("plugins:\n- type: queue-scorerr\n", "plugins[0].type"),
        ("plugins:\n- type: queue-scorer\n  parameters: {bogus: 1}\n", "plugins[0].parameters"),
        ("plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n", "maxNumOfEndpoints"),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: nothing\n",
            "schedulingProfiles[0].plugins[0].pluginRef",
        ),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: -1\n",
            "weight",
        ),
        ("plugins:\n- type: queue-scorer\n- type: queue-scorer\n", "declared twice"),
        ("unknownKey: 1\n", "unknownKey"),
        ("kind: Deployment\n", "kind"),
        ("apiVersion: v9\n", "apiVersion"),
        ("featureGates: [warpDrive]\n", "featureGates[0]"),
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: [{pluginRef: queue-scorer}]\n- name: b\n  plugins: [{pluginRef: queue-scorer}]\n",
            "single-profile-handler needs exactly one scheduling profile",
        ),
        (
            "plugins:\n- type: random-picker\n- type: max-score-picker\nschedulingProfiles:\n- name: a\n  plugins: [{pluginRef: random-picker}, {pluginRef: max-score-picker}]\n",
            "exactly one picker",
        ),
    ];
    for (body, needle) in cases {
        let text = error_text(body);
        assert!(text.contains(needle), "{body:?} -> {text}");
    }
}

#[test]
fn pool_rejections() {
    let cases = [
        ("pool: {endpoints: []}", "pool.endpoints"),
        (
            "pool: {endpoints: [{address: nope}]}",
            "pool.endpoints[0].address",
        ),
        (
            "pool: {endpoints: [{address: '1.2.3.4:80'}, {address: '1.2.3.4:80'}]}",
            "listed twice",
        ),
        (
            "pool: {endpoints: [{address: '1.2.3.4:80'}], refreshMetricsInterval: 5}",
            "duration \"5\"",
        ),
        (
            "pool: {endpoints: [{address: '1.2.3.4:80'}], metricsPath: metrics}",
            "pool.metricsPath",
        ),
        (
            "pool: {endpoints: [{address: '1.2.3.4:80', weight: 3}]}",
            "weight",
        ),
        ("plugins: []", "pool"),
        ("", "empty"),
        ("[1, 2", "invalid configuration"),
    ];
    for (text, needle) in cases {
        let message = match load(text, 1) {
            Ok(_) => "loaded".to_string(),
            Err(error) => error.to_string(),
        };
        assert!(message.contains(needle), "{text:?} -> {message}");
    }
}
