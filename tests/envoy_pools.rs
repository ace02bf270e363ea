//! One Envoy for every model (`envoy/envoy-multi-pool.yaml`): three pools of different models,
//! the request's model picks the pool and the pool's cluster, the pod comes from that pool only.

mod support;

use std::collections::BTreeMap;
use support::{picker_config_of, with_pool_endpoints, Envoy, Sim};

const CONFIG: &str = "envoy/envoy-multi-pool.yaml";
const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
const QWEN: &str = "Qwen/Qwen3-8B";
const MISTRAL: &str = "mistralai/Mistral-7B-Instruct-v0.3";

struct Pods {
    llama: [Sim; 2],
    qwen: Sim,
    mistral: Sim,
}

fn pods() -> Pods {
    let llama = |name: &str| Sim::start(name, &["--model", LLAMA, "--adapters", "sql-lora"]);
    Pods {
        llama: [llama("llama-a"), llama("llama-b")],
        qwen: Sim::start("qwen-a", &["--model", QWEN]),
        mistral: Sim::start("mistral-a", &["--model", MISTRAL]),
    }
}

fn gateway(pods: &Pods) -> Envoy {
    let mut config = picker_config_of(CONFIG);
    config = with_pool_endpoints(&config, "llama", &[&pods.llama[0], &pods.llama[1]]);
    config = with_pool_endpoints(&config, "qwen", &[&pods.qwen]);
    config = with_pool_endpoints(&config, "mistral", &[&pods.mistral]);
    let envoy = Envoy::start_from(CONFIG, &config, 2, |_| {});
    for sim in [&pods.llama[0], &pods.llama[1], &pods.qwen, &pods.mistral] {
        sim.wait_for_scrapes(2);
    }
    envoy
}

fn chat(model: &str, n: usize) -> String {
    format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"question {n}"}}],"max_tokens":3}}"#
    )
}

#[test]
fn each_model_reaches_only_its_own_pools_pods() {
    let pods = pods();
    let envoy = gateway(&pods);
    let mut served: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for n in 0..8 {
        for model in [LLAMA, QWEN, MISTRAL, "sql-lora"] {
            let response = envoy.post("/v1/chat/completions", &chat(model, n));
            assert_eq!(response.status, 200, "{model}: {}", response.text());
            *served
                .entry(model)
                .or_default()
                .entry(response.pod())
                .or_insert(0) += 1;
        }
    }
    let pods_of = |model: &str| -> Vec<String> { served[model].keys().cloned().collect() };
    assert_eq!(pods_of(QWEN), ["qwen-a"]);
    assert_eq!(pods_of(MISTRAL), ["mistral-a"]);
    for model in [LLAMA, "sql-lora"] {
        let pods = pods_of(model);
        assert!(
            !pods.is_empty() && pods.iter().all(|pod| pod.starts_with("llama-")),
            "{model} went to {pods:?}"
        );
    }
    // The pool header chose the cluster: the stats count each pool's own decisions.
    envoy.wait_for_decisions(32);
    let routed = |pool: &str| {
        envoy
            .stat(&format!(
                "wasmcustom.inference_picker.pool.{pool}.decisions.routed"
            ))
            .unwrap_or(0.0)
    };
    assert_eq!(
        (routed("llama"), routed("qwen"), routed("mistral")),
        (16.0, 8.0, 8.0)
    );
    let cluster_requests = |pool: &str| {
        envoy
            .stat(&format!("cluster.pool_{pool}.upstream_rq_total"))
            .unwrap_or(0.0)
    };
    assert_eq!(
        cluster_requests("qwen"),
        8.0,
        "qwen's requests went through its own cluster"
    );
    assert_eq!(cluster_requests("mistral"), 8.0);
}

#[test]
fn an_unknown_model_is_a_404_naming_it_and_reaches_no_pod() {
    let pods = pods();
    let envoy = gateway(&pods);
    let before: u64 = [&pods.llama[0], &pods.llama[1], &pods.qwen, &pods.mistral]
        .iter()
        .map(|sim| sim.requests_total())
        .sum();
    let response = envoy.post("/v1/chat/completions", &chat("gpt-4o", 0));
    assert_eq!(response.status, 404, "{}", response.text());
    let error = response.json();
    assert_eq!(error["error"]["code"], 404);
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("`gpt-4o`"),
        "{error}"
    );
    // A pool's glob does not stretch to another family, and the client cannot pick the pool.
    let response = envoy.post_with(
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-gateway-inference-pool", "qwen"),
        ],
        &chat("Qwen2-7B", 0),
    );
    assert_eq!(response.status, 404, "{}", response.text());
    let after: u64 = [&pods.llama[0], &pods.llama[1], &pods.qwen, &pods.mistral]
        .iter()
        .map(|sim| sim.requests_total())
        .sum();
    assert_eq!(before, after, "no pod saw the unknown models");
}

