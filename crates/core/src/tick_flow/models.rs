//! `models-data-source`'s side of the tick: the scraping VM asks every pod for its model list
//! once per `refreshInterval` (at most `pool.maxScrapesInFlight` calls at a time) and, when a
//! round changed any pod's list, publishes every pod's list in shared data; the other VMs read
//! it at the same pace. The picker routes models to pools with it.

use crate::director::Director;
use crate::duration::duration_ms;
use crate::host::{CalloutAnswer, HostError, HttpCallouts, SharedData};
use crate::protocol::DESTINATION_HEADER;
use crate::scheduling::plugins::datalayer::models_data_source::served_models;
pub(super) use crate::scheduling::plugins::datalayer::models_data_source::MAX_MODELS_BYTES;
use hashbrown::HashMap;
use std::collections::VecDeque;

#[derive(Debug, Default)]
pub struct ModelLists {
    /// Calls in flight: token -> endpoint index.
    calls: HashMap<u32, usize>,
    /// The round's endpoints not asked yet.
    queue: VecDeque<usize>,
    /// A pod's list changed in the current round: publish when it ends.
    round_changed: bool,
    /// When the next round is due (scraper) or the shared lists are read next (the others).
    next_round_ms: u64,
    /// The shared entry's version this VM last applied.
    applied_cas: Option<u32>,
}

/// The shared-data key of a pool's model lists.
fn key(namespace: &str) -> String {
    format!("{namespace}/models")
}

impl ModelLists {
    pub fn owns(&self, token: u32) -> bool {
        self.calls.contains_key(&token)
    }

    /// The scraper's part of a tick: a new round of `/v1/models` calls when one is due.
    pub fn send_when_due(&mut self, host: &impl HttpCallouts, director: &Director, now: u64) {
        let Some(source) = director.models_source() else {
            return;
        };
        if now < self.next_round_ms || !self.calls.is_empty() || !self.queue.is_empty() {
            return;
        }
        self.next_round_ms = now.saturating_add(duration_ms(source.refresh_interval));
        let live = director.pool().endpoints.iter().enumerate();
        self.queue
            .extend(live.filter(|(_, e)| !e.removed).map(|(index, _)| index));
        self.send(host, director);
    }

    /// Sends queued calls up to the scrape window.
    fn send(&mut self, host: &impl HttpCallouts, director: &Director) {
        let (Some(source), settings) = (director.models_source(), director.settings()) else {
            return;
        };
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        while self.calls.len() < settings.max_scrapes_in_flight.max(1) {
            let Some(index) = self.queue.pop_front() else {
                return;
            };
            let Some(address) = director.address(index) else {
                continue;
            };
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
    /// restart should not make its models vanish for a round), or counts as serving nothing
    /// if it never did. Publishes the lists when the round ends with a change. Returns
    /// whether the pool's models changed.
    pub fn on_answer(
        &mut self,
        host: &(impl HttpCallouts + SharedData),
        director: &mut Director,
        namespace: Option<&str>,
        token: u32,
        answer: &CalloutAnswer,
    ) -> bool {
        let Some(index) = self.calls.remove(&token) else {
            return false;
        };
        let change = match read_models(answer, director, index) {
            Some(models) => director.set_endpoint_models(index, models),
            None => director.mark_unanswered(index),
        };
        self.round_changed |= change.pod;
        if change.pool {
            log::info!(
                "inference-picker: the pool now serves {:?} (as its pods report)",
                director.served_models()
            );
        }
        self.send(host, director);
        let round_over = self.calls.is_empty() && self.queue.is_empty();
        if let (true, true, Some(namespace)) = (round_over, self.round_changed, namespace) {
            self.round_changed = false;
            if let Err(error) = self.publish(host, namespace, director) {
                log::warn!("inference-picker: sharing the pool's models: {error}");
            }
        }
        change.pool
    }

    /// Publishes what each pod reported, as JSON `[[address, [model, ...]], ...]`.
    fn publish(
        &mut self,
        store: &impl SharedData,
        namespace: &str,
        director: &Director,
    ) -> Result<(), HostError> {
        let reported: Vec<(&str, &[String])> = director.reported_models().collect();
        let text = serde_json::to_vec(&reported).unwrap_or_default();
        store.set(&key(namespace), &text, None)?;
        Ok(())
    }

    /// Applies what the scraping VM published, once per `refreshInterval` (or at once after
    /// the members changed) and only when it changed since the last look; an entry that does
    /// not parse leaves the lists as they are. Returns whether the pool's models changed.
    pub fn apply_shared(
        &mut self,
        store: &impl SharedData,
        namespace: &str,
        director: &mut Director,
        now: u64,
        members_changed: bool,
    ) -> Result<bool, HostError> {
        let Some(source) = director.models_source() else {
            return Ok(false);
        };
        if members_changed {
            // Addresses unknown at the last look may be members now.
            self.applied_cas = None;
        } else if now < self.next_round_ms {
            return Ok(false);
        }
        let Some((bytes, cas)) = store.get(&key(namespace))? else {
            // Nothing published yet: look again on the next tick.
            return Ok(false);
        };
        self.next_round_ms = now.saturating_add(duration_ms(source.refresh_interval));
        if self.applied_cas == Some(cas) {
            return Ok(false);
        }
        let Ok(reported) = serde_json::from_slice::<Vec<(String, Vec<String>)>>(&bytes) else {
            log::warn!("inference-picker: the shared model lists do not parse; kept the last ones");
            return Ok(false);
        };
        self.applied_cas = Some(cas);
        Ok(director.apply_reported_models(&reported).pool)
    }
}

/// The model ids of endpoint `index`'s answer, `None` when it gave no usable list.
fn read_models(answer: &CalloutAnswer, director: &Director, index: usize) -> Option<Vec<String>> {
    let address = director.address(index).unwrap_or("?");
    if answer.status.as_deref() != Some(b"200".as_slice()) {
        log::debug!("inference-picker: {address} did not list its models");
        return None;
    }
    let body_size = answer.body_size;
    if body_size > MAX_MODELS_BYTES {
        log::warn!("inference-picker: the model list of {address} is {body_size} bytes, over {MAX_MODELS_BYTES}: not read");
        return None;
    }
    let models = answer
        .body
        .as_ref()
        .ok()
        .and_then(|body| served_models(body));
    if models.is_none() {
        log::warn!("inference-picker: the model list of {address} is not an OpenAI model list");
    }
    models
}
