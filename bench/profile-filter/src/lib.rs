//! A filter that stops at one stage of the picker's per-request work, chosen by its plugin
//! configuration: `pass` (callbacks only, nothing paused), `pause` (hold the headers until the
//! body's end, as the picker does), `read` (also copy the body into the VM), `parse` (also parse
//! it with the picker's own parser), `write` (also set the destination header). `ticks` and
//! `scrapes <ip:port,...>` pass requests through and load the timer side instead: a tick every
//! 50 ms that does nothing, or that fetches each pod's `/metrics` through the metrics cluster
//! (the body copied into the VM, not parsed), as the picker's scraping VM does.

use inference_picker_core::request::{parse_body, ApiKind};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};
use std::time::Duration;

/// The shipped configuration's scrape interval.
const TICK: Duration = Duration::from_millis(50);

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(StageRoot { stage: Stage::Pass, scraped: Vec::new() }) });
}}

#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Stage {
    Pass,
    Pause,
    Read,
    Parse,
    Write,
}

struct StageRoot {
    stage: Stage,
    /// Pods scraped on every tick (`scrapes`).
    scraped: Vec<String>,
}

impl Context for StageRoot {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        size: usize,
        _trailers: usize,
    ) {
        let body = self.get_http_call_response_body(0, size);
        std::hint::black_box(&body);
    }
}

impl RootContext for StageRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let config = String::from_utf8_lossy(&config);
        let mut words = config.split_whitespace();
        let stage = words.next().unwrap_or_default();
        if matches!(stage, "ticks" | "scrapes") {
            self.scraped = words
                .flat_map(|list| list.split(','))
                .map(str::to_owned)
                .collect();
            self.set_tick_period(TICK);
        }
        self.stage = match stage {
            "pass" | "ticks" | "scrapes" => Stage::Pass,
            "pause" => Stage::Pause,
            "read" => Stage::Read,
            "parse" => Stage::Parse,
            "write" => Stage::Write,
            _ => return false,
        };
        true
    }

    fn on_tick(&mut self) {
        for pod in &self.scraped {
            let headers = vec![
                (":method", "GET"),
                (":path", "/metrics"),
                (":authority", pod.as_str()),
                ("x-gateway-destination-endpoint", pod.as_str()),
            ];
            let timeout = Duration::from_secs(1);
            let _ =
                self.dispatch_http_call("inference_picker_metrics", headers, None, vec![], timeout);
        }
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(StageHttp { stage: self.stage }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct StageHttp {
    stage: Stage,
}

impl Context for StageHttp {}

impl HttpContext for StageHttp {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if self.stage == Stage::Pass || end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.stage == Stage::Pass {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        if self.stage >= Stage::Read {
            let body = self.get_http_request_body(0, body_size).unwrap_or_default();
            if self.stage >= Stage::Parse {
                let parsed = parse_body(ApiKind::Completions, &body);
                std::hint::black_box(&parsed);
            }
            if self.stage >= Stage::Write {
                self.set_http_request_header("x-gateway-destination-endpoint", Some("-"));
            }
        }
        Action::Continue
    }
}
