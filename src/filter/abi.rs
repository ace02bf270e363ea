//! The proxy-wasm host calls the filter makes, declared here so that every status the host
//! returns is handled: the SDK's wrappers panic on statuses they do not expect, and a panic
//! kills the VM. Statuses come back as raw `u32`, never as an enum the host could overflow.

use crate::host::{encode_header_map, level_filter, HostCall, HostError, HostLogger, MetricKind};
use proxy_wasm::types::{BufferType, MapType};
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

/// The calls counted since the last take, by kind in [`HostCall::ALL`] order.
pub fn take_call_counts() -> [u64; HostCall::ALL.len()] {
    let mut counts = [0; HostCall::ALL.len()];
    for (count, counter) in counts.iter_mut().zip(&CALLS) {
        *count = counter.swap(0, Ordering::Relaxed);
    }
    counts
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
}

#[allow(clashing_extern_declarations)]
extern "C" {
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
}

/// Makes `context_id` the context later host calls act on (a held stream, from another
/// context's callback). Fails when that context is gone.
pub fn set_effective_context(context_id: u32) -> Result<(), HostError> {
    count(HostCall::Stream);
    check("proxy_set_effective_context", unsafe {
        proxy_set_effective_context(context_id)
    })
}

/// Resumes the effective context's paused request.
pub fn resume_request() -> Result<(), HostError> {
    count(HostCall::Stream);
    const HTTP_REQUEST: u32 = 0;
    check("proxy_continue_stream", unsafe {
        proxy_continue_stream(HTTP_REQUEST)
    })
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

pub fn log(level: u32, message: &str) {
    count(HostCall::Log);
    // Nothing sensible to do if logging itself fails.
    let _ = unsafe { proxy_log(level, message.as_ptr(), message.len()) };
}

/// The host's log level (0 trace .. 5 critical).
pub fn log_level() -> Result<u32, HostError> {
    count(HostCall::Log);
    let mut level = 0u32;
    check("proxy_get_log_level", unsafe {
        proxy_get_log_level(&mut level)
    })?;
    Ok(level)
}

pub fn current_time_ns() -> Result<u64, HostError> {
    count(HostCall::Clock);
    let mut nanos = 0u64;
    check("proxy_get_current_time_nanoseconds", unsafe {
        proxy_get_current_time_nanoseconds(&mut nanos)
    })?;
    Ok(nanos)
}

pub fn current_time_ms() -> Result<u64, HostError> {
    current_time_ns().map(|nanos| nanos / 1_000_000)
}

/// This VM's linear memory in bytes (it never shrinks).
pub fn memory_bytes() -> u64 {
    let pages = u64::try_from(core::arch::wasm32::memory_size(0)).unwrap_or(0);
    pages.saturating_mul(65536)
}

pub fn set_tick_period_ms(period: u32) -> Result<(), HostError> {
    check("proxy_set_tick_period_milliseconds", unsafe {
        proxy_set_tick_period_milliseconds(period)
    })
}

/// Bytes `[start, start + max_size)` of a buffer; an absent or empty buffer is empty.
pub fn buffer(
    buffer_type: BufferType,
    start: usize,
    max_size: usize,
) -> Result<Vec<u8>, HostError> {
    count(HostCall::BodyRead);
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe {
        proxy_get_buffer_bytes(buffer_type as u32, start, max_size, &mut data, &mut size)
    };
    match status {
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND | EMPTY => Ok(Vec::new()),
        status => Err(HostError {
            call: "proxy_get_buffer_bytes",
            status,
        }),
    }
}

pub fn header(map_type: MapType, name: &str) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::HeaderRead);
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe {
        proxy_get_header_map_value(
            map_type as u32,
            name.as_ptr(),
            name.len(),
            &mut data,
            &mut size,
        )
    };
    match status {
        OK => Ok(Some(unsafe { take_host_buffer(data, size) })),
        NOT_FOUND => Ok(None),
        status => Err(HostError {
            call: "proxy_get_header_map_value",
            status,
        }),
    }
}

/// A whole header map in one call, as proxy-wasm pairs.
pub fn header_pairs(map_type: MapType) -> Result<Vec<u8>, HostError> {
    count(HostCall::HeaderRead);
    let mut data = null_mut();
    let mut size = 0usize;
    let status = unsafe { proxy_get_header_map_pairs(map_type as u32, &mut data, &mut size) };
    match status {
        OK => Ok(unsafe { take_host_buffer(data, size) }),
        NOT_FOUND | EMPTY => Ok(Vec::new()),
        status => Err(HostError {
            call: "proxy_get_header_map_pairs",
            status,
        }),
    }
}

