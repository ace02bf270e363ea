//! The host contract: everything the pure core needs from the proxy, as small traits, shaped by
//! what the core asks (a stream is addressed by its id, a callout's answer arrives as a value).
//! The edges (`crates/wasm-filter`, `crates/dynamic-module`) implement them with their host's
//! calls; [`fake`] implements them in memory for native tests. A failed host call is a
//! [`HostError`], never a panic.

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
    /// Every request header in one call (see [`HeaderPairs`]); `None` if the host cannot say.
    fn request_headers(&self) -> Option<HeaderPairs>;
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    fn remove_request_header(&self, name: &str) -> Result<(), HostError>;
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError>;
    /// Replaces the first `size` bytes of the buffered body (all of it) with `body`.
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError>;
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError>;
    /// The `ip:port` the request's last upstream attempt went to (Envoy's `upstream.address`
    /// property), once the response is known; `None` when there was none or it is unreadable.
    fn upstream_address(&self) -> Option<String>;
    /// The raw value of the proxy's subset hint (filter metadata `envoy.lb_subset_hint`,
    /// key `x-gateway-destination-endpoint-subset`), `None` when the proxy set none.
    fn subset_hint(&self) -> Option<Vec<u8>>;
    /// The port the request arrived on (Envoy's `destination.port`): the peer path is served
    /// on the peer port only. `None` when unreadable.
    fn destination_port(&self) -> Option<u16>;
    /// Answers the request here with `status` and a binary `body` (a peer's state).
    fn send_answer(&self, status: u16, body: &[u8]) -> Result<(), HostError>;
    /// Answers the request with the error's status and JSON body in `shape` (plus llm-d's
    /// `x-llm-d-request-dropped-reason` on shed and no-endpoint answers).
    fn send_error(
        &self,
        error: &crate::error_response::RequestError,
        shape: crate::error_response::ErrorShape,
    ) -> Result<(), HostError>;
    /// The host's wall clock in milliseconds (0 if unreadable).
    fn now_ms(&self) -> u64;
    /// The process-wide shared data (flow control's Envoy-wide queue accounting).
    fn shared_data(&self) -> &dyn SharedData;
}

/// The process-wide shared data every worker VM sees: values with a compare-and-swap token.
pub trait SharedData {
    /// The value and its CAS token, or `None` when the key was never set.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError>;
    /// Stores `value` if the key's CAS still equals `cas` (`None`: unconditionally). Returns
    /// false when another VM wrote in between.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError>;
}

/// Shared data in this process's memory, with Envoy's semantics: a CAS token per key, bumped on
/// every write. What a host without Envoy's shared data (the native module, the tests) shares
/// between its pickers.
#[derive(Default)]
pub struct SharedMemory {
    data: std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, u32)>>,
}

