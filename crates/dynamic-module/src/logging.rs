//! The `log` crate's records go to Envoy's log (the `dynamic_modules` logger), at Envoy's level.

use crate::abi::{envoy, ModuleBuffer};
use crate::support::{count, failed};
use inference_picker_core::host::{level_filter, HostCall, HostLogger};

fn sink(level: u32, message: &str) {
    count(HostCall::Log);
    if let Some(envoy) = envoy() {
        // SAFETY: Envoy reads the message during the call only.
        unsafe { (envoy.log)(level, ModuleBuffer::of(message.as_bytes())) };
    }
}

static LOGGER: HostLogger = HostLogger { sink };

/// A line at Envoy's critical level, whatever `log`'s filter says.
pub fn critical(message: &str) {
    sink(inference_picker_core::host::LOG_CRITICAL, message);
}

pub fn install() {
    let _ = log::set_logger(&LOGGER);
    sync_level();
}

/// Mirrors Envoy's level (an operator may change it at run time) into `log`'s filter; Envoy's
/// levels run trace (0) to critical (5) and off (6), as proxy-wasm's do.
pub fn sync_level() {
    count(HostCall::Log);
    let level = envoy().map(|envoy| {
        // SAFETY: no arguments; callable from any thread.
        unsafe { (envoy.get_log_level)() }
    });
    log::set_max_level(level_filter(level.ok_or(failed("get_log_level"))));
}
