//! The streams the core acts on, each by its id. The stream whose hook runs is reached
//! directly; a stream flow control holds is another thread's (its worker's), so what the core
//! does to it is queued and carried out on that worker, through the stream's scheduler, before
//! it resumes.

use crate::abi::{body, envoy, header_map, EnvoyBuffer, EnvoyHeader, EnvoyPtr, ModuleBuffer};
use crate::abi::{
    ModuleHeader, ATTRIBUTE_DESTINATION_PORT, ATTRIBUTE_UPSTREAM_ADDRESS, METADATA_DYNAMIC,
};
use crate::support::{count, failed, first_bytes, lock, shared, wall_clock_ns};
use inference_picker_core::error_response::{ErrorShape, RequestError};
use inference_picker_core::host::{HeaderPairs, HostCall, HostError, HttpHost, SharedData};
use inference_picker_core::protocol::{
    DESTINATION_HEADER, DROPPED_REASON_HEADER, SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE,
};
use inference_picker_core::vm::answer_no_endpoint;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The GIE protocol's metadata namespace for the picked endpoints, written directly (the wasm
/// filter needs Envoy's header_to_metadata filter for it).
const LB_NAMESPACE: &str = "envoy.lb";

/// The event a held stream's scheduler fires: run what was queued for it.
pub const RUN_QUEUED: u64 = 1;

/// What the core did to a held stream, carried out on its worker.
pub enum Queued {
    SetHeader(String, String),
    RemoveHeader(String),
    ReplaceBody(Vec<u8>),
    SendError(RequestError, ErrorShape),
    Resume,
}

/// A stream flow control holds.
struct Held {
    scheduler: EnvoyPtr,
    /// Its `:path`, read when it was held: a refusal's body is shaped by its API.
    path: Vec<u8>,
    queued: Vec<Queued>,
}

/// The stream whose hook is running.
#[derive(Clone, Copy)]
pub struct Own {
    pub id: u32,
    pub filter: EnvoyPtr,
    /// The core let it go within its own hook: the hook continues instead of stopping.
    pub resumed: bool,
}

/// The stream whose hook runs, and the streams held.
#[derive(Default)]
pub struct Streams {
    own: Option<Own>,
    held: HashMap<u32, Held>,
}

impl Streams {
    /// A hook of stream `own` (or, with `None`, a main-thread callback) starts; `None` again
    /// when it ends.
    pub fn enter(&mut self, own: Option<Own>) {
        self.own = own;
    }

    /// The core let the running hook's own stream go.
    pub fn own_resumed(&self) -> bool {
        self.own.is_some_and(|own| own.resumed)
    }

    /// Stream `id` as the core reaches it: the running hook's own stream directly, a held one
    /// through its worker (counted as a stream call, as proxy-wasm's switch to it is); `None`
    /// when it is neither (its end ran).
    pub fn reach(streams: &Arc<Mutex<Streams>>, id: u32) -> Option<NativeStream> {
        let this = lock(streams);
        match this.own {
            Some(own) if own.id == id => Some(NativeStream::Direct(own.filter)),
            _ if this.held.contains_key(&id) => {
                count(HostCall::Stream);
                let streams = Arc::clone(streams);
                Some(NativeStream::Held { streams, id })
            }
            _ => None,
        }
    }

    pub fn resume(&mut self, id: u32) -> Result<(), HostError> {
        match &mut self.own {
            Some(own) if own.id == id => {
                own.resumed = true;
                Ok(())
            }
            _ => self.queue(id, Queued::Resume),
        }
    }

    /// Keeps stream `id` as held: its worker will be asked to carry out what the core decides.
    ///
    /// # Safety
    /// Call on the stream's worker, within one of its hooks (the scheduler is made there).
    pub unsafe fn hold(
        &mut self,
        id: u32,
        filter: EnvoyPtr,
        path: Vec<u8>,
    ) -> Result<(), HostError> {
        let envoy = envoy().ok_or(failed("http_filter_scheduler_new"))?;
        let scheduler = EnvoyPtr((envoy.http_filter_scheduler_new)(filter.0));
        if scheduler.is_null() {
            return Err(failed("http_filter_scheduler_new"));
        }
        let held = Held {
            scheduler,
            path,
            queued: Vec::new(),
        };
        if let Some(replaced) = self.held.insert(id, held) {
            delete_scheduler(replaced.scheduler);
        }
        Ok(())
    }

