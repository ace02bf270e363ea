//! Compiled only with the `fault-injection` feature (`make fault-module`), for the test that a
//! panic costs one request: a request that carries `x-inference-picker-fault: panic` panics
//! inside the picker, as a bug would. The shipped artefact is built without this module.

use crate::abi::EnvoyPtr;
use crate::stream::NativeStream;
use inference_picker_core::host::HttpHost;

const FAULT_HEADER: &str = "x-inference-picker-fault";

/// Panics when the request asks for it; otherwise does nothing.
pub fn panic_if_asked(envoy: EnvoyPtr) {
    let asked = NativeStream::Direct(envoy)
        .request_header(FAULT_HEADER)
        .is_some_and(|value| value == b"panic");
    if asked {
        #[allow(clippy::panic)]
        {
            panic!("fault injection: a panic inside the picker, as asked");
        }
    }
}
