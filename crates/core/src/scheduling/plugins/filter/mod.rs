//! Filters: drop candidates before scoring.

pub mod by_label;
pub mod decode_filter;
pub mod encode_filter;
pub mod header_based_testing_filter;
pub mod label_selector_filter;
pub mod prefill_filter;
pub mod prefix_cache_affinity_filter;
pub mod slo_headroom_tier_filter;

use super::spec::{no_parameters, parameters};
