//! Any text as a `/metrics` body, for every engine and with custom selectors.
#![no_main]

use inference_picker_core::metrics::{extract, Engine, MetricSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let selectors = [MetricSelector {
        metric_name: "vllm:num_requests_running".into(),
        labels: vec![("model_name".into(), "m".into())],
    }];
    for engine in [Engine::Vllm, Engine::Sglang, Engine::TrtllmServe] {
        let _ = extract(engine, &text, &selectors);
    }
});
