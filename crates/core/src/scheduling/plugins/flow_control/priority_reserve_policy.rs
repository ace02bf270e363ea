//! `priority-reserve-policy`: a usage limit that keeps, below each band, the fewest free
//! slots that let the higher bands find one at the rate they are arriving, and none while they
//! are idle (the estimate is in `crate::flow_control::reserve`). Unlike
//! `priority-holdback-policy`'s fixed ceilings, a pool with no high-priority traffic runs
//! every slot. The default usage limit when flow control has more than one band.
//! Parameters: `waitShare` (0.1, in (0, 1): the share of higher-band arrivals that may find
//! every slot taken), `maxShare` (0.25, in [0, 1): at most this share of the pool is kept),
//! `window` (2s: how far back arrivals count).

use crate::duration::serde_go;
use crate::scheduling::flow_policy::{FlowPolicy, ReserveConfig, UsageLimit};
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;
use std::time::Duration;

pub const TYPE: &str = "priority-reserve-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<Parameters>);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub wait_share: f64,
    pub max_share: f64,
    #[serde(with = "serde_go")]
    pub window: Duration,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            wait_share: 0.1,
            max_share: 0.25,
            window: Duration::from_secs(2),
        }
    }
}

/// The policy with its default parameters.
pub fn default_limit() -> UsageLimit {
    UsageLimit::Reserve(config(&Parameters::default()))
}

fn config(p: &Parameters) -> ReserveConfig {
    ReserveConfig {
        wait_share: p.wait_share,
        max_share: p.max_share,
        window_ms: crate::duration::duration_ms(p.window),
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let p: Parameters = crate::scheduling::plugins::spec::parameters(parameters)?;
    if !(p.wait_share > 0.0 && p.wait_share < 1.0) {
        return Err(format!("waitShare {} must be in (0, 1)", p.wait_share));
    }
    if !(p.max_share >= 0.0 && p.max_share < 1.0) {
        return Err(format!("maxShare {} must be in [0, 1)", p.max_share));
    }
    if p.window.is_zero() {
        return Err("window must be longer than 0s".into());
    }
    Ok(Plugin::FlowPolicy(FlowPolicy::UsageLimit(
        UsageLimit::Reserve(config(&p)),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn defaults_and_bounds() {
        match build(&Value::Null) {
            Ok(Plugin::FlowPolicy(FlowPolicy::UsageLimit(limit))) => {
                assert_eq!(limit, default_limit())
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            "{waitShare: 0}",
            "{waitShare: 1}",
            "{maxShare: 1}",
            "{maxShare: -0.1}",
            "{window: 0s}",
            "{ceiling: 0.5}",
        ] {
            assert!(build(&serde_yaml::from_str(bad).unwrap()).is_err(), "{bad}");
        }
    }
}
