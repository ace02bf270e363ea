//! `sglanghttp-parser` (llm-d-router): parses SGLang's own `/generate` bodies. The filter does not
//! read that API: those requests still go through, routed on load alone, which the warning says.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};

pub const TYPE: &str = "sglanghttp-parser";

/// What the filter does with these requests; loading the parser warns with it.
const UNPARSED: &str = "the filter does not parse SGLang's /generate: those requests are routed on load alone, without their prompt";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::Parser,
    super::build_parser,
    effective::<NoParameters>,
)
.done_by(UNPARSED)
.limited(UNPARSED);
