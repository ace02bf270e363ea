//! `make engine-shape`: the shape of the simulator's batching engine (`model-server-sim
//! --batching` with the routing-quality flags, `BATCHING_SIM`) against a real vLLM 0.32 CPU
//! server (the tiny random-weight Llama of `tests/vllm/make_model.py`). Both are driven
//! directly, no Envoy, by the same client code with the same requests:
//!
//! - TTFT against uncached prompt tokens: one streamed request at a time, prompts of fresh
//!   random words (nothing cached) from 64 tokens to the largest the real server takes, one
//!   warm-up per size discarded, then rounds over the sizes; median per size;
//! - TPOT against the batch: B streamed requests at once (B = 1, 2, ... up to the real server's
//!   `--max-num-seqs`), each generating the same number of tokens (`ignore_eos`); per request
//!   (last token - first token) / (tokens - 1), median over the repeats' requests.
//!
//! The two engines' absolute times have nothing in common (an 8B model on an H100, time-scaled,
//! against a tiny model on one CPU core): the report compares shapes, normalised curves and
//! least-squares fits, every figure computed by the run. It goes to stdout and to
//! `bench/results/engine-shape.md`, stamped with the commit like the other bench results. The
//! simulator runs first, then vLLM, never both at once; every process is stopped by pid.
//!
//! `cargo run --release --example engine-shape -- --venv .venv-vllm --model-dir target/vllm-model
//! [--core 1]` (the Makefile target installs vLLM, builds the model and the simulator first).

#[allow(dead_code)]
#[path = "../bench/report.rs"]
mod report;
#[allow(dead_code)]
#[path = "e2e-vllm/server.rs"]
mod server;
#[path = "../tests/support/mod.rs"]
mod support;
#[allow(dead_code)]
#[path = "../bench/workloads.rs"]
mod workloads;

use inference_picker_core::scheduling::rng::Rng;
use report::{markdown_table, Cell, Column, Row, Stamp};
use serde_json::{json, Value};
use server::{
    metric_sum, Setup, Vllm, BLOCK_TOKENS, KV_BLOCKS, MAX_MODEL_LEN, MAX_NUM_SEQS, MODEL,
};
use std::path::PathBuf;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use support::http1::Client;
use support::{repo, try_request, Sim};
use workloads::BATCHING_SIM;

