//! The host contract: everything the pure core needs from the proxy, as small traits. The
//! proxy-wasm edge (`filter/`) implements them with host calls; [`fake`] implements them in
//! memory for native tests. A failed host call is a [`HostError`], never a panic.

/// A host call that did not succeed; the status is the raw proxy-wasm status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: u32,
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed with status {}", self.call, self.status)
    }
}

/// One HTTP request's headers and body, as the request flow reads and writes them.
pub trait HttpHost {
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    fn remove_request_header(&self, name: &str) -> Result<(), HostError>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
    /// Replaces the first `size` bytes of the buffered body (all of it) with `body`.
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError>;
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    fn send_local_reply(&self, status: u16, json_body: &[u8]) -> Result<(), HostError>;
}

/// The process-wide shared data every worker VM sees: values with a compare-and-swap token.
pub trait SharedData {
    /// The value and its CAS token, or `None` when the key was never set.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError>;
    /// Stores `value` if the key's CAS still equals `cas` (`None`: unconditionally). Returns
    /// false when another VM wrote in between.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError>;
}

/// Outgoing HTTP calls (scrapes, discovery) and the answer being delivered.
pub trait HttpCallouts {
    /// Sends a request to an Envoy cluster; the token names it in the response callback.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError>;
    /// The `:status` of the response being delivered (valid inside its callback only).
    fn response_status(&self) -> Option<Vec<u8>>;
    /// The first `size` bytes of the response body being delivered.
    fn response_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
}

/// The host's wall clock.
pub trait Clock {
    fn now_ms(&self) -> Result<u64, HostError>;
}

/// In-memory hosts for native tests.
#[cfg(test)]
pub mod fake;
