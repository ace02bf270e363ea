//! `prefix-cache-scorer` (approximate): the share of the prompt's leading blocks an endpoint
//! probably holds in its KV cache, learned from the filter's own past picks.
//!
//! Blocks are `blockSizeTokens * 4` characters; block hashes chain from the model name, so a
//! block only matches when everything before it matched too.
//!
//! With `homeAffinity` (by default when `pool.replicas` is above 1, with live load signals) a
//! prefix that other requests share also has a home: the pod its leading blocks rank first by
//! rendezvous hashing, which it leaves for the next in that order only when the wait there
//! outlasts the cold prefill it would cost (see [`crate::scheduling::prefix_home`]). Every
//! Envoy replica computes the same home, so a prefix no replica has seen yet still lands where
//! the others sent it; what this replica learned raises the share the home is expected to
//! hold. The home scores that share, so a short shared start pulls less against the load
//! scorers than a long one.

use crate::endpoint::Pool;
use crate::hash::hash_bytes;
use crate::limits;
use crate::request::InferenceRequest;
use crate::request::CHARS_PER_TOKEN;
use crate::scheduling::plugins::spec::{effective, Data, Kind, PluginSpec, Signal};
use crate::scheduling::prefix_home::{MemberHashes, PrefixHome, SpillRule};
use crate::scheduling::prefix_index::PrefixIndex;
use crate::scheduling::{
    CycleState, LearnedPrefix, Plugin, PrefixMatches, SchedulingContext, Scorer,
};
use serde_yaml::Value;

pub const TYPE: &str = "prefix-cache-scorer";
/// The name older llm-d configs use.
pub const LEGACY_TYPE: &str = "prefix-cache";

/// The registry's entry for this plugin.
pub const SPEC: PluginSpec = PluginSpec::new(TYPE, Kind::Scorer, build, effective::<Parameters>)
    .with_aliases(&[LEGACY_TYPE])
    .consuming(&[
        Data::Metric(Signal::CacheConfig),
        Data::Metric(Signal::WaitingQueue),
        Data::InFlight,
    ])
    .producing(&[Data::PrefixMatches]);

#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Parameters {
    /// `blockSize` is the older llm-d spelling.
    #[serde(alias = "blockSize")]
    pub block_size_tokens: usize,
    /// Older configs give the block size in characters instead.
    pub hash_block_size: Option<usize>,
    pub max_prefix_blocks_to_match: usize,
    pub lru_capacity_per_server: usize,
    /// Size each pod's LRU from its `vllm:cache_config_info` when it reports one.
    pub auto_tune: bool,
    /// Waiting requests beyond the shortest candidate queue at which a cached prefix stops
    /// counting: a hit saves one prefill, a queue costs every request ahead, so an endpoint
    /// holding a hot prefix sheds the overflow to the next best pod, which then caches the
    /// prefix too. The hit counts `1 - (excess / limit)^2`: one request ahead barely matters
    /// (a queue that short drains faster than a prefill), a few do, and at this excess the hit
    /// counts nothing; 0 (or `pool.loadSignals: scraped`) keeps GIE's load-blind score.
    pub affinity_queue_limit: usize,
    /// llm-d-router's share of the score given to the matched length rather than the matched
    /// ratio: `w x min(1, matched tokens / matchLengthScaleTokens)^2 + (1 - w) x ratio`. The
    /// square favours long matches, whose prefill (quadratic attention) costs most to redo.
    pub match_length_weight: f64,
    pub match_length_scale_tokens: usize,
    /// Send a shared prefix to its home pod (see the module documentation) when no pod is
    /// known to hold more of it. Unset: only behind several Envoy replicas (`pool.replicas`
    /// above one), since one Envoy knows every placement itself and places a new prefix by
    /// load, which spreads prefixes more evenly than a hash. `true`: always. `false`, or
    /// `pool.loadSignals: scraped`: never, scoring learned matches only, as GIE does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub home_affinity: Option<bool>,
    /// Leading blocks that name a prefix's home: a system prompt names its application by up to
    /// this many of its blocks, and a prompt this replica has placed before by this many (all
    /// of a shorter one). A continuing conversation (a chat with an assistant turn) is named by
    /// its opening instead, up to the block where its first assistant turn begins, so that its
    /// later turns follow each other rather than its system prompt's other conversations. A
    /// prompt with neither, seen for the first time, has no home.
    pub home_key_blocks: usize,
    /// A home is let go of when the wait behind it is longer than the cold prefill of the
    /// shared prefix at the next pod in the prefix's order, from each pod's pace (learned from
    /// vLLM's counters). A pod whose pace is not known yet is skipped as a home while its load
    /// (running plus waiting) is above this many times the candidates' mean, plus one request.
    pub home_load_factor: f64,
    /// The score of each next pod in the prefix's order (within the bound) is this times
    /// the one before's: what spills from a busy home goes to the same few pods from every
    /// replica, unless another pod is much less loaded.
    pub home_rank_decay: f64,
    /// llm-d-router's producer instance to read matches from; accepted, since this scorer
    /// keeps its own index.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub prefix_match_info_producer_name: String,
}

