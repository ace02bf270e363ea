//! Model-server metrics: which series each engine exposes, and the compact snapshot the
//! scorers read.

use crate::latency::LatencyTotals;
use crate::pace::WorkTotals;
use crate::prometheus::{for_each_named_sample_within, ParseSummary, Sample};

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

/// vLLM's adapter series: the adapters running and waiting, as labels.
const LORA_INFO: &str = "vllm:lora_requests_info";
/// vLLM's cache geometry series, as labels.
const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// vLLM's work counters (see [`WorkTotals`]).
const FINISHED: &str = "vllm:request_success_total";
const PREFILL_SECONDS: &str = "vllm:request_prefill_time_seconds_sum";
const PROMPT_TOKENS_BY_SOURCE: &str = "vllm:prompt_tokens_by_source_total";
/// vLLM's latency histograms' sums and counts (see [`LatencyTotals`]).
const TTFT_SUM: &str = "vllm:time_to_first_token_seconds_sum";
const TTFT_COUNT: &str = "vllm:time_to_first_token_seconds_count";
const ITL_SUM: &str = "vllm:inter_token_latency_seconds_sum";
const ITL_COUNT: &str = "vllm:inter_token_latency_seconds_count";
const VLLM_COUNTERS: [&str; 7] = [
    FINISHED,
    PREFILL_SECONDS,
    PROMPT_TOKENS_BY_SOURCE,
    TTFT_SUM,
    TTFT_COUNT,
    ITL_SUM,
    ITL_COUNT,
];

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
///
/// An engine value is `None` when it is **unknown**: the pod reported NaN, an infinity, a
/// negative number, or series whose sum overflows; or it was never scraped (the default).
/// Every scorer and detector treats an unknown value as the worst one, never as idle, and
/// leaves it out of anything it computes across pods (a min-max range, a softmax sum), so
/// one pod's values cannot change how the others compare. Read them through
/// [`EndpointMetrics::waiting`], [`EndpointMetrics::running`] and
/// [`EndpointMetrics::kv_usage`], which also refuse values that are not valid (e.g. in a
/// snapshot built by hand).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EndpointMetrics {
    pub waiting_queue: Option<f64>,
    pub running_requests: Option<f64>,
    /// KV-cache utilisation in 0..1.
    pub kv_cache_usage: Option<f64>,
    pub lora: Option<LoraInfo>,
    pub cache_config: Option<CacheConfig>,
    /// vLLM's work counters, when the page has all of them.
    pub work: Option<WorkTotals>,
    /// vLLM's TTFT and inter-token latency counters, when the page has all of them.
    pub latency: Option<LatencyTotals>,
    /// Values of the configured custom selectors, in their order; `None` when absent or
    /// unknown (a non-finite value, or a sum that overflows).
    pub custom: Vec<Option<f64>>,
}

/// A usable gauge value: finite and not negative.
pub fn known(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite() && *v >= 0.0)
}

impl EndpointMetrics {
    /// A pod that reported an empty queue, nothing running and an empty KV cache.
    pub fn idle() -> Self {
        EndpointMetrics {
            waiting_queue: Some(0.0),
            running_requests: Some(0.0),
            kv_cache_usage: Some(0.0),
            ..EndpointMetrics::default()
        }
    }

    /// Requests waiting; `None` when unknown.
    pub fn waiting(&self) -> Option<f64> {
        known(self.waiting_queue)
    }

    /// Requests running; `None` when unknown.
    pub fn running(&self) -> Option<f64> {
        known(self.running_requests)
    }

    /// KV-cache utilisation in 0..1; `None` when unknown.
    pub fn kv_usage(&self) -> Option<f64> {
        known(self.kv_cache_usage).map(|kv| kv.min(1.0))
    }
}

/// Why a scrape body yielded no usable metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    NoEngineMetrics {
        engine: Engine,
        malformed_lines: usize,
    },
    /// The body is longer than `pool.maxMetricsBytes`; parsing stopped there.
    TooLarge { limit: usize },
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractError::NoEngineMetrics {
                engine,
                malformed_lines,
            } => write!(
                f,
                "no {engine:?} queue/running/KV metrics found ({malformed_lines} malformed lines among those series or with no metric name)"
            ),
            ExtractError::TooLarge { limit } => write!(
                f,
                "the page is larger than pool.maxMetricsBytes ({limit} bytes); not read past it"
            ),
        }
    }
}