impl SharedMemory {
    fn data(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (Vec<u8>, u32)>> {
        // A writer that panicked left whole values behind: the map is still usable.
        self.data
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SharedData for SharedMemory {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        Ok(self.data().get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        let mut data = self.data();
        let current = data.get(key).map_or(0, |(_, cas)| *cas);
        if cas.is_some_and(|cas| cas != current) {
            return Ok(false);
        }
        data.insert(key.into(), (value.to_vec(), current.wrapping_add(1)));
        Ok(true)
    }
}

/// Outgoing HTTP calls (scrapes, discovery); their answers come back as [`CalloutAnswer`]s.
pub trait HttpCallouts {
    /// Sends a request to an Envoy cluster; the token names it in the response callback.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError>;
}

/// A callout's answer as the edge read it, handed to the core as a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalloutAnswer {
    /// Its `:status`; `None` when the call timed out or was reset.
    pub status: Option<Vec<u8>>,
    /// The body's size, whether it was read or not.
    pub body_size: usize,
    /// The body of a 200 within the cap; empty when it was not read.
    pub body: Result<Vec<u8>, HostError>,
}

impl CalloutAnswer {
    /// Reads an answer with the edge's calls: its status, then its body only if the status is
    /// 200 (the core uses no other body) and the body is within `cap` bytes (the core's limit
    /// for that call), so an oversized page is never copied. `answered` false: no response
    /// arrived (a timeout or a reset), and nothing is read.
    pub fn read(
        answered: bool,
        body_size: usize,
        cap: usize,
        status: impl FnOnce() -> Option<Vec<u8>>,
        body: impl FnOnce(usize) -> Result<Vec<u8>, HostError>,
    ) -> CalloutAnswer {
        let status = if answered { status() } else { None };
        let body_size = if answered { body_size } else { 0 };
        let ok = status.as_deref() == Some(b"200".as_slice());
        let body = if ok && body_size <= cap {
            body(body_size)
        } else {
            Ok(Vec::new())
        };
        CalloutAnswer {
            status,
            body_size,
            body,
        }
    }
}

/// The memory of one address space (a wasm VM's linear memory, or the module's process)
/// already added to the shared `vm_memory_bytes` gauge. It belongs to the address space, not
/// to a configuration: when Envoy replaces a configuration, the new one's VM in the same
/// address space adds only what the memory grew since, so the gauge counts it once.
#[derive(Debug, Default)]
pub struct MemoryReported(std::sync::atomic::AtomicU64);

impl MemoryReported {
    pub const fn new() -> Self {
        MemoryReported(std::sync::atomic::AtomicU64::new(0))
    }

    /// Reports `bytes` through `add`, which adds a change to the gauge: the change not yet
    /// in it (a wasm VM's memory only grows; the module's heap also shrinks, when a
    /// configuration Envoy dropped is freed). Taken as reported only once `add` succeeds, so
    /// a failed host call is retried with the next report. Returns whether this was the
    /// address space's first report.
    pub fn report(&self, bytes: u64, add: impl FnOnce(i64) -> bool) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let previous = self.0.load(Relaxed);
        let change = i128::from(bytes) - i128::from(previous);
        let change = i64::try_from(change).unwrap_or(if change > 0 { i64::MAX } else { i64::MIN });
        if change == 0 || !add(change) {
            return false;
        }
        self.0.store(bytes, Relaxed);
        previous == 0
    }
}

/// The host's wall clock.
pub trait Clock {
    fn now_ms(&self) -> Result<u64, HostError>;
}

/// Envoy stat kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter = 0,
    Gauge = 1,
    Histogram = 2,
}

/// Envoy stats: defined once by name, then bumped or set by id.
pub trait Metrics {
    /// Defines (or finds) a stat; Envoy prefixes its name with `wasmcustom.`.
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError>;
    /// Defines (or finds) endpoint `address`'s stat `what` in the pool whose stats start with
    /// `prefix`. By default the stat `{prefix}.endpoint.{address}.{what}`, whose address the
    /// shipped `stats_tags` rules turn into the `endpoint` label. A host that can define stats
    /// only while the configuration loads labels a family defined then instead
    /// ([`Metrics::define_endpoint_family`]), so an endpoint discovered later has its stats too.
    fn define_endpoint(
        &self,
        kind: MetricKind,
        prefix: &str,
        what: &str,
        address: &str,
    ) -> Result<u32, HostError> {
        self.define(kind, &format!("{prefix}.endpoint.{address}.{what}"))
    }
    /// Readies `{prefix}.endpoint.{what}` for endpoints to come, on a host that defines stats
    /// only while the configuration loads; nothing where a stat can be defined at any time.
    fn define_endpoint_family(
        &self,
        _kind: MetricKind,
        _prefix: &str,
        _what: &str,
    ) -> Result<(), HostError> {
        Ok(())
    }
    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError>;
    /// Sets a gauge or records a histogram sample.
    fn record(&self, id: u32, value: u64) -> Result<(), HostError>;
}

/// What a worker VM needs from its host beyond data and callouts: its timer, the streams it
/// acts on (each addressed by its id), and what it reports about itself. Every call may fail;
/// none may panic.
pub trait VmHost: SharedData + HttpCallouts + Metrics + Clock + Clone {
    /// One stream's calls: its headers, body and local reply.
    type Stream: HttpHost;
    /// Stream `id`: the one whose callback runs, or one flow control holds; `None` when it is
    /// gone (its end already ran).
    fn stream(&self, id: u32) -> Option<Self::Stream>;
    /// Lets stream `id`, paused, go on.
    fn resume(&self, id: u32) -> Result<(), HostError>;
    /// Sets the period of this VM's tick.
    fn set_tick_period_ms(&self, period_ms: u32) -> Result<(), HostError>;
    /// A nanosecond clock, to time decisions and the configuration.
    fn now_ns(&self) -> Result<u64, HostError>;
    /// A random number, for this VM's id with the clock and the root id: Envoy configures
    /// the workers' VMs at once, and two of them can read the same time (two workers with
    /// one id each count the other's requests in flight as their own, and never see them).
    fn entropy(&self) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    }
    /// This VM's linear memory, in bytes.
    fn memory_bytes(&self) -> u64;
    /// How much of that memory is already in the shared `vm_memory_bytes` gauge: kept per
    /// address space, not per configuration. A static is exactly that: one per wasm VM
    /// instance, one per process for the module.
    fn memory_reported(&self) -> &MemoryReported {
        static REPORTED: MemoryReported = MemoryReported::new();
        &REPORTED
    }
    /// Host calls by kind since the last take, in [`HostCall::ALL`] order.
    fn take_host_calls(&self) -> [u64; HostCall::ALL.len()];
    /// Re-reads the host's log level (an operator may change it at run time).
    fn sync_log_level(&self);
}

