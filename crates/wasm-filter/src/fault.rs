//! Compiled only with the `fault-injection` feature, for the fail-open test: a request that
//! carries `x-inference-picker-fault: trap` aborts the VM (a wasm trap), as a bug would, so
//! that Envoy's `failure_policy` decides what later requests see. The shipped artefact is
//! built without this module.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MapType;

const FAULT_HEADER: &str = "x-inference-picker-fault";

/// Traps when the request asks for it; otherwise does nothing.
pub fn trap_if_asked() {
    let asked = hostcalls::get_map_value(MapType::HttpRequestHeaders, FAULT_HEADER)
        .ok()
        .flatten()
        .is_some_and(|value| value == "trap");
    if asked {
        log::error!("inference-picker: fault injection: aborting the VM as asked");
        core::arch::wasm32::unreachable();
    }
}
