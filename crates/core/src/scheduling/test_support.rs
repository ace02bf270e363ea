//! Pools and cycle states for the scheduling unit tests.

use super::cycle::{CycleState, PrefixMatches};
use crate::endpoint::{EndpointState, Health, Pool};
use crate::metrics::EndpointMetrics;
use std::collections::BTreeMap;

/// A pool of fresh endpoints `10.0.0.{i}:8000` with the given metrics.
pub fn pool_with(metrics: Vec<EndpointMetrics>) -> Pool {
    Pool::new(
        metrics
            .into_iter()
            .enumerate()
            .map(|(i, metrics)| {
                let mut endpoint = EndpointState::new(format!("10.0.0.{i}:8000"), BTreeMap::new());
                endpoint.metrics = metrics;
                endpoint.health = Health::Fresh;
                endpoint
            })
            .collect(),
    )
}

/// A cycle in which endpoint i holds `matched[i]` of `total` prompt blocks.
pub fn prefix_cycle(matched: Vec<usize>, total: usize, block_tokens: usize) -> CycleState {
    CycleState {
        prefix: Some(PrefixMatches {
            matched_blocks: matched,
            total_blocks: total,
            block_tokens,
        }),
        latency: None,
    }
}

pub fn queues(values: &[f64]) -> Pool {
    pool_with(
        values
            .iter()
            .map(|&q| EndpointMetrics {
                waiting_queue: Some(q),
                ..EndpointMetrics::idle()
            })
            .collect(),
    )
}
