//! Unit tests of `prefix-cache-scorer`: block hashing, scores and what picks teach it, its
//! parameters, and the prefix homes.

use super::*;
use crate::harness::test;
use crate::metrics::{CacheConfig, EndpointMetrics};
use crate::scheduling::test_support::{pool_with, queues};

fn request(prompt: &str) -> InferenceRequest {
    InferenceRequest {
        model: "m".into(),
        prompt: prompt.into(),
        ..InferenceRequest::default()
    }
}

#[test]
fn blocks_end_after_block_chars_characters_in_any_script() {
    let texts = [
        "abcdefghij",
        "ab€cd€efgh",
        "€€€€€€",
        "abcd€",
        "日本語のテキストです",
    ];
    for text in texts {
        for chars in 1..6 {
            let mut start = 0;
            while let Some(end) = block_end(text, start, chars) {
                assert_eq!(text[start..end].chars().count(), chars, "{text:?} {chars}");
                start = end;
            }
            assert!(text[start..].chars().count() < chars, "{text:?} {chars}");
        }
    }
}

#[test]
fn blocks_chain_and_ignore_the_partial_tail() {
    let mut a = Vec::new();
    let mut b = Vec::new();
    block_hashes("m", "aaaabbbbcc", 4, 256, &mut a);
    block_hashes("m", "aaaabbbbdd", 4, 256, &mut b);
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
    block_hashes("m", "xaaabbbb", 4, 256, &mut b);
    assert_ne!(
        a[1], b[1],
        "a different first block changes every later hash"
    );
    block_hashes("other", "aaaabbbb", 4, 256, &mut b);
    assert_ne!(a[0], b[0], "the model seeds the chain");
    block_hashes("m", "aaaabbbbcccc", 4, 2, &mut b);
    assert_eq!(b.len(), 2, "capped at maxPrefixBlocksToMatch");
    block_hashes("m", "ééééüüüü", 4, 256, &mut b);
    assert_eq!(b.len(), 2, "blocks count characters, not bytes");
}

#[test]
fn score_is_matched_share_and_learns_from_picks() {
    let pool = pool_with(vec![EndpointMetrics::default(), EndpointMetrics::default()]);
    let mut scorer = PrefixCacheScorer::new(Parameters {
        block_size_tokens: 1,
        home_affinity: Some(false),
        ..Parameters::default()
    })
    .unwrap();
    let mut scores = [0.0; 2];
    let mut cycle = CycleState::default();
    let first = request("aaaabbbbcccc");
    scorer.prepare(&first, &pool, &mut cycle);
    let ctx = SchedulingContext {
        request: &first,
        pool: &pool,
        cycle: &cycle,
    };
    scorer.score(&ctx, &[0, 1], &mut scores);
    assert_eq!(scores, [0.0, 0.0]);
    scorer.on_picked(&ctx, 1);
    let second = request("aaaabbbbdddd");
    scorer.prepare(&second, &pool, &mut cycle);
    let ctx = SchedulingContext {
        request: &second,
        pool: &pool,
        cycle: &cycle,
    };
    scorer.score(&ctx, &[0, 1], &mut scores);
    assert_eq!(scores, [0.0, 2.0 / 3.0]);
    assert_eq!(cycle.cached_tokens(1), 2, "two one-token blocks held");
}

#[test]
fn match_length_weight_blends_in_the_matched_length() {
    let parameters = |yaml: &str| -> Parameters {
        super::super::parameters(&serde_yaml::from_str(yaml).unwrap()).unwrap()
    };
    let ratio_only = Parameters::default();
    assert_eq!(ratio_only.cache_score(0.5, 4096), 0.5);
    let blended = parameters("{matchLengthWeight: 0.5, matchLengthScaleTokens: 8192}");
    // Half the scale matched: length score (1/2)^2; half the prompt: ratio 1/2.
    assert_eq!(blended.cache_score(0.5, 4096), 0.5 * 0.25 + 0.5 * 0.5);
    assert_eq!(
        blended.cache_score(0.1, 20_000),
        0.5 + 0.5 * 0.1,
        "capped at 1"
    );
    for bad in ["{matchLengthWeight: 1.5}", "{matchLengthScaleTokens: 0}"] {
        let value: Value = serde_yaml::from_str(bad).unwrap();
        assert!(build(&value).is_err(), "{bad}");
    }
    let named: Value =
        serde_yaml::from_str("{prefixMatchInfoProducerName: approx-prefix-cache-producer}")
            .unwrap();
    assert!(build(&named).is_ok());
}