impl Default for Parameters {
    fn default() -> Self {
        Parameters {
            block_size_tokens: 16,
            hash_block_size: None,
            max_prefix_blocks_to_match: 256,
            lru_capacity_per_server: 31_250,
            auto_tune: true,
            affinity_queue_limit: DEFAULT_AFFINITY_QUEUE_LIMIT,
            match_length_weight: 0.0,
            match_length_scale_tokens: 8192,
            home_affinity: None,
            home_key_blocks: 16,
            home_load_factor: 2.0,
            home_rank_decay: 0.5,
            prefix_match_info_producer_name: String::new(),
        }
    }
}

/// See [`Parameters::affinity_queue_limit`].
pub const DEFAULT_AFFINITY_QUEUE_LIMIT: usize = 4;

/// Requests by which, with all placements shared (`pool.peers`), a pod's queue may read
/// longer than the shortest before its hit is discounted, in a fleet of many replicas.
const PEER_VIEW_SLACK: f64 = 3.0;

/// The most a learned hit's score is lowered, as a share of it, to break a tie by the
/// prefix's order: far below any difference the matches or the load make, far above the
/// totals' rounding.
const ORDER_TIE_BREAK: f64 = 1e-6;

/// How far a queue as this replica reads it can be from the truth, in requests: what the
/// other replicas placed since their last state (the share `1 - 1/replicas` of the traffic
/// this one does not see at once). The shortest of several such readings is the one most
/// likely read short, so without the slack every replica lets a hit go for a queue that is
/// not shorter, each to a different pod: the prefix's prefill repeated, its caches crowded
/// (part 5 of the bench measures pods per prefix group).
fn peer_view_slack(pool: &Pool) -> f64 {
    if !pool.peers_share_load {
        return 0.0;
    }
    PEER_VIEW_SLACK * (1.0 - 1.0 / pool.replicas.max(1.0))
}

impl Parameters {
    /// How much of a hit counts at an endpoint with `waiting` requests when the shortest
    /// candidate queue is `shortest`.
    fn affinity_weight(&self, waiting: Option<f64>, shortest: f64) -> f64 {
        let (Some(waiting), limit) = (waiting, self.affinity_queue_limit) else {
            return 1.0;
        };
        if limit == 0 || !shortest.is_finite() {
            return 1.0;
        }
        let share = ((waiting - shortest) / limit as f64).clamp(0.0, 1.0);
        1.0 - share * share
    }

    fn block_chars(&self) -> usize {
        self.hash_block_size
            .unwrap_or(self.block_size_tokens.saturating_mul(CHARS_PER_TOKEN))
    }

    fn block_tokens(&self) -> usize {
        self.block_chars().div_ceil(CHARS_PER_TOKEN)
    }

