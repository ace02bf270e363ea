//! `models-data-source`: the scraping VM asks every pod for its model list once per
//! `refreshInterval` (at most `pool.maxScrapesInFlight` calls at a time) and, when a round
//! changed any pod's list, publishes every pod's list in shared data; the other VMs read it at
//! the same pace. What each pod reported narrows a request's candidates to the pods serving
//! its model, and the pool router routes models to pools with the pool's union of them.

use super::scrapes::pod_get;
use crate::config::{ModelsSource, PoolConfig};
use crate::duration::duration_ms;
use crate::endpoint::Pool;
use crate::host::{CalloutAnswer, HostError, HttpCallouts, SharedData};
use crate::scheduling::plugins::datalayer::models_data_source::served_models;
pub use crate::scheduling::plugins::datalayer::models_data_source::MAX_MODELS_BYTES;
use hashbrown::HashMap;
use std::collections::VecDeque;

/// What a model list changed: one pod's list, and the pool's models as a whole.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelsChange {
    pub pod: bool,
    pub pool: bool,
}

#[derive(Debug, Default)]
pub struct ModelLists {
    /// Where each pod's model list is read; `None` without `models-data-source`.
    source: Option<ModelsSource>,
    /// What each pod last reported (by pool index), and the pool's union of them (sorted).
    reported: Vec<Option<Vec<String>>>,
    served: Vec<String>,
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

impl ModelLists {
    pub fn new(source: Option<ModelsSource>) -> Self {
        ModelLists {
            source,
            ..ModelLists::default()
        }
    }

    pub fn source(&self) -> Option<&ModelsSource> {
        self.source.as_ref()
    }

    pub fn owns(&self, token: u32) -> bool {
        self.calls.contains_key(&token)
    }

    /// The models the pool's pods report (sorted).
    pub fn served(&self) -> &[String] {
        &self.served
    }

    /// Whether the pods' model lists narrow the candidates for `model`: only when the pool
    /// learns its models and some pod reports it (a name only the configuration lists is
    /// served by every pod).
    pub fn narrows(&self, model: &str) -> bool {
        self.source.is_some() && (0..self.reported.len()).any(|index| self.reports(index, model))
    }

    /// Whether endpoint `index` reported serving `model` (each list is sorted).
    pub fn reports(&self, index: usize, model: &str) -> bool {
        self.reported
            .get(index)
            .and_then(Option::as_ref)
            .is_some_and(|models| models.binary_search_by(|m| m.as_str().cmp(model)).is_ok())
    }

    /// The scraper's part of a tick: a new round of `/v1/models` calls when one is due.
    pub fn send_when_due(
        &mut self,
        host: &impl HttpCallouts,
        pool: &Pool,
        settings: &PoolConfig,
        now: u64,
    ) {
        let Some(source) = &self.source else {
            return;
        };
        if now < self.next_round_ms || !self.calls.is_empty() || !self.queue.is_empty() {
            return;
        }
        self.next_round_ms = now.saturating_add(duration_ms(source.refresh_interval));
        let live = pool.endpoints.iter().enumerate();
        self.queue
            .extend(live.filter(|(_, e)| !e.removed).map(|(index, _)| index));
        self.send(host, pool, settings);
    }

