//! The config checker binary: `check` and `explain`, on the example configs.

use std::path::Path;
use std::process::Command;

fn checker(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_inference-picker"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run inference-picker");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_prints_an_effective_config_that_loads_again() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/configs");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let (ok, stdout, stderr) = checker(&["check", path.to_str().unwrap()]);
        assert!(ok, "{}: {stderr}", path.display());
        // One effective configuration per pool, each a single-pool document of its own.
        let original = inference_picker_core::config::load_set(
            &std::fs::read_to_string(&path).unwrap(),
            1,
            false,
        )
        .unwrap();
        let sections: Vec<&str> = stdout
            .split("# effective configuration\n")
            .skip(1)
            .map(|section| section.split("\n# ").next().unwrap_or(section))
            .collect();
        assert_eq!(sections.len(), original.pools.len(), "{}", path.display());
        for (effective, original) in sections.into_iter().zip(&original.pools) {
            let again = inference_picker_core::config::load(effective, 1).unwrap_or_else(|e| {
                panic!(
                    "{}: effective config does not load: {e}\n{effective}",
                    path.display()
                )
            });
            let original = &original.config;
            assert_eq!(
                again.scheduler.profiles().len(),
                original.scheduler.profiles().len()
            );
            assert_eq!(again.metric_selectors, original.metric_selectors);
            assert_eq!(again.pool, original.pool);
        }
    }
}

#[test]
fn check_names_the_key_of_an_error() {
    let dir = std::env::temp_dir().join(format!("ip-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: kv\npool: {endpoints: [{address: '10.0.0.1:8000'}]}\n",
    )
    .unwrap();
    let (ok, _, stderr) = checker(&["check", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("schedulingProfiles[0].plugins[0].pluginRef") && stderr.contains("\"kv\""),
        "{stderr}"
    );
    std::fs::write(&bad, "plugins: [\n").unwrap();
    let (ok, _, stderr) = checker(&["check", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("line"),
        "syntax errors carry a location: {stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn explain_prints_every_score_and_the_winner() {
    let (ok, stdout, stderr) = checker(&[
        "explain",
        "examples/configs/custom-metrics.yaml",
        "--metrics",
        "examples/explain/pod-1.metrics",
        "--metrics",
        "examples/explain/pod-2.metrics",
        "--metrics",
        "examples/explain/pod-3.metrics",
        "--body",
        "examples/explain/chat.json",
        "--path",
        "/v1/chat/completions",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout.matches("active-load-scorer=").count(), 3, "{stdout}");
    assert!(stdout.contains("prefix-cache-scorer=0.000x60"), "{stdout}");
    assert!(
        stdout.trim_end().ends_with("picked: 127.0.0.1:8002"),
        "{stdout}"
    );
    let (ok, _, stderr) = checker(&[
        "explain",
        "examples/configs/custom-metrics.yaml",
        "--metrics",
        "examples/explain/pod-1.metrics",
        "--body",
        "examples/explain/chat.json",
    ]);
    assert!(!ok);
    assert!(stderr.contains("3 endpoints"), "{stderr}");
}

#[test]
fn explain_shows_flow_control_holding_a_request_while_the_pool_is_saturated() {
    let dir = std::env::temp_dir().join(format!("checker-flow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("flow.yaml");
    std::fs::write(
        &config,
        "featureGates: [flowControl]\npool:\n  endpoints:\n  - address: 127.0.0.1:8001\n  - address: 127.0.0.1:8002\n  - address: 127.0.0.1:8003\n",
    )
    .unwrap();
    let explain = |pods: [&str; 3]| {
        let mut args = vec!["explain", config.to_str().unwrap()];
        for pod in pods {
            args.extend(["--metrics", pod]);
        }
        args.extend([
            "--body",
            "examples/explain/chat.json",
            "--path",
            "/v1/chat/completions",
        ]);
        checker(&args)
    };
    // Flow control holds a request only while no pod has room (each pod counts at most 1).
    let (ok, stdout, stderr) = explain([
        "examples/explain/pod-saturated.metrics",
        "examples/explain/pod-saturated.metrics",
        "examples/explain/pod-saturated.metrics",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("pool saturation 1.00"), "{stdout}");
    assert!(
        stdout.contains("band    0: ceiling 1.00 (saturated, waits) maxRequests 5000"),
        "{stdout}"
    );
    assert!(
        stdout.trim_end().ends_with(
            "held: flow control queues it (band 0, flow \"default-flow\") until the pool's saturation drops below its band's ceiling"
        ),
        "{stdout}"
    );
    let (ok, stdout, stderr) = explain([
        "examples/explain/pod-1.metrics",
        "examples/explain/pod-2.metrics",
        "examples/explain/pod-3.metrics",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("(room, goes at once)"), "{stdout}");
    assert!(
        stdout.trim_end().ends_with("picked: 127.0.0.1:8002"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn explain_picks_the_pool_by_the_bodys_model_and_refuses_an_unknown_one() {
    let dir = std::env::temp_dir().join(format!("checker-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = |name: &str, model: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!(r#"{{"model":"{model}","prompt":"hello"}}"#)).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let explain = |body: &str, metrics: &[&str]| {
        let mut args = vec![
            "explain",
            "examples/configs/multi-pool.yaml",
            "--body",
            body,
        ];
        for pod in metrics {
            args.extend(["--metrics", pod]);
        }
        checker(&args)
    };
    let qwen = body("qwen.json", "Qwen/Qwen3-8B");
    let (ok, stdout, stderr) = explain(&qwen, &["examples/explain/pod-1.metrics"]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("pool: qwen"), "{stdout}");
    assert!(stdout.contains("127.0.0.1:8003"), "{stdout}");
    // The llama pool has two pods: one metrics file is not enough for it.
    let lora = body("lora.json", "sql-lora");
    let (ok, stdout, stderr) = explain(&lora, &["examples/explain/pod-1.metrics"]);
    assert!(
        !ok && stdout.contains("pool: llama") && stderr.contains("2 endpoints"),
        "{stderr}"
    );
    let unknown = body("unknown.json", "gpt-4o");
    let (ok, _, stderr) = explain(&unknown, &["examples/explain/pod-1.metrics"]);
    assert!(!ok);
    assert!(
        stderr.contains("404") && stderr.contains("gpt-4o"),
        "{stderr}"
    );
}