    /// The cache score before the queue discount: the matched ratio, blended with the matched
    /// length when `matchLengthWeight` is set.
    fn cache_score(&self, ratio: f64, matched_tokens: u32) -> f64 {
        let weight = self.match_length_weight;
        if weight <= 0.0 {
            return ratio;
        }
        let scale = self.match_length_scale_tokens.max(1) as f64;
        let length = (f64::from(matched_tokens) / scale).min(1.0);
        weight * length * length + (1.0 - weight) * ratio
    }
}

pub struct PrefixCacheScorer {
    parameters: Parameters,
    index: PrefixIndex,
    /// Hashes of the request being scheduled, reused by `on_picked`.
    hashes: Vec<u64>,
    all_endpoints: Vec<usize>,
    /// Own picks not yet handed to the other workers; bounded when nobody collects them.
    learned: Vec<LearnedPrefix>,
    members: MemberHashes,
    /// The home of the request being scheduled, from the last `score`.
    home: PrefixHome,
    /// Leading blocks of the request being scheduled that name its home.
    key_blocks: usize,
    /// The share of the request's prompt its home is expected to hold; 0 when nothing says
    /// another request shares its start, and it has no home.
    home_share: f64,
    home_picks: u64,
    home_spills: u64,
    /// Whether its matches are the request's (the cycle state's), which filters, deciders and
    /// the cost model read; a second index (a CPU tier) keeps its own in `own_matches`.
    publishes: bool,
    own_matches: PrefixMatches,
}

/// Own picks kept for sharing between two collections.
const MAX_UNSHARED: usize = 1024;

pub fn build(parameters: &Value) -> Result<Plugin, String> {
    Ok(Plugin::Scorer(Box::new(PrefixCacheScorer::new(
        super::parameters(parameters)?,
    )?)))
}

impl PrefixCacheScorer {
    pub fn new(parameters: Parameters) -> Result<Self, String> {
        let p = &parameters;
        let checks = [
            (
                "blockSizeTokens",
                p.block_size_tokens,
                limits::BLOCK_SIZE_TOKENS,
            ),
            (
                "maxPrefixBlocksToMatch",
                p.max_prefix_blocks_to_match,
                limits::PREFIX_BLOCKS_TO_MATCH,
            ),
            (
                "lruCapacityPerServer",
                p.lru_capacity_per_server,
                limits::LRU_CAPACITY_PER_SERVER,
            ),
            (
                "affinityQueueLimit",
                p.affinity_queue_limit,
                limits::AFFINITY_QUEUE_LIMIT,
            ),
        ];
        for (key, value, bounds) in checks {
            bounds
                .check_usize(value)
                .map_err(|reason| format!("{key}: {reason}"))?;
        }
        if !(0.0..=1.0).contains(&p.match_length_weight) {
            return Err(format!(
                "matchLengthWeight: {} must be from 0 to 1",
                p.match_length_weight
            ));
        }
        if p.match_length_scale_tokens == 0 {
            return Err("matchLengthScaleTokens must be at least 1".into());
        }
        if p.home_key_blocks == 0 {
            return Err("homeKeyBlocks must be at least 1".into());
        }
        if !(1.0..=100.0).contains(&p.home_load_factor) {
            return Err(format!(
                "homeLoadFactor: {} must be from 1 to 100",
                p.home_load_factor
            ));
        }
        if !(0.0..=1.0).contains(&p.home_rank_decay) {
            return Err(format!(
                "homeRankDecay: {} must be from 0 to 1",
                p.home_rank_decay
            ));
        }
        if let Some(chars) = p.hash_block_size {
            limits::HASH_BLOCK_CHARS
                .check_usize(chars)
                .map_err(|reason| format!("hashBlockSize: {reason}"))?;
        }
        Ok(PrefixCacheScorer {
            index: PrefixIndex::new(parameters.lru_capacity_per_server),
            parameters,
            hashes: Vec::new(),
            all_endpoints: Vec::new(),
            learned: Vec::new(),
            members: MemberHashes::default(),
            home: PrefixHome::default(),
            key_blocks: 0,
            home_share: 0.0,
            home_picks: 0,
            home_spills: 0,
            publishes: true,
            own_matches: PrefixMatches::default(),
        })
    }

