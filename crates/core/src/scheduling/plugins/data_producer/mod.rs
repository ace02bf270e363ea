//! llm-d-router's request data producers whose data the filter computes on its own: accepted
//! so their configs load, their parameters checked, a warning naming what does the job here.

pub mod approx_prefix_cache_producer;
pub mod inflight_load_producer;
pub mod predicted_latency_producer;
pub mod token_producer;

use super::spec::parameters;
