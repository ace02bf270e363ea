//! The processes a part starts besides the pods of `support`: Envoy as a plain load balancer,
//! Envoy with the `ext_proc` filter and its picker, and the peer LLM routers (SGLang's and
//! vLLM's, from PyPI into `.venv-peers`).

use crate::support::{
    example_config, free_port, repo, retry_bind, shipped_picker_config, static_cluster, stop,
    try_request, wait_ready, with_endpoints, Envoy, Sim, TempDir,
};
use serde_yaml::Value;
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A gateway of the routing-quality and scale-out parts.
#[derive(Clone, Copy)]
pub enum Gateway {
    /// Envoy alone with this `lb_policy`.
    Envoy(&'static str),
    /// Envoy with the filter and this picker config (`default`: the shipped one; otherwise a
    /// file of `examples/`).
    Picker(&'static str),
    /// SGLang's router (`sglang-router`) with this `--policy`, its other settings at their
    /// defaults.
    Sglang(&'static str),
    /// The vLLM project's router (`vllm-router`) with this `--policy`, its other settings at
    /// their defaults.
    VllmRouter(&'static str),
}

impl Gateway {
    pub fn name(self) -> String {
        match self {
            Gateway::Envoy(policy) => format!("Envoy {policy}"),
            Gateway::Picker(config) => format!("picker {}", config.trim_end_matches(".yaml")),
            Gateway::Sglang(policy) => format!("SGLang {policy}"),
            Gateway::VllmRouter(policy) => format!("vllm-router {policy}"),
        }
    }

    pub fn start(self, sims: &[&Sim]) -> Running {
        match self {
            Gateway::Envoy(policy) => Running::Envoy(plain_envoy(sims, policy)),
            Gateway::Picker(config) => {
                let text = if config == "default" {
                    shipped_picker_config()
                } else {
                    example_config(config)
                };
                Running::Envoy(Envoy::start(&with_endpoints(&text, sims), 2))
            }
            Gateway::Sglang(policy) => {
                Running::Router(PeerRouter::start(Peer::Sglang, policy, sims))
            }
            Gateway::VllmRouter(policy) => {
                Running::Router(PeerRouter::start(Peer::Vllm, policy, sims))
            }
        }
    }
}

/// A started gateway: an Envoy, or a peer router process; either is stopped when dropped.
pub enum Running {
    Envoy(Envoy),
    Router(PeerRouter),
}

impl Running {
    /// Where clients send their requests.
    pub fn address(&self) -> String {
        match self {
            Running::Envoy(envoy) => envoy.address(),
            Running::Router(router) => router.address(),
        }
    }

    /// The gateway's process, to read its CPU.
    pub fn pid(&self) -> u32 {
        match self {
            Running::Envoy(envoy) => envoy.pid(),
            Running::Router(router) => router.pid(),
        }
    }
}

/// The peer routers, installed by `make peers` into `.venv-peers` at pinned versions.
#[derive(Clone, Copy)]
enum Peer {
    Sglang,
    Vllm,
}

/// A peer LLM router in front of the pods, on loopback.
pub struct PeerRouter {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl PeerRouter {
    /// Starts the router on a free loopback port (its Prometheus listener on another) with
    /// `--policy policy` and nothing else set, and waits until it reports every pod healthy.
    /// A free port can be taken between choosing it and binding it, so a start that fails to
    /// bind is retried on new ports.
    fn start(peer: Peer, policy: &str, sims: &[&Sim]) -> PeerRouter {
        retry_bind("the router", || PeerRouter::try_start(peer, policy, sims))
            .unwrap_or_else(|log| panic!("the router exited:\n{log}"))
    }

    fn try_start(peer: Peer, policy: &str, sims: &[&Sim]) -> Result<PeerRouter, String> {
        let venv = repo().join(".venv-peers/bin");
        let (program, mut args, log_level) = match peer {
            Peer::Sglang => (
                venv.join("python"),
                vec!["-m".to_string(), "sglang_router.launch_router".to_string()],
                "warn",
            ),
            Peer::Vllm => (venv.join("vllm-router"), Vec::new(), "warning"),
        };
        assert!(
            program.exists(),
            "{} is missing: run `make peers` (make bench does it)",
            program.display()
        );
        let (port, metrics_port) = (free_port(), free_port());
        args.push("--worker-urls".into());
        args.extend(sims.iter().map(|sim| format!("http://{}", sim.address)));
        for (flag, value) in [
            ("--policy", policy.to_string()),
            ("--host", "127.0.0.1".into()),
            ("--port", port.to_string()),
            ("--prometheus-host", "127.0.0.1".into()),
            ("--prometheus-port", metrics_port.to_string()),
            ("--log-level", log_level.into()),
        ] {
            args.extend([flag.to_string(), value]);
        }
        let dir = TempDir::new("peer-router");
        let log = std::fs::File::create(dir.0.join("router.log")).expect("router log");
        let child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("router log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let mut router = PeerRouter { child, port, dir };
        router.wait_ready(sims.len())?;
        Ok(router)
    }

    /// Polls `/readiness` (both routers serve it) until it counts `pods` healthy workers, at
    /// most 30 s; the router's log if it exited instead.
    fn wait_ready(&mut self, pods: usize) -> Result<(), String> {
        let (address, log) = (self.address(), self.dir.0.join("router.log"));
        let ready = || {
            try_request(&address, "GET", "/readiness", &[], b"").is_ok_and(|response| {
                let healthy = serde_json::from_slice::<serde_json::Value>(&response.body)
                    .ok()
                    .and_then(|body| body["healthy_workers"].as_u64());
                response.status == 200 && healthy == Some(pods as u64)
            })
        };
        let log = || std::fs::read_to_string(&log).unwrap_or_default();
        let what = format!("the router ({pods} healthy pods)");
        wait_ready(
            &mut self.child,
            &what,
            Duration::from_millis(100),
            ready,
            log,
        )
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for PeerRouter {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Envoy with no filter, balancing with `lb_policy` over a STATIC cluster of the pods.
pub fn plain_envoy(sims: &[&Sim], lb_policy: &'static str) -> Envoy {
    let addresses: Vec<&str> = sims.iter().map(|sim| sim.address.as_str()).collect();
    let mut cluster = static_cluster("pool", &addresses);
    cluster["lb_policy"] = lb_policy.into();
    let picker = with_endpoints(&shipped_picker_config(), sims);
    Envoy::start_with(&picker, 2, move |config| {
        let mut listener = config.listener_mut(0);
        listener
            .http_filters_mut()
            .retain(|f| f["name"] == "envoy.filters.http.router");
        listener.http_connection_manager_mut()["route_config"]["virtual_hosts"][0]["routes"][0]
            ["route"]["cluster"] = "pool".into();
        *config.clusters_mut() = vec![cluster.clone()];
    })
}

/// A gauge or counter of the filter, from Envoy's admin page.
pub fn filter_stat(envoy: &Envoy, name: &str) -> f64 {
    envoy
        .admin_get(&format!("/stats?filter=inference_picker.{name}$"))
        .text()
        .lines()
        .find_map(|l| l.split_once(": ").map(|(_, v)| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The ext_proc baseline: `extproc-picker` (bench/extproc), our scheduling core behind gRPC.
pub struct ExtProcPicker {
    child: Child,
    address: String,
    _dir: TempDir,
}

impl ExtProcPicker {
    pub fn start(picker_config: &str) -> ExtProcPicker {
        let binary = repo().join("target/release/extproc-picker");
        assert!(
            binary.exists(),
            "run `make extproc` first (make bench does it)"
        );
        let dir = TempDir::new("extproc");
        let config = dir.0.join("picker.yaml");
        std::fs::write(&config, picker_config).expect("picker config");
        let mut child = Command::new(binary)
            .args(["--port", "0", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start extproc-picker");
        let address = listening_addresses(&mut child, 1)
            .pop()
            .expect("extproc-picker prints its address");
        ExtProcPicker {
            child,
            address,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ExtProcPicker {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// The first `count` `listening on <address>` lines a child prints.
fn listening_addresses(child: &mut Child, count: usize) -> Vec<String> {
    let stdout = child.stdout.take().expect("stdout");
    std::io::BufReader::new(stdout)
        .lines()
        .take(count)
        .map(|line| {
            line.expect("address line")
                .trim()
                .strip_prefix("listening on ")
                .expect("address line")
                .to_string()
        })
        .collect()
}

const EXT_PROC_FILTER: &str = r#"
name: envoy.filters.http.ext_proc
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service:
    envoy_grpc: {cluster_name: endpoint_picker}
    timeout: 10s
  failure_mode_allow: false
  message_timeout: 10s
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SEND
    request_body_mode: FULL_DUPLEX_STREAMED
    request_trailer_mode: SEND
    response_body_mode: NONE
    response_trailer_mode: SKIP
"#;

/// The cluster through which Envoy reaches the ext_proc picker at `address`, over HTTP/2.
fn ext_proc_cluster(address: &str) -> Value {
    let (host, port) = address.rsplit_once(':').expect("address");
    serde_yaml::from_str(&format!(
        r#"
name: endpoint_picker
type: STATIC
connect_timeout: 1s
typed_extension_protocol_options:
  envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
    "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
    explicit_http_config: {{http2_protocol_options: {{}}}}
load_assignment:
  cluster_name: endpoint_picker
  endpoints:
  - lb_endpoints:
    - endpoint: {{address: {{socket_address: {{address: '{host}', port_value: {port}}}}}}}
"#
    ))
    .expect("picker cluster")
}

/// Envoy with the `ext_proc` filter in the wasm filter's place, calling `picker` over gRPC the
/// way Envoy calls GIE's endpoint picker: headers and the whole body streamed to it
/// (`FULL_DUPLEX_STREAMED`), response headers too, so it knows when a request ends. With this
/// many worker threads.
pub fn ext_proc_envoy(sims: &[&Sim], picker: &ExtProcPicker, concurrency: u32) -> Envoy {
    let filter: Value = serde_yaml::from_str(EXT_PROC_FILTER).expect("ext_proc filter");
    let cluster = ext_proc_cluster(&picker.address);
    let picker_config = with_endpoints(&shipped_picker_config(), sims);
    Envoy::start_with(&picker_config, concurrency, move |config| {
        if let Some(wasm) = config
            .listener_mut(0)
            .http_filter_mut("envoy.filters.http.wasm")
        {
            *wasm = filter.clone();
        }
        config.clusters_mut().push(cluster.clone());
    })
}
