//! `metric-scorer`: turns a custom Prometheus series (from a `prometheus-metric` extractor
//! wired in `dataLayer`) into a score.
//!
//! Linear: `s = (clamp(v, min, max) - min) / (max - min)`, and `1 - s` when minimising.
//! Softmax: over the candidates, `exp(x - max x) / sum exp(x - max x)` with `x = clamp(v)` when
//! maximising and `x = -clamp(v)` when minimising. A pod without the series scores 0 (worst).

use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer, Wiring};
use serde_yaml::Value;

pub const TYPE: &str = "metric-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::CustomMetric]);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum OptimizationMode {
    Minimize,
    Maximize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum NormalizationAlgo {
    Linear,
    Softmax,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub metric_name: String,
    pub optimization_mode: OptimizationMode,
    pub min: f64,
    pub max: f64,
    pub normalization_algo: NormalizationAlgo,
    /// Names the extractor when several extract the same metric with different labels.
    pub extractor: Option<String>,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            metric_name: String::new(),
            optimization_mode: OptimizationMode::Minimize,
            min: 0.0,
            max: 1.0,
            normalization_algo: NormalizationAlgo::Linear,
            extractor: None,
        }
    }
}

pub struct MetricScorer {
    parameters: Parameters,
    /// Slot in `EndpointMetrics::custom`, set when the loader resolves the wiring.
    slot: usize,
    values: Vec<Option<f64>>,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::Scorer(Box::new(MetricScorer::new(
        super::parameters(parameters)?,
    )?)))
}

impl MetricScorer {
    pub fn new(parameters: Parameters) -> Result<Self, String> {
        if parameters.metric_name.trim().is_empty() {
            return Err("metricName is required".into());
        }
        // The span must be finite too: scores divide by it.
        let finite = (parameters.max - parameters.min).is_finite();
        if !finite || parameters.max <= parameters.min {
            return Err(format!(
                "max ({}) must be a finite number above min ({}), less than 1.7e308 apart",
                parameters.max, parameters.min
            ));
        }
        Ok(MetricScorer {
            parameters,
            slot: 0,
            values: Vec::new(),
        })
    }

    fn clamped(&self, value: f64) -> f64 {
        value.clamp(self.parameters.min, self.parameters.max)
    }

    fn linear(&self, value: f64) -> f64 {
        let p = &self.parameters;
        let share = (self.clamped(value) - p.min) / (p.max - p.min);
        match p.optimization_mode {
            OptimizationMode::Maximize => share,
            OptimizationMode::Minimize => 1.0 - share,
        }
    }

    fn softmax(&self, scores: &mut [f64]) {
        let sign = match self.parameters.optimization_mode {
            OptimizationMode::Maximize => 1.0,
            OptimizationMode::Minimize => -1.0,
        };
        let exponent = |v: f64| sign * self.clamped(v);
        let Some(top) = self
            .values
            .iter()
            .flatten()
            .map(|&v| exponent(v))
            .reduce(f64::max)
        else {
            return;
        };
        let sum: f64 = self
            .values
            .iter()
            .flatten()
            .map(|&v| (exponent(v) - top).exp())
            .sum();
        for (score, value) in scores.iter_mut().zip(&self.values) {
            *score = value.map_or(0.0, |v| (exponent(v) - top).exp() / sum);
        }
    }
}

