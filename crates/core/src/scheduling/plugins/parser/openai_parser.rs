//! `openai-parser` (llm-d-router): parses the OpenAI API's request bodies, which the filter parses
//! itself. With `propagatePriority` the request's priority (its objective's) also reaches the
//! model server's own scheduler: see [`Parameters::propagate_priority`].

use crate::scheduling::plugins::spec::{effective, parameters, Kind, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "openai-parser";

/// The registry's entry for this plugin. The filter parses /v1/completions,
/// /v1/chat/completions, /v1/embeddings and /v1/responses bodies itself, declared or not.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Parser, build, effective::<Parameters>);

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// Write the request's priority into the forwarded body's `priority` field, for the model
    /// server's own priority scheduling (vLLM's `--scheduling-policy priority`, SGLang's
    /// `--enable-priority-scheduling`); the client's `priority` is replaced, so the objective
    /// governs it. vLLM runs lower values first and SGLang higher ones, as objectives rank
    /// them: the value is negated for a vLLM pod (the picked pod's engine type, from its
    /// `inference.networking.k8s.io/engine-type` label; vLLM without one), as
    /// llm-d-router does.
    pub propagate_priority: bool,
}

pub fn build(value: &Value) -> Result<Plugin, String> {
    let _: Parameters = parameters(value)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}

/// Whether an `openai-parser` declared with these parameters propagates the priority.
pub fn propagates_priority(value: &Value) -> bool {
    parameters::<Parameters>(value).is_ok_and(|p| p.propagate_priority)
}
