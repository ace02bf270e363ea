//! The picker's per-request steps, each runnable `n` times over one body: shared by the wasm
//! module (timed in V8 by `run.js`) and the bench (timed natively), so both run the same code.
//! The picker is the shipped `envoy/envoy.yaml` configuration over its first two endpoints,
//! each scraped once (fresh metrics), as in the profile's Envoy rows.

use inference_picker_core::error_response::{ErrorShape, RequestError};
use inference_picker_core::host::fake::{FakeVm, NoSharedData};
use inference_picker_core::host::{
    encode_header_map, HeaderPairs, HostError, HttpHost, SharedData,
};
use inference_picker_core::request::{ApiKind, RequestHeaders};
use inference_picker_core::request_driver::RequestDriver;
use inference_picker_core::router::PoolRouter;
use inference_picker_core::tick_driver::TickDriver;
use serde_yaml::Value;

/// What each step runs, in order: every step does the one before it and more.
pub const STEPS: [&str; 3] = ["parse", "decide", "request"];

const SHIPPED_ENVOY: &str = include_str!("../../../envoy/envoy.yaml");
const ENDPOINTS: usize = 2;

/// The headers Envoy hands the filter for a bench request (as `proxy_get_header_map_pairs`
/// returns them).
const REQUEST_HEADERS: [(&str, &str); 9] = [
    (":authority", "127.0.0.1:10000"),
    (":path", "/v1/completions"),
    (":method", "POST"),
    (":scheme", "http"),
    ("content-type", "application/json"),
    ("content-length", "1024"),
    ("x-forwarded-proto", "http"),
    ("x-request-id", "6c0e3f7e-5d2b-4f8e-9a53-0d6a1b2c3d4e"),
    ("x-envoy-expected-rq-timeout-ms", "600000"),
];

/// The picker configuration inside the shipped Envoy configuration, over its first endpoints.
fn shipped_picker_config() -> Option<String> {
    let envoy: Value = serde_yaml::from_str(SHIPPED_ENVOY).ok()?;
    let manager = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    let filters = manager["typed_config"]["http_filters"].as_sequence()?;
    let wasm = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.wasm")?;
    let text = wasm["typed_config"]["config"]["configuration"]["value"].as_str()?;
    let mut config: Value = serde_yaml::from_str(text).ok()?;
    let endpoints = config["pool"]["endpoints"].as_sequence_mut()?;
    endpoints.truncate(ENDPOINTS);
    serde_yaml::to_string(&config).ok()
}

/// The picker, its endpoints scraped once.
pub fn shipped_picker() -> Option<PoolRouter> {
    let mut router = shipped_configuration()?.0;
    let data = &mut router.slot_mut(0)?.data;
    for (endpoint, waiting) in (0..ENDPOINTS).zip([1, 3]) {
        let metrics = format!(
            "vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 2\n\
             vllm:kv_cache_usage_perc 0.{waiting}\n"
        );
        data.scrape_answered(endpoint, 0, &metrics).ok()?;
    }
    data.refresh_health(0);
    Some(router)
}

/// The shipped configuration's picker and its pool's tick flow.
fn shipped_configuration() -> Option<(PoolRouter, TickDriver)> {
    let text = shipped_picker_config()?;
    let configured = inference_picker_core::vm::configure::configure(text.as_bytes(), 7).ok()?;
    let flow = configured.ticks.into_iter().next()?.driver;
    Some((configured.router, flow))
}

/// A real vLLM 0.32 `/metrics` answer under load (what each scrape reads in production).
const VLLM_METRICS: &str =
    include_str!("../../../tests/fixtures/vllm/vllm-0.32.0-metrics-busy.txt");

/// The scraping VM's ticks, on the in-memory host: each tick's own work and the answers of
/// the scrapes it sent, with a clock that moves one interval per tick.
pub struct Ticks {
    router: PoolRouter,
    flow: TickDriver,
    host: FakeVm,
}

impl Ticks {
    pub fn new() -> Option<Ticks> {
        let (router, flow) = shipped_configuration()?;
        let host = FakeVm::default();
        host.clock.advance(1_000_000);
        Some(Ticks { router, flow, host })
    }