#[test]
fn a_hit_counts_less_the_longer_its_queue_is_beyond_the_shortest() {
    let mut pool = queues(&[6.0, 2.0, 3.0]);
    let mut scorer = PrefixCacheScorer::new(Parameters {
        block_size_tokens: 1,
        home_affinity: Some(false),
        ..Parameters::default()
    })
    .unwrap();
    let held = request("aaaabbbbcccc");
    let mut cycle = CycleState::default();
    scorer.prepare(&held, &pool, &mut cycle);
    for endpoint in 0..3 {
        scorer.on_picked(&SchedulingContext::new(&held, &pool), endpoint);
    }
    let scores = |scorer: &mut PrefixCacheScorer, pool: &Pool, candidates: &[usize]| {
        let mut cycle = CycleState::default();
        scorer.prepare(&held, pool, &mut cycle);
        let ctx = SchedulingContext {
            request: &held,
            pool,
            cycle: &cycle,
        };
        let mut out = vec![0.0; candidates.len()];
        scorer.score(&ctx, candidates, &mut out);
        out
    };
    // Four (the default limit) beyond the shortest: nothing; one beyond: 1 - (1/4)^2.
    assert_eq!(scores(&mut scorer, &pool, &[0, 1, 2]), [0.0, 1.0, 0.9375]);
    assert_eq!(
        scores(&mut scorer, &pool, &[0, 2]),
        [0.4375, 1.0],
        "measured against the candidates only"
    );
    let mut shared = pool.clone();
    shared.set_peer_replicas(4);
    // Four replicas sharing their placements: each reads a queue up to 3 x 3/4 requests short.
    // (Within a millionth: shared placements break ties by the prefix's order.)
    let with_slack = scores(&mut scorer, &shared, &[0, 1, 2]);
    let expected = [1.0 - (1.75f64 / 4.0).powi(2), 1.0, 1.0];
    assert!(
        with_slack
            .iter()
            .zip(expected)
            .all(|(s, e)| (s - e).abs() < 1e-6 && *s <= e),
        "a queue within the peers' slack of the shortest keeps its hit: {with_slack:?}"
    );
    pool.endpoints[1].metrics.running_requests = Some(2.0);
    pool.endpoints[1].running_capacity = Some(2.0);
    pool.endpoints[1].in_flight = 2;
    assert_eq!(
        scores(&mut scorer, &pool, &[0, 1, 2]),
        [0.4375, 0.9375, 1.0],
        "requests placed since the scrape at a full pod count as queued"
    );
    let scraped = pool.clone().with_live_load(false);
    assert_eq!(
        scores(&mut scorer, &scraped, &[0, 1, 2]),
        [1.0, 1.0, 1.0],
        "scraped load signals keep GIE's load-blind score"
    );
    scorer.parameters.affinity_queue_limit = 0;
    assert_eq!(
        scores(&mut scorer, &pool, &[0, 1, 2]),
        [1.0, 1.0, 1.0],
        "so does a limit of 0"
    );
}

#[test]
fn legacy_hash_block_size_is_in_characters() {
    let parameters: Parameters = serde_yaml::from_str("hashBlockSize: 5").unwrap();
    assert_eq!(parameters.block_chars(), 5);
    let parameters: Parameters = serde_yaml::from_str("blockSize: 64").unwrap();
    assert_eq!(parameters.block_chars(), 256);
    assert_eq!(Parameters::default().block_chars(), 64);
}

