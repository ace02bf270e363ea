//! Any bytes as a request body, for every API, and as a model rewrite: errors, never panics.
#![no_main]

use inference_picker_core::request::{parse_body, rewrite_model, ApiKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    for kind in [
        ApiKind::Completions,
        ApiKind::ChatCompletions,
        ApiKind::Embeddings,
        ApiKind::Responses,
        ApiKind::Messages,
    ] {
        if parse_body(kind, body).is_ok() {
            let _ = rewrite_model(body, "rewritten");
        }
    }
});
