//! `make soak`: 200,000 requests through Envoy (the shipped `envoy/envoy.yaml`, four workers)
//! and the filter in front of four simulated pods, while pods die under load three ways: pod-1
//! is killed (SIGKILL) and restarted at its address 2 s later, pod-2 refuses new connections for
//! 2 s while its open ones (scrapes included) are served, pod-3 is stopped gracefully (SIGTERM,
//! it drains) and restarted 2 s later. Reports the errors clients saw after each event, Envoy's
//! retries, the picks of each pod while it was gone and when it was picked again, picks per pod,
//! and Envoy's memory; writes `bench/results/soak.md`. Fails on any error, a pod not picked again,
//! or Envoy's memory growing more than 10 % after the warm-up.
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

/// A counter from Envoy's admin `/stats` (0 if absent).
fn envoy_stat(envoy: &Envoy, name: &str) -> u64 {
    envoy
        .admin_get(&format!("/stats?filter=^{name}$"))
        .text()
        .lines()
        .find_map(|l| l.split_once(": ").map(|(_, v)| v.trim().to_string()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const RETRIES: &str = "cluster.inference_pool.upstream_rq_retry";

/// One response: when it arrived, its status (0: none) and the pod that served it.
struct Answer {
    at: Instant,
    status: u16,
    pod: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Death {
    Kill,
    Refuse,
    Terminate,
}

impl Death {
    fn describe(self) -> &'static str {
        match self {
            Death::Kill => "killed (SIGKILL), restarted at its address 2 s later",
            Death::Refuse => "refuses new connections for 2 s, open ones served",
            Death::Terminate => "stopped gracefully (SIGTERM, drains), restarted 2 s later",
        }
    }
}

/// What happened around one event.
struct Event {
    death: Death,
    pod: usize,
    sent_at_event: usize,
    at: Instant,
    back: Instant,
    /// Picks of the pod from 0.5 s after the event until it was back.
    picks_while_gone: u64,
    retries_before: u64,
    retries_after: u64,
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
    let addresses: Vec<String> = sims.iter().map(|s| s.address.clone()).collect();
    let rss_start = rss_kib(envoy.pid());
    println!("soak: {total} requests, {clients} keep-alive clients, Envoy --concurrency 4, 4 pods");
    println!("Envoy RSS before the load: {} MiB", rss_start / 1024);

    let next = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(Vec::<Answer>::with_capacity(total)));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (next, answers, address) = (next.clone(), answers.clone(), envoy.address());
            std::thread::spawn(move || {
                let mut client = KeepAlive::new(&address);
                let mut local = Vec::new();
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= total || Instant::now() > deadline {
                        break;
                    }
                    let body = format!(
                        r#"{{"model":"{MODEL}","prompt":"soak request {n} about topic {}","max_tokens":4}}"#,
                        n % 97
                    );
                    let (status, pod) = client
                        .post("/v1/completions", &body)
                        .map(|e| (e.status, e.pod))
                        .unwrap_or((0, "no response".into()));
                    local.push(Answer {
                        at: Instant::now(),
                        status,
                        pod,
                    });
                }
                let mut answers = answers.lock().unwrap_or_else(|p| p.into_inner());
                answers.extend(local);
            })
        })
        .collect();
    let sent = || next.load(Ordering::Relaxed);
    let wait_until_sent = |count: usize| {
        while sent() < count && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // The warm-up: connection pools and buffers are in place before memory is compared.
    wait_until_sent(total / 20);
    let rss_warm = rss_kib(envoy.pid());
    println!(
        "{:>7} requests sent: Envoy RSS after the warm-up {} MiB",
        sent(),
        rss_warm / 1024
    );

    let plan = [
        (Death::Kill, 0, 20),
        (Death::Refuse, 1, 45),
        (Death::Terminate, 2, 70),
    ];
    let mut events = Vec::new();
    for (death, pod, percent) in plan {
        wait_until_sent(total * percent / 100);
        let retries_before = envoy_stat(&envoy, RETRIES);
        let at = Instant::now();
        let sent_at_event = sent();
        let port = sims[pod].port();
        match death {
            Death::Kill => sims[pod].kill(),
            Death::Refuse => {
                sims[pod].admin("fault", r#"{"mode":"refuse","for_ms":2000}"#);
            }
            Death::Terminate => sims[pod].terminate(),
        }
        println!(
            "{sent_at_event:>7} requests sent: pod-{} {}",
            pod + 1,
            death.describe()
        );
        std::thread::sleep(Duration::from_millis(500));
        let gone_from = envoy.endpoint_picks(&addresses[pod]);
        std::thread::sleep((at + Duration::from_secs(2)).saturating_duration_since(Instant::now()));
        let picks_while_gone = envoy
            .endpoint_picks(&addresses[pod])
            .saturating_sub(gone_from);
        if death != Death::Refuse {
            sims[pod] = Sim::start_at(&format!("pod-{}", pod + 1), port, &fast);
        }
        let back = Instant::now();
        println!("{:>7} requests sent: pod-{} back", sent(), pod + 1);
        // Until the next event: its back-offs end and it is picked again.
        std::thread::sleep(Duration::from_secs(6));
        events.push(Event {
            death,
            pod,
            sent_at_event,
            at,
            back,
            picks_while_gone,
            retries_before,
            retries_after: envoy_stat(&envoy, RETRIES),
        });
    }
    let mut reported = 0;
    while sent() < total && Instant::now() < deadline {
        if sent() >= reported + total / 10 {
            reported = sent();
            println!(
                "{reported:>7} requests sent ({:.0} s)",
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
    let retries_total = envoy_stat(&envoy, RETRIES);
    let retries_ok = envoy_stat(&envoy, "cluster.inference_pool.upstream_rq_retry_success");

    let answers = std::mem::take(&mut *answers.lock().unwrap_or_else(|p| p.into_inner()));
    let answered = answers.len();
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.status != 200).collect();
    let mut by_failure = BTreeMap::<(u16, &str), usize>::new();
    for answer in &failed {
        *by_failure
            .entry((answer.status, answer.pod.as_str()))
            .or_insert(0) += 1;
    }
    let mut served = BTreeMap::<&str, usize>::new();
    for answer in answers.iter().filter(|a| a.status == 200) {
        *served.entry(answer.pod.as_str()).or_insert(0) += 1;
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut report = format!(
        "# Soak\n\n_Command: `make soak` (`cargo run --release --example soak -- --requests {total} --clients {clients}`); \
         Envoy 1.40 with the shipped `envoy/envoy.yaml` (pool cluster, override_host, two retries on the picker's next picks), \
         --concurrency 4, 4 simulated pods (`--time-scale 0.001`); {cores} cores._\n\n\
         - {answered} requests in {elapsed:.1} s ({:.0}/s)\n\
         - errors seen by clients: {} ({:.3} %)\n",
        answered as f64 / elapsed,
        failed.len(),
        100.0 * failed.len() as f64 / answered.max(1) as f64
    );
    for ((status, what), count) in &by_failure {
        report.push_str(&format!("  - status {status} {what}: {count}\n"));
    }
    report.push_str(&format!(
        "- Envoy retries: {retries_total}, of which answered on the retry: {retries_ok}\n\n\
         | event | at request | errors until the next event | Envoy retries | picks while gone (0.5 s after the event until back) | picked again after it was back | served by it in the 6 s after |\n\
         |---|---:|---:|---:|---:|---:|---:|\n"
    ));
    let mut ok = true;
    for (i, event) in events.iter().enumerate() {
        let until = events.get(i + 1).map(|e| e.at);
        let errors = failed
            .iter()
            .filter(|a| a.at >= event.at && until.is_none_or(|u| a.at < u))
            .count();
        let name = format!("pod-{}", event.pod + 1);
        let after_back: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.pod == name && a.at >= event.back)
            .collect();
        let first = after_back.iter().map(|a| a.at).min();
        let within = after_back
            .iter()
            .filter(|a| a.at < event.back + Duration::from_secs(6))
            .count();
        ok &= first.is_some();
        report.push_str(&format!(
            "| {name} {} | {} | {errors} | {} | {} | {} | {within} |\n",
            event.death.describe(),
            event.sent_at_event,
            event.retries_after.saturating_sub(event.retries_before),
            event.picks_while_gone,
            first.map_or("never".into(), |at| format!(
                "after {:.1} s",
                at.duration_since(event.back).as_secs_f64()
            )),
        ));
    }
    report.push_str("\n- served per pod (status 200):");
    for (pod, count) in &served {
        report.push_str(&format!(" {pod} {count};"));
    }
    let growth = 100.0 * (rss_end as f64 - rss_warm as f64) / rss_warm.max(1) as f64;
    ok &= failed.is_empty() && growth <= 10.0 && answered == total;
    report.push_str(&format!(
        "\n- Envoy RSS: {} MiB before the load, {} MiB after the warm-up ({} requests), {} MiB at the end ({growth:+.1} % since the warm-up)\n\
         - result: {}\n",
        rss_start / 1024,
        rss_warm / 1024,
        total / 20,
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
