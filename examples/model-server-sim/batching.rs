//! The batching engine (`--batching`): continuous batching as vLLM V1 schedules it, one engine
//! step at a time, instead of the slot engine's requests timed each on its own.
//!
//! Every step has a token budget (`--max-num-batched-tokens`). Running sequences come first,
//! oldest first: a decoding one takes one token, one still prefilling takes the next chunk of
//! its prompt that fits. Waiting requests are then admitted first come first served while
//! budget, a sequence slot (`--max-num-seqs`), KV blocks for the prompt and a LoRA slot are
//! left. A step lasts `fixed + per token x tokens in the step + per context token x the
//! context its sequences attend to` (`StepCost`), so a long prefill slows every decode in its
//! step and a cache hit frees compute for everyone on the pod. The step that completes a
//! prompt samples its first token; every later step samples one more. A decoding sequence
//! takes one more KV block each time it fills its last; when none is free the newest running
//! sequence is preempted (its blocks freed, its prompt and the tokens it already produced
//! recomputed when it is admitted again), as vLLM does.

use crate::engine::Engine;
use std::collections::VecDeque;
use std::sync::mpsc::Sender;
use std::time::Instant;

/// What one engine step costs, in unscaled milliseconds.
///
/// Defaults from a published vLLM measurement of an 8B model on one H100; see
/// [`StepCost::H100_LLAMA_8B`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub fixed_ms: f64,
    pub ms_per_token: f64,
    pub ms_per_context_token: f64,
}

impl StepCost {
    /// Llama-3-8B in bf16 on one H100 SXM under vLLM, from published measurements:
    /// - fixed part, 7 ms: the 32 layers' linear kernels take ~5.6 ms for up to 64 tokens on an
    ///   H100 (Vidur's profile, `data/profiling/compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv`,
    ///   scaled by Llama-3-8B's 8 % larger layers, plus its 128k-vocabulary head), and vLLM
    ///   reports ~5 ms of GPU time per step for Llama-8B on H100 (blog.vllm.ai, "vLLM V1: A
    ///   Major Upgrade", 2025-01-27) and a TPOT of ~7.5-8 ms at light load (blog.vllm.ai,
    ///   "vLLM v0.6.0: 2.7x Throughput Improvement", 2024-09-05, appendix "Llama 3 8B on
    ///   1xH100"; LambdaLabsML/vllm-benchmark, 1xH100 Meta-Llama-3-8B-Instruct, 10 clients:
    ///   median TPOT 7.56 ms);
    /// - per token in the step, 0.022 ms: Vidur's profile from 2,048 to 4,096 tokens
    ///   ((84.5 - 40.8) ms / 2,048, x 1.08), which puts a 2k-token prompt's TTFT at ~52 ms;
    /// - per context token attended to, 0.00006 ms: 128 KiB of KV per Llama-3-8B token read at
    ///   1.8-3 TB/s (FlashAttention-3 paged decode on H100, Dao-AILab/flash-attention #1572).
    ///
    /// Cross-check: the v0.6.0 appendix's ShareGPT run with every request sent at once (about
    /// 37 req/s) is predicted within a few per cent.
    pub const H100_LLAMA_8B: StepCost = StepCost {
        fixed_ms: 7.0,
        ms_per_token: 0.022,
        ms_per_context_token: 0.000_06,
    };

    /// Milliseconds of a step that computes `tokens` tokens for sequences attending to
    /// `context` tokens in all.
    pub fn step_ms(&self, tokens: usize, context: usize) -> f64 {
        self.fixed_ms
            + self.ms_per_token * tokens as f64
            + self.ms_per_context_token * context as f64
    }
}

/// The batching engine's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchSettings {
    pub max_num_batched_tokens: usize,
    pub cost: StepCost,
    /// Milliseconds a step takes longer for each adapter it has to load.
    pub lora_load_ms: f64,
}