#[test]
fn auto_tune_sizes_the_lru_from_cache_config() {
    let pool = pool_with(vec![EndpointMetrics {
        cache_config: Some(CacheConfig {
            block_size: 16,
            num_gpu_blocks: 100,
        }),
        ..EndpointMetrics::default()
    }]);
    let mut scorer = PrefixCacheScorer::new(Parameters::default()).unwrap();
    let req = request("hello");
    let mut cycle = CycleState::default();
    scorer.prepare(&req, &pool, &mut cycle);
    scorer.on_picked(&SchedulingContext::new(&req, &pool), 0);
    assert_eq!(scorer.index().capacity(0), 100);
}

#[test]
fn auto_tune_never_sizes_past_the_bound() {
    let pool = pool_with(vec![EndpointMetrics {
        cache_config: Some(CacheConfig {
            block_size: u32::MAX,
            num_gpu_blocks: u64::MAX,
        }),
        ..EndpointMetrics::default()
    }]);
    let mut scorer = PrefixCacheScorer::new(Parameters::default()).unwrap();
    let req = request("hello");
    scorer.prepare(&req, &pool, &mut CycleState::default());
    scorer.on_picked(&SchedulingContext::new(&req, &pool), 0);
    assert_eq!(scorer.index().capacity(0), 1 << 21);
}

#[test]
fn absurd_parameters_are_refused_with_the_limit() {
    for (yaml, expected) in [
        (
            "blockSizeTokens: 0",
            "blockSizeTokens: 0 tokens is below the minimum of 1",
        ),
        // x 4 characters overflows a 32-bit usize, the filter's.
        (
            "blockSizeTokens: 1073741824",
            "blockSizeTokens: 1073741824 tokens is above the maximum of 4096",
        ),
        ("hashBlockSize: 0", "hashBlockSize: 0 characters is below"),
        (
            "hashBlockSize: 100000",
            "hashBlockSize: 100000 characters is above",
        ),
        (
            "maxPrefixBlocksToMatch: 0",
            "maxPrefixBlocksToMatch: 0 blocks is below",
        ),
        (
            "maxPrefixBlocksToMatch: 1000000",
            "is above the maximum of 65536 blocks",
        ),
        (
            "lruCapacityPerServer: 0",
            "lruCapacityPerServer: 0 blocks is below",
        ),
        (
            "lruCapacityPerServer: 1000000000",
            "is above the maximum of 2097152 blocks",
        ),
    ] {
        let value: Value = serde_yaml::from_str(yaml).unwrap();
        let error = build(&value).err().unwrap();
        assert!(error.contains(expected), "{yaml}: {error}");
    }
    let value: Value = serde_yaml::from_str(
        "{blockSizeTokens: 4096, maxPrefixBlocksToMatch: 65536, lruCapacityPerServer: 2097152}",
    )
    .unwrap();
    assert!(build(&value).is_ok(), "the bounds themselves are fine");
}

#[test]
fn picks_are_shared_and_replayed() {
    let pool = pool_with(vec![EndpointMetrics::default(), EndpointMetrics::default()]);
    let parameters = Parameters {
        block_size_tokens: 1,
        auto_tune: false,
        ..Parameters::default()
    };
    let mut here = PrefixCacheScorer::new(parameters.clone()).unwrap();
    let mut there = PrefixCacheScorer::new(parameters).unwrap();
    let req = request("aaaabbbbcccc");
    let mut cycle = CycleState::default();
    here.prepare(&req, &pool, &mut cycle);
    here.on_picked(&SchedulingContext::new(&req, &pool), 1);
    let mut learned = Vec::new();
    here.take_learned(&mut learned);
    assert_eq!(learned.len(), 1);
    here.take_learned(&mut learned);
    assert_eq!(learned.len(), 1, "taken once");
    there.learn_remote(&learned[0]);
    there.prepare(&req, &pool, &mut cycle);
    assert_eq!(cycle.hit_ratio(1), 1.0);
    assert_eq!(cycle.hit_ratio(0), 0.0);
}