/// proxy-wasm's log levels.
pub const LOG_CRITICAL: u32 = 5;

/// A `log` backend over the host's log call (`sink(level, message)`) that never fails.
pub struct HostLogger {
    pub sink: fn(u32, &str),
}

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            (self.sink)(host_level(record.level()), &record.args().to_string());
        }
    }

    fn flush(&self) {}
}

fn host_level(level: log::Level) -> u32 {
    match level {
        log::Level::Trace => 0,
        log::Level::Debug => 1,
        log::Level::Info => 2,
        log::Level::Warn => 3,
        log::Level::Error => 4,
    }
}

/// The `log` filter for the host's level, so disabled debug lines cost nothing to skip.
pub fn level_filter(host_level: Result<u32, HostError>) -> log::LevelFilter {
    match host_level {
        Ok(0) => log::LevelFilter::Trace,
        Ok(1) => log::LevelFilter::Debug,
        Ok(2) => log::LevelFilter::Info,
        Ok(3) => log::LevelFilter::Warn,
        Ok(4) => log::LevelFilter::Error,
        Ok(_) => log::LevelFilter::Off,
        Err(_) => log::LevelFilter::Info,
    }
}

/// proxy-wasm's header-map encoding: the count, then (key length, value length) pairs, then
/// the NUL-terminated keys and values.
pub fn encode_header_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    let text_len: usize = pairs.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut bytes = Vec::with_capacity(4 + pairs.len() * 8 + text_len);
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    bytes.extend_from_slice(&len(pairs.len()));
    for (key, value) in pairs {
        bytes.extend_from_slice(&len(key.len()));
        bytes.extend_from_slice(&len(value.len()));
    }
    for (key, value) in pairs {
        bytes.extend_from_slice(key.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
    }
    bytes
}

/// A header map as one host call returns it (proxy-wasm pairs: a count, each key's and value's
/// size, then each key and value NUL-terminated), looked up locally: one crossing of the wasm
/// boundary instead of one per header.
#[derive(Debug, Default)]
pub struct HeaderPairs {
    bytes: Vec<u8>,
    /// `(key start, key end, value start, value end)` into `bytes`.
    spans: Vec<(usize, usize, usize, usize)>,
}

impl HeaderPairs {
    /// `None` unless `bytes` is exactly one pairs buffer.
    pub fn decode(bytes: Vec<u8>) -> Option<HeaderPairs> {
        let word = |at: usize| -> Option<usize> {
            let raw: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
            usize::try_from(u32::from_le_bytes(raw)).ok()
        };
        let count = word(0)?;
        let mut data = count.checked_mul(8)?.checked_add(4)?;
        if data > bytes.len() {
            return None;
        }
        let mut spans = Vec::with_capacity(count);
        for pair in 0..count {
            let key_len = word(4 + pair * 8)?;
            let value_len = word(8 + pair * 8)?;
            let key_end = data.checked_add(key_len)?;
            let value_start = key_end.checked_add(1)?;
            let value_end = value_start.checked_add(value_len)?;
            spans.push((data, key_end, value_start, value_end));
            data = value_end.checked_add(1)?;
        }
        (data == bytes.len()).then_some(HeaderPairs { bytes, spans })
    }

    /// The map from `(key, value)` pairs, for a host that hands out a pair array (Envoy's
    /// dynamic-module ABI) rather than proxy-wasm's encoding.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> HeaderPairs {
        let mut map = HeaderPairs::default();
        for (key, value) in pairs {
            let key_start = map.bytes.len();
            map.bytes.extend_from_slice(key);
            let key_end = map.bytes.len();
            map.bytes.extend_from_slice(value);
            map.spans
                .push((key_start, key_end, key_end, map.bytes.len()));
        }
        map
    }

    /// The first value of `name` (lowercase, as Envoy keeps header names).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.spans
            .iter()
            .find_map(|&(key_start, key_end, value_start, value_end)| {
                let key = self.bytes.get(key_start..key_end)?;
                (key == name.as_bytes())
                    .then(|| self.bytes.get(value_start..value_end))
                    .flatten()
            })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Every key, in order.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.spans
            .iter()
            .filter_map(|&(start, end, _, _)| self.bytes.get(start..end))
    }
}

