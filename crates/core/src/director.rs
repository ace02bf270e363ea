//! The director: one pool's decisions for one request. It schedules a prepared request over
//! the data layer's pool (filter -> scorer -> picker, narrowed by the subset hint, the pods'
//! model lists and, under flow control, the pods with room) and turns the pick into what the
//! request carries: destination, fallbacks, prefill host, session token. It keeps no
//! bookkeeping of its own beyond the scheduler's: the pool is the data layer's, the held
//! requests flow control's.

use crate::config::FilterConfig;
use crate::datalayer::DataLayer;
use crate::duration::duration_ms;
use crate::error_response::RequestError;
use crate::metrics::Engine;
use crate::protocol::{
    PROFILE_HEADER, SESSION_TOKEN_HEADER, SLO_TTFT_HEADER, TEST_SELECTION_HEADER,
};
use crate::request::{
    parse_body_keeping, rewrite_model, ApiKind, InferenceRequest, RequestHeaders,
};
use crate::scheduling::plugins::{self, scorer::session_affinity_scorer, Data};
use crate::scheduling::{LearnedPrefix, ScheduleError, Scheduler};

#[cfg(test)]
mod tests;

/// Which optional protocol headers the configuration reads: each is a host call per request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderUse {
    /// `x-session-token`, for `session-affinity-scorer` (which also returns it).
    pub session_token: bool,
    /// `test-epp-endpoint-selection`, for `header-based-testing-filter`.
    pub test_selection: bool,
    /// `x-gateway-inference-objective`, when `pool.objectives` declares any.
    pub objective: bool,
    /// `epp-profile`, for `header-profile-handler`.
    pub profile: bool,
    /// The SLO headers, for `predicted-latency-producer` and flow control's SLO ordering.
    pub slo: bool,
    /// The fairness id headers, for flow control's flows.
    pub fairness: bool,
}

impl HeaderUse {
    /// Headers either reads (a request's pool is known only after its body).
    pub fn union(self, other: HeaderUse) -> HeaderUse {
        HeaderUse {
            session_token: self.session_token || other.session_token,
            test_selection: self.test_selection || other.test_selection,
            objective: self.objective || other.objective,
            profile: self.profile || other.profile,
            slo: self.slo || other.slo,
            fairness: self.fairness || other.fairness,
        }
    }
}

/// Ticks a saturation change must hold before it is announced.
pub const SATURATION_TICKS_TO_ANNOUNCE: u32 = 2;

/// A parsed request, ready to be picked for (now, or when flow control releases it).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub request: InferenceRequest,
    /// The body to forward instead of the client's (after a model rewrite).
    pub rewritten_body: Option<Vec<u8>>,
    /// With `propagatePriority`, the body to forward without the client's `priority`, which
    /// gets the request's once the pick says for which engine.
    pub priority_body: Option<serde_json::Map<String, serde_json::Value>>,
    /// The client's body size, which a rewrite replaces.
    pub body_size: usize,
}

/// The routing outcome handed back to the host edge.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// The primary's `ip:port`: the destination header and metadata value.
    pub destination: String,
    /// The other picks, best first, comma-separated (`maxNumOfEndpoints > 1`); may be empty.
    pub fallbacks: String,
    /// The destination header's value: the primary, or with `pool.destinationList` the
    /// primary and the fallbacks.
    pub header: String,
    /// Pool index of the primary endpoint, whose in-flight count was raised.
    pub primary: usize,
    /// Tokens accounted to the primary until the request ends.
    pub tokens: u64,
    /// `ip:port` of the prefill endpoint when the request is disaggregated.
    pub prefill: Option<String>,
    /// The value for the response's `x-session-token`, when session affinity is configured.
    pub session_token: Option<String>,
    /// The body to forward instead of the client's (after a model rewrite).
    pub rewritten_body: Option<Vec<u8>>,
    pub model: String,
    pub priority: i32,
    /// Set when no endpoint had fresh metrics.
    pub degraded: bool,
    /// The prompt's blocks, kept while Envoy may retry on a fallback: the pod that serves it
    /// learns them.
    pub prompt_blocks: Option<Vec<u64>>,
    /// `x-gateway-destination-endpoint-scores`, with `pool.emitEndpointScores`.
    pub scores: Option<String>,
}

