//! The proxy-wasm filter Envoy loads: its root and HTTP contexts forward every callback to the
//! core's [`WorkerVm`], and `abi` carries out what it asks (the host traits, implemented with
//! raw host calls). No decision is made here. The crate is empty on other targets.
#![cfg(all(target_arch = "wasm32", target_os = "wasi"))]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![deny(clippy::indexing_slicing)]

mod abi;
#[cfg(feature = "fault-injection")]
mod fault;

use abi::{EnvoyHost, EnvoyStream};
use inference_picker_core::host::LOG_CRITICAL;
use inference_picker_core::request_driver::{Next, RequestDriver};
use inference_picker_core::vm::{answer_unavailable, WorkerVm};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType};
use std::cell::RefCell;
use std::rc::Rc;

proxy_wasm::main! {{
    let _ = log::set_logger(&abi::LOGGER);
    log::set_max_level(log::LevelFilter::Info);
    // A panic aborts the VM; say why first, at the host's critical level.
    std::panic::set_hook(Box::new(|info| {
        abi::log(LOG_CRITICAL, &format!("inference-picker: panic, the VM aborts: {info}"));
    }));
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(PickerRoot { context_id, vm: None })
    });
}}

type SharedVm = Rc<RefCell<WorkerVm<EnvoyHost>>>;

struct PickerRoot {
    context_id: u32,
    vm: Option<SharedVm>,
}

impl PickerRoot {
    fn with_vm(&self, callback: impl FnOnce(&mut WorkerVm<EnvoyHost>)) {
        let _entered = abi::enter(self.context_id);
        if let Some(mut vm) = self.vm.as_ref().and_then(|vm| vm.try_borrow_mut().ok()) {
            callback(&mut vm);
        }
    }
}

/// Envoy deletes a root context when its configuration goes: its VM leaves the shared state.
impl Drop for PickerRoot {
    fn drop(&mut self) {
        self.with_vm(WorkerVm::retire);
    }
}

impl Context for PickerRoot {
    /// The answer is read here, within the cap the VM gives for that call, and handed over.
    fn on_http_call_response(&mut self, token: u32, headers: usize, body_size: usize, _: usize) {
        self.with_vm(|vm| {
            if let Some(cap) = vm.callout_body_cap(token) {
                let answer = abi::callout_answer(headers, body_size, cap);
                vm.on_callout_response(token, answer);
            }
        });
    }
}

impl RootContext for PickerRoot {
    fn on_configure(&mut self, configuration_size: usize) -> bool {
        abi::sync_log_level();
        let text = match abi::buffer(BufferType::PluginConfiguration, configuration_size) {
            Ok(bytes) => bytes,
            Err(error) => {
                log::error!("inference-picker: reading the configuration: {error}");
                return false;
            }
        };
        match WorkerVm::configure(EnvoyHost, self.context_id, &text) {
            Ok(vm) => {
                // A configuration replaced in place: the old VM leaves the shared state.
                self.with_vm(WorkerVm::retire);
                self.vm = Some(Rc::new(RefCell::new(vm)));
                true
            }
            Err(error) => {
                log::error!("inference-picker: {error}");
                false
            }
        }
    }

    fn on_tick(&mut self) {
        self.with_vm(WorkerVm::on_tick);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(PickerHttp {
            vm: self.vm.clone(),
            request: RequestDriver::new(context_id),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct PickerHttp {
    vm: Option<SharedVm>,
    request: RequestDriver,
}

impl PickerHttp {
    /// Runs one request callback on the VM; without one, the request is answered 503.
    fn run(
        &mut self,
        step: impl FnOnce(&mut WorkerVm<EnvoyHost>, &mut RequestDriver) -> Next,
    ) -> Action {
        let _entered = abi::enter(self.request.id());
        let Some(mut vm) = self.vm.as_ref().and_then(|vm| vm.try_borrow_mut().ok()) else {
            answer_unavailable(&EnvoyStream(self.request.id()));
            return Action::Pause;
        };
        match step(&mut vm, &mut self.request) {
            Next::Continue => Action::Continue,
            Next::Pause => Action::Pause,
        }
    }
}

impl Context for PickerHttp {}

impl HttpContext for PickerHttp {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        #[cfg(feature = "fault-injection")]
        fault::trap_if_asked();
        self.run(|vm, request| vm.on_request_headers(request, end_of_stream))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.run(|vm, request| vm.on_request_body(request, body_size, end_of_stream))
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.run(WorkerVm::on_request_trailers)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let _entered = abi::enter(self.request.id());
        if let Some(Ok(mut vm)) = self.vm.as_ref().map(|vm| vm.try_borrow_mut()) {
            vm.on_response_headers(&mut self.request);
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        let _entered = abi::enter(self.request.id());
        if let Some(Ok(mut vm)) = self.vm.as_ref().map(|vm| vm.try_borrow_mut()) {
            vm.on_stream_done(&mut self.request);
        }
    }
}
