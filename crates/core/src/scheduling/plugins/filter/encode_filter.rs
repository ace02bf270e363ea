//! `encode-filter`: keeps endpoints whose `llm-d.ai/role` is `encode`, `encode-prefill` or
//! `encode-prefill-decode` (multimodal encoders in encode/prefill/decode disaggregation).

use super::decode_filter::{build_role_filter, RoleFilter};
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "encode-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<NoParameters>)
    .consuming(&[Data::EndpointLabels]);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    build_role_filter(
        parameters,
        RoleFilter {
            roles: &["encode", "encode-prefill", "encode-prefill-decode"],
            unlabelled: false,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn keeps_encoders_only() {
        let Ok(Plugin::Filter(mut filter)) = build(&Value::Null) else {
            panic!("not a filter");
        };
        assert_eq!(
            super::super::decode_filter::survivors(filter.as_mut()),
            [4, 5, 6]
        );
    }
}
