//! The engine's state behind one lock: the waiting queue and its scheduler, running requests,
//! LoRA slots, the KV cache, counters, and the load and faults tests set from outside.
//!
//! The scheduler is vLLM's first-come-first-served policy: it walks the waiting queue in
//! arrival order and admits while there is a sequence slot (`--max-num-seqs`) and KV blocks
//! for the request; the first request that does not fit stops it (reason `capacity`). A
//! request whose adapter cannot be loaded (every one of `--max-lora` slots holds an adapter
//! in use) is skipped and later ones go ahead (reason `deferred`).

use crate::batching::Batch;
use crate::kv_cache::{Allocation, KvCache};
use crate::metrics::Snapshot;
use crate::metrics::{Histogram, ITL_BUCKETS, PREFILL_BUCKETS, TTFT_BUCKETS};
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_num_seqs: usize,
    pub max_lora: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultScope {
    /// Every path.
    All,
    /// Everything but `/metrics`: the pod looks healthy to scrapes but fails requests.
    Inference,
    /// `/metrics` only: a busy server whose metrics page answers late while it serves
    /// requests promptly.
    Metrics,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Error(u16),
    Slow(u64),
    Hang,
}

/// A request waiting for admission.
#[derive(Debug)]
struct Waiter {
    id: u64,
    adapter: Option<String>,
    hashes: Vec<u64>,
    prompt_tokens: usize,
    total_tokens: usize,
}

/// What admission gave a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    pub allocation: Allocation,
    /// The adapter was not resident: the request pays `--lora-load-ms` first.
    pub lora_loaded: bool,
}

#[derive(Debug)]
pub struct Engine {
    pub(crate) limits: Limits,
    pub kv: KvCache,
    /// The batching engine's queues (`--batching`); empty in the slot engine.
    pub(crate) batch: Batch,
    waiting: VecDeque<Waiter>,
    admitted: HashMap<u64, Admitted>,
    next_id: u64,
    pub running: usize,
    /// Running requests per adapter.
    running_adapters: HashMap<String, usize>,
    /// Adapters resident in GPU memory, least recently used first (at most `max_lora`).
    pub loaded_adapters: Vec<String>,
    pub background_waiting: usize,
    pub background_running: usize,
    pub background_kv: f64,
    /// Raw exposition lines appended to `/metrics` (other models' series, custom gauges).
    pub extra_metrics: String,
    /// `/metrics` is padded with filler series to at least this many bytes.
    pub metrics_padding_bytes: usize,
    /// `x-prefiller-host-port` values seen on inference requests, with counts.
    pub prefillers_seen: HashMap<String, u64>,
    /// Requests by the `priority` their body carried (`none` without one).
    pub priorities_seen: HashMap<String, u64>,
    /// Prompt tokens looked up in the prefix cache at admission, and those it served.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub generation_tokens: u64,
    pub requests_total: u64,
    /// Prefill times (admission to first token), TTFTs (arrival to first token) and the gaps
    /// between a request's tokens, as vLLM's histograms count them.
    pub prefill_time: Histogram,
    pub first_token_time: Histogram,
    pub inter_token_time: Histogram,
    /// The longest the waiting queue has been after a scheduling pass.
    pub peak_waiting: usize,
    /// Running sequences the batching engine preempted for KV blocks.
    pub preemptions: u64,
    pub metrics_scrapes: u64,
    pub fault: Option<Fault>,
    /// Which paths the fault hits.
    pub fault_scope: FaultScope,
}

impl Engine {
    pub fn new(limits: Limits, kv: KvCache) -> Engine {
        Engine {
            limits,
            kv,
            batch: Batch::default(),
            waiting: VecDeque::new(),
            admitted: HashMap::new(),
            next_id: 0,
            running: 0,
            running_adapters: HashMap::new(),
            loaded_adapters: Vec::new(),
            background_waiting: 0,
            background_running: 0,
            background_kv: 0.0,
            extra_metrics: String::new(),
            metrics_padding_bytes: 0,
            prefill_time: Histogram::new(PREFILL_BUCKETS),
            first_token_time: Histogram::new(TTFT_BUCKETS),
            inter_token_time: Histogram::new(ITL_BUCKETS),
            prefillers_seen: HashMap::new(),
            priorities_seen: HashMap::new(),
            prefix_queries: 0,
            prefix_hits: 0,
            generation_tokens: 0,
            requests_total: 0,
            peak_waiting: 0,
            preemptions: 0,
            metrics_scrapes: 0,
            fault: None,
            fault_scope: FaultScope::All,
        }
    }

