//! The filter's configuration: one GIE `EndpointPickerConfig` document plus our `pool` section.
//! Loading either yields a complete, validated configuration or one error naming the key;
//! there is no half-configured state.

mod build;
mod defaults;
mod effective;
mod error;
pub mod flow_control;
pub mod peers;
mod pool;
mod pools;
mod prefix_indexes;
mod raw;
mod validate;

pub use crate::scheduling::ModelsSource;
pub use error::ConfigError;
pub use pool::{EndpointConfig, LoadSignals, ObjectiveConfig, PoolConfig};
pub use pools::DEFAULT_POOL_NAME;

use crate::metrics::MetricSelector;
use crate::scheduling::plugins;
use crate::scheduling::{Plugin, PluginInstance, Scheduler};
use build::{
    add_missing_latency_producer, build_plugins, build_profiles, flow_control, models_source,
    profile_handler, resolve_scorers, saturation_detector, wire_data_layer,
};
use defaults::with_defaults;
use prefix_indexes::link_prefix_indexes;
use raw::RawConfig;
use serde_yaml::Value;
use validate::{check_header, check_parsers, warn_ignored_gates, warn_unused};

/// A loaded configuration, ready to schedule.
pub struct FilterConfig {
    pub scheduler: Scheduler,
    pub pool: PoolConfig,
    /// Custom series the scrape must extract, in `EndpointMetrics::custom` order.
    pub metric_selectors: Vec<MetricSelector>,
    pub feature_gates: Vec<String>,
    /// Flow control's settings when the `flowControl` gate is on.
    pub flow_control: Option<crate::config::flow_control::FlowControlConfig>,
    /// Not fatal, but worth a log line (e.g. a plugin no profile uses).
    pub warnings: Vec<String>,
    /// Where the pods' model lists are read, with `models-data-source`.
    pub models_source: Option<ModelsSource>,
    /// The engine a pod without the engine-type label is read as (`core-metrics-extractor`'s
    /// `defaultEngine`); vLLM when `None`.
    pub default_engine: Option<String>,
    /// The request's priority is written into the forwarded body (`openai-parser`'s
    /// `propagatePriority`).
    pub propagate_priority: bool,
}

/// Every pool of a document: one named [`DEFAULT_POOL_NAME`] serving every model for a
/// single `pool` section, or the `pools` list.
pub struct PoolSet {
    pub pools: Vec<NamedPool>,
    /// Written as a `pools` list (even of one): stats and shared state carry pool names.
    pub listed: bool,
    /// `poolHeader`: the request header the chosen pool's name is written to.
    pub pool_header: Option<String>,
}

pub struct NamedPool {
    pub name: String,
    /// Model names and globs it serves; `None` serves every model no other pool lists.
    pub models: Option<Vec<String>>,
    pub config: FilterConfig,
    /// The pool's effective document, when asked for (the config checker).
    pub effective: Option<Value>,
    /// What the pool's VMs share is kept under this: see [`shared_identity`].
    pub shared_identity: u64,
}

/// What a pool's VMs share (members, metrics, the scraper's lease, flow control's ledgers,
/// requests in flight, prefix placements) means the same under every document that differs
/// only in how endpoints are chosen: the scheduling profiles (which plugins run, their
/// weights) and the plugins that only choose (filters, scorers, pickers, profile handlers and
/// deciders that produce no data). Such documents share it: after an update that re-tunes the
/// choice, the new VMs read the metrics, in-flight counts and recent placements the old ones
/// share, and while the old configuration drains the pods are scraped once, not once per
/// configuration. The pool, the data layer, flow control, the saturation
/// detector and every plugin that produces data (the prefix scorer's placements among them)
/// stay in the identity.
fn shared_identity(document: &Value) -> u64 {
    let mut document = document.clone();
    if let Some(map) = document.as_mapping_mut() {
        map.remove("schedulingProfiles");
        if let Some(plugins) = map.get_mut("plugins").and_then(Value::as_sequence_mut) {
            plugins.retain(|plugin| !only_chooses(plugin));
        }
    }
    let text = serde_yaml::to_string(&document).unwrap_or_default();
    crate::hash::hash_bytes(0, text.as_bytes())
}