/// A request in the batching engine.
#[derive(Debug)]
pub struct Sequence {
    adapter: Option<String>,
    hashes: Vec<u64>,
    prompt_tokens: usize,
    output_tokens: usize,
    /// Tokens whose KV is computed: the prompt's, then one per decode step.
    computed: usize,
    /// Tokens sampled so far (each one sent to `tokens`).
    generated: usize,
    blocks: Vec<u32>,
    /// Tokens this step computes for it.
    scheduled: usize,
    /// When it was first admitted: its prefill time runs from here to its first token.
    admitted_at: Option<Instant>,
    /// When it was queued (its TTFT runs from here) and when it sampled its last token (the
    /// inter-token latency runs from there).
    queued_at: Instant,
    last_token_at: Option<Instant>,
    /// The number of tokens sampled so far, after each new one; closed when the client left.
    tokens: Sender<usize>,
}

impl Sequence {
    pub fn new(
        adapter: Option<&str>,
        hashes: Vec<u64>,
        prompt_tokens: usize,
        output_tokens: usize,
        tokens: Sender<usize>,
    ) -> Sequence {
        Sequence {
            adapter: adapter.map(String::from),
            hashes,
            prompt_tokens: prompt_tokens.max(1),
            output_tokens: output_tokens.max(1),
            computed: 0,
            generated: 0,
            blocks: Vec::new(),
            scheduled: 0,
            admitted_at: None,
            queued_at: Instant::now(),
            last_token_at: None,
            tokens,
        }
    }

    /// Tokens whose KV must be computed before the next token can be sampled: the prompt and
    /// every token sampled so far (a preempted sequence recomputes them all).
    fn context_needed(&self) -> usize {
        self.prompt_tokens + self.generated
    }

    fn remaining(&self) -> usize {
        self.context_needed().saturating_sub(self.computed)
    }

    fn done(&self) -> bool {
        self.generated >= self.output_tokens
    }
}

/// The batching engine's queues.
#[derive(Debug, Default)]
pub struct Batch {
    pub(crate) waiting: VecDeque<Sequence>,
    /// In admission order: the last is preempted first.
    running: Vec<Sequence>,
    pub(crate) settings: Option<BatchSettings>,
    /// What `/metrics` shows: vLLM V1 sets its gauges from the scheduler's stats at the end
    /// of each step, so a request that arrives mid-step is never seen waiting unless the next
    /// step cannot admit it.
    pub(crate) last_step: StepStats,
}

/// The queues as the last step left them.
#[derive(Debug, Default, Clone)]
pub struct StepStats {
    pub running: usize,
    /// The adapter of each sequence the last scheduling pass left waiting (`None`: the base
    /// model).
    pub waiting: Vec<Option<String>>,
    pub kv_usage: f64,
}

impl Batch {
    pub fn waiting_adapters(&self) -> impl Iterator<Item = Option<&str>> {
        self.waiting.iter().map(|s| s.adapter.as_deref())
    }
}

impl Engine {
    /// Queues a request for the batching engine.
    pub fn enqueue_sequence(&mut self, sequence: Sequence) {
        self.batch.waiting.push_back(sequence);
    }

