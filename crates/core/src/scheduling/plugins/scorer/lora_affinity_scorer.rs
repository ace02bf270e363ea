//! `lora-affinity-scorer`: prefers endpoints that already run the requested LoRA adapter, then
//! those with a free adapter slot, then those that have it queued. A pod that reports no
//! `vllm:lora_requests_info` has every slot free: vLLM exposes the series only after its first
//! request, so a restarted or new pod would otherwise be starved.

use crate::metrics::LoraInfo;
use crate::scheduling::plugins::spec::{effective, Data, Kind, NoParameters, PluginSpec, Signal};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "lora-affinity-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<NoParameters>)
    .consuming(&[Data::Metric(Signal::LoraAdapters)]);

const RUNNING: f64 = 1.0;
const FREE_SLOT: f64 = 0.8;
const WAITING: f64 = 0.6;

pub struct LoraAffinityScorer;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    super::no_parameters(parameters)?;
    Ok(Plugin::Scorer(Box::new(LoraAffinityScorer)))
}

fn affinity(lora: Option<&LoraInfo>, adapter: &str) -> f64 {
    let Some(lora) = lora else {
        return FREE_SLOT;
    };
    let listed = |list: &[String]| list.iter().any(|name| name == adapter);
    if listed(&lora.running) {
        RUNNING
    } else if lora.running.len() + lora.waiting.len() < lora.max_lora as usize {
        FREE_SLOT
    } else if listed(&lora.waiting) {
        WAITING
    } else {
        0.0
    }
}

impl Scorer for LoraAffinityScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let adapter = ctx.request.model.as_str();
        for (score, &i) in scores.iter_mut().zip(candidates) {
            *score = affinity(
                ctx.pool.get(i).and_then(|e| e.metrics.lora.as_ref()),
                adapter,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    fn info(max: u32, running: &[&str], waiting: &[&str]) -> LoraInfo {
        LoraInfo {
            max_lora: max,
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn tiers() {
        assert_eq!(affinity(Some(&info(2, &["a", "b"], &[])), "a"), 1.0);
        assert_eq!(affinity(Some(&info(2, &["b"], &[])), "a"), 0.8);
        assert_eq!(affinity(Some(&info(2, &["b"], &["a"])), "a"), 0.6);
        assert_eq!(affinity(Some(&info(2, &["b", "c"], &[])), "a"), 0.0);
        assert_eq!(
            affinity(None, "a"),
            0.8,
            "no LoRA info yet: every slot free"
        );
    }

    /// On real vLLM 0.32 scrapes (`tests/fixtures/vllm/`).
    #[test]
    fn real_vllm_pods() {
        let lora_of = |text: &str| {
            crate::metrics::extract(crate::metrics::Engine::Vllm, text, &[])
                .unwrap()
                .0
                .lora
        };
        let fresh = lora_of(include_str!(
            "../../../../../../tests/fixtures/vllm/vllm-0.32.0-metrics-fresh.txt"
        ));
        assert_eq!(
            affinity(fresh.as_ref(), "sql-lora"),
            0.8,
            "restarted pod: free slots"
        );
        let running = lora_of(include_str!(
            "../../../../../../tests/fixtures/vllm/vllm-0.32.0-metrics-lora-running.txt"
        ));
        assert_eq!(affinity(running.as_ref(), "sql-lora"), 1.0);
        // One adapter in both of vLLM's lists holds one slot of two: the other is free.
        assert_eq!(affinity(running.as_ref(), "tiny-llama"), 0.8);
        assert_eq!(affinity(running.as_ref(), "other-lora"), 0.8);
    }
}
