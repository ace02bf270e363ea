//! Envoy as the core sees it: the host traits implemented with the proxy-wasm host calls,
//! declared here so that every status the host returns is handled (the SDK's wrappers panic on
//! statuses they do not expect, and a panic kills the VM). Statuses come back as raw `u32`,
//! never as an enum the host could overflow.

use inference_picker_core::error_response::{ErrorShape, RequestError};
use inference_picker_core::host::{
    encode_header_map, level_filter, CalloutAnswer, Clock, HeaderPairs, HostCall, HostError,
    HostLogger, HttpCallouts, HttpHost, MetricKind, Metrics, SharedData, VmHost,
};
use inference_picker_core::protocol::{
    DROPPED_REASON_HEADER, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE,
};
use proxy_wasm::types::{BufferType, MapType};
use std::cell::Cell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

/// Host calls made so far, by kind (`HostCall as usize`); a VM is single-threaded, the atomics
/// only make the statics safe.
static CALLS: [AtomicU64; HostCall::ALL.len()] = [const { AtomicU64::new(0) }; HostCall::ALL.len()];

fn count(call: HostCall) {
    if let Some(counter) = CALLS.get(call as usize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

const OK: u32 = 0;
const NOT_FOUND: u32 = 1;
const EMPTY: u32 = 7;
const CAS_MISMATCH: u32 = 8;

#[allow(clashing_extern_declarations)]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
}

/// The VM's side of Envoy: shared data, callouts, stats, the clock, the timer and streams.
#[derive(Clone, Copy)]
pub struct EnvoyHost;

/// One stream's side of Envoy, by its context id: its headers, body and local reply.
pub struct EnvoyStream(pub u32);

thread_local! {
    /// The context Envoy's stream calls act on now (the effective one); `None`: not known.
    static EFFECTIVE: Cell<Option<u32>> = const { Cell::new(None) };
}

/// Envoy makes a callback's own context effective as the callback starts: noted while the guard
/// lives, then what an enclosing callback had is put back (as Envoy does after a nested one).
pub fn enter(context_id: u32) -> Entered {
    Entered(EFFECTIVE.replace(Some(context_id)))
}

pub struct Entered(Option<u32>);

impl Drop for Entered {
    fn drop(&mut self) {
        EFFECTIVE.set(self.0);
    }
}

/// Makes `context_id` the effective context unless it already is; an error when it is gone.
/// proxy-wasm's stream calls act on the effective context, so each call of an [`EnvoyStream`]
/// addresses its own stream first: after the core acted on a held stream from another stream's
/// callback, that callback's next call on its own stream switches back, and a host call is
/// spent only when the stream changes. The other calls (shared data, stats, clock, timer,
/// callouts, which Envoy makes on the root context) act alike from any context.
fn address(context_id: u32) -> Result<(), HostError> {
    if EFFECTIVE.get() == Some(context_id) {
        return Ok(());
    }
    count(HostCall::Stream);
    check("proxy_set_effective_context", unsafe {
        proxy_set_effective_context(context_id)
    })?;
    EFFECTIVE.set(Some(context_id));
    Ok(())
}

impl SharedData for EnvoyHost {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        let mut cas = 0u32;
        let value = host_bytes(
            "proxy_get_shared_data",
            HostCall::SharedData,
            |data, size| unsafe {
                proxy_get_shared_data(key.as_ptr(), key.len(), data, size, &mut cas)
            },
        )?;
        Ok(value.map(|value| (value, cas)))
    }

    /// Stores the value if its CAS is still `cas` (`None`: unconditionally); false on a CAS
    /// mismatch.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        count(HostCall::SharedData);
        let (data, size, cas) = (value.as_ptr(), value.len(), cas.unwrap_or(0));
        match unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), data, size, cas) } {
            OK => Ok(true),
            CAS_MISMATCH => Ok(false),
            status => Err(HostError {
                call: "proxy_set_shared_data",
                status,
            }),
        }
    }
}

impl HttpCallouts for EnvoyHost {
    /// Goes through the SDK: its dispatcher must learn the token or it rejects the answer.
    /// Envoy returns only Ok, BadArgument or InternalFailure here, all of which the SDK maps
    /// to a `Result`.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        count(HostCall::HttpCall);
        let timeout = std::time::Duration::from_millis(u64::from(timeout_ms));
        proxy_wasm::hostcalls::dispatch_http_call(
            cluster,
            headers.to_vec(),
            None,
            Vec::new(),
            timeout,
        )
        .map_err(|status| HostError {
            call: "proxy_http_call",
            status: status as u32,
        })
    }
}

