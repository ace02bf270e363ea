//! `make soak`: 200,000 requests through Envoy with four workers and the filter in front of
//! four simulated pods; one pod dies halfway and comes back at the same address. Reports
//! errors, picks per pod and Envoy's memory at start and end, and fails if the memory grew by
//! more than 10 % or more than 1 % of the requests failed.
//!
//! `cargo run --release --example soak -- [--requests N] [--clients N]`

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{shipped_picker_config, with_endpoints, Envoy, KeepAlive, Sim, MODEL};

fn flag(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Envoy's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let total = flag("--requests", 200_000);
    let clients = flag("--clients", 32);
    let fast = ["--time-scale", "0.001", "--max-num-seqs", "64"];
    let mut sims: Vec<Sim> = (1..=4)
        .map(|i| Sim::start(&format!("pod-{i}"), &fast))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = Arc::new(Envoy::start(
        &with_endpoints(&shipped_picker_config(), &refs),
        4,
    ));
    for sim in &refs {
        sim.wait_for_scrapes(3);
    }
    let rss_start = rss_kib(envoy.pid());
    println!("soak: {total} requests, {clients} keep-alive clients, Envoy --concurrency 4, 4 pods");
    println!("Envoy RSS at start: {} MiB", rss_start / 1024);

    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(BTreeMap::<(u16, String), usize>::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (next, outcomes, address) = (next.clone(), outcomes.clone(), envoy.address());
            std::thread::spawn(move || {
                let mut client = KeepAlive::new(&address);
                let mut local = BTreeMap::<(u16, String), usize>::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total || Instant::now() > deadline {
                        break;
                    }
                    let body = format!(
                        r#"{{"model":"{MODEL}","prompt":"soak request {n} about topic {}","max_tokens":4}}"#,
                        n % 97
                    );
                    let key = client
                        .post("/v1/completions", &body)
                        .map(|e| (e.status, e.pod))
                        .unwrap_or((0, "connection error".into()));
                    *local.entry(key).or_insert(0) += 1;
                }
                let mut outcomes = outcomes.lock().unwrap_or_else(|p| p.into_inner());
                for (key, count) in local {
                    *outcomes.entry(key).or_insert(0) += count;
                }
            })
        })
        .collect();

    // Halfway, pod-1 dies; it comes back at the same address two seconds later.
    while next.load(Ordering::Relaxed) < total / 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let address = sims[0].address.clone();
    let port: u16 = address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    sims[0].kill();
    println!(
        "{:>7} requests sent: killed pod-1 ({address})",
        next.load(Ordering::Relaxed)
    );
    std::thread::sleep(Duration::from_secs(2));
    sims[0] = Sim::start_at("pod-1", port, &fast);
    println!(
        "{:>7} requests sent: pod-1 back",
        next.load(Ordering::Relaxed)
    );
    let mut reported = 0;
    while next.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        let sent = next.load(Ordering::Relaxed);
        if sent >= reported + total / 10 {
            reported = sent;
            println!(
                "{sent:>7} requests sent ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for thread in threads {
        let _ = thread.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(500));
    let rss_end = rss_kib(envoy.pid());

    let outcomes = outcomes.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sent: usize = outcomes.values().sum();
    let failed: usize = outcomes
        .iter()
        .filter(|((s, _), _)| *s != 200)
        .map(|(_, c)| c)
        .sum();
    let growth = 100.0 * (rss_end as f64 - rss_start as f64) / rss_start.max(1) as f64;
    let ok = growth <= 10.0 && failed * 100 <= sent && sent == total;
    let mut report = format!(
        "# Soak\n\n_Command: `make soak` (`cargo run --release --example soak -- --requests {total} --clients {clients}`); \
         Envoy --concurrency 4, 4 simulated pods, pod-1 killed at the halfway mark and restarted at the same address 2 s later; \
         {} cores._\n\n\
         - {sent} requests in {elapsed:.1} s ({:.0}/s)\n\
         - errors: {failed} ({:.3} %)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        sent as f64 / elapsed,
        100.0 * failed as f64 / sent.max(1) as f64
    );
    for ((status, what), count) in &outcomes {
        if *status != 200 {
            report.push_str(&format!("  - status {status} {what}: {count}\n"));
        }
    }
    report.push_str("- picks per pod (status 200):");
    for ((status, pod), count) in &outcomes {
        if *status == 200 {
            report.push_str(&format!(" {pod} {count};"));
        }
    }
    report.push_str(&format!(
        "\n- Envoy RSS: {} MiB at start, {} MiB at end ({growth:+.1} %)\n- result: {}\n",
        rss_start / 1024,
        rss_end / 1024,
        if ok { "ok" } else { "FAILED" }
    ));
    print!("{report}");
    let path = support::repo().join("bench/results/soak.md");
    if let Err(error) = std::fs::write(&path, &report) {
        eprintln!("writing {}: {error}", path.display());
    }
    drop(envoy);
    drop(sims);
    std::process::exit(if ok { 0 } else { 1 });
}
