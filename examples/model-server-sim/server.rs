//! One pod's HTTP surface: the OpenAI routes and Anthropic's `/v1/messages`, `/metrics`,
//! `/health`, `/v1/models`, the admin routes, faults, and the life of one inference request
//! through the engine.

use crate::api::{self, Api, ApiRequest};
use crate::batching::Sequence;
use crate::engine::{Engine, Fault, FaultScope, Limits};
use crate::http1::{self, Request};
use crate::kv_cache::{self, KvCache};
use crate::lifecycle::Door;
use crate::metrics;
use crate::Settings;
use serde_json::{json, Value};
use std::net::TcpStream;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Pod {
    settings: Settings,
    /// The listening socket and open connections (refusing, draining).
    door: Arc<Door>,
    engine: Mutex<Engine>,
    /// Signalled when the scheduler admits requests.
    admitted: Condvar,
    /// Signalled when a request joins the batching engine's queue.
    queued: Condvar,
    started: Instant,
    started_unix: f64,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
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

impl Pod {
    pub fn new(settings: Settings, door: Arc<Door>) -> Pod {
        let limits = Limits {
            max_num_seqs: settings.max_num_seqs,
            max_lora: settings.max_lora,
        };
        let mut engine = Engine::new(
            limits,
            KvCache::new(settings.kv_blocks, settings.block_size),
        );
        engine.batch.settings = settings.batching;
        engine.loaded_adapters = settings.loaded_adapters.clone();
        engine.background_waiting = settings.background_waiting;
        engine.background_running = settings.background_running;
        engine.background_kv = settings.background_kv;
        engine.extra_metrics = settings.extra_metrics.clone();
        engine.metrics_padding_bytes = settings.metrics_padding_bytes;
        engine.fault = settings
            .fault
            .as_ref()
            .and_then(|mode| fault_from(&json!({ "mode": mode })));
        Pod {
            settings,
            door,
            engine: Mutex::new(engine),
            admitted: Condvar::new(),
            queued: Condvar::new(),
            started: Instant::now(),
            started_unix: unix_now(),
        }
    }

    /// The batching engine's loop (`--batching`): plans a step, lets it take its time, then
    /// hands out the tokens it produced; sleeps while nothing is queued or running.
    pub fn run_batches(&self) {
        loop {
            let step_ms = {
                let mut engine = self.lock();
                loop {
                    if let Some(ms) = engine.plan_step() {
                        break ms;
                    }
                    engine = self
                        .queued
                        .wait(engine)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            thread::sleep(self.scaled(step_ms));
            self.lock().complete_step();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Engine> {
        self.engine
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn scaled(&self, millis: f64) -> Duration {
        Duration::from_secs_f64((millis * self.settings.time_scale / 1000.0).max(0.0))
    }

    /// Answers one request; false when the connection must be closed.
    pub fn handle(&self, request: &Request, out: &mut TcpStream) -> bool {
        let path = request.path();
        if path.starts_with("/admin/") {
            return self.admin(request, path, out);
        }
        let fault = {
            let engine = self.lock();
            let hit = match engine.fault_scope {
                FaultScope::All => true,
                FaultScope::Inference => path != "/metrics",
                FaultScope::Metrics => path == "/metrics",
            };
            if hit {
                engine.fault.clone()
            } else {
                None
            }
        };
        match fault {
            Some(Fault::Error(status)) => {
                let body = api::error_for(
                    Api::from_path(path),
                    "injected fault",
                    "server_error",
                    status,
                );
                return self.respond_json(out, status, &body);
            }
            Some(Fault::Slow(ms)) => thread::sleep(Duration::from_millis(ms)),
            Some(Fault::Hang) => {
                thread::sleep(Duration::from_secs(3600));
                return false;
            }
            None => {}
        }
        match (request.method.as_str(), path) {
            ("GET", "/metrics") => {
                let snapshot =
                    self.lock()
                        .snapshot(&self.settings.model, self.started_unix, unix_now());
                let text = metrics::render(&snapshot);
                self.respond(out, 200, "text/plain; version=0.0.4", text.as_bytes())
            }
            ("GET", "/health") => self.respond(out, 200, "text/plain", b"ok"),
            ("GET", "/v1/models") => {
                let model = &self.settings.model;
                let mut models = vec![json!({"id": model, "object": "model", "owned_by": "sim"})];
                for adapter in &self.settings.adapters {
                    models.push(json!({"id": adapter, "object": "model", "parent": model}));
                }
                self.respond_json(out, 200, &json!({"object": "list", "data": models}))
            }
            ("POST", "/tokenize") => self.tokenize(request, out),
            ("POST", _) => match Api::from_path(path) {
                Some(api) => self.inference(api, request, out),
                None => self.not_found(out),
            },
            _ => self.not_found(out),
        }
    }

    /// vLLM's `/tokenize`: a completion (`prompt`) or chat (`messages`) body's prompt tokens,
    /// after the chat template, as the engine would see them.
    fn tokenize(&self, request: &Request, out: &mut TcpStream) -> bool {
        let is_chat = serde_json::from_slice::<Value>(&request.body)
            .is_ok_and(|body| body.get("messages").is_some());
        let api = if is_chat { Api::Chat } else { Api::Completions };
        match api::parse(api, &request.body) {
            Ok(parsed) => {
                let tokens = parsed.prompt_tokens();
                let body = json!({"count": tokens.len(), "tokens": tokens});
                self.respond_json(out, 200, &body)
            }
            Err(message) => {
                let body = api::error_body(&message, "invalid_request_error", 400);
                self.respond_json(out, 400, &body)
            }
        }
    }

    fn not_found(&self, out: &mut TcpStream) -> bool {
        let body = api::error_body("no such route", "invalid_request_error", 404);
        self.respond_json(out, 404, &body)
    }

    fn admin(&self, request: &Request, path: &str, out: &mut TcpStream) -> bool {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        match path {
            "/admin/fault" => {
                // "refuse": the listening socket closes (new connections are refused) while
                // open connections, scrapes included, are served as usual; `for_ms` opens it
                // again by itself. Any other mode opens it.
                if body.get("mode").and_then(Value::as_str) == Some("refuse") {
                    let reopen = body
                        .get("for_ms")
                        .and_then(Value::as_u64)
                        .map(Duration::from_millis);
                    self.door.close(reopen);
                } else {
                    self.door.open();
                }
                let fault = fault_from(&body);
                let mut engine = self.lock();
                engine.fault = fault;
                engine.fault_scope = match body.get("scope").and_then(Value::as_str) {
                    Some("inference") => FaultScope::Inference,
                    Some("metrics") => FaultScope::Metrics,
                    _ => FaultScope::All,
                };
            }
            "/admin/load" => {
                let mut engine = self.lock();
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
                if let Some(bytes) = body.get("metrics_padding_bytes").and_then(Value::as_u64) {
                    engine.metrics_padding_bytes = bytes as usize;
                }
            }
            _ => {}
        }
        let stats = {
            let engine = self.lock();
            json!({
                "name": self.settings.name,
                "requests_total": engine.requests_total,
                "metrics_scrapes": engine.metrics_scrapes,
                "waiting": engine.waiting(),
                "peak_waiting": engine.peak_waiting,
                "running": engine.running,
                "prefix_queries": engine.prefix_queries,
                "prefix_hits": engine.prefix_hits,
                "prefillers_seen": engine.prefillers_seen,
                "priorities_seen": engine.priorities_seen,
                "block_size": engine.kv.block_size(),
                "kv_blocks": engine.kv.num_blocks(),
                "kv_blocks_used": engine.kv.used_blocks(),
                "kv_blocks_cached": engine.kv.cached_blocks(),
                "kv_evictions": engine.kv.evictions,
                "generation_tokens": engine.generation_tokens,
                "preemptions": engine.preemptions,
            })
        };
        self.respond_json(out, 200, &stats)
    }

    fn inference(&self, api: Api, request: &Request, out: &mut TcpStream) -> bool {
        let parsed = match api::parse(api, &request.body) {
            Ok(parsed) => parsed,
            Err(message) => {
                let body = api::error_for(Some(api), &message, "invalid_request_error", 400);
                return self.respond_json(out, 400, &body);
            }
        };
        let priority = parsed.priority.map_or("none".into(), |p| p.to_string());
        *self.lock().priorities_seen.entry(priority).or_default() += 1;
        if let Some(prefiller) = request.header("x-prefiller-host-port") {
            *self
                .lock()
                .prefillers_seen
                .entry(prefiller.to_string())
                .or_default() += 1;
        }
        let adapter = if parsed.model == self.settings.model {
            None
        } else if self.settings.adapters.contains(&parsed.model) {
            Some(parsed.model.as_str())
        } else {
            let message = format!("The model `{}` does not exist.", parsed.model);
            let body = api::error_for(Some(api), &message, "invalid_request_error", 404);
            return self.respond_json(out, 404, &body);
        };
        // Outside the lock: tokenizing and hashing a large prompt takes a while.
        let tokens = parsed.prompt_tokens();
        let hashes = kv_cache::block_hashes(&tokens, self.settings.block_size, adapter);
        let output_tokens = parsed.output_tokens();
        let prompt_tokens = tokens.len();
        drop(tokens);
        if self.settings.batching.is_some() {
            let batch = Batched {
                adapter,
                hashes,
                prompt_tokens,
                output_tokens,
            };
            return self.inference_batched(api, request, &parsed, batch, out);
        }

        let arrived = Instant::now();
        let admitted = {
            let mut engine = self.lock();
            let ticket = engine.enqueue(
                adapter,
                hashes,
                prompt_tokens,
                prompt_tokens + output_tokens,
            );
            if engine.schedule() {
                self.admitted.notify_all();
            }
            loop {
                if let Some(admitted) = engine.take_admitted(ticket) {
                    break admitted;
                }
                engine = self
                    .admitted
                    .wait(engine)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        let prefill_started = Instant::now();
        if admitted.lora_loaded {
            thread::sleep(self.scaled(self.settings.lora_load_ms));
        }
        let uncached = prompt_tokens.saturating_sub(admitted.allocation.hit_tokens);
        thread::sleep(self.scaled(uncached as f64 * self.settings.prefill_us_per_token / 1000.0));
        let prefill_seconds = prefill_started.elapsed().as_secs_f64();
        let first_token_seconds =
            arrived.elapsed().as_secs_f64() + self.decode_step().as_secs_f64();
        let decode_started = Instant::now();
        let id = self.response_id(api, request);
        let ok = if parsed.stream && api != Api::Embeddings {
            let mut next_token = || {
                thread::sleep(self.decode_step());
                true
            };
            self.stream(
                &parsed,
                &id,
                prompt_tokens,
                output_tokens,
                &mut next_token,
                out,
            )
        } else {
            for _ in 0..output_tokens {
                thread::sleep(self.decode_step());
            }
            let body = api::full_response(&parsed, &id, prompt_tokens, output_tokens);
            self.respond_json(out, 200, &body)
        };
        let decode_seconds = decode_started.elapsed().as_secs_f64();
        let mut engine = self.lock();
        engine.prefill_time.observe(prefill_seconds);
        engine.first_token_time.observe(first_token_seconds);
        if output_tokens > 1 {
            // The slots engine sleeps one decode step a token: every gap is the step.
            let gaps = (output_tokens - 1) as u64;
            engine
                .inter_token_time
                .observe_many(decode_seconds / output_tokens as f64, gaps);
        }
        engine.finish(adapter, &admitted.allocation.blocks, output_tokens);
        if engine.schedule() {
            self.admitted.notify_all();
        }
        ok
    }

    /// A request through the batching engine: queued, then answered token by token as the
    /// engine's steps produce them.
    fn inference_batched(
        &self,
        api: Api,
        request: &Request,
        parsed: &ApiRequest,
        batch: Batched<'_>,
        out: &mut TcpStream,
    ) -> bool {
        let (sender, tokens) = mpsc::channel();
        let Batched {
            adapter,
            hashes,
            prompt_tokens,
            output_tokens,
        } = batch;
        let sequence = Sequence::new(adapter, hashes, prompt_tokens, output_tokens, sender);
        self.lock().enqueue_sequence(sequence);
        self.queued.notify_all();
        let id = self.response_id(api, request);
        if parsed.stream && api != Api::Embeddings {
            // The first token comes with the step that completes the prompt.
            if tokens.recv().is_err() {
                return false;
            }
            let mut first = true;
            let mut next_token = || std::mem::take(&mut first) || tokens.recv().is_ok();
            self.stream(
                parsed,
                &id,
                prompt_tokens,
                output_tokens,
                &mut next_token,
                out,
            )
        } else {
            if !received_all(&tokens, output_tokens) {
                return false;
            }
            let body = api::full_response(parsed, &id, prompt_tokens, output_tokens);
            self.respond_json(out, 200, &body)
        }
    }

    /// Tests pin the id with x-sim-response-id to compare responses byte for byte.
    fn response_id(&self, api: Api, request: &Request) -> String {
        match request.header("x-sim-response-id") {
            Some(id) => id.to_string(),
            None => format!(
                "{}-{}-{}",
                if api == Api::Messages { "msg" } else { "cmpl" },
                self.settings.name,
                self.started.elapsed().as_nanos()
            ),
        }
    }

    /// One decode step; batching makes each step a little slower as more sequences run.
    fn decode_step(&self) -> Duration {
        let running = self.lock().running as f64;
        self.scaled(self.settings.decode_ms_per_token * (1.0 + 0.02 * running))
    }

    fn stream(
        &self,
        request: &ApiRequest,
        id: &str,
        prompt_tokens: usize,
        output_tokens: usize,
        next_token: &mut dyn FnMut() -> bool,
        out: &mut TcpStream,
    ) -> bool {
        let mut headers = vec![
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("x-inference-pod", self.settings.name.as_str()),
        ];
        headers.extend(self.closing());
        if http1::write_chunked_head(out, 200, &headers).is_err() {
            return false;
        }
        let start = api::stream_start(request, id, prompt_tokens);
        if !start.is_empty() && http1::write_chunk(out, start.as_bytes()).is_err() {
            return false;
        }
        // Events go out in chunks of `--stream-interval` tokens, the first token on its own.
        let interval = self.settings.stream_interval;
        let mut pending = String::new();
        for i in 0..output_tokens {
            if !next_token() {
                return false;
            }
            pending.push_str(&api::stream_event(request, id, i));
            let due = i == 0 || (i + 1) % interval == 0 || i + 1 == output_tokens;
            if due && http1::write_chunk(out, std::mem::take(&mut pending).as_bytes()).is_err() {
                return false;
            }
        }
        http1::write_chunk(out, api::stream_end(request, output_tokens).as_bytes()).is_ok()
            && http1::write_last_chunk(out).is_ok()
    }

    fn respond_json(&self, out: &mut TcpStream, status: u16, body: &Value) -> bool {
        self.respond(out, status, "application/json", body.to_string().as_bytes())
    }

    fn respond(&self, out: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) -> bool {
        let mut headers = vec![
            ("content-type", content_type),
            ("x-inference-pod", self.settings.name.as_str()),
        ];
        headers.extend(self.closing());
        http1::write_response(out, status, &headers, body).is_ok()
    }

    /// While draining, each response says the connection closes after it, so the client does
    /// not send another request on it.
    fn closing(&self) -> Option<(&'static str, &'static str)> {
        self.door.draining().then_some(("connection", "close"))
    }
}

/// What the batching engine needs of a parsed request.
struct Batched<'a> {
    adapter: Option<&'a str>,
    hashes: Vec<u64>,
    prompt_tokens: usize,
    output_tokens: usize,
}

/// Waits for the engine to produce all `output_tokens`; false if the sequence ended first.
fn received_all(tokens: &Receiver<usize>, output_tokens: usize) -> bool {
    tokens.iter().any(|count| count >= output_tokens)
}