    /// Keeps this index's matches to itself (see `publishes`).
    pub fn keep_matches_private(&mut self) {
        self.publishes = false;
    }

    /// The matches this scorer scores from: the request's, or its own.
    fn matches<'a>(&'a self, ctx: &'a SchedulingContext<'_>) -> Option<&'a PrefixMatches> {
        if self.publishes {
            ctx.cycle.prefix.as_ref()
        } else {
            Some(&self.own_matches)
        }
    }

    /// Picks that went to the prefix's first-ranked pod (`home_picks`), and picks that went
    /// to the pod the prefix spilled to because the first-ranked was busy (`home_spills`).
    pub fn home_counts(&self) -> (u64, u64) {
        (self.home_picks, self.home_spills)
    }

    /// How many leading blocks name `request`'s home and the share of its prompt the home is
    /// expected to hold, when something says other requests share its start:
    /// - a continuing conversation is named by its opening, and its home holds all of it but
    ///   the latest turn;
    /// - a system prompt of at least one block names its application (up to `homeKeyBlocks`),
    ///   and the home holds the system prompt;
    /// - a prompt whose key blocks this replica has already placed is shared, whatever it is.
    ///
    /// A prompt with none of these (one user message seen for the first time, say) has no
    /// home: ranking pods for text nobody shares would only pull it against the load.
    fn home_basis(&self, request: &InferenceRequest, best_match: usize) -> Option<(usize, f64)> {
        let block_chars = self.parameters.block_chars().max(1);
        let total = self.hashes.len();
        let learned = best_match as f64 / total.max(1) as f64;
        let opening = request
            .opening_chars
            .map(|chars| chars.div_ceil(block_chars))
            .filter(|&blocks| blocks > 0);
        if let Some(blocks) = opening {
            return Some((blocks, 1.0));
        }
        let key = self.parameters.home_key_blocks.min(total);
        let system = request
            .system_chars
            .map(|chars| (chars / block_chars).min(total))
            .filter(|&blocks| blocks > 0);
        if let Some(blocks) = system {
            let share = (blocks as f64 / total as f64).max(learned);
            return Some((blocks.min(key), share));
        }
        (key > 0 && best_match >= key).then_some((key, learned))
    }

    /// The request's home key: the chained hash of the blocks that name it.
    fn home_key(&self) -> Option<u64> {
        let blocks = self.key_blocks.min(self.hashes.len());
        self.hashes.get(blocks.checked_sub(1)?).copied()
    }

    /// The key whose order breaks ties between learned hits: the home key, else the first
    /// block's hash. Only replicas that share placements (`pool.peers`) need one: each knows
    /// every pod the prefix went to, and would otherwise pick among equals at random.
    fn order_key(&mut self, pool: &Pool) -> Option<u64> {
        if !pool.peers_share_load {
            return None;
        }
        self.members.refresh(pool);
        self.home_key().or_else(|| self.hashes.first().copied())
    }

    /// Finds the request's home among `candidates`, when home affinity applies.
    fn locate_home(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize]) -> PrefixHome {
        let wanted = self
            .parameters
            .home_affinity
            .unwrap_or(ctx.pool.replicas > 1.0);
        let applies = wanted && ctx.pool.live_load && self.home_share > 0.0;
        match self.home_key().filter(|_| applies) {
            Some(key) => {
                let prompt_tokens = (self.hashes.len() * self.parameters.block_tokens()) as f64;
                let rule = SpillRule {
                    load_factor: self.parameters.home_load_factor,
                    shared_tokens: self.home_share * prompt_tokens,
                };
                self.members.home(ctx.pool, key, candidates, rule)
            }
            None => PrefixHome::default(),
        }
    }

    /// `candidate`'s place in the prefix's order as a score: the share the home is expected to
    /// hold, times `homeRankDecay` per place after the home. Not discounted by the queue as a
    /// learned hit is: between scrapes a replica reads a pod's queue as its own placements
    /// times `pool.replicas`, so one placement would read the home as full; the spill rule
    /// moves it on instead. Not lowered where this replica learned the prefix went elsewhere:
    /// the other replicas did not learn that, and follow the order.
    fn home_score(&self, candidate: usize) -> f64 {
        self.home.rank_of(candidate).map_or(0.0, |rank| {
            let decay = self
                .parameters
                .home_rank_decay
                .powi(i32::try_from(rank).unwrap_or(i32::MAX));
            self.home_share * decay
        })
    }

    pub fn parameters(&self) -> &Parameters {
        &self.parameters
    }

    pub fn index(&self) -> &PrefixIndex {
        &self.index
    }
}

