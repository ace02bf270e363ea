//! A filter that stops at one stage of the picker's per-request work, chosen by its plugin
//! configuration: `pass` (callbacks only, nothing paused), `pause` (hold the headers until the
//! body's end, as the picker does), `read` (also copy the body into the VM), `parse` (also parse
//! it with the picker's own parser), `write` (also set the destination header).

use inference_picker::request::{parse_body, ApiKind};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(StageRoot { stage: Stage::Pass }) });
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
}

impl Context for StageRoot {}

impl RootContext for StageRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        self.stage = match String::from_utf8_lossy(&config).trim() {
            "pass" => Stage::Pass,
            "pause" => Stage::Pause,
            "read" => Stage::Read,
            "parse" => Stage::Parse,
            "write" => Stage::Write,
            _ => return false,
        };
        true
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
