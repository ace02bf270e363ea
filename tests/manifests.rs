//! Every Kubernetes manifest in `deploy/` is valid against the real CRD schema of its kind
//! (`tests/fixtures/crds/`), and the picker configuration inside it loads with the filter's
//! own loader.

mod support;

use serde_yaml::Value;
use support::repo;

/// `spec.versions[name].schema.openAPIV3Schema` of the CRD for `api_version`/`kind`.
fn crd_schema(file: &str, api_version: &str, kind: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("tests/fixtures/crds").join(file)).unwrap();
    let (group, version) = api_version.split_once('/').expect("group/version");
    for document in serde_yaml::Deserializer::from_str(&text) {
        let crd = Value::deserialize(document).unwrap();
        if crd["spec"]["names"]["kind"] != kind || crd["spec"]["group"] != group {
            continue;
        }
        for v in crd["spec"]["versions"].as_sequence().unwrap() {
            if v["name"] == version {
                return v["schema"]["openAPIV3Schema"].clone();
            }
        }
    }
    panic!("{file} has no {kind} {api_version}");
}

use serde::Deserialize;

/// A structural OpenAPI v3 check as the API server applies it: types, required fields,
/// enums, array items, unknown fields (unless the schema preserves them), oneOf/anyOf/not.
fn validate(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_i64() || value.is_u64() || value.is_string()) {
            errors.push(format!("{path}: expected an integer or a string"));
        }
        return;
    }
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => validate_object(value, schema, preserve, path, errors),
        Some("array") => match value.as_sequence() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(item_schema) = schema.get("items") {
                        validate(item, item_schema, &format!("{path}[{i}]"), errors);
                    }
                }
            }
            None => errors.push(format!("{path}: expected an array")),
        },
        Some("string") if !value.is_string() => errors.push(format!("{path}: expected a string")),
        Some("integer") if !(value.is_i64() || value.is_u64()) => {
            errors.push(format!("{path}: expected an integer"))
        }
        Some("number") if !value.is_number() => errors.push(format!("{path}: expected a number")),
        Some("boolean") if !value.is_bool() => errors.push(format!("{path}: expected a boolean")),
        _ => {}
    }
    // `required` holds with or without a `type` (oneOf alternatives list only `required`).
    if let Some(map) = value.as_mapping() {
        for required in schema
            .get("required")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
        {
            if !map.contains_key(required) {
                errors.push(format!("{path}: missing required {required:?}"));
            }
        }
    }
    if schema
        .get("not")
        .is_some_and(|forbidden| passes(value, forbidden, path))
    {
        errors.push(format!("{path}: matches a schema it must not"));
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_sequence) {
        if !allowed.contains(value) {
            errors.push(format!("{path}: {value:?} is not one of {allowed:?}"));
        }
    }
    for (keyword, exactly_one) in [("oneOf", true), ("anyOf", false)] {
        if let Some(alternatives) = schema.get(keyword).and_then(Value::as_sequence) {
            let passing = alternatives
                .iter()
                .filter(|alternative| passes(value, alternative, path))
                .count();
            if (exactly_one && passing != 1) || passing == 0 {
                errors.push(format!(
                    "{path}: {passing} of the {keyword} alternatives match"
                ));
            }
        }
    }
}

fn passes(value: &Value, schema: &Value, path: &str) -> bool {
    let mut errors = Vec::new();
    validate(value, schema, path, &mut errors);
    errors.is_empty()
}

fn validate_object(
    value: &Value,
    schema: &Value,
    preserve: bool,
    path: &str,
    errors: &mut Vec<String>,
) {
    let Some(map) = value.as_mapping() else {
        errors.push(format!("{path}: expected an object"));
        return;
    };
    let properties = schema.get("properties").and_then(Value::as_mapping);
    for (key, child) in map {
        let key_text = key.as_str().unwrap_or("?");
        let child_path = format!("{path}.{key_text}");
        match (
            properties.and_then(|p| p.get(key)),
            schema.get("additionalProperties"),
        ) {
            (Some(child_schema), _) => validate(child, child_schema, &child_path, errors),
            (None, Some(extra)) if extra.is_mapping() => {
                validate(child, extra, &child_path, errors)
            }
            (None, _) if preserve || properties.is_none() => {}
            (None, _) => errors.push(format!("{child_path}: unknown field")),
        }
    }
}

/// Validates one manifest file; returns the parsed document.
fn check(file: &str, crd: &str) -> Value {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let manifest: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let schema = crd_schema(
        crd,
        manifest["apiVersion"].as_str().unwrap(),
        manifest["kind"].as_str().unwrap(),
    );
    assert!(
        manifest["metadata"]["name"].is_string(),
        "{file}: metadata.name"
    );
    // The API server supplies apiVersion, kind and metadata itself; the CRD schema covers the rest.
    let mut body = manifest.clone();
    if let Some(map) = body.as_mapping_mut() {
        for key in ["apiVersion", "kind", "metadata"] {
            map.remove(key);
        }
    }
    let mut errors = Vec::new();
    validate(&body, &schema, "", &mut errors);
    assert!(errors.is_empty(), "{file}:\n{}", errors.join("\n"));
    manifest
}

