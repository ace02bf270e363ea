//! `concurrency-detector`: an endpoint is saturated when the whole Envoy has
//! `maxConcurrency` requests (mode `requests`) or `maxTokenConcurrency` tokens (mode
//! `tokens`) in flight there, raised by `headroom`. Counts are the filter's own, shared
//! across workers, so it reacts before any scrape.

use crate::endpoint::{EndpointState, LoadView};
use crate::scheduling::plugins::spec::{effective, Data, Ignored, Kind, PluginSpec};
use crate::scheduling::{Plugin, SaturationDetector};
use serde_yaml::Value;

pub const TYPE: &str = "concurrency-detector";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(
    TYPE,
    Kind::SaturationDetector,
    build,
    effective::<Parameters>,
)
.consuming(&[Data::InFlight])
    .ignoring(&[
        Ignored::parameter(
            "failOpen",
            "with flow control off, a saturated pool sheds; fail-open is the Envoy filter's fail_open setting (docs/operations.md)",
        ),
        Ignored::producer("inFlightLoadProducerName", "inflight-load-producer"),
    ]);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Requests,
    Tokens,
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    pub concurrency_mode: Mode,
    pub max_concurrency: u32,
    pub max_token_concurrency: u64,
    pub headroom: f64,
    /// Accepted for llm-d configs: without fresh counts the filter still routes (fails open).
    pub fail_open: bool,
    /// llm-d-router's producer instance to read from; accepted, since the filter keeps one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub in_flight_load_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            concurrency_mode: Mode::Requests,
            max_concurrency: 100,
            max_token_concurrency: 1_000_000,
            headroom: 0.0,
            fail_open: true,
            in_flight_load_producer_name: String::new(),
        }
    }
}

pub struct ConcurrencyDetector {
    parameters: Parameters,
}

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    let parameters: Parameters = super::parameters(parameters)?;
    if parameters.max_concurrency == 0 || parameters.max_token_concurrency == 0 {
        return Err("maxConcurrency and maxTokenConcurrency must be at least 1".into());
    }
    if !(parameters.headroom >= 0.0 && parameters.headroom.is_finite()) {
        return Err(format!("headroom {} must be >= 0", parameters.headroom));
    }
    Ok(Plugin::SaturationDetector(Box::new(ConcurrencyDetector {
        parameters,
    })))
}

impl SaturationDetector for ConcurrencyDetector {
    /// In-flight requests (or tokens) over the limit; counts are live by nature.
    fn saturation(&self, endpoint: &EndpointState, _view: LoadView, _now_ms: u64) -> f64 {
        let p = &self.parameters;
        let scale = 1.0 + p.headroom;
        match p.concurrency_mode {
            Mode::Requests => {
                f64::from(endpoint.total_in_flight()) / (f64::from(p.max_concurrency) * scale)
            }
            Mode::Tokens => {
                endpoint.total_in_flight_tokens() as f64 / (p.max_token_concurrency as f64 * scale)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;
    use std::collections::BTreeMap;

    #[test]
    fn requests_and_tokens_modes() {
        let mut endpoint = EndpointState::new("10.0.0.1:8000".into(), BTreeMap::new());
        endpoint.in_flight = 2;
        endpoint.remote_in_flight = 1;
        endpoint.in_flight_tokens = 900;
        let detector = |yaml: &str| {
            let Ok(Plugin::SaturationDetector(d)) = build(&serde_yaml::from_str(yaml).unwrap())
            else {
                panic!("not a detector: {yaml}");
            };
            d
        };
        assert!(detector("{maxConcurrency: 3}").saturated(&endpoint, 0));
        assert!(!detector("{maxConcurrency: 4}").saturated(&endpoint, 0));
        assert!(!detector("{maxConcurrency: 2, headroom: 1}").saturated(&endpoint, 0));
        assert!(
            detector("{concurrencyMode: tokens, maxTokenConcurrency: 900}").saturated(&endpoint, 0)
        );
        assert!(
            !detector("{concurrencyMode: tokens, maxTokenConcurrency: 901}")
                .saturated(&endpoint, 0)
        );
        assert!(build(&serde_yaml::from_str("{maxConcurrency: 0}").unwrap()).is_err());
    }
}
