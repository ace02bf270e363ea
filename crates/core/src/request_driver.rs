//! One request's life in the filter, written against a small host trait so it runs natively
//! in tests: pause the headers, buffer the body, route once, answer errors as JSON.

use crate::director::{Prepared, Routed};
use crate::error_response::RequestError;
use crate::flow_control::queue::Queue;
use crate::flow_control::{Arrival, DEFAULT_FAIRNESS_ID};
use crate::request::{ApiKind, RequestHeaders};
use crate::router::{Decided, PoolRouter, PoolSlot};

use crate::config::peers::PEER_SECRET_HEADER;
use crate::host::{HeaderPairs, HostError, HttpHost, SharedData};
use crate::peers::serve;
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
pub enum Next {
    Continue,
    Pause,
}

/// What the request driver decided, for logs and for ending the request.
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

pub struct RequestDriver {
    /// The host's context id: flow control names the held request by it.
    id: u32,
    api: ApiKind,
    headers: RequestHeaders,
    pub request_id: String,
    pub outcome: Outcome,
    /// A request for the peer path, answered here: `Some(true)` when it was refused.
    pub peer_reply: Option<bool>,
    /// A client's request, counted among the VM's open ones until its stream ends.
    pub(crate) counted_open: bool,
    /// Set once the request ended, so a late callback cannot give its slot back twice.
    ended: bool,
    /// Bytes of body buffered so far.
    body_size: usize,
    /// The pool the request's model named (known once the body is parsed).
    pool: usize,
    /// Which protocol headers the client sent (the decision removes those it does not set).
    client_sent: ClientSent,
    /// The fairness id, read with the other protocol headers when flow control is on.
    fairness_id: Option<String>,
}

