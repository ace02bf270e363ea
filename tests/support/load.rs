//! Load generation: request bodies and a keep-alive client that times each exchange.

use super::http1::Client;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A completions body with a prompt unique to `n`, so prefix affinity does not interfere.
pub fn completion(n: usize) -> String {
    format!(r#"{{"model":"{MODEL}","prompt":"request number {n}: say hello","max_tokens":4}}"#)
}

/// What one request through a [`KeepAlive`] connection measured.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub status: u16,
    /// The pod that served it (`x-inference-pod`), `-` if none.
    pub pod: String,
    /// Until the first body bytes (for a stream: the first token's chunk).
    pub first_byte: Duration,
    pub total: Duration,
}

/// One HTTP/1.1 keep-alive connection for load generation; reconnects after an error or when
/// the server closes.
pub struct KeepAlive {
    address: String,
    client: Option<Client>,
}

impl KeepAlive {
    pub fn new(address: &str) -> KeepAlive {
        KeepAlive {
            address: address.to_string(),
            client: None,
        }
    }

    pub fn post(&mut self, path: &str, body: &str) -> std::io::Result<Exchange> {
        self.post_with(path, &[], body)
    }

    /// [`KeepAlive::post`] with more request headers.
    pub fn post_with(
        &mut self,
        path: &str,
        extra: &[(&str, &str)],
        body: &str,
    ) -> std::io::Result<Exchange> {
        let client = match &mut self.client {
            Some(client) => client,
            None => self
                .client
                .insert(Client::connect(&self.address, Duration::from_secs(60))?),
        };
        let started = Instant::now();
        let mut first_byte = None;
        let mut headers = vec![("host", "bench"), ("content-type", "application/json")];
        headers.extend_from_slice(extra);
        let result = client.send("POST", path, &headers, body.as_bytes(), &mut |_| {
            first_byte.get_or_insert_with(|| started.elapsed());
        });
        let total = started.elapsed();
        if result.is_err() || client.is_closed() {
            self.client = None;
        }
        let response = result?;
        Ok(Exchange {
            status: response.status,
            pod: response
                .header("x-inference-pod")
                .unwrap_or("-")
                .to_string(),
            first_byte: first_byte.unwrap_or(total),
            total,
        })
    }
}

/// What a [`BackgroundLoad`] request got: its status (0: no response) and serving pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub status: u16,
    pub pod: String,
    /// When the response arrived.
    pub at: Instant,
}

/// Keep-alive clients posting completions through a gateway until finished, each response
/// recorded: load across an event (a pod dying) in the tests and the soak.
pub struct BackgroundLoad {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    served: Arc<Mutex<Vec<Served>>>,
    threads: Vec<JoinHandle<()>>,
}

impl BackgroundLoad {
    pub fn start(address: &str, clients: usize) -> BackgroundLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|_| {
                let (stop, sent, served) = (stop.clone(), sent.clone(), served.clone());
                let mut client = KeepAlive::new(address);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let n = sent.fetch_add(1, Ordering::Relaxed);
                        let outcome = client.post("/v1/completions", &completion(n));
                        let (status, pod) = outcome
                            .map(|e| (e.status, e.pod))
                            .unwrap_or((0, "no response".into()));
                        let at = Instant::now();
                        let mut served = served.lock().unwrap_or_else(|p| p.into_inner());
                        served.push(Served { status, pod, at });
                    }
                })
            })
            .collect();
        BackgroundLoad {
            stop,
            sent,
            served,
            threads,
        }
    }

    /// Responses so far.
    pub fn answered(&self) -> usize {
        self.served.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Some response so far satisfies `test`.
    pub fn any(&self, test: impl Fn(&Served) -> bool) -> bool {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        served.iter().any(test)
    }

    /// Waits (up to 30 s) until `count` responses have arrived in all.
    pub fn wait_for(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answered() < count {
            assert!(
                Instant::now() < deadline,
                "the load stalled at {}",
                self.answered()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops the clients and returns every response, in arrival order.
    pub fn finish(mut self) -> Vec<Served> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *served)
    }
}

impl Drop for BackgroundLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