/// Prompt sizes aimed at, in tokens (the prompt's begin-of-text token included); the largest
/// is cut to what the real server takes with the output ([`largest_prompt`]).
const TARGET_TOKENS: [usize; 5] = [64, 256, 512, 1024, 2048];
/// Output tokens of a TTFT request.
const TTFT_MAX_TOKENS: usize = 8;
/// Measured TTFT requests per size, after one warm-up.
const TTFT_REPEATS: usize = 5;
/// Output tokens of a TPOT request, and its prompt's size in tokens.
const TPOT_MAX_TOKENS: usize = 64;
const TPOT_PROMPT_TOKENS: usize = 32;
/// Measured batches per batch size, after one warm-up batch.
const TPOT_REPEATS: usize = 3;
/// Where the report goes (relative to the repository).
const OUT: &str = "bench/results/engine-shape.md";
const START_TIMEOUT: Duration = Duration::from_secs(240);
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Prompt words: each is one token with the space before it for both tokenizers (the
/// simulator's keeps a word of up to 7 characters with its space whole; the tiny model's was
/// trained on text made of these words), so a prompt of N words is N tokens, plus a
/// begin-of-text token where the tokenizer adds one. The run counts every prompt on each
/// server's `/tokenize` all the same.
const WORDS: [&str; 64] = [
    "the", "a", "of", "to", "in", "and", "or", "is", "are", "was", "be", "for", "on", "with", "as",
    "by", "at", "from", "this", "that", "it", "you", "we", "they", "not", "all", "any", "each",
    "some", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "select", "insert", "update", "delete", "where", "join", "table", "row", "index", "query",
    "order", "group", "count", "sum", "limit", "value", "key", "model", "server", "token",
    "prefix", "cache", "block", "queue", "route",
];

fn main() {
    let started = Instant::now();
    // Read before anything is written, as the bench does.
    let stamp = Stamp::of_checkout();
    match run(&stamp, started) {
        Ok(markdown) => {
            print!("{markdown}");
            std::fs::write(repo().join(OUT), &markdown)
                .expect("write bench/results/engine-shape.md");
            eprintln!("wrote {OUT} ({:.0} s)", started.elapsed().as_secs_f64());
        }
        Err(error) => {
            eprintln!("engine-shape: {error}");
            std::process::exit(1);
        }
    }
}

/// Both engines measured, one after the other, and the report. Every process started here is
/// stopped (by pid, on drop) before this returns; nothing on the way panics while one runs
/// (the release profile aborts on a panic, which would skip the drops).
fn run(stamp: &Stamp, started: Instant) -> Result<String, String> {
    let load = load_average();
    let setup = Setup {
        python: arg("--venv", ".venv-vllm").join("bin/python"),
        model_dir: arg("--model-dir", "target/vllm-model"),
        log_dir: repo().join("target/engine-shape"),
    };
    let core: u32 = flag("--core").and_then(|c| c.parse().ok()).unwrap_or(1);
    let _ = std::fs::remove_dir_all(&setup.log_dir);
    std::fs::create_dir_all(&setup.log_dir).map_err(|e| format!("target/engine-shape: {e}"))?;
    let plan = Plan::new();
    eprintln!(
        "engine-shape: {} TTFT and {} TPOT requests per engine; the simulator first, then vLLM",
        plan.ttft_requests(),
        plan.tpot_requests()
    );

    let mut sim_flags: Vec<&str> = BATCHING_SIM.to_vec();
    sim_flags.extend(["--model", MODEL]);
    let sim = Sim::start("engine-shape-sim", &sim_flags);
    eprintln!("simulator at {}: {}", sim.address, sim_flags.join(" "));
    let simulated = measure(&sim.address, &plan);
    drop(sim);
    let simulated = simulated.map_err(|error| format!("simulator: {error}"))?;

    let mut vllm = Vllm::spawn(&setup, "vllm", support::free_port(), core);
    let up = vllm
        .wait_healthy(START_TIMEOUT)
        .map_err(|error| format!("vLLM did not start: {error}"))?;
    eprintln!(
        "vLLM at {} healthy after {:.0} s",
        vllm.address,
        up.as_secs_f64()
    );
    let version = get_json(&vllm.address, "/version")
        .ok()
        .and_then(|v| v["version"].as_str().map(String::from))
        .unwrap_or_else(|| "?".into());
    let real = measure(&vllm.address, &plan);
    vllm.stop();
    let real = real.map_err(|error| format!("vLLM: {error}\n{}", vllm.log_tail(20)))?;

    let context = Context {
        stamp_line: stamp.mark(),
        header: format!(
            "_Measured on {}; command: `make engine-shape`; machine: {} cores, load average at \
             start {load}; run took {:.0} s._",
            stamp.describe(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            started.elapsed().as_secs_f64()
        ),
        sim_flags: BATCHING_SIM.join(" "),
        vllm: format!(
            "vLLM {version} (CPU build) serving the tiny random-weight Llama of \
             `tests/vllm/make_model.py` ({}) with `--max-model-len {MAX_MODEL_LEN} --max-num-seqs \
             {MAX_NUM_SEQS}`, {KV_BLOCKS} KV blocks of {BLOCK_TOKENS} tokens, LoRA enabled (as \
             `make e2e-vllm` runs it; no adapter requested here), its OpenMP threads on core {core}",
            model_size(&setup)
        ),
        largest_prompt: largest_prompt(),
    };
    Ok(render(&context, &simulated, &real))
}

/// The tiny model's layers and hidden size, from its `config.json`.
fn model_size(setup: &Setup) -> String {
    let config = std::fs::read(setup.model_dir.join("tiny-llama/config.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .unwrap_or_default();
    match (
        config["num_hidden_layers"].as_u64(),
        config["hidden_size"].as_u64(),
    ) {
        (Some(layers), Some(hidden)) => format!("{layers} layers, hidden size {hidden}"),
        _ => "config.json unread".into(),
    }
}

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

fn arg(name: &str, default: &str) -> PathBuf {
    repo().join(flag(name).unwrap_or_else(|| default.to_string()))
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    fields.join(" ")
}

/// The largest prompt the real server takes with [`TTFT_MAX_TOKENS`] of output.
fn largest_prompt() -> usize {
    MAX_MODEL_LEN - TTFT_MAX_TOKENS
}

/// Every request both engines get, made once before either runs.
struct Plan {
    /// Per size: the tokens aimed at, and the warm-up prompt then the measured ones.
    ttft: Vec<(usize, Vec<String>)>,
    /// Per batch size: the warm-up batch then the measured ones, each of `batch` prompts.
    tpot: Vec<(usize, Vec<Vec<String>>)>,
}

impl Plan {
    fn new() -> Plan {
        let mut rng = Rng::new(0x5eed_e291);
        let ttft = sizes(largest_prompt())
            .into_iter()
            .map(|tokens| {
                let prompts = (0..=TTFT_REPEATS)
                    .map(|_| prompt(&mut rng, tokens))
                    .collect();
                (tokens, prompts)
            })
            .collect();
        let tpot = batches(MAX_NUM_SEQS)
            .into_iter()
            .map(|batch| {
                let rounds = (0..=TPOT_REPEATS)
                    .map(|_| {
                        (0..batch)
                            .map(|_| prompt(&mut rng, TPOT_PROMPT_TOKENS))
                            .collect()
                    })
                    .collect();
                (batch, rounds)
            })
            .collect();
        Plan { ttft, tpot }
    }

    fn ttft_requests(&self) -> usize {
        self.ttft.iter().map(|(_, prompts)| prompts.len()).sum()
    }

    fn tpot_requests(&self) -> usize {
        self.tpot
            .iter()
            .map(|(batch, rounds)| batch * rounds.len())
            .sum()
    }
}

/// [`TARGET_TOKENS`], each cut to `largest`, without repeats.
fn sizes(largest: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = TARGET_TOKENS.iter().map(|&t| t.min(largest)).collect();
    sizes.dedup();
    sizes
}

/// 1, 2, 4, ... below `max`, then `max`.
fn batches(max: usize) -> Vec<usize> {
    let mut batches: Vec<usize> = std::iter::successors(Some(1usize), |b| Some(b * 2))
        .take_while(|&b| b < max)
        .collect();
    batches.push(max.max(1));
    batches
}

/// `tokens - 1` random words, each after a space: `tokens` tokens where the tokenizer adds a
/// begin-of-text token.
fn prompt(rng: &mut Rng, tokens: usize) -> String {
    (1..tokens)
        .map(|_| format!(" {}", WORDS[rng.below(WORDS.len())]))
        .collect()
}

/// What one engine measured.
struct Measured {
    /// Per size, in plan order.
    ttft: Vec<SizePoint>,
    /// Per batch size, in plan order.
    tpot: Vec<BatchPoint>,
    /// Prefix-cache hits (`vllm:prefix_cache_hits_total`) during the TTFT requests, in tokens.
    ttft_cache_hits: f64,
}

struct SizePoint {
    target: usize,
    /// The server's `/tokenize` count of each measured prompt.
    tokens: Vec<usize>,
    ttft_ms: Vec<f64>,
}

struct BatchPoint {
    batch: usize,
    /// Every measured request's TPOT.
    tpot_ms: Vec<f64>,
    /// Every measured request's output tokens.
    tokens: Vec<usize>,
    /// Per measured batch, [`overlap`]: whether its requests really decoded together.
    overlap: Vec<f64>,
}

fn measure(address: &str, plan: &Plan) -> Result<Measured, String> {
    let hits_before = prefix_cache_hits(address)?;
    let mut ttft: Vec<SizePoint> = Vec::new();
    for (target, prompts) in &plan.ttft {
        let mut tokens = Vec::new();
        for prompt in prompts.iter().skip(1) {
            tokens.push(count_tokens(address, prompt)?);
        }
        ttft.push(SizePoint {
            target: *target,
            tokens,
            ttft_ms: Vec::new(),
        });
    }
    // A warm-up round (one request per size), then rounds over the sizes, so drift on a
    // shared machine spreads over every size alike.
    for round in 0..=TTFT_REPEATS {
        for ((_, prompts), point) in plan.ttft.iter().zip(ttft.iter_mut()) {
            let prompt = prompts.get(round).ok_or("a prompt per round")?;
            let streamed = stream(address, &body(prompt, TTFT_MAX_TOKENS))?;
            if round > 0 {
                point.ttft_ms.push(ms(streamed.first));
            }
        }
    }
    let ttft_cache_hits = prefix_cache_hits(address)? - hits_before;
    eprintln!("  TTFT done ({address})");

    let mut tpot = Vec::new();
    for (batch, rounds) in &plan.tpot {
        let mut point = BatchPoint {
            batch: *batch,
            tpot_ms: Vec::new(),
            tokens: Vec::new(),
            overlap: Vec::new(),
        };
        for (round, prompts) in rounds.iter().enumerate() {
            let results = concurrently(address, prompts)?;
            if round == 0 {
                continue;
            }
            point.overlap.push(overlap(&results));
            for streamed in results {
                let per_token = streamed.tpot().ok_or("a stream of fewer than two tokens")?;
                point.tpot_ms.push(ms(per_token));
                point.tokens.push(streamed.tokens);
            }
        }
        tpot.push(point);
    }
    eprintln!("  TPOT done ({address})");
    Ok(Measured {
        ttft,
        tpot,
        ttft_cache_hits,
    })
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn body(prompt: &str, max_tokens: usize) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})
}

fn count_tokens(address: &str, prompt: &str) -> Result<usize, String> {
    let body = json!({"model": MODEL, "prompt": prompt}).to_string();
    let headers = [("content-type", "application/json")];
    let response = try_request(address, "POST", "/tokenize", &headers, body.as_bytes())
        .map_err(|e| format!("POST /tokenize: {e}"))?;
    serde_json::from_slice::<Value>(&response.body)
        .ok()
        .and_then(|v| v["count"].as_u64())
        .map(|count| count as usize)
        .ok_or_else(|| {
            format!(
                "/tokenize answered {}: {}",
                response.status,
                response.text()
            )
        })
}

fn get_json(address: &str, path: &str) -> Result<Value, String> {
    let response =
        try_request(address, "GET", path, &[], b"").map_err(|e| format!("GET {path}: {e}"))?;
    serde_json::from_slice(&response.body).map_err(|_| {
        format!(
            "GET {path} answered {}: {}",
            response.status,
            response.text()
        )
    })
}

fn prefix_cache_hits(address: &str) -> Result<f64, String> {
    let response = try_request(address, "GET", "/metrics", &[], b"")
        .map_err(|e| format!("GET /metrics: {e}"))?;
    if response.status != 200 {
        return Err(format!("/metrics answered {}", response.status));
    }
    Ok(metric_sum(&response.text(), "vllm:prefix_cache_hits_total"))
}

/// One streamed request as the client saw it.
struct Streamed {
    /// Just before its request was written.
    sent: Instant,
    /// From `sent` to the first event carrying a token.
    first: Duration,
    /// To the last event carrying a token.
    last: Duration,
    /// Output tokens: the stream's usage when it reports one, else its token events.
    tokens: usize,
}

impl Streamed {
    /// (last token - first token) / (tokens - 1).
    fn tpot(&self) -> Option<Duration> {
        let gaps = u32::try_from(self.tokens.checked_sub(1)?).ok()?;
        (gaps > 0).then(|| self.last.saturating_sub(self.first) / gaps)
    }
}

/// What one server-sent event holds: token-carrying choices, and the usage's output tokens.
fn event_tokens(event: &str) -> (usize, Option<usize>) {
    let mut tokens = 0;
    let mut usage = None;
    for data in event.lines().filter_map(|line| line.strip_prefix("data:")) {
        let Ok(value) = serde_json::from_str::<Value>(data.trim()) else {
            continue; // `[DONE]`
        };
        if value["choices"].as_array().is_some_and(|c| !c.is_empty()) {
            tokens += 1;
        }
        if let Some(count) = value["usage"]["completion_tokens"].as_u64() {
            usage = Some(count as usize);
        }
    }
    (tokens, usage)
}

fn stream(address: &str, body: &Value) -> Result<Streamed, String> {
    let mut client = Client::connect(address, READ_TIMEOUT).map_err(|e| e.to_string())?;
    stream_on(&mut client, address, body)
}

fn stream_on(client: &mut Client, address: &str, body: &Value) -> Result<Streamed, String> {
    let headers = [
        ("host", address),
        ("content-type", "application/json"),
        ("connection", "close"),
    ];
    let mut pending: Vec<u8> = Vec::new();
    let (mut first, mut last, mut events, mut usage) = (None, None, 0, None);
    let started = Instant::now();
    let response = client
        .send(
            "POST",
            "/v1/completions",
            &headers,
            body.to_string().as_bytes(),
            &mut |data| {
                let at = started.elapsed();
                pending.extend_from_slice(data);
                while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = pending.drain(..end + 2).collect();
                    let (tokens, reported) = event_tokens(&String::from_utf8_lossy(&event));
                    if tokens > 0 {
                        first.get_or_insert(at);
                        last = Some(at);
                        events += tokens;
                    }
                    usage = reported.or(usage);
                }
            },
        )
        .map_err(|e| format!("POST /v1/completions: {e}"))?;
    if response.status != 200 {
        return Err(format!(
            "POST /v1/completions answered {}: {}",
            response.status,
            response.text()
        ));
    }
    match (first, last) {
        (Some(first), Some(last)) => Ok(Streamed {
            sent: started,
            first,
            last,
            tokens: usage.unwrap_or(events),
        }),
        _ => Err("a stream without a token".into()),
    }
}

/// The time every request of a batch was decoding (from the last one's first token to the
/// first one's last token) over a request's median decoding time: 1 when they decoded side by
/// side throughout, 0 when one after another.
fn overlap(batch: &[Streamed]) -> f64 {
    let Some(origin) = batch.iter().map(|s| s.sent).min() else {
        return f64::NAN;
    };
    let at = |s: &Streamed, offset: Duration| ms(s.sent.duration_since(origin) + offset);
    let all_started = batch
        .iter()
        .map(|s| at(s, s.first))
        .fold(f64::MIN, f64::max);
    let first_done = batch.iter().map(|s| at(s, s.last)).fold(f64::MAX, f64::min);
    let spans: Vec<f64> = batch.iter().map(|s| ms(s.last - s.first)).collect();
    ((first_done - all_started) / median(&spans)).clamp(0.0, 1.0)
}

/// Streams every prompt at once, each on its own connection, released together.
fn concurrently(address: &str, prompts: &[String]) -> Result<Vec<Streamed>, String> {
    let barrier = Barrier::new(prompts.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let client = Client::connect(address, READ_TIMEOUT);
                    barrier.wait();
                    let mut client = client.map_err(|e| e.to_string())?;
                    stream_on(&mut client, address, &body(prompt, TPOT_MAX_TOKENS))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("a client panicked".into()))
            })
            .collect()
    })
}