    /// The stream ended: forget it.
    pub fn forget(&mut self, id: u32) {
        if let Some(held) = self.held.remove(&id) {
            delete_scheduler(held.scheduler);
        }
    }

    /// What was queued for stream `id`, to carry out on its worker.
    pub fn take_queued(&mut self, id: u32) -> Vec<Queued> {
        self.held
            .get_mut(&id)
            .map(|held| std::mem::take(&mut held.queued))
            .unwrap_or_default()
    }

    fn queue(&mut self, id: u32, action: Queued) -> Result<(), HostError> {
        let held = self.held.get_mut(&id).ok_or(failed("held stream"))?;
        let first = held.queued.is_empty();
        held.queued.push(action);
        if first {
            let envoy = envoy().ok_or(failed("http_filter_scheduler_commit"))?;
            // SAFETY: the scheduler is alive until `forget` deletes it; committing is allowed
            // from any thread and does nothing once the stream is gone.
            unsafe { (envoy.http_filter_scheduler_commit)(held.scheduler.0, RUN_QUEUED) };
        }
        Ok(())
    }
}

fn delete_scheduler(scheduler: EnvoyPtr) {
    if let Some(envoy) = envoy() {
        // SAFETY: a scheduler this module made and has not deleted yet.
        unsafe { (envoy.http_filter_scheduler_delete)(scheduler.0) };
    }
}

/// One stream as the core's request flow sees it.
pub enum NativeStream {
    /// On its own worker, within one of its hooks: Envoy's calls act on it directly.
    Direct(EnvoyPtr),
    /// Held, on another thread's worker: what the core does to it is queued there.
    Held {
        streams: Arc<Mutex<Streams>>,
        id: u32,
    },
}

impl NativeStream {
    /// Carries out what was queued for this (direct) stream; true if it may go on.
    pub fn carry_out(&self, queued: Vec<Queued>) -> bool {
        let mut resume = false;
        for action in queued {
            let done = match action {
                Queued::SetHeader(name, value) => self.set_request_header(&name, &value),
                Queued::RemoveHeader(name) => self.remove_request_header(&name),
                Queued::ReplaceBody(body) => self.replace_request_body(0, &body),
                Queued::SendError(error, shape) => self.send_error(&error, shape),
                Queued::Resume => {
                    resume = true;
                    Ok(())
                }
            };
            if let Err(error) = done {
                // As on the direct path: a decision not written in full is refused, never
                // sent on with what the client wrote.
                log::error!("inference-picker: applying a released decision: {error}");
                answer_no_endpoint(self, "the destination could not be set");
                return false;
            }
        }
        resume
    }

    fn filter(&self, call: &'static str) -> Result<EnvoyPtr, HostError> {
        match self {
            NativeStream::Direct(filter) => Ok(*filter),
            NativeStream::Held { .. } => Err(failed(call)),
        }
    }

    /// Queues `action` for a held stream; `None` when this stream is reached directly.
    fn queue(&self, action: impl FnOnce() -> Queued) -> Option<Result<(), HostError>> {
        match self {
            NativeStream::Held { streams, id } => Some(lock(streams).queue(*id, action())),
            NativeStream::Direct(_) => None,
        }
    }