    /// Sends queued calls up to the scrape window.
    fn send(&mut self, host: &impl HttpCallouts, pool: &Pool, settings: &PoolConfig) {
        let Some(source) = &self.source else {
            return;
        };
        let timeout = u32::try_from(duration_ms(settings.metrics_timeout)).unwrap_or(u32::MAX);
        while self.calls.len() < settings.max_scrapes_in_flight.max(1) {
            let Some(index) = self.queue.pop_front() else {
                return;
            };
            let Some(address) = pool.get(index).map(|e| e.address.as_str()) else {
                continue;
            };
            let headers = pod_get(&source.path, address, "application/json");
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
        (callouts, store): (&impl HttpCallouts, &impl SharedData),
        (pool, settings): (&Pool, &PoolConfig),
        key: Option<&str>,
        token: u32,
        answer: &CalloutAnswer,
    ) -> bool {
        let Some(index) = self.calls.remove(&token) else {
            return false;
        };
        let change = match read_models(answer, pool, index) {
            Some(models) => self.set_endpoint_models(pool, index, models),
            None => self.mark_unanswered(pool, index),
        };
        self.round_changed |= change.pod;
        if change.pool {
            log::info!(
                "inference-picker: the pool now serves {:?} (as its pods report)",
                self.served
            );
        }
        self.send(callouts, pool, settings);
        let round_over = self.calls.is_empty() && self.queue.is_empty();
        if let (true, true, Some(key)) = (round_over, self.round_changed, key) {
            self.round_changed = false;
            if let Err(error) = self.publish(store, key, pool) {
                log::warn!("inference-picker: sharing the pool's models: {error}");
            }
        }
        change.pool
    }

    /// What endpoint `index` reported at its model list. A removed endpoint's models no
    /// longer count.
    pub fn set_endpoint_models(
        &mut self,
        pool: &Pool,
        index: usize,
        models: Vec<String>,
    ) -> ModelsChange {
        if self.reported.len() < pool.len() {
            self.reported.resize(pool.len(), None);
        }
        let pod = match self.reported.get_mut(index) {
            Some(slot) if slot.as_ref() != Some(&models) => {
                *slot = Some(models);
                true
            }
            _ => false,
        };
        ModelsChange {
            pod,
            pool: self.recompute_served(pool),
        }
    }

    /// Endpoint `index` gave no usable model list: it keeps what it reported last, or serves
    /// nothing if it never reported (so a pod that never answers cannot hold the pool's list).
    fn mark_unanswered(&mut self, pool: &Pool, index: usize) -> ModelsChange {
        let reported = self.reported.get(index).is_some_and(Option::is_some);
        if reported {
            return ModelsChange::default();
        }
        self.set_endpoint_models(pool, index, Vec::new())
    }

    /// What each pod reported, by address (the pods that never answered are not listed).
    pub fn reported<'a>(&'a self, pool: &'a Pool) -> Vec<(&'a str, &'a [String])> {
        self.reported
            .iter()
            .zip(&pool.endpoints)
            .filter_map(|(models, endpoint)| Some((endpoint.address.as_str(), models.as_deref()?)))
            .collect()
    }

    /// Publishes what each pod reported, as JSON `[[address, [model, ...]], ...]`.
    fn publish(
        &mut self,
        store: &impl SharedData,
        key: &str,
        pool: &Pool,
    ) -> Result<(), HostError> {
        let reported = self.reported(pool);
        let text = serde_json::to_vec(&reported).unwrap_or_default();
        store.set(key, &text, None)?;
        Ok(())
    }

    /// Applies what the scraping VM published, once per `refreshInterval` (or at once after
    /// the members changed) and only when it changed since the last look; an entry that does
    /// not parse leaves the lists as they are. Returns whether the pool's models changed.
    pub fn apply_shared(
        &mut self,
        store: &impl SharedData,
        key: &str,
        pool: &Pool,
        now: u64,
        members_changed: bool,
    ) -> Result<bool, HostError> {
        let Some(source) = &self.source else {
            return Ok(false);
        };
        if members_changed {
            // Addresses unknown at the last look may be members now.
            self.applied_cas = None;
        } else if now < self.next_round_ms {
            return Ok(false);
        }
        let Some((bytes, cas)) = store.get(key)? else {
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
        Ok(self.apply_reported(pool, &reported).pool)
    }

    /// The scraping VM's lists (published after whole rounds: a pod it does not list serves
    /// nothing).
    pub fn apply_reported(
        &mut self,
        pool: &Pool,
        reported: &[(String, Vec<String>)],
    ) -> ModelsChange {
        let before = std::mem::take(&mut self.reported);
        self.reported.resize(pool.len(), Some(Vec::new()));
        for (address, models) in reported {
            if let Some(slot) = pool
                .index_of(address)
                .and_then(|index| self.reported.get_mut(index))
            {
                *slot = Some(models.clone());
            }
        }
        ModelsChange {
            pod: before != self.reported,
            pool: self.recompute_served(pool),
        }
    }

    fn recompute_served(&mut self, pool: &Pool) -> bool {
        let mut union: Vec<String> = Vec::new();
        let mut all_reported = true;
        let reported = self.reported.iter().zip(&pool.endpoints);
        for (models, _) in reported.filter(|(_, endpoint)| !endpoint.removed) {
            match models {
                Some(models) => union.extend(models.iter().cloned()),
                None => all_reported = false,
            }
        }
        // Until every pod has answered once (a VM taking over the scraping), the models the
        // pool served so far stay: a partial round must not make models vanish.
        if !all_reported {
            union.extend(self.served.iter().cloned());
        }
        union.sort();
        union.dedup();
        if union == self.served {
            return false;
        }
        self.served = union;
        true
    }
}

/// The model ids of endpoint `index`'s answer, `None` when it gave no usable list.
fn read_models(answer: &CalloutAnswer, pool: &Pool, index: usize) -> Option<Vec<String>> {
    let address = pool.get(index).map_or("?", |e| e.address.as_str());
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