// ---- The pure parts: statistics, fits, the report. ----

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn median_count(values: &[usize]) -> f64 {
    let as_f64: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    median(&as_f64)
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// `y = intercept + slope x`, by least squares, and how much of y's variance it explains.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit {
    slope: f64,
    intercept: f64,
    r_squared: f64,
}

/// `None` with fewer than two points or no spread in x.
fn least_squares(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - mean_y).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r_squared = if syy > 0.0 {
        sxy * sxy / (sxx * syy)
    } else {
        1.0
    };
    Some(Fit {
        slope,
        intercept: mean_y - slope * mean_x,
        r_squared,
    })
}

/// Every value above the one before it.
fn rises_monotonically(values: &[f64]) -> bool {
    values.windows(2).all(|w| w[1] > w[0])
}

/// Each value divided by the first.
fn normalised(values: &[f64]) -> Vec<f64> {
    let base = values.first().copied().unwrap_or(f64::NAN);
    values.iter().map(|v| v / base).collect()
}

/// One engine's curves and fits, from its measurements.
struct Shape {
    /// Per size: the median prompt tokens the server counted, median TTFT, min, max.
    ttft: Vec<(usize, f64, f64, f64, f64)>,
    /// Per batch: batch, median TPOT, min, max, median output tokens, median overlap.
    tpot: Vec<(usize, f64, f64, f64, f64, f64)>,
    /// TTFT ms against thousands of prompt tokens.
    ttft_fit: Option<Fit>,
    /// TPOT ms against the batch size.
    tpot_fit: Option<Fit>,
    cache_hits: f64,
}