/// The answer of the callout being delivered (valid inside its callback only), its body read
/// up to `cap` bytes (see [`CalloutAnswer::read`]).
pub fn callout_answer(num_headers: usize, body_size: usize, cap: usize) -> CalloutAnswer {
    let status = || header(MapType::HttpCallResponseHeaders, ":status").unwrap_or_default();
    let body = |size| buffer(BufferType::HttpCallResponseBody, size);
    CalloutAnswer::read(num_headers > 0, body_size, cap, status, body)
}

impl Metrics for EnvoyHost {
    /// Defines (or finds) an Envoy stat; Envoy prefixes its name with `wasmcustom.`.
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        count(HostCall::Metric);
        let mut id = 0u32;
        let status =
            unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) };
        check("proxy_define_metric", status).map(|()| id)
    }

    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError> {
        count(HostCall::Metric);
        check("proxy_increment_metric", unsafe {
            proxy_increment_metric(id, offset)
        })
    }

    fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        count(HostCall::Metric);
        check("proxy_record_metric", unsafe {
            proxy_record_metric(id, value)
        })
    }
}

impl Clock for EnvoyHost {
    fn now_ms(&self) -> Result<u64, HostError> {
        self.now_ns().map(|nanos| nanos / 1_000_000)
    }
}

impl VmHost for EnvoyHost {
    type Stream = EnvoyStream;

    /// `None` when that context is gone (Envoy refuses to make it effective).
    fn stream(&self, id: u32) -> Option<EnvoyStream> {
        address(id).ok().map(|()| EnvoyStream(id))
    }

    fn resume(&self, id: u32) -> Result<(), HostError> {
        address(id)?;
        count(HostCall::Stream);
        const HTTP_REQUEST: u32 = 0;
        check("proxy_continue_stream", unsafe {
            proxy_continue_stream(HTTP_REQUEST)
        })
    }

    fn set_tick_period_ms(&self, period_ms: u32) -> Result<(), HostError> {
        let status = unsafe { proxy_set_tick_period_milliseconds(period_ms) };
        check("proxy_set_tick_period_milliseconds", status)
    }

    fn now_ns(&self) -> Result<u64, HostError> {
        count(HostCall::Clock);
        let mut nanos = 0u64;
        let status = unsafe { proxy_get_current_time_nanoseconds(&mut nanos) };
        check("proxy_get_current_time_nanoseconds", status).map(|()| nanos)
    }

    /// Linear memory never shrinks.
    fn memory_bytes(&self) -> u64 {
        let pages = u64::try_from(core::arch::wasm32::memory_size(0)).unwrap_or(0);
        pages.saturating_mul(65536)
    }

    fn take_host_calls(&self) -> [u64; HostCall::ALL.len()] {
        std::array::from_fn(|kind| CALLS.get(kind).map_or(0, |c| c.swap(0, Ordering::Relaxed)))
    }

    fn sync_log_level(&self) {
        sync_log_level();
    }
}

impl HttpHost for EnvoyStream {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        address(self.0).ok()?;
        header(MapType::HttpRequestHeaders, name).ok().flatten()
    }

    /// The whole map in one call.
    fn request_headers(&self) -> Option<HeaderPairs> {
        address(self.0).ok()?;
        let map = MapType::HttpRequestHeaders as u32;
        let bytes = host_bytes(
            "proxy_get_header_map_pairs",
            HostCall::HeaderRead,
            |data, size| unsafe { proxy_get_header_map_pairs(map, data, size) },
        );
        HeaderPairs::decode(bytes.ok()?.unwrap_or_default())
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        address(self.0)?;
        replace_header(MapType::HttpRequestHeaders, name, value)
    }

    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        address(self.0)?;
        count(HostCall::HeaderRemove);
        let map = MapType::HttpRequestHeaders as u32;
        let status = unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) };
        check("proxy_remove_header_map_value", status)
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        address(self.0)?;
        buffer(BufferType::HttpRequestBody, size)
    }

    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
        address(self.0)?;
        count(HostCall::BodyWrite);
        let kind = BufferType::HttpRequestBody as u32;
        let status = unsafe { proxy_set_buffer_bytes(kind, 0, size, body.as_ptr(), body.len()) };
        check("proxy_set_buffer_bytes", status)
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        address(self.0).ok()?;
        header(MapType::HttpResponseHeaders, name).ok().flatten()
    }

    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        address(self.0)?;
        replace_header(MapType::HttpResponseHeaders, name, value)
    }

    fn upstream_address(&self) -> Option<String> {
        address(self.0).ok()?;
        let bytes = property(&["upstream", "address"]).ok().flatten()?;
        String::from_utf8(bytes)
            .ok()
            .filter(|address| !address.is_empty())
    }

    fn subset_hint(&self) -> Option<Vec<u8>> {
        address(self.0).ok()?;
        let path = [
            "metadata",
            "filter_metadata",
            SUBSET_HINT_NAMESPACE,
            SUBSET_HINT_KEY,
        ];
        property(&path).ok().flatten()
    }

    fn now_ms(&self) -> u64 {
        Clock::now_ms(&EnvoyHost).unwrap_or(0)
    }

    fn shared_data(&self) -> &dyn SharedData {
        &EnvoyHost
    }

    fn destination_port(&self) -> Option<u16> {
        address(self.0).ok()?;
        let bytes = property(&["destination", "port"]).ok().flatten()?;
        u16::try_from(i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()
    }

    fn send_answer(&self, status: u16, body: &[u8]) -> Result<(), HostError> {
        address(self.0)?;
        let headers = encode_header_map(&[("content-type", "application/octet-stream")]);
        local_reply(status, body, &headers, "inference_picker_peer")
    }

    fn send_error(&self, error: &RequestError, shape: ErrorShape) -> Result<(), HostError> {
        address(self.0)?;
        let content_type = ("content-type", "application/json");
        let headers = match error.dropped_reason() {
            Some(reason) => encode_header_map(&[content_type, (DROPPED_REASON_HEADER, reason)]),
            None => encode_header_map(&[content_type]),
        };
        let body = error.to_json_for(shape);
        local_reply(error.status(), &body, &headers, "inference_picker")
    }
}

