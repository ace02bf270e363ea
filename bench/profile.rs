//! Part 8, one request's cost, step by step: Envoy's CPU per request as the picker's work is
//! added one stage at a time, the host calls a request makes by kind, and where Envoy's CPU
//! goes (`perf`) with the filter on.

use crate::load::{closed_loop, percentile, sorted};
use crate::procfs::cpu_seconds;
use crate::report::{csv_table, goal, markdown_table, Cell, Column, Part, Row};
use crate::setup::{filter_stat, plain_envoy};
use crate::support::{
    repo, shipped_picker_config, static_cluster, with_endpoints, Envoy, EnvoyConfig, Sim,
};
use crate::workloads::padded_completion;
use inference_picker::host::HostCall;
use std::process::{Command, Stdio};
use std::time::Duration;

const INTRO: &str = "## 8. One request's cost, step by step\n\n\
     Envoy's CPU per request and the latency a request sees, as the picker's work is added one \
     step at a time. Two near-instant simulated pods; every gateway is Envoy `--concurrency 2`; \
     closed loop, one client over a keep-alive connection, `max_tokens: 1`; the gateways take \
     turns in eight rounds per body size. Rows (b)-(f) run a stage filter \
     (`bench/profile-filter`) that stops after one step of the picker's work: (b) callbacks \
     only, nothing paused; (c) the headers held until the body's end, as the picker does (Envoy \
     buffers the body); (d) the body copied into the VM; (e) parsed with the picker's own \
     parser; (f) a header written. (g) is the picker itself (the shipped plugins: parse, \
     prefix hashing, scheduling, its header writes and stats) without the `header_to_metadata` \
     step, (h) the shipped `envoy/envoy.yaml` (with it), (i) `envoy/envoy-original-dst.yaml` \
     (an ORIGINAL_DST cluster instead of the pool cluster). CPU = Envoy's user+system seconds \
     per 1,000 requests; `x alone` divides it by (a)'s.\n\n";

const ROUNDS: usize = 8;
const LARGE_BODY: usize = 220 * 1024;

/// A gateway of the profile: what it adds, and how to start it.
struct Step {
    name: &'static str,
    envoy: Envoy,
}

struct StepRow {
    step: &'static str,
    body_bytes: usize,
    p50_ms: f64,
    added_p50_us: f64,
    cpu_per_1000: f64,
    cpu_ratio: f64,
    errors: usize,
}

impl Row for StepRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("step", "step"),
        Column::both("body", "body_bytes"),
        Column::both("p50 ms", "p50_ms"),
        Column::both("p50 vs (a) µs", "added_p50_us"),
        Column::both("CPU s / 1k req", "cpu_s_per_1k"),
        Column::both("x alone", "cpu_ratio"),
        Column::both("errors", "errors"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text(self.step.to_string()),
            Cell::Kilobytes(self.body_bytes),
            Cell::Measure(self.p50_ms, 3),
            Cell::Fixed(self.added_p50_us, 0),
            Cell::Measure(self.cpu_per_1000, 3),
            Cell::Fixed(self.cpu_ratio, 2),
            Cell::Count(self.errors),
        ]
    }
}

fn stage_wasm() -> std::path::PathBuf {
    let path = repo().join("target/profile-filter/wasm32-wasip1/release/profile_filter.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make bench-profile`",
        path.display()
    );
    path
}

/// Envoy routing round robin to the pods (as `plain_envoy`) through the stage filter stopping
/// at `stage`.
fn stage_envoy(sims: &[&Sim], stage: &'static str) -> Envoy {
    let addresses: Vec<&str> = sims.iter().map(|sim| sim.address.as_str()).collect();
    let mut cluster = static_cluster("pool", &addresses);
    cluster["lb_policy"] = "ROUND_ROBIN".into();
    let wasm = stage_wasm();
    let picker = with_endpoints(&shipped_picker_config(), sims);
    Envoy::start_with(&picker, 2, move |config| {
        let mut listener = config.listener_mut(0);
        listener.http_filters_mut().retain(|f| {
            f["name"] == "envoy.filters.http.wasm" || f["name"] == "envoy.filters.http.router"
        });
        listener.set_wasm_file(&wasm);
        listener.set_picker_config(stage);
        listener.http_connection_manager_mut()["route_config"]["virtual_hosts"][0]["routes"][0]
            ["route"]["cluster"] = "pool".into();
        *config.clusters_mut() = vec![cluster.clone()];
    })
}

