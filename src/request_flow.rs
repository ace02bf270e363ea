//! One request's life in the filter, written against a small host trait so it runs natively
//! in tests: pause the headers, buffer the body, route once, answer errors as JSON.

use crate::error_response::RequestError;
use crate::picker::{Picker, Routed};
use crate::request::ApiKind;

/// The GIE destination header; the Envoy config copies it into `envoy.lb` metadata.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// A host call that did not succeed; the status is the raw proxy-wasm status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: u32,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed with status {}", self.call, self.status)
    }
}

/// What the request flow needs from the proxy.
pub trait HttpHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
    fn send_local_reply(&self, status: u16, json_body: &[u8]) -> Result<(), HostError>;
}

/// Whether the host should hold the request or let it go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// What the flow decided, for logs and the in-flight release.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pending,
    Routed(Routed),
    Rejected(RequestError),
}

pub struct RequestFlow {
    api: ApiKind,
    pub outcome: Outcome,
}

impl Default for RequestFlow {
    fn default() -> Self {
        RequestFlow {
            api: ApiKind::Other,
            outcome: Outcome::Pending,
        }
    }
}

impl RequestFlow {
    pub fn on_headers(
        &mut self,
        host: &impl HttpHost,
        picker: &mut Picker,
        end_of_stream: bool,
    ) -> Flow {
        let path = host.request_header(":path").unwrap_or_default();
        self.api = ApiKind::from_path(&String::from_utf8_lossy(&path));
        if end_of_stream || !self.api.is_inference() {
            // No body to read (GET /v1/models) or none we need: route on the headers alone.
            return self.finish(host, picker, None);
        }
        Flow::Pause
    }

    pub fn on_body(
        &mut self,
        host: &impl HttpHost,
        picker: &mut Picker,
        body_size: usize,
        end_of_stream: bool,
    ) -> Flow {
        if self.outcome != Outcome::Pending {
            return Flow::Continue;
        }
        let limit = picker.settings().max_request_body_bytes;
        if body_size > limit {
            return self.reject(host, RequestError::BodyTooLarge { limit });
        }
        if !end_of_stream {
            return Flow::Pause;
        }
        match host.request_body(body_size) {
            Ok(body) => self.finish(host, picker, Some(&body)),
            Err(error) => {
                log::warn!("inference-picker: reading the request body: {error}");
                self.reject(
                    host,
                    RequestError::BadRequest("the request body could not be read".into()),
                )
            }
        }
    }

    /// The request ended, however it ended: give back its in-flight slot.
    pub fn on_done(&mut self, picker: &mut Picker) {
        if let Outcome::Routed(routed) = &self.outcome {
            picker.release(routed.primary);
        }
        self.outcome = Outcome::Pending;
    }

    fn finish(&mut self, host: &impl HttpHost, picker: &mut Picker, body: Option<&[u8]>) -> Flow {
        let routed = match picker.route(self.api, body) {
            Ok(routed) => routed,
            Err(error) => return self.reject(host, error),
        };
        // The header always replaces whatever the client sent: the ORIGINAL_DST cluster would
        // otherwise route wherever the client asked.
        if let Err(error) = host.set_request_header(DESTINATION_HEADER, &routed.destination) {
            log::error!("inference-picker: setting {DESTINATION_HEADER}: {error}");
            picker.release(routed.primary);
            return self.reject(
                host,
                RequestError::NoEndpoint("the destination could not be set".into()),
            );
        }
        self.outcome = Outcome::Routed(routed);
        Flow::Continue
    }