pub struct Director {
    scheduler: Scheduler,
    /// The optional protocol headers this configuration uses; the others are never read.
    header_use: HeaderUse,
    /// Flow control holds this pool's requests: sheddable ones wait rather than being shed,
    /// and a released request goes to a pod with room.
    flow_controlled: bool,
    /// `openai-parser`'s `propagatePriority`: see [`Director::keep_body_for_priority`].
    propagate_priority: bool,
    /// The saturation last announced, and ticks in a row that disagreed with it.
    saturated: bool,
    saturation_streak: u32,
    /// With flow control, which endpoints have room now (reused per request).
    room: Vec<bool>,
}

impl Director {
    pub fn new(config: FilterConfig) -> Self {
        let reads_header = |name: &'static str| {
            config.scheduler.plugins().iter().any(|p| {
                plugins::spec(p.type_name)
                    .is_some_and(|spec| spec.consumes(Data::RequestHeader(name)))
            })
        };
        let header_use = HeaderUse {
            session_token: reads_header(SESSION_TOKEN_HEADER),
            test_selection: reads_header(TEST_SELECTION_HEADER),
            profile: reads_header(PROFILE_HEADER),
            // The latency plugins and flow control's SLO ordering read the same header once.
            slo: reads_header(SLO_TTFT_HEADER)
                || config
                    .flow_control
                    .as_ref()
                    .is_some_and(|flow| flow.orders_by_slo()),
            objective: !config.pool.objectives.is_empty(),
            fairness: config.flow_control.is_some(),
        };
        Director {
            header_use,
            flow_controlled: config.flow_control.is_some(),
            propagate_priority: config.propagate_priority,
            scheduler: config.scheduler,
            saturated: false,
            saturation_streak: 0,
            room: Vec::new(),
        }
    }

    /// Characters of a prompt's text this pool's plugins read.
    pub fn prompt_chars_needed(&self) -> usize {
        self.scheduler.prompt_chars_needed()
    }

    pub fn header_use(&self) -> HeaderUse {
        self.header_use
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The pool's saturation as the saturation detector sees it (flow control's gate, its
    /// gauge and `explain`); `None` when no endpoint is routable.
    pub fn pool_saturation(&self, data: &DataLayer, now_ms: u64) -> Option<f64> {
        self.scheduler.pool_saturation(data.pool(), now_ms)
    }

    /// The pool's saturation at a tick, announced once it changed for
    /// [`SATURATION_TICKS_TO_ANNOUNCE`] ticks in a row: one scrape round on the edge would
    /// otherwise flap the warning on and off.
    pub fn saturation_change(&mut self, data: &DataLayer, now_ms: u64) -> Option<bool> {
        let saturated = self.scheduler.pool_saturated(data.pool(), now_ms);
        if saturated == self.saturated {
            self.saturation_streak = 0;
            return None;
        }
        self.saturation_streak += 1;
        if self.saturation_streak < SATURATION_TICKS_TO_ANNOUNCE {
            return None;
        }
        self.saturation_streak = 0;
        self.saturated = saturated;
        Some(saturated)
    }

    /// The response to a routed request arrived; `served` is where its last upstream attempt
    /// went (Envoy's `upstream.address`) and `failed` says the response is a 5xx. Envoy's
    /// override_host policy gives attempt n the n-th address of the destination list, so every
    /// listed endpoint before `served` failed to take the request (refused, reset, 503), and
    /// `served` too when the answer is a 5xx (the primary when `served` is unknown). Each is
    /// avoided for `pool.passiveHealthBackoff`; the addresses whose back-off this starts are
    /// returned. A request served by a fallback moves its in-flight count there, and the pod
    /// that served it learns the prompt's blocks.
    pub fn report_response(
        &mut self,
        data: &mut DataLayer,
        routed: &mut Routed,
        served: Option<&str>,
        failed: bool,
    ) -> Vec<String> {
        // The usual answer: the first pick served it. Nothing to avoid or move, nothing to
        // allocate.
        if !failed && served.is_none_or(|served| served == routed.destination) {
            data.answered(routed.primary);
            return Vec::new();
        }
        let listed: Vec<&str> = std::iter::once(routed.destination.as_str())
            .chain(routed.fallbacks.split(',').filter(|a| !a.is_empty()))
            .collect();
        let position = served.and_then(|served| listed.iter().position(|a| *a == served));
        let mut unreachable: Vec<&str> =
            listed.iter().take(position.unwrap_or(0)).copied().collect();
        if failed {
            let answered = position.and_then(|p| listed.get(p)).copied();
            unreachable.push(answered.unwrap_or(routed.destination.as_str()));
        }
        let until = data
            .pool()
            .now_ms()
            .saturating_add(duration_ms(data.settings().passive_health_backoff));
        let mut started = Vec::new();
        for address in unreachable {
            if let Some(index) = data.pool().index_of(address) {
                if data.avoid(index, until) {
                    started.push(address.to_owned());
                }
            }
        }
        let moved = position
            .filter(|p| *p > 0)
            .and(served)
            .and_then(|served| data.pool().index_of(served));
        if let Some(index) = moved.filter(|_| !failed) {
            data.answered(index);
        }
        if let Some(index) = moved {
            data.end_in_flight(routed.primary, routed.tokens);
            data.add_in_flight(index, routed.tokens);
            routed.primary = index;
            if let Some(hashes) = routed.prompt_blocks.take() {
                let learned = LearnedPrefix {
                    endpoint: index,
                    hashes,
                };
                self.scheduler.learn_served(&learned);
            }
        }
        started
    }

    /// This pool's part of preparing a parsed request: its body limit and the objective's
    /// priority.
    pub fn complete_prepared(
        data: &DataLayer,
        prepared: &mut Prepared,
    ) -> Result<(), RequestError> {
        let settings = data.settings();
        let limit = settings.max_request_body_bytes;
        if prepared.body_size > limit {
            return Err(RequestError::BodyTooLarge { limit });
        }
        let objective = prepared.request.headers.objective.as_deref();
        prepared.request.priority = settings.priority_of(objective);
        Ok(())
    }

    /// With `propagatePriority`, keeps the body to forward (`body`, or its model rewrite) as a
    /// document without the client's `priority`: the request's own goes in once the pick names
    /// the engine (see [`Director::route_prepared`]).
    pub fn keep_body_for_priority(
        &self,
        prepared: &mut Prepared,
        body: Option<&[u8]>,
    ) -> Result<(), RequestError> {
        let forwarded = prepared.rewritten_body.as_deref().or(body);
        let Some(forwarded) = forwarded.filter(|_| self.propagate_priority) else {
            return Ok(());
        };
        let mut document = crate::request::body_document(forwarded)?;
        document.remove("priority");
        prepared.priority_body = Some(document);
        Ok(())
    }

    /// Schedules a prepared request: on success the primary's in-flight count is raised, and
    /// [`Director::request_ended`] gives it back when the request ends.
    pub fn route_prepared(
        &mut self,
        data: &mut DataLayer,
        prepared: Prepared,
    ) -> Result<Routed, RequestError> {
        let mut routed = self.route_parsed(data, &prepared.request)?;
        routed.rewritten_body = match prepared.priority_body {
            Some(document) => {
                let engine = data.pool().get(routed.primary).map(|e| e.engine);
                let priority = engine_priority(prepared.request.priority, engine);
                Some(with_priority(document, priority)?)
            }
            None => prepared.rewritten_body,
        };
        Ok(routed)
    }

    pub fn route_parsed(
        &mut self,
        data: &mut DataLayer,
        request: &InferenceRequest,
    ) -> Result<Routed, RequestError> {
        let now_ms = data.pool().now_ms();
        // With flow control on, sheddable requests wait in their band like the others.
        if request.priority < 0
            && !self.flow_controlled
            && self.scheduler.pool_saturated(data.pool(), now_ms)
        {
            return Err(RequestError::Shed(format!(
                "the pool is saturated and the request is sheddable (priority {})",
                request.priority
            )));
        }
        let decision = self.schedule(data, request)?;
        let targets = decision.targets();
        let primary = *targets
            .first()
            .ok_or_else(|| RequestError::NoEndpoint("the scheduler picked no endpoint".into()))?;
        // Cached prompt blocks take no new KV space on the pod.
        let cached = u64::from(self.scheduler.last_cycle().cached_tokens(primary));
        let tokens = request.total_tokens().saturating_sub(cached);
        data.add_in_flight(primary, tokens);
        Ok(self.routed(data, request, &decision, primary, tokens))
    }

    /// The scheduler's decision among the candidates: the pool, narrowed by the proxy's subset
    /// hint and, with `models-data-source`, to the pods that report serving the model (nothing
    /// is allocated without a hint).
    fn schedule(
        &mut self,
        data: &DataLayer,
        request: &InferenceRequest,
    ) -> Result<crate::scheduling::Decision, RequestError> {
        let subset = request
            .headers
            .subset_hint
            .as_deref()
            .map(|a| subset_mask(data, a));
        let models = data.models();
        let by_model = models.narrows(&request.model);
        // Flow control let the request go because some pod has room: it goes to one of those,
        // not behind a full pod's queue, which would hold up a high-priority request.
        let mut room = std::mem::take(&mut self.room);
        let by_room = self.flow_controlled
            && self
                .scheduler
                .endpoints_with_room(data.pool(), data.pool().now_ms(), &mut room);
        let model = request.model.as_str();
        let eligible = |index: usize| {
            subset
                .as_ref()
                .is_none_or(|mask| mask.get(index) == Some(&true))
                && (!by_model || models.reports(index, model))
                && (!by_room || room.get(index) == Some(&true))
        };
        let scheduled = self
            .scheduler
            .schedule_where(request, data.pool(), eligible);
        self.room = room;
        scheduled.map_err(|error| match error {
            ScheduleError::NoReachableEndpoint => RequestError::NoEndpoint(error.to_string()),
            ScheduleError::FilteredOut { .. } => RequestError::TooManyRequests(error.to_string()),
            ScheduleError::NotAdmitted => RequestError::Shed(error.to_string()),
        })
    }

    /// What the request carries for the decision: destination, fallbacks, prefill host,
    /// session token, scores.
    fn routed(
        &self,
        data: &DataLayer,
        request: &InferenceRequest,
        decision: &crate::scheduling::Decision,
        primary: usize,
        tokens: u64,
    ) -> Routed {
        let destination = data.address(primary).unwrap_or_default().to_owned();
        let mut fallbacks = String::new();
        for address in decision
            .targets()
            .iter()
            .skip(1)
            .filter_map(|&t| data.address(t))
        {
            if !fallbacks.is_empty() {
                fallbacks.push(',');
            }
            fallbacks.push_str(address);
        }
        let prefill = decision
            .prefill_endpoint()
            .and_then(|index| data.address(index))
            .map(str::to_owned);
        let session_token = self
            .header_use
            .session_token
            .then(|| session_affinity_scorer::token_for(&destination));
        let prompt_blocks = (!fallbacks.is_empty())
            .then(|| self.scheduler.last_prompt_blocks().map(<[u64]>::to_vec))
            .flatten();
        let settings = data.settings();
        let scores = settings
            .emit_endpoint_scores
            .then(|| self.scheduler.scores_json(data.pool()));
        let header = if settings.destination_list && !fallbacks.is_empty() {
            format!("{destination},{fallbacks}")
        } else {
            destination.clone()
        };
        Routed {
            destination,
            fallbacks,
            header,
            primary,
            tokens,
            prefill,
            session_token,
            rewritten_body: None,
            model: request.model.clone(),
            priority: request.priority,
            degraded: decision.degraded,
            prompt_blocks,
            scores,
        }
    }

    /// The request routed to `routed.primary` ended (completed, reset or failed).
    pub fn request_ended(&mut self, data: &mut DataLayer, routed: &Routed) {
        data.end_in_flight(routed.primary, routed.tokens);
    }

    /// A random RFC 4122 version-4 UUID, for requests that arrive without `x-request-id`.
    pub fn new_request_id(&mut self) -> String {
        let high = self.scheduler.random_u64();
        let low = self.scheduler.random_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0x0fff,
            ((low >> 48) & 0x3fff) | 0x8000,
            low & 0xffff_ffff_ffff
        )
    }

    /// Prefix-index entries learned here since the last call, for the other VMs.
    pub fn take_learned(&mut self, out: &mut Vec<LearnedPrefix>) {
        self.scheduler.take_learned(out);
    }

    /// Replays prefix-index entries another VM learned.
    pub fn learn_remote(&mut self, data: &DataLayer, learned: &LearnedPrefix) {
        if learned.endpoint < data.pool().len() {
            self.scheduler.learn_remote(learned);
        }
    }

    /// The last decision, row by row (the config checker prints these).
    pub fn explain_rows<'a>(
        &'a self,
        data: &'a DataLayer,
    ) -> Vec<crate::scheduling::ExplainRow<'a>> {
        self.scheduler.explain_rows(data.pool())
    }

    /// Every scorer's score for the last decision, for the debug log.
    pub fn explain_last(&self, data: &DataLayer) -> String {
        self.scheduler.explain(data.pool())
    }
}

