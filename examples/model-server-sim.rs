//! A simulated vLLM model server: a real HTTP/1.1 server with an engine that queues, prefills,
//! decodes, caches prefixes and loads LoRA adapters, and exposes vLLM's metric names.
//!
//! ```text
//! cargo run --release --example model-server-sim -- --port 8001 --name pod-a
//! ```
//! Flags (all optional): --port N (0 = any; the bound address is printed first), --host 127.x.y.z
//! (another loopback address, default 127.0.0.1), --listeners N (N pods in one process, named
//! NAME-0..; for large pools), --name NAME,
//! --model NAME, --max-num-seqs N, --max-lora N, --adapters a,b, --lora-load-ms F,
//! --prefill-us-per-token F,
//! --decode-ms-per-token F, --kv-blocks N, --block-size N, --time-scale F,
//! --loaded-adapters a,b (resident at start), --background-waiting N (queued work from
//! elsewhere), --background-running N, --background-kv F, --extra-metrics TEXT (raw exposition
//! lines appended to /metrics, `\n` separated), --fault MODE (none|error|slow|hang|die).
//! Runtime control: `POST /admin/fault` (`{"mode":"error","status":500,"scope":"inference"}`;
//! the scope spares `/metrics`) and `POST /admin/load` with a JSON body,
//! `GET /admin/stats` for counters. A request header `x-sim-response-id` pins the response id
//! so tests can compare responses byte for byte.

use inference_picker::request::{parse_body, ApiKind, InferenceRequest};
use inference_picker::scheduling::plugins::scorer::prefix_cache_scorer::block_hashes;
use inference_picker::scheduling::prefix_index::PrefixIndex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone)]
struct Settings {
    port: u16,
    name: String,
    model: String,
    max_num_seqs: usize,
    max_lora: usize,
    adapters: Vec<String>,
    /// Time to load an adapter that is not resident, before the request's prefill.
    lora_load_ms: f64,
    prefill_us_per_token: f64,
    decode_ms_per_token: f64,
    kv_blocks: usize,
    block_size: usize,
    time_scale: f64,
}

#[derive(Debug, Clone, PartialEq)]
enum Fault {
    Error(u16),
    Slow(u64),
    Hang,
}

#[derive(Default)]
struct Engine {
    waiting: usize,
    running: usize,
    /// Tokens held in KV cache by running requests.
    kv_tokens: usize,
    /// Requests running per adapter.
    running_adapters: HashMap<String, usize>,
    /// Adapters resident in GPU memory, least recently used first (at most `max_lora`).
    loaded_adapters: Vec<String>,
    waiting_adapters: HashMap<String, usize>,
    background_waiting: usize,
    background_running: usize,
    background_kv: f64,
    /// Raw exposition lines appended to `/metrics` (other models' series, custom gauges).
    extra_metrics: String,
    /// `x-prefiller-host-port` values seen on inference requests, with counts.
    prefillers_seen: HashMap<String, u64>,
    prefix: Option<PrefixIndex>,
    prefix_queries: u64,
    prefix_hits: u64,
    requests_total: u64,
    metrics_scrapes: u64,
    fault: Option<Fault>,
    /// The fault spares `/metrics`: the pod looks healthy to scrapes but fails requests.
    fault_spares_metrics: bool,
}

struct Sim {
    settings: Settings,
    engine: Mutex<Engine>,
    slot_freed: Condvar,
    started: Instant,
}

fn main() {
    let settings = parse_args();
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.windows(2)
            .find(|pair| pair[0] == name)
            .map(|pair| pair[1].clone())
    };
    // Loopback only: 127.0.0.1 unless --host names another 127.x.y.z (a "pod IP" in tests).
    let host = flag("--host")
        .filter(|host| host.starts_with("127."))
        .unwrap_or_else(|| "127.0.0.1".into());
    // --listeners N: N independent pods in one process (large pools for the benchmarks), on
    // consecutive ports from --port, or on any free ports when --port is 0.
    let listeners: u16 = flag("--listeners")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut pods = Vec::new();
    for n in 0..listeners {
        let port = if settings.port == 0 {
            0
        } else {
            settings.port.saturating_add(n)
        };
        let listener = match TcpListener::bind((host.as_str(), port)) {
            Ok(listener) => listener,
            Err(error) => {
                eprintln!("model-server-sim: cannot bind {host}:{port}: {error}");
                std::process::exit(2);
            }
        };
        let address = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        println!("listening on {address}");
        let mut settings = settings.clone();
        if listeners > 1 {
            settings.name = format!("{}-{n}", settings.name);
        }
        pods.push((listener, settings));
    }
    let _ = std::io::stdout().flush();
    let mut accept_threads = Vec::new();
    for (listener, settings) in pods {
        let sim = Arc::new(Sim {
            engine: Mutex::new(engine_from_args(&settings)),
            settings,
            slot_freed: Condvar::new(),
            started: Instant::now(),
        });
        accept_threads.push(thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sim = Arc::clone(&sim);
                thread::spawn(move || serve_connection(&sim, stream));
            }
        }));
    }
    for accept in accept_threads {
        let _ = accept.join();
    }
}