    /// Plans the next step: what each sequence computes in it; its unscaled milliseconds, or
    /// `None` when there is nothing to run.
    pub fn plan_step(&mut self) -> Option<f64> {
        let settings = self.batch.settings?;
        let mut budget = settings.max_num_batched_tokens.max(1);
        let mut preempted = false;
        let mut index = 0;
        while index < self.batch.running.len() && budget > 0 {
            if self.reserve_or_preempt(index) {
                let sequence = &mut self.batch.running[index];
                sequence.scheduled = sequence.remaining().min(budget);
                budget -= sequence.scheduled;
                index += 1;
            } else {
                preempted = true;
            }
        }
        let mut loaded = 0;
        // vLLM admits nothing new in a step that had to preempt.
        while !preempted && budget > 0 && self.batch.running.len() < self.limits.max_num_seqs {
            let Some(admitted) = self.admit_next() else {
                break;
            };
            loaded += usize::from(admitted);
            let Some(sequence) = self.batch.running.last_mut() else {
                break;
            };
            sequence.scheduled = sequence.remaining().min(budget);
            budget -= sequence.scheduled;
        }
        self.peak_waiting = self.peak_waiting.max(self.waiting());
        self.batch.last_step.waiting = self
            .batch
            .waiting_adapters()
            .map(|a| a.map(String::from))
            .collect();
        let (tokens, context) = self
            .batch
            .running
            .iter()
            .filter(|s| s.scheduled > 0)
            .fold((0, 0), |(tokens, context), s| {
                (tokens + s.scheduled, context + s.computed + s.scheduled)
            });
        (tokens > 0)
            .then(|| settings.cost.step_ms(tokens, context) + settings.lora_load_ms * loaded as f64)
    }

    /// KV blocks for what running sequence `index` computes next, preempting the newest
    /// running sequences until there are; false if `index` itself was preempted.
    fn reserve_or_preempt(&mut self, index: usize) -> bool {
        loop {
            let Some(sequence) = self.batch.running.get_mut(index) else {
                return false;
            };
            let wanted = self.kv.blocks_for(sequence.computed + 1);
            if sequence.blocks.len() >= wanted || self.kv.grow(&mut sequence.blocks) {
                if sequence.blocks.len() >= wanted {
                    return true;
                }
                continue;
            }
            let newest = self.batch.running.len() - 1;
            if newest == 0 {
                // Alone and still too long for the whole cache (vLLM refuses such a request
                // up front): it ends here, and its client sees the stream stop.
                self.end(0);
                return false;
            }
            self.preempt(newest);
            if newest == index {
                return false;
            }
        }
    }

    /// Running sequence `index` gives its blocks back and waits at the head of the queue.
    fn preempt(&mut self, index: usize) {
        if index >= self.batch.running.len() {
            return;
        }
        let mut sequence = self.batch.running.remove(index);
        self.stop_running(&sequence);
        sequence.blocks.clear();
        sequence.computed = 0;
        sequence.scheduled = 0;
        self.preemptions += 1;
        self.batch.waiting.push_front(sequence);
    }

    /// Admits the first waiting sequence that can run (one waiting for a LoRA slot is passed
    /// over; one without KV room stops admission); `Some(adapter loaded)` if one was.
    fn admit_next(&mut self) -> Option<bool> {
        let position = self.batch.waiting.iter().position(|s| {
            s.adapter
                .as_deref()
                .is_none_or(|adapter| self.lora_ready(adapter))
        })?;
        let sequence = self.batch.waiting.get(position)?;
        let context = sequence.context_needed();
        let allocation = self.kv.allocate(&sequence.hashes, context, context)?;
        let mut sequence = self.batch.waiting.remove(position)?;
        let loaded = self.start_running(sequence.adapter.as_deref(), context, &allocation);
        sequence.computed = allocation.hit_tokens;
        sequence.blocks = allocation.blocks;
        sequence.admitted_at.get_or_insert_with(Instant::now);
        self.batch.running.push(sequence);
        Some(loaded)
    }

