//! `openai-parser` (llm-d-router): parses the OpenAI API's request bodies, which the filter parses
//! itself.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};

pub const TYPE: &str = "openai-parser";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::Parser,
    super::build_parser,
    effective::<NoParameters>,
)
.done_by("the filter parses /v1/completions, /v1/chat/completions, /v1/embeddings and /v1/responses bodies itself");
