//! `weighted-random-picker`: picks with probability proportional to the total score, using
//! weighted reservoir sampling (key `u^(1/w)`, largest keys win), so fallbacks are distinct and
//! follow the same weights. If every total is 0 the pick is uniform.

use super::PickerParameters;
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::rng::Rng;
use crate::scheduling::{Picker, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "weighted-random-picker";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::Picker, build, effective::<PickerParameters>);

pub struct WeightedRandomPicker {
    parameters: PickerParameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::Picker(Box::new(WeightedRandomPicker {
        parameters: PickerParameters::parse(parameters)?,
    })))
}

impl Picker for WeightedRandomPicker {
    fn pick(&self, candidates: &[usize], totals: &[f64], rng: &mut Rng, picked: &mut Vec<usize>) {
        picked.clear();
        let all_zero = totals.iter().all(|&t| t <= 0.0);
        let mut keyed: Vec<(f64, usize)> = candidates
            .iter()
            .zip(totals)
            .map(|(&candidate, &total)| {
                let weight = if all_zero { 1.0 } else { total.max(0.0) };
                let key = if weight > 0.0 {
                    // 1 - unit() is in (0, 1], so ln() is finite.
                    (1.0 - rng.unit()).ln() / weight
                } else {
                    f64::NEG_INFINITY
                };
                (key, candidate)
            })
            .collect();
        keyed.sort_by(|a, b| b.0.total_cmp(&a.0));
        picked.extend(
            keyed
                .iter()
                .filter(|(key, _)| *key > f64::NEG_INFINITY)
                .take(self.parameters.max_num_of_endpoints)
                .map(|&(_, candidate)| candidate),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn frequencies_follow_the_weights() {
        let picker = WeightedRandomPicker {
            parameters: PickerParameters::default(),
        };
        let mut rng = Rng::new(11);
        let mut counts = [0u32; 3];
        let mut picked = Vec::new();
        for _ in 0..30_000 {
            picker.pick(&[0, 1, 2], &[3.0, 1.0, 0.0], &mut rng, &mut picked);
            counts[picked[0]] += 1;
        }
        // Expected 22,500 / 7,500 / 0.
        assert_eq!(counts[2], 0, "zero weight is never picked");
        assert!((21_800..23_200).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn all_zero_is_uniform_and_fallbacks_are_distinct() {
        let picker = WeightedRandomPicker {
            parameters: PickerParameters {
                max_num_of_endpoints: 3,
            },
        };
        let mut rng = Rng::new(2);
        let mut picked = Vec::new();
        let mut firsts = [0u32; 3];
        for _ in 0..3000 {
            picker.pick(&[0, 1, 2], &[0.0, 0.0, 0.0], &mut rng, &mut picked);
            let mut sorted = picked.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2]);
            firsts[picked[0]] += 1;
        }
        assert!(firsts.iter().all(|&c| c > 850), "{firsts:?}");
    }
}
