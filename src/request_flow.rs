//! One request's life in the filter, written against a small host trait so it runs natively
//! in tests: pause the headers, buffer the body, route once, answer errors as JSON.

use crate::error_response::RequestError;
use crate::picker::{Picker, Routed};
use crate::request::{ApiKind, RequestHeaders};

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

/// The GIE fallback header (one endpoint) and Envoy's list form of it.
pub const FALLBACK_HEADER: &str = "x-gateway-destination-endpoint-fallback";
pub const FALLBACKS_HEADER: &str = "x-gateway-destination-endpoint-fallbacks";

/// The llm-d header naming the prefill endpoint of a disaggregated request.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
pub const SESSION_TOKEN_HEADER: &str = "x-session-token";
pub const REQUEST_ID_HEADER: &str = "x-request-id";
const TEST_SELECTION_HEADER: &str = "test-epp-endpoint-selection";
const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// Only shown in the decision log (read there, when debug logging is on).
pub const FAIRNESS_ID_HEADER: &str = "x-gateway-inference-fairness-id";
const MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";

/// What the request flow needs from the proxy.
pub trait HttpHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    fn remove_request_header(&self, name: &str) -> Result<(), HostError>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
    /// Replaces the first `size` bytes of the buffered body (all of it) with `body`.
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError>;
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError>;
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
    headers: RequestHeaders,
    pub request_id: String,
    pub outcome: Outcome,
    /// Set once the request ended, so a late callback cannot release twice.
    released: bool,
}

impl Default for RequestFlow {
    fn default() -> Self {
        RequestFlow {
            api: ApiKind::Other,
            headers: RequestHeaders::default(),
            request_id: String::new(),
            outcome: Outcome::Pending,
            released: false,
        }
    }
}

