//! In-memory hosts for native tests: HTTP headers and bodies, shared data with Envoy's CAS
//! semantics, HTTP callouts whose answers the test delivers, and a settable clock.

use super::{
    Clock, HostCall, HostError, HttpCallouts, HttpHost, MemoryReported, MetricKind, Metrics,
    SharedData, VmHost,
};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// One request's headers and body; records the headers read and the local reply sent.
#[derive(Default)]
pub struct FakeHost {
    pub headers: RefCell<HashMap<String, String>>,
    pub response_headers: RefCell<HashMap<String, String>>,
    pub body: RefCell<Vec<u8>>,
    pub reply: RefCell<Option<(u16, Vec<u8>)>>,
    pub fail_set_header: bool,
    pub reads: RefCell<Vec<String>>,
    /// What `upstream_address` answers.
    pub upstream: RefCell<Option<String>>,
    /// What `subset_hint` answers.
    pub subset_hint: RefCell<Option<Vec<u8>>>,
    /// What `destination_port` answers.
    pub destination_port: std::cell::Cell<Option<u16>>,
    pub now_ms: Cell<u64>,
    pub shared: FakeShared,
}

impl HttpHost for FakeHost {
    fn request_headers(&self) -> Option<super::HeaderPairs> {
        self.reads.borrow_mut().push("*".to_string());
        let headers = self.headers.borrow();
        let pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        super::HeaderPairs::decode(super::encode_header_map(&pairs))
    }

    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.reads.borrow_mut().push(name.to_string());
        self.headers
            .borrow()
            .get(name)
            .map(|v| v.as_bytes().to_vec())
    }
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        if self.fail_set_header {
            return Err(HostError {
                call: "set",
                status: 2,
            });
        }
        self.headers.borrow_mut().insert(name.into(), value.into());
        Ok(())
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        self.headers.borrow_mut().remove(name);
        Ok(())
    }
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let body = self.body.borrow();
        Ok(body
            .get(..size.min(body.len()))
            .unwrap_or_default()
            .to_vec())
    }
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
        let mut buffered = self.body.borrow_mut();
        let size = size.min(buffered.len());
        buffered.splice(..size, body.iter().copied());
        Ok(())
    }
    fn upstream_address(&self) -> Option<String> {
        self.upstream.borrow().clone()
    }
    fn subset_hint(&self) -> Option<Vec<u8>> {
        self.subset_hint.borrow().clone()
    }
    fn destination_port(&self) -> Option<u16> {
        self.destination_port.get()
    }
    fn send_answer(&self, status: u16, body: &[u8]) -> Result<(), HostError> {
        *self.reply.borrow_mut() = Some((status, body.to_vec()));
        Ok(())
    }
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.response_headers
            .borrow()
            .get(name)
            .map(|v| v.as_bytes().to_vec())
    }
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.response_headers
            .borrow_mut()
            .insert(name.into(), value.into());
        Ok(())
    }
    fn send_error(
        &self,
        error: &crate::error_response::RequestError,
        shape: crate::error_response::ErrorShape,
    ) -> Result<(), HostError> {
        *self.reply.borrow_mut() = Some((error.status(), error.to_json_for(shape)));
        Ok(())
    }
    fn now_ms(&self) -> u64 {
        self.now_ms.get()
    }
    fn shared_data(&self) -> &dyn SharedData {
        &self.shared
    }
}

/// Envoy's shared data semantics, in memory (the store the native module shares process-wide).
pub type FakeShared = super::SharedMemory;

/// Shared data that keeps nothing: a process with one VM and no flow control, where no
/// other VM reads what this one writes.
pub struct NoSharedData;

impl SharedData for NoSharedData {
    fn get(&self, _key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        Ok(None)
    }
    fn set(&self, _key: &str, _value: &[u8], _cas: Option<u32>) -> Result<bool, HostError> {
        Ok(true)
    }
}

/// A callout the code under test sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCall {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub timeout_ms: u32,
}

impl SentCall {
    /// The host the call went to (its `:authority`): a pod's `ip:port` for a scrape.
    pub fn authority(&self) -> Option<&str> {
        let header = self.headers.iter().find(|(name, _)| name == ":authority");
        header.map(|(_, value)| value.as_str())
    }
}

