//! Any text as the filter's configuration: a loaded config or an error, never a panic.
#![no_main]

use inference_picker_core::config::load;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = load(text, 1);
    }
});
