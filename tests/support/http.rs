//! HTTP for the tests: one request per connection on top of the kit in `http1.rs`, and what
//! the tests read from a response (the serving pod, a JSON body).

pub use super::http1::Response;
use serde_json::Value;
use std::time::Duration;

/// How long a test waits for a response before failing.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Response {
    /// The pod that served it (the simulator's `x-inference-pod`), `-` if none.
    pub fn pod(&self) -> String {
        self.header("x-inference-pod").unwrap_or("-").to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!(
                "not JSON ({}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// [`try_request`], panicking on a transport error.
pub fn request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    try_request(address, method, path, headers, body)
        .unwrap_or_else(|error| panic!("{method} {address}{path}: {error}"))
}

/// One HTTP/1.1 exchange on a fresh connection (`connection: close`), body de-chunked.
pub fn try_request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    super::http1::exchange(address, method, path, headers, body, READ_TIMEOUT)
}