    /// Answers this (direct) stream here.
    fn send_response(
        &self,
        status: u16,
        mut headers: Vec<ModuleHeader>,
        body: &[u8],
        details: &[u8],
    ) -> Result<(), HostError> {
        count(HostCall::LocalReply);
        let filter = self.filter("http_send_response")?;
        let envoy = envoy().ok_or(failed("http_send_response"))?;
        // SAFETY: this stream's own hook is running; Envoy copies the reply.
        unsafe {
            (envoy.http_send_response)(
                filter.0,
                u32::from(status),
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details),
            );
        }
        Ok(())
    }

    /// Writes a request header (`ModuleBuffer::NULL`: removes it), then has Envoy choose the
    /// route again (a route may match on it, as the multi-pool config's does on the pool
    /// header).
    fn rewrite_request_header(&self, name: &str, value: ModuleBuffer) -> Result<(), HostError> {
        self.set_header(header_map::REQUEST, name, value)?;
        let filter = self.filter("http_clear_route_cache")?;
        let envoy = envoy().ok_or(failed("http_clear_route_cache"))?;
        // SAFETY: this stream's own hook is running.
        unsafe { (envoy.http_clear_route_cache)(filter.0) };
        Ok(())
    }

    fn header(&self, map: u32, name: &str) -> Option<Vec<u8>> {
        count(HostCall::HeaderRead);
        let filter = self.filter("http_get_header").ok()?;
        let envoy = envoy()?;
        let mut value = EnvoyBuffer::EMPTY;
        let key = ModuleBuffer::of(name.as_bytes());
        // SAFETY: this stream's own hook is running; the value is copied before it returns.
        unsafe {
            let found =
                (envoy.http_get_header)(filter.0, map, key, &mut value, 0, std::ptr::null_mut());
            (found && !value.ptr.is_null()).then(|| value.bytes().to_vec())
        }
    }

    fn set_header(&self, map: u32, name: &str, value: ModuleBuffer) -> Result<(), HostError> {
        let filter = self.filter("http_set_header")?;
        let envoy = envoy().ok_or(failed("http_set_header"))?;
        let key = ModuleBuffer::of(name.as_bytes());
        // SAFETY: this stream's own hook is running; Envoy copies the buffers.
        let done = unsafe { (envoy.http_set_header)(filter.0, map, key, value) };
        done.then_some(()).ok_or(failed("http_set_header"))
    }

    /// A destination header's value into `envoy.lb`, under the header's name.
    fn set_lb_metadata(&self, filter: EnvoyPtr, name: &str, value: &str) -> Result<(), HostError> {
        let envoy = envoy().ok_or(failed("http_set_dynamic_metadata_string"))?;
        let (namespace, key) = (LB_NAMESPACE.as_bytes(), name.as_bytes());
        // SAFETY: this stream's own hook is running; Envoy copies the buffers.
        unsafe {
            (envoy.http_set_dynamic_metadata_string)(
                filter.0,
                ModuleBuffer::of(namespace),
                ModuleBuffer::of(key),
                ModuleBuffer::of(value.as_bytes()),
            );
        }
        Ok(())
    }

    /// The request body's chunks: what Envoy buffered, then the chunk of this callback.
    fn body_chunks(&self, filter: EnvoyPtr) -> Vec<&[u8]> {
        let Some(envoy) = envoy() else {
            return Vec::new();
        };
        // SAFETY: this stream's own hook is running.
        let released = unsafe { (envoy.http_received_buffered_request_body)(filter.0) };
        // A buffer an earlier filter released arrives as the received chunk: read it once.
        let kinds: &[u32] = if released {
            &[body::RECEIVED_REQUEST]
        } else {
            &[body::BUFFERED_REQUEST, body::RECEIVED_REQUEST]
        };
        let mut chunks = Vec::new();
        for &kind in kinds {
            // SAFETY: as above; the slices live until the hook returns or the body changes,
            // and the caller copies them first.
            unsafe {
                let size = (envoy.http_get_body_chunks_size)(filter.0, kind);
                let mut buffers = vec![EnvoyBuffer::EMPTY; size];
                if size > 0 && (envoy.http_get_body_chunks)(filter.0, kind, buffers.as_mut_ptr()) {
                    chunks.extend(buffers.into_iter().map(|buffer| buffer.bytes()));
                }
            }
        }
        chunks
    }

    /// The request body's size now (both parts, as [`HttpHost::request_body`] reads it),
    /// without reading it.
    pub fn request_body_size(&self) -> usize {
        let (Ok(filter), Some(envoy)) = (self.filter("http_get_body_size"), envoy()) else {
            return 0;
        };
        // SAFETY: this stream's own hook is running.
        unsafe {
            let received = (envoy.http_get_body_size)(filter.0, body::RECEIVED_REQUEST);
            if (envoy.http_received_buffered_request_body)(filter.0) {
                return received;
            }
            received + (envoy.http_get_body_size)(filter.0, body::BUFFERED_REQUEST)
        }
    }
}