/// One value gathered over a page's series: absent, a running total, or unknown for good
/// once a series is non-finite or negative, or the total overflows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Gauge {
    #[default]
    Absent,
    Value(f64),
    Unknown,
}

impl Gauge {
    /// Adds a series (gauges of one metric with different labels, e.g. one per model).
    fn add(&mut self, value: f64, allow_negative: bool) {
        *self = match *self {
            Gauge::Unknown => Gauge::Unknown,
            _ if !value.is_finite() || (value < 0.0 && !allow_negative) => Gauge::Unknown,
            Gauge::Absent => Gauge::Value(value),
            Gauge::Value(sum) => match sum + value {
                total if total.is_finite() => Gauge::Value(total),
                _ => Gauge::Unknown,
            },
        }
    }

    /// Keeps the highest series (KV usage of several models on one pod).
    fn max(&mut self, value: f64) {
        *self = match *self {
            Gauge::Unknown => Gauge::Unknown,
            _ if !value.is_finite() || value < 0.0 => Gauge::Unknown,
            Gauge::Absent => Gauge::Value(value),
            Gauge::Value(held) => Gauge::Value(held.max(value)),
        }
    }

    fn is_absent(self) -> bool {
        self == Gauge::Absent
    }

    /// An absent engine gauge reads as 0 (a page without that series), an unknown one as
    /// `None`.
    fn or_zero(self) -> Option<f64> {
        match self {
            Gauge::Absent => Some(0.0),
            Gauge::Value(value) => Some(value),
            Gauge::Unknown => None,
        }
    }

    fn value(self) -> Option<f64> {
        match self {
            Gauge::Value(value) => Some(value),
            Gauge::Absent | Gauge::Unknown => None,
        }
    }
}

#[derive(Default)]
struct Accumulator {
    waiting: Gauge,
    running: Gauge,
    kv_usage: Gauge,
    lora_timestamp: f64,
    finished: Gauge,
    prefill_seconds: Gauge,
    computed_prompt_tokens: Gauge,
    ttft_seconds: Gauge,
    first_tokens: Gauge,
    inter_token_seconds: Gauge,
    inter_tokens: Gauge,
}

impl Accumulator {
    /// A work counter's sample, when `sample` is one.
    fn work_counter(&mut self, sample: &Sample<'_>) -> Option<&mut Gauge> {
        match sample.name {
            FINISHED => Some(&mut self.finished),
            PREFILL_SECONDS => Some(&mut self.prefill_seconds),
            TTFT_SUM => Some(&mut self.ttft_seconds),
            TTFT_COUNT => Some(&mut self.first_tokens),
            ITL_SUM => Some(&mut self.inter_token_seconds),
            ITL_COUNT => Some(&mut self.inter_tokens),
            PROMPT_TOKENS_BY_SOURCE
                if sample.label("source").as_deref() == Some("local_compute") =>
            {
                Some(&mut self.computed_prompt_tokens)
            }
            _ => None,
        }
    }

    fn work(&self) -> Option<WorkTotals> {
        Some(WorkTotals {
            finished: self.finished.value()?,
            prefill_seconds: self.prefill_seconds.value()?,
            computed_prompt_tokens: self.computed_prompt_tokens.value()?,
        })
    }

    fn latency(&self) -> Option<LatencyTotals> {
        Some(LatencyTotals {
            ttft_seconds: self.ttft_seconds.value()?,
            first_tokens: self.first_tokens.value()?,
            inter_token_seconds: self.inter_token_seconds.value()?,
            inter_tokens: self.inter_tokens.value()?,
        })
    }
}

/// [`extract_within`] with no size limit.
pub fn extract(
    engine: Engine,
    text: &str,
    selectors: &[MetricSelector],
) -> Result<(EndpointMetrics, ParseSummary, Vec<usize>), ExtractError> {
    extract_within(engine, text, selectors, usize::MAX)
}