impl Default for RequestDriver {
    fn default() -> Self {
        RequestDriver {
            id: 0,
            api: ApiKind::Other,
            headers: RequestHeaders::default(),
            request_id: String::new(),
            outcome: Outcome::Pending,
            peer_reply: None,
            counted_open: false,
            ended: false,
            body_size: 0,
            pool: 0,
            client_sent: ClientSent::default(),
            fairness_id: None,
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

impl RequestDriver {
    pub fn new(id: u32) -> Self {
        RequestDriver {
            id,
            ..RequestDriver::default()
        }
    }

    pub fn on_headers(
        &mut self,
        host: &impl HttpHost,
        router: &mut PoolRouter,
        end_of_stream: bool,
    ) -> Next {
        // Every header in one host call: the reads below and the removals the decision can
        // skip are answered from it.
        let pairs = host.request_headers();
        let path = match &pairs {
            Some(pairs) => std::borrow::Cow::Borrowed(pairs.get(":path").unwrap_or_default()),
            None => std::borrow::Cow::Owned(host.request_header(":path").unwrap_or_default()),
        };
        if let Some(next) = self.answer_peer(host, router, &path, pairs.as_ref()) {
            return next;
        }
        self.api = ApiKind::from_path(&path);
        self.client_sent = pairs.as_ref().map(ClientSent::of).unwrap_or_default();
        self.read_protocol_headers(host, router, pairs.as_ref());
        if end_of_stream || !self.api.is_inference() {
            // No body to read (GET /v1/models) or none we need: route on the headers alone.
            return self.finish(host, router, None);
        }
        Next::Pause
    }

    /// A request for a pool's peer path (`pool.peers`) is answered here, never routed: with
    /// the replica's state on the peer port to a caller with the secret, refused otherwise.
    fn answer_peer(
        &mut self,
        host: &impl HttpHost,
        router: &PoolRouter,
        path: &[u8],
        pairs: Option<&HeaderPairs>,
    ) -> Option<Next> {
        let path = std::str::from_utf8(path).ok()?;
        let (config, key) = router.slots().iter().find_map(|slot| {
            let config = slot.data.settings().peers.as_ref()?;
            serve::asks_for(config, path).then_some((config, slot.peer_keys.as_ref()?))
        })?;
        let secret = match pairs {
            Some(pairs) => pairs.get(PEER_SECRET_HEADER).map(<[u8]>::to_vec),
            None => host.request_header(PEER_SECRET_HEADER),
        };
        let secret = secret.and_then(|s| String::from_utf8(s).ok());
        let port = host.destination_port();
        let reply = serve::reply(
            config,
            host.shared_data(),
            key,
            path,
            port,
            secret.as_deref(),
        );
        if reply.refused {
            log::warn!(
                "inference-picker: refused a request for the peer path on port {port:?} (status {})",
                reply.status
            );
        }
        if let Err(error) = host.send_answer(reply.status, &reply.body) {
            log::error!("inference-picker: answering a peer: {error}");
        }
        self.peer_reply = Some(reply.refused);
        Some(Next::Pause)
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
        router: &mut PoolRouter,
        pairs: Option<&HeaderPairs>,
    ) {
        let uses = router.header_use();
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
        self.fairness_id = read(uses.fairness, LLMD_FAIRNESS_ID_HEADER)
            .or_else(|| read(uses.fairness, FAIRNESS_ID_HEADER));
        self.request_id = match text(REQUEST_ID_HEADER) {
            Some(id) => id,
            None => {
                let id = router.new_request_id();
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
        router: &mut PoolRouter,
        body_size: usize,
        end_of_stream: bool,
    ) -> Next {
        if self.outcome != Outcome::Pending {
            return Next::Continue;
        }
        let limit = router.max_request_body_bytes();
        if body_size > limit {
            return self.reject(host, RequestError::BodyTooLarge { limit });
        }
        self.body_size = body_size;
        if !end_of_stream {
            return Next::Pause;
        }
        self.decide_on_body(host, router)
    }

    /// Trailers end the stream (HTTP/2 HEADERS after DATA, or after no DATA at all): decide
    /// here, or the paused request would move on undecided with whatever headers the client
    /// sent.
    pub fn on_trailers(&mut self, host: &impl HttpHost, router: &mut PoolRouter) -> Next {
        if self.outcome != Outcome::Pending {
            return Next::Continue;
        }
        self.decide_on_body(host, router)
    }

    fn decide_on_body(&mut self, host: &impl HttpHost, router: &mut PoolRouter) -> Next {
        match host.request_body(self.body_size) {
            Ok(body) => self.finish(host, router, Some(&body)),
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
    pub fn log_decision(&self, host: &impl HttpHost, router: &PoolRouter) {
        if !log::log_enabled!(log::Level::Debug) {
            return;
        }
        let Some(slot) = router.slot(self.pool) else {
            return;
        };
        let pool = slot.name.as_str();
        match &self.outcome {
            Outcome::Pending => {}
            Outcome::Routed(routed) => log::debug!(
                "inference-picker: decision request_id={} model={:?} pool={pool} priority={} fairness_id={} picked={} fallbacks={} prefill={} degraded={} {}",
                self.request_id,
                routed.model,
                routed.priority,
                self.fairness_id.as_deref().unwrap_or("-"),
                routed.destination,
                if routed.fallbacks.is_empty() { "-" } else { &routed.fallbacks },
                routed.prefill.as_deref().unwrap_or("-"),
                routed.degraded,
                if routed.degraded {
                    String::new()
                } else {
                    slot.director.explain_last(&slot.data)
                }
            ),
            Outcome::Rejected(error) => log::debug!(
                "inference-picker: rejected request_id={} {error}",
                self.request_id
            ),
            Outcome::Held => log::debug!(
                "inference-picker: held request_id={} waiting_here={} pool_saturation={:.2} kept_for_higher_bands={} (flow control: the pool is saturated, others wait first, or the free slots are kept for higher bands)",
                self.request_id,
                slot.queue.as_ref().map_or(0, |queue| queue.control().local_len()),
                slot.director
                    .pool_saturation(&slot.data, host.now_ms())
                    .unwrap_or(f64::NAN),
                slot.queue.as_ref().map_or(0, Queue::last_kept),
            ),
        }
    }

    /// Response headers: the pods that could not take the request back off, those Envoy
    /// retried past (refused, reset, 503: the response came from a later address of the
    /// destination list) and the one that answered 5xx (or Envoy's own 5xx when it could not
    /// connect); the session token goes back so the client can stick to the pod.
    pub fn on_response_headers(&mut self, host: &impl HttpHost, router: &mut PoolRouter) {
        let Some(slot) = router.slot_mut(self.pool) else {
            return;
        };
        self.take_back_dispatched(slot);
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
            Self::report(slot, routed, served.as_deref(), failed, &status);
        }
        if let Some(token) = &routed.session_token {
            if let Err(error) = host.set_response_header(SESSION_TOKEN_HEADER, token) {
                log::warn!("inference-picker: setting {SESSION_TOKEN_HEADER}: {error}");
            }
        }
    }

    /// Hands the response to the director and logs every endpoint it starts avoiding.
    fn report(
        slot: &mut PoolSlot,
        routed: &mut Routed,
        served: Option<&str>,
        failed: bool,
        status: &[u8],
    ) {
        let backoff = slot.data.settings().passive_health_backoff;
        let avoided = slot
            .director
            .report_response(&mut slot.data, routed, served, failed);
        for address in avoided {
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
    fn take_back_dispatched(&mut self, slot: &mut PoolSlot) {
        if self.outcome == Outcome::Held {
            let queue = slot.queue.as_mut();
            if let Some(routed) = queue.and_then(|queue| queue.take_dispatched(self.id)) {
                self.outcome = Outcome::Routed(routed);
            }
        }
    }

    /// The request ended, however it ended: give back its in-flight slot, exactly once; a
    /// request still held (its client went away) leaves the queue. Returns how long such a
    /// request had waited.
    pub fn on_done(
        &mut self,
        router: &mut PoolRouter,
        now_ms: u64,
        store: &dyn SharedData,
    ) -> Option<u64> {
        let slot = router.slot_mut(self.pool)?;
        self.take_back_dispatched(slot);
        if self.outcome == Outcome::Held {
            self.outcome = Outcome::Rejected(RequestError::NoEndpoint(
                "the client went away while the request was held".into(),
            ));
            return slot.queue.as_mut()?.abandon(self.id, now_ms, store);
        }
        if let (Outcome::Routed(routed), false) = (&self.outcome, self.ended) {
            slot.director.request_ended(&mut slot.data, routed);
            self.ended = true;
        }
        None
    }

    fn finish(
        &mut self,
        host: &impl HttpHost,
        router: &mut PoolRouter,
        body: Option<&[u8]>,
    ) -> Next {
        let headers = std::mem::take(&mut self.headers);
        let (pool, prepared) = match router.prepare(self.api, body, headers) {
            Ok(prepared) => prepared,
            Err(error) => return self.reject(host, error),
        };
        self.pool = pool;
        if let Some((header, name)) = router.pool_label(pool) {
            if let Err(error) = host.set_request_header(header, name) {
                // The client's value would pick the route: refuse rather than guess.
                log::error!("inference-picker: setting {header}: {error}");
                let error = RequestError::NoEndpoint("the pool could not be set".into());
                return self.reject(host, error);
            }
        }
        let Some(slot) = router.slot_mut(pool) else {
            return self.reject(
                host,
                RequestError::NoEndpoint("no pool serves this request".into()),
            );
        };
        let arrival = match &slot.queue {
            Some(queue) if self.api.is_inference() => {
                Some(self.arrival(queue.control().reads_slo_header(), &prepared))
            }
            _ => None,
        };
        let body_size = prepared.body_size;
        match slot.decide(prepared, arrival, host.now_ms(), host.shared_data()) {
            Decided::Routed(routed) => self.write_routed(host, slot, routed, body_size),
            Decided::Held => {
                self.outcome = Outcome::Held;
                Next::Pause
            }
            Decided::Refused(error) => self.reject(host, error),
        }
    }

    /// What flow control needs to queue the request: its flow (fairness id and priority),
    /// size and TTFT objective, from the protocol headers read once at the start.
    fn arrival(&self, reads_slo: bool, prepared: &Prepared) -> Arrival {
        let fairness_id = self
            .fairness_id
            .clone()
            .unwrap_or_else(|| DEFAULT_FAIRNESS_ID.to_owned());
        let slo_ttft_ms = reads_slo
            .then_some(prepared.request.headers.slo_ttft_ms)
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

    /// Writes the decision into the request and lets it go on.
    fn write_routed(
        &mut self,
        host: &impl HttpHost,
        slot: &mut PoolSlot,
        routed: Routed,
        body_size: usize,
    ) -> Next {
        if let Err(error) = write_decision(host, &routed, body_size, self.client_sent) {
            log::error!("inference-picker: applying the decision: {error}");
            slot.director.request_ended(&mut slot.data, &routed);
            return self.reject(
                host,
                RequestError::NoEndpoint("the destination could not be set".into()),
            );
        }
        self.outcome = Outcome::Routed(routed);
        Next::Continue
    }

    fn reject(&mut self, host: &impl HttpHost, error: RequestError) -> Next {
        if let Err(host_error) = host.send_error(&error, self.api.error_shape()) {
            log::error!(
                "inference-picker: sending the {} reply: {host_error}",
                error.status()
            );
        }
        self.outcome = Outcome::Rejected(error);
        Next::Pause
    }
}

/// Writes the decision into the request. The destination and prefiller headers always replace
/// whatever the client sent: the ORIGINAL_DST cluster would otherwise go wherever it asked.
/// `sent` says which headers the client sent that the decision must remove when it does not
/// set them.
pub fn write_decision(
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
mod tests;
