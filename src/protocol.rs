//! Header names of the endpoint-picker protocol (GIE / llm-d) and of the plugins that read
//! request headers. One place, so the plugins, the request flow and the CLI agree.

/// The endpoint Envoy sends the request to (`ip:port`).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The first fallback, for Envoy configs that retry on one more endpoint.
pub const FALLBACK_HEADER: &str = "x-gateway-destination-endpoint-fallback";
/// Every fallback, comma-separated, best first.
pub const FALLBACKS_HEADER: &str = "x-gateway-destination-endpoint-fallbacks";
/// The prefill endpoint of a P/D-disaggregated request.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// The pod a session sticks to (base64 of its `ip:port`), read and returned.
pub const SESSION_TOKEN_HEADER: &str = "x-session-token";
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Endpoints a test pins the request to (`header-based-testing-filter`).
pub const TEST_SELECTION_HEADER: &str = "test-epp-endpoint-selection";
/// The request's inference objective (priority), when `pool.objectives` declares any.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// llm-d's name for the objective header; read first when both are present.
pub const LLMD_OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// The tenant a request belongs to, for flow control's fairness (llm-d's name first).
pub const LLMD_FAIRNESS_ID_HEADER: &str = "x-llm-d-inference-fairness-id";
pub const FAIRNESS_ID_HEADER: &str = "x-gateway-inference-fairness-id";
/// A request's TTFT objective in milliseconds (`slo-deadline-ordering-policy`).
pub const SLO_TTFT_HEADER: &str = "x-llm-d-slo-ttft-ms";
pub const SLO_TTFT_LEGACY_HEADER: &str = "x-slo-ttft-ms";
/// On a flow-control refusal: why the request was dropped (as llm-d labels it).
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
pub const MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";