#[test]
fn the_kept_prompt_text_hashes_as_the_whole_prompt() {
    let scorer = PrefixCacheScorer::new(
        serde_yaml::from_str("{blockSizeTokens: 2, maxPrefixBlocksToMatch: 5}").unwrap(),
    )
    .unwrap();
    let needed = scorer.prompt_chars_needed();
    let prompt = "àbcdefghijklmnopqrstuvwxyz0123456789".repeat(4);
    let kept: String = prompt.chars().take(needed).collect();
    assert!(kept.len() < prompt.len());
    let (mut whole, mut cut) = (Vec::new(), Vec::new());
    let (chars, blocks) = (scorer.parameters.block_chars(), 5);
    block_hashes("m", &prompt, chars, blocks, &mut whole);
    block_hashes("m", &kept, chars, blocks, &mut cut);
    assert_eq!(whole.len(), 5);
    assert_eq!(whole, cut);
}

/// Scores of `prompt` over every endpoint of `pool`, then the pick of the best one.
fn score_and_pick(scorer: &mut PrefixCacheScorer, pool: &Pool, prompt: &str) -> Vec<f64> {
    score_and_pick_request(scorer, pool, &request(prompt))
}

/// A prompt whose first `system` characters are its system prompt.
fn with_system(system: usize, prompt: &str) -> InferenceRequest {
    InferenceRequest {
        system_chars: Some(system),
        ..request(prompt)
    }
}

fn score_and_pick_request(
    scorer: &mut PrefixCacheScorer,
    pool: &Pool,
    req: &InferenceRequest,
) -> Vec<f64> {
    let mut cycle = CycleState::default();
    scorer.prepare(req, pool, &mut cycle);
    let ctx = SchedulingContext {
        request: req,
        pool,
        cycle: &cycle,
    };
    let candidates: Vec<usize> = (0..pool.len()).collect();
    let mut scores = vec![0.0; pool.len()];
    scorer.score(&ctx, &candidates, &mut scores);
    let best = (0..scores.len())
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
        .unwrap();
    scorer.on_picked(&ctx, best);
    scores
}

/// Pods with these queues behind three Envoy replicas.
fn fleet(waiting: &[f64]) -> Pool {
    queues(waiting).with_replicas(3)
}

fn home_scorer() -> PrefixCacheScorer {
    PrefixCacheScorer::new(Parameters {
        block_size_tokens: 1,
        home_key_blocks: 2,
        ..Parameters::default()
    })
    .unwrap()
}

#[test]
fn an_unseen_prefix_scores_its_order_of_homes() {
    let pool = fleet(&[0.0; 6]);
    let mut scorer = home_scorer();
    // Two of three blocks are the system prompt: the home is expected to hold them.
    let scores = score_and_pick_request(&mut scorer, &pool, &with_system(8, "aaaabbbbcccc"));
    let share = 2.0 / 3.0;
    let mut sorted = scores.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let order = [share, share * 0.5, share * 0.25, share * 0.125, 0.0, 0.0];
    assert_eq!(sorted, order, "{scores:?}");
    assert_eq!(scorer.home_counts(), (1, 0));
    let home = scores.iter().position(|&s| s == share).unwrap();
    // A prompt of the same system prompt shares the home, learned or not.
    let mut fresh = home_scorer();
    let other = score_and_pick_request(&mut fresh, &pool, &with_system(8, "aaaabbbbdddd"));
    assert_eq!(other[home], share);
}

#[test]
fn a_prompt_nothing_says_is_shared_has_no_home_until_seen_again() {
    let pool = fleet(&[0.0; 6]);
    let mut scorer = home_scorer();
    let first = score_and_pick(&mut scorer, &pool, "aaaabbbbcccc");
    assert_eq!(first, [0.0; 6], "one user message, never seen: no home");
    assert_eq!(scorer.home_counts(), (0, 0));
    // Placed once, its key blocks are known: the next request that starts the same way
    // has a home, the same one every replica that has seen it computes.
    let again = score_and_pick(&mut scorer, &pool, "aaaabbbbdddd");
    let mut other = home_scorer();
    score_and_pick(&mut other, &pool, "aaaabbbbeeee");
    let there = score_and_pick(&mut other, &pool, "aaaabbbbdddd");
    let home = |scores: &[f64]| scores.iter().position(|&s| s == 2.0 / 3.0);
    assert!(home(&again).is_some(), "{again:?}");
    assert_eq!(home(&again), home(&there));
}

