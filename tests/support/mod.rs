//! Test kit shared by the integration tests, the soak (`examples/soak.rs`) and the benchmark
//! (`bench/`), split by concern:
//!
//! - [`http1`]: HTTP/1.1 framing, written once (the simulator includes it too);
//! - [`http`]: one request per connection, and what tests read from a response;
//! - [`processes`]: simulated pods and Envoy started per test and stopped by pid, ports,
//!   temporary directories;
//! - [`edge`]: which of the picker's edges (wasm filter, dynamic module) Envoy runs;
//! - [`envoy_config`]: Envoy configs through typed accessors, picker configs with the test's
//!   pods;
//! - [`load`]: request bodies and a timed keep-alive client;
//! - [`wait`]: waiting for a condition, with a deadline.
//!
//! Everything is re-exported here, so users write `support::Sim`, `support::request`, ...
#![allow(dead_code, unused_imports)]

pub mod edge;
pub mod envoy_config;
pub mod http;
pub mod http1;
pub mod load;
pub mod processes;
pub mod wait;

pub use edge::{module_dir, sample, to_module_edge, Edge};
pub use envoy_config::{
    cluster_members, example_config, is_pool_cluster, lb_endpoint, picker_config_of,
    shipped_envoy_config, shipped_picker_config, static_cluster, with_addresses, with_endpoints,
    with_pool_endpoints, with_pool_keys, EnvoyConfig, Listener,
};
pub use http::{request, try_request, Response};
pub use load::{completion, BackgroundLoad, Exchange, KeepAlive, Served, MODEL};
pub use processes::{
    envoy_binary, example_envoy, free_port, repo, retry_bind, sim_binary, stop, wait_ready,
    wasm_path, Envoy, Sim, SimPool, TempDir,
};
pub use wait::eventually;
