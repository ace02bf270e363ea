//! A simulated vLLM model server: a real HTTP/1.1 server in front of an engine that queues,
//! prefills, decodes, caches prefixes on token blocks and loads LoRA adapters, with vLLM's
//! metrics. It shares no code with the picker (a test, `tests/simulator_independent.rs`,
//! keeps it so): its own request parsing, tokenizer, chat template and prefix cache, so hit
//! rates measured here can show the picker's estimation errors instead of repeating them.
//!
//! ```text
//! cargo run --release --example model-server-sim -- --port 8001 --name pod-a
//! ```
//!
//! Timing model (every duration multiplied by `--time-scale`):
//! 1. A request is parsed, templated (chat) and tokenized (`tokenizer.rs`), and its full
//!    prompt blocks hashed (`kv_cache.rs`).
//! 2. It waits, first come first served, for a sequence slot (`--max-num-seqs`), KV blocks for
//!    its prompt and `max_tokens` (`--kv-blocks` of `--block-size` tokens; cached prefix blocks
//!    are reused, least recently freed blocks evicted), and a LoRA slot (`--max-lora`; a
//!    request that cannot get one is deferred while later ones go ahead) (`engine.rs`).
//! 3. An adapter that was not resident costs `--lora-load-ms`.
//! 4. Prefill costs `--prefill-us-per-token` per prompt token NOT served from the prefix cache.
//! 5. Each output token costs one decode step of `--decode-ms-per-token x (1 + 0.02 x running
//!    requests)`; streamed responses send each token as it is decoded.
//! 6. The request's blocks return to the cache (still cached until evicted).
//!
//! With `--batching` steps 2 to 5 are the batching engine's instead (`batching.rs`): vLLM V1's
//! continuous batching, every engine step shared by the decodes and prefill chunks of up to
//! `--max-num-seqs` sequences within a token budget, its time growing with the tokens in it,
//! KV blocks taken as sequences grow and preemption when they run out.
//!
//! Flags (all optional): --port N (0 = any; the bound address is printed first), --host
//! 127.x.y.z (another loopback address, default 127.0.0.1), --listeners N (N pods in one
//! process, named NAME-0..; for large pools), --name NAME, --model NAME (default
//! meta-llama/Llama-3.1-8B-Instruct), --max-num-seqs N (8), --max-lora N (2), --adapters a,b,
//! --lora-load-ms F (0), --prefill-us-per-token F (100), --decode-ms-per-token F (10),
//! --kv-blocks N (4096), --block-size N (16 tokens), --time-scale F (1), --loaded-adapters a,b
//! (resident at start), --background-waiting N (queued work from elsewhere),
//! --background-running N, --background-kv F (added to the reported KV usage),
//! --stream-interval N (1: streamed tokens written N to a chunk, the first alone), --batching
//! (the batching engine, below), --max-num-batched-tokens N (8192), --step-fixed-ms F,
//! --step-ms-per-token F, --step-ms-per-context-token F (an 8B model on one H100, see
//! `batching.rs`), --extra-metrics TEXT (raw exposition lines appended to /metrics, `\n` separated),
//! --metrics-padding BYTES (filler series appended until /metrics is at least that long: an
//! oversized page), --fault MODE (none|error|slow|hang|die), --drain-timeout-s F (30: how long
//! a graceful stop waits).
//!
//! Runtime control: `POST /admin/fault` (`{"mode":"error","status":500,"scope":"inference"}`;
//! the scope `inference` spares `/metrics`, `metrics` hits only it, as
//! `{"mode":"slow","delay_ms":3000,"scope":"metrics"}` for a busy server's late metrics page; `{"mode":"refuse","for_ms":2000}` closes the listening socket,
//! so new connections are refused while open ones are served, for 2 s or until another mode is
//! set), `POST /admin/load` with a JSON body (`background_waiting`, `background_running`,
//! `background_kv`, `extra_metrics`, `metrics_padding_bytes`), `GET`/`POST /admin/stats` for
//! counters (`prefix_queries` / `prefix_hits` are prompt tokens, from the token-block cache).
//! A request header `x-sim-response-id` pins the response id so tests can compare responses
//! byte for byte. SIGTERM stops the pod gracefully (`lifecycle.rs`): no new connections, the
//! requests in flight finish (`connection: close`), idle connections close, then it exits.

#[path = "../../tests/support/http1.rs"]
mod http1;

mod api;
mod batching;
mod engine;
mod kv_cache;
mod lifecycle;
mod metrics;
mod server;
mod tokenizer;