impl HttpHost for NativeStream {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        if let NativeStream::Held { streams, id } = self {
            // A held stream's only header read: its path, for the shape of a refusal.
            let streams = lock(streams);
            let held = streams.held.get(id).filter(|_| name == ":path")?;
            return Some(held.path.clone());
        }
        self.header(header_map::REQUEST, name)
    }

    fn request_headers(&self) -> Option<HeaderPairs> {
        count(HostCall::HeaderRead);
        let filter = self.filter("http_get_headers").ok()?;
        let envoy = envoy()?;
        // SAFETY: this stream's own hook is running; the pairs are copied before it returns.
        unsafe {
            let size = (envoy.http_get_headers_size)(filter.0, header_map::REQUEST);
            let mut headers = vec![EnvoyHeader::EMPTY; size];
            if size > 0
                && !(envoy.http_get_headers)(filter.0, header_map::REQUEST, headers.as_mut_ptr())
            {
                return None;
            }
            Some(HeaderPairs::from_pairs(
                headers.into_iter().map(|header| header.pair()),
            ))
        }
    }

    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        if let Some(queued) = self.queue(|| Queued::SetHeader(name.into(), value.into())) {
            return queued;
        }
        count(HostCall::HeaderWrite);
        self.rewrite_request_header(name, ModuleBuffer::of(value.as_bytes()))?;
        // Every GIE destination header (the pick, its fallbacks, its scores) goes into
        // envoy.lb too, as the wasm filter's header_to_metadata step copies them.
        if name.starts_with(DESTINATION_HEADER) {
            self.set_lb_metadata(
                self.filter("http_set_dynamic_metadata_string")?,
                name,
                value,
            )?;
        }
        Ok(())
    }

    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        if let Some(queued) = self.queue(|| Queued::RemoveHeader(name.into())) {
            return queued;
        }
        count(HostCall::HeaderRemove);
        self.rewrite_request_header(name, ModuleBuffer::NULL)
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        count(HostCall::BodyRead);
        let filter = self.filter("http_get_body_chunks")?;
        Ok(first_bytes(self.body_chunks(filter), size))
    }

    /// Replaces the whole body: drains both parts, then appends where the body continues (the
    /// chunk of a body callback, else the buffer).
    fn replace_request_body(&self, _size: usize, body: &[u8]) -> Result<(), HostError> {
        if let Some(queued) = self.queue(|| Queued::ReplaceBody(body.to_vec())) {
            return queued;
        }
        count(HostCall::BodyWrite);
        let filter = self.filter("http_drain_body")?;
        let envoy = envoy().ok_or(failed("http_drain_body"))?;
        // SAFETY: this stream's own hook is running; Envoy copies the appended bytes.
        unsafe {
            for kind in [body::BUFFERED_REQUEST, body::RECEIVED_REQUEST] {
                let size = (envoy.http_get_body_size)(filter.0, kind);
                (envoy.http_drain_body)(filter.0, kind, size);
            }
            let appended =
                (envoy.http_append_body)(filter.0, body::RECEIVED_REQUEST, ModuleBuffer::of(body))
                    || (envoy.http_append_body)(
                        filter.0,
                        body::BUFFERED_REQUEST,
                        ModuleBuffer::of(body),
                    );
            appended.then_some(()).ok_or(failed("http_append_body"))
        }
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.header(header_map::RESPONSE, name)
    }

    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        count(HostCall::HeaderWrite);
        self.set_header(
            header_map::RESPONSE,
            name,
            ModuleBuffer::of(value.as_bytes()),
        )
    }

    fn upstream_address(&self) -> Option<String> {
        count(HostCall::Property);
        let filter = self.filter("http_filter_get_attribute_string").ok()?;
        let envoy = envoy()?;
        let mut value = EnvoyBuffer::EMPTY;
        // SAFETY: this stream's own hook is running; the value is copied before it returns.
        let bytes = unsafe {
            let found = (envoy.http_filter_get_attribute_string)(
                filter.0,
                ATTRIBUTE_UPSTREAM_ADDRESS,
                &mut value,
            );
            found.then(|| value.bytes().to_vec())?
        };
        String::from_utf8(bytes)
            .ok()
            .filter(|address| !address.is_empty())
    }

    /// GIE's hint is a list of addresses; a plain string is read too. The core parses the
    /// addresses separated by commas.
    fn subset_hint(&self) -> Option<Vec<u8>> {
        count(HostCall::Property);
        let filter = self.filter("http_get_metadata_list_size").ok()?.0;
        let envoy = envoy()?;
        let namespace = ModuleBuffer::of(SUBSET_HINT_NAMESPACE.as_bytes());
        let key = ModuleBuffer::of(SUBSET_HINT_KEY.as_bytes());
        let mut value = EnvoyBuffer::EMPTY;
        let mut size = 0usize;
        // SAFETY: this stream's own hook is running; each value is copied before it returns.
        unsafe {
            if !(envoy.http_get_metadata_list_size)(
                filter,
                METADATA_DYNAMIC,
                namespace,
                key,
                &mut size,
            ) {
                let found = (envoy.http_get_metadata_string)(
                    filter,
                    METADATA_DYNAMIC,
                    namespace,
                    key,
                    &mut value,
                );
                return found.then(|| value.bytes().to_vec());
            }
            let mut addresses = Vec::new();
            for index in 0..size {
                if (envoy.http_get_metadata_list_string)(
                    filter,
                    METADATA_DYNAMIC,
                    namespace,
                    key,
                    index,
                    &mut value,
                ) {
                    if !addresses.is_empty() {
                        addresses.push(b',');
                    }
                    addresses.extend_from_slice(value.bytes());
                }
            }
            Some(addresses)
        }
    }

    fn destination_port(&self) -> Option<u16> {
        count(HostCall::Property);
        let filter = self.filter("http_filter_get_attribute_int").ok()?;
        let envoy = envoy()?;
        let mut port = 0u64;
        // SAFETY: this stream's own hook is running; Envoy writes one integer.
        let found = unsafe {
            (envoy.http_filter_get_attribute_int)(filter.0, ATTRIBUTE_DESTINATION_PORT, &mut port)
        };
        found.then(|| u16::try_from(port).ok()).flatten()
    }

    /// Only ever from the request-headers hook of the stream itself (a peer's call).
    fn send_answer(&self, status: u16, body: &[u8]) -> Result<(), HostError> {
        let headers = vec![ModuleHeader::of("content-type", "application/octet-stream")];
        self.send_response(status, headers, body, b"inference_picker_peer")
    }

    fn send_error(&self, error: &RequestError, shape: ErrorShape) -> Result<(), HostError> {
        if let Some(queued) = self.queue(|| Queued::SendError(error.clone(), shape)) {
            return queued;
        }
        let mut headers = vec![ModuleHeader::of("content-type", "application/json")];
        if let Some(reason) = error.dropped_reason() {
            headers.push(ModuleHeader::of(DROPPED_REASON_HEADER, reason));
        }
        let body = error.to_json_for(shape);
        self.send_response(error.status(), headers, &body, b"inference_picker")
    }

    fn now_ms(&self) -> u64 {
        wall_clock_ns().map_or(0, |nanos| nanos / 1_000_000)
    }

    fn shared_data(&self) -> &dyn SharedData {
        shared()
    }
}
