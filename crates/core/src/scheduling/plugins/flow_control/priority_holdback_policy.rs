//! `priority-holdback-policy`: a usage limit per band that keeps room for the higher ones.
//! The highest band may dispatch until the pool's saturation reaches `maxCeiling`, the lowest
//! until `minCeiling`, the bands between on a straight line by their rank (`domain: rank`) or
//! their priority values (`domain: value`). A request of a lower band then never takes the
//! last free capacity: a higher-priority arrival finds it free. The price is the share of
//! the pool the lowest band cannot use while it alone waits.
//! Parameters: `minCeiling` (required, in (0, 1)), `maxCeiling` (1.0, in (minCeiling, 1]),
//! `shape` (`linear`, the only one), `domain` (`rank` | `value`, `rank`).

use crate::scheduling::flow_policy::{FlowPolicy, UsageLimit};
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::Plugin;
use serde_yaml::Value;

pub const TYPE: &str = "priority-holdback-policy";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::FlowControl, build, effective::<Parameters>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    #[default]
    Rank,
    Value,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub min_ceiling: Option<f64>,
    pub max_ceiling: f64,
    pub shape: String,
    pub domain: Domain,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            min_ceiling: None,
            max_ceiling: 1.0,
            shape: "linear".into(),
            domain: Domain::Rank,
        }
    }
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let p: Parameters = crate::scheduling::plugins::spec::parameters(parameters)?;
    let min = p.min_ceiling.ok_or("minCeiling is required")?;
    if !(min > 0.0 && min < 1.0) {
        return Err(format!(
            "minCeiling {min} must be in (0, 1): at 0 the lowest band would never dispatch"
        ));
    }
    if !(p.max_ceiling > min && p.max_ceiling <= 1.0) {
        return Err(format!(
            "maxCeiling {} must be in (minCeiling, 1]",
            p.max_ceiling
        ));
    }
    if p.shape != "linear" {
        return Err(format!(
            "shape {:?} is not supported (only linear)",
            p.shape
        ));
    }
    Ok(Plugin::FlowPolicy(FlowPolicy::UsageLimit(
        UsageLimit::Holdback {
            min,
            max: p.max_ceiling,
            by_value: p.domain == Domain::Value,
        },
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn limit(yaml: &str) -> UsageLimit {
        match build(&serde_yaml::from_str(yaml).unwrap()) {
            Ok(Plugin::FlowPolicy(FlowPolicy::UsageLimit(limit))) => limit,
            other => panic!("{yaml}: {other:?}"),
        }
    }

    #[test]
    fn ceilings_fall_from_the_highest_band_to_the_lowest() {
        let by_rank = limit("{minCeiling: 0.5}");
        assert_eq!(by_rank.ceilings(&[100, 10, 0]), vec![1.0, 0.75, 0.5]);
        let by_value = limit("{minCeiling: 0.5, maxCeiling: 0.9, domain: value}");
        let ceilings = by_value.ceilings(&[100, 10, 0]);
        assert!((ceilings[1] - 0.54).abs() < 1e-9, "{ceilings:?}");
        assert_eq!(
            by_rank.ceilings(&[0]),
            vec![1.0],
            "one band: the top ceiling"
        );
    }

    #[test]
    fn bad_parameters_are_refused() {
        for bad in [
            "{}",
            "{minCeiling: 0}",
            "{minCeiling: 1.0}",
            "{minCeiling: 0.5, maxCeiling: 0.4}",
            "{minCeiling: 0.5, shape: step}",
            "{minCeiling: 0.5, domain: other}",
        ] {
            assert!(build(&serde_yaml::from_str(bad).unwrap()).is_err(), "{bad}");
        }
    }
}
