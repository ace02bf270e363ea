//! Header names of the endpoint-picker protocol (GIE / llm-d) and of the plugins that read
//! request headers. One place, so the plugins, the request flow and the CLI agree.

/// The endpoint Envoy sends the request to (`ip:port`).
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The first fallback, for Envoy configs that retry on one more endpoint.
pub const FALLBACK_HEADER: &str = "x-gateway-destination-endpoint-fallback";
/// Every fallback, comma-separated, best first.
pub const FALLBACKS_HEADER: &str = "x-gateway-destination-endpoint-fallbacks";
/// With `pool.emitEndpointScores`: every scored endpoint's total, a JSON object
/// `{"ip:port": score, ...}` (llm-d-router's key of the same name in `envoy.lb`).
pub const SCORES_HEADER: &str = "x-gateway-destination-endpoint-scores";
/// The prefill endpoint of a P/D-disaggregated request.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// The pod a session sticks to (base64 of its `ip:port`), read and returned.
pub const SESSION_TOKEN_HEADER: &str = "x-session-token";
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// Endpoints a test pins the request to (`header-based-testing-filter`).
pub const TEST_SELECTION_HEADER: &str = "test-epp-endpoint-selection";
/// The profile `header-profile-handler` runs (llm-d's `EPP-Profile`, lowercased).
pub const PROFILE_HEADER: &str = "epp-profile";
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
/// The request's TPOT SLO in milliseconds, and its older name.
pub const SLO_TPOT_HEADER: &str = "x-llm-d-slo-tpot-ms";
pub const SLO_TPOT_LEGACY_HEADER: &str = "x-slo-tpot-ms";
/// On a flow-control refusal: why the request was dropped (as llm-d labels it).
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
pub const MODEL_REWRITE_HEADER: &str = "x-gateway-model-name-rewrite";

/// The GIE protocol's subset hint: filter metadata namespace and key.
pub const SUBSET_HINT_NAMESPACE: &str = "envoy.lb_subset_hint";
pub const SUBSET_HINT_KEY: &str = "x-gateway-destination-endpoint-subset";

/// The subset hint's addresses from the bytes Envoy returns for the metadata value: a list
/// comes serialized as proxy-wasm pairs (count, then key and value sizes, then each key and
/// value NUL-terminated; the elements are the keys); a plain string is a comma-separated list.
pub fn parse_subset_hint(bytes: &[u8]) -> Vec<String> {
    match pairs_keys(bytes) {
        Some(keys) => keys,
        None => String::from_utf8_lossy(bytes)
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect(),
    }
}

/// The keys of a proxy-wasm pairs buffer; `None` unless `bytes` is exactly one.
fn pairs_keys(bytes: &[u8]) -> Option<Vec<String>> {
    let pairs = crate::host::HeaderPairs::decode(bytes.to_vec())?;
    pairs
        .keys()
        .map(|key| String::from_utf8(key.to_vec()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    /// What Envoy 1.40 returned for `["127.0.0.1:8002", "127.0.0.1:8003"]` set by the
    /// `set_metadata` filter.
    const ENVOY_LIST: &[u8] =
        b"\x02\0\0\0\x0e\0\0\0\0\0\0\0\x0e\0\0\0\0\0\0\x00127.0.0.1:8002\0\x00127.0.0.1:8003\0\0";

    #[test]
    fn a_metadata_list_is_read_from_envoys_pairs() {
        assert_eq!(
            parse_subset_hint(ENVOY_LIST),
            ["127.0.0.1:8002", "127.0.0.1:8003"]
        );
        assert_eq!(
            parse_subset_hint(b"\0\0\0\0"),
            Vec::<String>::new(),
            "an empty list"
        );
    }

    #[test]
    fn a_string_is_a_comma_separated_list_and_garbage_is_not_a_pairs_buffer() {
        assert_eq!(
            parse_subset_hint(b"10.0.0.1:80, 10.0.0.2:80"),
            ["10.0.0.1:80", "10.0.0.2:80"]
        );
        // A count that promises more than the buffer holds is text, not a list.
        assert_eq!(parse_subset_hint(b"\xff\xff\xff\x7f").len(), 1);
        assert!(parse_subset_hint(&ENVOY_LIST[..ENVOY_LIST.len() - 1]).len() == 1);
    }
}
