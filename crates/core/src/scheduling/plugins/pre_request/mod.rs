//! Pre-request plugins: accepted for llm-d configs; their behaviour is built into the filter.

pub mod disagg_headers_handler;

use super::spec::parameters;