/// `priority` as `engine` reads it: objectives rank higher values first, as SGLang does; vLLM
/// runs lower values first, so it gets the negation.
fn engine_priority(priority: i32, engine: Option<Engine>) -> i64 {
    let priority = i64::from(priority);
    match engine {
        Some(Engine::Vllm) => -priority,
        _ => priority,
    }
}

/// The body with its `priority` field set to `priority`.
fn with_priority(
    mut document: serde_json::Map<String, serde_json::Value>,
    priority: i64,
) -> Result<Vec<u8>, RequestError> {
    document.insert("priority".into(), priority.into());
    crate::request::document_bytes(&document)
}

/// The pool members a subset hint names (addresses outside the pool name none).
fn subset_mask(data: &DataLayer, addresses: &[String]) -> Vec<bool> {
    let mut mask = vec![false; data.pool().len()];
    for address in addresses {
        let canonical = crate::endpoint::canonical_address(address).ok();
        let index = canonical.and_then(|address| data.pool().index_of(&address));
        if let Some(slot) = index.and_then(|index| mask.get_mut(index)) {
            *slot = true;
        }
    }
    mask
}

/// Parses the body (if the API has one) and applies the model rewrite: the part of preparing
/// a request that needs no pool.
/// Only the first `keep_chars` characters of the prompt's text are kept (see
/// [`parse_body_keeping`]).
pub fn parse_prepared(
    api: ApiKind,
    body: Option<&[u8]>,
    headers: RequestHeaders,
    keep_chars: usize,
) -> Result<Prepared, RequestError> {
    let mut request = match (api.is_inference(), body) {
        (true, Some(body)) => parse_body_keeping(api, body, keep_chars)?,
        (true, None) => parse_body_keeping(api, &[], keep_chars)?,
        (false, _) => InferenceRequest::empty(),
    };
    let rewritten_body = match (&headers.model_rewrite, body) {
        (Some(model), Some(body)) if api.is_inference() && *model != request.model => {
            request.model.clone_from(model);
            Some(rewrite_model(body, model)?)
        }
        _ => None,
    };
    request.headers = headers;
    Ok(Prepared {
        request,
        rewritten_body,
        priority_body: None,
        body_size: body.map_or(0, <[u8]>::len),
    })
}
