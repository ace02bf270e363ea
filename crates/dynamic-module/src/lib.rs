//! The picker as an Envoy dynamic module: a native shared library Envoy loads with
//! `envoy.filters.http.dynamic_modules`, the same core and configuration as the proxy-wasm
//! filter behind a second thin edge. Envoy's hooks land here and go to the core's [`WorkerVm`];
//! `host` and `stream` carry out what it asks through Envoy's callbacks (`abi`).
//!
//! One picker per filter config serves every worker of this Envoy (behind one lock), so the
//! shared state proxy-wasm copies between VMs is plain memory here; the core's lease still runs,
//! through this process's [`support::shared`] store, so exactly one picker scrapes each pool
//! however many configs name it. Ticks, scrapes and callout answers run on Envoy's main thread;
//! request hooks on the stream's worker.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

mod abi;
#[cfg(feature = "fault-injection")]
mod fault;
mod host;
mod logging;
mod memory;
mod stream;
mod support;
mod ticker;

use abi::{status, EnvoyBuffer, EnvoyHeader, EnvoyPtr};
use host::NativeHost;
use inference_picker_core::host::{CalloutAnswer, HostCall};
use inference_picker_core::request_driver::{Next, Outcome, RequestDriver};
use inference_picker_core::vm::{answer_no_endpoint, answer_unavailable, WorkerVm};
use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use stream::{NativeStream, Own, RUN_QUEUED};
use support::{count, first_bytes, lock};
use ticker::{Ticker, TICK};

/// The VM's own id (proxy-wasm's root context id, which seeds its tie-breaking); streams count
/// from 1.
const ROOT_ID: u32 = 0;

static NEXT_STREAM_ID: AtomicU32 = AtomicU32::new(1);

thread_local! {
    /// This thread is inside the picker: Envoy re-enters a filter's hooks from within a call
    /// (a local reply sent from a request hook runs the response hooks at once).
    static IN_VM: Cell<bool> = const { Cell::new(false) };
}

/// One filter config's picker, shared by its streams on every worker.
struct ConfigVm {
    host: NativeHost,
    vm: Mutex<WorkerVm<NativeHost>>,
}

impl ConfigVm {
    /// Runs `step` on the VM, with `own` as the stream of the running hook (`None`: a main
    /// thread callback); `None` when this thread is already inside the picker, or when `step`
    /// panicked: a bug costs the request or tick it happened in, never Envoy's process (the
    /// module is built to unwind, see `make build`), and counts in `panics`.
    fn run<R>(
        &self,
        own: Option<Own>,
        step: impl FnOnce(&mut WorkerVm<NativeHost>) -> R,
    ) -> Option<R> {
        if IN_VM.get() {
            return None;
        }
        IN_VM.set(true);
        let mut vm = lock(&self.vm);
        lock(&self.host.state.streams).enter(own);
        let result = panic::catch_unwind(AssertUnwindSafe(|| step(&mut vm)));
        lock(&self.host.state.streams).enter(None);
        if result.is_err() {
            vm.count_panic();
        }
        drop(vm);
        IN_VM.set(false);
        result.ok()
    }
}

/// One stream's filter.
struct StreamFilter {
    config_vm: Arc<ConfigVm>,
    request: RequestDriver,
}

impl StreamFilter {
    /// Runs one request hook; true if the request goes on.
    fn step(
        &mut self,
        envoy: EnvoyPtr,
        step: impl FnOnce(&mut WorkerVm<NativeHost>, &mut RequestDriver) -> Next,
    ) -> bool {
        let id = self.request.id();
        let own = Own {
            id,
            filter: envoy,
            resumed: false,
        };
        let (request, host) = (&mut self.request, &self.config_vm.host);
        let ran = self.config_vm.run(Some(own), |vm| {
            let flow = step(vm, request);
            // Held, unless the core let it go within this same hook.
            let resumed = lock(&host.state.streams).own_resumed();
            if flow == Next::Pause && request.outcome == Outcome::Held && !resumed {
                hold(host, id, envoy);
            }
            flow == Next::Continue || resumed
        });
        ran.unwrap_or_else(|| {
            answer_unavailable(&NativeStream::Direct(envoy));
            false
        })
    }
}

