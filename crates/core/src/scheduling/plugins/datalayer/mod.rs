//! Data layer: where metrics come from and which series are extracted.

pub mod core_metrics_extractor;
pub mod metrics_data_source;
pub mod models_data_extractor;
pub mod models_data_source;
pub mod prometheus_metric;

use super::spec::parameters;
