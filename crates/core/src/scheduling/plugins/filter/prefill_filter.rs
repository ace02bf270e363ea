//! `prefill-filter`: keeps endpoints whose `llm-d.ai/role` is `prefill`, `prefill-decode`,
//! `both`, `encode-prefill` or `encode-prefill-decode`; unlabelled endpoints are not prefill
//! workers.

use super::decode_filter::{build_role_filter, RoleFilter};
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "prefill-filter";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Filter, build, effective::<NoParameters>)
    .consuming(&[Data::EndpointLabels]);

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    build_role_filter(
        parameters,
        RoleFilter {
            roles: &[
                "prefill",
                "prefill-decode",
                "both",
                "encode-prefill",
                "encode-prefill-decode",
            ],
            unlabelled: false,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn keeps_prefill_workers_only() {
        let Ok(Plugin::Filter(mut filter)) = build(&Value::Null) else {
            panic!("not a filter");
        };
        assert_eq!(
            super::super::decode_filter::survivors(filter.as_mut()),
            [1, 2, 5, 6]
        );
    }
}
