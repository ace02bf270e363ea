//! Checks that reject a document (header, weights) or warn about one (unused plugins, a
//! prefix reader without a prefix producer).

use super::error::ConfigError;
use super::raw::RawConfig;
use crate::limits::MAX_WEIGHT;
use crate::scheduling::plugins::{self, Data, Kind};
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

/// Plugins that change nothing: declared but in no profile, or accepted llm-d plugins whose
/// job the filter does on its own.
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
        if let Some(done_by) = plugins::spec(instance.type_name).and_then(|spec| spec.done_by) {
            let plugin = if instance.name == instance.type_name {
                format!("{:?}", instance.name)
            } else {
                format!("{:?} ({})", instance.name, instance.type_name)
            };
            warnings.push(format!(
                "plugin {plugin} is accepted and does nothing here: {done_by}"
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
