//! The deployment files parse and reference files that exist: docker-compose and its
//! Dockerfile. Docker itself is not needed.

mod support;

use serde_yaml::Value;
use std::path::{Path, PathBuf};
use support::repo;

fn yaml(relative: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(relative)).expect(relative);
    let mut value: Value =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{relative}: {e}"));
    // Compose files use YAML merge keys (`<<: *sim`).
    value.apply_merge().expect("merge keys");
    value
}

/// The Envoy version the Makefile installs, which images must match.
fn pinned_envoy_version() -> String {
    let makefile = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    makefile
        .lines()
        .find_map(|l| l.strip_prefix("ENVOY_VERSION := "))
        .expect("ENVOY_VERSION in the Makefile")
        .trim()
        .to_string()
}

/// Checks a Dockerfile's instructions and that every COPY source exists in `context`.
fn check_dockerfile(path: &Path, context: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|_| panic!("{}", path.display()));
    let known = [
        "FROM",
        "WORKDIR",
        "COPY",
        "RUN",
        "ENTRYPOINT",
        "CMD",
        "ARG",
        "ENV",
        "EXPOSE",
        "LABEL",
        "USER",
    ];
    assert!(
        text.lines().any(|l| l.starts_with("FROM ")),
        "{}: no FROM",
        path.display()
    );
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let instruction = line.split_whitespace().next().unwrap_or("");
        assert!(
            known.contains(&instruction),
            "{}: unknown instruction in {line:?}",
            path.display()
        );
        if instruction == "COPY" && !line.contains("--from=") {
            let words: Vec<&str> = line.split_whitespace().skip(1).collect();
            for source in &words[..words.len() - 1] {
                assert!(
                    context.join(source).exists(),
                    "{}: COPY source {source} missing",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn compose_file_and_dockerfile_are_consistent_with_the_repository() {
    let compose_dir: PathBuf = repo().join("deploy/compose");
    let compose = yaml("deploy/compose/docker-compose.yaml");
    let services = compose["services"].as_mapping().expect("services");
    let envoy = &compose["services"]["envoy"];
    assert_eq!(
        envoy["image"].as_str(),
        Some(format!("envoyproxy/envoy:v{}", pinned_envoy_version()).as_str()),
        "the Envoy image is the version the tests run"
    );
    // Every mounted file exists (the .wasm after `make build`), and the Envoy config mounted is
    // envoy/envoy.yaml, the file the integration tests and the demo run.
    let mounts: Vec<&str> = envoy["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for mount in &mounts {
        let source = mount.split(':').next().unwrap();
        assert!(
            compose_dir.join(source).exists(),
            "mount source {source} missing"
        );
    }
    let config_mount = mounts
        .iter()
        .find(|m| m.contains("envoy.yaml"))
        .expect("an Envoy config mount");
    assert_eq!(
        std::fs::canonicalize(compose_dir.join(config_mount.split(':').next().unwrap())).unwrap(),
        std::fs::canonicalize(repo().join("envoy/envoy.yaml")).unwrap()
    );
    let command: Vec<&str> = envoy["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let config_arg = command
        .iter()
        .skip_while(|a| **a != "-c")
        .nth(1)
        .expect("-c");
    assert!(
        config_mount.contains(&format!("/repo/{config_arg}")),
        "{config_arg} is the mounted file"
    );
    // The pods listen where envoy/envoy.yaml's pool expects them.
    let picker: Value = serde_yaml::from_str(&support::shipped_picker_config()).unwrap();
    let mut expected: Vec<String> = picker["pool"]["endpoints"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            e["address"]
                .as_str()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut ports = Vec::new();
    for (name, service) in services {
        let Some(build) = service.get("build") else {
            continue;
        };
        let context = compose_dir.join(build["context"].as_str().unwrap());
        check_dockerfile(
            &context.join(build["dockerfile"].as_str().unwrap()),
            &context,
        );
        let args: Vec<&str> = service["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let port = args
            .iter()
            .skip_while(|a| **a != "--port")
            .nth(1)
            .unwrap_or_else(|| panic!("{name:?}: --port"));
        ports.push(port.to_string());
    }
    expected.sort();
    ports.sort();
    assert_eq!(ports, expected);
    assert!(
        compose["services"]["load"]["profiles"]
            .as_sequence()
            .is_some(),
        "the load runs on demand"
    );
}
