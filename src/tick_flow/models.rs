//! `models-data-source`'s side of the tick: the scraping VM asks every pod for its model list
//! once per `refreshInterval` and publishes the pool's union in shared data; the other VMs read
//! it on their ticks. The picker routes models to pools with it.

use crate::director::Director;
use crate::duration::duration_ms;
use crate::host::{Clock, HostError, HttpCallouts, SharedData};
use crate::protocol::DESTINATION_HEADER;
use crate::scheduling::plugins::datalayer::models_data_source::{served_models, MAX_MODELS_BYTES};
use hashbrown::HashMap;

#[derive(Debug, Default)]
pub struct ModelLists {
    /// Calls in flight: token -> endpoint index.
    calls: HashMap<u32, usize>,
    next_round_ms: u64,
    /// The shared entry's version this VM last applied.
    applied_cas: Option<u32>,
}

/// The shared-data key of a pool's model list.
fn key(namespace: &str) -> String {
    format!("{namespace}/models")
}

impl ModelLists {
    pub fn owns(&self, token: u32) -> bool {
        self.calls.contains_key(&token)
    }

    /// The scraper's part of a tick: a new round of `/v1/models` calls when one is due.
    pub fn send_when_due(
        &mut self,
        host: &(impl HttpCallouts + Clock),
        director: &Director,
        now: u64,
    ) {
        let Some(source) = director.models_source() else {
            return;
        };
        if now < self.next_round_ms || !self.calls.is_empty() {
            return;
        }
        self.next_round_ms = now.saturating_add(duration_ms(source.refresh_interval));
        let settings = director.settings();
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        for (index, endpoint) in director.pool().endpoints.iter().enumerate() {
            if endpoint.removed {
                continue;
            }
            let address = endpoint.address.as_str();
            let headers = [
                (":method", "GET"),
                (":path", source.path.as_str()),
                (":authority", address),
                (DESTINATION_HEADER, address),
                ("accept", "application/json"),
            ];
            match host.dispatch(&settings.metrics_cluster, &headers, timeout) {
                Ok(token) => {
                    self.calls.insert(token, index);
                }
                Err(error) => {
                    log::debug!("inference-picker: asking {address} for its models: {error}");
                }
            }
        }
    }

    /// A `/v1/models` answer. A pod that does not answer keeps what it reported last (a
    /// restart should not make its models vanish for a round). Returns whether the pool's
    /// models changed.
    pub fn on_answer(
        &mut self,
        host: &impl HttpCallouts,
        director: &mut Director,
        token: u32,
        body_size: usize,
    ) -> bool {
        let Some(index) = self.calls.remove(&token) else {
            return false;
        };
        let address = director.address(index).unwrap_or("?").to_owned();
        if host.response_status().as_deref() != Some(b"200".as_slice()) {
            log::debug!("inference-picker: {address} did not list its models");
            return false;
        }
        if body_size > MAX_MODELS_BYTES {
            log::warn!("inference-picker: the model list of {address} is {body_size} bytes, over {MAX_MODELS_BYTES}: not read");
            return false;
        }
        let models = host
            .response_body(body_size)
            .ok()
            .and_then(|body| served_models(&body));
        let Some(models) = models else {
            log::warn!("inference-picker: the model list of {address} is not an OpenAI model list");
            return false;
        };
        let changed = director.set_endpoint_models(index, models);
        if changed {
            log::info!(
                "inference-picker: the pool now serves {:?} (as its pods report)",
                director.served_models()
            );
        }
        changed
    }

    /// Publishes what each pod reported, as JSON `[[address, [model, ...]], ...]`.
    pub fn publish(
        &mut self,
        store: &impl SharedData,
        namespace: &str,
        director: &Director,
    ) -> Result<(), HostError> {
        let reported: Vec<(&str, &[String])> = director.reported_models().collect();
        let text = serde_json::to_vec(&reported).unwrap_or_default();
        store.set(&key(namespace), &text, None)?;
        self.applied_cas = None;
        Ok(())
    }

    /// Applies what the scraping VM published, when it changed since the last look. Returns
    /// whether the pool's models changed.
    pub fn apply_shared(
        &mut self,
        store: &impl SharedData,
        namespace: &str,
        director: &mut Director,
    ) -> Result<bool, HostError> {
        let Some((bytes, cas)) = store.get(&key(namespace))? else {
            return Ok(false);
        };
        if self.applied_cas == Some(cas) {
            return Ok(false);
        }
        self.applied_cas = Some(cas);
        let reported: Vec<(String, Vec<String>)> =
            serde_json::from_slice(&bytes).unwrap_or_default();
        Ok(director.apply_reported_models(&reported))
    }
}