fn steps(sims: &[&Sim]) -> Vec<Step> {
    let picker = with_endpoints(&shipped_picker_config(), sims);
    let without_metadata = |config: &mut EnvoyConfig| {
        config
            .http_filters_mut()
            .retain(|f| f["name"] != "envoy.filters.http.header_to_metadata");
    };
    let original_dst = crate::support::picker_config_of("envoy/envoy-original-dst.yaml");
    let original_dst = with_endpoints(&original_dst, sims);
    vec![
        Step {
            name: "(a) Envoy alone",
            envoy: plain_envoy(sims, "ROUND_ROBIN"),
        },
        Step {
            name: "(b) + filter callbacks",
            envoy: stage_envoy(sims, "pass"),
        },
        Step {
            name: "(c) + held until the body",
            envoy: stage_envoy(sims, "pause"),
        },
        Step {
            name: "(d) + body copied in",
            envoy: stage_envoy(sims, "read"),
        },
        Step {
            name: "(e) + parsed",
            envoy: stage_envoy(sims, "parse"),
        },
        Step {
            name: "(f) + a header written",
            envoy: stage_envoy(sims, "write"),
        },
        Step {
            name: "(g) picker, no metadata step",
            envoy: Envoy::start_with(&picker, 2, without_metadata),
        },
        Step {
            name: "(h) picker, shipped",
            envoy: Envoy::start(&picker, 2),
        },
        Step {
            name: "(i) picker, ORIGINAL_DST",
            envoy: Envoy::start_from("envoy/envoy-original-dst.yaml", &original_dst, 2, |_| {}),
        },
    ]
}

#[derive(Default, Clone)]
struct Tally {
    latencies_ms: Vec<f64>,
    cpu: f64,
    sent: usize,
}

fn measure(steps: &[Step], body_bytes: usize, quick: bool) -> Vec<StepRow> {
    let body = padded_completion(body_bytes);
    // Enough requests per gateway that a step of ~0.01 s per 1,000 stands out of the spread.
    let count = match (body_bytes >= LARGE_BODY, quick) {
        (false, false) => 4800,
        (false, true) => 400,
        (true, false) => 960,
        (true, true) => 100,
    };
    for step in steps {
        let _ = closed_loop(&step.envoy.address(), 1, 20, &body);
    }
    let mut tallies = vec![Tally::default(); steps.len()];
    for _ in 0..ROUNDS {
        for (tally, step) in tallies.iter_mut().zip(steps) {
            let before = cpu_seconds(step.envoy.pid());
            let results = closed_loop(&step.envoy.address(), 1, count / ROUNDS, &body);
            tally.cpu += cpu_seconds(step.envoy.pid()) - before;
            tally.sent += count / ROUNDS;
            tally.latencies_ms.extend(
                results
                    .iter()
                    .filter(|e| e.status == 200)
                    .map(|e| e.total.as_secs_f64() * 1000.0),
            );
        }
    }
    let per_1000 = |tally: &Tally| tally.cpu * 1000.0 / tally.sent.max(1) as f64;
    let base_p50 = percentile(&sorted(tallies[0].latencies_ms.clone()), 50.0);
    let base_cpu = per_1000(&tallies[0]);
    steps
        .iter()
        .zip(tallies)
        .map(|(step, tally)| {
            let cpu = per_1000(&tally);
            let latencies = sorted(tally.latencies_ms);
            let p50_ms = percentile(&latencies, 50.0);
            let row = StepRow {
                step: step.name,
                body_bytes,
                p50_ms,
                added_p50_us: (p50_ms - base_p50) * 1000.0,
                cpu_per_1000: cpu,
                cpu_ratio: cpu / base_cpu,
                errors: tally.sent - latencies.len(),
            };
            println!(
                "  {:<30} {:>4} KB p50 {:.3} ms ({:+.0} µs) CPU {:.3} s/1k ({:.2}x)",
                row.step,
                body_bytes / 1024,
                row.p50_ms,
                row.added_p50_us,
                row.cpu_per_1000,
                row.cpu_ratio
            );
            row
        })
        .collect()
}

/// Host calls per request by kind, through the picker (the filter's own `host_calls`
/// counters over `count` requests, less what its ticks make meanwhile).
fn host_calls_per_request(envoy: &Envoy, count: usize) -> String {
    let counts = || -> Vec<f64> {
        // The counters reach the stats on the filter's ticks.
        std::thread::sleep(Duration::from_millis(300));
        HostCall::ALL
            .iter()
            .map(|call| filter_stat(envoy, &format!("host_calls.{}", call.name())))
            .map(|v| if v.is_nan() { 0.0 } else { v })
            .collect()
    };
    let idle_before = counts();
    let idle_after = counts();
    let body = padded_completion(1024);
    let started = std::time::Instant::now();
    let _ = closed_loop(&envoy.address(), 1, count, &body);
    let busy = started.elapsed().as_secs_f64();
    let after = counts();
    let idle_rate: Vec<f64> = idle_after
        .iter()
        .zip(&idle_before)
        .map(|(a, b)| (a - b) / 0.3)
        .collect();
    let mut total = 0.0;
    let mut rows = String::from("| host call | per request |\n|---|---:|\n");
    for ((call, after), (before, idle)) in HostCall::ALL
        .iter()
        .zip(&after)
        .zip(idle_after.iter().zip(&idle_rate))
    {
        let per_request = ((after - before - idle * (busy + 0.3)) / count as f64).max(0.0);
        if per_request >= 0.05 {
            total += per_request;
            rows.push_str(&format!("| `{}` | {per_request:.1} |\n", call.name()));
        }
    }
    rows.push_str(&format!("| all | {total:.1} |\n"));
    println!("  host calls per request: {total:.1}");
    rows
}

