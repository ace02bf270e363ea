//! Model-server metrics: which series each engine exposes, and the compact snapshot the
//! scorers read.

use crate::prometheus::{for_each_sample, ParseSummary, Sample};

/// Metric-name profile, chosen per pod by its `engine-type` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
    TrtllmServe,
}

struct MetricNames {
    waiting: &'static [&'static str],
    running: &'static [&'static str],
    kv_usage: &'static [&'static str],
}

impl Engine {
    /// Unknown or missing labels fall back to vLLM, as GIE does.
    pub fn from_label(label: Option<&str>) -> Engine {
        match label {
            Some("sglang") => Engine::Sglang,
            Some("trtllm-serve") | Some("trtllm") => Engine::TrtllmServe,
            _ => Engine::Vllm,
        }
    }

    fn names(self) -> MetricNames {
        match self {
            Engine::Vllm => MetricNames {
                waiting: &["vllm:num_requests_waiting"],
                running: &["vllm:num_requests_running"],
                kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            },
            Engine::Sglang => MetricNames {
                waiting: &["sglang:num_queue_reqs"],
                running: &["sglang:num_running_reqs"],
                kv_usage: &["sglang:token_usage"],
            },
            Engine::TrtllmServe => MetricNames {
                waiting: &["trtllm_num_requests_waiting"],
                running: &["trtllm_num_requests_running"],
                kv_usage: &["trtllm_kv_cache_utilization"],
            },
        }
    }
}

/// LoRA adapters a vLLM pod has loaded or queued (`vllm:lora_requests_info`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraInfo {
    pub max_lora: u32,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

/// vLLM's `vllm:cache_config_info`: used to size the prefix index per pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheConfig {
    pub block_size: u32,
    pub num_gpu_blocks: u64,
}

/// A user-declared series to extract (`prometheus-metric` extractor).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSelector {
    pub metric_name: String,
    pub labels: Vec<(String, String)>,
}

impl MetricSelector {
    fn matches(&self, sample: &Sample<'_>) -> bool {
        sample.name == self.metric_name
            && sample.matches_labels(self.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// One pod's metrics as of its last good scrape.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EndpointMetrics {
    pub waiting_queue: f64,
    pub running_requests: f64,
    /// KV-cache utilisation in 0..1.
    pub kv_cache_usage: f64,
    pub lora: Option<LoraInfo>,
    pub cache_config: Option<CacheConfig>,
    /// Values of the configured custom selectors, in their order; `None` when absent.
    pub custom: Vec<Option<f64>>,
}

/// Why a scrape body yielded no usable metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    NoEngineMetrics {
        engine: Engine,
        malformed_lines: usize,
    },
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractError::NoEngineMetrics {
                engine,
                malformed_lines,
            } => write!(
                f,
                "no {engine:?} queue/running/KV metrics found ({malformed_lines} malformed lines)"
            ),
        }
    }
}

#[derive(Default)]
struct Accumulator {
    waiting: Option<f64>,
    running: Option<f64>,
    kv_usage: Option<f64>,
    lora_timestamp: f64,
}

/// Reads one `/metrics` body into a snapshot. Series of the same gauge with different labels
/// (one per served model) are summed for queue and running, and the highest KV usage wins.
/// Also returns the selectors whose metric appeared only with other labels, so a label filter
/// that matches nothing can be reported.
pub fn extract(
    engine: Engine,
    text: &str,
    selectors: &[MetricSelector],
) -> Result<(EndpointMetrics, ParseSummary, Vec<usize>), ExtractError> {
    let names = engine.names();
    let mut acc = Accumulator::default();
    let mut metrics = EndpointMetrics {
        custom: vec![None; selectors.len()],
        ..EndpointMetrics::default()
    };
    let mut name_seen = vec![false; selectors.len()];
    let summary = for_each_sample(text, |sample| {
        let value = finite_or_zero(sample.value);
        if names.waiting.contains(&sample.name) {
            *acc.waiting.get_or_insert(0.0) += value;
        } else if names.running.contains(&sample.name) {
            *acc.running.get_or_insert(0.0) += value;
        } else if names.kv_usage.contains(&sample.name) {
            acc.kv_usage = Some(acc.kv_usage.unwrap_or(0.0).max(value));
        } else if sample.name == "vllm:lora_requests_info" && sample.value >= acc.lora_timestamp {
            acc.lora_timestamp = sample.value;
            metrics.lora = Some(lora_info(sample));
        } else if sample.name == "vllm:cache_config_info" {
            metrics.cache_config = cache_config(sample);
        }
        for ((slot, seen), selector) in metrics
            .custom
            .iter_mut()
            .zip(name_seen.iter_mut())
            .zip(selectors)
        {
            if sample.name == selector.metric_name {
                *seen = true;
                if selector.matches(sample) {
                    *slot = Some(slot.unwrap_or(0.0) + value);
                }
            }
        }
    });
    if acc.waiting.is_none() && acc.running.is_none() && acc.kv_usage.is_none() {
        return Err(ExtractError::NoEngineMetrics {
            engine,
            malformed_lines: summary.malformed_lines,
        });
    }
    metrics.waiting_queue = acc.waiting.unwrap_or(0.0).max(0.0);
    metrics.running_requests = acc.running.unwrap_or(0.0).max(0.0);
    metrics.kv_cache_usage = acc.kv_usage.unwrap_or(0.0).clamp(0.0, 1.0);
    let unmatched = metrics
        .custom
        .iter()
        .zip(&name_seen)
        .enumerate()
        .filter(|(_, (value, &seen))| seen && value.is_none())
        .map(|(index, _)| index)
        .collect();
    Ok((metrics, summary, unmatched))
}