impl Shape {
    fn of(measured: &Measured) -> Shape {
        let ttft: Vec<(usize, f64, f64, f64, f64)> = measured
            .ttft
            .iter()
            .map(|p| {
                let (lo, hi) = min_max(&p.ttft_ms);
                (
                    p.target,
                    median_count(&p.tokens),
                    median(&p.ttft_ms),
                    lo,
                    hi,
                )
            })
            .collect();
        let tpot: Vec<(usize, f64, f64, f64, f64, f64)> = measured
            .tpot
            .iter()
            .map(|p| {
                let (lo, hi) = min_max(&p.tpot_ms);
                let tokens = median_count(&p.tokens);
                (
                    p.batch,
                    median(&p.tpot_ms),
                    lo,
                    hi,
                    tokens,
                    median(&p.overlap),
                )
            })
            .collect();
        let ttft_points: Vec<(f64, f64)> = ttft.iter().map(|t| (t.1 / 1000.0, t.2)).collect();
        let tpot_points: Vec<(f64, f64)> = tpot.iter().map(|t| (t.0 as f64, t.1)).collect();
        Shape {
            ttft_fit: least_squares(&ttft_points),
            tpot_fit: least_squares(&tpot_points),
            ttft,
            tpot,
            cache_hits: measured.ttft_cache_hits,
        }
    }