    /// Runs `n` ticks; the scrapes answered, so a tick that scrapes nothing shows as 0.
    pub fn run(&mut self, n: usize) -> usize {
        let Some(slot) = self.router.slot_mut(0) else {
            return 0;
        };
        let mut answered = 0;
        for _ in 0..n {
            self.host.clock.advance(50);
            self.flow.on_tick(&self.host, slot);
            for call in self.host.callouts.take_sent() {
                let cap = slot.data.body_cap(call.token).unwrap_or(0);
                let answer = self
                    .host
                    .callouts
                    .answer(call.token, Some("200"), VLLM_METRICS, cap);
                self.flow
                    .on_callout_response(&self.host, slot, call.token, &answer);
                answered += 1;
            }
        }
        answered
    }
}

/// A completions body of about `bytes`, its prompt all `x`, as the bench sends.
pub fn padded_completion(bytes: usize) -> String {
    let prompt = "x".repeat(bytes.saturating_sub(64));
    format!(r#"{{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"{prompt}","max_tokens":1}}"#)
}

/// The host of one request, in memory: answers what Envoy would and discards writes.
pub struct BenchHost {
    headers: Vec<u8>,
    body: Vec<u8>,
}

impl BenchHost {
    pub fn new(body: &str) -> Self {
        BenchHost {
            headers: encode_header_map(&REQUEST_HEADERS),
            body: body.as_bytes().to_vec(),
        }
    }
}

impl HttpHost for BenchHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        let pairs = self.request_headers()?;
        pairs.get(name).map(<[u8]>::to_vec)
    }

    fn request_headers(&self) -> Option<HeaderPairs> {
        HeaderPairs::decode(self.headers.clone())
    }

    fn set_request_header(&self, _name: &str, _value: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn remove_request_header(&self, _name: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        Ok(self.body.get(..size).unwrap_or(&self.body).to_vec())
    }

    fn replace_request_body(&self, _size: usize, _body: &[u8]) -> Result<(), HostError> {
        Ok(())
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        (name == ":status").then(|| b"200".to_vec())
    }

    fn set_response_header(&self, _name: &str, _value: &str) -> Result<(), HostError> {
        Ok(())
    }

    fn upstream_address(&self) -> Option<String> {
        Some("127.0.0.1:8001".into())
    }

    fn subset_hint(&self) -> Option<Vec<u8>> {
        None
    }

    fn destination_port(&self) -> Option<u16> {
        None
    }

    fn send_answer(&self, _status: u16, _body: &[u8]) -> Result<(), HostError> {
        Ok(())
    }

    fn send_error(&self, _error: &RequestError, _shape: ErrorShape) -> Result<(), HostError> {
        Ok(())
    }

    fn now_ms(&self) -> u64 {
        0
    }

    fn shared_data(&self) -> &dyn SharedData {
        &NoSharedData
    }
}

/// Runs step `step` (an index into [`STEPS`]) `n` times; the count of requests routed, so a
/// broken step shows as 0.
pub fn run(router: &mut PoolRouter, host: &BenchHost, step: usize, n: usize) -> usize {
    let mut routed = 0;
    for id in 0..n {
        let ok = match step {
            0 => parse(router, host),
            1 => decide(router, host),
            _ => request(router, host, id),
        };
        routed += usize::from(ok);
    }
    routed
}

fn parse(router: &mut PoolRouter, host: &BenchHost) -> bool {
    let body = host.body.as_slice();
    let prepared = router.prepare(ApiKind::Completions, Some(body), RequestHeaders::default());
    std::hint::black_box(&prepared).is_ok()
}

fn decide(router: &mut PoolRouter, host: &BenchHost) -> bool {
    let body = host.body.as_slice();
    let Ok((pool, prepared)) =
        router.prepare(ApiKind::Completions, Some(body), RequestHeaders::default())
    else {
        return false;
    };
    let Some(slot) = router.slot_mut(pool) else {
        return false;
    };
    match slot.director.route_prepared(&mut slot.data, prepared) {
        Ok(routed) => {
            slot.director.request_ended(&mut slot.data, &routed);
            true
        }
        Err(_) => false,
    }
}

fn request(router: &mut PoolRouter, host: &BenchHost, id: usize) -> bool {
    let mut flow = RequestDriver::new(u32::try_from(id).unwrap_or(0));
    flow.on_headers(host, router, false);
    flow.on_body(host, router, host.body.len(), true);
    let routed = flow.was_routed();
    flow.on_response_headers(host, router);
    flow.on_done(router, 0, &NoSharedData);
    routed
}
