//! llm-d keeps its approximate prefix index in a producer (`approx-prefix-cache-producer`)
//! that `prefix-cache-scorer`, `prefix-cache-affinity-filter` and the P/D deciders read by
//! name. Here a prefix index is a `prefix-cache-scorer` instance, so this step maps llm-d's
//! wiring onto ours:
//! - a scorer takes the index parameters of the producer it names (or of the default-named
//!   producer, when declared);
//! - a producer no scorer reads becomes an index of its own, in no profile;
//! - when a plugin reads prefix matches and nothing produces them, the default producer is
//!   created, as llm-d's EPP does.
//!
//! One index publishes its matches to the request's cycle state (the default producer's, as
//! llm-d's readers default to it); a second index (a CPU tier) scores from its own.

use super::error::ConfigError;
use super::raw::RawPlugin;
use crate::limits;
use crate::scheduling::plugins::data_producer::approx_prefix_cache_producer as producer;
use crate::scheduling::plugins::scorer::prefix_cache_scorer::{self as scorer, PrefixCacheScorer};
use crate::scheduling::plugins::{self, Data};
use crate::scheduling::{Plugin, PluginInstance};
use serde_yaml::{Mapping, Value};

pub(super) fn link_prefix_indexes(
    raw: &[RawPlugin],
    instances: &mut Vec<PluginInstance>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let producers: Vec<(usize, &Value)> = of_type(raw, instances, producer::TYPE);
    let mut served = vec![false; producers.len()];
    let mut publisher = None;
    for (index, parameters) in of_type(raw, instances, scorer::TYPE) {
        let key = parameters_key(index, instances);
        let named = parameters
            .get("prefixMatchInfoProducerName")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty());
        let producer_name = named.unwrap_or(producer::TYPE);
        let linked = producers
            .iter()
            .position(|&(p, _)| instance_name(instances, p) == Some(producer_name));
        let merged = match linked {
            Some(p) => {
                if let Some(flag) = served.get_mut(p) {
                    *flag = true;
                }
                let from = producers.get(p).map_or(&Value::Null, |(_, v)| *v);
                overlay(index_parameters(from, &key, warnings)?, parameters)
            }
            None if named.is_some() => {
                return Err(ConfigError::invalid(
                    key,
                    format!("prefixMatchInfoProducerName {producer_name:?} names no declared approx-prefix-cache-producer"),
                ))
            }
            None => parameters.clone(),
        };
        let publishes = producer_name == producer::TYPE && publisher.is_none();
        replace_with_index(instances, index, &merged, &key, publishes)?;
        if publishes {
            publisher = Some(index);
        }
    }
    for (&(index, parameters), _) in producers.iter().zip(&served).filter(|(_, s)| !**s) {
        let key = parameters_key(index, instances);
        let publishes =
            publisher.is_none() && instance_name(instances, index) == Some(producer::TYPE);
        let own = index_parameters(parameters, &key, warnings)?;
        replace_with_index(instances, index, &own, &key, publishes)?;
        if publishes {
            publisher = Some(index);
        }
    }
    let reads_matches = instances.iter().any(|instance| {
        plugins::spec(instance.type_name).is_some_and(|spec| spec.consumes(Data::PrefixMatches))
    });
    if publisher.is_none() && reads_matches {
        create_default(instances, warnings)?;
    }
    Ok(())
}

/// llm-d's EPP creates the default producer when a plugin reads prefix matches and no
/// default-named one is declared.
fn create_default(
    instances: &mut Vec<PluginInstance>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let key = "plugins (the default approx-prefix-cache-producer)";
    let parameters = index_parameters(&Value::Null, key, warnings)?;
    instances.push(PluginInstance {
        name: producer::TYPE.to_owned(),
        type_name: producer::TYPE,
        plugin: index(&parameters, key, true)?,
    });
    Ok(())
}

/// The instances of one plugin type (or its aliases), with their raw parameters.
fn of_type<'a>(
    raw: &'a [RawPlugin],
    instances: &[PluginInstance],
    type_name: &str,
) -> Vec<(usize, &'a Value)> {
    instances
        .iter()
        .zip(raw)
        .enumerate()
        .filter(|(_, (instance, _))| instance.type_name == type_name)
        .map(|(index, (_, raw))| (index, &raw.parameters))
        .collect()
}

