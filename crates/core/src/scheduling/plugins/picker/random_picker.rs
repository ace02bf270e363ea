//! `random-picker`: a uniformly random candidate (and distinct random fallbacks).

use super::PickerParameters;
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::rng::Rng;
use crate::scheduling::{Picker, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "random-picker";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::Picker, build, effective::<PickerParameters>);

pub struct RandomPicker {
    parameters: PickerParameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::Picker(Box::new(RandomPicker {
        parameters: PickerParameters::parse(parameters)?,
    })))
}

impl Picker for RandomPicker {
    fn pick(&self, candidates: &[usize], _totals: &[f64], rng: &mut Rng, picked: &mut Vec<usize>) {
        picked.clear();
        picked.extend_from_slice(candidates);
        rng.shuffle(picked);
        picked.truncate(self.parameters.max_num_of_endpoints);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn spreads_and_ignores_scores() {
        let picker = RandomPicker {
            parameters: PickerParameters {
                max_num_of_endpoints: 2,
            },
        };
        let mut rng = Rng::new(5);
        let mut counts = [0; 3];
        let mut picked = Vec::new();
        for _ in 0..3000 {
            picker.pick(&[0, 1, 2], &[9.0, 0.0, 0.0], &mut rng, &mut picked);
            assert_eq!(picked.len(), 2);
            assert_ne!(picked[0], picked[1]);
            counts[picked[0]] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
    }
}
