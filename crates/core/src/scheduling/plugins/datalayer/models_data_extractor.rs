//! `models-data-extractor` (llm-d-router): reads the model ids out of each pod's `/v1/models`
//! answer. Here `models-data-source` reads them itself, so this plugin only has to load.

use crate::scheduling::plugins::spec::{effective, Kind, NoParameters, PluginSpec};
use crate::scheduling::{BuiltIn, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "models-data-extractor";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::BuiltIn, build, effective::<NoParameters>)
    .done_by("models-data-source reads the model ids of each pod's /v1/models answer itself");

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let _: NoParameters = super::parameters(parameters)?;
    Ok(Plugin::BuiltIn(BuiltIn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn loads_as_built_in_without_parameters() {
        assert!(matches!(build(&Value::Null), Ok(Plugin::BuiltIn(_))));
        let extra: Value = serde_yaml::from_str("{path: /v1/models}").unwrap();
        assert!(build(&extra).is_err());
    }
}