/// Reads one `/metrics` body into a snapshot. Series of the same gauge with different labels
/// (one per served model) are summed for queue and running, and the highest KV usage wins;
/// a non-finite or negative series (or a sum that overflows) makes that value unknown.
/// Parsing stops at `max_bytes`: a longer body is an error, whatever came before the cap.
/// Also returns the selectors whose metric appeared only with other labels, so a label filter
/// that matches nothing can be reported.
pub fn extract_within(
    engine: Engine,
    text: &str,
    selectors: &[MetricSelector],
    max_bytes: usize,
) -> Result<(EndpointMetrics, ParseSummary, Vec<usize>), ExtractError> {
    let names = engine.names();
    let mut acc = Accumulator::default();
    let mut metrics = EndpointMetrics::default();
    let mut custom = vec![Gauge::Absent; selectors.len()];
    let mut name_seen = vec![false; selectors.len()];
    let wanted = |name: &str| {
        names.waiting.contains(&name)
            || names.running.contains(&name)
            || names.kv_usage.contains(&name)
            || name == LORA_INFO
            || name == CACHE_CONFIG_INFO
            || (engine == Engine::Vllm && VLLM_COUNTERS.contains(&name))
            || selectors
                .iter()
                .any(|selector| selector.metric_name == name)
    };
    let summary = for_each_named_sample_within(text, max_bytes, wanted, |sample| {
        let value = sample.value;
        if names.waiting.contains(&sample.name) {
            acc.waiting.add(value, false);
        } else if names.running.contains(&sample.name) {
            acc.running.add(value, false);
        } else if names.kv_usage.contains(&sample.name) {
            acc.kv_usage.max(value);
        } else if sample.name == LORA_INFO && sample.value >= acc.lora_timestamp {
            acc.lora_timestamp = sample.value;
            metrics.lora = Some(lora_info(sample));
        } else if sample.name == CACHE_CONFIG_INFO {
            metrics.cache_config = cache_config(sample);
        } else if let Some(counter) = acc.work_counter(sample) {
            counter.add(value, false);
        }
        for ((slot, seen), selector) in custom.iter_mut().zip(name_seen.iter_mut()).zip(selectors) {
            if sample.name == selector.metric_name {
                *seen = true;
                if selector.matches(sample) {
                    // A custom gauge may be negative (its scorer clamps to [min, max]).
                    slot.add(value, true);
                }
            }
        }
    });
    if summary.truncated {
        return Err(ExtractError::TooLarge { limit: max_bytes });
    }
    if acc.waiting.is_absent() && acc.running.is_absent() && acc.kv_usage.is_absent() {
        return Err(ExtractError::NoEngineMetrics {
            engine,
            malformed_lines: summary.malformed_lines,
        });
    }
    metrics.waiting_queue = acc.waiting.or_zero();
    metrics.running_requests = acc.running.or_zero();
    metrics.kv_cache_usage = acc.kv_usage.or_zero().map(|kv| kv.min(1.0));
    metrics.work = acc.work();
    metrics.latency = acc.latency();
    metrics.custom = custom.iter().map(|gauge| gauge.value()).collect();
    let unmatched = custom
        .iter()
        .zip(&name_seen)
        .enumerate()
        .filter(|(_, (gauge, &seen))| seen && gauge.is_absent())
        .map(|(index, _)| index)
        .collect();
    Ok((metrics, summary, unmatched))
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

/// vLLM 0.32 lists an adapter with requests running in both lists (with a waiting count of 0);
/// it holds one slot, so running takes precedence and it is counted once.
fn lora_info(sample: &Sample<'_>) -> LoraInfo {
    let running = adapter_list(sample.label("running_lora_adapters"));
    let mut waiting = adapter_list(sample.label("waiting_lora_adapters"));
    waiting.retain(|adapter| !running.contains(adapter));
    LoraInfo {
        max_lora: sample
            .label("max_lora")
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0),
        running,
        waiting,
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
        assert_eq!(metrics.waiting_queue, Some(5.0));
        assert_eq!(metrics.running_requests, Some(7.0));
        assert_eq!(metrics.kv_cache_usage, Some(0.4));
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
    fn work_counters_of_a_real_vllm() {
        let busy = include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt");
        let (metrics, _, _) = extract(Engine::Vllm, busy, &[]).unwrap();
        assert_eq!(
            metrics.work,
            Some(WorkTotals {
                finished: 21.0,
                prefill_seconds: 0.424920353001653,
                computed_prompt_tokens: 3371.0,
            })
        );
        assert_eq!(
            metrics.latency,
            Some(LatencyTotals {
                ttft_seconds: 0.9630544185638428,
                first_tokens: 25.0,
                inter_token_seconds: 5.8675946869989275,
                inter_tokens: 996.0,
            })
        );
        let (metrics, _, _) = extract(Engine::Vllm, VLLM, &[]).unwrap();
        assert_eq!(metrics.work, None, "a page without the counters");
        assert_eq!(metrics.latency, None);
    }

    #[test]
    fn newer_kv_metric_name_is_read() {
        let (metrics, _, _) = extract(Engine::Vllm, "vllm:kv_cache_usage_perc 0.9\n", &[]).unwrap();
        assert_eq!(metrics.kv_cache_usage, Some(0.9));
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
            (Some(4.0), Some(2.0), Some(0.5))
        );
        let text = "trtllm_num_requests_waiting 1\ntrtllm_kv_cache_utilization 0.25\n";
        let (metrics, _, _) = extract(Engine::TrtllmServe, text, &[]).unwrap();
        assert_eq!(
            (metrics.waiting(), metrics.running(), metrics.kv_usage()),
            (Some(1.0), Some(0.0), Some(0.25)),
            "a series the page lacks reads as 0"
        );
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

    fn engine_values(text: &str) -> (Option<f64>, Option<f64>, Option<f64>) {
        let (metrics, _, _) = extract(Engine::Vllm, text, &[]).unwrap();
        (metrics.waiting(), metrics.running(), metrics.kv_usage())
    }

    #[test]
    fn non_finite_and_negative_values_are_unknown_never_idle() {
        let text = "vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc 7\nvllm:num_requests_running -3\n";
        assert_eq!(
            engine_values(text),
            (None, None, Some(1.0)),
            "NaN and negative are unknown; a usage above 1 is full"
        );
        let text = "vllm:num_requests_waiting +Inf\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc -Inf\n";
        assert_eq!(engine_values(text), (None, Some(2.0), None));
        let text = "vllm:kv_cache_usage_perc{m=\"a\"} 0.5\nvllm:kv_cache_usage_perc{m=\"b\"} NaN\n";
        assert_eq!(
            engine_values(text).2,
            None,
            "one bad series spoils the value, whatever the others say"
        );
    }

    #[test]
    fn a_sum_that_overflows_is_unknown() {
        let text = "vllm:num_requests_waiting{m=\"a\"} 1e308\nvllm:num_requests_waiting{m=\"b\"} 1e308\nvllm:num_requests_running 1e308\n";
        assert_eq!(engine_values(text), (None, Some(1e308), Some(0.0)));
        let text = "vllm:num_requests_waiting{m=\"a\"} -1\nvllm:num_requests_waiting{m=\"b\"} 5\n";
        assert_eq!(
            engine_values(text).0,
            None,
            "a negative series is not netted out"
        );
    }

    #[test]
    fn unknown_values_still_make_a_model_server() {
        let (metrics, _, _) =
            extract(Engine::Vllm, "vllm:num_requests_waiting NaN\n", &[]).unwrap();
        assert_eq!(metrics.waiting(), None);
        assert!(
            extract(Engine::Vllm, "up NaN\n", &[]).is_err(),
            "still not a model server"
        );
    }

    #[test]
    fn accessors_refuse_invalid_values_built_by_hand() {
        let metrics = EndpointMetrics {
            waiting_queue: Some(f64::NAN),
            running_requests: Some(-1.0),
            kv_cache_usage: Some(3.0),
            ..EndpointMetrics::default()
        };
        assert_eq!(
            (metrics.waiting(), metrics.running(), metrics.kv_usage()),
            (None, None, Some(1.0))
        );
        assert_eq!(EndpointMetrics::default().waiting(), None, "never scraped");
        assert_eq!(EndpointMetrics::idle().kv_usage(), Some(0.0));
    }

    #[test]
    fn parsing_stops_at_the_size_cap() {
        assert!(extract_within(Engine::Vllm, VLLM, &[], VLLM.len()).is_ok());
        assert_eq!(
            extract_within(Engine::Vllm, VLLM, &[], VLLM.len() - 1).err(),
            Some(ExtractError::TooLarge {
                limit: VLLM.len() - 1
            }),
            "one byte over the cap fails, though the series before it were fine"
        );
    }

    #[test]
    fn custom_values_unknown_when_not_finite() {
        let selector = |name: &str| MetricSelector {
            metric_name: name.into(),
            labels: vec![],
        };
        let text = "vllm:num_requests_waiting 1\nm_nan NaN\nm_neg -2\nm_sum 1e308\nm_sum 1e308\n";
        let selectors = [selector("m_nan"), selector("m_neg"), selector("m_sum")];
        let (metrics, _, unmatched) = extract(Engine::Vllm, text, &selectors).unwrap();
        assert_eq!(metrics.custom, vec![None, Some(-2.0), None]);
        assert!(
            unmatched.is_empty(),
            "unknown is not a label mismatch: {unmatched:?}"
        );
    }

    /// Unchanged scrapes of a real vLLM 0.32.0 (CPU build, `--max-loras 2`, adapter `sql-lora`);
    /// where they come from: `tests/fixtures/vllm/README.md`.
    mod real_vllm_0_32 {
        use super::*;
        use crate::harness::test;

        const IDLE: &str =
            include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-idle.txt");
        const BUSY: &str =
            include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt");
        const LORA_RUNNING: &str =
            include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-lora-running.txt");
        const FRESH: &str =
            include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-fresh.txt");

        const CPU_CACHE: CacheConfig = CacheConfig {
            block_size: 128,
            num_gpu_blocks: 48,
        };

        /// The metrics, and the summary of the whole dump's parse (every sample, not only the
        /// ones extraction reads).
        fn extracted(text: &str) -> (EndpointMetrics, ParseSummary) {
            let (metrics, read, unmatched) = extract(Engine::Vllm, text, &[]).unwrap();
            assert!(unmatched.is_empty());
            let whole = crate::prometheus::for_each_sample(text, |_| {});
            // Extraction reads the few series it uses and passes over the rest by name.
            assert!(read.samples < whole.samples / 10, "{read:?} of {whole:?}");
            assert_eq!(read.malformed_lines, 0);
            (metrics, whole)
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
                    malformed_lines: 0,
                    truncated: false
                }
            );
            assert_eq!(
                (
                    metrics.waiting_queue,
                    metrics.running_requests,
                    metrics.kv_cache_usage
                ),
                (Some(0.0), Some(0.0), Some(0.0))
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
                    malformed_lines: 0,
                    truncated: false
                }
            );
            // `num_requests_waiting_by_reason` (capacity 2, deferred 0) is another series and
            // is not added to the queue.
            assert_eq!(metrics.waiting_queue, Some(2.0));
            assert_eq!(metrics.running_requests, Some(4.0));
            assert_eq!(metrics.kv_cache_usage, Some(0.34042553191489366));
            // The newest series (base-model requests only) wins over the sql-lora one 8.8 s older.
            assert_eq!(metrics.lora, lora(2, &[], &[]));
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }

        #[test]
        fn lora_running() {
            let (metrics, summary) = extracted(LORA_RUNNING);
            assert_eq!(summary.malformed_lines, 0);
            assert_eq!(metrics.waiting_queue, Some(0.0));
            assert_eq!(metrics.running_requests, Some(1.0));
            assert_eq!(metrics.kv_cache_usage, Some(0.021276595744680882));
            // vLLM lists the one adapter with a running request in BOTH lists; it holds one
            // slot of two, so it counts once, as running.
            assert!(LORA_RUNNING
                .contains("running_lora_adapters=\"sql-lora\",waiting_lora_adapters=\"sql-lora\""));
            assert_eq!(metrics.lora, lora(2, &["sql-lora"], &[]));
            assert_eq!(metrics.cache_config, Some(CPU_CACHE));
        }

        #[test]
        fn fresh_after_restart() {
            let (metrics, summary) = extracted(FRESH);
            assert_eq!(
                summary,
                ParseSummary {
                    samples: 430,
                    malformed_lines: 0,
                    truncated: false
                }
            );
            assert_eq!(
                (
                    metrics.waiting_queue,
                    metrics.running_requests,
                    metrics.kv_cache_usage
                ),
                (Some(0.0), Some(0.0), Some(0.0))
            );
            // Before its first request vLLM exposes no `lora_requests_info`: the LoRA scorer
            // reads that as every slot free (see lora_affinity_scorer's tests on this dump).
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