    /// The planned step ran: every sequence's tokens are computed, the ones that caught up
    /// sample a token and send it; finished sequences and those whose client left end.
    pub fn complete_step(&mut self) {
        let mut ended = Vec::new();
        for (index, sequence) in self.batch.running.iter_mut().enumerate() {
            if sequence.scheduled == 0 {
                continue;
            }
            sequence.computed += sequence.scheduled;
            sequence.scheduled = 0;
            if sequence.computed < sequence.context_needed() {
                continue;
            }
            sequence.generated += 1;
            self.generation_tokens += 1;
            let now = Instant::now();
            if sequence.generated == 1 {
                let admitted_at = sequence.admitted_at.unwrap_or(now);
                self.prefill_time
                    .observe(now.duration_since(admitted_at).as_secs_f64());
                self.first_token_time
                    .observe(now.duration_since(sequence.queued_at).as_secs_f64());
            } else if let Some(last) = sequence.last_token_at {
                self.inter_token_time
                    .observe(now.duration_since(last).as_secs_f64());
            }
            sequence.last_token_at = Some(now);
            let client_left = sequence.tokens.send(sequence.generated).is_err();
            if client_left || sequence.done() {
                ended.push(index);
            }
        }
        for index in ended.into_iter().rev() {
            self.end(index);
        }
        self.batch.last_step.running = self.batch.running.len();
        self.batch.last_step.kv_usage = self.kv.usage();
    }

    /// Running sequence `index` is over (finished, or its client left).
    fn end(&mut self, index: usize) {
        if index < self.batch.running.len() {
            let sequence = self.batch.running.remove(index);
            self.stop_running(&sequence);
            self.requests_total += 1;
        }
    }

