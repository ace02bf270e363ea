//! `passthrough-parser` (llm-d-router): forwards bodies it does not read; the filter already routes
//! every path it does not parse on load alone.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};

pub const TYPE: &str = "passthrough-parser";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::Parser,
    super::build_parser,
    effective::<NoParameters>,
)
.done_by("the filter routes every path it does not parse on load alone");
