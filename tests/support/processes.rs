//! Real processes on loopback: simulated pods ([`Sim`]) and Envoy ([`Envoy`]), started per test
//! and stopped by pid when their handle drops; ports and temporary directories.

use super::edge::{module_dir, sample, to_module_edge, Edge};
use super::envoy_config::{picker_config_of, with_endpoints, EnvoyConfig};
use super::http::{request, try_request, Response};
use super::wait::eventually;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
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

/// A loopback port nothing listens on now, for a process the test starts next.
pub fn free_port() -> u16 {
    // Below the kernel's ephemeral range: there, an outgoing connection (a large pool's
    // scrapes open thousands a second) or a listener on port 0 can take the port between
    // choosing it and Envoy binding it.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let low = ephemeral_range_start().max(FIXED_PORTS_FROM + 1);
    let span = usize::from(low - FIXED_PORTS_FROM);
    let start = std::process::id() as usize * 7919 + NEXT.fetch_add(1, Ordering::Relaxed) * 104_729;
    (0..span)
        .map(|step| FIXED_PORTS_FROM + ((start + step) % span) as u16)
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        .or_else(|| {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .ok()
        })
        .expect("a free loopback port")
}

/// Where [`free_port`] starts looking: above the well-known and registered ports most
/// services listen on.
const FIXED_PORTS_FROM: u16 = 10_000;

/// The first port the kernel hands out for outgoing connections and port-0 binds (Linux:
/// `ip_local_port_range`; 32768 where it cannot be read).
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
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

/// Stops a child we started, by its pid, and reaps it.
pub fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `try_start` up to three times: a free port can be taken (by a parallel test) between
/// choosing it and binding it, so a start whose log says the address is in use is retried on
/// new ports. Any other failure is returned with its log.
pub fn retry_bind<T>(
    what: &str,
    mut try_start: impl FnMut() -> Result<T, String>,
) -> Result<T, String> {
    let mut in_use = String::new();
    for _ in 0..3 {
        match try_start() {
            Err(log) if log.contains("ddress already in use") => {
                in_use = log
                    .lines()
                    .find(|line| line.contains("ddress already in use"))
                    .unwrap_or_default()
                    .to_string();
            }
            result => return result,
        }
    }
    panic!("{what} could not bind its ports three times; the last time: {in_use}");
}