/// A fresh engine with the load, metrics and fault the command line asks for.
fn engine_from_args(settings: &Settings) -> Engine {
    let mut engine = Engine {
        prefix: Some(PrefixIndex::new(settings.kv_blocks.max(1))),
        ..Engine::default()
    };
    let mut extra_fault = None;
    for pair in std::env::args().collect::<Vec<_>>().windows(2) {
        match pair[0].as_str() {
            "--background-waiting" => engine.background_waiting = pair[1].parse().unwrap_or(0),
            "--background-kv" => engine.background_kv = pair[1].parse().unwrap_or(0.0),
            "--background-running" => engine.background_running = pair[1].parse().unwrap_or(0),
            "--extra-metrics" => engine.extra_metrics = pair[1].replace("\\n", "\n"),
            "--fault" => extra_fault = Some(pair[1].clone()),
            "--loaded-adapters" => {
                engine.loaded_adapters = pair[1]
                    .split(',')
                    .filter(|a| !a.is_empty())
                    .map(String::from)
                    .collect()
            }
            _ => {}
        }
    }
    engine.fault = extra_fault.and_then(|mode| fault_from(&json!({ "mode": mode })));
    engine
}

fn parse_args() -> Settings {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let number =
        |flag: &str, default: f64| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    Settings {
        port: number("--port", 0.0) as u16,
        name: value("--name").unwrap_or_else(|| "sim".into()),
        model: value("--model").unwrap_or_else(|| "meta-llama/Llama-3.1-8B-Instruct".into()),
        max_num_seqs: number("--max-num-seqs", 8.0) as usize,
        max_lora: number("--max-lora", 2.0) as usize,
        adapters: value("--adapters")
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        lora_load_ms: number("--lora-load-ms", 0.0),
        prefill_us_per_token: number("--prefill-us-per-token", 100.0),
        decode_ms_per_token: number("--decode-ms-per-token", 10.0),
        kv_blocks: number("--kv-blocks", 4096.0) as usize,
        block_size: number("--block-size", 16.0) as usize,
        time_scale: number("--time-scale", 1.0),
    }
}

fn fault_from(body: &Value) -> Option<Fault> {
    match body.get("mode").and_then(Value::as_str).unwrap_or("none") {
        "error" => Some(Fault::Error(
            body.get("status").and_then(Value::as_u64).unwrap_or(500) as u16,
        )),
        "slow" => Some(Fault::Slow(
            body.get("delay_ms").and_then(Value::as_u64).unwrap_or(1000),
        )),
        "hang" => Some(Fault::Hang),
        "die" => std::process::exit(1),
        _ => None,
    }
}

struct HttpRequest {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpRequest {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<HttpRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut request = HttpRequest {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    if request
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).ok()?;
            let size = usize::from_str_radix(size_line.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            request.body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = request
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        request.body = vec![0; length];
        reader.read_exact(&mut request.body).ok()?;
    }
    Some(request)
}

fn serve_connection(sim: &Sim, stream: TcpStream) {
    // Headers and body go out in separate writes; without this Nagle's algorithm and delayed
    // ACKs add ~40 ms to every response.
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut writer = write_half;
    while let Some(request) = read_request(&mut reader) {
        let close = request
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if !handle(sim, &request, &mut writer) || close {
            return;
        }
    }
}

/// Returns false when the connection must be closed.
fn handle(sim: &Sim, request: &HttpRequest, out: &mut TcpStream) -> bool {
    let path = request.path.split('?').next().unwrap_or("");
    if path.starts_with("/admin/") {
        return admin(sim, request, path, out);
    }
    let fault = {
        let engine = lock(sim);
        if engine.fault_spares_metrics && path == "/metrics" {
            None
        } else {
            engine.fault.clone()
        }
    };
    match fault {
        Some(Fault::Error(status)) => {
            return respond_json(
                sim,
                out,
                status,
                &json!({"error": {"message": "injected fault", "type": "server_error", "code": status}}),
            )
        }
        Some(Fault::Slow(ms)) => thread::sleep(Duration::from_millis(ms)),
        Some(Fault::Hang) => {
            thread::sleep(Duration::from_secs(3600));
            return false;
        }
        _ => {}
    }
    match (request.method.as_str(), path) {
        ("GET", "/metrics") => {
            let text = metrics_text(sim);
            respond(sim, out, 200, "text/plain; version=0.0.4", text.as_bytes())
        }
        ("GET", "/health") => respond(sim, out, 200, "text/plain", b"ok"),
        ("GET", "/v1/models") => {
            let mut models =
                vec![json!({"id": sim.settings.model, "object": "model", "owned_by": "sim"})];
            for adapter in &sim.settings.adapters {
                models
                    .push(json!({"id": adapter, "object": "model", "parent": sim.settings.model}));
            }
            respond_json(sim, out, 200, &json!({"object": "list", "data": models}))
        }
        ("POST", _) => match ApiKind::from_path(path) {
            ApiKind::Other => respond_json(sim, out, 404, &error_body("no such route", 404)),
            api => inference(sim, api, request, out),
        },
        _ => respond_json(sim, out, 404, &error_body("no such route", 404)),
    }
}

fn error_body(message: &str, code: u16) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "code": code}})
}

