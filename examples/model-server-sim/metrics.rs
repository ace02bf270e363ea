//! `/metrics` in the shape of a real vLLM 0.32 (see `tests/fixtures/vllm/`): `engine` and
//! `model_name` labels, `_created` samples beside counters, Python float formatting, the
//! waiting queue split by reason, prefix-cache counters in tokens, and `cache_config_info`
//! with its full label set. Of the histograms, only the prefill time's (which the picker reads)
//! is there; process metrics are left out.

use std::fmt::Write as _;

/// What one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub model: String,
    pub running: usize,
    /// Waiting for a sequence slot or KV blocks.
    pub waiting_capacity: usize,
    /// Waiting for a LoRA slot.
    pub waiting_deferred: usize,
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache, and those found there.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub generation_tokens: u64,
    /// Requests finished (all stop at `max_tokens`: `finished_reason="length"`).
    pub finished: u64,
    pub prefill_time: Histogram,
    pub first_token_time: Histogram,
    pub inter_token_time: Histogram,
    pub max_lora: usize,
    pub running_adapters: Vec<String>,
    pub waiting_adapters: Vec<String>,
    pub block_size: usize,
    pub num_blocks: usize,
    /// Unix seconds: the process start (the counters' `_created`) and now.
    pub started: f64,
    pub now: f64,
    /// Raw exposition lines appended at the end.
    pub extra: String,
    /// Filler series appended after those until the page is at least this many bytes.
    pub padding_bytes: usize,
}

/// vLLM 0.32's bucket bounds (seconds) for `vllm:request_prefill_time_seconds`.
pub const PREFILL_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// ... for `vllm:time_to_first_token_seconds`.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// ... for `vllm:inter_token_latency_seconds`.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Observed durations, as one of vLLM's latency histograms counts them.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations at or below each bound (not cumulative).
    in_bucket: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// No observations and no buckets but `+Inf`.
impl Default for Histogram {
    fn default() -> Self {
        Histogram::new(&[])
    }
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            in_bucket: vec![0; bounds.len()],
            count: 0,
            sum_seconds: 0.0,
        }
    }

    pub fn observe(&mut self, seconds: f64) {
        self.observe_many(seconds, 1);
    }

    /// `n` observations of `seconds` each.
    pub fn observe_many(&mut self, seconds: f64, n: u64) {
        self.count += n;
        self.sum_seconds += seconds * n as f64;
        if let Some(bucket) = self.bounds.iter().position(|&bound| seconds <= bound) {
            self.in_bucket[bucket] += n;
        }
    }
}

/// A float as Python's `prometheus_client` writes it: `4.0`, `0.34042553191489366`,
/// `1.7954260808892508e+09`.
pub fn py_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let mut text = format!("{value}");
    if !text.contains(['.', 'e']) {
        text.push_str(".0");
    }
    // floatToGoString: more than six digits before the point go to exponent form.
    let dot = text.find('.').unwrap_or(text.len());
    if value > 0.0 && dot > 6 {
        let digits: String = text.chars().filter(char::is_ascii_digit).collect();
        let mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e+0{}", dot - 1);
    }
    text
}

struct Writer {
    out: String,
    labels: String,
}

impl Writer {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A sample with the engine's labels plus `extra` ones (`key="value"` pairs).
    fn sample(&mut self, name: &str, extra: &str, value: f64) {
        let comma = if extra.is_empty() { "" } else { "," };
        let _ = writeln!(
            self.out,
            "{name}{{{}{comma}{extra}}} {}",
            self.labels,
            py_float(value)
        );
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.header(name, "gauge", help);
        self.sample(name, "", value);
    }

    /// A counter: `_total`, then its `_created` gauge, as prometheus_client writes them.
    fn counter(&mut self, name: &str, help: &str, value: f64, created: f64) {
        self.header(&format!("{name}_total"), "counter", help);
        self.sample(&format!("{name}_total"), "", value);
        self.header(&format!("{name}_created"), "gauge", help);
        self.sample(&format!("{name}_created"), "", created);
    }
}