/// Polls `ready` every `every` until it holds. If the child exits first, its exit status and
/// `log()`; past 30 s, a panic with `log()`.
pub fn wait_ready(
    child: &mut Child,
    what: &str,
    every: Duration,
    ready: impl Fn() -> bool,
    log: impl Fn() -> String,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exit status {status}\n{}", log()));
        }
        if ready() {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "{what} not ready in 30 s:\n{}",
            log()
        );
        std::thread::sleep(every);
    }
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

    /// A pod on a given port (0 = any), e.g. to bring a killed one back at its address. Runs
    /// at `--time-scale 0.05` unless `args` set one.
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

    /// SIGKILL: the pod vanishes mid-request, as a crashed or OOM-killed one does.
    pub fn kill(&mut self) {
        stop(&mut self.child);
    }

    /// SIGTERM: the simulator stops gracefully (it stops accepting, finishes the requests in
    /// flight, closes its idle connections, exits). Waits up to 10 s for it to exit.
    pub fn terminate(&mut self) {
        #[cfg(unix)]
        if let Ok(pid) = i32::try_from(self.child.id()) {
            if matches!(self.child.try_wait(), Ok(None)) {
                // SAFETY: a plain kill(2) on our own child's pid, which it still is (not reaped).
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop(&mut self.child);
    }

    /// The port it listens on (to bring it back at the same address).
    pub fn port(&self) -> u16 {
        self.address
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or(0)
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

    /// The sim's counters (`/admin/stats`): requests, scrapes, queue, and the prefix cache's
    /// `prefix_queries` / `prefix_hits` in prompt tokens.
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

/// Many simulated pods: `model-server-sim --listeners N` processes of at most
/// [`SimPool::PER_PROCESS`] pods each (each pod takes a thread and a descriptor for its
/// listener, and one of each per open connection).
pub struct SimPool {
    children: Vec<Child>,
    pub addresses: Vec<String>,
}

impl SimPool {
    pub const PER_PROCESS: usize = 1024;

    pub fn start(count: usize) -> SimPool {
        Self::start_in(count, Self::PER_PROCESS)
    }

    /// `count` pods in processes of at most `per_process` pods each.
    pub fn start_in(count: usize, per_process: usize) -> SimPool {
        let per_process = per_process.max(1);
        let mut pool = SimPool {
            children: Vec::new(),
            addresses: Vec::with_capacity(count),
        };
        let mut left = count;
        while left > 0 {
            let listeners = left.min(per_process);
            let mut child = Command::new(sim_binary())
                .args(["--port", "0", "--name", "pod", "--time-scale", "0"])
                .args(["--listeners", &listeners.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start model-server-sim");
            let stdout = child.stdout.take().expect("sim stdout");
            pool.children.push(child);
            let lines = BufReader::new(stdout).lines().take(listeners);
            for line in lines {
                let line = line.expect("address line");
                let address = line
                    .trim()
                    .strip_prefix("listening on ")
                    .expect("address line");
                pool.addresses.push(address.to_string());
            }
            assert_eq!(
                pool.addresses.len(),
                count - left + listeners,
                "sim exited early"
            );
            left -= listeners;
        }
        pool
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for SimPool {
    fn drop(&mut self) {
        for child in &mut self.children {
            stop(child);
        }
    }
}

/// The picker's logger at `debug` (one decision line per request, which the tests read) unless
/// `INFERENCE_PICKER_WASM_LOG` says otherwise; benchmarks run at `info`.
fn picker_log_level(edge: Edge) -> String {
    let level = std::env::var("INFERENCE_PICKER_WASM_LOG").unwrap_or_else(|_| "debug".into());
    format!("{}:{level}", edge.log_component())
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

/// The shipped configs' peer port (`pool.peers.port`).
pub const SHIPPED_PEER_PORT: u16 = 9100;

/// A picker config whose peers use the shipped port gets a free one instead (its own address
/// in the peer list follows), so that test Envoys do not share it; a fleet's own ports stay.
/// The config and its peer port (none without `pool.peers`).
fn place_peer_port(picker_config: &str) -> (String, Option<u16>) {
    let Ok(mut value) = serde_yaml::from_str::<serde_yaml::Value>(picker_config) else {
        return (picker_config.to_owned(), None);
    };
    let peers = &mut value["pool"]["peers"];
    let Some(port) = peers["port"].as_u64().and_then(|p| u16::try_from(p).ok()) else {
        return (picker_config.to_owned(), None);
    };
    if port != SHIPPED_PEER_PORT {
        return (picker_config.to_owned(), Some(port));
    }
    let free = free_port();
    peers["port"] = free.into();
    let shipped = format!("127.0.0.1:{SHIPPED_PEER_PORT}");
    if let Some(addresses) = peers["addresses"].as_sequence_mut() {
        for address in addresses
            .iter_mut()
            .filter(|a| a.as_str() == Some(&shipped))
        {
            *address = format!("127.0.0.1:{free}").into();
        }
    }
    (serde_yaml::to_string(&value).expect("yaml"), Some(free))
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
        adjust: impl Fn(&mut EnvoyConfig),
    ) -> Envoy {
        Envoy::start_from("envoy/envoy.yaml", picker_config, concurrency, adjust)
    }

    /// Like `start_with`, from another Envoy config of the repository.
    pub fn start_from(
        base: &str,
        picker_config: &str,
        concurrency: u32,
        adjust: impl Fn(&mut EnvoyConfig),
    ) -> Envoy {
        Envoy::start_on(Edge::current(), base, picker_config, concurrency, adjust)
    }

    /// Like `start_from`, with the picker as `edge` whatever this run's edge is (the
    /// benchmarks run both in one Envoy run each).
    pub fn start_on(
        edge: Edge,
        base: &str,
        picker_config: &str,
        concurrency: u32,
        adjust: impl Fn(&mut EnvoyConfig),
    ) -> Envoy {
        retry_bind("envoy", || {
            Envoy::try_start(edge, None, base, picker_config, concurrency, &adjust)
        })
        .unwrap_or_else(|log| panic!("envoy exited:\n{log}"))
    }

    /// The shipped module config with the dynamic module Envoy loads from `module_dir` (a
    /// build with test-only features) instead of `make build`'s.
    pub fn start_module_from(module_dir: &Path, picker_config: &str, concurrency: u32) -> Envoy {
        retry_bind("envoy", || {
            Envoy::try_start(
                Edge::Module,
                Some(module_dir),
                "envoy/envoy.yaml",
                picker_config,
                concurrency,
                &|_| {},
            )
        })
        .unwrap_or_else(|log| panic!("envoy exited:\n{log}"))
    }

    /// Starts Envoy with a picker config it must refuse; returns Envoy's log. Panics if Envoy
    /// comes up instead.
    pub fn refused(picker_config: &str) -> String {
        match retry_bind("envoy", || {
            Envoy::try_start(
                Edge::current(),
                None,
                "envoy/envoy.yaml",
                picker_config,
                1,
                &|_| {},
            )
        }) {
            Ok(envoy) => panic!("envoy accepted the configuration:\n{}", envoy.log()),
            Err(log) => log,
        }
    }

    fn try_start(
        edge: Edge,
        module: Option<&Path>,
        base: &str,
        picker_config: &str,
        concurrency: u32,
        adjust: &impl Fn(&mut EnvoyConfig),
    ) -> Result<Envoy, String> {
        let dir = TempDir::new("envoy");
        let port = free_port();
        let admin_port = free_port();
        let mut config = EnvoyConfig::load(base);
        config.set_admin_port(admin_port);
        let mut listener = config.listener_mut(0);
        listener.set_port(port);
        listener.set_access_log_path(&dir.0.join("access.log"));
        listener.set_wasm_file(&wasm_path());
        let (picker_config, peer_port) = place_peer_port(picker_config);
        let picker_config = picker_config.as_str();
        listener.set_peer_port(peer_port);
        listener.set_picker_config(picker_config);
        config.set_pool_members(picker_config);
        adjust(&mut config);
        if edge == Edge::Module {
            to_module_edge(&mut config);
        }
        let config_path = dir.0.join("envoy.yaml");
        std::fs::write(&config_path, config.render()).expect("write config");
        let mut command = Command::new(envoy_binary());
        if edge == Edge::Module {
            let dir = module.map_or_else(module_dir, Path::to_path_buf);
            command.env("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", dir);
        }
        let child = command
            .arg("-c")
            .arg(&config_path)
            .args([
                "--concurrency",
                &concurrency.to_string(),
                "--disable-hot-restart",
            ])
            // A listener updated through LDS drains in 2 s, not Envoy's default 10 minutes, so
            // a test sees the old configuration go.
            .args(["--drain-time-s", "2"])
            .args([
                "-l",
                "info",
                "--component-log-level",
                &picker_log_level(edge),
            ])
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
        let (admin, log) = (self.admin_address(), self.dir.0.join("envoy.log"));
        let ready =
            || try_request(&admin, "GET", "/ready", &[], b"").is_ok_and(|r| r.status == 200);
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_ready(
            &mut self.child,
            "envoy",
            Duration::from_millis(50),
            ready,
            log,
        )
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn admin_address(&self) -> String {
        format!("127.0.0.1:{}", self.admin_port)
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
        request(&self.admin_address(), "GET", path, &[], b"")
    }

    /// Waits until the filter's stats count `count` decisions: it adds the per-request counts
    /// (decisions, picks) to them on its next tick, not per request.
    pub fn wait_for_decisions(&self, count: u64) {
        eventually(
            &format!("{count} decisions in the filter's stats"),
            Duration::from_secs(5),
            || self.decisions() >= count,
        );
    }

    /// The filter's decisions so far, over every pool and outcome.
    pub fn decisions(&self) -> u64 {
        let text = self.admin_get("/stats?filter=decisions").text();
        let total: f64 = text
            .lines()
            .filter_map(|line| line.split_once(": "))
            .filter(|(name, _)| {
                name.starts_with("wasmcustom.inference_picker.") && name.contains(".decisions.")
            })
            .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
            .sum();
        total as u64
    }

    /// The filter's pick counter for `address` (the pod it chose first for a request), summed
    /// over Envoy's workers; 0 before its first pick. Each worker adds its picks to it on its
    /// tick, not per request.
    pub fn endpoint_picks(&self, address: &str) -> u64 {
        let series = format!("inference_picker_endpoint_picks{{endpoint=\"{address}\"}}");
        sample(&self.admin_get("/stats/prometheus").text(), &series).map_or(0, |n| n as u64)
    }

    /// Waits until `count` endpoints of the (single) pool have fresh metrics, as the VM that
    /// scrapes sets `endpoints_fresh` on its tick.
    pub fn wait_for_fresh_endpoints(&self, count: usize) {
        eventually(
            &format!("{count} endpoints with fresh metrics"),
            Duration::from_secs(10),
            || self.stat("wasmcustom.inference_picker.endpoints_fresh") == Some(count as f64),
        );
    }

    /// A counter or gauge from the admin `/stats` by its exact name (the filter's own carry
    /// Envoy's `wasmcustom.` prefix).
    pub fn stat(&self, name: &str) -> Option<f64> {
        let text = self.admin_get(&format!("/stats?filter=^{name}$")).text();
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}: ")))
            .and_then(|value| value.trim().parse().ok())
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
            // The polling interval: Envoy flushes its log every 100 ms.
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
            // The polling interval: Envoy flushes the file every 100 ms.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
