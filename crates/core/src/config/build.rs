//! From checked raw sections to the scheduler's parts: plugin instances, profiles, the
//! profile handler, the saturation detector and the data-layer wiring.

use super::defaults::{default_picker, implicit_profile};
use super::error::ConfigError;
use super::pool::PoolConfig;
use super::raw::{RawConfig, RawPlugin, RawProfile};
use super::validate::{is_producer, weight};
use crate::config::flow_control::FlowControlConfig;
use crate::scheduling::plugins::{self, profile_handler::single_profile_handler};
use crate::scheduling::{
    DataLayerPlugin, ModelsSource, Plugin, PluginInstance, PluginSummary, Profile, WeightedScorer,
    Wiring,
};
use serde_yaml::Value;

pub(super) fn build_plugins(
    raw: &[RawPlugin],
    warnings: &mut Vec<String>,
) -> Result<Vec<PluginInstance>, ConfigError> {
    let mut instances: Vec<PluginInstance> = Vec::with_capacity(raw.len() + 2);
    for (i, spec) in raw.iter().enumerate() {
        if let Some(why) = plugins::not_supported(&spec.type_name) {
            return Err(ConfigError::invalid(
                format!("plugins[{i}].type"),
                format!("plugin type {:?} is not supported: {why}", spec.type_name),
            ));
        }
        let type_name = plugins::known_type(&spec.type_name).ok_or_else(|| {
            ConfigError::invalid(
                format!("plugins[{i}].type"),
                format!(
                    "unknown plugin type {:?}; known types: {}",
                    spec.type_name,
                    plugins::all_types().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        let name = spec.name.clone().unwrap_or_else(|| spec.type_name.clone());
        if name.is_empty() {
            return Err(ConfigError::invalid(
                format!("plugins[{i}].name"),
                "must not be empty",
            ));
        }
        if instances.iter().any(|p| p.name == name) {
            return Err(ConfigError::invalid(
                format!("plugins[{i}].name"),
                format!("plugin name {name:?} is declared twice"),
            ));
        }
        let plugin = plugins::build(type_name, &spec.parameters).map_err(|reason| {
            ConfigError::invalid(format!("plugins[{i}].parameters ({name})"), reason)
        })?;
        warn_ignored(&name, type_name, &spec.parameters, warnings);
        instances.push(PluginInstance {
            name,
            type_name,
            plugin,
        });
    }
    Ok(instances)
}

/// llm-d's EPP creates `predicted-latency-producer` when a plugin reads predictions and none
/// is declared; so does the loader.
pub(super) fn add_missing_latency_producer(
    instances: &mut Vec<PluginInstance>,
) -> Result<(), ConfigError> {
    let spec_of = |i: &PluginInstance| plugins::spec(i.type_name);
    let reads = instances
        .iter()
        .any(|i| spec_of(i).is_some_and(|s| s.consumes(plugins::Data::LatencyPredictions)));
    let produced = instances
        .iter()
        .any(|i| spec_of(i).is_some_and(|s| s.produces(plugins::Data::LatencyPredictions)));
    if reads && !produced {
        let type_name = plugins::data_producer::predicted_latency_producer::TYPE;
        let plugin = plugins::build(type_name, &Value::Null)
            .map_err(|reason| ConfigError::invalid("plugins", reason))?;
        instances.push(PluginInstance {
            name: type_name.to_owned(),
            type_name,
            plugin,
        });
    }
    Ok(())
}

/// Each parameter the plugin accepts for llm-d and does not apply, named in a warning.
fn warn_ignored(name: &str, type_name: &str, parameters: &Value, warnings: &mut Vec<String>) {
    let Some(spec) = plugins::spec(type_name) else {
        return;
    };
    let plugin = if name == type_name {
        format!("{name:?}")
    } else {
        format!("{name:?} ({type_name})")
    };
    for ignored in spec.ignored.iter().filter(|i| i.is_set_in(parameters)) {
        warnings.push(format!(
            "plugin {plugin}: parameter {:?} is accepted and not applied: {}",
            ignored.key, ignored.why
        ));
    }
}

pub(super) fn build_profiles(
    raw: &[RawProfile],
    instances: &mut Vec<PluginInstance>,
) -> Result<Vec<Profile>, ConfigError> {
    let implicit;
    let raw = if raw.is_empty() {
        implicit = [implicit_profile(instances)];
        &implicit[..]
    } else {
        raw
    };
    let mut profiles: Vec<Profile> = Vec::with_capacity(raw.len());
    for (p, spec) in raw.iter().enumerate() {
        let key = format!("schedulingProfiles[{p}]");
        if spec.name.is_empty() || profiles.iter().any(|existing| existing.name == spec.name) {
            return Err(ConfigError::invalid(
                format!("{key}.name"),
                format!("profile name {:?} is empty or declared twice", spec.name),
            ));
        }
        let mut filters = Vec::new();
        let mut scorers = Vec::new();
        let mut picker = None;
        for (r, reference) in spec.plugins.iter().enumerate() {
            let key = format!("{key}.plugins[{r}].pluginRef");
            let index = instances
                .iter()
                .position(|instance| instance.name == reference.plugin_ref)
                .ok_or_else(|| {
                    ConfigError::invalid(
                        &key,
                        format!("no plugin named {:?} is declared", reference.plugin_ref),
                    )
                })?;
            // llm-d lists data producers in a profile too; they run for every request.
            if instances.get(index).is_some_and(is_producer) {
                continue;
            }
            match instances.get(index).map(|i| &i.plugin) {
                Some(Plugin::Filter(_)) => filters.push(index),
                Some(Plugin::Scorer(scorer)) => {
                    if scorer.filters() {
                        filters.push(index);
                    }
                    scorers.push(WeightedScorer {
                        plugin: index,
                        weight: weight(reference.weight, &key)?,
                    })
                }
                Some(Plugin::Picker(_)) if picker.is_none() => picker = Some(index),
                Some(Plugin::Picker(_)) => {
                    return Err(ConfigError::invalid(
                        &key,
                        "a profile takes exactly one picker",
                    ))
                }
                Some(Plugin::BuiltIn(_)) => {}
                Some(other) => {
                    return Err(ConfigError::invalid(
                        &key,
                        format!(
                            "{:?} is a {}, not a filter, scorer or picker",
                            reference.plugin_ref,
                            other.kind()
                        ),
                    ))
                }
                None => return Err(ConfigError::invalid(&key, "unresolvable plugin")),
            }
        }
        // llm-d's default, silently: a profile without a picker takes the best score.
        let picker = match picker {
            Some(picker) => picker,
            None => default_picker(instances),
        };
        profiles.push(Profile {
            name: spec.name.clone(),
            filters,
            scorers,
            picker,
        });
    }
    Ok(profiles)
}

pub(super) fn profile_handler(
    instances: &mut Vec<PluginInstance>,
    profiles: &[Profile],
) -> Result<usize, ConfigError> {
    let handlers: Vec<usize> = instances
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.plugin, Plugin::ProfileHandler(_)))
        .map(|(i, _)| i)
        .collect();
    let handler = match handlers.as_slice() {
        [] => {
            instances.push(PluginInstance {
                name: single_profile_handler::TYPE.into(),
                type_name: single_profile_handler::TYPE,
                plugin: Plugin::ProfileHandler(Box::new(
                    single_profile_handler::SingleProfileHandler,
                )),
            });
            instances.len() - 1
        }
        [one] => *one,
        _ => {
            return Err(ConfigError::invalid(
                "plugins",
                "more than one profile handler is declared",
            ))
        }
    };
    let summaries: Vec<PluginSummary> = instances.iter().map(PluginSummary::of).collect();
    if let Some(instance) = instances.get_mut(handler) {
        if let Plugin::ProfileHandler(plugin) = &mut instance.plugin {
            plugin.resolve(profiles, &summaries).map_err(|reason| {
                ConfigError::invalid(format!("plugins ({})", instance.name), reason)
            })?;
        }
    }
    Ok(handler)
}

/// The plugin `saturationDetector.pluginRef` names, or GIE's default `utilization-detector`.
pub(super) fn saturation_detector(
    raw: &RawConfig,
    instances: &mut Vec<PluginInstance>,
) -> Result<usize, ConfigError> {
    // llm-d moved the reference under `flowControl`; that one wins when both are set.
    let nested = raw
        .flow_control
        .as_ref()
        .and_then(|section| section.saturation_detector.as_ref());
    let (key, reference) = match (nested, &raw.saturation_detector) {
        (Some(nested), _) => (
            "flowControl.saturationDetector.pluginRef",
            &nested.plugin_ref,
        ),
        (None, Some(top)) => ("saturationDetector.pluginRef", &top.plugin_ref),
        (None, None) => return default_saturation_detector(instances),
    };
    resolve_detector(key, reference, instances)
}

/// The `flowControl` section, when the `flowControl` gate is on (else `None`, with a warning
/// if the section is there: llm-d ignores it too).
pub(super) fn flow_control(
    raw: &RawConfig,
    instances: &[PluginInstance],
    pool: &PoolConfig,
    warnings: &mut Vec<String>,
) -> Result<Option<FlowControlConfig>, ConfigError> {
    let gated = raw.feature_gates.iter().any(|g| g == FLOW_CONTROL_GATE);
    if !gated {
        if raw.flow_control.is_some() {
            warnings.push(
                "the flowControl section is ignored without `featureGates: [flowControl]`".into(),
            );
        }
        return Ok(None);
    }
    let section = raw.flow_control.clone().unwrap_or_default();
    let lookup = |name: &str| {
        instances
            .iter()
            .find(|instance| instance.name == name)
            .and_then(|instance| match &instance.plugin {
                Plugin::FlowPolicy(policy) => Some(*policy),
                _ => None,
            })
            .or_else(|| crate::config::flow_control::default_policy(name))
    };
    let priorities: Vec<i32> = pool.objectives.iter().map(|o| o.priority).collect();
    crate::config::flow_control::build(&section, &priorities, &lookup)
        .map(Some)
        .map_err(|(key, reason)| ConfigError::invalid(key, reason))
}

fn default_saturation_detector(instances: &mut Vec<PluginInstance>) -> Result<usize, ConfigError> {
    {
        instances.push(PluginInstance {
            name: "utilization-detector (default)".into(),
            type_name: plugins::saturation_detector::utilization_detector::TYPE,
            plugin: plugins::build(
                plugins::saturation_detector::utilization_detector::TYPE,
                &Value::Null,
            )
            .map_err(|reason| ConfigError::invalid("saturationDetector", reason))?,
        });
        Ok(instances.len() - 1)
    }
}

fn resolve_detector(
    key: &str,
    name: &str,
    instances: &[PluginInstance],
) -> Result<usize, ConfigError> {
    match instances.iter().position(|p| p.name == *name) {
        Some(index) => match instances.get(index).map(|p| &p.plugin) {
            Some(Plugin::SaturationDetector(_)) => Ok(index),
            Some(other) => Err(ConfigError::invalid(
                key,
                format!("{name:?} is a {}, not a saturation detector", other.kind()),
            )),
            None => Err(ConfigError::invalid(key, "unresolvable plugin")),
        },
        None => Err(ConfigError::invalid(
            key,
            format!("no plugin named {name:?} is declared"),
        )),
    }
}

pub(super) const FLOW_CONTROL_GATE: &str = "flowControl";

/// Wires `dataLayer.sources[].extractors[]` (the seed's `data:`) into the scrape: the sources
/// say which path is scraped, the extractors which custom series are kept.
pub(super) fn wire_data_layer(
    raw: &RawConfig,
    instances: &[PluginInstance],
    pool: &mut PoolConfig,
    warnings: &mut Vec<String>,
) -> Result<Wiring, ConfigError> {
    let sources = raw.data_layer.as_ref().map_or(&[][..], |d| &d.sources[..]);
    if let Some(discovery) = raw.data_layer.as_ref().and_then(|d| d.discovery.as_ref()) {
        return Err(ConfigError::invalid(
            "dataLayer.discovery",
            format!(
                "{:?}: endpoints come from pool.endpoints or pool.discovery",
                discovery.plugin_ref
            ),
        ));
    }
    let mut wiring = Wiring::default();
    // A metrics source declared but not listed is llm-d's default wiring of it.
    let mut source_path: Option<&str> = if sources.is_empty() {
        declared_source_path(instances)?
    } else {
        None
    };
    for (s, source) in sources.iter().enumerate() {
        let key = format!("dataLayer.sources[{s}].pluginRef");
        match find_data_plugin(instances, &source.plugin_ref, &key)? {
            DataLayerPlugin::Source { path, .. } => {
                if source_path.is_some_and(|p| p != path) {
                    return Err(ConfigError::invalid(
                        key,
                        "every metrics data source must scrape the same path",
                    ));
                }
                source_path = Some(path);
            }
            DataLayerPlugin::Extractor(_) => {
                return Err(ConfigError::invalid(
                    key,
                    format!("{:?} is an extractor, not a data source", source.plugin_ref),
                ))
            }
            DataLayerPlugin::Models(_) => {
                if !source.extractors.is_empty() {
                    return Err(ConfigError::invalid(
                        format!("dataLayer.sources[{s}].extractors"),
                        "a models data source has no metric extractors",
                    ));
                }
                continue;
            }
        }
        for (e, extractor) in source.extractors.iter().enumerate() {
            let key = format!("dataLayer.sources[{s}].extractors[{e}].pluginRef");
            if is_core_extractor(instances, &extractor.plugin_ref) {
                continue;
            }
            let DataLayerPlugin::Extractor(selector) =
                find_data_plugin(instances, &extractor.plugin_ref, &key)?
            else {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "{:?} is a data source, not an extractor",
                        extractor.plugin_ref
                    ),
                ));
            };
            if !wiring
                .extractors
                .iter()
                .any(|(name, _)| *name == extractor.plugin_ref)
            {
                wiring
                    .extractors
                    .push((extractor.plugin_ref.clone(), selector.clone()));
            }
        }
    }
    if let Some(path) = source_path {
        if pool.metrics_path != PoolConfig::default().metrics_path && pool.metrics_path != path {
            return Err(ConfigError::invalid(
                "pool.metricsPath",
                format!("differs from the metrics data source's path {path:?}"),
            ));
        }
        pool.metrics_path = path.to_owned();
    }
    for instance in instances {
        let wired = wiring
            .extractors
            .iter()
            .any(|(name, _)| *name == instance.name);
        if matches!(
            instance.plugin,
            Plugin::DataLayer(DataLayerPlugin::Extractor(_))
        ) && !wired
        {
            warnings.push(format!(
                "extractor {:?} is not wired into dataLayer.sources; its metric is not extracted",
                instance.name
            ));
        }
    }
    Ok(wiring)
}

