//! inference-picker: the Gateway API Inference Extension endpoint picker, as a proxy-wasm filter.
//!
//! Everything except [`filter`] is a pure core: it takes plain data, returns plain data and is
//! tested natively. [`filter`] is the only module that talks to the proxy-wasm host.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

pub mod config;
pub mod director;
pub mod discovery;
pub mod duration;
pub mod endpoint;
pub mod error_response;
pub mod flow_control;
pub mod hash;
pub mod host;
pub mod label_selector;
pub mod limits;
pub mod metrics;
pub mod picker;
pub mod prometheus;
pub mod protocol;
pub mod request;
pub mod request_flow;
pub mod scheduling;
pub mod shared_state;
pub mod stats;
pub mod tick_flow;
pub mod vm;

// The proxy-wasm host side, built for the filter's target only (wasm32-unknown-unknown is where the
// unit tests run under wasm-bindgen-test, see [`harness`]).
#[cfg(all(target_arch = "wasm32", target_os = "wasi", feature = "filter"))]
pub mod filter;

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