fn loads(config: &Value, file: &str) {
    // Istio and Envoy Gateway hand the object to the filter as JSON.
    let json = serde_json::to_string(config).unwrap();
    inference_picker_core::config::load(&json, 1).unwrap_or_else(|e| panic!("{file}: {e}"));
}

#[test]
fn istio_manifests_match_their_crds() {
    for file in [
        "deploy/istio/wasmplugin.yaml",
        "deploy/istio/wasmplugin-file.yaml",
    ] {
        let plugin = check(file, "istio-wasmplugins.extensions.istio.io.yaml");
        assert_eq!(plugin["spec"]["failStrategy"], "FAIL_CLOSE");
        loads(&plugin["spec"]["pluginConfig"], file);
    }
    let filter = check(
        "deploy/istio/envoyfilter.yaml",
        "istio-envoyfilters.networking.istio.io.yaml",
    );
    // The scrapes' cluster the plugins name is one the EnvoyFilter adds.
    let added: Vec<&Value> = filter["spec"]["configPatches"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|p| p["applyTo"] == "CLUSTER" && p["patch"]["operation"] == "ADD")
        .map(|p| &p["patch"]["value"])
        .collect();
    for file in [
        "deploy/istio/wasmplugin.yaml",
        "deploy/istio/wasmplugin-file.yaml",
    ] {
        let plugin = check(file, "istio-wasmplugins.extensions.istio.io.yaml");
        let wanted = &plugin["spec"]["pluginConfig"]["pool"]["metricsCluster"];
        assert!(
            added.iter().any(|cluster| cluster["name"] == *wanted),
            "{file}: envoyfilter.yaml adds no cluster {wanted:?}"
        );
    }
    let patch = &filter["spec"]["configPatches"][0]["patch"]["value"];
    assert_eq!(
        patch["typed_config"]["config"]["allow_on_headers_stop_iteration"],
        true
    );
    let plugin = check(
        "deploy/istio/wasmplugin.yaml",
        "istio-wasmplugins.extensions.istio.io.yaml",
    );
    assert_eq!(
        patch["name"].as_str().unwrap(),
        format!(
            "{}.{}",
            plugin["metadata"]["namespace"].as_str().unwrap(),
            plugin["metadata"]["name"].as_str().unwrap()
        ),
        "the EnvoyFilter patches the extension config Istio makes for the WasmPlugin"
    );
    // The image Dockerfile copies the built filter.
    let dockerfile = std::fs::read_to_string(repo().join("deploy/istio/Dockerfile")).unwrap();
    let source = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("COPY "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert!(
        repo().join(source).exists(),
        "{source} (run make build first)"
    );
}

#[test]
fn envoy_gateway_manifests_match_their_crds() {
    let policy = check(
        "deploy/envoy-gateway/envoyextensionpolicy.yaml",
        "envoy-gateway-envoyextensionpolicies.gateway.envoyproxy.io.yaml",
    );
    loads(
        &policy["spec"]["wasm"][0]["config"],
        "envoyextensionpolicy.yaml",
    );
    let patch = check(
        "deploy/envoy-gateway/envoypatchpolicy.yaml",
        "envoy-gateway-envoypatchpolicies.gateway.envoyproxy.io.yaml",
    );
    assert!(patch["spec"]["jsonPatches"][0]["operation"]["path"]
        .as_str()
        .unwrap()
        .ends_with("allow_on_headers_stop_iteration"));
    // The scrapes' cluster the policy names is one the patch adds.
    let wanted = &policy["spec"]["wasm"][0]["config"]["pool"]["metricsCluster"];
    assert!(
        patch["spec"]["jsonPatches"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(
                |p| p["type"] == "type.googleapis.com/envoy.config.cluster.v3.Cluster"
                    && p["operation"]["op"] == "add"
                    && p["operation"]["value"]["name"] == *wanted
            ),
        "envoypatchpolicy.yaml adds no cluster {wanted:?}"
    );
}

#[test]
fn the_validator_rejects_what_the_api_server_would() {
    let schema = crd_schema(
        "istio-wasmplugins.extensions.istio.io.yaml",
        "extensions.istio.io/v1alpha1",
        "WasmPlugin",
    );
    let bad: Value = serde_yaml::from_str(
        "{spec: {url: 'file:///a.wasm', failStrategy: FAIL_SOMETIMES, allowOnHeadersStopIteration: true}}",
    )
    .unwrap();
    let mut errors = Vec::new();
    validate(&bad, &schema, "", &mut errors);
    assert!(
        errors.iter().any(|e| e.contains("FAIL_SOMETIMES")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("allowOnHeadersStopIteration: unknown field")),
        "{errors:?}"
    );
}
