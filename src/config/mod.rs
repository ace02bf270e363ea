//! The filter's configuration: one GIE `EndpointPickerConfig` document plus our `pool` section.
//! Loading either yields a complete, validated configuration or one error naming the key;
//! there is no half-configured state.

mod pool;

pub use pool::{EndpointConfig, ObjectiveConfig, PoolConfig};

use crate::metrics::MetricSelector;
use crate::scheduling::plugins::{
    self, picker::max_score_picker, profile_handler::single_profile_handler, Data,
};
use crate::scheduling::{
    DataLayerPlugin, Plugin, PluginInstance, PluginSummary, Profile, Scheduler, WeightedScorer,
    Wiring,
};
use serde::Deserialize;
use serde_yaml::Value;

const API_VERSIONS: &[&str] = &[
    "inference.networking.x-k8s.io/v1alpha1",
    "inference.networking.k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
];
const KIND: &str = "EndpointPickerConfig";
const FEATURE_GATES: &[&str] = &["dataLayer", "flowControl", "enableLegacyMetrics"];

/// Why a configuration was rejected. Every variant names where the problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// Not YAML/JSON, or the document does not have the expected shape (unknown key, wrong type).
    Syntax(String),
    /// A value is present and well-typed but not acceptable.
    Invalid { key: String, reason: String },
}