/// A `plugins` entry of a registered type that only chooses among endpoints.
fn only_chooses(plugin: &Value) -> bool {
    use crate::scheduling::plugins::{spec, Kind};
    let Some(spec) = plugin.get("type").and_then(Value::as_str).and_then(spec) else {
        return false;
    };
    let choosing = matches!(
        spec.kind,
        Kind::Filter | Kind::Scorer | Kind::Picker | Kind::ProfileHandler | Kind::PdDecider
    );
    choosing && spec.produces.is_empty()
}

/// Parses and validates a single-pool YAML or JSON document (a `pools` list is refused: see
/// [`load_set`]).
pub fn load(text: &str, seed: u64) -> Result<FilterConfig, ConfigError> {
    load_document(text, seed, false).map(|(config, _)| config)
}

/// [`load`], plus the effective document (see [`effective`]) for the config checker.
pub fn load_with_effective(text: &str, seed: u64) -> Result<(FilterConfig, Value), ConfigError> {
    load_document(text, seed, true)
        .map(|(config, effective)| (config, effective.unwrap_or(Value::Null)))
}

/// Parses and validates a document with one `pool` or a `pools` list. `with_effective` adds
/// each pool's effective document (see [`effective`]).
pub fn load_set(text: &str, seed: u64, with_effective: bool) -> Result<PoolSet, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::Syntax("the configuration is empty".into()));
    }
    let document: Value =
        serde_yaml::from_str(text).map_err(|error| ConfigError::Syntax(error.to_string()))?;
    let pool_header = pools::pool_header(&document)?;
    let Some(entries) = pools::split(&document)? else {
        if pool_header.is_some() {
            return Err(ConfigError::invalid(
                pools::POOL_HEADER_KEY,
                "needs a `pools` list (one pool needs no header to be told apart)",
            ));
        }
        let (config, effective) = load_document(text, seed, with_effective)?;
        let pool = NamedPool {
            name: DEFAULT_POOL_NAME.into(),
            models: None,
            config,
            effective,
            shared_identity: shared_identity(&document),
        };
        return Ok(PoolSet {
            pools: vec![pool],
            listed: false,
            pool_header,
        });
    };
    let mut loaded = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let in_pool = |error: ConfigError| within_pool(i, &entry.name, error);
        let identity = shared_identity(&entry.document);
        let raw: RawConfig = serde_yaml::from_value(entry.document)
            .map_err(|error| in_pool(ConfigError::Syntax(error.to_string())))?;
        // Each pool breaks ties with its own sequence.
        let seed = crate::hash::hash_bytes(seed, &(i as u64).to_le_bytes());
        let (config, effective) = load_raw(raw, seed, with_effective).map_err(in_pool)?;
        loaded.push(NamedPool {
            name: entry.name,
            models: entry.models,
            config,
            effective,
            shared_identity: identity,
        });
    }
    let catch_alls = loaded.iter().filter(|p| p.serves_any_model()).count();
    if catch_alls > 1 {
        return Err(ConfigError::invalid(
            "pools",
            "at most one pool may omit `models` without a models-data-source (it serves every model no other pool lists)",
        ));
    }
    Ok(PoolSet {
        pools: loaded,
        listed: true,
        pool_header,
    })
}

impl NamedPool {
    /// Lists no models and learns none: it serves every model no other pool claims.
    pub fn serves_any_model(&self) -> bool {
        self.models.is_none() && self.config.models_source.is_none()
    }

    /// The names the model router starts from: `None` for the catch-all, and a pool that
    /// lists no models but learns them starts with none (it serves what its pods report).
    pub fn router_models(&self) -> Option<Vec<String>> {
        match (&self.models, &self.config.models_source) {
            (None, Some(_)) => Some(Vec::new()),
            (models, _) => models.clone(),
        }
    }
}

/// Names the pool an error is in; its `pool.` keys are the entry's own.
fn within_pool(i: usize, name: &str, error: ConfigError) -> ConfigError {
    match error {
        ConfigError::Syntax(message) => {
            ConfigError::Syntax(format!("pools[{i}] ({name}): {message}"))
        }
        ConfigError::Invalid { key, reason } => {
            let key = key.strip_prefix("pool.").unwrap_or(&key);
            ConfigError::invalid(
                format!("pools[{i}].{key}"),
                format!("(pool {name}) {reason}"),
            )
        }
    }
}