impl Scorer for MetricScorer {
    fn resolve(&mut self, wiring: &Wiring) -> Result<(), String> {
        let metric = &self.parameters.metric_name;
        let candidates: Vec<(usize, &str)> = wiring
            .extractors
            .iter()
            .enumerate()
            .filter(|(_, (name, selector))| {
                selector.metric_name == *metric
                    && self.parameters.extractor.as_ref().is_none_or(|e| e == name)
            })
            .map(|(slot, (name, _))| (slot, name.as_str()))
            .collect();
        match candidates.as_slice() {
            [(slot, _)] => {
                self.slot = *slot;
                Ok(())
            }
            [] => Err(format!(
                "no prometheus-metric extractor wired in dataLayer.sources extracts {metric:?}"
            )),
            several => Err(format!(
                "extractors {:?} all extract {metric:?}; name one with `extractor`",
                several.iter().map(|(_, name)| *name).collect::<Vec<_>>()
            )),
        }
    }

    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        self.values.clear();
        self.values.extend(candidates.iter().map(|&i| {
            ctx.pool
                .get(i)
                .and_then(|e| e.metrics.custom.get(self.slot).copied().flatten())
                .filter(|v| v.is_finite())
        }));
        match self.parameters.normalization_algo {
            NormalizationAlgo::Linear => {
                for (score, value) in scores.iter_mut().zip(&self.values) {
                    *score = value.map_or(0.0, |v| self.linear(v));
                }
            }
            NormalizationAlgo::Softmax => self.softmax(scores),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::metrics::{EndpointMetrics, MetricSelector};
    use crate::request::InferenceRequest;
    use crate::scheduling::test_support::pool_with;

    fn scorer(yaml: &str) -> MetricScorer {
        let mut scorer = MetricScorer::new(serde_yaml::from_str(yaml).unwrap()).unwrap();
        let wiring = Wiring {
            extractors: vec![(
                "x".into(),
                MetricSelector {
                    metric_name: "m".into(),
                    labels: vec![],
                },
            )],
        };
        scorer.resolve(&wiring).unwrap();
        scorer
    }

    fn scores(scorer: &mut MetricScorer, values: &[Option<f64>]) -> Vec<f64> {
        let pool = pool_with(
            values
                .iter()
                .map(|&v| EndpointMetrics {
                    custom: vec![v],
                    ..EndpointMetrics::default()
                })
                .collect(),
        );
        let request = InferenceRequest::empty();
        let candidates: Vec<usize> = (0..values.len()).collect();
        let mut out = vec![0.0; values.len()];
        scorer.score(
            &SchedulingContext::new(&request, &pool),
            &candidates,
            &mut out,
        );
        out
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
    }

    #[test]
    fn linear_minimize_and_maximize_with_clamping() {
        let mut min = scorer("{metricName: m, optimizationMode: Minimize, min: 0, max: 50}");
        // 10 -> 1 - 0.2; 60 clamps to 50 -> 0; -5 clamps to 0 -> 1; missing -> worst.
        let got = scores(&mut min, &[Some(10.0), Some(60.0), Some(-5.0), None]);
        assert!(close(&got, &[0.8, 0.0, 1.0, 0.0]), "{got:?}");
        let mut max = scorer("{metricName: m, optimizationMode: Maximize, min: 0, max: 50}");
        let got = scores(&mut max, &[Some(10.0), None]);
        assert!(close(&got, &[0.2, 0.0]), "{got:?}");
    }

    #[test]
    fn softmax_minimize_is_a_softmin() {
        let mut s = scorer(
            "{metricName: m, optimizationMode: Minimize, normalizationAlgo: Softmax, min: 0, max: 50}",
        );
        // x = [0, -1]: e^0 / (1 + e^-1) = 0.7311, e^-1 / (1 + e^-1) = 0.2689; missing -> 0.
        let got = scores(&mut s, &[Some(0.0), Some(1.0), None]);
        assert!(close(&got, &[0.7311, 0.2689, 0.0]), "{got:?}");
        let got = scores(&mut s, &[Some(3.0), Some(3.0)]);
        assert!(close(&got, &[0.5, 0.5]), "{got:?}");
        let got = scores(&mut s, &[None, None]);
        assert!(close(&got, &[0.0, 0.0]), "{got:?}");
    }

    #[test]
    fn parameters_and_wiring_are_checked() {
        assert!(MetricScorer::new(Parameters::default()).is_err());
        let bad: Parameters = serde_yaml::from_str("{metricName: m, min: 5, max: 5}").unwrap();
        assert!(MetricScorer::new(bad).err().unwrap().contains("above min"));
        assert!(
            serde_yaml::from_str::<Parameters>("{metricName: m, optimizationMode: Lowest}")
                .is_err()
        );
        let mut unwired =
            MetricScorer::new(serde_yaml::from_str("{metricName: other}").unwrap()).unwrap();
        assert!(unwired
            .resolve(&Wiring::default())
            .unwrap_err()
            .contains("no prometheus-metric"));
    }
}