/// Answers the current request here, with `headers` as encoded for the host.
fn local_reply(status: u16, body: &[u8], headers: &[u8], details: &str) -> Result<(), HostError> {
    count(HostCall::LocalReply);
    // SAFETY: every pointer is to a live buffer of the given length; the host copies them.
    let status = unsafe {
        proxy_send_local_response(
            u32::from(status),
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    };
    check("proxy_send_local_response", status)
}

fn check(call: &'static str, status: u32) -> Result<(), HostError> {
    if status == OK {
        Ok(())
    } else {
        Err(HostError { call, status })
    }
}

/// Takes ownership of a buffer the host allocated through the module's allocator.
///
/// # Safety
/// `data` must be null or come from `proxy_on_memory_allocate` with exactly `size` bytes.
unsafe fn take_host_buffer(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        return Vec::new();
    }
    Vec::from_raw_parts(data, size, size)
}

/// A host call that hands back a buffer the host allocated: its bytes, or `None` when the
/// host has none (`NotFound`, `Empty`).
fn host_bytes(
    call: &'static str,
    kind: HostCall,
    read: impl FnOnce(*mut *mut u8, *mut usize) -> u32,
) -> Result<Option<Vec<u8>>, HostError> {
    count(kind);
    let mut data = null_mut();
    let mut size = 0usize;
    match read(&mut data, &mut size) {
        OK => Ok(Some(unsafe { take_host_buffer(data, size) })),
        NOT_FOUND | EMPTY => Ok(None),
        status => Err(HostError { call, status }),
    }
}

/// The first `max_size` bytes of a buffer; an absent or empty buffer is empty.
pub fn buffer(kind: BufferType, max_size: usize) -> Result<Vec<u8>, HostError> {
    let bytes = host_bytes(
        "proxy_get_buffer_bytes",
        HostCall::BodyRead,
        |data, size| unsafe { proxy_get_buffer_bytes(kind as u32, 0, max_size, data, size) },
    );
    bytes.map(Option::unwrap_or_default)
}

fn header(map: MapType, name: &str) -> Result<Option<Vec<u8>>, HostError> {
    host_bytes(
        "proxy_get_header_map_value",
        HostCall::HeaderRead,
        |data, size| unsafe {
            proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), data, size)
        },
    )
}

/// A host property by its path (`["upstream", "address"]`); `None` when the host has none.
fn property(path: &[&str]) -> Result<Option<Vec<u8>>, HostError> {
    // The ABI's encoding: the path's parts joined by NUL.
    let encoded = path.join("\0");
    host_bytes(
        "proxy_get_property",
        HostCall::Property,
        |data, size| unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), data, size) },
    )
}

fn replace_header(map: MapType, name: &str, value: &str) -> Result<(), HostError> {
    count(HostCall::HeaderWrite);
    let (key, value) = ((name.as_ptr(), name.len()), (value.as_ptr(), value.len()));
    let status =
        unsafe { proxy_replace_header_map_value(map as u32, key.0, key.1, value.0, value.1) };
    check("proxy_replace_header_map_value", status)
}

pub fn log(level: u32, message: &str) {
    count(HostCall::Log);
    // Nothing sensible to do if logging itself fails.
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

pub static LOGGER: HostLogger = HostLogger { sink: log };

/// Mirrors the host's log level (0 trace .. 5 critical) into `log`'s filter.
pub fn sync_log_level() {
    count(HostCall::Log);
    let mut level = 0u32;
    let status = unsafe { proxy_get_log_level(&mut level) };
    log::set_max_level(level_filter(
        check("proxy_get_log_level", status).map(|()| level),
    ));
}