/// Records dispatched callouts; a test then reads an answer with [`answer`], as an edge does,
/// and hands it to the code's response handler. Dispatches fail once `capacity` calls are in
/// flight (sent and not answered), as Envoy's do past a cluster's circuit breakers.
///
/// [`answer`]: FakeCallouts::answer
pub struct FakeCallouts {
    pub sent: RefCell<Vec<SentCall>>,
    next_token: Cell<u32>,
    pub capacity: Cell<usize>,
    /// Tokens sent and not answered yet.
    pub in_flight: RefCell<HashSet<u32>>,
    /// Dispatches refused so far.
    pub refused: Cell<usize>,
    /// Bytes of answers' bodies copied out, over all calls.
    pub body_bytes_read: Cell<usize>,
}

impl Default for FakeCallouts {
    fn default() -> Self {
        FakeCallouts {
            sent: RefCell::new(Vec::new()),
            next_token: Cell::new(1),
            capacity: Cell::new(usize::MAX),
            in_flight: RefCell::new(HashSet::new()),
            refused: Cell::new(0),
            body_bytes_read: Cell::new(0),
        }
    }
}

impl FakeCallouts {
    /// The answer to call `token` (no longer in flight), read as an edge reads it with the
    /// core's `cap`: a status (`None`: a timeout or a reset) and a body.
    pub fn answer(
        &self,
        token: u32,
        status: Option<&str>,
        body: &str,
        cap: usize,
    ) -> super::CalloutAnswer {
        self.in_flight.borrow_mut().remove(&token);
        let read_status = || status.map(|s| s.as_bytes().to_vec());
        let read_body = |size: usize| {
            let read = body.as_bytes().get(..size).unwrap_or_default();
            let copied = self.body_bytes_read.get().saturating_add(read.len());
            self.body_bytes_read.set(copied);
            Ok(read.to_vec())
        };
        super::CalloutAnswer::read(status.is_some(), body.len(), cap, read_status, read_body)
    }

    /// Forgets the calls seen so far (the test answered or abandoned them).
    pub fn take_sent(&self) -> Vec<SentCall> {
        std::mem::take(&mut *self.sent.borrow_mut())
    }

    /// The token of the call sent to `authority`, if one was.
    pub fn token_for(&self, authority: &str) -> Option<u32> {
        let sent = self.sent.borrow();
        let call = sent.iter().find(|call| call.authority() == Some(authority));
        call.map(|call| call.token)
    }
}

impl HttpCallouts for FakeCallouts {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        if self.in_flight.borrow().len() >= self.capacity.get() {
            self.refused.set(self.refused.get() + 1);
            return Err(HostError {
                call: "dispatch_http_call",
                status: 1,
            });
        }
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        self.in_flight.borrow_mut().insert(token);
        self.sent.borrow_mut().push(SentCall {
            token,
            cluster: cluster.into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            timeout_ms,
        });
        Ok(token)
    }
}

/// A clock the test moves.
#[derive(Default)]
pub struct FakeClock(pub Cell<u64>);

impl FakeClock {
    pub fn advance(&self, ms: u64) {
        self.0.set(self.0.get() + ms);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> Result<u64, HostError> {
        Ok(self.0.get())
    }
}

/// Envoy stats in memory, by the name they were defined with: counters add up, gauges keep the
/// last value, histograms keep every sample.
#[derive(Default)]
pub struct FakeMetrics {
    defined: RefCell<Vec<(MetricKind, String)>>,
    values: RefCell<HashMap<u32, i64>>,
    samples: RefCell<HashMap<u32, Vec<u64>>>,
}

impl FakeMetrics {
    fn id(&self, name: &str) -> Option<u32> {
        let position = self.defined.borrow().iter().position(|(_, n)| n == name)?;
        u32::try_from(position + 1).ok()
    }

    fn kind(&self, id: u32) -> Option<MetricKind> {
        let index = usize::try_from(id).ok()?.checked_sub(1)?;
        self.defined.borrow().get(index).map(|(kind, _)| *kind)
    }

    /// A counter's total or a gauge's value; `None` when never defined or never set.
    pub fn value(&self, name: &str) -> Option<i64> {
        self.values.borrow().get(&self.id(name)?).copied()
    }

    /// A histogram's samples, in order.
    pub fn samples(&self, name: &str) -> Vec<u64> {
        self.id(name)
            .and_then(|id| self.samples.borrow().get(&id).cloned())
            .unwrap_or_default()
    }
}

impl Metrics for FakeMetrics {
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        if let Some(id) = self.id(name) {
            return Ok(id);
        }
        self.defined.borrow_mut().push((kind, name.to_owned()));
        Ok(u32::try_from(self.defined.borrow().len()).unwrap_or(u32::MAX))
    }

    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError> {
        *self.values.borrow_mut().entry(id).or_default() += offset;
        Ok(())
    }

    fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        if self.kind(id) == Some(MetricKind::Histogram) {
            self.samples.borrow_mut().entry(id).or_default().push(value);
        } else {
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            self.values.borrow_mut().insert(id, value);
        }
        Ok(())
    }
}

/// A worker VM's whole host in memory: the process's shared data, this VM's callouts, stats
/// and tick period, a clock the test moves, and the VM's streams by id. Clones are the same
/// host.
#[derive(Clone, Default)]
pub struct FakeVm(Rc<FakeVmState>);

#[derive(Default)]
pub struct FakeVmState {
    /// The process's shared data, shared with [`FakeVm::beside`]s.
    pub shared: Rc<FakeShared>,
    pub callouts: FakeCallouts,
    /// The process's clock, shared with [`FakeVm::beside`]s.
    pub clock: Rc<FakeClock>,
    pub metrics: FakeMetrics,
    /// The period the VM last set for its tick.
    pub tick_period_ms: Cell<Option<u32>>,
    pub memory_bytes: Cell<u64>,
    pub memory_reported: MemoryReported,
    streams: RefCell<HashMap<u32, Rc<FakeHost>>>,
    /// Streams whose end ran: they are gone to the VM.
    closed: RefCell<HashSet<u32>>,
    /// Streams resumed, in order.
    pub resumed: RefCell<Vec<u32>>,
}

impl std::ops::Deref for FakeVm {
    type Target = FakeVmState;
    fn deref(&self) -> &FakeVmState {
        &self.0
    }
}

/// What a stream call on a gone stream answers (proxy-wasm's `NotFound`).
const STREAM_GONE: HostError = HostError {
    call: "stream",
    status: 1,
};

impl FakeVm {
    /// A VM in a process with this shared data and clock.
    pub fn in_process(shared: Rc<FakeShared>, clock: Rc<FakeClock>) -> Self {
        FakeVm(Rc::new(FakeVmState {
            shared,
            clock,
            ..FakeVmState::default()
        }))
    }

    /// Another worker VM of the same process: the same shared data and clock, its own
    /// callouts, stats and streams.
    pub fn beside(&self) -> Self {
        FakeVm::in_process(Rc::clone(&self.shared), Rc::clone(&self.clock))
    }

    /// Opens stream `id` with these request headers and body.
    pub fn open_stream(&self, id: u32, headers: &[(&str, &str)], body: &str) -> Rc<FakeHost> {
        let stream = Rc::new(FakeHost::default());
        for (name, value) in headers {
            stream
                .headers
                .borrow_mut()
                .insert((*name).to_owned(), (*value).to_owned());
        }
        *stream.body.borrow_mut() = body.as_bytes().to_vec();
        self.streams.borrow_mut().insert(id, Rc::clone(&stream));
        stream
    }

    /// Stream `id`'s own state, unless it is gone (or was never opened).
    fn open(&self, id: u32) -> Option<Rc<FakeHost>> {
        if self.closed.borrow().contains(&id) {
            return None;
        }
        self.streams.borrow().get(&id).cloned()
    }

    /// The status of the local reply sent on stream `id`, if one was.
    pub fn stream_reply(&self, id: u32) -> Option<u16> {
        let stream = self.streams.borrow().get(&id).cloned()?;
        let reply = stream.reply.borrow();
        reply.as_ref().map(|(status, _)| *status)
    }

    /// Stream `id` is gone: its end ran (or its client reset it) and the VM cannot reach it.
    pub fn close_stream(&self, id: u32) {
        self.closed.borrow_mut().insert(id);
    }
}

impl SharedData for FakeVm {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        self.shared.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        self.shared.set(key, value, cas)
    }
}

impl HttpCallouts for FakeVm {
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        timeout_ms: u32,
    ) -> Result<u32, HostError> {
        self.callouts.dispatch(cluster, headers, timeout_ms)
    }
}

impl Metrics for FakeVm {
    fn define(&self, kind: MetricKind, name: &str) -> Result<u32, HostError> {
        self.metrics.define(kind, name)
    }
    fn increment(&self, id: u32, offset: i64) -> Result<(), HostError> {
        self.metrics.increment(id, offset)
    }
    fn record(&self, id: u32, value: u64) -> Result<(), HostError> {
        self.metrics.record(id, value)
    }
}