    /// Queues a request (its prompt's block hashes, prompt and prompt + output token counts);
    /// returns its ticket for [`Engine::take_admitted`].
    pub fn enqueue(
        &mut self,
        adapter: Option<&str>,
        hashes: Vec<u64>,
        prompt_tokens: usize,
        total_tokens: usize,
    ) -> u64 {
        self.next_id += 1;
        self.waiting.push_back(Waiter {
            id: self.next_id,
            adapter: adapter.map(String::from),
            hashes,
            prompt_tokens,
            total_tokens,
        });
        self.next_id
    }

    /// One scheduling pass; true if it admitted anything.
    pub fn schedule(&mut self) -> bool {
        let mut admitted_any = false;
        let mut i = 0;
        while i < self.waiting.len() && self.running < self.limits.max_num_seqs {
            let waiter = &self.waiting[i];
            if waiter
                .adapter
                .as_deref()
                .is_some_and(|name| !self.lora_ready(name))
            {
                i += 1;
                continue;
            }
            let Some(allocation) =
                self.kv
                    .allocate(&waiter.hashes, waiter.prompt_tokens, waiter.total_tokens)
            else {
                break;
            };
            let Some(waiter) = self.waiting.remove(i) else {
                break;
            };
            let lora_loaded =
                self.start_running(waiter.adapter.as_deref(), waiter.prompt_tokens, &allocation);
            self.admitted.insert(
                waiter.id,
                Admitted {
                    allocation,
                    lora_loaded,
                },
            );
            admitted_any = true;
        }
        self.peak_waiting = self.peak_waiting.max(self.waiting.len());
        admitted_any
    }

    /// Counts a request admitted to run: its slot, its adapter (made resident; true if it had
    /// to be loaded) and its prefix-cache lookup.
    pub(crate) fn start_running(
        &mut self,
        adapter: Option<&str>,
        prompt_tokens: usize,
        allocation: &Allocation,
    ) -> bool {
        self.running += 1;
        self.prefix_queries += prompt_tokens as u64;
        self.prefix_hits += allocation.hit_tokens as u64;
        match adapter {
            Some(name) => {
                *self.running_adapters.entry(name.to_string()).or_default() += 1;
                self.load_adapter(name)
            }
            None => false,
        }
    }

    pub fn take_admitted(&mut self, id: u64) -> Option<Admitted> {
        self.admitted.remove(&id)
    }

    /// A running request finished (or its client went away): its blocks and slots return.
    pub fn finish(&mut self, adapter: Option<&str>, blocks: &[u32], output_tokens: usize) {
        self.release(adapter, blocks);
        self.requests_total += 1;
        self.generation_tokens += output_tokens as u64;
    }

