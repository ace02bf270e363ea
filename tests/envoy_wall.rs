//! The pool is a hard wall: through each shipped Envoy config, over HTTP/1.1 and HTTP/2
//! (h2c with prior knowledge), however the request stream ends (headers, data, trailers after
//! data, trailers alone) and whatever protocol headers the client sends, no connection ever
//! reaches an address outside the pool. A canary listener the client names counts connections.

mod support;

use serde_json::Value;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use support::{
    http1, picker_config_of, repo, with_endpoints, with_pool_endpoints, Envoy, Sim, MODEL,
};

/// A loopback listener that counts the connections it accepts.
struct Canary {
    address: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Canary {
    fn start() -> Canary {
        let listener = TcpListener::bind("127.0.0.1:0").expect("canary listener");
        listener.set_nonblocking(true).expect("non-blocking");
        let address = listener.local_addr().expect("address").to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, stopping) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Canary {
            address,
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every request header a client could use to steer the request.
fn steering_headers(target: &str) -> Vec<(&'static str, String)> {
    [
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-fallback",
        "x-gateway-destination-endpoint-fallbacks",
        "x-gateway-destination-endpoint-subset",
        "x-envoy-original-dst-host",
        "x-prefiller-host-port",
    ]
    .into_iter()
    .map(|name| (name, target.to_owned()))
    .collect()
}

struct Answer {
    status: u16,
    pod: Option<String>,
    body: String,
}

/// One HTTP/2 request through `tests/h2/client.py` (Python's `h2`, installed by `make envoy`).
fn h2(envoy: &Envoy, path: &str, ending: &str, body: &str, headers: &[(&str, String)]) -> Answer {
    let output = Command::new(repo().join(".venv/bin/python"))
        .arg(repo().join("tests/h2/client.py"))
        .args([&envoy.address(), "POST", path, ending, body])
        .args(
            headers
                .iter()
                .map(|(name, value)| format!("{name}:{value}")),
        )
        .output()
        .expect("run the h2 client (make envoy installs it)");
    assert!(
        output.status.success(),
        "h2 client: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).expect("h2 client JSON");
    assert_eq!(result["reset"], false, "{result}");
    Answer {
        status: result["status"].as_u64().unwrap_or(0) as u16,
        pod: result["headers"]["x-inference-pod"]
            .as_str()
            .map(str::to_owned),
        body: result["body"].as_str().unwrap_or_default().to_owned(),
    }
}

/// One HTTP/1.1 request with a chunked body that ends in trailers.
fn h1_chunked_with_trailers(
    envoy: &Envoy,
    path: &str,
    body: &str,
    headers: &[(&str, String)],
) -> Answer {
    let mut stream = TcpStream::connect(envoy.address()).expect("connect to Envoy");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\nconnection: close\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str(&format!("\r\n{:x}\r\n{body}\r\n0\r\n", body.len()));
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let response = http1::read_response(&mut BufReader::new(stream)).expect("a response");
    Answer {
        status: response.status,
        pod: response.header("x-inference-pod").map(str::to_owned),
        body: String::from_utf8_lossy(&response.body).into_owned(),
    }
}

fn assert_answer(answer: &Answer, expected: u16, pods: &[&str], case: &str) {
    assert_eq!(answer.status, expected, "{case}: {}", answer.body);
    match expected {
        200 | 404 => assert!(
            answer.pod.as_deref().is_some_and(|pod| pods.contains(&pod)),
            "{case}: served by {:?}",
            answer.pod
        ),
        _ => {
            assert_eq!(answer.pod, None, "{case}: the filter answers, no pod");
            let error: Value = serde_json::from_str(&answer.body).unwrap_or_default();
            assert_eq!(error["error"]["code"], expected, "{case}: {}", answer.body);
        }
    }
}

#[test]
fn no_request_reaches_an_address_outside_the_pool() {
    wall_holds("envoy/envoy.yaml");
}

const ORIGINAL_DST: &str = "envoy/envoy-original-dst.yaml";

#[test]
fn no_request_reaches_an_address_outside_the_pool_with_original_dst() {
    wall_holds(ORIGINAL_DST);
}

#[test]
fn no_request_reaches_an_address_outside_the_pool_with_many_pools() {
    wall_holds("envoy/envoy-multi-pool.yaml");
}

fn wall_holds(envoy_config: &str) {
    let a = Sim::start("pod-a", &[]);
    let b = Sim::start("pod-b", &[]);
    let shipped = picker_config_of(envoy_config);
    // With many pools, the pods serve the first pool (the one serving MODEL).
    let picker_config = if shipped.contains("\npools:") {
        with_pool_endpoints(&shipped, "llama", &[&a, &b])
    } else {
        with_endpoints(&shipped, &[&a, &b])
    };
    let envoy = Envoy::start_from(envoy_config, &picker_config, 2, |_| {});
    a.wait_for_scrapes(2);
    let canary = Canary::start();
    let steer = steering_headers(&canary.address);
    let good = format!(r#"{{"model":"{MODEL}","prompt":"hello","max_tokens":2}}"#);
    let bad = r#"{"model": 42}"#;
    let pods = ["pod-a", "pod-b"];

    // (path, body, expected status when the body arrives, and when none does)
    let paths = [
        ("/v1/completions", good.as_str(), 200, 400),
        ("/v1/%63ompletions", good.as_str(), 200, 400),
        ("//v1/./completions", good.as_str(), 200, 400),
        ("/v1/completions", bad, 400, 400),
        ("/v1/%63ompletions", bad, 400, 400),
        // A pod answers (404: no POST route there); the filter routed it on load alone.
        ("/v1/models", "", 404, 404),
    ];
    for (path, body, with_body, without_body) in paths {
        for ending in ["data", "trailers", "trailers-only", "headers"] {
            let expected = match ending {
                "data" | "trailers" => with_body,
                _ => without_body,
            };
            let case = format!("{envoy_config}: h2 {ending} {path} {body}");
            let answer = h2(&envoy, path, ending, body, &steer);
            assert_answer(&answer, expected, &pods, &case);
        }
        let case = format!("{envoy_config}: HTTP/1.1 chunked+trailers {path} {body}");
        let answer = h1_chunked_with_trailers(&envoy, path, body, &steer);
        assert_answer(&answer, with_body, &pods, &case);
    }
    assert_eq!(escapes(&canary), 0, "a request escaped the pool");
}

/// The connections the canary accepted, counted after a time window, not a wait: an escape
/// would be a connection Envoy may open late (a retry) and the canary counts on its next poll;
/// an absence cannot be waited for.
fn escapes(canary: &Canary) -> usize {
    std::thread::sleep(Duration::from_millis(200));
    canary.accepted()
}

/// The wall's positive control: where nothing overwrites the client's destination header (the
/// ORIGINAL_DST config without the filter), the wall's own requests, headers and canary show
/// the escape: each request reaches the canary and no pod.
#[test]
fn the_canary_would_see_an_escape() {
    let a = Sim::start("pod-a", &[]);
    let picker_config = with_endpoints(&picker_config_of(ORIGINAL_DST), &[&a]);
    let envoy = Envoy::start_from(ORIGINAL_DST, &picker_config, 1, |config| {
        config
            .listener_mut(0)
            .http_filters_mut()
            .retain(|filter| filter["name"] != "envoy.filters.http.wasm");
    });
    let canary = Canary::start();
    let steer = steering_headers(&canary.address);
    let good = format!(r#"{{"model":"{MODEL}","prompt":"hello","max_tokens":2}}"#);
    let escaped = [
        h2(&envoy, "/v1/completions", "data", &good, &steer),
        h1_chunked_with_trailers(&envoy, "/v1/completions", &good, &steer),
    ];
    for answer in &escaped {
        assert_eq!(answer.pod, None, "a pod served it: {}", answer.body);
    }
    assert!(
        escapes(&canary) >= escaped.len(),
        "the canary saw {} of the {} escapes",
        canary.accepted(),
        escaped.len()
    );
    assert_eq!(a.requests_total(), 0, "the pod saw none of them");
}