fn finite_or_zero(value: f64) -> f64 {
    if value.is_finite() {
        value
    } else {
        0.0
    }
}

fn adapter_list(text: Option<std::borrow::Cow<'_, str>>) -> Vec<String> {
    text.map(|list| {
        list.split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

fn lora_info(sample: &Sample<'_>) -> LoraInfo {
    LoraInfo {
        max_lora: sample
            .label("max_lora")
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0),
        running: adapter_list(sample.label("running_lora_adapters")),
        waiting: adapter_list(sample.label("waiting_lora_adapters")),
    }
}

fn cache_config(sample: &Sample<'_>) -> Option<CacheConfig> {
    Some(CacheConfig {
        block_size: sample.label("block_size")?.trim().parse().ok()?,
        num_gpu_blocks: sample.label("num_gpu_blocks")?.trim().parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    const VLLM: &str = "\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=\"llama\"} 3
vllm:num_requests_waiting{model_name=\"other\"} 2
vllm:num_requests_running{model_name=\"llama\"} 7
vllm:gpu_cache_usage_perc{model_name=\"llama\"} 0.4
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a, b\",waiting_lora_adapters=\"\"} 100
vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 50
vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4096\"} 1
";

    #[test]
    fn vllm_snapshot() {
        let (metrics, _, _) = extract(Engine::Vllm, VLLM, &[]).unwrap();
        assert_eq!(metrics.waiting_queue, 5.0);
        assert_eq!(metrics.running_requests, 7.0);
        assert_eq!(metrics.kv_cache_usage, 0.4);
        let lora = metrics.lora.unwrap();
        assert_eq!(lora.max_lora, 2);
        assert_eq!(lora.running, ["a", "b"]);
        assert!(lora.waiting.is_empty());
        assert_eq!(
            metrics.cache_config,
            Some(CacheConfig {
                block_size: 16,
                num_gpu_blocks: 4096
            })
        );
    }

    #[test]
    fn newer_kv_metric_name_is_read() {
        let (metrics, _, _) = extract(Engine::Vllm, "vllm:kv_cache_usage_perc 0.9\n", &[]).unwrap();
        assert_eq!(metrics.kv_cache_usage, 0.9);
    }

    #[test]
    fn sglang_and_trtllm_names() {
        let text = "sglang:num_queue_reqs 4\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n";
        let (metrics, _, _) = extract(Engine::Sglang, text, &[]).unwrap();
        assert_eq!(
            (
                metrics.waiting_queue,
                metrics.running_requests,
                metrics.kv_cache_usage
            ),
            (4.0, 2.0, 0.5)
        );
        let text = "trtllm_num_requests_waiting 1\ntrtllm_kv_cache_utilization 0.25\n";
        let (metrics, _, _) = extract(Engine::TrtllmServe, text, &[]).unwrap();
        assert_eq!((metrics.waiting_queue, metrics.kv_cache_usage), (1.0, 0.25));
        assert_eq!(
            Engine::from_label(Some("trtllm-serve")),
            Engine::TrtllmServe
        );
        assert_eq!(Engine::from_label(Some("unknown")), Engine::Vllm);
    }

    #[test]
    fn not_a_model_server_is_an_error() {
        assert!(extract(Engine::Vllm, "up 1\n", &[]).is_err());
        assert!(extract(Engine::Sglang, VLLM, &[]).is_err());
    }

    #[test]
    fn out_of_range_values_are_tamed() {
        let text = "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 7\nvllm:num_requests_running -3\n";
        let (metrics, _, _) = extract(Engine::Vllm, text, &[]).unwrap();
        assert_eq!(
            (
                metrics.waiting_queue,
                metrics.running_requests,
                metrics.kv_cache_usage
            ),
            (0.0, 0.0, 1.0)
        );
    }

    /// Unchanged scrapes of a real vLLM 0.32.0 (CPU build, `--max-loras 2`, adapter `sql-lora`);
    /// where they come from: `tests/fixtures/vllm/README.md`. These tests pin what the parser
    /// extracts from them today, right or wrong: see the comments marked "issue 13".
    mod real_vllm_0_32 {
        use super::*;
        use crate::harness::test;

        const IDLE: &str = include_str!("../tests/fixtures/vllm/vllm-0.32.0-metrics-idle.txt");
        const BUSY: &str = include_str!("../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt");
        const LORA_RUNNING: &str =
            include_str!("../tests/fixtures/vllm/vllm-0.32.0-metrics-lora-running.txt");
        const FRESH: &str = include_str!("../tests/fixtures/vllm/vllm-0.32.0-metrics-fresh.txt");

        const CPU_CACHE: CacheConfig = CacheConfig {
            block_size: 128,
            num_gpu_blocks: 48,
        };

        fn extracted(text: &str) -> (EndpointMetrics, ParseSummary) {
            let (metrics, summary, unmatched) = extract(Engine::Vllm, text, &[]).unwrap();
            assert!(unmatched.is_empty());
            (metrics, summary)
        }

        fn lora(max_lora: u32, running: &[&str], waiting: &[&str]) -> Option<LoraInfo> {
            Some(LoraInfo {
                max_lora,
                running: running.iter().map(|name| name.to_string()).collect(),
                waiting: waiting.iter().map(|name| name.to_string()).collect(),
            })
        }

        #[test]
        fn idle() {
            let (metrics, summary) = extracted(IDLE);
            assert_eq!(
                summary,
                ParseSummary {
                    samples: 462,
                    malformed_lines: 0
                }
            );
            assert_eq!(
                (
                    metrics.waiting_queue,
                    metrics.running_requests,
                    metrics.kv_cache_usage
                ),
                (0.0, 0.0, 0.0)
            );
            // Two label sets: the newest (largest timestamp) lists nothing; the stale one from
            // an earlier LoRA request, 0.012 s older, is ignored.
            assert_eq!(metrics.lora, lora(2, &[], &[]));
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }

        #[test]
        fn busy() {
            let (metrics, summary) = extracted(BUSY);
            assert_eq!(
                summary,
                ParseSummary {
                    samples: 477,
                    malformed_lines: 0
                }
            );
            // `num_requests_waiting_by_reason` (capacity 2, deferred 0) is another series and
            // is not added to the queue.
            assert_eq!(metrics.waiting_queue, 2.0);
            assert_eq!(metrics.running_requests, 4.0);
            assert_eq!(metrics.kv_cache_usage, 0.34042553191489366);
            // The newest series (base-model requests only) wins over the sql-lora one 8.8 s older.
            assert_eq!(metrics.lora, lora(2, &[], &[]));
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }

        #[test]
        fn lora_running() {
            let (metrics, summary) = extracted(LORA_RUNNING);
            assert_eq!(summary.malformed_lines, 0);
            assert_eq!(metrics.waiting_queue, 0.0);
            assert_eq!(metrics.running_requests, 1.0);
            assert_eq!(metrics.kv_cache_usage, 0.021276595744680882);
            // Issue 13, item 2: vLLM lists the one adapter with a running request in BOTH lists,
            // and both are taken as they stand, so `running + waiting` counts 2 of 2 slots busy.
            assert_eq!(metrics.lora, lora(2, &["sql-lora"], &["sql-lora"]));
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }

        #[test]
        fn fresh_after_restart() {
            let (metrics, summary) = extracted(FRESH);
            assert_eq!(
                summary,
                ParseSummary {
                    samples: 430,
                    malformed_lines: 0
                }
            );
            assert_eq!(
                (
                    metrics.waiting_queue,
                    metrics.running_requests,
                    metrics.kv_cache_usage
                ),
                (0.0, 0.0, 0.0)
            );
            // Issue 13, item 2: before its first request vLLM exposes no `lora_requests_info`,
            // so a LoRA-enabled pod reads as one without LoRA (no free slot) rather than as one
            // with all its slots free.
            assert_eq!(metrics.lora, None);
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }
    }

    #[test]
    fn custom_selectors_filter_by_labels() {
        let selectors = [
            MetricSelector {
                metric_name: "vllm:num_requests_running".into(),
                labels: vec![("model_name".into(), "llama".into())],
            },
            MetricSelector {
                metric_name: "vllm:num_requests_running".into(),
                labels: vec![("model_name".into(), "absent".into())],
            },
        ];
        let (metrics, _, unmatched) = extract(Engine::Vllm, VLLM, &selectors).unwrap();
        assert_eq!(metrics.custom, vec![Some(7.0), None]);
        assert_eq!(
            unmatched,
            [1],
            "the name exists, the label filter matches nothing"
        );
    }
}
