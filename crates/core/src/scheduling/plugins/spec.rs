//! What a plugin is and what it needs, declared beside it: the registry builds from these, the
//! loader warns from them (a prefix reader without a prefix producer), the director reads only
//! the request headers they name, and a test checks the plugin table of `docs/plugins.md`
//! against them.

use crate::scheduling::Plugin;
use serde::de::DeserializeOwned;
use serde_yaml::Value;

/// The plugin kinds of GIE / llm-d's scheduling framework.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Filter,
    Scorer,
    Picker,
    ProfileHandler,
    PdDecider,
    SaturationDetector,
    /// Flow control's fairness, ordering and usage-limit policies.
    FlowControl,
    DataLayer,
    /// llm-d-router's request parsers, named by `requestHandler.parsers`; the filter parses
    /// the bodies it knows itself.
    Parser,
    /// Accepted for llm-d configs; the behaviour is built into the filter.
    BuiltIn,
    /// Decides whether a request is scheduled at all (llm-d's admission plugins).
    Admitter,
}

impl Kind {
    /// As the plugin table of `docs/plugins.md` names it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Filter => "filter",
            Kind::Scorer => "scorer",
            Kind::Picker => "picker",
            Kind::ProfileHandler => "profile handler",
            Kind::PdDecider => "P/D decider",
            Kind::SaturationDetector => "saturation detector",
            Kind::FlowControl => "flow-control policy",
            Kind::DataLayer => "data layer",
            Kind::Parser => "parser",
            Kind::BuiltIn => "built in",
            Kind::Admitter => "admitter",
        }
    }
}

/// A scraped engine signal (the series behind it depend on the engine; see `metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    WaitingQueue,
    RunningRequests,
    KvCacheUsage,
    LoraAdapters,
    /// `vllm:cache_config_info`: block size and KV blocks.
    CacheConfig,
}

/// Data a plugin reads or writes besides the candidate list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// How much of the prompt's prefix each endpoint probably caches (`prefix-cache-scorer`).
    PrefixMatches,
    /// A request header: read once per request, and only when a configured plugin names it.
    RequestHeader(&'static str),
    /// An engine metric from the endpoint's last scrape.
    Metric(Signal),
    /// A user-declared series extracted through `dataLayer`.
    CustomMetric,
    /// The filter's own open requests (and their tokens) per endpoint.
    InFlight,
    /// Endpoint labels (pool config or discovery).
    EndpointLabels,
    /// Each endpoint's predicted TTFT and TPOT for the request (`predicted-latency-producer`).
    LatencyPredictions,
}

pub type Builder = fn(&Value) -> Result<Plugin, String>;
/// Parameters with every default filled in, for the config checker.
pub type Effective = fn(&Value) -> Result<Value, String>;

/// One plugin type: its names, kind, constructor and the data it consumes and produces.
pub struct PluginSpec {
    pub type_name: &'static str,
    /// Older or upstream names that load the same plugin.
    pub aliases: &'static [&'static str],
    pub kind: Kind,
    pub build: Builder,
    pub effective: Effective,
    pub consumes: &'static [Data],
    pub produces: &'static [Data],
    /// For an llm-d plugin whose job the filter does on its own: what does it here. Loading
    /// one says so in a warning, so nobody tunes a plugin that changes nothing.
    pub done_by: Option<&'static str>,
    /// llm-d parameters this plugin accepts and does not apply: setting one warns at load,
    /// naming it.
    pub ignored: &'static [Ignored],
    /// What an accepted llm-d plugin does less of here; loading one warns with it.
    pub limitation: Option<&'static str>,
}

const ONE_PREFIX_INDEX: &str =
    "the filter has one prefix index: the one the default approx-prefix-cache-producer names";

/// A parameter accepted for llm-d configs that changes nothing here.
#[derive(Debug, Clone, Copy)]
pub struct Ignored {
    /// The parameter's key, as llm-d spells it.
    pub key: &'static str,
    /// A value that asks for what the filter does anyway (a producer named by its default
    /// name): giving it is silent.
    pub default_value: Option<&'static str>,
    /// Why it changes nothing, and what does the job instead.
    pub why: &'static str,
}