    fn reject(&mut self, host: &impl HttpHost, error: RequestError) -> Flow {
        if let Err(host_error) = host.send_local_reply(error.status(), &error.to_json()) {
            log::error!(
                "inference-picker: sending the {} reply: {host_error}",
                error.status()
            );
        }
        self.outcome = Outcome::Rejected(error);
        Flow::Pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeHost {
        headers: RefCell<HashMap<String, String>>,
        body: Vec<u8>,
        reply: RefCell<Option<(u16, Vec<u8>)>>,
        fail_set_header: bool,
    }

    impl HttpHost for FakeHost {
        fn request_header(&self, name: &str) -> Option<Vec<u8>> {
            self.headers
                .borrow()
                .get(name)
                .map(|v| v.as_bytes().to_vec())
        }
        fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
            if self.fail_set_header {
                return Err(HostError {
                    call: "set",
                    status: 2,
                });
            }
            self.headers.borrow_mut().insert(name.into(), value.into());
            Ok(())
        }
        fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
            Ok(self.body[..size.min(self.body.len())].to_vec())
        }
        fn send_local_reply(&self, status: u16, json_body: &[u8]) -> Result<(), HostError> {
            *self.reply.borrow_mut() = Some((status, json_body.to_vec()));
            Ok(())
        }
    }

    fn host(path: &str, body: &str) -> FakeHost {
        let host = FakeHost {
            body: body.as_bytes().to_vec(),
            ..FakeHost::default()
        };
        host.headers
            .borrow_mut()
            .insert(":path".into(), path.into());
        host.headers
            .borrow_mut()
            .insert(DESTINATION_HEADER.into(), "6.6.6.6:22".into());
        host
    }

    fn picker() -> Picker {
        let mut picker =
            Picker::new(load("pool: {endpoints: [{address: '127.0.0.1:8001'}]}", 1).unwrap());
        picker
            .on_scrape_ok(0, 0, "vllm:num_requests_waiting 0\n")
            .unwrap();
        picker.on_tick(0);
        picker
    }

    #[test]
    fn body_is_buffered_then_routed_and_client_header_overwritten() {
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut picker = picker();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut picker, false), Flow::Pause);
        assert_eq!(flow.on_body(&host, &mut picker, 5, false), Flow::Pause);
        assert_eq!(
            flow.on_body(&host, &mut picker, host.body.len(), true),
            Flow::Continue
        );
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
        assert_eq!(picker.pool().endpoints[0].in_flight, 1);
        flow.on_done(&mut picker);
        flow.on_done(&mut picker);
        assert_eq!(
            picker.pool().endpoints[0].in_flight,
            0,
            "released exactly once"
        );
    }

    #[test]
    fn get_without_body_is_routed_at_headers() {
        let host = host("/v1/models", "");
        let mut picker = picker();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut picker, true), Flow::Continue);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
    }

    #[test]
    fn errors_become_json_replies() {
        let mut picker = picker();
        for (path, body, end_at_headers, status) in [
            ("/v1/chat/completions", "{oops", false, 400),
            ("/v1/completions", r#"{"prompt":"x"}"#, false, 400),
            ("/v1/completions", "", true, 400),
        ] {
            let host = host(path, body);
            let mut flow = RequestFlow::default();
            if flow.on_headers(&host, &mut picker, end_at_headers) == Flow::Pause && !end_at_headers
            {
                flow.on_body(&host, &mut picker, body.len(), true);
            }
            let (got, json) = host.reply.borrow().clone().unwrap();
            assert_eq!(got, status, "{path} {body}");
            let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap();
            assert_eq!(parsed["error"]["code"], status);
            assert_eq!(
                host.headers.borrow()[DESTINATION_HEADER],
                "6.6.6.6:22",
                "never forwarded"
            );
        }
        assert_eq!(picker.pool().endpoints[0].in_flight, 0);
    }

    #[test]
    fn oversized_body_is_413_before_buffering_completes() {
        let host = host("/v1/completions", "");
        let mut picker = picker();
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &mut picker, false);
        let limit = picker.settings().max_request_body_bytes;
        assert_eq!(
            flow.on_body(&host, &mut picker, limit + 1, false),
            Flow::Pause
        );
        assert_eq!(host.reply.borrow().as_ref().unwrap().0, 413);
    }

    #[test]
    fn failing_to_set_the_header_refuses_and_releases() {
        let mut host = host("/v1/models", "");
        host.fail_set_header = true;
        let mut picker = picker();
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &mut picker, true);
        assert_eq!(host.reply.borrow().as_ref().unwrap().0, 503);
        assert_eq!(picker.pool().endpoints[0].in_flight, 0);
    }
}