fn instance_name(instances: &[PluginInstance], index: usize) -> Option<&str> {
    instances.get(index).map(|i| i.name.as_str())
}

fn parameters_key(index: usize, instances: &[PluginInstance]) -> String {
    format!(
        "plugins[{index}].parameters ({})",
        instance_name(instances, index).unwrap_or_default()
    )
}

fn parsed(parameters: &Value, key: &str) -> Result<scorer::Parameters, ConfigError> {
    plugins::parameters(parameters).map_err(|reason| ConfigError::invalid(key, reason))
}

/// A prefix index with these (scorer) parameters; see the module for `publishes`.
fn index(parameters: &Value, key: &str, publishes: bool) -> Result<Plugin, ConfigError> {
    let mut built = PrefixCacheScorer::new(parsed(parameters, key)?)
        .map_err(|reason| ConfigError::invalid(key, reason))?;
    if !publishes {
        built.keep_matches_private();
    }
    Ok(Plugin::Scorer(Box::new(built)))
}

fn replace_with_index(
    instances: &mut [PluginInstance],
    at: usize,
    parameters: &Value,
    key: &str,
    publishes: bool,
) -> Result<(), ConfigError> {
    let plugin = index(parameters, key, publishes)?;
    if let Some(instance) = instances.get_mut(at) {
        instance.plugin = plugin;
    }
    Ok(())
}

/// The scorer's own keys win over what it takes from its producer.
fn overlay(mut base: Value, own: &Value) -> Value {
    if let (Value::Mapping(base), Value::Mapping(own)) = (&mut base, own) {
        for (key, value) in own {
            base.insert(key.clone(), value.clone());
        }
    }
    base
}

/// A producer's parameters as the scorer's, with llm-d's defaults and rules: blocks of at
/// least 64 tokens, the match bound in tokens, and an LRU within the filter's bound (a larger
/// one is lowered, with a warning naming it).
fn index_parameters(
    producer_parameters: &Value,
    key: &str,
    warnings: &mut Vec<String>,
) -> Result<Value, ConfigError> {
    let given: producer::Parameters = plugins::parameters(producer_parameters)
        .map_err(|reason| ConfigError::invalid(key, reason))?;
    let block_tokens = given
        .block_size_tokens
        .or(given.block_size)
        .unwrap_or(producer::DEFAULT_BLOCK_SIZE_TOKENS)
        .max(producer::MIN_BLOCK_SIZE_TOKENS);
    let max_tokens = given
        .max_prefix_tokens_to_match
        .unwrap_or(producer::DEFAULT_MAX_PREFIX_TOKENS_TO_MATCH);
    let max_blocks = if max_tokens > 0 {
        max_tokens.div_ceil(block_tokens)
    } else {
        given
            .max_prefix_blocks_to_match
            .unwrap_or(producer::DEFAULT_MAX_PREFIX_BLOCKS_TO_MATCH)
    };
    let max_blocks = max_blocks.min(limits::PREFIX_BLOCKS_TO_MATCH.max);
    let lru = given
        .lru_capacity_per_server
        .unwrap_or(producer::DEFAULT_LRU_CAPACITY_PER_SERVER);
    let lru_bound = limits::LRU_CAPACITY_PER_SERVER.max;
    if lru > lru_bound {
        warnings.push(format!(
            "{key}: parameter \"lruCapacityPerServer\" {lru} is above the filter's bound; each pod's index keeps at most {lru_bound} blocks"
        ));
    }
    let mut mapping = Mapping::new();
    let mut set = |name: &str, value: Value| {
        mapping.insert(Value::from(name), value);
    };
    set("blockSizeTokens", Value::from(block_tokens));
    set("maxPrefixBlocksToMatch", Value::from(max_blocks.max(1)));
    set("lruCapacityPerServer", Value::from(lru.min(lru_bound)));
    set("autoTune", Value::from(given.auto_tune.unwrap_or(true)));
    Ok(Value::Mapping(mapping))
}
