//! Load generation: request bodies and a keep-alive client that times each exchange.

use super::http1::Client;
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
        let client = match &mut self.client {
            Some(client) => client,
            None => self
                .client
                .insert(Client::connect(&self.address, Duration::from_secs(60))?),
        };
        let started = Instant::now();
        let mut first_byte = None;
        let headers = [("host", "bench"), ("content-type", "application/json")];
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