#[test]
fn a_short_queue_keeps_the_home_and_only_the_load_bound_moves_it() {
    let prompt = with_system(8, "aaaabbbb");
    let calm = score_and_pick_request(&mut home_scorer(), &fleet(&[0.0; 4]), &prompt);
    let home = calm.iter().position(|&s| s == 1.0).unwrap();
    let mut waiting = [0.0; 4];
    waiting[home] = 2.0;
    // Two waiting, against a bound of 2 x the mean (0.5) + 1: still the home.
    let busy = score_and_pick_request(&mut home_scorer(), &fleet(&waiting), &prompt);
    assert_eq!(busy[home], 1.0, "{busy:?}");
}

#[test]
fn a_continuing_conversation_is_named_by_its_opening() {
    let pool = fleet(&[0.0; 8]);
    let turn = |user: &str, reply: &str| {
        let prompt = format!("sys: aaaa\nuser: {user}\nassistant: {reply}\nuser: more");
        InferenceRequest {
            opening_chars: prompt.find("assistant"),
            ..request(&prompt)
        }
    };
    // Two conversations of one system prompt: their later turns each follow their own
    // opening, whatever the reply and the rest.
    let homes: Vec<usize> = [
        ("bbbb", "r1"),
        ("bbbb", "r2"),
        ("cccc", "r1"),
        ("cccc", "r3"),
    ]
    .iter()
    .map(|(user, reply)| {
        let mut scorer = home_scorer();
        let req = turn(user, reply);
        let mut cycle = CycleState::default();
        scorer.prepare(&req, &pool, &mut cycle);
        let ctx = SchedulingContext {
            request: &req,
            pool: &pool,
            cycle: &cycle,
        };
        let mut scores = vec![0.0; 8];
        scorer.score(&ctx, &(0..8).collect::<Vec<_>>(), &mut scores);
        // 21 characters before the assistant turn: the block holding the 21st (whose
        // rest is the same in every later turn) ends the key.
        assert_eq!(scorer.key_blocks, 6);
        scores.iter().position(|&s| s == 1.0).unwrap()
    })
    .collect();
    assert_eq!(homes[0], homes[1]);
    assert_eq!(homes[2], homes[3]);
}

#[test]
fn two_replicas_that_never_talk_send_a_prefix_to_the_same_pod() {
    let pool = fleet(&[0.0; 8]);
    let mut here = home_scorer();
    let mut there = home_scorer();
    for group in 0..50 {
        let prompt = with_system(8, &format!("{group:04}{group:04}{}", "x".repeat(group)));
        let a = score_and_pick_request(&mut here, &pool, &prompt);
        let b = score_and_pick_request(&mut there, &pool, &prompt);
        assert!(a.iter().any(|&s| s > 0.0), "a home");
        assert_eq!(a, b, "{:?}", prompt.prompt);
    }
}

#[test]
fn a_hit_learned_elsewhere_raises_the_homes_share_and_does_not_pull_away_from_it() {
    let pool = fleet(&[0.0; 6]);
    let mut first = home_scorer();
    let scores = score_and_pick_request(&mut first, &pool, &with_system(8, "aaaabbbbcccc"));
    let home = scores.iter().position(|&s| s == 2.0 / 3.0).unwrap();
    let elsewhere = (0..6).find(|&c| scores[c] == 0.0).unwrap();
    let mut scorer = home_scorer();
    scorer.index.insert(elsewhere, &first.hashes);
    let longer = score_and_pick_request(&mut scorer, &pool, &with_system(8, "aaaabbbbccccdddd"));
    assert_eq!(
        longer[home], 0.75,
        "the home is expected to hold as much as was learned: {longer:?}"
    );
    assert_eq!(
        longer[elsewhere], 0.0,
        "the other replicas do not know of the copy elsewhere: {longer:?}"
    );
}