fn lock(sim: &Sim) -> std::sync::MutexGuard<'_, Engine> {
    sim.engine
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn admin(sim: &Sim, request: &HttpRequest, path: &str, out: &mut TcpStream) -> bool {
    let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    match path {
        "/admin/fault" => {
            let fault = fault_from(&body);
            let mut engine = lock(sim);
            engine.fault = fault;
            engine.fault_spares_metrics =
                body.get("scope").and_then(Value::as_str) == Some("inference");
        }
        "/admin/load" => {
            let mut engine = lock(sim);
            if let Some(waiting) = body.get("background_waiting").and_then(Value::as_u64) {
                engine.background_waiting = waiting as usize;
            }
            if let Some(kv) = body.get("background_kv").and_then(Value::as_f64) {
                engine.background_kv = kv;
            }
            if let Some(running) = body.get("background_running").and_then(Value::as_u64) {
                engine.background_running = running as usize;
            }
            if let Some(extra) = body.get("extra_metrics").and_then(Value::as_str) {
                engine.extra_metrics = extra.to_string();
            }
        }
        _ => {}
    }
    let stats = {
        let engine = lock(sim);
        json!({
            "name": sim.settings.name,
            "requests_total": engine.requests_total,
            "metrics_scrapes": engine.metrics_scrapes,
            "waiting": engine.waiting,
            "running": engine.running,
            "prefix_queries": engine.prefix_queries,
            "prefix_hits": engine.prefix_hits,
            "prefillers_seen": engine.prefillers_seen,
        })
    };
    respond_json(sim, out, 200, &stats)
}

fn metrics_text(sim: &Sim) -> String {
    let settings = &sim.settings;
    let mut engine = lock(sim);
    engine.metrics_scrapes += 1;
    let capacity_tokens = (settings.kv_blocks * settings.block_size).max(1) as f64;
    let kv = (engine.kv_tokens as f64 / capacity_tokens + engine.background_kv).min(1.0);
    let model = &settings.model;
    let running: Vec<&str> = engine.loaded_adapters.iter().map(String::as_str).collect();
    let waiting: Vec<&str> = engine.waiting_adapters.keys().map(String::as_str).collect();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    format!(
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{model}\"}} {waiting_count}\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{model}\"}} {running_count}\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"{model}\"}} {kv}\n\
         vllm:gpu_cache_usage_perc{{model_name=\"{model}\"}} {kv}\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"{max_lora}\",running_lora_adapters=\"{running}\",waiting_lora_adapters=\"{waiting}\"}} {now}\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{block_size}\",num_gpu_blocks=\"{blocks}\"}} 1.0\n\
         # TYPE vllm:prefix_cache_queries_total counter\n\
         vllm:prefix_cache_queries_total{{model_name=\"{model}\"}} {queries}\n\
         # TYPE vllm:prefix_cache_hits_total counter\n\
         vllm:prefix_cache_hits_total{{model_name=\"{model}\"}} {hits}\n\
         # TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{model_name=\"{model}\"}} {requests}\n{extra}",
        extra = engine.extra_metrics,
        waiting_count = engine.waiting + engine.background_waiting,
        running_count = engine.running + engine.background_running,
        max_lora = settings.max_lora,
        running = running.join(","),
        waiting = waiting.join(","),
        block_size = settings.block_size,
        blocks = settings.kv_blocks,
        queries = engine.prefix_queries,
        hits = engine.prefix_hits,
        requests = engine.requests_total,
    )
}

