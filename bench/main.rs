//! `make bench`: measurements, written to `bench/RESULTS.md` with CSV and SVG beside it.
//!
//! ```text
//! cargo run --release --example bench -- [schedule|hop|quality|memory|scaleout|overload|pools|profile|all|quick]
//! ```
//! - `schedule`: one full pick (default plugins + prefix scorer) natively, over 8/64/256
//!   endpoints and 2k/8k/32k-character prompts, in ns per pick; body parsing per size.
//! - `hop`: added latency and CPU over Envoy routing with no filter, of the wasm filter and of
//!   an ext_proc picker running the same core (`bench/extproc`); same near-instant pods,
//!   bodies of 1 KB..1 MB, concurrency 1/16/64, interleaved.
//! - `quality`: open-loop rate sweeps of 8 simulated pods with real prefill/decode timing
//!   behind Envoy's ROUND_ROBIN, LEAST_REQUEST and RANDOM, picker configs and peer routers;
//!   shared-prefix, multi-turn, hot-prefix, mixed, LoRA-mix and burst workloads; TTFT, TPOT,
//!   throughput, errors, hit rate, balance per cell; goodput under TTFT SLOs and the ceiling.
//! - `memory`: Envoy RSS and the VMs' memory at 8/256/1,024 endpoints as the index fills;
//!   large pools of 1,024/4,096/16,384 endpoints (configuration time, scrape rounds against
//!   the interval, freshness, errors, memory, the admin port's `/stats`).
//! - `schedule` also times loading a configuration of 1,024 to 100,000 endpoints natively.
//! - `scaleout`: 1 to 8 Envoy replicas sharing what they learn (`pool.peers`) in front of the
//!   same pods, beside the same Envoys calling one central ext_proc picker, SGLang's router and
//!   replicas that never talk; a peer killed and a replica joining mid-run.
//! - `overload`: 1.5x the pods' capacity from two tenants at two priorities, through the
//!   picker with and without flow control and Envoy's LEAST_REQUEST.
//! - `pools`: one filter serving 1 vs 100 pools: latency and Envoy CPU per request.
//! - `profile`: one request's cost step by step (stage filter, host calls by kind, `perf`).
//!
//! `BENCH_QUICK=1` runs any part small; `quick` runs them all small.
//!
//! Every run is bounded in requests and time; every process started is stopped.
//!
//! Where things are: `load` (closed and open loop), `workloads` (request bodies, pod flags),
//! `setup` (gateways and other processes), `report` and `chart` (one table per part rendered
//! to markdown and CSV, goals, RESULTS.md, SVG), one module per part, and `internals` (all the
//! benchmark takes from the crate).

#[path = "../tests/support/mod.rs"]
mod support;

mod chart;
mod hop;
mod load;
mod memory;
#[path = "wasm-micro/src/steps.rs"]
mod micro_steps;
mod overload;
mod pools;
mod procfs;
mod profile;
mod quality;
mod report;
mod scaleout;
mod schedule;
mod setup;
mod workloads;

use report::{assemble, write_part, Part, RunHeader, Stamp};

/// A part: its name on the command line, its file name, how to run it (quick or not).
struct PartSpec {
    name: &'static str,
    file: &'static str,
    run: fn(bool) -> Part,
}

const PARTS: [PartSpec; 8] = [
    PartSpec {
        name: "schedule",
        file: "1-schedule",
        run: |_| schedule::run(),
    },
    PartSpec {
        name: "hop",
        file: "2-hop",
        run: hop::run,
    },
    PartSpec {
        name: "quality",
        file: "3-quality",
        run: quality::run,
    },
    PartSpec {
        name: "memory",
        file: "4-memory",
        run: memory::run,
    },
    PartSpec {
        name: "scaleout",
        file: "5-scaleout",
        run: scaleout::run,
    },
    PartSpec {
        name: "overload",
        file: "6-overload",
        run: overload::run,
    },
    PartSpec {
        name: "pools",
        file: "7-pools",
        run: pools::run,
    },
    PartSpec {
        name: "profile",
        file: "8-profile",
        run: profile::run,
    },
];

/// Release builds abort on panic, so the pods, Envoys and routers a part started would outlive
/// it: a failed run stops every child of this process before it goes.
fn stop_children_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-P", &std::process::id().to_string()])
            .status();
    }));
}

fn main() {
    stop_children_on_panic();
    // Decision lines cost a formatted string and a log write per request: measure without
    // (a trial may ask for them).
    if std::env::var("INFERENCE_PICKER_WASM_LOG").is_err() {
        std::env::set_var("INFERENCE_PICKER_WASM_LOG", "info");
    }
    let run = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    // `quick` runs every part small (under five minutes) into results-quick/; BENCH_QUICK=1
    // makes any single part small.
    let quick = run == "quick" || std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let (dir, report) = if quick {
        ("bench/results-quick", "bench/RESULTS-quick.md")
    } else {
        ("bench/results", "bench/RESULTS.md")
    };
    let results = support::repo().join(dir);
    std::fs::create_dir_all(&results).expect("results directory");
    // Read before any part writes: a report is one run of one commit.
    let header = RunHeader {
        stamp: Stamp::of_checkout(),
        run: run.clone(),
        machine: machine_header(),
    };
    let all = run == "all" || run == "quick";
    // A trial (some of the profile's rows, some quality cells or rates) prints its figures and
    // writes nothing: a report holds whole parts only.
    let trial = [
        "BENCH_STEPS",
        "BENCH_ONLY",
        "BENCH_RATES",
        "BENCH_POOLS",
        "BENCH_INDEX_POOLS",
    ]
    .iter()
    .any(|name| std::env::var(name).is_ok_and(|value| !value.is_empty()));
    for part in PARTS {
        if all || run == part.name {
            let started = std::time::Instant::now();
            let written = (part.run)(quick);
            if !trial {
                write_part(&results, part.file, &header, written, started.elapsed());
            }
        }
    }
    if !trial {
        assemble(&results, report, &header.stamp);
    }
}

fn machine_header() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let envoy = std::process::Command::new(support::envoy_binary())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let version = envoy.split_whitespace().last().unwrap_or("?").to_string();
    format!("machine: {cores} cores; Envoy {version}")
}
