//! `session-affinity-scorer`: a request whose `x-session-token` names a candidate scores 1
//! there and 0 elsewhere. The token is the base64 of the endpoint's `ip:port`; the filter puts
//! it on every response so the client can send it back. A token naming an address that is not
//! a candidate has no effect: it can only score pool members.

use crate::protocol::SESSION_TOKEN_HEADER;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec};
use crate::scheduling::{Plugin, SchedulingContext, Scorer};
use serde_yaml::Value;

pub const TYPE: &str = "session-affinity-scorer";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .consuming(&[Data::RequestHeader(SESSION_TOKEN_HEADER)]);

/// llm-d-router's parameters: its default strategy is this scorer, so that strategy and its
/// header load; the stateful `session_id` strategy and a per-profile pin are refused.
#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub strategy: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoded_endpoint_header_config: Option<HeaderConfig>,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub session_id_config: Value,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub profile_name: String,
}

#[derive(Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeaderConfig {
    pub header: String,
}

pub struct SessionAffinityScorer;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if !matches!(parameters.strategy.as_str(), "" | "encoded_endpoint_header") {
        return Err(format!(
            "strategy {:?}: only encoded_endpoint_header (the {SESSION_TOKEN_HEADER} token) is implemented",
            parameters.strategy
        ));
    }
    if !parameters.session_id_config.is_null() {
        return Err("sessionIdConfig: the session_id strategy is not implemented; clients send back the x-session-token of the response".into());
    }
    if let Some(config) = &parameters.encoded_endpoint_header_config {
        if !config.header.eq_ignore_ascii_case(SESSION_TOKEN_HEADER) {
            return Err(format!(
                "encodedEndpointHeaderConfig.header {:?}: the token header is {SESSION_TOKEN_HEADER}",
                config.header
            ));
        }
    }
    if !parameters.profile_name.is_empty() {
        return Err(format!(
            "profileName {:?}: the token always names the pod that served the request (the decode pick)",
            parameters.profile_name
        ));
    }
    Ok(Plugin::Scorer(Box::new(SessionAffinityScorer)))
}

/// The token a response carries for `address`.
pub fn token_for(address: &str) -> String {
    base64_encode(address.as_bytes())
}

impl Scorer for SessionAffinityScorer {
    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        let Some(token) = ctx.request.headers.session_token.as_deref() else {
            return;
        };
        let Some(address) = base64_decode(token) else {
            return;
        };
        for (score, &i) in scores.iter_mut().zip(candidates) {
            if ctx
                .pool
                .get(i)
                .is_some_and(|e| e.address.as_bytes() == address)
            {
                *score = 1.0;
            }
        }
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                let sextet = (n >> (18 - 6 * k)) & 63;
                out.push(char::from(
                    ALPHABET.get(sextet as usize).copied().unwrap_or(b'A'),
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64 with optional padding; `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = ALPHABET.iter().position(|&c| c == byte)?;
        buffer = (buffer << 6) | value as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use crate::request::{InferenceRequest, RequestHeaders};
    use crate::scheduling::test_support::queues;

    #[test]
    fn llm_d_router_parameters_load_for_the_header_strategy_only() {
        let ours: Value = serde_yaml::from_str(
            "{strategy: encoded_endpoint_header, encodedEndpointHeaderConfig: {header: X-Session-Token}}",
        )
        .unwrap();
        assert!(build(&ours).is_ok());
        for (given, needle) in [
            ("{strategy: session_id}", "strategy"),
            (
                "{sessionIdConfig: {sources: [{header: x-session-id}]}}",
                "sessionIdConfig",
            ),
            (
                "{encodedEndpointHeaderConfig: {header: x-other}}",
                "x-session-token",
            ),
            ("{profileName: prefill}", "profileName"),
        ] {
            let value: Value = serde_yaml::from_str(given).unwrap();
            let error = build(&value).err().unwrap();
            assert!(error.contains(needle), "{given}: {error}");
        }
    }

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64_encode(b"10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA==");
        for text in ["", "a", "ab", "abc", "[::1]:8000"] {
            assert_eq!(
                base64_decode(&base64_encode(text.as_bytes())).unwrap(),
                text.as_bytes()
            );
        }
        assert_eq!(base64_decode("not base64!"), None);
    }

    #[test]
    fn token_names_the_endpoint() {
        let pool = queues(&[0.0, 0.0, 0.0]);
        let mut request = InferenceRequest::empty();
        let mut scores = [0.0; 3];
        let score = |request: &InferenceRequest, scores: &mut [f64; 3]| {
            *scores = [0.0; 3];
            SessionAffinityScorer.score(
                &SchedulingContext::new(request, &pool),
                &[0, 1, 2],
                scores,
            );
        };
        score(&request, &mut scores);
        assert_eq!(scores, [0.0; 3], "no token, no preference");
        request.headers = RequestHeaders {
            session_token: Some(token_for("10.0.0.1:8000")),
            ..RequestHeaders::default()
        };
        score(&request, &mut scores);
        assert_eq!(scores, [0.0, 1.0, 0.0]);
        request.headers.session_token = Some(token_for("6.6.6.6:1"));
        score(&request, &mut scores);
        assert_eq!(
            scores, [0.0; 3],
            "an address outside the pool scores nobody"
        );
    }
}
