//! In-memory hosts for native tests: HTTP headers and bodies, shared data with Envoy's CAS
//! semantics, HTTP callouts whose answers the test delivers, and a settable clock.

use super::{Clock, HostError, HttpCallouts, HttpHost, SharedData};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

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
        Ok(body[..size.min(body.len())].to_vec())
    }
    fn replace_request_body(&self, size: usize, body: &[u8]) -> Result<(), HostError> {
        self.body.borrow_mut().splice(..size, body.iter().copied());
        Ok(())
    }
    fn upstream_address(&self) -> Option<String> {
        self.upstream.borrow().clone()
    }
    fn subset_hint(&self) -> Option<Vec<u8>> {
        self.subset_hint.borrow().clone()
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

/// Envoy's shared data semantics: a CAS token per key, bumped on every write.
#[derive(Default)]
pub struct FakeShared {
    data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
}

impl SharedData for FakeShared {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        Ok(self.data.borrow().get(key).cloned())
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        let mut data = self.data.borrow_mut();
        let current = data.get(key).map_or(0, |(_, c)| *c);
        if cas.is_some_and(|cas| cas != current) {
            return Ok(false);
        }
        data.insert(key.into(), (value.to_vec(), current + 1));
        Ok(true)
    }
}

/// A callout's answer: its `:status` (`None`: timeout or reset) and its body.
type Answer = (Option<Vec<u8>>, Vec<u8>);

/// A callout the code under test sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCall {
    pub token: u32,
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub timeout_ms: u32,
}

/// Records dispatched callouts; a test then sets the answer being delivered with [`answer`]
/// and calls the code's response handler. Dispatches fail once `capacity` calls are in flight
/// (sent and not answered), as Envoy's do past a cluster's circuit breakers.
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
    delivering: RefCell<Option<Answer>>,
    /// Bytes copied out by `response_body`, over all calls.
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
            delivering: RefCell::new(None),
            body_bytes_read: Cell::new(0),
        }
    }
}

impl FakeCallouts {
    /// The answer the next response callback sees, for the call `token` (no longer in
    /// flight): a status (`None`: timeout or reset) and a body.
    pub fn answer(&self, token: u32, status: Option<&str>, body: &str) {
        self.in_flight.borrow_mut().remove(&token);
        *self.delivering.borrow_mut() = Some((
            status.map(|s| s.as_bytes().to_vec()),
            body.as_bytes().to_vec(),
        ));
    }

    /// Forgets the calls seen so far (the test answered or abandoned them).
    pub fn take_sent(&self) -> Vec<SentCall> {
        std::mem::take(&mut *self.sent.borrow_mut())
    }

    /// The token of the call sent to `authority`, if one was.
    pub fn token_for(&self, authority: &str) -> Option<u32> {
        self.sent.borrow().iter().find_map(|call| {
            call.headers
                .iter()
                .any(|(name, value)| name == ":authority" && value == authority)
                .then_some(call.token)
        })
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

    fn response_status(&self) -> Option<Vec<u8>> {
        self.delivering
            .borrow()
            .as_ref()
            .and_then(|(s, _)| s.clone())
    }

    fn response_body(&self, size: usize) -> Result<Vec<u8>, HostError> {
        let delivering = self.delivering.borrow();
        let body = delivering.as_ref().map_or(&[][..], |(_, b)| b.as_slice());
        let read = body.get(..size.min(body.len())).unwrap_or_default();
        self.body_bytes_read
            .set(self.body_bytes_read.get().saturating_add(read.len()));
        Ok(read.to_vec())
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
