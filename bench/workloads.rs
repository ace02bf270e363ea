//! Request bodies for every part, and the pod flags the routing-quality workloads run against.

use crate::support::{request, Sim, MODEL};
use inference_picker_core::scheduling::rng::Rng;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};

/// Routing-quality pods: two sequences at a time, real prefill and decode timing scaled by 0.2,
/// a prefix cache of 1,024 blocks.
pub const QUALITY_SIM: [&str; 10] = [
    "--max-num-seqs",
    "2",
    "--time-scale",
    "0.2",
    "--prefill-us-per-token",
    "400",
    "--decode-ms-per-token",
    "10",
    "--kv-blocks",
    "1024",
];

/// Routing-quality pods as the batching engine: vLLM V1's continuous batching of up to 32
/// sequences within 8,192 tokens a step, an 8B model's step costs on one H100 (the
/// simulator's defaults, cited in `examples/model-server-sim/batching.rs`, spelled out here
/// for the ceiling) and its KV cache (~423k tokens: 26,400 blocks of 16), time-scaled by 3;
/// tokens streamed 16 to a chunk. The batch and the scale are what a 2-core machine can
/// drive past saturation in cells of a few hundred requests: 8 pods x 32 sequences in flight,
/// each request ~64 steps long.
pub const BATCHING_SIM: [&str; 17] = [
    "--batching",
    "--max-num-seqs",
    "32",
    "--max-num-batched-tokens",
    "8192",
    "--kv-blocks",
    "26400",
    "--time-scale",
    "3",
    "--stream-interval",
    "16",
    "--step-fixed-ms",
    "7",
    "--step-ms-per-token",
    "0.022",
    "--step-ms-per-context-token",
    "0.00006",
];