/// Label values as Prometheus escapes them.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn render(s: &Snapshot) -> String {
    let mut w = Writer {
        out: String::with_capacity(4096),
        labels: format!("engine=\"0\",model_name=\"{}\"", escape(&s.model)),
    };
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        s.running as f64,
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        (s.waiting_capacity + s.waiting_deferred) as f64,
    );
    w.header(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling \
         capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, \
         blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    );
    let by_reason = [
        ("capacity", s.waiting_capacity),
        ("deferred", s.waiting_deferred),
    ];
    for (reason, count) in by_reason {
        w.sample(
            "vllm:num_requests_waiting_by_reason",
            &format!("reason=\"{reason}\""),
            count as f64,
        );
    }
    w.header(
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is \
         awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    );
    for (state, value) in [
        ("awake", 1.0),
        ("weights_offloaded", 0.0),
        ("discard_all", 0.0),
    ] {
        w.sample(
            "vllm:engine_sleep_state",
            &format!("sleep_state=\"{state}\""),
            value,
        );
    }
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        s.kv_usage,
    );
    let created = s.started;
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        s.prefix_queries as f64,
        created,
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        s.prefix_hits as f64,
        created,
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        0.0,
        created,
    );
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        s.prefix_queries as f64,
        created,
    );
    let by_source = [
        (
            "local_compute",
            s.prefix_queries - s.prefix_hits.min(s.prefix_queries),
        ),
        ("local_cache_hit", s.prefix_hits),
        ("external_kv_transfer", 0),
    ];
    let help = "Number of prompt tokens by source.";
    w.header("vllm:prompt_tokens_by_source_total", "counter", help);
    for (source, value) in by_source {
        w.sample(
            "vllm:prompt_tokens_by_source_total",
            &format!("source=\"{source}\""),
            value as f64,
        );
    }
    w.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        s.prefix_hits as f64,
        created,
    );
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        s.generation_tokens as f64,
        created,
    );
    w.header(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
    );
    for reason in ["stop", "length", "abort", "error", "repetition"] {
        let count = if reason == "length" { s.finished } else { 0 };
        // vLLM orders the labels alphabetically here: engine, finished_reason, model_name.
        let _ = writeln!(
            w.out,
            "vllm:request_success_total{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"{}\"}} {}",
            escape(&s.model),
            py_float(count as f64)
        );
    }
    let model = escape(&s.model);
    histogram(&mut w, &s.prefill_time, PREFILL, &model, created);
    histogram(&mut w, &s.first_token_time, TTFT, &model, created);
    histogram(&mut w, &s.inter_token_time, ITL, &model, created);
    w.header(
        "vllm:lora_requests_info",
        "gauge",
        "Running stats on lora requests.",
    );
    let _ = writeln!(
        w.out,
        "vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\"}} {}",
        s.max_lora,
        escape(&s.running_adapters.join(",")),
        escape(&s.waiting_adapters.join(",")),
        py_float(s.now)
    );
    w.header(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
    );
    let _ = writeln!(
        w.out,
        "vllm:cache_config_info{{{}}} 1.0",
        cache_config_labels(s)
    );
    w.out.push_str(&s.extra);
    if w.out.len() < s.padding_bytes {
        w.out.reserve(s.padding_bytes - w.out.len() + 64);
        w.header(
            "vllm:sim_padding",
            "gauge",
            "Filler making the page oversized",
        );
        let mut n = 0u64;
        while w.out.len() < s.padding_bytes {
            let _ = writeln!(w.out, "vllm:sim_padding{{n=\"{n}\"}} 0.0");
            n += 1;
        }
    }
    w.out
}

/// A histogram's name and help text, as vLLM 0.32 writes them.
type Named = (&'static str, &'static str);
const PREFILL: Named = (
    "vllm:request_prefill_time_seconds",
    "Histogram of time spent in PREFILL phase for request.",
);
const TTFT: Named = (
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
);
const ITL: Named = (
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
);

/// A latency histogram as vLLM writes it: labels in alphabetical order (`engine`, `le`,
/// `model_name`), cumulative buckets, then count, sum and `_created`.
fn histogram(
    w: &mut Writer,
    histogram: &Histogram,
    (name, help): Named,
    model: &str,
    created: f64,
) {
    w.header(name, "histogram", help);
    let mut cumulative = 0;
    let bounds = histogram.bounds.iter().map(|&b| py_float(b));
    for (bound, count) in bounds
        .chain(["+Inf".to_string()])
        .zip(histogram.in_bucket.iter().copied().chain([histogram.count]))
    {
        cumulative = if bound == "+Inf" {
            count
        } else {
            cumulative + count
        };
        let _ = writeln!(
            w.out,
            "{name}_bucket{{engine=\"0\",le=\"{bound}\",model_name=\"{model}\"}} {}",
            py_float(cumulative as f64)
        );
    }
    w.sample(&format!("{name}_count"), "", histogram.count as f64);
    w.sample(&format!("{name}_sum"), "", histogram.sum_seconds);
    w.header(&format!("{name}_created"), "gauge", help);
    w.sample(&format!("{name}_created"), "", created);
}