/// Flow control holds the stream: keep what its worker needs to act on it later. If Envoy
/// gives no scheduler to reach it with, it is answered 503 now (it leaves the queue when its
/// stream ends) rather than left waiting for a release that could not reach it.
fn hold(host: &NativeHost, id: u32, envoy: EnvoyPtr) {
    use inference_picker_core::host::HttpHost;
    let stream = NativeStream::Direct(envoy);
    let path = stream.request_header(":path").unwrap_or_default();
    // SAFETY: called within a request hook of this stream, on its worker.
    let held = unsafe { lock(&host.state.streams).hold(id, envoy, path) };
    if let Err(error) = held {
        log::error!("inference-picker: holding a request: {error}");
        answer_no_endpoint(&stream, "flow control could not hold the request");
    }
}

/// A filter config's picker, shared by the main thread and every worker.
///
/// # Safety
/// `config` must be null or a pointer `config_new` returned, not yet destroyed.
unsafe fn config_vm_of<'a>(config: *const c_void) -> Option<&'a Arc<ConfigVm>> {
    config.cast::<Arc<ConfigVm>>().as_ref()
}

/// A stream's filter, used by its worker only; `None` (the hook does nothing) when this thread
/// is already inside the picker, where a hook Envoy runs re-entrantly would alias the filter
/// the outer hook holds.
///
/// # Safety
/// `filter` must be null or a pointer `filter_new` returned, not yet destroyed.
unsafe fn stream_filter<'a>(filter: *const c_void) -> Option<&'a mut StreamFilter> {
    if IN_VM.get() {
        return None;
    }
    filter.cast::<StreamFilter>().cast_mut().as_mut()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    match abi::load() {
        Ok(()) => {
            logging::install();
            // The code denies what panics; should one happen anyway, this says where, at
            // Envoy's critical level. Built to unwind (`make build`), the hook it happened in is
            // abandoned and Envoy carries on; built to abort, that is Envoy's whole process.
            panic::set_hook(Box::new(|info| {
                let outcome = if cfg!(panic = "unwind") {
                    "the request or tick it happened in fails, Envoy carries on"
                } else {
                    "this build aborts Envoy"
                };
                logging::critical(&format!("inference-picker: panic ({outcome}): {info}"));
            }));
            abi::ABI_VERSION.as_ptr()
        }
        Err(missing) => {
            // Envoy's own log cannot be reached without the callbacks.
            eprintln!(
                "inference-picker: this Envoy has no {missing}; the module is built for Envoy {} (dynamic-module ABI {:?}): build it for this Envoy or run that one",
                abi::ENVOY_VERSION,
                abi::ABI_VERSION,
            );
            std::ptr::null()
        }
    }
}

/// Loads the configuration (the same YAML as the wasm filter's) and starts the tick; null
/// (Envoy refuses the config) with the reason logged.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    // SAFETY: Envoy's buffers, valid during this call; copied here.
    let (name, text) = unsafe { (name.bytes().to_vec(), config.bytes().to_vec()) };
    let configured = panic::catch_unwind(|| configure(EnvoyPtr(config_envoy), &text))
        .unwrap_or_else(|_| Err("loading the configuration panicked".into()));
    match configured {
        Ok(picker) => Box::into_raw(Box::new(picker)).cast_const().cast(),
        Err(error) => {
            let name = String::from_utf8_lossy(&name);
            log::error!("inference-picker: filter {name}: {error}");
            std::ptr::null()
        }
    }
}