/// The value of `flag` in pod flags such as [`QUALITY_SIM`]; NaN if absent.
pub fn flag_value(flags: &[&str], flag: &str) -> f64 {
    flags
        .iter()
        .position(|f| *f == flag)
        .and_then(|i| flags.get(i + 1)?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Tokens every routing-quality chat asks for (`max_tokens`); the pods generate exactly this
/// many.
pub const OUTPUT_TOKENS: usize = 64;

/// Pod flags for the LoRA workload: 12 adapters, room for 2 (the load time is the regime's).
pub const LORA_SIM: [&str; 4] = [
    "--adapters",
    "lora-0,lora-1,lora-2,lora-3,lora-4,lora-5,lora-6,lora-7,lora-8,lora-9,lora-10,lora-11",
    "--max-lora",
    "2",
];

/// `groups` groups of `per_group` chats sharing a ~2048-token system prompt, each with its own
/// ~128-token question, 64 tokens out; shuffled.
pub fn shared_prefix_workload(groups: usize, per_group: usize, rng: &mut Rng) -> Vec<String> {
    grouped_workload(&vec![per_group; groups], rng)
        .into_iter()
        .map(|(_, chat)| chat)
        .collect()
}

/// [`shared_prefix_workload`] with each chat's group.
pub fn shared_prefix_groups(
    groups: usize,
    per_group: usize,
    rng: &mut Rng,
) -> Vec<(usize, String)> {
    grouped_workload(&vec![per_group; groups], rng)
}

/// `total` chats over `groups` groups built as in [`shared_prefix_workload`], the group sizes
/// Zipf-distributed with the exponent that gives the first group `hot_share` of them (one hot
/// system prompt, a long tail of cold ones); shuffled.
pub fn hot_prefix_workload(
    groups: usize,
    total: usize,
    hot_share: f64,
    rng: &mut Rng,
) -> Vec<String> {
    grouped_workload(&zipf_counts(groups, total, hot_share), rng)
        .into_iter()
        .map(|(_, chat)| chat)
        .collect()
}

/// Chats of group `g` for each `counts[g]`, each with its group, shuffled.
fn grouped_workload(counts: &[usize], rng: &mut Rng) -> Vec<(usize, String)> {
    let mut requests = Vec::new();
    for (g, &count) in counts.iter().enumerate() {
        let system = format!("Group {g} system prompt. ").repeat(8192 / 24);
        for q in 0..count {
            let question = format!("Question {q} of group {g}: ").repeat(512 / 24);
            let chat = streamed_chat(&format!(
                "{},{}",
                message("system", &system),
                message("user", &question)
            ));
            requests.push((g, chat));
        }
    }
    rng.shuffle(&mut requests);
    requests
}

/// `total` split over `groups` in proportion to `1 / rank^s`, with `s` found by bisection so
/// that the first group gets `hot_share`; rounding is settled on the first group.
fn zipf_counts(groups: usize, total: usize, hot_share: f64) -> Vec<usize> {
    let weights = |s: f64| -> Vec<f64> { (1..=groups).map(|k| (k as f64).powf(-s)).collect() };
    let top_share = |s: f64| 1.0 / weights(s).iter().sum::<f64>();
    let (mut low, mut high) = (0.0f64, 8.0f64);
    for _ in 0..60 {
        let mid = (low + high) / 2.0;
        if top_share(mid) < hot_share {
            low = mid;
        } else {
            high = mid;
        }
    }
    let weights = weights(low);
    let sum: f64 = weights.iter().sum();
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|w| (w / sum * total as f64).round() as usize)
        .collect();
    let rest: usize = counts[1..].iter().sum();
    counts[0] = total.saturating_sub(rest);
    counts
}

/// Applications (system prompts) the multi-turn conversations share, 16 conversations each at
/// 64 conversations.
const CHAT_APPS: usize = 4;

/// `conversations` chats of `turns` turns each. Turn `k` re-sends the whole history: the
/// conversation's application system prompt (~512 tokens, one of [`CHAT_APPS`]), turns
/// `0..k` (a ~64-token user message and a ~64-token assistant reply each; the reply is a
/// stand-in of the length the pod generates, not its text: pods cache prompt blocks only, so
/// the text of the reply does not change what hits) and a new ~64-token user message; 64
/// tokens out.
///
/// Arrival order: round by round (turn 0 of every conversation, then turn 1, ...), the
/// conversations in the same shuffled order every round, so the turns of a conversation are
/// exactly `conversations` arrivals apart: at 60 req/s and 64 conversations, ~1 s, several
/// times a turn's service time, so turn `k + 1` is sent after turn `k` finished unless the
/// pods are far past saturation. The load stays open-loop.
pub fn multi_turn_workload(conversations: usize, turns: usize, rng: &mut Rng) -> Vec<String> {
    multi_turn_sessions(conversations, turns, rng)
        .into_iter()
        .map(|(_, chat)| chat)
        .collect()
}

/// [`multi_turn_workload`] with each chat's conversation, for a balancer that hashes sessions.
pub fn multi_turn_sessions(
    conversations: usize,
    turns: usize,
    rng: &mut Rng,
) -> Vec<(usize, String)> {
    let mut order: Vec<usize> = (0..conversations).collect();
    rng.shuffle(&mut order);
    (0..turns)
        .flat_map(|turn| order.iter().map(move |&c| (c, chat_turn(c, turn))))
        .collect()
}

/// Turn `turn` of conversation `c`, with the whole history before it.
fn chat_turn(c: usize, turn: usize) -> String {
    let app = c % CHAT_APPS;
    let mut messages = vec![message(
        "system",
        &format!("App {app} system prompt. ").repeat(102),
    )];
    for t in 0..turn {
        messages.push(user_turn(c, t));
        messages.push(message(
            "assistant",
            &format!("Reply {t} to user {c} here. ").repeat(9),
        ));
    }
    messages.push(user_turn(c, turn));
    streamed_chat(&messages.join(","))
}

fn user_turn(c: usize, t: usize) -> String {
    message("user", &format!("User {c} turn {t} asks this. ").repeat(9))
}

/// The best share of prompt tokens any router could have served from cache on `requests`
/// (in order) against pods like `sim`: as if every request went where all earlier ones went
/// and nothing was evicted. A request hits the full token blocks (never its last token, which
/// the engine always computes) whose chained prefix an earlier request already filled. The
/// tokens are the simulator's own (`/tokenize`: its tokenizer after its chat template), so the
/// bound counts what the pods' `prefix_hits` count.
pub fn best_hit_rate(sim: &Sim, requests: &[String]) -> f64 {
    best_hit_rate_of(&prompt_tokens(sim, requests), block_size(sim))
}

/// [`best_hit_rate`] over prompts already tokenized, with blocks of `block` tokens.
pub fn best_hit_rate_of(prompts: &[Vec<u64>], block: usize) -> f64 {
    let mut seen = HashSet::new();
    let (mut hits, mut total) = (0usize, 0usize);
    for tokens in prompts {
        total += tokens.len();
        let cacheable = tokens.len().saturating_sub(1) / block;
        let mut chain = 0u64;
        let mut hitting = true;
        for full in tokens.chunks(block).take(cacheable) {
            chain = chain_hash(chain, full);
            if hitting && seen.contains(&chain) {
                hits += block;
            } else {
                hitting = false;
                seen.insert(chain);
            }
        }
    }
    hits as f64 / total.max(1) as f64
}

/// Each request's prompt as `sim` tokenizes it (its tokenizer after its chat template).
pub fn prompt_tokens(sim: &Sim, requests: &[String]) -> Vec<Vec<u64>> {
    requests
        .iter()
        .map(|body| {
            let tokens = request(&sim.address, "POST", "/tokenize", &[], body.as_bytes()).json();
            tokens["tokens"]
                .as_array()
                .map(|ids| ids.iter().filter_map(|id| id.as_u64()).collect())
                .unwrap_or_default()
        })
        .collect()
}

/// Tokens per prefix-cache block of `sim`.
pub fn block_size(sim: &Sim) -> usize {
    sim.stats()["block_size"].as_u64().unwrap_or(16).max(1) as usize
}

/// A block's hash chained on its parent's, as prefix caches key blocks.
fn chain_hash(parent: u64, tokens: &[u64]) -> u64 {
    let mut hasher = DefaultHasher::new();
    (parent, tokens).hash(&mut hasher);
    hasher.finish()
}

/// `count` unique chats of 64..3072 tokens.
pub fn mixed_workload(count: usize, rng: &mut Rng) -> Vec<String> {
    (0..count)
        .map(|n| unique_chat(n, [64usize, 256, 1024, 3072][rng.below(4)]))
        .collect()
}

/// Chat `n` of about `tokens` prompt tokens that no other shares, streamed.
pub fn unique_chat(n: usize, tokens: usize) -> String {
    let prompt = format!("{n} unique prompt text ").repeat(tokens * 4 / 22);
    streamed_chat(&message("user", &prompt))
}

/// The mixed workload, each request for one of 12 adapters, uniformly.
pub fn lora_workload(count: usize, rng: &mut Rng) -> Vec<String> {
    mixed_workload(count, rng)
        .into_iter()
        .map(|body| body.replacen(MODEL, &format!("lora-{}", rng.below(12)), 1))
        .collect()
}

fn message(role: &str, content: &str) -> String {
    format!(r#"{{"role":"{role}","content":"{content}"}}"#)
}

fn streamed_chat(messages: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","messages":[{messages}],"max_tokens":{OUTPUT_TOKENS},"stream":true}}"#
    )
}

/// A completions body of about `bytes` bytes, one token out.
pub fn padded_completion(bytes: usize) -> String {
    one_token_completion(&"x".repeat(bytes.saturating_sub(64)))
}

/// `count` completions whose prompts of exactly `chars` characters differ from the first.
pub fn distinct_completions(count: usize, chars: usize) -> Vec<String> {
    distinct_completions_from(0, count, chars)
}

/// As [`distinct_completions`], numbered from `first`: distinct from those of other numbers.
pub fn distinct_completions_from(first: usize, count: usize, chars: usize) -> Vec<String> {
    let filler = "lorem ipsum dolor sit amet ".repeat(chars / 27 + 1);
    (first..first + count)
        .map(|n| {
            let prompt = format!("{n:09} {filler}");
            one_token_completion(&prompt[..chars])
        })
        .collect()
}

fn one_token_completion(prompt: &str) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":"{prompt}","max_tokens":1}}"#)
}

/// `count` chats of about `chars` characters that share their first half.
pub fn half_shared_chats(count: usize, chars: usize) -> Vec<String> {
    let shared = "s".repeat(chars / 2);
    (0..count)
        .map(|n| {
            let tail = format!("{n:04}").repeat(chars / 8);
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{shared}{tail}"}}]}}"#)
        })
        .collect()
}
