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
pub mod hash;
pub mod host;
pub mod label_selector;
pub mod metrics;
pub mod prometheus;
pub mod protocol;
pub mod request;
pub mod request_flow;
pub mod scheduling;
pub mod shared_state;
pub mod stats;
pub mod tick_flow;

#[cfg(target_arch = "wasm32")]
pub mod filter;
