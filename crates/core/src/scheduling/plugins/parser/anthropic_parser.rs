//! `anthropic-parser` (llm-d-router): parses Anthropic Messages API bodies, which the filter parses
//! itself.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};

pub const TYPE: &str = "anthropic-parser";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::Parser,
    super::build_parser,
    effective::<NoParameters>,
)
.done_by("the filter parses /v1/messages bodies itself");
