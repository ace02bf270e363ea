//! Saturation detectors: whether an endpoint (and so the pool) can take more work.

pub mod concurrency_detector;
pub mod utilization_detector;

use super::spec::parameters;
