//! Test harness: real processes on loopback. Simulated pods and Envoy are started per test and
//! stopped by pid when their handle drops.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn required(relative: &str, hint: &str) -> PathBuf {
    let path = repo().join(relative);
    assert!(path.exists(), "{} is missing: {hint}", path.display());
    path
}

pub fn envoy_binary() -> PathBuf {
    required(".venv/bin/envoy", "run `make envoy` (make test does it)")
}

pub fn sim_binary() -> PathBuf {
    required(
        "target/release/examples/model-server-sim",
        "run `make sim` (make test does it)",
    )
}

pub fn wasm_path() -> PathBuf {
    required(
        "target/wasm32-wasip1/release/inference_picker.wasm",
        "run `make build` (make test does it)",
    )
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("inference-picker-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// One simulated model server.
pub struct Sim {
    child: Child,
    pub name: String,
    pub address: String,
}

impl Sim {
    pub fn start(name: &str, args: &[&str]) -> Sim {
        Sim::start_at(name, 0, args)
    }

    /// A pod on a given port (0 = any), e.g. to bring a killed one back at its address.
    pub fn start_at(name: &str, port: u16, args: &[&str]) -> Sim {
        let mut child = Command::new(sim_binary())
            .args(["--port", &port.to_string(), "--name", name])
            .args(args)
            .args(if args.contains(&"--time-scale") {
                &[][..]
            } else {
                &["--time-scale", "0.05"][..]
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start model-server-sim");
        let stdout = child.stdout.take().expect("sim stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("sim prints its address");
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .expect("sim address line")
            .to_string();
        Sim {
            child,
            name: name.to_string(),
            address,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        stop(&mut self.child);
    }

    /// `POST /admin/<what>` with a JSON body; returns the sim's counters.
    pub fn admin(&self, what: &str, body: &str) -> Value {
        let response = request(
            &self.address,
            "POST",
            &format!("/admin/{what}"),
            &[],
            body.as_bytes(),
        );
        response.json()
    }

    pub fn stats(&self) -> Value {
        self.admin("stats", "")
    }

    pub fn metrics_scrapes(&self) -> u64 {
        self.stats()["metrics_scrapes"].as_u64().unwrap_or(0)
    }

    pub fn requests_total(&self) -> u64 {
        self.stats()["requests_total"].as_u64().unwrap_or(0)
    }

    /// Waits until the gateway has scraped this pod `count` more times.
    pub fn wait_for_scrapes(&self, count: u64) {
        let start = self.metrics_scrapes();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.metrics_scrapes() < start + count {
            assert!(Instant::now() < deadline, "{} was not scraped", self.name);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// The picker configuration shipped in `envoy/envoy.yaml`.
pub fn shipped_envoy_config() -> serde_yaml::Value {
    envoy_config_file("envoy/envoy.yaml")
}

pub fn envoy_config_file(relative: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(repo().join(relative)).expect(relative);
    serde_yaml::from_str(&text).expect("the Envoy config parses")
}

fn http_filters(config: &mut serde_yaml::Value) -> &mut serde_yaml::Value {
    &mut config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"]
}

fn wasm_config(config: &mut serde_yaml::Value) -> &mut serde_yaml::Value {
    &mut http_filters(config)[0]["typed_config"]["config"]
}

/// The picker configuration inside one of the repository's Envoy configs.
pub fn picker_config_of(relative: &str) -> String {
    let mut config = envoy_config_file(relative);
    wasm_config(&mut config)["configuration"]["value"]
        .as_str()
        .expect("picker configuration string")
        .to_string()
}

/// Envoy from `envoy/examples/<name>` (the example's picker config in envoy.yaml), with the
/// pool's addresses replaced by these pods.
pub fn example_envoy(name: &str, sims: &[&Sim], concurrency: u32) -> Envoy {
    let file = format!("envoy/examples/{name}");
    Envoy::start_from(
        &file,
        &with_endpoints(&picker_config_of(&file), sims),
        concurrency,
        |_| {},
    )
}

/// A config from `examples/configs/`.
pub fn example_config(name: &str) -> String {
    std::fs::read_to_string(repo().join("examples/configs").join(name)).expect("example config")
}

pub fn shipped_picker_config() -> String {
    let mut config = shipped_envoy_config();
    wasm_config(&mut config)["configuration"]["value"]
        .as_str()
        .expect("picker configuration string")
        .to_string()
}

/// `picker_config` with its `pool.endpoints` addresses replaced by the given pods, in order;
/// the labels of the i-th configured endpoint stay with the i-th pod.
pub fn with_endpoints(picker_config: &str, sims: &[&Sim]) -> String {
    let addresses: Vec<&str> = sims.iter().map(|sim| sim.address.as_str()).collect();
    with_addresses(picker_config, &addresses)
}

/// `with_endpoints` from addresses.
pub fn with_addresses(picker_config: &str, addresses: &[&str]) -> String {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(picker_config).expect("picker config parses");
    let configured = config["pool"]["endpoints"].clone();
    let endpoints: Vec<serde_yaml::Value> = addresses
        .iter()
        .enumerate()
        .map(|(i, address)| {
            let mut endpoint = serde_yaml::Mapping::new();
            endpoint.insert("address".into(), (*address).into());
            if let Some(labels) = configured.get(i).and_then(|e| e.get("labels")) {
                endpoint.insert("labels".into(), labels.clone());
            }
            serde_yaml::Value::Mapping(endpoint)
        })
        .collect();
    config["pool"]["endpoints"] = serde_yaml::Value::Sequence(endpoints);
    serde_yaml::to_string(&config).expect("serialize picker config")
}

/// `wasm:debug` (one decision line per request, which the tests read) unless
/// `INFERENCE_PICKER_WASM_LOG` says otherwise; benchmarks run at `info`.
fn wasm_log_level() -> String {
    let level = std::env::var("INFERENCE_PICKER_WASM_LOG").unwrap_or_else(|_| "debug".into());
    format!("wasm:{level}")
}

/// A real Envoy running `envoy/envoy.yaml` with its ports, paths and picker config replaced.
pub struct Envoy {
    child: Child,
    pub port: u16,
    pub admin_port: u16,
    dir: TempDir,
}

impl Envoy {
    pub fn start(picker_config: &str, concurrency: u32) -> Envoy {
        Envoy::start_with(picker_config, concurrency, |_| {})
    }

    /// Starts Envoy; `adjust` may edit the rendered Envoy config first. A free port can be
    /// taken by a parallel test between choosing it and binding it, so a start that fails to
    /// bind is retried on new ports.
    pub fn start_with(
        picker_config: &str,
        concurrency: u32,
        adjust: impl Fn(&mut serde_yaml::Value),
    ) -> Envoy {
        Envoy::start_from("envoy/envoy.yaml", picker_config, concurrency, adjust)
    }

    /// Like `start_with`, from another Envoy config of the repository.
    pub fn start_from(
        base: &str,
        picker_config: &str,
        concurrency: u32,
        adjust: impl Fn(&mut serde_yaml::Value),
    ) -> Envoy {
        for _ in 0..3 {
            match Envoy::try_start(base, picker_config, concurrency, &adjust) {
                Ok(envoy) => return envoy,
                Err(log) if log.contains("ddress already in use") => continue,
                Err(log) => panic!("envoy exited:\n{log}"),
            }
        }
        panic!("envoy could not bind its ports three times");
    }

    fn try_start(
        base: &str,
        picker_config: &str,
        concurrency: u32,
        adjust: &impl Fn(&mut serde_yaml::Value),
    ) -> Result<Envoy, String> {
        let dir = TempDir::new("envoy");
        let port = free_port();
        let admin_port = free_port();
        let mut config = envoy_config_file(base);
        config["admin"]["address"]["socket_address"]["port_value"] = admin_port.into();
        let listener = &mut config["static_resources"]["listeners"][0];
        listener["address"]["socket_address"]["port_value"] = port.into();
        listener["filter_chains"][0]["filters"][0]["typed_config"]["access_log"][0]
            ["typed_config"]["path"] = dir.0.join("access.log").display().to_string().into();
        let wasm = wasm_config(&mut config);
        wasm["vm_config"]["code"]["local"]["filename"] = wasm_path().display().to_string().into();
        wasm["configuration"]["value"] = picker_config.into();
        adjust(&mut config);
        let config_path = dir.0.join("envoy.yaml");
        std::fs::write(
            &config_path,
            serde_yaml::to_string(&config).expect("render"),
        )
        .expect("write config");
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&config_path)
            .args([
                "--concurrency",
                &concurrency.to_string(),
                "--disable-hot-restart",
            ])
            .args(["-l", "info", "--component-log-level", &wasm_log_level()])
            .args(["--file-flush-interval-msec", "100"])
            .arg("--log-path")
            .arg(dir.0.join("envoy.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start envoy");
        let mut envoy = Envoy {
            child,
            port,
            admin_port,
            dir,
        };
        envoy.wait_ready()?;
        Ok(envoy)
    }

    /// Waits for `/ready`; the log if Envoy exited instead.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exit status {status}\n{}", self.log()));
            }
            if let Ok(response) = try_request(
                &format!("127.0.0.1:{}", self.admin_port),
                "GET",
                "/ready",
                &[],
                b"",
            ) {
                if response.status == 200 {
                    return Ok(());
                }
            }
            assert!(
                Instant::now() < deadline,
                "envoy not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        request(
            &self.address(),
            "POST",
            path,
            &[("content-type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
        request(&self.address(), "POST", path, headers, body.as_bytes())
    }

    pub fn get(&self, path: &str) -> Response {
        request(&self.address(), "GET", path, &[], b"")
    }

    pub fn admin_get(&self, path: &str) -> Response {
        request(
            &format!("127.0.0.1:{}", self.admin_port),
            "GET",
            path,
            &[],
            b"",
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("envoy.log")).unwrap_or_default()
    }

    /// The first log line containing `needle`, waiting for Envoy to flush it.
    pub fn wait_for_log_line(&self, needle: &str) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(line) = self.log().lines().find(|l| l.contains(needle)) {
                return Some(line.to_string());
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Access log lines; Envoy flushes the file on its own schedule, so this waits for `min`.
    pub fn access_log(&self, min: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(self.dir.0.join("access.log")).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(String::from).collect();
            if lines.len() >= min || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn pod(&self) -> String {
        self.header("x-inference-pod").unwrap_or("-").to_string()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            panic!(
                "not JSON ({}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub fn request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    try_request(address, method, path, headers, body)
        .unwrap_or_else(|error| panic!("{method} {address}{path}: {error}"))
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`), body de-chunked.
pub fn try_request(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    read_response(BufReader::new(stream))
}

/// Reads one response, using its framing (content-length or chunked) rather than waiting for
/// the server to close the connection.
fn read_response(mut reader: BufReader<TcpStream>) -> std::io::Result<Response> {
    let bad = |what: &str| std::io::Error::other(format!("bad response: {what}"));
    let mut status_line = String::new();
    reader.read_line(&mut status_line)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&status_line))?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| bad(line))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if response
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        response.body = read_chunked(&mut reader)?;
    } else if let Some(length) = response
        .header("content-length")
        .and_then(|v| v.parse().ok())
    {
        response.body = vec![0; length];
        reader.read_exact(&mut response.body)?;
    } else {
        reader.read_to_end(&mut response.body)?;
    }
    Ok(response)
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size_line = String::new();
        reader.read_line(&mut size_line)?;
        let size = usize::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {size_line:?}")))?;
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk)?;
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

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

/// One HTTP/1.1 keep-alive connection for load generation; reconnects after an error.
pub struct KeepAlive {
    address: String,
    reader: Option<BufReader<TcpStream>>,
}

impl KeepAlive {
    pub fn new(address: &str) -> KeepAlive {
        KeepAlive {
            address: address.to_string(),
            reader: None,
        }
    }

    pub fn post(&mut self, path: &str, body: &str) -> std::io::Result<Exchange> {
        if self.reader.is_none() {
            let stream = TcpStream::connect(&self.address)?;
            stream.set_read_timeout(Some(Duration::from_secs(60)))?;
            stream.set_nodelay(true)?;
            self.reader = Some(BufReader::new(stream));
        }
        let result = self.exchange(path, body);
        if result.is_err() {
            self.reader = None;
        }
        result
    }

    fn exchange(&mut self, path: &str, body: &str) -> std::io::Result<Exchange> {
        let reader = self
            .reader
            .as_mut()
            .ok_or(std::io::ErrorKind::NotConnected)?;
        let started = Instant::now();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        reader.get_mut().write_all(head.as_bytes())?;
        reader.get_mut().write_all(body.as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or(std::io::ErrorKind::InvalidData)?;
        let (mut length, mut chunked, mut close) = (None, false, false);
        let mut pod = String::from("-");
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((header, ""));
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<usize>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                "x-inference-pod" => pod = value.to_string(),
                "connection" => close = value.eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let mut first_byte = None;
        if chunked {
            loop {
                line.clear();
                reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
                first_byte.get_or_insert_with(|| started.elapsed());
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
            }
        } else {
            let mut rest = vec![0; length.unwrap_or(0)];
            reader.read_exact(&mut rest)?;
            first_byte = Some(started.elapsed());
        }
        if close {
            self.reader = None;
        }
        let total = started.elapsed();
        Ok(Exchange {
            status,
            pod,
            first_byte: first_byte.unwrap_or(total),
            total,
        })
    }
}