#[test]
fn a_client_naming_another_pool_is_routed_by_its_model() {
    let pods = pods();
    let envoy = gateway(&pods);
    for n in 0..4 {
        let response = envoy.post_with(
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("x-gateway-inference-pool", "mistral"),
            ],
            &chat(QWEN, n),
        );
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "qwen-a");
    }
}

#[test]
fn every_pool_is_scraped_once_per_envoy() {
    let pods = pods();
    let envoy = gateway(&pods);
    let sims = [&pods.llama[0], &pods.llama[1], &pods.qwen, &pods.mistral];
    let before: Vec<u64> = sims.iter().map(|sim| sim.metrics_scrapes()).collect();
    // A measuring window: the scrapes each pod gets in one second.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let after: Vec<u64> = sims.iter().map(|sim| sim.metrics_scrapes()).collect();
    for ((sim, before), after) in sims.iter().zip(&before).zip(&after) {
        let scrapes = after - before;
        // 50 ms interval: ~20 a second from the one scraping VM, not ~40 from two.
        assert!(
            (12..=28).contains(&scrapes),
            "{}: {scrapes} scrapes in 1 s",
            sim.name
        );
    }
    drop(envoy);
}

/// A pool without a model list learns its models from its pods' `/v1/models`
/// (`models-data-source`): the base model and the adapters they report.
#[test]
fn a_pool_serves_the_models_its_pods_report() {
    let pods = pods();
    let mistral_with_adapter = Sim::start(
        "mistral-b",
        &["--model", MISTRAL, "--adapters", "support-lora"],
    );
    let mut config: serde_yaml::Value = serde_yaml::from_str(&picker_config_of(CONFIG)).unwrap();
    config["featureGates"] = serde_yaml::from_str("[dataLayer]").unwrap();
    let mistral = config["pools"]
        .as_sequence_mut()
        .unwrap()
        .iter_mut()
        .find(|pool| pool["name"] == "mistral")
        .unwrap();
    mistral.as_mapping_mut().unwrap().remove("models");
    mistral["plugins"] = serde_yaml::from_str(
        "[{type: queue-scorer}, {type: max-score-picker}, {type: models-data-source, parameters: {refreshInterval: 500ms}}]",
    )
    .unwrap();
    let mut text = serde_yaml::to_string(&config).unwrap();
    text = with_pool_endpoints(&text, "llama", &[&pods.llama[0], &pods.llama[1]]);
    text = with_pool_endpoints(&text, "qwen", &[&pods.qwen]);
    text = with_pool_endpoints(&text, "mistral", &[&pods.mistral, &mistral_with_adapter]);
    let envoy = Envoy::start_from(CONFIG, &text, 2, |_| {});
    mistral_with_adapter.wait_for_scrapes(2);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut response = envoy.post("/v1/chat/completions", &chat("support-lora", 0));
    while response.status == 404 && std::time::Instant::now() < deadline {
        // The polling interval of a wait for the adapter to be learned.
        std::thread::sleep(std::time::Duration::from_millis(100));
        response = envoy.post("/v1/chat/completions", &chat("support-lora", 0));
    }
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        response.pod(),
        "mistral-b",
        "only the pod with the adapter loaded reports it"
    );
    // Learned: every request for the adapter goes to the one pod that has it, although
    // mistral-a is as idle (a 404 from mistral-a would show a pick outside the reporters).
    for n in 1..7 {
        let response = envoy.post("/v1/chat/completions", &chat("support-lora", n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.pod(), "mistral-b");
    }
    for n in 0..6 {
        let response = envoy.post("/v1/chat/completions", &chat(MISTRAL, n));
        assert_eq!(response.status, 200, "{}", response.text());
        assert!(response.pod().starts_with("mistral-"), "{}", response.pod());
    }
    let response = envoy.post("/v1/chat/completions", &chat("gpt-4o", 0));
    assert_eq!(
        response.status, 404,
        "learning a list is not serving every model"
    );
}
