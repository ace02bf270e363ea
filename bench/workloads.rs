//! Request bodies for every part, and the pod flags the routing-quality workloads run against.

use crate::support::{request, Sim, MODEL};
use inference_picker::scheduling::rng::Rng;
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

/// Pod flags for the LoRA workload: 12 adapters, room for 2, loading one takes 200 ms.
pub const LORA_SIM: [&str; 6] = [
    "--adapters",
    "lora-0,lora-1,lora-2,lora-3,lora-4,lora-5,lora-6,lora-7,lora-8,lora-9,lora-10,lora-11",
    "--max-lora",
    "2",
    "--lora-load-ms",
    "200",
];

/// `groups` groups of `per_group` chats sharing a ~2048-token system prompt, each with its own
/// ~128-token question, 64 tokens out; shuffled.
pub fn shared_prefix_workload(groups: usize, per_group: usize, rng: &mut Rng) -> Vec<String> {
    let mut requests = Vec::new();
    for g in 0..groups {
        let system = format!("Group {g} system prompt. ").repeat(8192 / 24);
        for q in 0..per_group {
            let question = format!("Question {q} of group {g}: ").repeat(512 / 24);
            requests.push(streamed_chat(&format!(
                "{},{}",
                message("system", &system),
                message("user", &question)
            )));
        }
    }
    rng.shuffle(&mut requests);
    requests
}

/// The best share of prompt tokens any router could have served from cache on `requests`
/// (in order) against pods like `sim`: as if every request went where all earlier ones went
/// and nothing was evicted. A request hits the full token blocks (never its last token, which
/// the engine always computes) whose chained prefix an earlier request already filled. The
/// tokens are the simulator's own (`/tokenize`: its tokenizer after its chat template), so the
/// bound counts what the pods' `prefix_hits` count.
pub fn best_hit_rate(sim: &Sim, requests: &[String]) -> f64 {
    let block = sim.stats()["block_size"].as_u64().unwrap_or(16).max(1) as usize;
    let mut seen = HashSet::new();
    let (mut hits, mut total) = (0usize, 0usize);
    for body in requests {
        let tokens = request(&sim.address, "POST", "/tokenize", &[], body.as_bytes()).json();
        let tokens: Vec<u64> = tokens["tokens"]
            .as_array()
            .map(|ids| ids.iter().filter_map(|id| id.as_u64()).collect())
            .unwrap_or_default();
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

/// A block's hash chained on its parent's, as prefix caches key blocks.
fn chain_hash(parent: u64, tokens: &[u64]) -> u64 {
    let mut hasher = DefaultHasher::new();
    (parent, tokens).hash(&mut hasher);
    hasher.finish()
}

/// `count` unique chats of 64..3072 tokens.
pub fn mixed_workload(count: usize, rng: &mut Rng) -> Vec<String> {
    (0..count)
        .map(|n| {
            let tokens = [64usize, 256, 1024, 3072][rng.below(4)];
            let prompt = format!("{n} unique prompt text ").repeat(tokens * 4 / 22);
            streamed_chat(&message("user", &prompt))
        })
        .collect()
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
    format!(r#"{{"model":"{MODEL}","messages":[{messages}],"max_tokens":64,"stream":true}}"#)
}

/// A completions body of about `bytes` bytes, one token out.
pub fn padded_completion(bytes: usize) -> String {
    one_token_completion(&"x".repeat(bytes.saturating_sub(64)))
}

/// `count` completions whose prompts of exactly `chars` characters differ from the first.
pub fn distinct_completions(count: usize, chars: usize) -> Vec<String> {
    let filler = "lorem ipsum dolor sit amet ".repeat(chars / 27 + 1);
    (0..count)
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