fn configure(config_envoy: EnvoyPtr, text: &[u8]) -> Result<Arc<ConfigVm>, String> {
    let envoy = abi::envoy().ok_or("the module's callbacks are not loaded")?;
    let ticker = Ticker::new();
    let host = NativeHost::new(config_envoy, ticker.clone());
    let vm = WorkerVm::configure(host.clone(), ROOT_ID, text)?;
    // Envoy freezes a module's stats once this hook returns.
    vm.define_all_stats();
    // SAFETY: Envoy's config pointer, on the main thread within its config hook.
    let scheduler = EnvoyPtr(unsafe { (envoy.http_filter_config_scheduler_new)(config_envoy.0) });
    if scheduler.is_null() {
        return Err("Envoy gave no scheduler for the metrics tick".into());
    }
    ticker
        .start(scheduler)
        .map_err(|error| format!("cannot start the metrics tick: {error}"))?;
    Ok(Arc::new(ConfigVm {
        host,
        vm: Mutex::new(vm),
    }))
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    if config.is_null() {
        return;
    }
    // SAFETY: the pointer `config_new` returned, destroyed once.
    let picker = unsafe { Box::from_raw(config.cast::<Arc<ConfigVm>>().cast_mut()) };
    picker.host.state.ticker.stop();
    // No tick runs any more: the VM leaves the pool's shared state.
    picker.run(None, WorkerVm::retire);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: *mut c_void,
    config: *const c_void,
    event: u64,
) {
    // SAFETY: the pointer `config_new` returned, alive until `config_destroy`.
    let Some(picker) = (unsafe { config_vm_of(config) }) else {
        return;
    };
    if event == TICK {
        picker.host.state.ticker.ticked();
        picker.run(None, WorkerVm::on_tick);
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: *mut c_void,
    config: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    // SAFETY: the pointer `config_new` returned, alive until `config_destroy`.
    let Some(picker) = (unsafe { config_vm_of(config) }) else {
        return;
    };
    let Ok(token) = u32::try_from(callout_id) else {
        return;
    };
    // SAFETY: Envoy's arrays of the given sizes, valid during this call (or null).
    let (headers, chunks) = unsafe {
        (
            slice_or_empty(headers, headers_size),
            slice_or_empty(body_chunks, body_chunks_size),
        )
    };
    // SAFETY (both closures): each header and chunk is Envoy's, valid during this call.
    let status = || {
        headers.iter().find_map(|header| {
            let (key, value) = unsafe { header.pair() };
            (key == b":status").then(|| value.to_vec())
        })
    };
    // Copied only as far as the core reads: a page over `pool.maxMetricsBytes` never is.
    let body = |size| {
        count(HostCall::BodyRead);
        Ok(first_bytes(
            chunks.iter().map(|c| unsafe { c.bytes() }),
            size,
        ))
    };
    let answered = result == abi::CALLOUT_SUCCESS;
    let body_size = chunks.iter().map(|chunk| chunk.length).sum();
    picker.run(None, |vm| {
        if let Some(cap) = vm.callout_body_cap(token) {
            let answer = CalloutAnswer::read(answered, body_size, cap, status, body);
            vm.on_callout_response(token, answer);
        }
    });
}

/// # Safety
/// `data` must be null or point at `size` initialised values for the borrow's lifetime.
unsafe fn slice_or_empty<'a, T>(data: *const T, size: usize) -> &'a [T] {
    if data.is_null() || size == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(data, size)
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: *mut c_void,
) -> *const c_void {
    // SAFETY: the pointer `config_new` returned, alive until `config_destroy`.
    let Some(picker) = (unsafe { config_vm_of(config) }) else {
        return std::ptr::null();
    };
    let id = NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed).max(1);
    let filter = StreamFilter {
        config_vm: Arc::clone(picker),
        request: RequestDriver::new(id),
    };
    Box::into_raw(Box::new(filter)).cast_const().cast()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointer `filter_new` returned, used on its worker only.
    let Some(filter) = (unsafe { stream_filter(filter) }) else {
        return status::CONTINUE;
    };
    let go_on = filter.step(EnvoyPtr(filter_envoy), |vm, request| {
        #[cfg(feature = "fault-injection")]
        fault::panic_if_asked(EnvoyPtr(filter_envoy));
        vm.on_request_headers(request, end_of_stream)
    });
    if go_on {
        status::CONTINUE
    } else {
        status::HEADERS_STOP_ITERATION
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter_envoy: *mut c_void,
    filter: *const c_void,
    end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointer `filter_new` returned, used on its worker only.
    let Some(filter) = (unsafe { stream_filter(filter) }) else {
        return status::CONTINUE;
    };
    // Decided already (routed, or refused and answered): the rest of the body only passes.
    match filter.request.outcome {
        Outcome::Routed(_) => return status::CONTINUE,
        Outcome::Rejected(_) => return status::BODY_STOP_NO_BUFFER,
        Outcome::Pending | Outcome::Held => {}
    }
    let envoy = EnvoyPtr(filter_envoy);
    let body_size = NativeStream::Direct(envoy).request_body_size();
    let go_on = filter.step(envoy, |vm, request| {
        vm.on_request_body(request, body_size, end_of_stream)
    });
    match (go_on, &filter.request.outcome) {
        (true, _) => status::CONTINUE,
        // A refusal was answered: nothing more of the body is kept.
        (false, Outcome::Rejected(_)) => status::BODY_STOP_NO_BUFFER,
        (false, _) => status::BODY_STOP_AND_BUFFER,
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter_envoy: *mut c_void,
    filter: *const c_void,
) -> u32 {
    // SAFETY: the pointer `filter_new` returned, used on its worker only.
    let Some(filter) = (unsafe { stream_filter(filter) }) else {
        return status::CONTINUE;
    };
    if filter.step(EnvoyPtr(filter_envoy), WorkerVm::on_request_trailers) {
        status::CONTINUE
    } else {
        status::TRAILERS_STOP_ITERATION
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: *mut c_void,
    filter: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    // SAFETY: the pointer `filter_new` returned, used on its worker only.
    if let Some(filter) = unsafe { stream_filter(filter) } {
        let own = Own {
            id: filter.request.id(),
            filter: EnvoyPtr(filter_envoy),
            resumed: false,
        };
        let request = &mut filter.request;
        // A local reply the picker sends runs this hook within the picker: nothing to learn.
        filter
            .config_vm
            .run(Some(own), |vm| vm.on_response_headers(request));
    }
    status::CONTINUE
}

/// The stream is gone: its slot (or its place in the queue) is given back. Envoy runs this
/// from its deferred deletes, never within another hook.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: *const c_void) {
    if filter.is_null() {
        return;
    }
    // SAFETY: the pointer `filter_new` returned, destroyed once.
    let mut filter = unsafe { Box::from_raw(filter.cast::<StreamFilter>().cast_mut()) };
    let id = filter.request.id();
    let StreamFilter {
        config_vm: picker,
        request,
    } = &mut *filter;
    picker.run(None, |vm| {
        vm.on_stream_done(request);
        lock(&picker.host.state.streams).forget(id);
    });
}

/// A held stream's worker carries out what the core decided for it, then lets it go on.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    filter_envoy: *mut c_void,
    filter: *const c_void,
    event: u64,
) {
    // SAFETY: the pointer `filter_new` returned, used on its worker only.
    let Some(filter) = (unsafe { stream_filter(filter) }) else {
        return;
    };
    if event != RUN_QUEUED {
        return;
    }
    let queued = lock(&filter.config_vm.host.state.streams).take_queued(filter.request.id());
    if NativeStream::Direct(EnvoyPtr(filter_envoy)).carry_out(queued) {
        if let Some(envoy) = abi::envoy() {
            // SAFETY: this stream's worker, within its hook.
            unsafe { (envoy.http_filter_continue_decoding)(filter_envoy) };
        }
    }
}

/// The hooks Envoy requires of every HTTP filter module, which this picker does not use: the
/// response body and trailers, the end of the stream (the slot is given back at `destroy`,
/// which Envoy never runs within another hook), per-stream callouts and write watermarks.
mod unused_hooks {
    use super::status::CONTINUE;
    use std::ffi::c_void;

    type Envoy = *mut c_void;
    type Module = *const c_void;

    /// Each hook, doing nothing (and letting the stream go on where Envoy expects a status).
    macro_rules! unused_hooks {
        ($($name:ident($($arg:ty),*) $(-> $status:ty = $value:expr)?;)*) => {$(
            #[no_mangle]
            extern "C" fn $name($(_: $arg),*) $(-> $status)? { $($value)? }
        )*};
    }

    unused_hooks! {
        envoy_dynamic_module_on_http_filter_response_body(Envoy, Module, bool) -> u32 = CONTINUE;
        envoy_dynamic_module_on_http_filter_response_trailers(Envoy, Module) -> u32 = CONTINUE;
        envoy_dynamic_module_on_http_filter_stream_complete(Envoy, Module);
        envoy_dynamic_module_on_http_filter_http_callout_done(
            Envoy, Module, u64, u32, Module, usize, Module, usize
        );
        envoy_dynamic_module_on_http_filter_http_stream_headers(
            Envoy, Module, u64, Module, usize, bool
        );
        envoy_dynamic_module_on_http_filter_http_stream_data(Envoy, Module, u64, Module, usize, bool);
        envoy_dynamic_module_on_http_filter_http_stream_trailers(Envoy, Module, u64, Module, usize);
        envoy_dynamic_module_on_http_filter_http_stream_complete(Envoy, Module, u64);
        envoy_dynamic_module_on_http_filter_http_stream_reset(Envoy, Module, u64, u32);
        envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
            Envoy, Module
        );
        envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
            Envoy, Module
        );
    }
}