    fn ttft_medians(&self) -> Vec<f64> {
        self.ttft.iter().map(|t| t.2).collect()
    }

    fn tpot_medians(&self) -> Vec<f64> {
        self.tpot.iter().map(|t| t.1).collect()
    }

    fn ttft_ratio(&self) -> f64 {
        last_over_first(&self.ttft_medians())
    }

    fn tpot_ratio(&self) -> f64 {
        last_over_first(&self.tpot_medians())
    }

    /// The fitted slope over the last two sizes' medians over the slope fitted to all: 1 for
    /// a straight line, above 1 when each token costs more the longer the prompt.
    fn ttft_bend(&self) -> f64 {
        let n = self.ttft.len();
        let (Some(fit), Some(a), Some(b)) = (
            self.ttft_fit,
            self.ttft.get(n.wrapping_sub(2)),
            self.ttft.get(n.wrapping_sub(1)),
        ) else {
            return f64::NAN;
        };
        (b.2 - a.2) / ((b.1 - a.1) / 1000.0) / fit.slope
    }

    /// TPOT's change from the smallest batch to the largest, and how far apart the smallest
    /// batch's own requests were (fastest to slowest).
    fn tpot_change_and_spread(&self) -> (f64, f64) {
        match (self.tpot.first(), self.tpot.last()) {
            (Some(first), Some(last)) => (last.1 - first.1, first.3 - first.2),
            _ => (f64::NAN, f64::NAN),
        }
    }

    /// The fitted per-token term's share of the fitted TTFT at the largest prompt.
    fn per_token_share(&self) -> f64 {
        let (Some(fit), Some(largest)) = (self.ttft_fit, self.ttft.last()) else {
            return f64::NAN;
        };
        let per_token = fit.slope * largest.1 / 1000.0;
        per_token / (fit.intercept + per_token)
    }

    /// The fitted per-sequence term's share of the fitted TPOT at the largest batch.
    fn per_sequence_share(&self) -> f64 {
        let (Some(fit), Some(largest)) = (self.tpot_fit, self.tpot.last()) else {
            return f64::NAN;
        };
        let per_sequence = fit.slope * largest.0 as f64;
        per_sequence / (fit.intercept + per_sequence)
    }
}

fn last_over_first(values: &[f64]) -> f64 {
    match (values.first(), values.last()) {
        (Some(first), Some(last)) => last / first,
        _ => f64::NAN,
    }
}

struct TtftRow {
    target: usize,
    tokens: f64,
    median: f64,
    low: f64,
    high: f64,
    normalised: f64,
}

impl Row for TtftRow {
    const COLUMNS: &'static [Column] = &[
        Column::markdown("tokens aimed at"),
        Column::markdown("prompt tokens (its /tokenize)"),
        Column::markdown("TTFT ms, median"),
        Column::markdown("min / max"),
        Column::markdown("÷ smallest"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Count(self.target),
            Cell::Fixed(self.tokens, 0),
            Cell::Fixed(self.median, 1),
            Cell::Series(vec![self.low, self.high], 1),
            Cell::Fixed(self.normalised, 2),
        ]
    }
}

struct TpotRow {
    batch: usize,
    median: f64,
    low: f64,
    high: f64,
    normalised: f64,
    tokens: f64,
    overlap: f64,
}

impl Row for TpotRow {
    const COLUMNS: &'static [Column] = &[
        Column::markdown("batch (requests at once)"),
        Column::markdown("TPOT ms, median"),
        Column::markdown("min / max"),
        Column::markdown("÷ batch 1"),
        Column::markdown("output tokens per request"),
        Column::markdown("decoding side by side"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Count(self.batch),
            Cell::Fixed(self.median, 2),
            Cell::Series(vec![self.low, self.high], 2),
            Cell::Fixed(self.normalised, 2),
            Cell::Fixed(self.tokens, 0),
            Cell::Percent(self.overlap),
        ]
    }
}

struct ShapeRow {
    what: &'static str,
    sim: String,
    vllm: String,
}

impl Row for ShapeRow {
    const COLUMNS: &'static [Column] = &[
        Column::markdown("").left(),
        Column::markdown("simulator"),
        Column::markdown("vLLM"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.what.to_string()),
            Cell::Text(self.sim.clone()),
            Cell::Text(self.vllm.clone()),
        ]
    }
}

/// What the report says about the run besides the measurements.
struct Context {
    stamp_line: String,
    header: String,
    sim_flags: String,
    vllm: String,
    largest_prompt: usize,
}

fn yes_no(yes: bool) -> &'static str {
    if yes {
        "yes"
    } else {
        "no"
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.0} %", fraction * 100.0)
}

fn engine_tables(title: &str, shape: &Shape) -> String {
    let ttft_norm = normalised(&shape.ttft_medians());
    let ttft_rows: Vec<TtftRow> = shape
        .ttft
        .iter()
        .zip(ttft_norm)
        .map(|(t, normalised)| TtftRow {
            target: t.0,
            tokens: t.1,
            median: t.2,
            low: t.3,
            high: t.4,
            normalised,
        })
        .collect();
    let tpot_norm = normalised(&shape.tpot_medians());
    let tpot_rows: Vec<TpotRow> = shape
        .tpot
        .iter()
        .zip(tpot_norm)
        .map(|(t, normalised)| TpotRow {
            batch: t.0,
            median: t.1,
            low: t.2,
            high: t.3,
            normalised,
            tokens: t.4,
            overlap: t.5,
        })
        .collect();
    format!(
        "### {title}\n\nTTFT against uncached prompt tokens:\n\n{}\nTPOT against the batch \
         (decoding side by side: of a request's decoding, the median share during which all \
         the batch's requests were decoding):\n\n{}\n",
        markdown_table(&ttft_rows),
        markdown_table(&tpot_rows)
    )
}

