//! `max-score-picker`: the highest total wins; ties are broken at random. With
//! `maxNumOfEndpoints > 1` the next best follow as fallbacks.

use super::PickerParameters;
use crate::scheduling::plugins::spec::{effective, Kind, PluginSpec};
use crate::scheduling::rng::Rng;
use crate::scheduling::{Picker, Plugin};
use serde_yaml::Value;

pub const TYPE: &str = "max-score-picker";
/// The name older llm-d configs use.
pub const LEGACY_TYPE: &str = "max-score";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec =
    PluginSpec::new(TYPE, Kind::Picker, build, effective::<PickerParameters>)
        .with_aliases(&[LEGACY_TYPE]);

pub struct MaxScorePicker {
    parameters: PickerParameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::Picker(Box::new(MaxScorePicker::new(
        PickerParameters::parse(parameters)?,
    ))))
}

impl MaxScorePicker {
    pub fn new(parameters: PickerParameters) -> Self {
        MaxScorePicker { parameters }
    }
}

impl Picker for MaxScorePicker {
    fn pick(&self, candidates: &[usize], totals: &[f64], rng: &mut Rng, picked: &mut Vec<usize>) {
        picked.clear();
        if self.parameters.max_num_of_endpoints == 1 {
            // The common case: one pass, reservoir-style random choice among equal maxima.
            let mut best = f64::NEG_INFINITY;
            let mut ties = 0usize;
            for (&candidate, &total) in candidates.iter().zip(totals) {
                if total > best {
                    best = total;
                    ties = 1;
                    picked.clear();
                    picked.push(candidate);
                } else if total == best {
                    ties += 1;
                    if rng.below(ties) == 0 {
                        picked.clear();
                        picked.push(candidate);
                    }
                }
            }
            return;
        }
        let mut order: Vec<(usize, f64)> = candidates
            .iter()
            .copied()
            .zip(totals.iter().copied())
            .collect();
        rng.shuffle(&mut order);
        order.sort_by(|a, b| b.1.total_cmp(&a.1));
        picked.extend(
            order
                .iter()
                .take(self.parameters.max_num_of_endpoints)
                .map(|(c, _)| *c),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn picker(n: usize) -> MaxScorePicker {
        MaxScorePicker::new(PickerParameters {
            max_num_of_endpoints: n,
        })
    }

    #[test]
    fn highest_total_wins() {
        let mut picked = Vec::new();
        picker(1).pick(&[4, 5, 6], &[0.5, 2.0, 1.0], &mut Rng::new(1), &mut picked);
        assert_eq!(picked, [5]);
    }

    #[test]
    fn ties_are_broken_at_random() {
        let mut rng = Rng::new(3);
        let mut counts = [0; 3];
        let mut picked = Vec::new();
        for _ in 0..3000 {
            picker(1).pick(&[0, 1, 2], &[1.0, 1.0, 0.0], &mut rng, &mut picked);
            counts[picked[0]] += 1;
        }
        assert_eq!(counts[2], 0);
        assert!(counts[0] > 1200 && counts[1] > 1200, "{counts:?}");
    }

    #[test]
    fn fallbacks_in_score_order() {
        let mut picked = Vec::new();
        picker(3).pick(
            &[0, 1, 2, 3],
            &[0.1, 0.9, 0.5, 0.7],
            &mut Rng::new(9),
            &mut picked,
        );
        assert_eq!(picked, [1, 3, 2]);
        picker(9).pick(&[0, 1], &[0.1, 0.9], &mut Rng::new(9), &mut picked);
        assert_eq!(picked, [1, 0]);
    }
}