fn load_document(
    text: &str,
    seed: u64,
    with_effective: bool,
) -> Result<(FilterConfig, Option<Value>), ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::Syntax("the configuration is empty".into()));
    }
    let raw: RawConfig = serde_yaml::from_str(text).map_err(|error| {
        let message = error.to_string();
        if message.contains("unknown field `pools`")
            || message.contains("unknown field `poolHeader`")
        {
            ConfigError::Syntax(format!(
                "{message} (a document with many pools is loaded with load_set)"
            ))
        } else {
            ConfigError::Syntax(message)
        }
    })?;
    load_raw(raw, seed, with_effective)
}

fn load_raw(
    raw: RawConfig,
    seed: u64,
    with_effective: bool,
) -> Result<(FilterConfig, Option<Value>), ConfigError> {
    check_header(&raw)?;
    let mut pool = raw
        .pool
        .clone()
        .ok_or_else(|| ConfigError::invalid("pool", "the pool section is required"))?;
    pool.validate()?;
    let mut warnings = Vec::new();
    let (raw_plugins, raw_profiles) = with_defaults(&raw);
    let mut instances = build_plugins(&raw_plugins, &mut warnings)?;
    let wiring = wire_data_layer(&raw, &instances, &mut pool, &mut warnings)?;
    resolve_scorers(&mut instances, &wiring)?;
    let profiles = build_profiles(&raw_profiles, &mut instances)?;
    add_missing_latency_producer(&mut instances)?;
    link_prefix_indexes(&raw_plugins, &mut instances, &mut warnings)?;
    let handler = profile_handler(&mut instances, &profiles)?;
    warn_unused(&instances, &profiles, handler, &mut warnings);
    warn_ignored_gates(&raw, &mut warnings);
    check_parsers(&raw, &instances)?;
    let detector = saturation_detector(&raw, &mut instances)?;
    fit_detector(&mut instances, detector, &pool, &mut warnings);
    let flow_control = flow_control(&raw, &instances, &pool, &mut warnings)?;
    let effective = with_effective.then(|| {
        effective::document(
            &raw,
            &raw_plugins,
            &instances,
            &profiles,
            detector,
            &pool,
            flow_control.as_ref(),
        )
    });
    let models_source = models_source(&instances);
    let latency_admitter = plugins::admitter::latency_slo_admitter::TYPE;
    let admits_by_latency = instances.iter().any(|i| i.type_name == latency_admitter);
    let mut scheduler = Scheduler::new(instances, profiles, handler, seed);
    if admits_by_latency {
        scheduler.set_admission(plugins::admitter::latency_slo_admitter::admits);
    }
    scheduler.set_saturation_detector(detector);
    let default_engine = raw_plugins
        .iter()
        .filter(|p| {
            plugins::known_type(&p.type_name)
                == Some(plugins::datalayer::core_metrics_extractor::TYPE)
        })
        .find_map(|p| plugins::datalayer::core_metrics_extractor::default_engine(&p.parameters));
    let propagate_priority = raw_plugins.iter().any(|p| {
        plugins::known_type(&p.type_name) == Some(plugins::parser::openai_parser::TYPE)
            && plugins::parser::openai_parser::propagates_priority(&p.parameters)
    });
    let config = FilterConfig {
        scheduler,
        pool,
        metric_selectors: wiring.extractors.into_iter().map(|(_, s)| s).collect(),
        feature_gates: raw.feature_gates,
        flow_control,
        warnings,
        models_source,
        default_engine,
        propagate_priority,
    };
    Ok((config, effective))
}

/// Tells the saturation detector how often this replica refreshes each pod (see
/// [`PoolConfig::replicas`]), so that metrics a replica only refreshes that often are not read
/// as stale.
fn fit_detector(
    instances: &mut [PluginInstance],
    detector: usize,
    pool: &PoolConfig,
    warnings: &mut Vec<String>,
) {
    let interval_ms = crate::duration::duration_ms(pool.scrape_interval());
    if let Some(PluginInstance {
        plugin: Plugin::SaturationDetector(detector),
        ..
    }) = instances.get_mut(detector)
    {
        warnings.extend(detector.fit_scrape_interval(interval_ms));
    }
}

#[cfg(test)]
mod tests;
