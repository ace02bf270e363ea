//! The configuration as the filter runs it, every implicit plugin, profile, weight and default
//! spelled out. Only the CLI (`inference-picker check`) asks for it; the filter's VMs never
//! compute it.

use super::pool::PoolConfig;
use super::raw::{RawConfig, RawPlugin};
use super::validate::{API_VERSIONS, KIND};
use crate::config::flow_control::FlowControlConfig;
use crate::scheduling::flow_policy::FlowPolicy;
use crate::scheduling::flow_policy_plugins::{fairness_type, ordering_type};
use crate::scheduling::plugins;
use crate::scheduling::{Plugin, PluginInstance, Profile};
use serde_yaml::Value;

/// The loaded configuration written out in full, in `EndpointPickerConfig` form.
pub(super) fn document(
    raw: &RawConfig,
    raw_plugins: &[RawPlugin],
    instances: &[PluginInstance],
    profiles: &[Profile],
    detector: usize,
    pool: &PoolConfig,
    flow_control: Option<&FlowControlConfig>,
) -> Value {
    let name_of = |index: usize| instances.get(index).map_or("?", |p| p.name.as_str());
    let plugins: Vec<Value> = instances
        .iter()
        .map(|instance| {
            let given = raw_plugins
                .iter()
                .find(|p| p.name.as_deref().unwrap_or(&p.type_name) == instance.name)
                .map_or(Value::Null, |p| p.parameters.clone());
            let parameters =
                plugins::effective_parameters(instance.type_name, &given).unwrap_or(given);
            serde_yaml::to_value(serde_json::json!({
                "name": instance.name,
                "type": instance.type_name,
                "parameters": serde_json::to_value(&parameters).unwrap_or_default(),
            }))
            .unwrap_or_default()
        })
        .collect();
    let profiles: Vec<serde_json::Value> =
        profiles
            .iter()
            .map(|profile| {
                let mut refs: Vec<serde_json::Value> = profile
                    .filters
                    .iter()
                    .filter(|f| !profile.scorers.iter().any(|s| s.plugin == **f))
                    .map(|&f| serde_json::json!({"pluginRef": name_of(f)}))
                    .collect();
                refs.extend(profile.scorers.iter().map(
                    |s| serde_json::json!({"pluginRef": name_of(s.plugin), "weight": s.weight}),
                ));
                refs.push(serde_json::json!({"pluginRef": name_of(profile.picker)}));
                serde_json::json!({"name": profile.name, "plugins": refs})
            })
            .collect();
    let sources: Vec<serde_json::Value> = raw
        .data_layer
        .as_ref()
        .map(|d| {
            d.sources
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "pluginRef": s.plugin_ref,
                        "extractors": s.extractors.iter().map(|e| serde_json::json!({"pluginRef": e.plugin_ref})).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let document = serde_json::json!({
        "apiVersion": raw.api_version.as_deref().unwrap_or(API_VERSIONS.first().copied().unwrap_or_default()),
        "kind": KIND,
        "featureGates": raw.feature_gates,
        "schedulingProfiles": profiles,
        "saturationDetector": {"pluginRef": name_of(detector)},
        "dataLayer": {"sources": sources},
        "pool": serde_json::to_value(pool).unwrap_or_default(),
    });
    let mut value = serde_yaml::to_value(document).unwrap_or_default();
    if let Value::Mapping(map) = &mut value {
        map.insert("plugins".into(), Value::Sequence(plugins));
        if let Some(flow) = flow_control {
            let section = flow_control_section(flow, name_of(detector), instances);
            map.insert(
                "flowControl".into(),
                serde_yaml::to_value(section).unwrap_or_default(),
            );
        }
    }
    value
}

/// The `flowControl` section with every band spelled out (objectives' bands included).
fn flow_control_section(
    flow: &FlowControlConfig,
    detector: &str,
    instances: &[PluginInstance],
) -> serde_json::Value {
    // A declared plugin configuring the policy, by name; else llm-d's default by type.
    let reference = |policy: FlowPolicy, type_name: &'static str| {
        instances
            .iter()
            .find(|instance| matches!(&instance.plugin, Plugin::FlowPolicy(p) if *p == policy))
            .map_or(type_name, |instance| instance.name.as_str())
            .to_owned()
    };
    let ttl = |ttl: Option<std::time::Duration>| {
        ttl.map_or_else(|| "0s".to_owned(), crate::duration::format_duration)
    };
    let bands: Vec<serde_json::Value> = flow
        .bands
        .iter()
        .map(|band| {
            serde_json::json!({
                "priority": band.priority,
                "maxRequests": band.max_requests,
                "maxBytes": band.max_bytes,
                "fairnessPolicyRef": reference(FlowPolicy::Fairness(band.fairness), fairness_type(band.fairness)),
                "orderingPolicyRef": reference(FlowPolicy::Ordering(band.ordering), ordering_type(band.ordering)),
            })
        })
        .collect();
    let mut section = serde_json::json!({
        "saturationDetector": {"pluginRef": detector},
        "maxRequests": flow.max_requests.unwrap_or(0),
        "maxBytes": flow.max_bytes.unwrap_or(0),
        "defaultRequestTTL": ttl(flow.request_ttl),
        "noEndpointRequestTTL": ttl(flow.no_endpoint_ttl),
        "priorityBands": bands,
    });
    let usage_limit = instances.iter().find(|instance| {
        matches!(
            instance.plugin,
            Plugin::FlowPolicy(FlowPolicy::UsageLimit(_))
        )
    });
    if let (Some(instance), Some(map)) = (usage_limit, section.as_object_mut()) {
        map.insert(
            "usageLimitPolicyPluginRef".into(),
            instance.name.clone().into(),
        );
    }
    section
}