/// A host property by its path (`["upstream", "address"]`); `None` when the host has none.
pub fn property(path: &[&str]) -> Result<Option<Vec<u8>>, HostError> {
    count(HostCall::Property);
    // The ABI's encoding: the path's parts joined by NUL.
    let encoded = path.join("\0");
    let mut data = null_mut();
    let mut size = 0usize;
    let status =
        unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    match status {
        OK => Ok(Some(unsafe { take_host_buffer(data, size) })),
        NOT_FOUND | EMPTY => Ok(None),
        status => Err(HostError {
            call: "proxy_get_property",
            status,
        }),
    }
}

pub fn replace_header(map_type: MapType, name: &str, value: &str) -> Result<(), HostError> {
    count(HostCall::HeaderWrite);
    check("proxy_replace_header_map_value", unsafe {
        proxy_replace_header_map_value(
            map_type as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Defines (or finds) an Envoy stat; Envoy prefixes its name with `wasmcustom.`.
pub fn define_metric(kind: MetricKind, name: &str) -> Result<u32, HostError> {
    count(HostCall::Metric);
    let mut id = 0u32;
    check("proxy_define_metric", unsafe {
        proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id)
    })?;
    Ok(id)
}

pub fn increment_metric(id: u32, offset: i64) -> Result<(), HostError> {
    count(HostCall::Metric);
    check("proxy_increment_metric", unsafe {
        proxy_increment_metric(id, offset)
    })
}

/// Sets a gauge or records a histogram sample.
pub fn record_metric(id: u32, value: u64) -> Result<(), HostError> {
    count(HostCall::Metric);
    check("proxy_record_metric", unsafe {
        proxy_record_metric(id, value)
    })
}

/// A shared-data value and its CAS token; `None` when the key was never set.
pub fn shared_data(key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
    count(HostCall::SharedData);
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    let status =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match status {
        OK => Ok(Some((unsafe { take_host_buffer(data, size) }, cas))),
        NOT_FOUND => Ok(None),
        status => Err(HostError {
            call: "proxy_get_shared_data",
            status,
        }),
    }
}

/// Stores a shared-data value if its CAS is still `cas` (0: unconditionally); false on a
/// CAS mismatch.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<bool, HostError> {
    count(HostCall::SharedData);
    let status =
        unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) };
    match status {
        OK => Ok(true),
        CAS_MISMATCH => Ok(false),
        status => Err(HostError {
            call: "proxy_set_shared_data",
            status,
        }),
    }
}

pub fn remove_header(map_type: MapType, name: &str) -> Result<(), HostError> {
    count(HostCall::HeaderRemove);
    check("proxy_remove_header_map_value", unsafe {
        proxy_remove_header_map_value(map_type as u32, name.as_ptr(), name.len())
    })
}

/// Replaces `size` bytes at `start` of a buffer with `data`.
pub fn set_buffer(
    buffer_type: BufferType,
    start: usize,
    size: usize,
    data: &[u8],
) -> Result<(), HostError> {
    count(HostCall::BodyWrite);
    check("proxy_set_buffer_bytes", unsafe {
        proxy_set_buffer_bytes(buffer_type as u32, start, size, data.as_ptr(), data.len())
    })
}

pub fn send_local_response(
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), HostError> {
    count(HostCall::LocalReply);
    let headers = encode_header_map(headers);
    let details = "inference_picker";
    check("proxy_send_local_response", unsafe {
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
    })
}

/// Starts an HTTP callout; the answer arrives in `on_http_call_response` with the token.
///
/// This one goes through the SDK: its dispatcher must learn the token or it rejects the
/// answer. Envoy returns only Ok, BadArgument or InternalFailure here, all of which the SDK
/// maps to a `Result`.
pub fn http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    timeout_ms: u32,
) -> Result<u32, HostError> {
    count(HostCall::HttpCall);
    proxy_wasm::hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        None,
        Vec::new(),
        std::time::Duration::from_millis(u64::from(timeout_ms)),
    )
    .map_err(|status| HostError {
        call: "proxy_http_call",
        status: status as u32,
    })
}

pub static LOGGER: HostLogger = HostLogger { sink: log };

/// Mirrors the host's log level into `log`'s filter.
pub fn sync_log_level() {
    log::set_max_level(level_filter(log_level()));
}
