//! One request's life in the filter, written against a small host trait so it runs natively
//! in tests: pause the headers, buffer the body, route once, answer errors as JSON.

use crate::director::{Admission, Director, Prepared, Release, Routed};
use crate::error_response::RequestError;
use crate::flow_control::{Arrival, DEFAULT_FAIRNESS_ID};
use crate::picker::Picker;
use crate::request::{ApiKind, RequestHeaders};

use crate::host::{HeaderPairs, HostError, HttpHost, SharedData};
use crate::protocol::{
    parse_subset_hint, DESTINATION_HEADER, FAIRNESS_ID_HEADER, FALLBACKS_HEADER, FALLBACK_HEADER,
    LLMD_FAIRNESS_ID_HEADER, LLMD_OBJECTIVE_HEADER, MODEL_REWRITE_HEADER, OBJECTIVE_HEADER,
    PREFILLER_HEADER, PROFILE_HEADER, REQUEST_ID_HEADER, SCORES_HEADER, SESSION_TOKEN_HEADER,
    SLO_TPOT_HEADER, SLO_TPOT_LEGACY_HEADER, SLO_TTFT_HEADER, SLO_TTFT_LEGACY_HEADER,
    TEST_SELECTION_HEADER,
};

/// An SLO header's milliseconds; a value that is not a positive number is no SLO.
fn milliseconds(text: Option<String>) -> Option<f64> {
    text.and_then(|t| t.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms > 0.0)
}

/// Whether the host should hold the request or let it go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Pause,
}

/// What the flow decided, for logs and the in-flight release.
// One per stream, inside the stream's own heap-allocated context: boxing the routed outcome
// would add an allocation per request to save bytes nobody copies.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Pending,
    Routed(Routed),
    Rejected(RequestError),
    /// Flow control holds it; the decision comes back through the director.
    Held,
}

pub struct RequestFlow {
    /// The host's context id: flow control names the held request by it.
    id: u32,
    api: ApiKind,
    headers: RequestHeaders,
    pub request_id: String,
    pub outcome: Outcome,
    /// Set once the request ended, so a late callback cannot release twice.
    released: bool,
    /// Bytes of body buffered so far.
    body_size: usize,
    /// The pool the request's model named (known once the body is parsed).
    pool: usize,
    /// Which protocol headers the client sent (the decision removes those it does not set).
    client_sent: ClientSent,
}

impl Default for RequestFlow {
    fn default() -> Self {
        RequestFlow {
            id: 0,
            api: ApiKind::Other,
            headers: RequestHeaders::default(),
            request_id: String::new(),
            outcome: Outcome::Pending,
            released: false,
            body_size: 0,
            pool: 0,
            client_sent: ClientSent::default(),
        }
    }
}

fn header_text(host: &impl HttpHost, name: &str) -> Option<String> {
    host.request_header(name).and_then(|value| clean(&value))
}

/// A header value as text: lossy UTF-8, trimmed, `None` when empty.
fn clean(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The protocol headers the client sent that the decision removes when it does not set them
/// (so a client's value never reaches a pod); without a header snapshot, each counts as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSent {
    fallback: bool,
    fallbacks: bool,
    prefiller: bool,
}

impl Default for ClientSent {
    fn default() -> Self {
        ClientSent {
            fallback: true,
            fallbacks: true,
            prefiller: true,
        }
    }
}

impl ClientSent {
    fn of(pairs: &HeaderPairs) -> Self {
        ClientSent {
            fallback: pairs.contains(FALLBACK_HEADER),
            fallbacks: pairs.contains(FALLBACKS_HEADER),
            prefiller: pairs.contains(PREFILLER_HEADER),
        }
    }
}

impl RequestFlow {
    pub fn new(id: u32) -> Self {
        RequestFlow {
            id,
            ..RequestFlow::default()
        }
    }

    pub fn on_headers(
        &mut self,
        host: &impl HttpHost,
        picker: &mut Picker,
        end_of_stream: bool,
    ) -> Flow {
        // Every header in one host call: the reads below and the removals the decision can
        // skip are answered from it.
        let pairs = host.request_headers();
        self.api = match &pairs {
            Some(pairs) => ApiKind::from_path(pairs.get(":path").unwrap_or_default()),
            None => ApiKind::from_path(&host.request_header(":path").unwrap_or_default()),
        };
        self.client_sent = pairs.as_ref().map(ClientSent::of).unwrap_or_default();
        self.read_protocol_headers(host, picker, pairs.as_ref());
        if end_of_stream || !self.api.is_inference() {
            // No body to read (GET /v1/models) or none we need: route on the headers alone.
            return self.finish(host, picker, None);
        }
        Flow::Pause
    }