use batching::{BatchSettings, StepCost};
use std::io::Write;
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// One pod's configuration, from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    pub port: u16,
    pub host: String,
    pub listeners: u16,
    pub name: String,
    pub model: String,
    pub max_num_seqs: usize,
    pub max_lora: usize,
    pub adapters: Vec<String>,
    /// Time to load an adapter that is not resident, before the request's prefill.
    pub lora_load_ms: f64,
    pub prefill_us_per_token: f64,
    pub decode_ms_per_token: f64,
    pub kv_blocks: usize,
    pub block_size: usize,
    pub time_scale: f64,
    pub loaded_adapters: Vec<String>,
    pub background_waiting: usize,
    pub background_running: usize,
    pub background_kv: f64,
    pub extra_metrics: String,
    pub metrics_padding_bytes: usize,
    pub fault: Option<String>,
    /// On SIGTERM, how long open connections may take to finish before the process exits.
    pub drain_timeout_s: f64,
    /// Streamed tokens per chunk written (the first token always alone).
    pub stream_interval: usize,
    /// The batching engine (`--batching`) and its settings; `None`: the slot engine.
    pub batching: Option<BatchSettings>,
}

impl Settings {
    pub fn from_args(args: &[String]) -> Settings {
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
        };
        let number =
            |flag: &str, default: f64| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
        let list = |flag: &str| {
            value(flag)
                .map(|list| {
                    list.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        Settings {
            port: number("--port", 0.0) as u16,
            // Loopback only: 127.0.0.1 unless --host names another 127.x.y.z (a "pod IP").
            host: value("--host")
                .filter(|host| host.starts_with("127."))
                .unwrap_or_else(|| "127.0.0.1".into()),
            listeners: (number("--listeners", 1.0) as u16).max(1),
            name: value("--name").unwrap_or_else(|| "sim".into()),
            model: value("--model").unwrap_or_else(|| "meta-llama/Llama-3.1-8B-Instruct".into()),
            max_num_seqs: number("--max-num-seqs", 8.0) as usize,
            max_lora: number("--max-lora", 2.0) as usize,
            adapters: list("--adapters"),
            lora_load_ms: number("--lora-load-ms", 0.0),
            prefill_us_per_token: number("--prefill-us-per-token", 100.0),
            decode_ms_per_token: number("--decode-ms-per-token", 10.0),
            kv_blocks: (number("--kv-blocks", 4096.0) as usize).max(1),
            block_size: (number("--block-size", 16.0) as usize).max(1),
            time_scale: number("--time-scale", 1.0),
            loaded_adapters: list("--loaded-adapters"),
            background_waiting: number("--background-waiting", 0.0) as usize,
            background_running: number("--background-running", 0.0) as usize,
            background_kv: number("--background-kv", 0.0),
            extra_metrics: value("--extra-metrics")
                .map(|text| text.replace("\\n", "\n"))
                .unwrap_or_default(),
            metrics_padding_bytes: number("--metrics-padding", 0.0) as usize,
            fault: value("--fault"),
            drain_timeout_s: number("--drain-timeout-s", 30.0),
            stream_interval: (number("--stream-interval", 1.0) as usize).max(1),
            batching: args.iter().any(|a| a == "--batching").then(|| {
                let h100 = StepCost::H100_LLAMA_8B;
                BatchSettings {
                    max_num_batched_tokens: (number("--max-num-batched-tokens", 8192.0) as usize)
                        .max(1),
                    cost: StepCost {
                        fixed_ms: number("--step-fixed-ms", h100.fixed_ms),
                        ms_per_token: number("--step-ms-per-token", h100.ms_per_token),
                        ms_per_context_token: number(
                            "--step-ms-per-context-token",
                            h100.ms_per_context_token,
                        ),
                    },
                    lora_load_ms: number("--lora-load-ms", 0.0),
                }
            }),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let settings = Settings::from_args(&args);
    // --listeners N: N independent pods in one process (large pools for the benchmarks), on
    // consecutive ports from --port, or on any free ports when --port is 0.
    let mut pods = Vec::new();
    for n in 0..settings.listeners {
        let port = if settings.port == 0 {
            0
        } else {
            settings.port.saturating_add(n)
        };
        let listener = match TcpListener::bind((settings.host.as_str(), port)) {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!(
                    "model-server-sim: cannot bind {}:{port}: {error}",
                    settings.host
                );
                std::process::exit(2);
            }
        };
        let address = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        println!("listening on {address}");
        let mut settings = settings.clone();
        if settings.listeners > 1 {
            settings.name = format!("{}-{n}", settings.name);
        }
        pods.push((listener, settings));
    }
    let _ = std::io::stdout().flush();
    let mut doors = Vec::new();
    let accept_threads: Vec<_> = pods
        .into_iter()
        .filter_map(|(listener, settings)| {
            let door = lifecycle::Door::new(listener.local_addr().ok()?);
            doors.push(Arc::clone(&door));
            let batching = settings.batching.is_some();
            let pod = Arc::new(server::Pod::new(settings, Arc::clone(&door)));
            if batching {
                let engine = Arc::clone(&pod);
                thread::spawn(move || engine.run_batches());
            }
            Some(thread::spawn(move || {
                door.run(listener, move |request, out| pod.handle(request, out))
            }))
        })
        .collect();
    lifecycle::stop_gracefully_on_sigterm(
        doors,
        Duration::from_secs_f64(settings.drain_timeout_s.max(0.0)),
    );
    // The accept loops return when their pods drain; the SIGTERM thread then exits.
    for accept in accept_threads {
        let _ = accept.join();
    }
    loop {
        thread::park();
    }
}
