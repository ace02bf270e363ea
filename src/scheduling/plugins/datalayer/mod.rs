//! Data layer: where metrics come from and which series are extracted.

pub mod metrics_data_source;
pub mod models_data_source;
pub mod prometheus_metric;

use super::spec::parameters;