fn fit_text(fit: Option<Fit>, unit: &str, decimals: usize) -> String {
    fit.map_or("no fit".into(), |f| {
        format!(
            "{:+.decimals$} ms {unit}, intercept {:.decimals$} ms (R² {:.3})",
            f.slope, f.intercept, f.r_squared
        )
    })
}

fn render(context: &Context, sim: &Measured, vllm: &Measured) -> String {
    let (s, v) = (Shape::of(sim), Shape::of(vllm));
    let smallest = s.ttft.first().map_or(0, |t| t.0);
    let largest = s.ttft.last().map_or(0, |t| t.0);
    let biggest_batch = s.tpot.last().map_or(0, |t| t.0);
    let mut out = format!("{}\n{}\n\n", context.stamp_line, context.header);
    out.push_str("## The batching engine against a real vLLM\n\n");
    out.push_str(&format!(
        "Two engines, driven directly (no Envoy) by the same client with the same requests \
         (`/v1/completions`, streamed, `ignore_eos`): the simulator's batching engine, one pod \
         with the routing-quality flags (`{}`, plus `--model {MODEL}`), then {}. TTFT: one \
         request at a time, fresh random words per prompt so nothing is cached, {TTFT_MAX_TOKENS} \
         output tokens, one warm-up per size discarded, then {TTFT_REPEATS} rounds over the \
         sizes; median per size. The sizes aim at {} tokens, the largest cut to {} (the real \
         server's max-model-len {MAX_MODEL_LEN} less the output); the prompt tokens are each \
         server's own `/tokenize` count. TPOT: B requests at once, {TPOT_PROMPT_TOKENS}-token \
         prompts, {TPOT_MAX_TOKENS} output tokens each, B up to the real server's \
         max-num-seqs ({MAX_NUM_SEQS}); one warm-up batch, then {TPOT_REPEATS} batches; per \
         request (last token - first token) / (tokens - 1), median over the batches' requests.\n\n",
        context.sim_flags,
        context.vllm,
        TARGET_TOKENS
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        context.largest_prompt,
    ));
    out.push_str(
        "The absolute times have nothing in common (the simulator: an 8B model's step costs on \
         an H100, time-scaled; vLLM: a tiny random-weight model on one CPU core), so compare \
         the normalised columns and the fits: does each curve rise, how straight, and which \
         term (fixed or per token, fixed or per sequence) dominates.\n\n",
    );
    out.push_str(&engine_tables("Simulator (batching engine)", &s));
    out.push_str(&engine_tables("vLLM (CPU)", &v));
    out.push_str("### Shape\n\n");
    let ttft_fit_row = |shape: &Shape| fit_text(shape.ttft_fit, "per 1,000 tokens", 1);
    let tpot_fit_row = |shape: &Shape| fit_text(shape.tpot_fit, "per added sequence", 2);
    let rows = vec![
        ShapeRow {
            what: "TTFT, least squares on the medians",
            sim: ttft_fit_row(&s),
            vllm: ttft_fit_row(&v),
        },
        ShapeRow {
            what: "per-token share of the fitted TTFT at the largest prompt",
            sim: percent(s.per_token_share()),
            vllm: percent(v.per_token_share()),
        },
        ShapeRow {
            what: "TTFT slope over the two largest sizes ÷ the fitted slope (1: straight)",
            sim: format!("{:.2}", s.ttft_bend()),
            vllm: format!("{:.2}", v.ttft_bend()),
        },
        ShapeRow {
            what: "TTFT largest ÷ smallest prompt",
            sim: format!("{:.2}", s.ttft_ratio()),
            vllm: format!("{:.2}", v.ttft_ratio()),
        },
        ShapeRow {
            what: "TTFT rises monotonically",
            sim: yes_no(rising(&s.ttft_medians())).into(),
            vllm: yes_no(rising(&v.ttft_medians())).into(),
        },
        ShapeRow {
            what: "prefix-cache hits during the TTFT requests (tokens)",
            sim: format!("{:.0}", s.cache_hits),
            vllm: format!("{:.0}", v.cache_hits),
        },
        ShapeRow {
            what: "TPOT, least squares on the medians",
            sim: tpot_fit_row(&s),
            vllm: tpot_fit_row(&v),
        },
        ShapeRow {
            what: "per-sequence share of the fitted TPOT at the largest batch",
            sim: percent(s.per_sequence_share()),
            vllm: percent(v.per_sequence_share()),
        },
        ShapeRow {
            what: "TPOT largest ÷ smallest batch",
            sim: format!("{:.2}", s.tpot_ratio()),
            vllm: format!("{:.2}", v.tpot_ratio()),
        },
        ShapeRow {
            what: "TPOT rises monotonically",
            sim: yes_no(rising(&s.tpot_medians())).into(),
            vllm: yes_no(rising(&v.tpot_medians())).into(),
        },
    ];
    out.push_str(&markdown_table(&rows));
    out.push('\n');
    out.push_str(&verdict(&s, &v, smallest, largest, biggest_batch));
    out
}

fn rising(values: &[f64]) -> bool {
    rises_monotonically(values)
}

