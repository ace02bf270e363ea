//! The pure core of inference-picker, the Gateway API Inference Extension endpoint picker that
//! runs inside Envoy: it takes plain data and returns decisions, and reaches the proxy only
//! through the traits in [`host`]. [`vm::WorkerVm`] is a whole worker VM; the proxy-wasm edge
//! (the `inference-picker` crate) forwards every callback to it and carries out what it asks.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod config;
pub mod datalayer;
pub mod director;
pub mod discovery;
pub mod duration;
pub mod endpoint;
pub mod error_response;
pub mod flow_control;
pub mod hash;
pub mod host;
pub mod label_selector;
pub mod latency;
pub mod learned;
pub mod limits;
pub mod metrics;
pub mod pace;
pub mod peers;
pub mod placement_batches;
pub mod prometheus;
pub mod protocol;
pub mod request;
pub mod request_driver;
pub mod router;
pub mod scheduling;
pub mod shared_keys;
pub mod shared_state;
pub mod stats;
pub mod tick_driver;
pub mod vm;

/// The `#[test]` every unit-test module imports (`use crate::harness::test;`): libtest's natively
/// and on wasm32-wasip1, wasm-bindgen-test's on wasm32-unknown-unknown, where `make wasm-unit`
/// runs the same tests in Node's V8.
#[cfg(test)]
mod harness {
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    pub use core::prelude::v1::test;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    pub use wasm_bindgen_test::wasm_bindgen_test as test;
}