/// In-memory hosts for native tests, here and (with the `testing` feature) in the CLI, the
/// benches and the integration tests.
#[cfg(any(test, feature = "testing"))]
pub mod fake;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn pairs_read_alike_from_either_encoding() {
        let pairs: [(&[u8], &[u8]); 3] = [(b":path", b"/v1"), (b"x", b""), (b"x", b"2")];
        let decoded = HeaderPairs::decode(encode_header_map(&[
            (":path", "/v1"),
            ("x", ""),
            ("x", "2"),
        ]));
        for map in [HeaderPairs::from_pairs(pairs), decoded.unwrap()] {
            assert_eq!(map.get(":path"), Some(&b"/v1"[..]));
            assert_eq!(map.get("x"), Some(&b""[..]));
            assert!(!map.contains("y"));
            assert_eq!(map.keys().count(), 3);
        }
    }

    #[test]
    fn an_answer_reads_only_the_body_of_a_200_within_the_cap() {
        let read = |answered: bool, status: &str, size: usize, cap: usize| {
            let mut reads = Vec::new();
            let answer = CalloutAnswer::read(
                answered,
                size,
                cap,
                || Some(status.as_bytes().to_vec()),
                |size| {
                    reads.push(size);
                    Ok(vec![b'x'; size])
                },
            );
            (answer, reads)
        };
        let (answer, reads) = read(true, "200", 10, 10);
        assert_eq!((answer.body, reads), (Ok(vec![b'x'; 10]), vec![10]));
        let (answer, reads) = read(true, "200", 11, 10);
        assert_eq!(
            (answer.body_size, answer.body, reads),
            (11, Ok(vec![]), vec![])
        );
        let (answer, reads) = read(true, "503", 3, 10);
        assert_eq!(answer.status.as_deref(), Some(&b"503"[..]));
        assert!(reads.is_empty(), "a failure's body is not read");
        let (answer, reads) = read(false, "200", 3, 10);
        assert_eq!((answer.status, answer.body_size, reads), (None, 0, vec![]));
    }

    #[test]
    fn header_map_encoding() {
        let bytes = encode_header_map(&[("a", "bc"), (":s", "")]);
        let mut expected = vec![2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0];
        expected.extend_from_slice(b"a\0bc\0:s\0\0");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn host_levels_map_both_ways() {
        for level in [
            log::Level::Trace,
            log::Level::Debug,
            log::Level::Info,
            log::Level::Warn,
            log::Level::Error,
        ] {
            assert_eq!(level_filter(Ok(host_level(level))), level.to_level_filter());
        }
        assert_eq!(level_filter(Ok(LOG_CRITICAL)), log::LevelFilter::Off);
        assert_eq!(
            level_filter(Err(HostError {
                call: "x",
                status: 2
            })),
            log::LevelFilter::Info
        );
    }
}

/// Host calls by kind, counted by the host edge and published as `inference_picker.host_calls.*`
/// stats: what a request costs in calls across the wasm boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostCall {
    HeaderRead,
    HeaderWrite,
    HeaderRemove,
    BodyRead,
    BodyWrite,
    Property,
    Clock,
    Metric,
    Log,
    SharedData,
    LocalReply,
    Stream,
    HttpCall,
}

impl HostCall {
    pub const ALL: [HostCall; 13] = [
        HostCall::HeaderRead,
        HostCall::HeaderWrite,
        HostCall::HeaderRemove,
        HostCall::BodyRead,
        HostCall::BodyWrite,
        HostCall::Property,
        HostCall::Clock,
        HostCall::Metric,
        HostCall::Log,
        HostCall::SharedData,
        HostCall::LocalReply,
        HostCall::Stream,
        HostCall::HttpCall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HostCall::HeaderRead => "header_read",
            HostCall::HeaderWrite => "header_write",
            HostCall::HeaderRemove => "header_remove",
            HostCall::BodyRead => "body_read",
            HostCall::BodyWrite => "body_write",
            HostCall::Property => "property",
            HostCall::Clock => "clock",
            HostCall::Metric => "metric",
            HostCall::Log => "log",
            HostCall::SharedData => "shared_data",
            HostCall::LocalReply => "local_reply",
            HostCall::Stream => "stream",
            HostCall::HttpCall => "http_call",
        }
    }
}