/// The shape statements, every figure from the run.
fn verdict(s: &Shape, v: &Shape, smallest: usize, largest: usize, batch: usize) -> String {
    let both = |a: bool, b: bool, what: &str| match (a, b) {
        (true, true) => format!("both engines' {what} rise monotonically"),
        (false, false) => format!("neither engine's {what} rise monotonically"),
        (true, false) => format!("the simulator's {what} rise monotonically, vLLM's do not"),
        (false, true) => format!("vLLM's {what} rise monotonically, the simulator's do not"),
    };
    let ttft_rise = both(
        rising(&s.ttft_medians()),
        rising(&v.ttft_medians()),
        "TTFTs",
    );
    let tpot_rise = both(
        rising(&s.tpot_medians()),
        rising(&v.tpot_medians()),
        "TPOTs",
    );
    let r2 = |fit: Option<Fit>| fit.map_or(f64::NAN, |f| f.r_squared);
    let (s_change, s_spread) = s.tpot_change_and_spread();
    let (v_change, v_spread) = v.tpot_change_and_spread();
    format!(
        "- TTFT: {ttft_rise}. From {smallest} to {largest} tokens aimed at, the simulator's \
         grows {:.2}x and vLLM's {:.2}x (simulator ÷ vLLM: {:.2}). Fitted, the per-token term \
         is {} of the simulator's TTFT at the largest prompt and {} of vLLM's: {}. A straight \
         line explains {} of the simulator's variation and {} of vLLM's; over the two largest \
         sizes the simulator's slope is {:.2}x its fitted slope ({}) and vLLM's {:.2}x ({}).\n\
         - TPOT: {tpot_rise}. From 1 to {batch} requests at once the simulator's changes by \
         {s_change:+.2} ms ({:.2}x), {}, and vLLM's by {v_change:+.2} ms ({:.2}x), {}. Fitted, \
         the per-sequence term is {} of the simulator's TPOT at {batch} and {} of vLLM's: {}.\n",
        s.ttft_ratio(),
        v.ttft_ratio(),
        s.ttft_ratio() / v.ttft_ratio(),
        percent(s.per_token_share()),
        percent(v.per_token_share()),
        dominant(s.per_token_share(), v.per_token_share(), "per-token"),
        percent(r2(s.ttft_fit)),
        percent(r2(v.ttft_fit)),
        s.ttft_bend(),
        bend(s.ttft_bend()),
        v.ttft_bend(),
        bend(v.ttft_bend()),
        s.tpot_ratio(),
        against_spread(s_change, s_spread),
        v.tpot_ratio(),
        against_spread(v_change, v_spread),
        percent(s.per_sequence_share()),
        percent(v.per_sequence_share()),
        dominant(
            s.per_sequence_share(),
            v.per_sequence_share(),
            "per-sequence"
        ),
    )
}

/// Which term makes up more of the fitted value, in each engine.
fn dominant(sim: f64, vllm: f64, term: &str) -> String {
    match (sim > 0.5, vllm > 0.5) {
        (true, true) => format!("the {term} term dominates in both"),
        (false, false) => "the fixed term dominates in both".into(),
        (true, false) => format!("the {term} term dominates in the simulator, the fixed in vLLM"),
        (false, true) => format!("the fixed term dominates in the simulator, the {term} in vLLM"),
    }
}

/// A curve's last slope against its fitted one, in words (straight: within 15 %).
fn bend(ratio: f64) -> &'static str {
    if ratio > 1.15 {
        "bending up"
    } else if ratio < 0.85 {
        "bending down"
    } else {
        "straight within 15 %"
    }
}

