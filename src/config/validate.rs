//! Checks that reject a document (header, weights) or warn about one (unused plugins, a
//! prefix reader without a prefix producer).

use super::error::ConfigError;
use super::raw::RawConfig;
use crate::limits::MAX_WEIGHT;
use crate::scheduling::plugins::{self, Data};
use crate::scheduling::{Plugin, PluginInstance, Profile};

pub(super) const API_VERSIONS: &[&str] = &[
    "inference.networking.x-k8s.io/v1alpha1",
    "inference.networking.k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
];

pub(super) const KIND: &str = "EndpointPickerConfig";

pub(super) const FEATURE_GATES: &[&str] = &["dataLayer", "flowControl", "enableLegacyMetrics"];

pub(super) fn check_header(raw: &RawConfig) -> Result<(), ConfigError> {
    if let Some(api_version) = &raw.api_version {
        if !API_VERSIONS.contains(&api_version.as_str()) {
            return Err(ConfigError::invalid(
                "apiVersion",
                format!("{api_version:?} is not one of {API_VERSIONS:?}"),
            ));
        }
    }
    if let Some(kind) = &raw.kind {
        if kind != KIND {
            return Err(ConfigError::invalid(
                "kind",
                format!("{kind:?} must be {KIND:?}"),
            ));
        }
    }
    for (i, gate) in raw.feature_gates.iter().enumerate() {
        if !FEATURE_GATES.contains(&gate.as_str()) {
            return Err(ConfigError::invalid(
                format!("featureGates[{i}]"),
                format!("unknown feature gate {gate:?} (known: {FEATURE_GATES:?})"),
            ));
        }
    }
    Ok(())
}

pub(super) fn weight(weight: Option<f64>, key: &str) -> Result<f64, ConfigError> {
    match weight {
        None => Ok(1.0),
        Some(w) if w.is_finite() && (0.0..=MAX_WEIGHT).contains(&w) => Ok(w),
        Some(w) => Err(ConfigError::invalid(
            key,
            format!("weight {w} must be a number from 0 to {MAX_WEIGHT} (totals add every weighted score)"),
        )),
    }
}

pub(super) fn warn_unused(
    instances: &[PluginInstance],
    profiles: &[Profile],
    handler: usize,
    warnings: &mut Vec<String>,
) {
    for (index, instance) in instances.iter().enumerate() {
        let wired_elsewhere = matches!(
            instance.plugin,
            Plugin::DataLayer(_)
                | Plugin::PdDecider(_)
                | Plugin::BuiltIn(_)
                | Plugin::SaturationDetector(_)
                | Plugin::FlowPolicy(_)
        );
        let used = index == handler
            || wired_elsewhere
            || profiles.iter().any(|p| {
                p.picker == index
                    || p.filters.contains(&index)
                    || p.scorers.iter().any(|s| s.plugin == index)
            });
        if !used {
            warnings.push(format!(
                "plugin {:?} is declared but no profile uses it",
                instance.name
            ));
        }
    }
}

/// A plugin that reads prefix matches sees none unless a plugin that computes them is declared.
pub(super) fn warn_missing_prefix_scorer(instances: &[PluginInstance], warnings: &mut Vec<String>) {
    let specs = || {
        instances
            .iter()
            .filter_map(|instance| Some((instance, plugins::spec(instance.type_name)?)))
    };
    if specs().any(|(_, spec)| spec.produces(Data::PrefixMatches)) {
        return;
    }
    for (instance, _) in specs().filter(|(_, spec)| spec.consumes(Data::PrefixMatches)) {
        warnings.push(format!(
            "plugin {:?} reads prefix-cache matches but no prefix-cache-scorer is declared; it sees no cache hits",
            instance.name
        ));
    }
}
