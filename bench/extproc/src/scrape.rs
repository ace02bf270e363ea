//! Keeps every pool's metrics fresh: every `pool.refreshMetricsInterval` (the shortest of the
//! pools'), a `GET /metrics` to each endpoint (in parallel, each bounded by its pool's
//! `pool.metricsTimeout`), then a health tick.

use crate::exchange::Shared;
use inference_picker_core::duration::duration_ms;
use inference_picker_core::host::fake::{FakeCallouts, NoSharedData};
use inference_picker_core::host::CalloutAnswer;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub fn spawn(shared: Arc<Mutex<Shared>>) {
    // The scrape calls each pool's data layer sends, recorded here and answered with what the
    // fetch threads bring back: the same rounds, window and back-off as in Envoy.
    let calls = Calls::default();
    std::thread::spawn(move || loop {
        let Ok(interval) = shared.lock().map(|mut shared| start_rounds(&mut shared, &calls)) else {
            return;
        };
        loop {
            let jobs = take_jobs(&shared, &calls);
            if jobs.is_empty() {
                break;
            }
            let fetches: Vec<_> = jobs
                .into_iter()
                .map(|(pool, token, address, path, timeout)| {
                    std::thread::spawn(move || (pool, token, fetch(&address, &path, timeout)))
                })
                .collect();
            for fetch in fetches {
                let Ok((pool, token, body)) = fetch.join() else {
                    continue;
                };
                let Ok(mut shared) = shared.lock() else {
                    return;
                };
                let now = duration_ms(shared.started.elapsed());
                let Some(slot) = shared.router.slot_mut(pool) else {
                    continue;
                };
                let answer = CalloutAnswer {
                    status: body.as_ref().map(|_| b"200".to_vec()),
                    body_size: body.as_ref().map_or(0, String::len),
                    body: Ok(body.map(String::into_bytes).unwrap_or_default()),
                };
                slot.data
                    .on_answer((&calls.callouts, &NoSharedData), token, &answer, now, true, None);
                // An answer lets the round's next scrapes go: they are this pool's too.
                note_pool(&calls, pool);
            }
        }
        if let Ok(mut shared) = shared.lock() {
            let now = duration_ms(shared.started.elapsed());
            for slot in shared.router.slots_mut() {
                slot.data.refresh_health(now);
            }
        }
        std::thread::sleep(interval);
    });
}

/// One scrape to make: the pool, the call's token, the endpoint's address, path and timeout.
type Job = (usize, u32, String, String, Duration);

/// The scrape calls of the data layers, kept to be answered.
#[derive(Default)]
struct Calls {
    callouts: FakeCallouts,
    /// Which pool sent each call.
    pools: RefCell<HashMap<u32, usize>>,
}

/// Every pool's data layer starts its due scrape round; returns how long to wait before the
/// next.
fn start_rounds(shared: &mut Shared, calls: &Calls) -> Duration {
    let mut interval = Duration::MAX;
    let now = duration_ms(shared.started.elapsed());
    for (pool, slot) in shared.router.slots_mut().iter_mut().enumerate() {
        interval = interval.min(slot.data.settings().refresh_metrics_interval);
        slot.data.call_out(&calls.callouts, now);
        note_pool(calls, pool);
    }
    // No pool: look again in a second.
    if interval == Duration::MAX {
        Duration::from_secs(1)
    } else {
        interval
    }
}

/// Marks the calls sent since the last look as `pool`'s.
fn note_pool(calls: &Calls, pool: usize) {
    let mut pools = calls.pools.borrow_mut();
    for call in calls.callouts.sent.borrow().iter() {
        pools.entry(call.token).or_insert(pool);
    }
}

/// The calls sent and not fetched yet, as fetches to make.
fn take_jobs(shared: &Arc<Mutex<Shared>>, calls: &Calls) -> Vec<Job> {
    let Ok(shared) = shared.lock() else {
        return Vec::new();
    };
    let sent = calls.callouts.take_sent();
    let mut pools = calls.pools.borrow_mut();
    sent.into_iter()
        .filter_map(|call| {
            let pool = pools.remove(&call.token)?;
            let settings = shared.router.slot(pool)?.data.settings();
            let address = call.authority()?.to_owned();
            let path = settings.metrics_path.clone();
            Some((pool, call.token, address, path, settings.metrics_timeout))
        })
        .collect()
}

/// The body of a 200 answer, or None.
fn fetch(address: &str, path: &str, timeout: Duration) -> Option<String> {
    let socket = address.parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&socket, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}