    /// The host's context id of the request's stream.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The pool the request was prepared for.
    pub fn pool(&self) -> usize {
        self.pool
    }

    /// Reads the protocol headers the configuration uses, from `pairs` (or one host call each
    /// without it).
    fn read_protocol_headers(
        &mut self,
        host: &impl HttpHost,
        picker: &mut Picker,
        pairs: Option<&HeaderPairs>,
    ) {
        let uses = picker.header_use();
        let text = |name: &str| match pairs {
            Some(pairs) => pairs.get(name).and_then(clean),
            None => header_text(host, name),
        };
        let read = |used: bool, name: &str| used.then(|| text(name)).flatten();
        self.headers = RequestHeaders {
            session_token: read(uses.session_token, SESSION_TOKEN_HEADER),
            test_endpoint_selection: read(uses.test_selection, TEST_SELECTION_HEADER),
            profile: read(uses.profile, PROFILE_HEADER),
            slo_ttft_ms: milliseconds(
                read(uses.slo, SLO_TTFT_HEADER).or_else(|| read(uses.slo, SLO_TTFT_LEGACY_HEADER)),
            ),
            slo_tpot_ms: milliseconds(
                read(uses.slo, SLO_TPOT_HEADER).or_else(|| read(uses.slo, SLO_TPOT_LEGACY_HEADER)),
            ),
            objective: read(uses.objective, LLMD_OBJECTIVE_HEADER)
                .or_else(|| read(uses.objective, OBJECTIVE_HEADER)),
            model_rewrite: text(MODEL_REWRITE_HEADER),
            // Metadata only: a client header must not steer the pick.
            subset_hint: host.subset_hint().map(|raw| parse_subset_hint(&raw)),
        };
        self.request_id = match text(REQUEST_ID_HEADER) {
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
        let limit = picker.max_request_body_bytes();
        if body_size > limit {
            return self.reject(host, RequestError::BodyTooLarge { limit });
        }
        self.body_size = body_size;
        if !end_of_stream {
            return Flow::Pause;
        }
        self.decide_on_body(host, picker)
    }

    /// Trailers end the stream (HTTP/2 HEADERS after DATA, or after no DATA at all): decide
    /// here, or the paused request would move on undecided with whatever headers the client
    /// sent.
    pub fn on_trailers(&mut self, host: &impl HttpHost, picker: &mut Picker) -> Flow {
        if self.outcome != Outcome::Pending {
            return Flow::Continue;
        }
        self.decide_on_body(host, picker)
    }

    fn decide_on_body(&mut self, host: &impl HttpHost, picker: &mut Picker) -> Flow {
        match host.request_body(self.body_size) {
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

    /// The decision's debug line: where the request went and every score behind it, or why
    /// it was refused.
    pub fn log_decision(&self, host: &impl HttpHost, picker: &Picker) {
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        let Some(director) = picker.director(self.pool) else {
            return;
        };
        let pool = picker
            .slots()
            .get(self.pool)
            .map_or("-", |slot| slot.name.as_str());
        match &self.outcome {
            Outcome::Pending => {}
            Outcome::Routed(routed) => log::debug!(
                "inference-picker: decision request_id={} model={:?} pool={pool} priority={} fairness_id={} picked={} fallbacks={} prefill={} degraded={} {}",
                self.request_id,
                routed.model,
                routed.priority,
                header_text(host, LLMD_FAIRNESS_ID_HEADER)
                    .or_else(|| header_text(host, FAIRNESS_ID_HEADER))
                    .as_deref()
                    .unwrap_or("-"),
                routed.destination,
                if routed.fallbacks.is_empty() { "-" } else { &routed.fallbacks },
                routed.prefill.as_deref().unwrap_or("-"),
                routed.degraded,
                if routed.degraded {
                    String::new()
                } else {
                    director.explain_last()
                }
            ),
            Outcome::Rejected(error) => log::debug!(
                "inference-picker: rejected request_id={} {error}",
                self.request_id
            ),
            Outcome::Held => log::debug!(
                "inference-picker: held request_id={} waiting_here={} pool_saturation={:.2} (flow control: the pool is saturated or others wait first)",
                self.request_id,
                director.flow_control().map_or(0, |flow| flow.local_len()),
                director.pool_saturation(host.now_ms()).unwrap_or(f64::NAN),
            ),
        }
    }

    /// Response headers: the pods that could not take the request back off, those Envoy
    /// retried past (refused, reset, 503: the response came from a later address of the
    /// destination list) and the one that answered 5xx (or Envoy's own 5xx when it could not
    /// connect); the session token goes back so the client can stick to the pod.
    pub fn on_response_headers(&mut self, host: &impl HttpHost, picker: &mut Picker) {
        let Some(director) = picker.director_mut(self.pool) else {
            return;
        };
        self.take_back_dispatched(director);
        let Outcome::Routed(routed) = &mut self.outcome else {
            return;
        };
        let status = host.response_header(":status").unwrap_or_default();
        let failed = status.first() == Some(&b'5');
        // A success without fallbacks came from the pick: no host call to ask where.
        let served = if failed || !routed.fallbacks.is_empty() {
            host.upstream_address()
        } else {
            None
        };
        if failed && served.is_none() {
            // Envoy answered without reaching any upstream (no healthy host, overflow, a
            // route or filter reply): nothing a pod did, so no pod is avoided for it.
            log::warn!(
                "inference-picker: Envoy answered {} for {} before reaching any upstream; no endpoint is avoided for it",
                String::from_utf8_lossy(&status),
                routed.destination,
            );
        } else {
            Self::report(director, routed, served.as_deref(), failed, &status);
        }
        if let Some(token) = &routed.session_token {
            if let Err(error) = host.set_response_header(SESSION_TOKEN_HEADER, token) {
                log::warn!("inference-picker: setting {SESSION_TOKEN_HEADER}: {error}");
            }
        }
    }

    /// Hands the response to the director and logs every endpoint it starts avoiding.
    fn report(
        director: &mut Director,
        routed: &mut Routed,
        served: Option<&str>,
        failed: bool,
        status: &[u8],
    ) {
        let backoff = director.settings().passive_health_backoff;
        for address in director.report_response(routed, served, failed) {
            if failed && served.unwrap_or(&routed.destination) == address {
                log::warn!(
                    "inference-picker: endpoint {address} answered {}; avoiding it for {backoff:?}",
                    String::from_utf8_lossy(status),
                );
            } else {
                log::warn!(
                    "inference-picker: endpoint {address} did not take a request (Envoy retried it on {}); avoiding it for {backoff:?}",
                    served.unwrap_or("-"),
                );
            }
        }
    }

    /// Whether the request was sent to a pod (so its end frees a slot there).
    pub fn was_routed(&self) -> bool {
        matches!(self.outcome, Outcome::Routed(_))
    }

    /// A held request that flow control dispatched becomes a routed one.
    fn take_back_dispatched(&mut self, director: &mut Director) {
        if self.outcome == Outcome::Held {
            if let Some(routed) = director.take_dispatched(self.id) {
                self.outcome = Outcome::Routed(routed);
            }
        }
    }

    /// The request ended, however it ended: give back its in-flight slot, exactly once; a
    /// request still held (its client went away) leaves the queue. Returns how long such a
    /// request had waited.
    pub fn on_done(
        &mut self,
        picker: &mut Picker,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Option<u64> {
        let director = picker.director_mut(self.pool)?;
        self.take_back_dispatched(director);
        if self.outcome == Outcome::Held {
            self.outcome = Outcome::Rejected(RequestError::NoEndpoint(
                "the client went away while the request was held".into(),
            ));
            return director.abandon(self.id, now_ms, store);
        }
        if let (Outcome::Routed(routed), false) = (&self.outcome, self.released) {
            director.release(routed);
            self.released = true;
        }
        None
    }

    fn finish(&mut self, host: &impl HttpHost, picker: &mut Picker, body: Option<&[u8]>) -> Flow {
        let headers = std::mem::take(&mut self.headers);
        let (pool, prepared) = match picker.prepare(self.api, body, headers) {
            Ok(prepared) => prepared,
            Err(error) => return self.reject(host, error),
        };
        self.pool = pool;
        if let Some((header, name)) = picker.pool_label(pool) {
            if let Err(error) = host.set_request_header(header, name) {
                // The client's value would pick the route: refuse rather than guess.
                log::error!("inference-picker: setting {header}: {error}");
                let error = RequestError::NoEndpoint("the pool could not be set".into());
                return self.reject(host, error);
            }
        }
        let Some(director) = picker.director_mut(pool) else {
            return self.reject(
                host,
                RequestError::NoEndpoint("no pool serves this request".into()),
            );
        };
        if director.flow_control().is_none() || !self.api.is_inference() {
            return self.route_now(host, director, prepared);
        }
        let arrival = self.arrival(host, director, &prepared);
        match director.admit(prepared, arrival, host.now_ms(), host.shared_data()) {
            Admission::Now(prepared) => self.route_now(host, director, *prepared),
            Admission::Held => {
                self.outcome = Outcome::Held;
                Flow::Pause
            }
            Admission::Refused(error) => self.reject(host, error),
        }
    }

    /// What flow control needs to queue the request: its flow (fairness id and priority),
    /// size and TTFT objective. The headers are read only with flow control on.
    fn arrival(&self, host: &impl HttpHost, director: &Director, prepared: &Prepared) -> Arrival {
        let fairness_id = header_text(host, LLMD_FAIRNESS_ID_HEADER)
            .or_else(|| header_text(host, FAIRNESS_ID_HEADER))
            .unwrap_or_else(|| DEFAULT_FAIRNESS_ID.to_owned());
        // Read with the other protocol headers (see `HeaderUse::slo`).
        let slo_ttft_ms = director
            .flow_control()
            .is_some_and(|flow| flow.reads_slo_header())
            .then_some(self.headers.slo_ttft_ms)
            .flatten()
            .map(|ms| ms.ceil() as u64);
        Arrival {
            id: self.id,
            request_id: self.request_id.clone(),
            priority: prepared.request.priority,
            fairness_id,
            bytes: prepared.body_size as u64,
            slo_ttft_ms,
        }
    }

    fn route_now(
        &mut self,
        host: &impl HttpHost,
        director: &mut Director,
        prepared: Prepared,
    ) -> Flow {
        let body_size = prepared.body_size;
        let routed = match director.route_prepared(prepared) {
            Ok(routed) => routed,
            Err(error) => return self.reject(host, error),
        };
        if let Err(error) = apply_routing(host, &routed, body_size, self.client_sent) {
            log::error!("inference-picker: applying the decision: {error}");
            director.release(&routed);
            return self.reject(
                host,
                RequestError::NoEndpoint("the destination could not be set".into()),
            );
        }
        self.outcome = Outcome::Routed(routed);
        Flow::Continue
    }

    fn reject(&mut self, host: &impl HttpHost, error: RequestError) -> Flow {
        if let Err(host_error) = host.send_error(&error, self.api.error_shape()) {
            log::error!(
                "inference-picker: sending the {} reply: {host_error}",
                error.status()
            );
        }
        self.outcome = Outcome::Rejected(error);
        Flow::Pause
    }
}

/// What became of a released request on its stream.
#[derive(Debug, PartialEq)]
pub enum Carried {
    /// The decision is written: resume the stream.
    Resume,
    /// The stream was answered with its refusal.
    Answered,
    /// A refusal that must wait for a root callback (see [`carry_out`]).
    Deferred(Release),
}

/// Carries out flow control's release of a held request on its stream (the host is that
/// stream's): writes the decision, or answers with the refusal. A local reply sent from
/// another stream's callback would change how Envoy treats that stream's own return
/// (it stops buffering its body), so with `may_answer` false a refusal is handed back to be
/// sent from a root callback (a tick or a callout answer, within a few ms).
pub fn carry_out(
    host: &impl HttpHost,
    director: &mut Director,
    release: Release,
    may_answer: bool,
) -> Carried {
    let refusal = match release {
        Release::Routed {
            id,
            routed,
            body_size,
            waited_ms,
            request_id,
        } => {
            // A held stream's flow is not at hand here: remove what a client could have sent.
            if let Err(error) = apply_routing(host, &routed, body_size, ClientSent::default()) {
                log::error!("inference-picker: applying a released decision: {error}");
                director.release(&routed);
                Release::Refused {
                    id,
                    request_id,
                    error: RequestError::NoEndpoint("the destination could not be set".into()),
                    waited_ms,
                }
            } else {
                log::debug!(
                    "inference-picker: flow control released request_id={request_id} waited_ms={waited_ms} reason=dispatched picked={} priority={} {}",
                    routed.destination,
                    routed.priority,
                    director.explain_last()
                );
                director.record_dispatched(id, *routed);
                return Carried::Resume;
            }
        }
        refused @ Release::Refused { .. } => refused,
    };
    if !may_answer {
        return Carried::Deferred(refusal);
    }
    if let Release::Refused {
        error,
        waited_ms,
        request_id,
        ..
    } = &refusal
    {
        log::debug!(
            "inference-picker: flow control refused request_id={request_id} waited_ms={waited_ms} reason={} {error}",
            error.dropped_reason().unwrap_or("no-endpoint")
        );
        // The held stream's own path: flow control keeps no API kind for what it holds.
        let path = host.request_header(":path").unwrap_or_default();
        if let Err(host_error) = host.send_error(error, ApiKind::from_path(&path).error_shape()) {
            log::error!(
                "inference-picker: sending the {} reply: {host_error}",
                error.status()
            );
        }
    }
    Carried::Answered
}

/// Writes the decision into the request. The destination and prefiller headers always replace
/// whatever the client sent: the ORIGINAL_DST cluster would otherwise go wherever it asked.
/// `sent` says which headers the client sent that the decision must remove when it does not
/// set them.
fn apply_routing(
    host: &impl HttpHost,
    routed: &Routed,
    body_size: usize,
    sent: ClientSent,
) -> Result<(), HostError> {
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
            if sent.fallback {
                host.remove_request_header(FALLBACK_HEADER)?;
            }
            if sent.fallbacks {
                host.remove_request_header(FALLBACKS_HEADER)?;
            }
        }
    }
    match &routed.prefill {
        Some(prefill) => host.set_request_header(PREFILLER_HEADER, prefill)?,
        None if sent.prefiller => host.remove_request_header(PREFILLER_HEADER)?,
        None => {}
    }
    if let Some(scores) = &routed.scores {
        host.set_request_header(SCORES_HEADER, scores)?;
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
    use crate::host::fake::{FakeHost, FakeShared};
    use std::cell::RefCell;

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

    /// The one pool's director of a test picker.
    fn only(picker: &Picker) -> &Director {
        picker.director(0).unwrap()
    }

    fn director() -> Picker {
        let mut director =
            Director::new(load("pool: {endpoints: [{address: '127.0.0.1:8001'}]}", 1).unwrap());
        director
            .on_scrape_ok(0, 0, "vllm:num_requests_waiting 0\n")
            .unwrap();
        director.on_tick(0);
        Picker::single(director)
    }

    #[test]
    fn body_is_buffered_then_routed_and_client_header_overwritten() {
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut director = director();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut director, false), Flow::Pause);
        assert_eq!(flow.on_body(&host, &mut director, 5, false), Flow::Pause);
        assert_eq!(
            flow.on_body(&host, &mut director, host.body.borrow().len(), true),
            Flow::Continue
        );
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
        assert_eq!(only(&director).pool().endpoints[0].in_flight, 1);
        flow.on_done(&mut director, 0, &FakeShared::default());
        flow.on_done(&mut director, 0, &FakeShared::default());
        assert_eq!(
            only(&director).pool().endpoints[0].in_flight,
            0,
            "released exactly once"
        );
    }

    #[test]
    fn trailers_end_the_stream_and_the_request_is_decided_there() {
        let body = r#"{"model":"m","prompt":"x"}"#;
        let host = host("/v1/%63ompletions", body);
        let mut director = director();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut director, false), Flow::Pause);
        assert_eq!(
            flow.on_body(&host, &mut director, body.len(), false),
            Flow::Pause
        );
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "6.6.6.6:22");
        assert_eq!(flow.on_trailers(&host, &mut director), Flow::Continue);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
        assert_eq!(
            flow.on_trailers(&host, &mut director),
            Flow::Continue,
            "decided once"
        );
        assert_eq!(only(&director).pool().endpoints[0].in_flight, 1);
    }

    #[test]
    fn trailers_without_data_get_the_body_error() {
        let host = host("/v1/chat/completions", "");
        let mut director = director();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut director, false), Flow::Pause);
        assert_eq!(flow.on_trailers(&host, &mut director), Flow::Pause);
        assert_eq!(host.reply.borrow().as_ref().unwrap().0, 400);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "6.6.6.6:22");
    }

    #[test]
    fn get_without_body_is_routed_at_headers() {
        let host = host("/v1/models", "");
        let mut director = director();
        let mut flow = RequestFlow::default();
        assert_eq!(flow.on_headers(&host, &mut director, true), Flow::Continue);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8001");
    }

    #[test]
    fn errors_become_json_replies() {
        let mut director = director();
        for (path, body, end_at_headers, status) in [
            ("/v1/chat/completions", "{oops", false, 400),
            ("/v1/completions", r#"{"prompt":"x"}"#, false, 400),
            ("/v1/completions", "", true, 400),
        ] {
            let host = host(path, body);
            let mut flow = RequestFlow::default();
            if flow.on_headers(&host, &mut director, end_at_headers) == Flow::Pause
                && !end_at_headers
            {
                flow.on_body(&host, &mut director, body.len(), true);
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
        assert_eq!(only(&director).pool().endpoints[0].in_flight, 0);
    }

    #[test]
    fn oversized_body_is_413_before_buffering_completes() {
        let host = host("/v1/completions", "");
        let mut director = director();
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &mut director, false);
        let limit = only(&director).settings().max_request_body_bytes;
        assert_eq!(
            flow.on_body(&host, &mut director, limit + 1, false),
            Flow::Pause
        );
        assert_eq!(host.reply.borrow().as_ref().unwrap().0, 413);
    }

    #[test]
    fn failing_to_set_the_header_refuses_and_releases() {
        let mut host = host("/v1/models", "");
        host.fail_set_header = true;
        let mut director = director();
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &mut director, true);
        assert_eq!(host.reply.borrow().as_ref().unwrap().0, 503);
        assert_eq!(only(&director).pool().endpoints[0].in_flight, 0);
    }

    fn routed(host: &FakeHost, director: &mut Picker) -> RequestFlow {
        let mut flow = RequestFlow::default();
        if flow.on_headers(host, director, false) == Flow::Pause {
            let size = host.body.borrow().len();
            assert_eq!(flow.on_body(host, director, size, true), Flow::Continue);
        }
        flow
    }

    #[test]
    fn request_id_is_added_only_when_absent() {
        let mut director = director();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let flow = routed(&host, &mut director);
        let id = host.headers.borrow()[REQUEST_ID_HEADER].clone();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(flow.request_id, id);
        let host = host_with(
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &[(REQUEST_ID_HEADER, "abc")],
        );
        let flow = routed(&host, &mut director);
        assert_eq!(flow.request_id, "abc");
        assert_eq!(host.headers.borrow()[REQUEST_ID_HEADER], "abc");
    }

    #[test]
    fn model_rewrite_changes_the_forwarded_body() {
        let mut director = director();
        let body = r#"{"model":"m","prompt":"x","max_tokens":2}"#;
        let host = host_with(
            "/v1/completions",
            body,
            &[("x-gateway-model-name-rewrite", "m-v2")],
        );
        let flow = routed(&host, &mut director);
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
        let mut director = director();
        let host = host_with(
            "/v1/completions",
            r#"{"model":"m","prompt":"x"}"#,
            &[(PREFILLER_HEADER, "6.6.6.6:1")],
        );
        routed(&host, &mut director);
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
        let mut director = director();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut director);
        host.response_headers
            .borrow_mut()
            .insert(":status".into(), "503".into());
        let Outcome::Routed(routed_to) = &flow.outcome else {
            panic!("routed");
        };
        *host.upstream.borrow_mut() = Some(routed_to.destination.clone());
        flow.on_response_headers(&host, &mut director);
        flow.on_done(&mut director, 0, &FakeShared::default());
        assert!(only(&director).pool().endpoints[0].backoff_until_ms > 0);
        // The only pod is backing off: the request still goes somewhere (degraded).
        let flow = routed(&host, &mut director);
        let Outcome::Routed(routed) = &flow.outcome else {
            panic!("{:?}", flow.outcome);
        };
        assert!(routed.degraded);
    }

    /// Three pods, pod 0 preferred (shortest queue), with two fallbacks in the header.
    fn director_with_fallbacks() -> Picker {
        let config = "plugins: [{type: queue-scorer}, {type: max-score-picker, parameters: {maxNumOfEndpoints: 3}}]\n\
                      pool: {destinationList: true, endpoints: [{address: '127.0.0.1:8001'}, {address: '127.0.0.1:8002'}, {address: '127.0.0.1:8003'}]}";
        let mut director = Director::new(load(config, 1).unwrap());
        for (index, waiting) in [(0, 0), (1, 1), (2, 2)] {
            director
                .on_scrape_ok(index, 0, &format!("vllm:num_requests_waiting {waiting}\n"))
                .unwrap();
        }
        director.on_tick(0);
        Picker::single(director)
    }

    fn respond(
        host: &FakeHost,
        flow: &mut RequestFlow,
        director: &mut Picker,
        status: &str,
        served: &str,
    ) {
        host.response_headers
            .borrow_mut()
            .insert(":status".into(), status.into());
        *host.upstream.borrow_mut() = Some(served.into());
        flow.on_response_headers(host, director);
    }

    fn backing_off(director: &Picker) -> Vec<bool> {
        only(director)
            .pool()
            .endpoints
            .iter()
            .map(|e| e.backoff_until_ms > 0)
            .collect()
    }

    #[test]
    fn a_request_envoy_retried_on_a_fallback_backs_the_skipped_pods_off() {
        let mut director = director_with_fallbacks();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut director);
        assert_eq!(
            host.headers.borrow()[DESTINATION_HEADER],
            "127.0.0.1:8001,127.0.0.1:8002,127.0.0.1:8003"
        );
        // The primary refused the connection; the first fallback answered.
        respond(&host, &mut flow, &mut director, "200", "127.0.0.1:8002");
        assert_eq!(backing_off(&director), [true, false, false]);
        let in_flight: Vec<u32> = only(&director)
            .pool()
            .endpoints
            .iter()
            .map(|e| e.in_flight)
            .collect();
        assert_eq!(
            in_flight,
            [0, 1, 0],
            "the count moved to the pod serving it"
        );
        flow.on_done(&mut director, 0, &FakeShared::default());
        assert!(only(&director)
            .pool()
            .endpoints
            .iter()
            .all(|e| e.in_flight == 0));
        // The next request is not offered to the pod that could not take the last one.
        let host = host_with("/v1/completions", r#"{"model":"m","prompt":"y"}"#, &[]);
        routed(&host, &mut director);
        assert_eq!(
            host.headers.borrow()[DESTINATION_HEADER],
            "127.0.0.1:8002,127.0.0.1:8003"
        );
    }

    #[test]
    fn served_by_the_primary_backs_nothing_off_and_a_last_503_backs_every_attempt_off() {
        let mut director = director_with_fallbacks();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut director);
        respond(&host, &mut flow, &mut director, "200", "127.0.0.1:8001");
        assert_eq!(backing_off(&director), [false, false, false]);
        flow.on_done(&mut director, 0, &FakeShared::default());
        // Every attempt failed; Envoy's 503 comes after the last one, on the third address.
        let mut flow = routed(&host, &mut director);
        respond(&host, &mut flow, &mut director, "503", "127.0.0.1:8003");
        assert_eq!(backing_off(&director), [true, true, true]);
        flow.on_done(&mut director, 0, &FakeShared::default());
        assert!(only(&director)
            .pool()
            .endpoints
            .iter()
            .all(|e| e.in_flight == 0));
    }

    #[test]
    fn a_503_envoy_made_without_reaching_a_pod_backs_nothing_off() {
        let mut director = director_with_fallbacks();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut director);
        // No healthy upstream: Envoy answers itself and the property is absent.
        host.response_headers
            .borrow_mut()
            .insert(":status".into(), "503".into());
        *host.upstream.borrow_mut() = None;
        flow.on_response_headers(&host, &mut director);
        assert_eq!(backing_off(&director), [false, false, false]);
        flow.on_done(&mut director, 0, &FakeShared::default());
        // The same 503 after reaching the pick is the pick's.
        let mut flow = routed(&host, &mut director);
        respond(&host, &mut flow, &mut director, "503", "127.0.0.1:8001");
        assert_eq!(backing_off(&director), [true, false, false]);
        flow.on_done(&mut director, 0, &FakeShared::default());
    }

    #[test]
    fn an_address_outside_the_list_says_nothing_about_the_listed_pods() {
        let mut director = director_with_fallbacks();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        let mut flow = routed(&host, &mut director);
        respond(&host, &mut flow, &mut director, "200", "10.9.9.9:80");
        assert_eq!(backing_off(&director), [false, false, false]);
        flow.on_done(&mut director, 0, &FakeShared::default());
        assert!(only(&director)
            .pool()
            .endpoints
            .iter()
            .all(|e| e.in_flight == 0));
    }

    #[test]
    fn the_request_headers_are_read_in_one_host_call() {
        let mut director = director();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        routed(&host, &mut director);
        let reads = host.reads.borrow().clone();
        assert_eq!(reads, ["*"], "one snapshot, no header read one by one");
    }

    #[test]
    fn protocol_headers_a_client_sent_are_removed_and_absent_ones_left_alone() {
        let mut director = director();
        let host = host("/v1/completions", r#"{"model":"m","prompt":"x"}"#);
        for name in [FALLBACK_HEADER, FALLBACKS_HEADER, PREFILLER_HEADER] {
            host.headers
                .borrow_mut()
                .insert(name.into(), "6.6.6.6:22".into());
        }
        routed(&host, &mut director);
        let headers = host.headers.borrow();
        for name in [FALLBACK_HEADER, FALLBACKS_HEADER, PREFILLER_HEADER] {
            assert!(!headers.contains_key(name), "{name} survived");
        }
        assert_eq!(headers[DESTINATION_HEADER], "127.0.0.1:8001");
        // Without a snapshot every one of them counts as sent.
        assert_eq!(
            ClientSent::default(),
            ClientSent {
                fallback: true,
                fallbacks: true,
                prefiller: true
            }
        );
    }

    #[test]
    fn a_refusal_is_sent_only_from_a_root_callback() {
        let mut director = director();
        let refusal = || Release::Refused {
            id: 7,
            request_id: "r".into(),
            error: RequestError::Dropped(crate::error_response::Dropped::TtlExpired),
            waited_ms: 5,
        };
        let host = host("/v1/completions", "");
        assert_eq!(
            carry_out(&host, director.director_mut(0).unwrap(), refusal(), false),
            Carried::Deferred(refusal())
        );
        assert!(
            host.reply.borrow().is_none(),
            "nothing sent from a stream callback"
        );
        assert_eq!(
            carry_out(&host, director.director_mut(0).unwrap(), refusal(), true),
            Carried::Answered
        );
        assert_eq!(host.reply.borrow().as_ref().map(|r| r.0), Some(429));
    }

    fn two_pools() -> Picker {
        let text = "poolHeader: x-gateway-inference-pool\npools:\n\
                    - {name: llama, models: [llama-3, sql-lora], endpoints: [{address: '127.0.0.1:8001'}]}\n\
                    - {name: qwen, models: ['qwen-*'], endpoints: [{address: '127.0.0.1:8002'}]}\n";
        let set = crate::config::load_set(text, 1, false).unwrap();
        let header = set.pool_header.clone();
        let slots = set
            .pools
            .into_iter()
            .map(|pool| {
                let models = pool.router_models();
                let mut director = Director::new(pool.config);
                director
                    .on_scrape_ok(0, 0, "vllm:num_requests_waiting 0\n")
                    .unwrap();
                director.on_tick(0);
                let slot = crate::picker::PoolSlot {
                    name: pool.name,
                    director,
                };
                (slot, models)
            })
            .collect();
        Picker::new(slots, header)
    }

    #[test]
    fn the_model_picks_the_pool_and_its_name_is_written() {
        let mut picker = two_pools();
        for (model, endpoint, pool) in [
            ("qwen-7b", "127.0.0.1:8002", "qwen"),
            ("sql-lora", "127.0.0.1:8001", "llama"),
        ] {
            let host = host(
                "/v1/completions",
                &format!(r#"{{"model":"{model}","prompt":"x"}}"#),
            );
            let mut flow = routed(&host, &mut picker);
            assert_eq!(host.headers.borrow()[DESTINATION_HEADER], endpoint);
            assert_eq!(host.headers.borrow()["x-gateway-inference-pool"], pool);
            assert_eq!(picker.slots()[flow.pool()].name, pool);
            flow.on_done(&mut picker, 0, &FakeShared::default());
        }
        let in_flight = |p: usize| picker.director(p).unwrap().pool().endpoints[0].in_flight;
        assert_eq!(
            (in_flight(0), in_flight(1)),
            (0, 0),
            "each released in its own pool"
        );
    }

    #[test]
    fn a_model_no_pool_serves_is_a_404_naming_it() {
        let mut picker = two_pools();
        let host = host(
            "/v1/chat/completions",
            r#"{"model":"mistral","messages":[]}"#,
        );
        let mut flow = RequestFlow::default();
        flow.on_headers(&host, &mut picker, false);
        flow.on_body(&host, &mut picker, host.body.borrow().len(), true);
        let (status, body) = host.reply.borrow().clone().unwrap();
        assert_eq!(status, 404);
        assert!(String::from_utf8_lossy(&body).contains("`mistral` does not exist"));
        assert_eq!(
            host.headers.borrow()[DESTINATION_HEADER],
            "6.6.6.6:22",
            "never routed"
        );
    }

    #[test]
    fn the_rewritten_model_picks_the_pool() {
        let mut picker = two_pools();
        let host = host("/v1/completions", r#"{"model":"llama-3","prompt":"x"}"#);
        host.headers
            .borrow_mut()
            .insert(MODEL_REWRITE_HEADER.into(), "qwen-14b".into());
        routed(&host, &mut picker);
        assert_eq!(host.headers.borrow()[DESTINATION_HEADER], "127.0.0.1:8002");
    }

    #[test]
    fn messages_api_refusals_are_anthropic_shaped() {
        let anthropic = |host: &FakeHost| {
            let (status, json) = host.reply.borrow().clone().unwrap();
            let body: serde_json::Value = serde_json::from_slice(&json).unwrap();
            assert_eq!(body["type"], "error", "{body}");
            (
                status,
                body["error"]["type"].as_str().unwrap_or("").to_owned(),
            )
        };
        let mut director = director();
        let bad = host("/v1//messages/", "{oops");
        let mut flow = RequestFlow::default();
        flow.on_headers(&bad, &mut director, false);
        flow.on_body(&bad, &mut director, 5, true);
        assert_eq!(anthropic(&bad), (400, "invalid_request_error".into()));
        let held = host("/v1/messages", "");
        let refusal = Release::Refused {
            id: 7,
            request_id: "r".into(),
            error: RequestError::Dropped(crate::error_response::Dropped::QueueFullNoEndpoints),
            waited_ms: 5,
        };
        carry_out(&held, director.director_mut(0).unwrap(), refusal, true);
        assert_eq!(anthropic(&held), (503, "overloaded_error".into()));
    }
}