#[test]
fn a_loaded_home_spills_to_the_second_home_and_counts_it() {
    let mut scorer = home_scorer();
    let prompt = with_system(8, "aaaabbbb");
    let calm = score_and_pick_request(&mut scorer, &fleet(&[0.0; 4]), &prompt);
    let home = calm.iter().position(|&s| s == 1.0).unwrap();
    let second = calm.iter().position(|&s| s == 0.5).unwrap();
    let mut waiting = [0.0; 4];
    waiting[home] = 8.0;
    let busy = score_and_pick_request(&mut scorer, &fleet(&waiting), &prompt);
    assert_eq!(busy[second], 1.0, "{busy:?}");
    assert_eq!(scorer.home_counts(), (1, 1));
}

#[test]
fn one_envoy_scraped_load_signals_or_the_switch_turn_homes_off() {
    let prompt = with_system(8, "aaaabbbb");
    let alone = score_and_pick_request(&mut home_scorer(), &queues(&[0.0; 4]), &prompt);
    assert_eq!(alone, [0.0; 4], "one Envoy places new prefixes by load");
    let mut on = home_scorer();
    on.parameters.home_affinity = Some(true);
    let asked = score_and_pick_request(&mut on, &queues(&[0.0; 4]), &prompt);
    assert!(
        asked.contains(&1.0),
        "asked for, one Envoy uses homes too: {asked:?}"
    );
    let scraped = fleet(&[0.0; 4]).with_live_load(false);
    let scores = score_and_pick_request(&mut home_scorer(), &scraped, &prompt);
    assert_eq!(scores, [0.0; 4]);
    let mut off = home_scorer();
    off.parameters.home_affinity = Some(false);
    assert_eq!(
        score_and_pick_request(&mut off, &fleet(&[0.0; 4]), &prompt),
        [0.0; 4]
    );
    for bad in [
        "{homeKeyBlocks: 0}",
        "{homeLoadFactor: 0.5}",
        "{homeRankDecay: 2}",
    ] {
        let value: Value = serde_yaml::from_str(bad).unwrap();
        assert!(build(&value).is_err(), "{bad}");
    }
}

#[test]
fn replicas_that_raced_a_prefix_onto_two_pods_send_what_follows_to_the_same_one() {
    // Two replicas that share placements, their members listed in opposite orders.
    let mut listed = queues(&[0.0; 6]);
    let mut reversed = Pool::new(listed.endpoints.iter().rev().cloned().collect());
    listed.set_peer_replicas(2);
    reversed.set_peer_replicas(2);
    let index_in = |pool: &Pool, address: &str| {
        (0..pool.len())
            .find(|&i| pool.get(i).unwrap().address == address)
            .unwrap()
    };
    let raced = ["10.0.0.1:8000", "10.0.0.4:8000"];
    let mut winners = std::collections::BTreeSet::new();
    for group in 0..16 {
        let system = format!("{group:04}{group:04}");
        let mut picks = Vec::new();
        for pool in [&listed, &reversed] {
            let mut scorer = home_scorer();
            // The group's first two chats raced onto two pods; both replicas learned both.
            for (question, address) in ["aaaa", "bbbb"].iter().zip(raced) {
                let mut hashes = Vec::new();
                block_hashes("m", &format!("{system}{question}"), 4, 64, &mut hashes);
                scorer.learn_remote(&LearnedPrefix {
                    endpoint: index_in(pool, address),
                    hashes,
                });
            }
            let scores = score_and_pick_request(
                &mut scorer,
                pool,
                &with_system(8, &format!("{system}cccc")),
            );
            let best = (0..scores.len())
                .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
                .unwrap();
            picks.push(pool.get(best).unwrap().address.clone());
        }
        assert_eq!(picks[0], picks[1], "group {group}");
        assert!(raced.contains(&picks[0].as_str()), "{picks:?}");
        winners.insert(picks[0].clone());
    }
    assert_eq!(
        winners.len(),
        2,
        "the order depends on the prefix: {winners:?}"
    );
}
