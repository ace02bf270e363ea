//! Scorers: score each candidate in [0, 1]; a profile weighs and sums them.

pub mod active_request_scorer;
pub mod context_length_aware;
pub mod kv_cache_utilization_scorer;
pub mod latency_scorer;
pub mod load_aware_scorer;
pub mod lora_affinity_scorer;
pub mod metric_scorer;
pub mod no_hit_lru_scorer;
pub mod prefix_cache_scorer;
pub mod queue_scorer;
pub mod request_cost_scorer;
pub mod running_requests_size_scorer;
pub mod session_affinity_scorer;
pub mod token_load_scorer;

use super::spec::{no_parameters, parameters};