/// Bytes of KV cache per token of Llama-3.1-8B (32 layers x 8 KV heads x 128 x 2 x fp16).
const KV_BYTES_PER_TOKEN: usize = 131_072;
const MAX_MODEL_LEN: usize = 131_072;

/// vLLM 0.32's full `cache_config_info` label set, in its (alphabetical) order.
fn cache_config_labels(s: &Snapshot) -> String {
    let tokens = s.num_blocks * s.block_size;
    let labels = [
        ("_block_size_resolved", "True".to_string()),
        ("block_size", s.block_size.to_string()),
        ("cache_dtype", "auto".into()),
        ("cache_hit_alignment_tokens", "None".into()),
        ("effective_attention_block_size", s.block_size.to_string()),
        ("enable_mamba_shared_prefix_checkpoint", "False".into()),
        ("enable_prefix_caching", "True".into()),
        ("engine", "0".into()),
        ("gpu_memory_utilization", "0.9".into()),
        ("hash_block_size", "None".into()),
        ("is_attention_free", "False".into()),
        ("kv_cache_dtype_skip_layers", "[]".into()),
        ("kv_cache_layout", "None".into()),
        (
            "kv_cache_max_concurrency",
            py_float(tokens as f64 / MAX_MODEL_LEN as f64),
        ),
        (
            "kv_cache_memory_bytes",
            (tokens * KV_BYTES_PER_TOKEN).to_string(),
        ),
        ("kv_cache_size_tokens", tokens.to_string()),
        ("kv_offloading_backend", "native".into()),
        ("kv_offloading_size", "None".into()),
        ("kv_sharing_fast_prefill", "False".into()),
        ("mamba_block_size", "None".into()),
        ("mamba_cache_dtype", "auto".into()),
        ("mamba_cache_mode", "none".into()),
        ("mamba_page_size_padded", "None".into()),
        ("mamba_ssm_cache_dtype", "float32".into()),
        ("num_cpu_blocks", "None".into()),
        ("num_gpu_blocks", s.num_blocks.to_string()),
        ("num_gpu_blocks_override", "None".into()),
        ("prefix_cache_retention_interval", "0".into()),
        // vLLM's default algorithm's name; the simulator's own chained hash is FNV-based.
        ("prefix_caching_hash_algo", "sha256".into()),
        ("prefix_match_unit", "None".into()),
        ("replayssm_buffer_len", "16".into()),
        ("skip_page_size_padded", "None".into()),
        ("sliding_window", "None".into()),
        ("swa_bounded_replay", "True".into()),
        ("use_kda_recoverssm", "False".into()),
        ("use_replayssm", "False".into()),
        // vLLM's own default (16 on GPUs) counts as not specified.
        (
            "user_specified_block_size",
            if s.block_size == 16 { "False" } else { "True" }.into(),
        ),
    ];
    labels
        .iter()
        .map(|(key, value)| format!("{key}=\"{value}\""))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    const REAL: &str = include_str!("../../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt");

    /// Per series name: its TYPE, and the label-name sets of its samples.
    fn shape(text: &str) -> BTreeMap<String, (String, BTreeSet<Vec<String>>)> {
        let mut shapes: BTreeMap<String, (String, BTreeSet<Vec<String>>)> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                shapes.entry(name.into()).or_default().0 = kind.into();
            } else if !line.starts_with('#') && !line.is_empty() {
                let (name, rest) = line.split_once('{').unwrap_or((line, ""));
                let name = name.split(' ').next().unwrap();
                let labels = rest
                    .split("\",")
                    .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.to_string()))
                    .collect();
                shapes.entry(name.into()).or_default().1.insert(labels);
            }
        }
        shapes
    }

    fn busy() -> Snapshot {
        Snapshot {
            model: "meta-llama/Llama-3.1-8B-Instruct".into(),
            running: 4,
            waiting_capacity: 2,
            waiting_deferred: 1,
            kv_usage: 0.25,
            prefix_queries: 9643,
            prefix_hits: 6272,
            generation_tokens: 1021,
            finished: 21,
            prefill_time: {
                let mut histogram = Histogram::new(PREFILL_BUCKETS);
                for seconds in [0.02, 0.4, 0.4, 3.0] {
                    histogram.observe(seconds);
                }
                histogram
            },
            first_token_time: Histogram::new(TTFT_BUCKETS),
            inter_token_time: Histogram::new(ITL_BUCKETS),
            max_lora: 2,
            running_adapters: vec!["sql-lora".into()],
            waiting_adapters: vec!["chat-lora".into()],
            block_size: 16,
            num_blocks: 4096,
            started: 1_795_426_031.043_914_3,
            now: 1_795_426_080.889_250_8,
            extra: String::new(),
            padding_bytes: 0,
        }
    }

    #[test]
    fn every_series_has_the_type_and_labels_of_a_real_vllm() {
        let real = shape(REAL);
        let ours = shape(&render(&busy()));
        assert!(ours.len() >= 20, "{ours:?}");
        for (name, (kind, label_sets)) in &ours {
            let (real_kind, real_sets) = real
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not a vLLM 0.32 series"));
            assert_eq!(kind, real_kind, "{name}");
            for labels in label_sets {
                assert!(
                    real_sets.contains(labels),
                    "{name}{labels:?} is not in {real_sets:?}"
                );
            }
        }
        // What the picker reads is there.
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:lora_requests_info",
            "vllm:cache_config_info",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
        ] {
            assert!(ours.contains_key(name), "{name}");
        }
    }

    #[test]
    fn padding_makes_an_oversized_page_that_still_parses() {
        let plain = render(&busy());
        let padded = render(&Snapshot {
            padding_bytes: 100_000,
            ..busy()
        });
        assert!(
            padded.len() >= 100_000 && padded.len() < 100_100,
            "{}",
            padded.len()
        );
        assert!(padded.starts_with(&plain), "the real series come first");
        assert!(padded.ends_with('\n'));
        assert_eq!(
            render(&Snapshot {
                padding_bytes: 10,
                ..busy()
            }),
            plain
        );
    }

    #[test]
    fn values_and_labels() {
        let text = render(&busy());
        let model = "engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"";
        for line in [
            format!("vllm:num_requests_running{{{model}}} 4.0"),
            format!("vllm:num_requests_waiting{{{model}}} 3.0"),
            format!("vllm:num_requests_waiting_by_reason{{{model},reason=\"capacity\"}} 2.0"),
            format!("vllm:num_requests_waiting_by_reason{{{model},reason=\"deferred\"}} 1.0"),
            format!("vllm:kv_cache_usage_perc{{{model}}} 0.25"),
            format!("vllm:prefix_cache_queries_total{{{model}}} 9643.0"),
            format!("vllm:prefix_cache_hits_total{{{model}}} 6272.0"),
            format!("vllm:prefix_cache_hits_created{{{model}}} 1.7954260310439143e+09"),
            format!("vllm:prompt_tokens_by_source_total{{{model},source=\"local_compute\"}} 3371.0"),
            "vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"0.3\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1.0".into(),
            "vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"2.5\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0".into(),
            "vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 4.0".into(),
            format!("vllm:request_prefill_time_seconds_sum{{{model}}} 3.8200000000000003"),
            "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql-lora\",waiting_lora_adapters=\"chat-lora\"} 1.7954260808892508e+09".into(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        let config = text
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .unwrap();
        assert!(config.contains("block_size=\"16\""), "{config}");
        assert!(config.contains("num_gpu_blocks=\"4096\""), "{config}");
        assert!(
            config.contains("kv_cache_size_tokens=\"65536\""),
            "{config}"
        );
    }

    #[test]
    fn python_float_format() {
        assert_eq!(py_float(4.0), "4.0");
        assert_eq!(py_float(0.0), "0.0");
        assert_eq!(py_float(0.340_425_531_914_893_66), "0.34042553191489366");
        assert_eq!(py_float(1_795_426_080.889_250_8), "1.7954260808892508e+09");
        assert_eq!(py_float(1_073_741_824.0), "1.073741824e+09");
        assert_eq!(py_float(123_456.0), "123456.0");
    }
}