/// The path every declared `metrics-data-source` scrapes, when none is listed in
/// `dataLayer.sources`.
fn declared_source_path(instances: &[PluginInstance]) -> Result<Option<&str>, ConfigError> {
    let mut paths = instances
        .iter()
        .filter_map(|instance| match &instance.plugin {
            Plugin::DataLayer(DataLayerPlugin::Source { path, .. }) => Some(path.as_str()),
            _ => None,
        });
    let first = paths.next();
    if paths.any(|path| Some(path) != first) {
        return Err(ConfigError::invalid(
            "plugins",
            "every metrics data source must scrape the same path",
        ));
    }
    Ok(first)
}

/// `core-metrics-extractor` names the scrape's built-in series: listing it is llm-d's
/// default wiring and needs nothing here.
fn is_core_extractor(instances: &[PluginInstance], name: &str) -> bool {
    instances.iter().any(|instance| {
        instance.name == name
            && instance.type_name == plugins::datalayer::core_metrics_extractor::TYPE
    })
}

/// The `models-data-source`, if one is declared (it needs no wiring: declaring it is asking
/// for the pods' model lists).
pub(super) fn models_source(instances: &[PluginInstance]) -> Option<ModelsSource> {
    instances
        .iter()
        .find_map(|instance| match &instance.plugin {
            Plugin::DataLayer(DataLayerPlugin::Models(source)) => Some(source.clone()),
            _ => None,
        })
}

pub(super) fn find_data_plugin<'a>(
    instances: &'a [PluginInstance],
    name: &str,
    key: &str,
) -> Result<&'a DataLayerPlugin, ConfigError> {
    match instances.iter().find(|p| p.name == name).map(|p| &p.plugin) {
        Some(Plugin::DataLayer(plugin)) => Ok(plugin),
        Some(other) => Err(ConfigError::invalid(
            key,
            format!("{name:?} is a {}, not a data layer plugin", other.kind()),
        )),
        None => Err(ConfigError::invalid(
            key,
            format!("no plugin named {name:?} is declared"),
        )),
    }
}

pub(super) fn resolve_scorers(
    instances: &mut [PluginInstance],
    wiring: &Wiring,
) -> Result<(), ConfigError> {
    for (i, instance) in instances.iter_mut().enumerate() {
        if let Plugin::Scorer(scorer) = &mut instance.plugin {
            scorer.resolve(wiring).map_err(|reason| {
                ConfigError::invalid(
                    format!("plugins[{i}].parameters ({})", instance.name),
                    reason,
                )
            })?;
        }
    }
    Ok(())
}
