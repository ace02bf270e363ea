//! P/D deciders: whether a request is worth a separate prefill pod.

pub mod always_disagg_pd_decider;
pub mod prefix_based_pd_decider;

use super::spec::{no_parameters, parameters};
