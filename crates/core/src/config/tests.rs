use super::*;
use crate::harness::test;
use crate::scheduling::Plugin;

mod plugins;

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
    assert_eq!(config.pool.metrics_cluster, "inference_picker_metrics");
    assert_eq!(config.pool.max_scrapes_in_flight, 128);
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
            "pool: {endpoints: [{address: '1.2.3.4:80'}], maxScrapesInFlight: 0}",
            "pool.maxScrapesInFlight",
        ),
        (
            "pool: {endpoints: [{address: '1.2.3.4:80'}], maxScrapesInFlight: 4097}",
            "above the maximum of 4096",
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

/// Loads a pool with one endpoint and `extra` pool keys; the error text, or "loaded".
fn pool_error(extra: &str) -> String {
    let text = format!("pool:\n  endpoints: [{{address: '10.0.0.1:8000'}}]\n{extra}");
    match load(&text, 1) {
        Ok(_) => "loaded".to_string(),
        Err(error) => error.to_string(),
    }
}

#[test]
fn an_idle_pool_is_scraped_once_a_second_within_the_staleness_threshold() {
    let interval = |extra: &str| {
        let text = format!("pool:\n  endpoints: [{{address: '10.0.0.1:8000'}}]\n{extra}");
        let pool = load(&text, 1).unwrap().pool;
        pool.idle_scrape_interval().as_millis()
    };
    assert_eq!(interval(""), 1000, "the default");
    assert_eq!(
        interval("  metricsStalenessThreshold: 1s\n"),
        500,
        "half the threshold"
    );
    assert_eq!(
        interval("  refreshMetricsInterval: 5s\n  metricsStalenessThreshold: 60s\n"),
        5000,
        "never faster than the interval"
    );
    assert_eq!(interval("  idleRefreshMetricsInterval: 50ms\n"), 50, "off");
    assert_eq!(
        interval("  replicas: 8\n"),
        1000,
        "8 replicas: each its share"
    );
    let error = pool_error("  idleRefreshMetricsInterval: 2m\n");
    assert!(error.contains("pool.idleRefreshMetricsInterval"), "{error}");
}

#[test]
fn replicas_share_the_refresh_so_each_scrapes_less_often() {
    let text = "pool:\n  endpoints: [{address: '10.0.0.1:8000'}]\n  replicas: 8\n";
    let config = load(text, 1).unwrap();
    assert_eq!(
        config.pool.scrape_interval(),
        std::time::Duration::from_millis(400),
        "8 x the default 50ms"
    );
    assert!(
        config.warnings.iter().any(|w| w.contains(
            "utilization-detector: metricsStalenessThreshold 200ms is shorter than two of this replica's scrape intervals (400ms"
        )),
        "GIE's default detector is stretched, and says so: {:?}",
        config.warnings
    );
    let one = load("pool:\n  endpoints: [{address: '10.0.0.1:8000'}]\n", 1).unwrap();
    assert!(one.warnings.is_empty(), "{:?}", one.warnings);
    for (extra, expected) in [
        (
            "  replicas: 8\n  metricsStalenessThreshold: 300ms\n",
            "times pool.replicas",
        ),
        ("  replicas: 0\n", "'pool.replicas': 0 replicas is below"),
        ("  replicas: 1001\n", "above the maximum of 1000"),
    ] {
        let error = pool_error(extra);
        assert!(error.contains(expected), "{extra:?} -> {error}");
    }
}

#[test]
fn every_pool_duration_size_and_count_is_bounded_with_the_limit_named() {
    let cases = [
        // The host refuses callout timeouts above i32::MAX ms; this one used to load and then
        // fail every scrape with status 2.
        (
            "  metricsTimeout: 1000h",
            "'pool.metricsTimeout': 3600000s is above the maximum of 60s",
        ),
        (
            "  metricsTimeout: 0s",
            "'pool.metricsTimeout': 0s is below the minimum of 1ms",
        ),
        (
            "  refreshMetricsInterval: 1ms",
            "'pool.refreshMetricsInterval': 1ms is below the minimum of 10ms",
        ),
        (
            "  refreshMetricsInterval: 2m\n  metricsStalenessThreshold: 5m",
            "'pool.refreshMetricsInterval': 120s is above the maximum of 60s",
        ),
        (
            "  metricsStalenessThreshold: 2h",
            "'pool.metricsStalenessThreshold': 7200s is above the maximum of 3600s",
        ),
        (
            "  refreshMetricsInterval: 1s\n  metricsStalenessThreshold: 500ms",
            "'pool.metricsStalenessThreshold': must be at least pool.refreshMetricsInterval",
        ),
        (
            "  passiveHealthBackoff: 1000h",
            "'pool.passiveHealthBackoff': 3600000s is above the maximum of 3600s",
        ),
        (
            "  maxRequestBodyBytes: 0",
            "'pool.maxRequestBodyBytes': 0 bytes is below the minimum of 1 bytes",
        ),
        (
            "  maxRequestBodyBytes: 1073741824",
            "'pool.maxRequestBodyBytes': 1073741824 bytes is above the maximum of 268435456 bytes",
        ),
        (
            "  maxMetricsBytes: 100",
            "'pool.maxMetricsBytes': 100 bytes is below the minimum of 4096 bytes",
        ),
        (
            "  maxMetricsBytes: 1073741824",
            "'pool.maxMetricsBytes': 1073741824 bytes is above the maximum of 67108864 bytes",
        ),
        (
            "  metricsPath: '/metrics x'",
            "'pool.metricsPath': must be visible ASCII without spaces",
        ),
        (
            "  metricsPath: /é",
            "'pool.metricsPath': must be visible ASCII without spaces",
        ),
    ];
    for (extra, needle) in cases {
        let message = pool_error(extra);
        assert!(message.contains(needle), "{extra:?} -> {message}");
    }
    let long_path = format!("  metricsPath: /{}", "a".repeat(8192));
    assert!(pool_error(&long_path).contains("8193 bytes is above the maximum of 8192 bytes"));
    let objectives: Vec<String> = (0..1025).map(|i| format!("{{name: o{i}}}")).collect();
    let message = pool_error(&format!("  objectives: [{}]", objectives.join(", ")));
    assert!(
        message.contains("'pool.objectives': 1025 objectives is above the maximum of 1024"),
        "{message}"
    );
    // The bounds themselves load.
    for extra in [
        "  metricsTimeout: 1m\n  refreshMetricsInterval: 10ms\n  metricsStalenessThreshold: 10ms",
        "  refreshMetricsInterval: 1m\n  metricsStalenessThreshold: 1h\n  passiveHealthBackoff: 0s",
        "  maxMetricsBytes: 4096\n  maxRequestBodyBytes: 268435456",
        "  maxMetricsBytes: 67108864\n  maxRequestBodyBytes: 1",
    ] {
        assert_eq!(pool_error(extra), "loaded", "{extra}");
    }
    let config = load(POOL, 1).unwrap();
    assert_eq!(config.pool.max_metrics_bytes, 4 << 20, "default: 4 MiB");
}

#[test]
fn the_endpoint_list_is_bounded() {
    let endpoints: Vec<String> = (0..65_537u32)
        .map(|i| {
            format!(
                "{{address: '10.{}.{}.{}:80'}}",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect();
    let text = format!("pool:\n  endpoints: [{}]\n", endpoints.join(","));
    let message = load(&text, 1).err().unwrap().to_string();
    assert!(
        message.contains("'pool.endpoints': 65537 endpoints is above the maximum of 65536"),
        "{message}"
    );
}

#[test]
fn unroutable_endpoint_addresses_are_refused() {
    for (address, needle) in [
        ("0.0.0.0:0", "port 0"),
        ("0.0.0.0:8000", "unspecified address (0.0.0.0)"),
        ("127.0.0.1:0", "port 0"),
        ("'[::]:9'", "unspecified address (::)"),
        ("'[::ffff:0.0.0.0]:9'", "unspecified"),
        ("224.0.0.1:80", "multicast"),
    ] {
        let text = format!("pool:\n  endpoints: [{{address: {address}}}]\n");
        let message = load(&text, 1).err().unwrap().to_string();
        assert!(
            message.contains("'pool.endpoints[0].address'")
                && message.contains("is not a routable pod address")
                && message.contains(needle),
            "{address}: {message}"
        );
    }
}

#[test]
fn load_signals_are_live_unless_set_to_scraped() {
    let config = load(POOL, 1).unwrap();
    assert_eq!(config.pool.load_signals, LoadSignals::Live);
    let text = format!("{POOL}  loadSignals: scraped\n");
    assert_eq!(
        load(&text, 1).unwrap().pool.load_signals,
        LoadSignals::Scraped
    );
    let message = pool_error("  loadSignals: guessed");
    assert!(
        message.contains("loadSignals") || message.contains("unknown variant"),
        "{message}"
    );
    assert!(
        message.contains("live") && message.contains("scraped"),
        "{message}"
    );
}

const POOLS: &str = "
plugins:
- type: queue-scorer
- type: max-score-picker
pools:
- name: llama
  models: [meta-llama/Llama-3.1-8B-Instruct, sql-lora]
  endpoints: [{address: 10.0.0.1:8000}]
- name: qwen
  models: ['qwen-*']
  plugins:
  - type: kv-cache-utilization-scorer
  - type: max-score-picker
  refreshMetricsInterval: 20ms
  endpoints: [{address: 10.0.1.1:8000}]
- name: rest
  endpoints: [{address: 10.0.2.1:8000}]
";

fn set_error(text: &str) -> String {
    match load_set(text, 1, false) {
        Ok(_) => panic!("accepted: {text}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn a_pools_list_loads_each_pool_with_the_top_level_as_defaults() {
    let set = load_set(POOLS, 1, false).unwrap();
    let names: Vec<&str> = set.pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["llama", "qwen", "rest"]);
    let types = |i: usize| -> Vec<&str> {
        set.pools[i]
            .config
            .scheduler
            .plugins()
            .iter()
            .map(|p| p.type_name)
            .collect()
    };
    assert!(types(0).contains(&"queue-scorer"), "{:?}", types(0));
    assert!(
        types(1).contains(&"kv-cache-utilization-scorer"),
        "{:?}",
        types(1)
    );
    assert!(
        !types(1).contains(&"queue-scorer"),
        "the pool's plugins replace the top level's"
    );
    assert_eq!(
        set.pools[1]
            .config
            .pool
            .refresh_metrics_interval
            .as_millis(),
        20
    );
    assert_eq!(set.pools[2].models, None, "no models: the catch-all");
    assert_eq!(
        set.pools[1].models.as_deref(),
        Some(&["qwen-*".to_owned()][..])
    );
    assert_eq!(set.pool_header, None);
}

#[test]
fn a_single_pool_is_the_default_pool_serving_every_model() {
    let set = load_set(POOL, 1, false).unwrap();
    assert_eq!(set.pools.len(), 1);
    assert_eq!(set.pools[0].name, DEFAULT_POOL_NAME);
    assert_eq!(set.pools[0].models, None);
    assert!(!set.listed);
    let one = load_set(
        "pools:\n- name: only\n  endpoints: [{address: 10.0.0.1:8000}]\n",
        1,
        false,
    )
    .unwrap();
    assert!(
        one.listed,
        "a one-entry list is still a list: its stats carry the pool's name"
    );
}

#[test]
fn pools_errors_name_the_pool_and_the_key() {
    let message = set_error("pools:\n- name: a\n  models: [m]\n  endpoints: [{address: nope}]\n");
    assert!(
        message.contains("pools[0].endpoints[0].address"),
        "{message}"
    );
    assert!(message.contains("pool a"), "{message}");
    assert!(set_error("pools: []\n").contains("non-empty"));
    assert!(
        set_error("pools:\n- models: [m]\n  endpoints: [{address: 1.2.3.4:80}]\n")
            .contains("needs a name")
    );
    assert!(
        set_error("pools:\n- name: Big_Name\n  endpoints: [{address: 1.2.3.4:80}]\n")
            .contains("DNS label")
    );
    let twice = "pools:\n- name: a\n  models: [m]\n  endpoints: [{address: 1.2.3.4:80}]\n- name: a\n  models: [n]\n  endpoints: [{address: 1.2.3.5:80}]\n";
    assert!(set_error(twice).contains("names two pools"));
    let two_catch_alls = "pools:\n- name: a\n  endpoints: [{address: 1.2.3.4:80}]\n- name: b\n  endpoints: [{address: 1.2.3.5:80}]\n";
    assert!(set_error(two_catch_alls).contains("at most one pool may omit"));
    let both = format!("{POOL}pools:\n- name: a\n  endpoints: [{{address: 1.2.3.4:80}}]\n");
    assert!(set_error(&both).contains("not both"));
    assert!(
        set_error("pools:\n- name: a\n  models: []\n  endpoints: [{address: 1.2.3.4:80}]\n")
            .contains("pools[0].models")
    );
    let unknown = "pools:\n- name: a\n  models: [m]\n  endpoint: [{address: 1.2.3.4:80}]\n";
    let message = set_error(unknown);
    assert!(
        message.contains("pools[0]") && message.contains("endpoint"),
        "{message}"
    );
}

#[test]
fn the_pool_header_needs_pools_and_a_header_name() {
    let set = load_set(
        &format!("poolHeader: x-gateway-inference-pool\n{POOLS}"),
        1,
        false,
    )
    .unwrap();
    assert_eq!(set.pool_header.as_deref(), Some("x-gateway-inference-pool"));
    assert!(set_error(&format!("poolHeader: x-pool\n{POOL}")).contains("needs a `pools` list"));
    assert!(set_error(&format!("poolHeader: 'Bad Header'\n{POOLS}")).contains("lowercase header"));
    for reserved in [
        "x-gateway-destination-endpoint",
        "content-length",
        "host",
        "x-envoy-upstream-alt-stat-name",
    ] {
        assert!(set_error(&format!("poolHeader: {reserved}\n{POOLS}")).contains("already means"));
    }
    assert!(load(POOLS, 1).is_err(), "load reads one pool only");
}

#[test]
fn a_pool_that_learns_its_models_is_no_catch_all() {
    let text = "featureGates: [dataLayer]\npools:\n- name: a\n  endpoints: [{address: 1.2.3.4:80}]\n- name: b\n  plugins: [{type: queue-scorer}, {type: max-score-picker}, {type: models-data-source}]\n  endpoints: [{address: 1.2.3.5:80}]\n";
    let set = load_set(text, 1, false).unwrap();
    assert!(set.pools[0].serves_any_model());
    assert!(!set.pools[1].serves_any_model());
    let source = set.pools[1].config.models_source.as_ref().unwrap();
    assert_eq!(source.path, "/v1/models");
}

#[test]
fn peers_need_a_port_a_secret_and_someone_to_call() {
    let base = "pool:\n  endpoints: [{address: '10.0.0.1:8000'}]\n";
    let ok = format!(
        "{base}  peers: {{port: 9100, secret: sixteen-chars-ok, addresses: ['10.1.0.1:9100']}}\n"
    );
    let config = load(&ok, 1).unwrap();
    let peers = config.pool.peers.unwrap();
    assert_eq!(peers.sync_interval, std::time::Duration::from_millis(100));
    assert_eq!(peers.cluster, "inference_picker_peers");
    for (peers, why) in [
        ("{secret: sixteen-chars-ok, addresses: ['10.1.0.1:9100']}", "pool.peers.port"),
        ("{port: 9100, secret: short, addresses: ['10.1.0.1:9100']}", "at least 16 characters"),
        ("{port: 9100, secret: sixteen-chars-ok}", "list the replicas' peer addresses"),
        ("{port: 9100, secret: sixteen-chars-ok, addresses: ['nowhere']}", "pool.peers.addresses"),
        ("{port: 9100, secret: sixteen-chars-ok, addresses: ['10.1.0.1:9100'], syncInterval: 1ms}", "below the minimum"),
        ("{port: 9100, secret: sixteen-chars-ok, addresses: ['10.1.0.1:9100'], unknown: 1}", "unknown field"),
    ] {
        let text = format!("{base}  peers: {peers}\n");
        let error = load(&text, 1).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains(why), "{peers}: {error}");
    }
    let both = format!("{ok}  replicas: 4\n");
    let error = load(&both, 1)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("leave it at 1 with pool.peers"), "{error}");
}

/// The shared identity of each pool `text` loads.
fn identities(text: &str) -> Vec<u64> {
    load_set(text, 1, false)
        .unwrap()
        .pools
        .iter()
        .map(|pool| pool.shared_identity)
        .collect()
}

#[test]
fn re_tuning_the_choice_keeps_the_shared_identity_and_other_changes_do_not() {
    let weighed = |weight: &str| {
        format!(
            "plugins:\n- type: queue-scorer\n- type: prefix-cache-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: {weight}\n  - pluginRef: prefix-cache-scorer\n    weight: 3\n{POOL}"
        )
    };
    let base = identities(&weighed("2"));
    assert_eq!(identities(&weighed("1")), base, "weights only");
    assert_eq!(
        identities(&format!("# a comment\n{}", weighed("2"))),
        base,
        "comments are not meaning"
    );
    let added_scorer = weighed("2").replace(
        "- type: queue-scorer\n",
        "- type: queue-scorer\n- type: lora-affinity-scorer\n",
    );
    assert_eq!(
        identities(&added_scorer),
        base,
        "a scorer that produces no data"
    );
    let prefix_tuned = weighed("2").replace(
        "- type: prefix-cache-scorer\n",
        "- type: prefix-cache-scorer\n  parameters: {blockSize: 32}\n",
    );
    assert_ne!(
        identities(&prefix_tuned),
        base,
        "the parameters of a plugin whose placements are shared"
    );
    let interval = format!("{}  refreshMetricsInterval: 20ms\n", weighed("2"));
    assert_ne!(identities(&interval), base, "how the pool is scraped");
    let other_pool = weighed("2").replace("10.0.0.1:8000", "10.0.0.3:8000");
    assert_ne!(identities(&other_pool), base, "the pool's members");
}

#[test]
fn each_pool_of_a_set_has_its_own_shared_identity() {
    let set = identities(POOLS);
    assert!(set.len() > 1);
    let mut distinct = set.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), set.len(), "{set:?}");
}