impl Ignored {
    /// llm-d's names for the prefix plugin a plugin reads matches from: here there is one
    /// prefix index (the default producer's), so naming another changes nothing.
    pub const PREFIX_PLUGIN_NAME: Ignored =
        Ignored::parameter("prefixPluginName", ONE_PREFIX_INDEX);
    pub const PREFIX_PLUGIN_TYPE: Ignored =
        Ignored::parameter("prefixPluginType", ONE_PREFIX_INDEX);
    pub const PREFIX_PRODUCER: Ignored = Ignored::producer(
        "prefixMatchInfoProducerName",
        "approx-prefix-cache-producer",
    );

    pub const fn parameter(key: &'static str, why: &'static str) -> Self {
        Ignored {
            key,
            default_value: None,
            why,
        }
    }

    /// A `*ProducerName` parameter: naming `default_producer` is what the filter does.
    pub const fn producer(key: &'static str, default_producer: &'static str) -> Self {
        Ignored {
            key,
            default_value: Some(default_producer),
            why: "the filter keeps one instance of this data, so only its default producer can be named",
        }
    }

    /// Whether `parameters` sets this parameter to something the filter will not do.
    pub fn is_set_in(&self, parameters: &Value) -> bool {
        match parameters.get(self.key) {
            None | Some(Value::Null) => false,
            Some(value) => self
                .default_value
                .is_none_or(|default| value.as_str() != Some(default)),
        }
    }
}

impl PluginSpec {
    /// A spec with no aliases that consumes and produces nothing; the builders below add those.
    pub const fn new(
        type_name: &'static str,
        kind: Kind,
        build: Builder,
        effective: Effective,
    ) -> Self {
        PluginSpec {
            type_name,
            aliases: &[],
            kind,
            build,
            effective,
            consumes: &[],
            produces: &[],
            done_by: None,
            ignored: &[],
            limitation: None,
        }
    }

    /// Loads, and does less than in llm-d: `what` says so in a load warning.
    pub const fn limited(mut self, what: &'static str) -> Self {
        self.limitation = Some(what);
        self
    }

    /// Parameters that load and change nothing (see [`Ignored`]).
    pub const fn ignoring(mut self, ignored: &'static [Ignored]) -> Self {
        self.ignored = ignored;
        self
    }

    /// Accepted and built in: `what` does this plugin's job in the filter (see `done_by`).
    pub const fn done_by(mut self, what: &'static str) -> Self {
        self.done_by = Some(what);
        self
    }

    pub const fn with_aliases(mut self, aliases: &'static [&'static str]) -> Self {
        self.aliases = aliases;
        self
    }

    pub const fn consuming(mut self, data: &'static [Data]) -> Self {
        self.consumes = data;
        self
    }

    pub const fn producing(mut self, data: &'static [Data]) -> Self {
        self.produces = data;
        self
    }

    pub fn answers_to(&self, type_name: &str) -> bool {
        self.type_name == type_name || self.aliases.contains(&type_name)
    }

    pub fn consumes(&self, data: Data) -> bool {
        self.consumes.contains(&data)
    }

    pub fn produces(&self, data: Data) -> bool {
        self.produces.contains(&data)
    }
}

/// A plugin's parameters with every default filled in: the `effective` of its spec.
pub fn effective<P: DeserializeOwned + serde::Serialize + Default>(
    value: &Value,
) -> Result<Value, String> {
    let parsed: P = parameters(value)?;
    serde_yaml::to_value(parsed).map_err(|error| error.to_string())
}

/// Deserializes a plugin's parameters; absent parameters mean all defaults.
pub fn parameters<P: DeserializeOwned + Default>(value: &Value) -> Result<P, String> {
    if value.is_null() {
        return Ok(P::default());
    }
    serde_yaml::from_value(value.clone()).map_err(|error| error.to_string())
}

/// The parameters of plugins that take none: any given key is an error.
#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct NoParameters {}

/// Checks that a plugin that takes no parameters was given none.
pub fn no_parameters(value: &Value) -> Result<(), String> {
    parameters::<NoParameters>(value).map(|_| ())
}

/// `maxNumOfEndpoints`, shared by every picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct PickerParameters {
    pub max_num_of_endpoints: usize,
}

impl Default for PickerParameters {
    fn default() -> Self {
        PickerParameters {
            max_num_of_endpoints: 1,
        }
    }
}

impl PickerParameters {
    pub fn parse(value: &Value) -> Result<Self, String> {
        let parsed: PickerParameters = parameters(value)?;
        crate::limits::PICKED_ENDPOINTS
            .check_usize(parsed.max_num_of_endpoints)
            .map_err(|reason| format!("maxNumOfEndpoints: {reason}"))?;
        Ok(parsed)
    }
}
