//! `static-usage-limit-policy` (llm-d's default usage limit): a band may dispatch while the
//! pool's saturation (0 = idle, 1 = the saturation detector's threshold) is below
//! `threshold`. Parameters: `threshold` in (0, 1], default 1.0 (dispatch until saturated).

use crate::scheduling::flow_policy::{FlowPolicy, UsageLimit};
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "static-usage-limit-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<Parameters>);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub threshold: f64,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters { threshold: 1.0 }
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let Parameters { threshold } = crate::scheduling::plugins::spec::parameters(parameters)?;
    if !(threshold > 0.0 && threshold <= 1.0) {
        return Err(format!("threshold {threshold} must be in (0, 1]"));
    }
    Ok(Plugin::FlowPolicy(FlowPolicy::UsageLimit(
        UsageLimit::Static { threshold },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn threshold_defaults_to_one_and_is_bounded() {
        let built = build(&Value::Null).unwrap();
        assert!(
            matches!(built, Plugin::FlowPolicy(FlowPolicy::UsageLimit(UsageLimit::Static { threshold })) if threshold == 1.0)
        );
        for bad in ["{threshold: 0}", "{threshold: 1.5}", "{threshold: .nan}"] {
            assert!(build(&serde_yaml::from_str(bad).unwrap()).is_err(), "{bad}");
        }
    }
}
