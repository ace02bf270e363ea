//! `pools:`: many InferencePools in one filter, each serving its own models. Every entry is
//! loaded as a document of its own: the top level's keys (plugins, profiles, saturation
//! detector, flow control, feature gates) are every pool's defaults, and an entry overrides
//! them with its own (a pool's own `plugins` also drop the shared `schedulingProfiles`); the
//! entry's other keys are its `pool` section.

use super::error::ConfigError;
use crate::limits;
use serde_yaml::{Mapping, Value};

/// The pool a single `pool:` section becomes.
pub const DEFAULT_POOL_NAME: &str = "default";

/// Top-level keys that only the pool set reads.
pub(super) const POOLS_KEY: &str = "pools";
pub(super) const POOL_HEADER_KEY: &str = "poolHeader";

/// Keys of a `pools[]` entry that override the top level's; the others are the pool section.
const OVERRIDES: [&str; 6] = [
    "plugins",
    "schedulingProfiles",
    "saturationDetector",
    "dataLayer",
    "flowControl",
    "featureGates",
];

/// One `pools[]` entry, split: its name, the models it serves and its own document.
pub(super) struct PoolEntry {
    pub(super) name: String,
    /// `None`: the entry lists no models: it serves those its pods report (with a
    /// `models-data-source`) or every model no other pool claims.
    pub(super) models: Option<Vec<String>>,
    pub(super) document: Value,
}

/// Splits the document into its pool entries, or `None` when it has no `pools` key (the
/// single-pool form). The top level's own `pool` section cannot be combined with `pools`.
pub(super) fn split(document: &Value) -> Result<Option<Vec<PoolEntry>>, ConfigError> {
    let Some(top) = document.as_mapping() else {
        return Ok(None);
    };
    let Some(pools) = top.get(POOLS_KEY) else {
        return Ok(None);
    };
    if top.contains_key("pool") {
        return Err(ConfigError::invalid(
            "pools",
            "give either one `pool` section or a `pools` list, not both",
        ));
    }
    let entries = pools
        .as_sequence()
        .filter(|entries| !entries.is_empty())
        .ok_or_else(|| ConfigError::invalid("pools", "must be a non-empty list of pools"))?;
    limits::POOLS
        .check_usize(entries.len())
        .map_err(|reason| ConfigError::invalid("pools", reason))?;
    let mut shared = top.clone();
    shared.remove(POOLS_KEY);
    shared.remove(POOL_HEADER_KEY);
    let mut split = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let entry = entry_of(i, entry, &shared)?;
        if split.iter().any(|e: &PoolEntry| e.name == entry.name) {
            return Err(ConfigError::invalid(
                format!("pools[{i}].name"),
                format!("{:?} names two pools", entry.name),
            ));
        }
        split.push(entry);
    }
    Ok(Some(split))
}

fn entry_of(i: usize, entry: &Value, shared: &Mapping) -> Result<PoolEntry, ConfigError> {
    let key = |field: &str| format!("pools[{i}].{field}");
    let mut pool = entry
        .as_mapping()
        .cloned()
        .ok_or_else(|| ConfigError::invalid(format!("pools[{i}]"), "must be a mapping"))?;
    let name = match pool.remove("name") {
        Some(Value::String(name)) => name,
        _ => return Err(ConfigError::invalid(key("name"), "every pool needs a name")),
    };
    check_pool_name(&name).map_err(|reason| ConfigError::invalid(key("name"), reason))?;
    let models = match pool.remove("models") {
        None => None,
        Some(models) => {
            Some(model_list(&models).map_err(|r| ConfigError::invalid(key("models"), r))?)
        }
    };
    let mut document = shared.clone();
    // A pool's own plugins come with its own profiles (or the implicit one over them): the
    // shared profiles name the shared plugins.
    if pool.contains_key("plugins") {
        document.remove("schedulingProfiles");
    }
    for field in OVERRIDES {
        if let Some(value) = pool.remove(field) {
            document.insert(field.into(), value);
        }
    }
    document.insert("pool".into(), Value::Mapping(pool));
    Ok(PoolEntry {
        name,
        models,
        document: Value::Mapping(document),
    })
}

/// A pool's name goes into stats names and a request header: a DNS label, as Kubernetes
/// names an InferencePool.
fn check_pool_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be a DNS label (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

fn model_list(models: &Value) -> Result<Vec<String>, String> {
    let list = models
        .as_sequence()
        .filter(|list| !list.is_empty())
        .ok_or("must be a non-empty list of model names or globs")?;
    let mut names = Vec::with_capacity(list.len());
    for model in list {
        match model.as_str().map(str::trim) {
            Some(name) if !name.is_empty() => names.push(name.to_owned()),
            _ => return Err(format!("{model:?} is not a model name")),
        }
    }
    Ok(names)
}

/// `poolHeader`: the request header the chosen pool's name is written to, if any.
pub(super) fn pool_header(document: &Value) -> Result<Option<String>, ConfigError> {
    let Some(value) = document.get(POOL_HEADER_KEY) else {
        return Ok(None);
    };
    let name = value
        .as_str()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| ConfigError::invalid(POOL_HEADER_KEY, "must be a header name"))?;
    let valid = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid || name.starts_with(':') {
        return Err(ConfigError::invalid(
            POOL_HEADER_KEY,
            format!("{name:?} must be a lowercase header name"),
        ));
    }
    // Headers the protocol or HTTP itself gives a meaning: the pool's name must not overwrite
    // them.
    let reserved = name.starts_with("x-gateway-destination-endpoint")
        || name.starts_with("x-envoy-")
        || name.starts_with("content-")
        || [
            "host",
            "transfer-encoding",
            "connection",
            "te",
            "upgrade",
            "x-request-id",
            crate::protocol::PREFILLER_HEADER,
            crate::protocol::MODEL_REWRITE_HEADER,
            crate::protocol::SESSION_TOKEN_HEADER,
        ]
        .contains(&name);
    if reserved {
        return Err(ConfigError::invalid(
            POOL_HEADER_KEY,
            format!("{name:?} already means something to the gateway or HTTP: choose another name"),
        ));
    }
    Ok(Some(name.to_owned()))
}
