//! Admission plugins: whether a request is scheduled at all.

pub mod latency_slo_admitter;