impl Clock for FakeVm {
    fn now_ms(&self) -> Result<u64, HostError> {
        self.clock.now_ms()
    }
}

impl VmHost for FakeVm {
    type Stream = FakeStream;

    fn stream(&self, id: u32) -> Option<FakeStream> {
        self.open(id)?;
        Some(FakeStream {
            vm: self.clone(),
            id,
        })
    }

    fn resume(&self, id: u32) -> Result<(), HostError> {
        self.open(id).ok_or(STREAM_GONE)?;
        self.resumed.borrow_mut().push(id);
        Ok(())
    }

    fn set_tick_period_ms(&self, period_ms: u32) -> Result<(), HostError> {
        self.tick_period_ms.set(Some(period_ms));
        Ok(())
    }

    fn now_ns(&self) -> Result<u64, HostError> {
        Ok(self.clock.0.get().saturating_mul(1_000_000))
    }

    fn memory_bytes(&self) -> u64 {
        self.memory_bytes.get()
    }

    /// Tests pick the same way on every run: each fake VM's id comes from its clock and root id.
    fn entropy(&self) -> u64 {
        0
    }

    /// Each fake VM its own address space (tests run side by side in one process).
    fn memory_reported(&self) -> &MemoryReported {
        &self.memory_reported
    }

    fn take_host_calls(&self) -> [u64; HostCall::ALL.len()] {
        [0; HostCall::ALL.len()]
    }

    fn sync_log_level(&self) {}
}

/// One stream of a [`FakeVm`], by id: each call fails (or finds nothing) once the stream is
/// gone.
pub struct FakeStream {
    vm: FakeVm,
    id: u32,
}

impl FakeStream {
    fn with<T>(&self, gone: T, call: impl FnOnce(&FakeHost) -> T) -> T {
        match self.vm.open(self.id) {
            Some(stream) => call(&stream),
            None => gone,
        }
    }
}

impl HttpHost for FakeStream {
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.with(None, |s| s.request_header(name))
    }
    fn request_headers(&self) -> Option<super::HeaderPairs> {
        self.with(None, HttpHost::request_headers)
    }
    fn set_request_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.set_request_header(name, value))
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.remove_request_header(name))
    }
    fn request_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        self.with(Err(STREAM_GONE), |s| s.request_body(size))
    }
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.replace_request_body(size, body))
    }
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.with(None, |s| s.response_header(name))
    }
    fn set_response_header(&self, name: &str, value: &str) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.set_response_header(name, value))
    }
    fn upstream_address(&self) -> Option<String> {
        self.with(None, HttpHost::upstream_address)
    }
    fn subset_hint(&self) -> Option<Vec<u8>> {
        self.with(None, HttpHost::subset_hint)
    }
    fn destination_port(&self) -> Option<u16> {
        self.with(None, HttpHost::destination_port)
    }
    fn send_answer(&self, status: u16, body: &[u8]) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.send_answer(status, body))
    }
    fn send_error(
        &self,
        error: &crate::error_response::RequestError,
        shape: crate::error_response::ErrorShape,
    ) -> Result<(), HostError> {
        self.with(Err(STREAM_GONE), |s| s.send_error(error, shape))
    }
    fn now_ms(&self) -> u64 {
        self.vm.clock.0.get()
    }
    fn shared_data(&self) -> &dyn SharedData {
        &*self.vm.shared
    }
}

/// A `log` backend that keeps, per thread, the warnings (and errors) logged while a test
/// captures them: for tests that bound how much the code logs.
struct CaptureLogger;

thread_local! {
    static CAPTURED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

impl log::Log for CaptureLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            CAPTURED.with(|captured| {
                if let Some(lines) = captured.borrow_mut().as_mut() {
                    lines.push(record.args().to_string());
                }
            });
        }
    }

    fn flush(&self) {}
}

static CAPTURE: CaptureLogger = CaptureLogger;

/// Runs `f` and returns what it returned and the warning lines it logged on this thread.
pub fn capture_warnings<R>(f: impl FnOnce() -> R) -> (R, Vec<String>) {
    let _ = log::set_logger(&CAPTURE);
    if log::max_level() < log::LevelFilter::Warn {
        log::set_max_level(log::LevelFilter::Warn);
    }
    CAPTURED.with(|captured| *captured.borrow_mut() = Some(Vec::new()));
    let result = f();
    let lines = CAPTURED.with(|captured| captured.borrow_mut().take().unwrap_or_default());
    (result, lines)
}