/// A change against how far apart one point's own requests were.
fn against_spread(change: f64, spread: f64) -> String {
    let side = if change.abs() <= spread {
        "within"
    } else {
        "beyond"
    };
    format!("{side} the {spread:.2} ms between its fastest and slowest request at batch 1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_squares_recovers_a_line_and_rejects_too_little() {
        let points: Vec<(f64, f64)> = (0..5).map(|x| (x as f64, 3.0 + 2.5 * x as f64)).collect();
        let fit = least_squares(&points).expect("a fit");
        assert!((fit.slope - 2.5).abs() < 1e-12);
        assert!((fit.intercept - 3.0).abs() < 1e-12);
        assert!((fit.r_squared - 1.0).abs() < 1e-12);
        assert_eq!(least_squares(&[(1.0, 2.0)]), None);
        assert_eq!(least_squares(&[(1.0, 2.0), (1.0, 3.0)]), None);
        let noisy = least_squares(&[(0.0, 0.0), (1.0, 2.0), (2.0, 1.0), (3.0, 3.0)]).expect("fit");
        assert!((noisy.slope - 0.8).abs() < 1e-12);
        assert!((noisy.intercept - 0.3).abs() < 1e-12);
        assert!(noisy.r_squared > 0.0 && noisy.r_squared < 1.0);
    }

    #[test]
    fn monotonic_means_every_step_up() {
        assert!(rises_monotonically(&[1.0, 2.0, 2.5]));
        assert!(!rises_monotonically(&[1.0, 2.0, 2.0]));
        assert!(!rises_monotonically(&[1.0, 0.5, 3.0]));
        assert!(rises_monotonically(&[1.0]));
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(normalised(&[2.0, 3.0, 8.0]), vec![1.0, 1.5, 4.0]);
        assert_eq!(min_max(&[2.0, 5.0, 1.0]), (1.0, 5.0));
    }

    #[test]
    fn sizes_fit_the_real_server_and_batches_reach_its_sequences() {
        assert_eq!(sizes(2040), vec![64, 256, 512, 1024, 2040]);
        assert_eq!(sizes(300), vec![64, 256, 300]);
        assert_eq!(batches(4), vec![1, 2, 4]);
        assert_eq!(batches(6), vec![1, 2, 4, 6]);
        assert_eq!(batches(1), vec![1]);
        assert!(largest_prompt() + TTFT_MAX_TOKENS <= MAX_MODEL_LEN);
    }

    #[test]
    fn prompts_are_fresh_words_of_the_size_asked() {
        let plan = Plan::new();
        let mut all: Vec<&String> = plan.ttft.iter().flat_map(|(_, p)| p).collect();
        all.extend(plan.tpot.iter().flat_map(|(_, r)| r.iter().flatten()));
        let count = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), count, "every prompt differs");
        for (tokens, prompts) in &plan.ttft {
            for prompt in prompts {
                assert_eq!(prompt.split_whitespace().count() + 1, *tokens);
                assert!(prompt.starts_with(' '));
            }
        }
        assert!(WORDS.iter().all(|w| w.len() <= 6));
    }

    #[test]
    fn events_count_tokens_and_read_usage() {
        let token = r#"data: {"choices":[{"index":0,"text":" tok0"}]}"#;
        assert_eq!(event_tokens(token), (1, None));
        let usage = r#"data: {"choices":[],"usage":{"completion_tokens":64}}"#;
        assert_eq!(event_tokens(usage), (0, Some(64)));
        assert_eq!(event_tokens("data: [DONE]"), (0, None));
        let streamed = Streamed {
            sent: Instant::now(),
            first: Duration::from_millis(100),
            last: Duration::from_millis(730),
            tokens: 64,
        };
        assert_eq!(streamed.tpot(), Some(Duration::from_millis(10)));
        let one = Streamed {
            tokens: 1,
            ..streamed
        };
        assert_eq!(one.tpot(), None);
    }

    #[test]
    fn overlap_is_the_share_of_decoding_done_side_by_side() {
        let origin = Instant::now();
        let at = |sent_ms: u64, first_ms: u64, last_ms: u64| Streamed {
            sent: origin + Duration::from_millis(sent_ms),
            first: Duration::from_millis(first_ms),
            last: Duration::from_millis(last_ms),
            tokens: 64,
        };
        let together = overlap(&[at(0, 10, 110), at(20, 10, 100)]);
        assert!((together - 80.0 / 95.0).abs() < 1e-9, "{together}");
        assert_eq!(overlap(&[at(0, 10, 110), at(200, 10, 110)]), 0.0);
        assert_eq!(overlap(&[at(0, 10, 110)]), 1.0);
        assert!(overlap(&[]).is_nan());
    }

    fn measured(ttft: &[(usize, f64)], tpot: &[(usize, f64)]) -> Measured {
        Measured {
            ttft: ttft
                .iter()
                .map(|&(tokens, ms)| SizePoint {
                    target: tokens,
                    tokens: vec![tokens; 3],
                    ttft_ms: vec![ms - 1.0, ms, ms + 1.0],
                })
                .collect(),
            tpot: tpot
                .iter()
                .map(|&(batch, ms)| BatchPoint {
                    batch,
                    tpot_ms: vec![ms; 3],
                    tokens: vec![64; 3],
                    overlap: vec![1.0; 3],
                })
                .collect(),
            ttft_cache_hits: 0.0,
        }
    }

    #[test]
    fn the_report_holds_both_engines_and_computed_statements() {
        let context = Context {
            stamp_line: "<!-- bench-stamp: abc clean -->".into(),
            header: "_header_".into(),
            sim_flags: "--batching".into(),
            vllm: "vLLM test".into(),
            largest_prompt: 2040,
        };
        // The simulator: 10 ms + 20 ms per 1,000 tokens; vLLM: flat then a jump.
        let sim = measured(
            &[(64, 11.28), (1064, 31.28), (2064, 51.28)],
            &[(1, 20.0), (2, 21.0), (4, 23.0)],
        );
        let vllm = measured(
            &[(64, 5.0), (1064, 4.0), (2064, 50.0)],
            &[(1, 10.0), (2, 10.0), (4, 10.0)],
        );
        let text = render(&context, &sim, &vllm);
        assert!(text.starts_with("<!-- bench-stamp: abc clean -->\n_header_\n"));
        assert!(text.contains("### Simulator (batching engine)"));
        assert!(text.contains("### vLLM (CPU)"));
        assert!(text.contains("| 64 | 64 | 11.3 | 10.3 / 12.3 | 1.00 |"));
        assert!(text.contains("| 2064 | 2064 | 51.3 | 50.3 / 52.3 | 4.55 |"));
        assert!(text.contains("| 4 | 23.00 | 23.00 / 23.00 | 1.15 | 64 | 100.0 % |"));
        assert!(text.contains("+20.0 ms per 1,000 tokens, intercept 10.0 ms (R² 1.000)"));
        assert!(text.contains("+1.00 ms per added sequence, intercept 19.00 ms (R² 1.000)"));
        assert!(text.contains("| TTFT rises monotonically | yes | no |"));
        assert!(text.contains("| TPOT rises monotonically | yes | no |"));
        assert!(text.contains("the simulator's TTFTs rise monotonically, vLLM's do not"));
        assert!(text.contains("grows 4.55x and vLLM's 10.00x"));
        assert!(text.contains("the per-token term dominates in both"));
        assert!(text.contains(
            "the simulator's slope is 1.00x its fitted slope (straight within 15 %) and vLLM's \
             2.04x (bending up)"
        ));
        assert!(text.contains(
            "the simulator's changes by +3.00 ms (1.15x), beyond the 0.00 ms between its \
             fastest and slowest request at batch 1, and vLLM's by +0.00 ms (1.00x), within"
        ));
        assert!(text.contains("is 17 % of the simulator's TPOT at 4 and 0 % of vLLM's: the fixed term dominates in both"));
    }
}
