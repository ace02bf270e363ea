//! `always-disagg-pd-decider`: every request gets a prefill endpoint (when one exists).

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::{PdDecider, Plugin, SchedulingContext};
use serde_yaml::Value;

pub const TYPE: &str = "always-disagg-pd-decider";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::PdDecider, build, effective::<NoParameters>);

pub struct AlwaysDisaggPdDecider;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::PdDecider(Box::new(AlwaysDisaggPdDecider)))
}

impl PdDecider for AlwaysDisaggPdDecider {
    fn disaggregate(&self, _ctx: &SchedulingContext<'_>, _decode_endpoint: usize) -> bool {
        true
    }
}