/// Chained hashes of the full blocks of `prompt`, at most `max_blocks` of them.
pub fn block_hashes(
    model: &str,
    prompt: &str,
    block_chars: usize,
    max_blocks: usize,
    out: &mut Vec<u64>,
) {
    out.clear();
    let mut previous = hash_bytes(0, model.as_bytes());
    let bytes = prompt.as_bytes();
    // Blocks are cut on byte offsets at char boundaries near block_chars ASCII characters, so
    // multi-byte text still hashes deterministically.
    let mut start = 0;
    while out.len() < max_blocks {
        let Some(end) = block_end(prompt, start, block_chars) else {
            break;
        };
        let Some(block) = bytes.get(start..end) else {
            break;
        };
        previous = hash_bytes(previous, block);
        out.push(previous);
        start = end;
    }
}

/// End of the full block starting at `start`, or `None` if fewer than `block_chars` remain.
fn block_end(text: &str, start: usize, block_chars: usize) -> Option<usize> {
    // Most prompts are ASCII: a block of that many ASCII bytes is that many characters.
    let ascii_end = start.checked_add(block_chars)?;
    if text
        .as_bytes()
        .get(start..ascii_end)
        .is_some_and(<[u8]>::is_ascii)
    {
        return Some(ascii_end);
    }
    let rest = text.get(start..)?;
    match rest.char_indices().nth(block_chars) {
        Some((offset, _)) => Some(start + offset),
        None if rest.chars().count() == block_chars => Some(text.len()),
        None => None,
    }
}

impl Scorer for PrefixCacheScorer {
    /// Hashes the prompt once and matches it against every endpoint, so filters, deciders
    /// and the cost model see the same matches through the cycle state.
    fn prepare(&mut self, request: &InferenceRequest, pool: &Pool, cycle: &mut CycleState) {
        self.home = PrefixHome::default();
        block_hashes(
            &request.model,
            &request.prompt,
            self.parameters.block_chars(),
            self.parameters.max_prefix_blocks_to_match,
            &mut self.hashes,
        );
        let mut matches = if self.publishes {
            cycle.prefix.take().unwrap_or_default()
        } else {
            std::mem::take(&mut self.own_matches)
        };
        matches.matched_blocks.clear();
        matches.matched_blocks.resize(pool.len(), 0);
        matches.total_blocks = self.hashes.len();
        matches.block_tokens = self.parameters.block_tokens();
        if !self.hashes.is_empty() {
            self.all_endpoints.clear();
            self.all_endpoints.extend(0..pool.len());
            self.index.match_lengths(
                &self.hashes,
                &self.all_endpoints,
                &mut matches.matched_blocks,
            );
        }
        let best_match = matches.matched_blocks.iter().copied().max().unwrap_or(0);
        (self.key_blocks, self.home_share) =
            self.home_basis(request, best_match).unwrap_or((0, 0.0));
        if self.publishes {
            cycle.prefix = Some(matches);
        } else {
            self.own_matches = matches;
        }
    }