impl ConfigError {
    fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Syntax(message) => write!(f, "invalid configuration: {message}"),
            ConfigError::Invalid { key, reason } => {
                write!(f, "invalid configuration at '{key}': {reason}")
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    feature_gates: Vec<String>,
    #[serde(default)]
    plugins: Vec<RawPlugin>,
    #[serde(default)]
    scheduling_profiles: Vec<RawProfile>,
    saturation_detector: Option<RawRef>,
    #[serde(alias = "data")]
    data_layer: Option<RawDataLayer>,
    pool: Option<PoolConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugin {
    name: Option<String>,
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    parameters: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: String,
    #[serde(default)]
    plugins: Vec<RawProfilePlugin>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProfilePlugin {
    plugin_ref: String,
    weight: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRef {
    plugin_ref: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataLayer {
    #[serde(default)]
    sources: Vec<RawSource>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSource {
    plugin_ref: String,
    #[serde(default)]
    extractors: Vec<RawRef>,
}

/// A loaded configuration, ready to schedule.
pub struct FilterConfig {
    pub scheduler: Scheduler,
    pub pool: PoolConfig,
    /// Custom series the scrape must extract, in `EndpointMetrics::custom` order.
    pub metric_selectors: Vec<MetricSelector>,
    pub feature_gates: Vec<String>,
    /// Not fatal, but worth a log line (e.g. a plugin no profile uses).
    pub warnings: Vec<String>,
    /// The configuration as the filter runs it: every implicit plugin, profile, weight and
    /// default spelled out (for `inference-picker check`).
    pub effective: Value,
}

/// Parses and validates a YAML or JSON document.
pub fn load(text: &str, seed: u64) -> Result<FilterConfig, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::Syntax("the configuration is empty".into()));
    }
    let raw: RawConfig =
        serde_yaml::from_str(text).map_err(|error| ConfigError::Syntax(error.to_string()))?;
    check_header(&raw)?;
    let mut pool = raw
        .pool
        .clone()
        .ok_or_else(|| ConfigError::invalid("pool", "the pool section is required"))?;
    pool.validate()?;
    let mut warnings = Vec::new();
    let (raw_plugins, raw_profiles) = with_defaults(&raw);
    let mut instances = build_plugins(&raw_plugins)?;
    let wiring = wire_data_layer(&raw, &instances, &mut pool, &mut warnings)?;
    resolve_scorers(&mut instances, &wiring)?;
    let profiles = build_profiles(&raw_profiles, &mut instances, &mut warnings)?;
    let handler = profile_handler(&mut instances, &profiles)?;
    warn_unused(&instances, &profiles, handler, &mut warnings);
    warn_missing_prefix_scorer(&instances, &mut warnings);
    let detector = saturation_detector(&raw, &mut instances)?;
    let effective = effective_document(&raw, &raw_plugins, &instances, &profiles, detector, &pool);
    let mut scheduler = Scheduler::new(instances, profiles, handler, seed);
    scheduler.set_saturation_detector(detector);
    Ok(FilterConfig {
        scheduler,
        pool,
        metric_selectors: wiring.extractors.into_iter().map(|(_, s)| s).collect(),
        feature_gates: raw.feature_gates,
        warnings,
        effective,
    })
}

/// The loaded configuration written out in full, in `EndpointPickerConfig` form.
fn effective_document(
    raw: &RawConfig,
    raw_plugins: &[RawPlugin],
    instances: &[PluginInstance],
    profiles: &[Profile],
    detector: usize,
    pool: &PoolConfig,
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
    }
    value
}

/// The plugin `saturationDetector.pluginRef` names, or GIE's default `utilization-detector`.
fn saturation_detector(
    raw: &RawConfig,
    instances: &mut Vec<PluginInstance>,
) -> Result<usize, ConfigError> {
    let Some(reference) = &raw.saturation_detector else {
        instances.push(PluginInstance {
            name: "utilization-detector (default)".into(),
            type_name: plugins::saturation_detector::utilization_detector::TYPE,
            plugin: plugins::build(
                plugins::saturation_detector::utilization_detector::TYPE,
                &Value::Null,
            )
            .map_err(|reason| ConfigError::invalid("saturationDetector", reason))?,
        });
        return Ok(instances.len() - 1);
    };
    let key = "saturationDetector.pluginRef";
    let name = &reference.plugin_ref;
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

const DATA_LAYER_GATE: &str = "dataLayer";

/// Wires `dataLayer.sources[].extractors[]` (the seed's `data:`) into the scrape: the sources
/// say which path is scraped, the extractors which custom series are kept.
fn wire_data_layer(
    raw: &RawConfig,
    instances: &[PluginInstance],
    pool: &mut PoolConfig,
    warnings: &mut Vec<String>,
) -> Result<Wiring, ConfigError> {
    let declared = instances
        .iter()
        .position(|p| matches!(p.plugin, Plugin::DataLayer(_)));
    let sources = raw.data_layer.as_ref().map_or(&[][..], |d| &d.sources[..]);
    let gated = raw.feature_gates.iter().any(|g| g == DATA_LAYER_GATE);
    if let (Some(index), false) = (declared, gated) {
        return Err(ConfigError::invalid(
            format!("plugins[{index}]"),
            "data layer plugins need `featureGates: [dataLayer]`",
        ));
    }
    if !sources.is_empty() && !gated {
        return Err(ConfigError::invalid(
            "dataLayer.sources",
            "the data layer needs `featureGates: [dataLayer]`",
        ));
    }
    let mut wiring = Wiring::default();
    let mut source_path: Option<&str> = None;
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
        }
        for (e, extractor) in source.extractors.iter().enumerate() {
            let key = format!("dataLayer.sources[{s}].extractors[{e}].pluginRef");
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

fn find_data_plugin<'a>(
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

fn resolve_scorers(instances: &mut [PluginInstance], wiring: &Wiring) -> Result<(), ConfigError> {
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

/// A plugin that reads prefix matches sees none unless a plugin that computes them is declared.
fn warn_missing_prefix_scorer(instances: &[PluginInstance], warnings: &mut Vec<String>) {
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

fn check_header(raw: &RawConfig) -> Result<(), ConfigError> {
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

/// GIE's defaults: no plugins at all means queue (2), KV cache (2) and prefix (3) scorers; no
/// profiles means one `default` profile using every declared filter, scorer and picker.
fn with_defaults(raw: &RawConfig) -> (Vec<RawPlugin>, Vec<RawProfile>) {
    if raw.plugins.is_empty() && raw.scheduling_profiles.is_empty() {
        let plugin = |type_name: &str| RawPlugin {
            name: None,
            type_name: type_name.into(),
            parameters: Value::Null,
        };
        let reference = |name: &str, weight| RawProfilePlugin {
            plugin_ref: name.into(),
            weight,
        };
        let plugins = vec![
            plugin("queue-scorer"),
            plugin("kv-cache-utilization-scorer"),
            plugin("prefix-cache-scorer"),
            plugin(max_score_picker::TYPE),
            plugin(single_profile_handler::TYPE),
        ];
        let profile = RawProfile {
            name: "default".into(),
            plugins: vec![
                reference("queue-scorer", Some(2.0)),
                reference("kv-cache-utilization-scorer", Some(2.0)),
                reference("prefix-cache-scorer", Some(3.0)),
                reference(max_score_picker::TYPE, None),
            ],
        };
        return (plugins, vec![profile]);
    }
    (raw.plugins.clone(), raw.scheduling_profiles.clone())
}

fn build_plugins(raw: &[RawPlugin]) -> Result<Vec<PluginInstance>, ConfigError> {
    let mut instances: Vec<PluginInstance> = Vec::with_capacity(raw.len() + 2);
    for (i, spec) in raw.iter().enumerate() {
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
        instances.push(PluginInstance {
            name,
            type_name,
            plugin,
        });
    }
    Ok(instances)
}

fn implicit_profile(instances: &[PluginInstance]) -> RawProfile {
    RawProfile {
        name: "default".into(),
        plugins: instances
            .iter()
            .filter(|p| {
                matches!(
                    p.plugin,
                    Plugin::Filter(_) | Plugin::Scorer(_) | Plugin::Picker(_)
                )
            })
            .map(|p| RawProfilePlugin {
                plugin_ref: p.name.clone(),
                weight: None,
            })
            .collect(),
    }
}

fn build_profiles(
    raw: &[RawProfile],
    instances: &mut Vec<PluginInstance>,
    warnings: &mut Vec<String>,
) -> Result<Vec<Profile>, ConfigError> {
    let implicit;
    let explicit = !raw.is_empty();
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
        let picker = match picker {
            Some(picker) => picker,
            None => {
                if explicit {
                    warnings.push(format!(
                        "profile {:?} names no picker; using max-score-picker",
                        spec.name
                    ));
                }
                default_picker(instances)
            }
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

fn weight(weight: Option<f64>, key: &str) -> Result<f64, ConfigError> {
    match weight {
        None => Ok(1.0),
        Some(w) if w.is_finite() && w >= 0.0 => Ok(w),
        Some(w) => Err(ConfigError::invalid(
            key,
            format!("weight {w} must be a finite number >= 0"),
        )),
    }
}

/// The shared implicit `max-score-picker` for profiles that name none.
fn default_picker(instances: &mut Vec<PluginInstance>) -> usize {
    const NAME: &str = "max-score-picker (default)";
    if let Some(index) = instances.iter().position(|p| p.name == NAME) {
        return index;
    }
    instances.push(PluginInstance {
        name: NAME.into(),
        type_name: max_score_picker::TYPE,
        plugin: Plugin::Picker(Box::new(max_score_picker::MaxScorePicker::new(
            plugins::PickerParameters::default(),
        ))),
    });
    instances.len() - 1
}

fn profile_handler(
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

fn warn_unused(
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

#[cfg(test)]
mod tests;
