//! The built filter exports the callbacks it handles and none of those `make build` drops:
//! Envoy calls into the VM only for what the module exports.

mod support;

use std::process::Command;
use support::{repo, wasm_path};

fn exports() -> Vec<String> {
    let tool = repo().join("target/tools/release/wasm-exports");
    let output = Command::new(&tool)
        .arg("list")
        .arg(wasm_path())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (run `make build`)", tool.display()));
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_filter_exports_only_the_callbacks_it_handles() {
    let exports = exports();
    let has = |name: &str| exports.iter().any(|e| e == name);
    for needed in [
        "proxy_abi_version_0_2_1",
        "proxy_on_memory_allocate",
        "proxy_on_vm_start",
        "proxy_on_configure",
        "proxy_on_tick",
        "proxy_on_http_call_response",
        "proxy_on_context_create",
        "proxy_on_request_headers",
        "proxy_on_request_body",
        "proxy_on_request_trailers",
        "proxy_on_response_headers",
        "proxy_on_log",
        "proxy_on_delete",
    ] {
        assert!(has(needed), "{needed} missing from {exports:?}");
    }
    for dropped in [
        "proxy_on_response_body",
        "proxy_on_response_trailers",
        "proxy_on_done",
    ] {
        assert!(!has(dropped), "{dropped} still exported");
    }
}