    fn score(&mut self, ctx: &SchedulingContext<'_>, candidates: &[usize], scores: &mut [f64]) {
        self.home = self.locate_home(ctx, candidates);
        // Replicas that share their placements (`pool.peers`) all know where the prefix went:
        // its home only places it first, and the learned hits lead from then on.
        let placed = self
            .matches(ctx)
            .is_some_and(|m| m.matched_blocks.iter().any(|&b| b > 0));
        if self.home.home().is_some() && !(ctx.pool.peers_share_load && placed) {
            // What this replica alone placed elsewhere (a spill, a pick before the home was
            // known) is unknown to the other replicas: a learned hit there would pull this
            // replica's requests away from where they all send them. What it learned raised
            // the share the home is expected to hold instead (see `home_basis`).
            for (score, &candidate) in scores.iter_mut().zip(candidates) {
                *score = self.home_score(candidate);
            }
            return;
        }
        // `pool.loadSignals: scraped` is GIE's picker exactly: a load-blind prefix score.
        let shortest = if ctx.pool.live_load {
            candidates
                .iter()
                .filter_map(|&i| ctx.pool.waiting(i))
                .fold(f64::INFINITY, f64::min)
                + peer_view_slack(ctx.pool)
        } else {
            f64::INFINITY
        };
        let order_key = self.order_key(ctx.pool);
        for (score, &candidate) in scores.iter_mut().zip(candidates) {
            let weight = self
                .parameters
                .affinity_weight(ctx.pool.waiting(candidate), shortest);
            let matches = self.matches(ctx);
            let cache = self.parameters.cache_score(
                matches.map_or(0.0, |m| m.hit_ratio(candidate)),
                matches.map_or(0, |m| m.cached_tokens(candidate)),
            );
            *score = cache * weight;
            if let Some(key) = order_key {
                *score *=
                    1.0 - ORDER_TIE_BREAK * (1.0 - self.members.order_fraction(key, candidate));
            }
        }
    }

    fn on_picked(&mut self, ctx: &SchedulingContext<'_>, endpoint: usize) {
        if self.parameters.auto_tune {
            if let Some(cache) = ctx.pool.get(endpoint).and_then(|e| e.metrics.cache_config) {
                let tokens = cache
                    .num_gpu_blocks
                    .saturating_mul(u64::from(cache.block_size));
                let blocks = tokens / self.parameters.block_tokens().max(1) as u64;
                // The pod says how big its cache is; the index never grows past the bound.
                let blocks = blocks.min(limits::LRU_CAPACITY_PER_SERVER.max);
                let blocks = usize::try_from(blocks).unwrap_or(usize::MAX);
                if blocks > 0 && blocks != self.index.capacity(endpoint) {
                    self.index.set_capacity(endpoint, blocks);
                }
            }
        }
        if Some(endpoint) == self.home.first {
            self.home_picks += 1;
        } else if Some(endpoint) == self.home.home() {
            self.home_spills += 1;
        }
        self.index.insert(endpoint, &self.hashes);
        if !self.hashes.is_empty() && self.learned.len() < MAX_UNSHARED {
            self.learned.push(LearnedPrefix {
                endpoint,
                hashes: self.hashes.clone(),
            });
        }
    }

    fn take_learned(&mut self, out: &mut Vec<LearnedPrefix>) {
        out.append(&mut self.learned);
    }

    fn learn_remote(&mut self, learned: &LearnedPrefix) {
        self.index.insert(learned.endpoint, &learned.hashes);
    }

    fn prompt_chars_needed(&self) -> usize {
        // One block past the last one hashed, so the last full block is seen whole.
        let blocks = self.parameters.max_prefix_blocks_to_match.saturating_add(1);
        blocks.saturating_mul(self.parameters.block_chars())
    }

    fn last_prompt_blocks(&self) -> Option<&[u64]> {
        (!self.hashes.is_empty()).then_some(self.hashes.as_slice())
    }

    fn counters(&self, out: &mut dyn FnMut(&'static str, u64)) {
        out("home_picks", self.home_picks);
        out("home_spills", self.home_spills);
        // Never falls, as a counter must not: the index's memory is this many entries.
        out("index_entries_peak", self.index.peak_entries() as u64);
    }

    fn learn_served(&mut self, learned: &LearnedPrefix) {
        self.index.insert(learned.endpoint, &learned.hashes);
        if self.learned.len() < MAX_UNSHARED {
            self.learned.push(learned.clone());
        }
    }
}

#[cfg(test)]
mod tests;