/// Envoy's CPU samples by shared object while the shipped picker serves 220 KB requests:
/// V8's compiled wasm has no symbols, so it shows as anonymous memory.
fn perf_profile(envoy: &Envoy, quick: bool) -> String {
    let dir = std::env::temp_dir().join(format!("profile-perf-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let data = dir.join("perf.data");
    let seconds = if quick { 3 } else { 8 };
    let recorder = Command::new("perf")
        .args(["record", "-F", "999", "-o"])
        .arg(&data)
        .args([
            "-p",
            &envoy.pid().to_string(),
            "--",
            "sleep",
            &seconds.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut recorder) = recorder else {
        return "`perf` is not available here: no profile.\n".into();
    };
    let body = padded_completion(LARGE_BODY);
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while std::time::Instant::now() < deadline {
        let _ = closed_loop(&envoy.address(), 1, 20, &body);
    }
    let _ = recorder.wait();
    let report = Command::new("perf")
        .args(["report", "--stdio", "--sort", "dso", "-i"])
        .arg(&data)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    let Ok(report) = report else {
        return "`perf report` failed: no profile.\n".into();
    };
    let text = String::from_utf8_lossy(&report.stdout);
    let mut table =
        String::from("| where Envoy's CPU went (perf, by object) | share |\n|---|---:|\n");
    for line in text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .take(8)
    {
        let mut parts = line.split_whitespace();
        let (Some(share), Some(object)) = (parts.next(), parts.next()) else {
            continue;
        };
        table.push_str(&format!("| `{object}` | {share} |\n"));
    }
    table
}

/// The per-request cost goals, judged on the shipped picker, row (h).
fn goals(rows: &[StepRow]) -> String {
    let shipped = |body: usize| {
        rows.iter()
            .find(|r| r.body_bytes == body && r.step.starts_with("(h)"))
    };
    let small = shipped(1024);
    let large = shipped(LARGE_BODY);
    let added = small.map_or(f64::NAN, |r| r.added_p50_us);
    let (cpu_small, cpu_large) = (
        small.map_or(f64::NAN, |r| r.cpu_ratio),
        large.map_or(f64::NAN, |r| r.cpu_ratio),
    );
    [
        goal(
            "added latency at 1 KB, 1 client: p50 at most 30 µs over Envoy alone",
            Some(added <= 30.0),
            &format!("{added:.0} µs"),
        ),
        goal(
            "Envoy CPU per request with the filter at most 1.25x Envoy alone at 1 KB",
            Some(cpu_small <= 1.25),
            &format!("{cpu_small:.2}x"),
        ),
        goal(
            "Envoy CPU per request with the filter at most 1.5x Envoy alone at 220 KB",
            Some(cpu_large <= 1.5),
            &format!("{cpu_large:.2}x"),
        ),
    ]
    .concat()
}

pub fn run(quick: bool) -> Part {
    println!("profile: one request's cost, step by step");
    let sims: Vec<Sim> = (1..=2)
        .map(|i| Sim::start(&format!("pod-{i}"), &["--time-scale", "0"]))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let steps = steps(&refs);
    for sim in &refs {
        sim.wait_for_scrapes(6);
    }
    let mut rows = measure(&steps, 1024, quick);
    rows.extend(measure(&steps, LARGE_BODY, quick));
    let shipped = &steps[7].envoy;
    let calls = host_calls_per_request(shipped, if quick { 200 } else { 1000 });
    let perf = perf_profile(shipped, quick);
    let goals = goals(&rows);
    Part {
        markdown: format!(
            "{INTRO}{}\n{goals}\nHost calls a request makes through the shipped picker, by kind (the \
             filter's `host_calls` counters over the requests of a closed loop, less what its \
             ticks make meanwhile):\n\n{calls}\nWhere Envoy's CPU goes with the shipped picker \
             serving 220 KB requests (`perf record` on the Envoy process, by object; the \
             wasm code V8 compiled has no symbols and shows as anonymous memory or \
             `[unknown]`):\n\n{perf}",
            markdown_table(&rows)
        ),
        csv: csv_table(&rows),
        charts: Vec::new(),
    }
}