fn scaled(sim: &Sim, millis: f64) -> Duration {
    Duration::from_secs_f64((millis * sim.settings.time_scale / 1000.0).max(0.0))
}

/// Waits for a running slot (and a LoRA slot if the request names an adapter). Also says
/// whether the adapter had to be loaded for this request (which then pays `--lora-load-ms`).
fn admit<'a>(sim: &'a Sim, adapter: Option<&str>) -> (std::sync::MutexGuard<'a, Engine>, bool) {
    let mut engine = lock(sim);
    let mut loaded = false;
    engine.waiting += 1;
    if let Some(name) = adapter {
        *engine.waiting_adapters.entry(name.to_string()).or_default() += 1;
    }
    loop {
        let lora_ok = adapter.is_none_or(|name| {
            match load_adapter(&mut engine, name, sim.settings.max_lora) {
                Some(newly) => {
                    loaded |= newly;
                    true
                }
                None => false,
            }
        });
        if engine.running < sim.settings.max_num_seqs && lora_ok {
            break;
        }
        engine = sim
            .slot_freed
            .wait(engine)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    engine.waiting -= 1;
    engine.running += 1;
    if let Some(name) = adapter {
        decrement(&mut engine.waiting_adapters, name);
        *engine.running_adapters.entry(name.to_string()).or_default() += 1;
    }
    (engine, loaded)
}

/// Makes `name` resident, evicting the least recently used idle adapter if the slots are
/// full: `Some(true)` if it was loaded now, `Some(false)` if it was resident, `None` when every
/// slot is busy.
fn load_adapter(engine: &mut Engine, name: &str, max_lora: usize) -> Option<bool> {
    if let Some(position) = engine.loaded_adapters.iter().position(|a| a == name) {
        let adapter = engine.loaded_adapters.remove(position);
        engine.loaded_adapters.push(adapter);
        return Some(false);
    }
    if engine.loaded_adapters.len() >= max_lora {
        let idle = engine
            .loaded_adapters
            .iter()
            .position(|a| !engine.running_adapters.contains_key(a));
        match idle {
            Some(position) => {
                engine.loaded_adapters.remove(position);
            }
            None => return None,
        }
    }
    engine.loaded_adapters.push(name.to_string());
    Some(true)
}

fn decrement(map: &mut HashMap<String, usize>, key: &str) {
    if let Some(count) = map.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            map.remove(key);
        }
    }
}

fn inference(sim: &Sim, api: ApiKind, request: &HttpRequest, out: &mut TcpStream) -> bool {
    let parsed = match parse_body(api, &request.body) {
        Ok(parsed) => parsed,
        Err(error) => return respond_json(sim, out, 400, &error_body(&error.message(), 400)),
    };
    if let Some(prefiller) = request.header("x-prefiller-host-port") {
        *lock(sim)
            .prefillers_seen
            .entry(prefiller.to_string())
            .or_default() += 1;
    }
    let adapter = if parsed.model == sim.settings.model {
        None
    } else if sim.settings.adapters.contains(&parsed.model) {
        Some(parsed.model.as_str())
    } else {
        let message = format!("The model `{}` does not exist.", parsed.model);
        return respond_json(sim, out, 404, &error_body(&message, 404));
    };
    let output_tokens = match api {
        ApiKind::Embeddings => 0,
        _ => parsed.max_tokens.unwrap_or(16).min(4096) as usize,
    };
    let (uncached, lora_loaded) = {
        let (mut engine, loaded) = admit(sim, adapter);
        let (uncached, _) = prefix_lookup(sim, &mut engine, &parsed);
        engine.kv_tokens += parsed.prompt_tokens as usize + output_tokens;
        (uncached, loaded)
    };
    if lora_loaded {
        thread::sleep(scaled(sim, sim.settings.lora_load_ms));
    }
    thread::sleep(scaled(
        sim,
        uncached as f64 * sim.settings.prefill_us_per_token / 1000.0,
    ));
    // Tests pin the id with x-sim-response-id to compare responses byte for byte.
    let id = match request.header("x-sim-response-id") {
        Some(id) => id.to_string(),
        None => format!(
            "cmpl-{}-{}",
            sim.settings.name,
            sim.started.elapsed().as_nanos()
        ),
    };
    let ok = if parsed.stream && api != ApiKind::Embeddings {
        stream_tokens(sim, api, &parsed, &id, output_tokens, out)
    } else {
        for _ in 0..output_tokens {
            thread::sleep(decode_step(sim));
        }
        respond_json(
            sim,
            out,
            200,
            &full_response(api, &parsed, &id, output_tokens),
        )
    };
    let mut engine = lock(sim);
    engine.running -= 1;
    engine.requests_total += 1;
    engine.kv_tokens = engine
        .kv_tokens
        .saturating_sub(parsed.prompt_tokens as usize + output_tokens);
    if let Some(name) = adapter {
        decrement(&mut engine.running_adapters, name);
    }
    sim.slot_freed.notify_all();
    ok
}