fn header_text(host: &impl HttpHost, name: &str) -> Option<String> {
    host.request_header(name)
        .map(|value| match String::from_utf8(value) {
            Ok(text) => text,
            Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
        })
        .map(|text| text.trim().to_owned())
        .filter(|value| !value.is_empty())
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
        self.read_protocol_headers(host, picker);
        if end_of_stream || !self.api.is_inference() {
            // No body to read (GET /v1/models) or none we need: route on the headers alone.
            return self.finish(host, picker, None);
        }
        Flow::Pause
    }

    /// Reads the protocol headers the configuration uses; each read is a host call.
    fn read_protocol_headers(&mut self, host: &impl HttpHost, picker: &mut Picker) {
        let uses = picker.header_use();
        let read = |used: bool, name: &str| used.then(|| header_text(host, name)).flatten();
        self.headers = RequestHeaders {
            session_token: read(uses.session_token, SESSION_TOKEN_HEADER),
            test_endpoint_selection: read(uses.test_selection, TEST_SELECTION_HEADER),
            objective: read(uses.objective, OBJECTIVE_HEADER),
            model_rewrite: header_text(host, MODEL_REWRITE_HEADER),
        };
        self.request_id = match header_text(host, REQUEST_ID_HEADER) {
            Some(id) => id,
            None => {
                let id = picker.new_request_id();
                if let Err(error) = host.set_request_header(REQUEST_ID_HEADER, &id) {
                    log::warn!("inference-picker: setting {REQUEST_ID_HEADER}: {error}");
                }
                id
            }
        };
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

    /// Response headers: a 5xx (from the pod, or Envoy's own when it could not connect)
    /// backs the pod off; the session token goes back so the client can stick to the pod.
    pub fn on_response_headers(&mut self, host: &impl HttpHost, picker: &mut Picker) {
        let Outcome::Routed(routed) = &self.outcome else {
            return;
        };
        let status = host.response_header(":status").unwrap_or_default();
        if status.first() == Some(&b'5') && picker.report_upstream_failure(routed) {
            log::warn!(
                "inference-picker: endpoint {} answered {}; avoiding it for {:?}",
                routed.destination,
                String::from_utf8_lossy(&status),
                picker.settings().passive_health_backoff
            );
        }
        if let Some(token) = &routed.session_token {
            if let Err(error) = host.set_response_header(SESSION_TOKEN_HEADER, token) {
                log::warn!("inference-picker: setting {SESSION_TOKEN_HEADER}: {error}");
            }
        }
    }

    /// The request ended, however it ended: give back its in-flight slot, exactly once.
    pub fn on_done(&mut self, picker: &mut Picker) {
        if let (Outcome::Routed(routed), false) = (&self.outcome, self.released) {
            picker.release(routed);
            self.released = true;
        }
    }

    fn finish(&mut self, host: &impl HttpHost, picker: &mut Picker, body: Option<&[u8]>) -> Flow {
        let body_size = body.map_or(0, <[u8]>::len);
        let routed = match picker.route(self.api, body, std::mem::take(&mut self.headers)) {
            Ok(routed) => routed,
            Err(error) => return self.reject(host, error),
        };
        if let Err(error) = apply_routing(host, &routed, body_size) {
            log::error!("inference-picker: applying the decision: {error}");
            picker.release(&routed);
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

/// Writes the decision into the request. The destination and prefiller headers always replace
/// whatever the client sent: the ORIGINAL_DST cluster would otherwise go wherever it asked.
fn apply_routing(host: &impl HttpHost, routed: &Routed, body_size: usize) -> Result<(), HostError> {
    host.set_request_header(DESTINATION_HEADER, &routed.header)?;
    match routed
        .fallbacks
        .split(',')
        .next()
        .filter(|first| !first.is_empty())
    {
        Some(first) => {
            host.set_request_header(FALLBACK_HEADER, first)?;
            host.set_request_header(FALLBACKS_HEADER, &routed.fallbacks)?;
        }
        None => {
            host.remove_request_header(FALLBACK_HEADER)?;
            host.remove_request_header(FALLBACKS_HEADER)?;
        }
    }
    match &routed.prefill {
        Some(prefill) => host.set_request_header(PREFILLER_HEADER, prefill)?,
        None => host.remove_request_header(PREFILLER_HEADER)?,
    }
    if let Some(body) = &routed.rewritten_body {
        host.replace_request_body(body_size, body)?;
        host.set_request_header("content-length", &body.len().to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;
    use crate::harness::test;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    struct FakeHost {
        headers: RefCell<HashMap<String, String>>,
        response_headers: RefCell<HashMap<String, String>>,
        body: RefCell<Vec<u8>>,
        reply: RefCell<Option<(u16, Vec<u8>)>>,
        fail_set_header: bool,
        reads: RefCell<Vec<String>>,
    }

    impl HttpHost for FakeHost {
        fn request_header(&self, name: &str) -> Option<Vec<u8>> {
            self.reads.borrow_mut().push(name.to_string());
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
        fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
            self.headers.borrow_mut().remove(name);
            Ok(())
        }
        fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
            let body = self.body.borrow();
            Ok(body[..size.min(body.len())].to_vec())
        }
        fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
            self.body.borrow_mut().splice(..size, body.iter().copied());
            Ok(())
        }
        fn response_header(&self, name: &str) -> Option<Vec<u8>> {
            self.response_headers
                .borrow()
                .get(name)
                .map(|v| v.as_bytes().to_vec())
        }
        fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
            self.response_headers
                .borrow_mut()
                .insert(name.into(), value.into());
            Ok(())
        }
        fn send_local_reply(&self, status: u16, json_body: &[u8]) -> Result<(), HostError> {
            *self.reply.borrow_mut() = Some((status, json_body.to_vec()));
            Ok(())
        }
    }

    fn host(path: &str, body: &str) -> FakeHost {
        let host = FakeHost {
            body: RefCell::new(body.as_bytes().to_vec()),
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
            flow.on_body(&host, &mut picker, host.body.borrow().len(), true),
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

    fn routed(host: &FakeHost, picker: &mut Picker) -> RequestFlow {
        let mut flow = RequestFlow::default();
        if flow.on_headers(host, picker, false) == Flow::Pause {
            let size = host.body.borrow().len();
            assert_eq!(flow.on_body(host, picker, size, true), Flow::Continue);
        }
        flow
    }

    #[test]
    fn request_id_is_added_only_when_absent() {
        let mut picker = picker();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let flow = routed(&host, &mut picker);
        let id = host.headers.borrow()[REQUEST_ID_HEADER].clone();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(flow.request_id, id);
        let host = host_with(
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &[(REQUEST_ID_HEADER, "abc")],
        );
        let flow = routed(&host, &mut picker);
        assert_eq!(flow.request_id, "abc");
        assert_eq!(host.headers.borrow()[REQUEST_ID_HEADER], "abc");
    }

    #[test]
    fn model_rewrite_changes_the_forwarded_body() {
        let mut picker = picker();
        let body = r#"{"model":"m","prompt":"x","max_tokens":2}"#;
        let host = host_with(
            "/v1/completions",
            body,
            &[("x-gateway-model-name-rewrite", "m-v2")],
        );
        let flow = routed(&host, &mut picker);
        let forwarded: serde_json::Value = serde_json::from_slice(&host.body.borrow()).unwrap();
        assert_eq!(forwarded["model"], "m-v2");
        assert_eq!(forwarded["max_tokens"], 2);
        assert_eq!(
            host.headers.borrow()["content-length"],
            host.body.borrow().len().to_string()
        );
        let Outcome::Routed(routed) = &flow.outcome else {
            panic!("not routed: {:?}", flow.outcome);
        };
        assert_eq!(routed.model, "m-v2");
    }

    #[test]
    fn client_prefiller_header_is_removed() {
        let mut picker = picker();
        let host = host_with(
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &[(PREFILLER_HEADER, "6.6.6.6:1")],
        );
        routed(&host, &mut picker);
        assert!(!host.headers.borrow().contains_key(PREFILLER_HEADER));
    }

    fn host_with(path: &str, body: &str, extra: &[(&str, &str)]) -> FakeHost {
        let host = host(path, body);
        for (name, value) in extra {
            host.headers
                .borrow_mut()
                .insert((*name).into(), (*value).into());
        }
        host
    }

    #[test]
    fn a_5xx_answer_backs_the_pod_off() {
        let mut picker = picker();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut picker);
        host.response_headers
            .borrow_mut()
            .insert(":status".into(), "503".into());
        flow.on_response_headers(&host, &mut picker);
        flow.on_done(&mut picker);
        assert!(picker.pool().endpoints[0].backoff_until_ms > 0);
        // The only pod is backing off: the request still goes somewhere (degraded).
        let flow = routed(&host, &mut picker);
        let Outcome::Routed(routed) = &flow.outcome else {
            panic!("{:?}", flow.outcome);
        };
        assert!(routed.degraded);
    }

    #[test]
    fn only_the_headers_the_configuration_uses_are_read() {
        let mut picker = picker();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        routed(&host, &mut picker);
        let reads = host.reads.borrow().clone();
        for unused in [
            SESSION_TOKEN_HEADER,
            TEST_SELECTION_HEADER,
            OBJECTIVE_HEADER,
        ] {
            assert!(
                !reads.iter().any(|r| r == unused),
                "{unused} read: {reads:?}"
            );
        }
        assert!(reads.iter().any(|r| r == MODEL_REWRITE_HEADER));
    }
}