    /// A request stops running: its blocks, its slot and its hold on its adapter return.
    pub(crate) fn release(&mut self, adapter: Option<&str>, blocks: &[u32]) {
        self.kv.release(blocks);
        self.running = self.running.saturating_sub(1);
        if let Some(name) = adapter {
            if let Some(count) = self.running_adapters.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    self.running_adapters.remove(name);
                }
            }
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len() + self.batch.waiting.len()
    }

    /// The adapter of every waiting request (`None` for the base model), in either engine.
    fn waiting_adapters(&self) -> impl Iterator<Item = Option<&str>> {
        let slots = self.waiting.iter().map(|w| w.adapter.as_deref());
        slots.chain(self.batch.waiting_adapters())
    }

    /// What `/metrics` shows of the queues: (running, the waiting requests' adapters, KV
    /// usage); the batching engine's as of its last step (see [`Batch::last_step`]).
    fn reported_queues(&self) -> (usize, Vec<Option<&str>>, f64) {
        if self.batch.settings.is_some() {
            let last = &self.batch.last_step;
            let waiting = last.waiting.iter().map(Option::as_deref).collect();
            return (last.running, waiting, last.kv_usage);
        }
        (
            self.running,
            self.waiting_adapters().collect(),
            self.kv.usage(),
        )
    }

    /// An adapter can run now: resident, or a slot is free or holds an idle adapter.
    pub(crate) fn lora_ready(&self, name: &str) -> bool {
        self.loaded_adapters.iter().any(|a| a == name)
            || self.loaded_adapters.len() < self.limits.max_lora
            || self
                .loaded_adapters
                .iter()
                .any(|a| !self.running_adapters.contains_key(a))
    }

    /// Makes `name` resident (most recently used), evicting the least recently used idle
    /// adapter if the slots are full; true if it had to be loaded.
    fn load_adapter(&mut self, name: &str) -> bool {
        if let Some(position) = self.loaded_adapters.iter().position(|a| a == name) {
            let adapter = self.loaded_adapters.remove(position);
            self.loaded_adapters.push(adapter);
            return false;
        }
        if self.loaded_adapters.len() >= self.limits.max_lora {
            if let Some(position) = self
                .loaded_adapters
                .iter()
                .position(|a| !self.running_adapters.contains_key(a))
            {
                self.loaded_adapters.remove(position);
            }
        }
        self.loaded_adapters.push(name.to_string());
        true
    }

    /// What `/metrics` shows now (counts `metrics_scrapes`).
    pub fn snapshot(&mut self, model: &str, started: f64, now: f64) -> Snapshot {
        self.metrics_scrapes += 1;
        let (running, waiting, kv_usage) = self.reported_queues();
        // Deferred: waiting for a LoRA slot.
        let deferred = waiting
            .iter()
            .filter(|a| a.is_some_and(|a| !self.lora_ready(a)))
            .count();
        let mut waiting_adapters: Vec<String> =
            waiting.iter().flatten().map(|a| a.to_string()).collect();
        waiting_adapters.sort();
        waiting_adapters.dedup();
        Snapshot {
            model: model.to_string(),
            running: running + self.background_running,
            waiting_capacity: waiting.len() - deferred + self.background_waiting,
            waiting_deferred: deferred,
            kv_usage: (kv_usage + self.background_kv).min(1.0),
            prefix_queries: self.prefix_queries,
            prefix_hits: self.prefix_hits,
            generation_tokens: self.generation_tokens,
            finished: self.requests_total,
            prefill_time: self.prefill_time.clone(),
            first_token_time: self.first_token_time.clone(),
            inter_token_time: self.inter_token_time.clone(),
            max_lora: self.limits.max_lora,
            running_adapters: self.loaded_adapters.clone(),
            waiting_adapters,
            block_size: self.kv.block_size(),
            num_blocks: self.kv.num_blocks(),
            started,
            now,
            extra: self.extra_metrics.clone(),
            padding_bytes: self.metrics_padding_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(max_num_seqs: usize, max_lora: usize, blocks: usize) -> Engine {
        Engine::new(
            Limits {
                max_num_seqs,
                max_lora,
            },
            KvCache::new(blocks, 4),
        )
    }

    #[test]
    fn first_come_first_served_until_slots_or_blocks_run_out() {
        let mut e = engine(2, 1, 4);
        let a = e.enqueue(None, vec![], 4, 8); // 2 blocks
        let b = e.enqueue(None, vec![], 4, 12); // 3 blocks: does not fit beside a
        let c = e.enqueue(None, vec![], 1, 4); // 1 block: would fit, but b is ahead
        assert!(e.schedule());
        let admitted_a = e.take_admitted(a).unwrap();
        assert!(e.take_admitted(b).is_none() && e.take_admitted(c).is_none());
        assert_eq!((e.running, e.waiting()), (1, 2));
        e.finish(None, &admitted_a.allocation.blocks, 4);
        assert!(e.schedule());
        assert!(e.take_admitted(b).is_some() && e.take_admitted(c).is_some());
        assert_eq!(
            (e.running, e.requests_total, e.generation_tokens),
            (2, 1, 4)
        );
    }

    #[test]
    fn a_request_without_a_lora_slot_is_deferred_and_others_go_ahead() {
        let mut e = engine(4, 1, 64);
        let a = e.enqueue(Some("sql"), vec![], 4, 8);
        assert!(e.schedule());
        let first = e.take_admitted(a).unwrap();
        assert!(first.lora_loaded);
        let b = e.enqueue(Some("chat"), vec![], 4, 8);
        let c = e.enqueue(None, vec![], 4, 8);
        let d = e.enqueue(Some("sql"), vec![], 4, 8);
        e.schedule();
        assert!(e.take_admitted(b).is_none());
        assert!(e.take_admitted(c).is_some());
        let again = e.take_admitted(d).unwrap();
        assert!(!again.lora_loaded, "sql is resident");
        let snapshot = e.snapshot("m", 0.0, 0.0);
        assert_eq!(
            (snapshot.waiting_capacity, snapshot.waiting_deferred),
            (0, 1)
        );
        assert_eq!(snapshot.waiting_adapters, ["chat"]);
        // Once sql is idle, chat replaces it.
        e.finish(Some("sql"), &first.allocation.blocks, 4);
        e.finish(Some("sql"), &again.allocation.blocks, 4);
        e.schedule();
        assert!(e.take_admitted(b).unwrap().lora_loaded);
        assert_eq!(e.loaded_adapters, ["chat"]);
    }
}