/// Tokens to prefill after the prefix cache, and the tokens it saved; the prompt's blocks
/// are then cached.
fn prefix_lookup(sim: &Sim, engine: &mut Engine, request: &InferenceRequest) -> (usize, usize) {
    let mut hashes = Vec::new();
    block_hashes(
        &request.model,
        &request.prompt,
        sim.settings.block_size * 4,
        usize::MAX,
        &mut hashes,
    );
    let Some(index) = engine.prefix.as_mut() else {
        return (request.prompt_tokens as usize, 0);
    };
    let mut matched = [0usize];
    index.match_lengths(&hashes, &[0], &mut matched);
    index.insert(0, &hashes);
    let hit_tokens = (matched[0] * sim.settings.block_size).min(request.prompt_tokens as usize);
    engine.prefix_queries += u64::from(request.prompt_tokens);
    engine.prefix_hits += hit_tokens as u64;
    (request.prompt_tokens as usize - hit_tokens, hit_tokens)
}

/// One decode step; batching makes each step a little slower as more sequences run.
fn decode_step(sim: &Sim) -> Duration {
    let running = lock(sim).running as f64;
    scaled(
        sim,
        sim.settings.decode_ms_per_token * (1.0 + 0.02 * running),
    )
}

fn word(i: usize) -> String {
    format!(" tok{i}")
}

fn full_response(
    api: ApiKind,
    request: &InferenceRequest,
    id: &str,
    output_tokens: usize,
) -> Value {
    let text: String = (0..output_tokens).map(word).collect();
    let usage = json!({"prompt_tokens": request.prompt_tokens, "completion_tokens": output_tokens,
        "total_tokens": request.prompt_tokens as usize + output_tokens});
    match api {
        ApiKind::ChatCompletions => {
            json!({"id": id, "object": "chat.completion", "model": request.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": usage})
        }
        ApiKind::Embeddings => {
            let vector: Vec<f64> = (0..8)
                .map(|i| ((request.prompt_chars + i) % 7) as f64 / 7.0)
                .collect();
            json!({"object": "list", "model": request.model, "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "usage": {"prompt_tokens": request.prompt_tokens, "total_tokens": request.prompt_tokens}})
        }
        ApiKind::Responses => {
            json!({"id": id, "object": "response", "model": request.model, "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": request.prompt_tokens, "output_tokens": output_tokens}})
        }
        _ => json!({"id": id, "object": "text_completion", "model": request.model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}),
    }
}

fn stream_tokens(
    sim: &Sim,
    api: ApiKind,
    request: &InferenceRequest,
    id: &str,
    output_tokens: usize,
    out: &mut TcpStream,
) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nx-inference-pod: {}\r\ntransfer-encoding: chunked\r\n\r\n",
        sim.settings.name
    );
    if out.write_all(head.as_bytes()).is_err() {
        return false;
    }
    for i in 0..output_tokens {
        thread::sleep(decode_step(sim));
        let chunk = match api {
            ApiKind::ChatCompletions => {
                json!({"id": id, "object": "chat.completion.chunk", "model": request.model,
                "choices": [{"index": 0, "delta": {"content": word(i)}, "finish_reason": Value::Null}]})
            }
            _ => json!({"id": id, "object": "text_completion", "model": request.model,
                "choices": [{"index": 0, "text": word(i), "finish_reason": Value::Null}]}),
        };
        if write_chunk(out, format!("data: {chunk}\n\n").as_bytes()).is_err() {
            return false;
        }
    }
    write_chunk(out, b"data: [DONE]\n\n").is_ok() && out.write_all(b"0\r\n\r\n").is_ok()
}

fn write_chunk(out: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    out.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    out.write_all(data)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

fn respond_json(sim: &Sim, out: &mut TcpStream, status: u16, body: &Value) -> bool {
    respond(
        sim,
        out,
        status,
        "application/json",
        body.to_string().as_bytes(),
    )
}

fn respond(sim: &Sim, out: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) -> bool {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nx-inference-pod: {}\r\n\r\n",
        body.len(),
        sim.settings.name
    );
    out.write_all(head.as_bytes()).is_ok() && out.write_all(body).is_ok() && out.flush().is_ok()
}
