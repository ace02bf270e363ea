//! Load generation (closed and open loop over keep-alive connections) and percentiles.

use crate::support::{Exchange, KeepAlive};
use inference_picker_core::scheduling::rng::Rng;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// No closed loop runs longer than this.
const CLOSED_LOOP_LIMIT: Duration = Duration::from_secs(120);

/// Closed loop: `clients` keep-alive connections sending `count` requests in all.
pub fn closed_loop(address: &str, clients: usize, count: usize, body: &str) -> Vec<Exchange> {
    closed_loop_over(address, clients, count, &|_| body)
}

/// Closed loop where request `n` carries `body(n)`.
pub fn closed_loop_over<'b>(
    address: &str,
    clients: usize,
    count: usize,
    body: &(dyn Fn(usize) -> &'b str + Sync),
) -> Vec<Exchange> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(count));
    let deadline = Instant::now() + CLOSED_LOOP_LIMIT;
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let mut client = KeepAlive::new(address);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= count || Instant::now() > deadline {
                        return;
                    }
                    if let Ok(exchange) = client.post("/v1/completions", body(n)) {
                        results.lock().expect("results").push(exchange);
                    }
                }
            });
        }
    });
    results.into_inner().expect("results")
}

/// What an open loop saw: the successful exchanges, the failures, the seconds it took.
pub struct OpenLoop {
    pub ok: Vec<Exchange>,
    /// The index in `requests` of each of `ok`.
    pub ok_requests: Vec<usize>,
    pub ok_sent_at: Vec<f64>,
    pub errors: usize,
    pub elapsed: f64,
}

/// Open loop: Poisson arrivals at `rate` per second, one thread per request in flight, these
/// headers on each; request `n` goes to `addresses[n % len]` (several gateways behind a
/// round-robin L4 balancer).
pub fn open_loop_with(
    addresses: &[String],
    requests: &[String],
    rate: f64,
    seed: u64,
    headers: &[(&str, &str)],
) -> OpenLoop {
    open_loop_balanced(
        addresses,
        requests,
        rate,
        seed,
        &|n| n % addresses.len(),
        headers,
    )
}

/// [`open_loop_with`], request `n` sent to `addresses[balance(n)]`.
pub fn open_loop_balanced(
    addresses: &[String],
    requests: &[String],
    rate: f64,
    seed: u64,
    balance: &(dyn Fn(usize) -> usize + Sync),
    headers: &[(&str, &str)],
) -> OpenLoop {
    let route = |n: usize| addresses[balance(n) % addresses.len()].clone();
    open_loop_routed(requests, rate, seed, &route, headers)
}

/// [`open_loop_with`], request `n` sent to the address `route(n)` names when it is sent: a
/// fleet that loses or gains a gateway mid-run.
pub fn open_loop_routed(
    requests: &[String],
    rate: f64,
    seed: u64,
    route: &(dyn Fn(usize) -> String + Sync),
    headers: &[(&str, &str)],
) -> OpenLoop {
    let started = Instant::now();
    let sent = open_loop_each(requests.len(), rate, seed, &|n,
                                                            client: &mut Option<
        KeepAlive,
    >| {
        let address = route(n);
        client
            .get_or_insert_with(|| KeepAlive::new(&address))
            .post_with("/v1/chat/completions", headers, &requests[n])
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut ok = Vec::new();
    let mut ok_requests = Vec::new();
    let mut ok_sent_at = Vec::new();
    let mut errors = 0;
    for (n, at, result) in sent {
        match result {
            Some(exchange) if exchange.status == 200 => {
                ok.push(exchange);
                ok_requests.push(n);
                ok_sent_at.push(at);
            }
            _ => errors += 1,
        }
    }
    OpenLoop {
        ok,
        ok_requests,
        ok_sent_at,
        errors,
        elapsed,
    }
}

/// Poisson arrivals at `rate` per second of `count` requests, each on its own thread and
/// connection: `send(n, client)` sends request `n` and says what came back (an [`Exchange`],
/// or more). Returns `(n, seconds after the start it was sent, what came back)`, `None` for a
/// transport error.
pub fn open_loop_each<T: Send>(
    count: usize,
    rate: f64,
    seed: u64,
    send: &(dyn Fn(usize, &mut Option<KeepAlive>) -> std::io::Result<T> + Sync),
) -> Vec<(usize, f64, Option<T>)> {
    let mut rng = Rng::new(seed);
    let results = Mutex::new(Vec::with_capacity(count));
    let started = Instant::now();
    let mut at = 0.0f64;
    std::thread::scope(|scope| {
        for n in 0..count {
            at += -(1.0 - rng.unit()).ln() / rate;
            std::thread::sleep(Duration::from_secs_f64(at).saturating_sub(started.elapsed()));
            let (results, sent_at) = (&results, started.elapsed().as_secs_f64());
            scope.spawn(move || {
                let outcome = send(n, &mut None).ok();
                results.lock().expect("results").push((n, sent_at, outcome));
            });
        }
    });
    results.into_inner().expect("results")
}

/// The value at percentile `p` of sorted values (nearest rank); NaN if there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// A goal judged on several figures: not met if any is not met, not measured if any was not
/// measured (or there is none), met only if every one is.
pub fn all_of(verdicts: impl IntoIterator<Item = Option<bool>>) -> Option<bool> {
    let mut all = None;
    for verdict in verdicts {
        match verdict {
            Some(false) => return Some(false),
            None => all = Some(None),
            Some(true) => {
                all.get_or_insert(Some(true));
            }
        }
    }
    all.flatten()
}

/// p50, p90 and p99 of a sample.
#[derive(Clone, Copy)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(sorted: &[f64]) -> Percentiles {
        Percentiles {
            p50: percentile(sorted, 50.0),
            p90: percentile(sorted, 90.0),
            p99: percentile(sorted, 99.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::all_of;

    #[test]
    fn all_of_is_met_only_when_every_figure_is() {
        assert_eq!(all_of([]), None);
        assert_eq!(all_of([Some(true), Some(true)]), Some(true));
        assert_eq!(all_of([Some(true), None]), None);
        assert_eq!(all_of([None, Some(true)]), None);
        assert_eq!(all_of([None, Some(false)]), Some(false));
        assert_eq!(all_of([Some(true), Some(false), None]), Some(false));
    }
}
