//! Checks that reject a document (header, weights) or warn about one (unused plugins, a
//! prefix reader without a prefix producer).

use super::error::ConfigError;
use super::raw::RawConfig;
use crate::limits::MAX_WEIGHT;
use crate::scheduling::plugins::{self, Kind};
use crate::scheduling::{Plugin, PluginInstance, Profile};

pub(super) const API_VERSIONS: &[&str] = &[
    "inference.networking.x-k8s.io/v1alpha1",
    "inference.networking.k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
];

pub(super) const KIND: &str = "EndpointPickerConfig";

pub(super) const FEATURE_GATES: &[&str] = &["dataLayer", "flowControl", "enableLegacyMetrics"];

/// Gates llm-d knows that change nothing here.
const IGNORED_GATES: &[(&str, &str)] = &[(
    "enableLegacyMetrics",
    "the filter's own stats do not have llm-d's legacy metric names",
)];

pub(super) fn warn_ignored_gates(raw: &RawConfig, warnings: &mut Vec<String>) {
    for gate in &raw.feature_gates {
        if let Some((_, why)) = IGNORED_GATES.iter().find(|(name, _)| name == gate) {
            warnings.push(format!(
                "featureGates: parameter {gate:?} is accepted and not applied: {why}"
            ));
        }
    }
}

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

/// A plugin that produces data for others (a built-in kind, as llm-d's producers are),
/// whatever it is built as: a profile that lists it does not score with it.
pub(super) fn is_producer(instance: &PluginInstance) -> bool {
    plugins::spec(instance.type_name).is_some_and(|spec| spec.kind == Kind::BuiltIn)
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

/// Plugins that change nothing (declared but in no profile), and accepted llm-d plugins that
/// do less here than in llm-d (their `limitation`). Declaring a plugin whose job the filter
/// does on its own, as llm-d's EPP would create it, is silent.
pub(super) fn warn_unused(
    instances: &[PluginInstance],
    profiles: &[Profile],
    handler: usize,
    warnings: &mut Vec<String>,
) {
    for (index, instance) in instances.iter().enumerate() {
        let spec = plugins::spec(instance.type_name);
        let wired_elsewhere = matches!(
            instance.plugin,
            Plugin::DataLayer(_)
                | Plugin::PdDecider(_)
                | Plugin::BuiltIn(_)
                | Plugin::SaturationDetector(_)
                | Plugin::FlowPolicy(_)
        ) || spec.is_some_and(|spec| spec.kind == Kind::BuiltIn);
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
        if let Some(limitation) = spec.and_then(|spec| spec.limitation) {
            warnings.push(format!(
                "plugin {:?} ({}) loads with a limitation: {limitation}",
                instance.name, instance.type_name
            ));
        }
    }
}

/// `requestHandler.parsers` and `parser` name declared parser plugins. The filter parses what
/// it knows on every route whatever the list says, so the list is only checked.
pub(super) fn check_parsers(
    raw: &RawConfig,
    instances: &[PluginInstance],
) -> Result<(), ConfigError> {
    let listed = raw
        .request_handler
        .iter()
        .flat_map(|handler| handler.parsers.iter().enumerate())
        .map(|(i, parser)| (format!("requestHandler.parsers[{i}].pluginRef"), parser))
        .chain(
            raw.parser
                .iter()
                .map(|parser| ("parser.pluginRef".to_owned(), parser)),
        );
    for (key, parser) in listed {
        let instance = instances
            .iter()
            .find(|instance| instance.name == parser.plugin_ref)
            .ok_or_else(|| {
                ConfigError::invalid(
                    &key,
                    format!("no plugin named {:?} is declared", parser.plugin_ref),
                )
            })?;
        if plugins::spec(instance.type_name).map(|spec| spec.kind) != Some(Kind::Parser) {
            return Err(ConfigError::invalid(
                &key,
                format!(
                    "{:?} ({}) is not a request parser",
                    parser.plugin_ref, instance.type_name
                ),
            ));
        }
    }
    Ok(())
}
