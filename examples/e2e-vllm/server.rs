//! One real vLLM OpenAI server (`python -m vllm.entrypoints.openai.api_server`) on loopback,
//! its process tree stopped by pid, and what the checks read from it (`/metrics`, `/tokenize`).

use crate::support::{request, try_request};
use serde_json::{json, Value};
use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model name the servers serve the tiny model under, and its adapter.
pub const MODEL: &str = "tiny-llama";
pub const ADAPTER: &str = "sql-lora";
/// vLLM's KV block on CPU, in tokens (the prefix cache counts whole blocks).
pub const BLOCK_TOKENS: u64 = 128;
/// The KV blocks a server has (`--num-gpu-blocks-override`).
pub const KV_BLOCKS: u64 = 48;
/// The longest prompt plus output a server takes, in tokens (`--max-model-len`).
pub const MAX_MODEL_LEN: usize = 2048;
/// The sequences a server runs at once (`--max-num-seqs`).
pub const MAX_NUM_SEQS: usize = 4;

/// Where the venv and the model are, shared by every server.
pub struct Setup {
    pub python: PathBuf,
    pub model_dir: PathBuf,
    pub log_dir: PathBuf,
}

pub struct Vllm {
    pub name: String,
    pub address: String,
    port: u16,
    core: u32,
    child: Option<Child>,
    child_started: bool,
    log: PathBuf,
}

impl Vllm {
    /// Starts a server on `port` with its OpenMP threads on `core`; returns at once (see
    /// [`Vllm::wait_healthy`]). Small footprint: [`KV_BLOCKS`] KV blocks of [`BLOCK_TOKENS`]
    /// tokens, [`MAX_NUM_SEQS`] sequences, LoRA with up to 2 adapters, `sql-lora` loaded.
    pub fn spawn(setup: &Setup, name: &str, port: u16, core: u32) -> Vllm {
        let log = setup.log_dir.join(format!("{name}.log"));
        let mut server = Vllm {
            name: name.to_string(),
            address: format!("127.0.0.1:{port}"),
            port,
            core,
            child: None,
            child_started: false,
            log,
        };
        server.start(setup);
        server
    }

    fn start(&mut self, setup: &Setup) {
        let model = setup.model_dir.join("tiny-llama");
        let adapter = setup.model_dir.join(ADAPTER);
        // A restart writes its own log, beside the first run's.
        if self.child_started {
            self.log = setup.log_dir.join(format!("{}.restarted.log", self.name));
        }
        self.child_started = true;
        let log = File::create(&self.log).expect("vLLM log file");
        let child = Command::new(&setup.python)
            .args(["-m", "vllm.entrypoints.openai.api_server"])
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .arg("--model")
            .arg(&model)
            .args(["--served-model-name", MODEL])
            .args(["--max-model-len", &MAX_MODEL_LEN.to_string()])
            .args(["--max-num-seqs", &MAX_NUM_SEQS.to_string()])
            .args(["--enforce-eager", "--gpu-memory-utilization", "0.2"])
            .args(["--num-gpu-blocks-override", &KV_BLOCKS.to_string()])
            .args(["--seed", "0"])
            .args(["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"])
            .arg("--lora-modules")
            .arg(format!("{ADAPTER}={}", adapter.display()))
            .env("VLLM_CPU_OMP_THREADS_BIND", self.core.to_string())
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("vLLM log file"))
            .stderr(log)
            .spawn()
            .expect("start vLLM");
        self.child = Some(child);
    }

    /// Starts the server again at the same address and core, after [`Vllm::crash`].
    pub fn restart(&mut self, setup: &Setup) {
        self.stop();
        self.start(setup);
    }

    /// Waits for `/health`; the log's tail if the server exited or did not come up in time.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("exited ({status}):\n{}", self.log_tail(30)));
                }
            }
            if let Ok(response) = try_request(&self.address, "GET", "/health", &[], b"") {
                if response.status == 200 {
                    return Ok(start.elapsed());
                }
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "not healthy after {timeout:?}:\n{}",
                    self.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kills the server and everything it started at once (SIGKILL), as a crash would, and
    /// what it leaves in `/dev/shm` (vLLM's message queues, ~400 MB of tmpfs; see `kill_tree`).
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let tree = process_tree(child.id());
            kill_tree(&mut child, &tree);
        }
    }

    /// Stops the server: SIGTERM (vLLM shuts its engine down), then SIGKILL for whatever of
    /// its process tree is left after 15 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let tree = process_tree(child.id());
        signal(&tree[..1], "TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let root_done = matches!(child.try_wait(), Ok(Some(_)));
            if root_done && tree[1..].iter().all(|&pid| !alive(pid)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let left: Vec<u32> = tree.iter().copied().filter(|&pid| alive(pid)).collect();
        kill_tree(&mut child, &left);
    }

    pub fn metrics(&self) -> String {
        request(&self.address, "GET", "/metrics", &[], b"").text()
    }

    /// How many tokens the server's tokenizer makes of a completions prompt.
    pub fn count_tokens(&self, prompt: &str) -> u64 {
        let body = json!({"model": MODEL, "prompt": prompt}).to_string();
        let response = request(
            &self.address,
            "POST",
            "/tokenize",
            &[("content-type", "application/json")],
            body.as_bytes(),
        );
        response.json()["count"].as_u64().unwrap_or(0)
    }

    /// POST a JSON body straight to the server (not through Envoy).
    pub fn post(&self, path: &str, request_id: &str, body: &Value) -> crate::support::Response {
        request(
            &self.address,
            "POST",
            path,
            &[
                ("content-type", "application/json"),
                ("x-request-id", request_id),
            ],
            body.to_string().as_bytes(),
        )
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The sum of every series of `name` in a Prometheus text (one per engine, model, ...).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `root` and all its descendants, root first, from `/proc`.
fn process_tree(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut next = 0;
    while let Some(&pid) = tree.get(next) {
        for &(child, parent) in &parents {
            if parent == pid && !tree.contains(&child) {
                tree.push(child);
            }
        }
        next += 1;
    }
    tree
}

/// SIGKILL to these processes (`child` among them, or already gone), except Python's
/// multiprocessing resource trackers: those outlive the others by a moment to unlink the
/// shared memory and semaphores that the killed processes left (SIGKILL for them too after
/// 5 s). Then the removal of the `/dev/shm` files that only these processes had mapped.
fn kill_tree(child: &mut Child, pids: &[u32]) {
    let shm = shared_memory(pids);
    let (trackers, others): (Vec<u32>, Vec<u32>) = pids.iter().partition(|&&pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains("resource_tracker"))
    });
    signal(&others, "KILL");
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(|&pid| alive(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<u32> = trackers.into_iter().filter(|&pid| alive(pid)).collect();
    signal(&left, "KILL");
    let still_mapped = shared_memory(&process_tree(1));
    for file in shm.iter().filter(|file| !still_mapped.contains(file)) {
        let _ = std::fs::remove_file(file);
    }
}

/// The `/dev/shm` files these processes have mapped.
fn shared_memory(pids: &[u32]) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    for pid in pids {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        for line in maps.lines() {
            if let Some(at) = line.find("/dev/shm/") {
                let file = PathBuf::from(line[at..].trim_end_matches(" (deleted)"));
                if !files.contains(&file) {
                    files.push(file);
                }
            }
        }
    }
    files
}

/// A process that exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s != "Z"))
        })
        .unwrap_or(false)
}

fn signal(pids: &[u32], signal: &str) {
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}
