//! The filter's configuration: one GIE `EndpointPickerConfig` document plus our `pool` section.
//! Loading either yields a complete, validated configuration or one error naming the key;
//! there is no half-configured state.

mod build;
mod defaults;
mod effective;
mod error;
mod pool;
mod raw;
mod validate;

pub use error::ConfigError;
pub use pool::{EndpointConfig, LoadSignals, ObjectiveConfig, PoolConfig};

use crate::metrics::MetricSelector;
use crate::scheduling::Scheduler;
use build::{
    build_plugins, build_profiles, flow_control, profile_handler, resolve_scorers,
    saturation_detector, wire_data_layer,
};
use defaults::with_defaults;
use raw::RawConfig;
use serde_yaml::Value;
use validate::{check_header, check_parsers, warn_missing_prefix_scorer, warn_unused};

/// A loaded configuration, ready to schedule.
pub struct FilterConfig {
    pub scheduler: Scheduler,
    pub pool: PoolConfig,
    /// Custom series the scrape must extract, in `EndpointMetrics::custom` order.
    pub metric_selectors: Vec<MetricSelector>,
    pub feature_gates: Vec<String>,
    /// Flow control's settings when the `flowControl` gate is on.
    pub flow_control: Option<crate::flow_control::FlowControlConfig>,
    /// Not fatal, but worth a log line (e.g. a plugin no profile uses).
    pub warnings: Vec<String>,
}

/// Parses and validates a YAML or JSON document.
pub fn load(text: &str, seed: u64) -> Result<FilterConfig, ConfigError> {
    load_document(text, seed, false).map(|(config, _)| config)
}

/// [`load`], plus the effective document (see [`effective`]) for the config checker.
pub fn load_with_effective(text: &str, seed: u64) -> Result<(FilterConfig, Value), ConfigError> {
    load_document(text, seed, true)
        .map(|(config, effective)| (config, effective.unwrap_or(Value::Null)))
}

fn load_document(
    text: &str,
    seed: u64,
    with_effective: bool,
) -> Result<(FilterConfig, Option<Value>), ConfigError> {
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
    check_parsers(&raw, &instances)?;
    let detector = saturation_detector(&raw, &mut instances)?;
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
    let mut scheduler = Scheduler::new(instances, profiles, handler, seed);
    scheduler.set_saturation_detector(detector);
    let config = FilterConfig {
        scheduler,
        pool,
        metric_selectors: wiring.extractors.into_iter().map(|(_, s)| s).collect(),
        feature_gates: raw.feature_gates,
        flow_control,
        warnings,
    };
    Ok((config, effective))
}

#[cfg(test)]
mod tests;