    /// A sequence leaves the batch: its blocks, slot and adapter are given back.
    fn stop_running(&mut self, sequence: &Sequence) {
        self.release(sequence.adapter.as_deref(), &sequence.blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Limits;
    use crate::kv_cache::KvCache;
    use std::sync::mpsc::{channel, Receiver};

    const COST: StepCost = StepCost {
        fixed_ms: 5.0,
        ms_per_token: 0.1,
        ms_per_context_token: 0.0,
    };

    fn engine(max_num_seqs: usize, blocks: usize, budget: usize) -> Engine {
        let mut engine = Engine::new(
            Limits {
                max_num_seqs,
                max_lora: 1,
            },
            KvCache::new(blocks, 4),
        );
        engine.batch.settings = Some(BatchSettings {
            max_num_batched_tokens: budget,
            cost: COST,
            lora_load_ms: 0.0,
        });
        engine
    }

    fn request(engine: &mut Engine, prompt: usize, output: usize) -> Receiver<usize> {
        let (tokens, received) = channel();
        engine.enqueue_sequence(Sequence::new(None, vec![], prompt, output, tokens));
        received
    }

    fn step(engine: &mut Engine) -> Option<f64> {
        let ms = engine.plan_step();
        engine.complete_step();
        ms
    }

    #[test]
    fn decodes_go_first_and_prefills_are_chunked_into_the_budget() {
        let mut e = engine(8, 64, 10);
        let a = request(&mut e, 4, 3);
        // Step 1: a's whole prompt (4 tokens) and its first token.
        assert_eq!(step(&mut e), Some(5.0 + 0.1 * 4.0));
        assert_eq!(a.try_recv(), Ok(1));
        let b = request(&mut e, 20, 2);
        // Step 2: a decodes (1 token), b prefills the 9 that fit; no token for b yet.
        assert_eq!(step(&mut e), Some(5.0 + 0.1 * 10.0));
        assert_eq!((a.try_recv(), b.try_recv().ok()), (Ok(2), None));
        // Step 3: a's last token, b's next 9 prompt tokens.
        assert_eq!(step(&mut e), Some(5.0 + 0.1 * 10.0));
        assert_eq!((a.try_recv(), b.try_recv().ok()), (Ok(3), None));
        assert_eq!((e.running, e.requests_total), (1, 1));
        // Step 4: b's last 2 prompt tokens and its first token; step 5 its last.
        assert_eq!(step(&mut e), Some(5.0 + 0.1 * 2.0));
        assert_eq!(step(&mut e), Some(5.0 + 0.1));
        assert_eq!(b.try_iter().collect::<Vec<_>>(), [1, 2]);
        assert_eq!((e.running, e.requests_total, step(&mut e)), (0, 2, None));
    }

    #[test]
    fn a_cached_prefix_is_not_computed_again() {
        let mut e = engine(8, 64, 100);
        let hashes = crate::kv_cache::block_hashes(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 4, None);
        let (tokens, first) = channel();
        e.enqueue_sequence(Sequence::new(None, hashes.clone(), 9, 1, tokens));
        assert_eq!(step(&mut e), Some(5.0 + 0.1 * 9.0));
        assert_eq!(first.try_recv(), Ok(1));
        let (tokens, second) = channel();
        e.enqueue_sequence(Sequence::new(None, hashes, 9, 1, tokens));
        // Two full blocks (8 tokens) cached: one token left to compute.
        assert_eq!(step(&mut e), Some(5.0 + 0.1));
        assert_eq!(second.try_recv(), Ok(1));
        assert_eq!((e.prefix_queries, e.prefix_hits), (18, 8));
    }

    #[test]
    fn slots_bound_the_batch() {
        let mut e = engine(2, 64, 100);
        let receivers: Vec<_> = (0..3).map(|_| request(&mut e, 4, 2)).collect();
        step(&mut e);
        assert_eq!((e.running, e.waiting()), (2, 1));
        assert!(receivers[2].try_recv().is_err());
    }

    #[test]
    fn metrics_show_the_queues_as_the_last_step_left_them() {
        let mut e = engine(2, 64, 100);
        let _first = request(&mut e, 4, 3);
        let snapshot = |e: &mut Engine| {
            let s = e.snapshot("m", 0.0, 0.0);
            (s.running, s.waiting_capacity)
        };
        assert_eq!(
            snapshot(&mut e),
            (0, 0),
            "arrived mid-step: not seen waiting"
        );
        step(&mut e);
        let _more: Vec<_> = (0..2).map(|_| request(&mut e, 4, 3)).collect();
        assert_eq!(
            snapshot(&mut e),
            (1, 0),
            "the last step ran one; two arrived since"
        );
        step(&mut e);
        assert_eq!(
            snapshot(&mut e),
            (2, 1),
            "the next step admitted one; the slots hold the other back"
        );
    }

    #[test]
    fn a_full_cache_preempts_the_newest_and_recomputes_it() {
        // 4 blocks of 4 tokens: a and b take 2 each for their 8-token prompts, then the
        // first decode that needs a fifth block preempts b, the newest.
        let mut e = engine(8, 4, 100);
        let a = request(&mut e, 7, 4);
        let b = request(&mut e, 7, 4);
        step(&mut e);
        assert_eq!((a.try_recv(), b.try_recv()), (Ok(1), Ok(1)));
        step(&mut e);
        assert_eq!((a.try_recv(), b.try_recv()), (Ok(2), Ok(2)));
        step(&mut e);
        assert_eq!(e.preemptions, 1);
        assert_eq!((e.running, e.waiting()), (1, 1));
        assert_eq!(a.try_recv(), Ok(3));
        assert!(b.try_recv().is_err());
        while step(&mut e).is_some() {}
        assert_eq!(a.try_iter().collect::<Vec<_>>(), [4]);
        // b recomputed its prompt and the tokens it had, then went on from its third.
        assert_eq!(b.try_iter().collect::<Vec<_>>(), [3, 4]);
        assert_eq!((e.requests_total, e.kv.used_blocks()), (2, 0));
    }

    #[test]
    fn a_client_that_left_ends_its_sequence() {
        let mut e = engine(8, 64, 100);
        let gone = request(&mut e, 4, 50);
        drop(gone);
        step(&mut e);
        assert_eq!((e.running, e.requests_total, e.kv.used_blocks()), (0, 1, 0));
    }

    #[test]
    fn a_step_costs_its_tokens_and_their_context() {
        let cost = StepCost {
            fixed_ms: 1.0,
            ms_per_token: 0.5,
            ms_per_context_token: 0.01,
        };
        assert_eq!(cost.step_ms(10, 1000), 1.0 + 5.0 + 10.0);
    }
}
