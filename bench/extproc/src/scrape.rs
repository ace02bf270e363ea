//! Keeps every pool's metrics fresh: every `pool.refreshMetricsInterval` (the shortest of the
//! pools'), a `GET /metrics` to each endpoint (in parallel, each bounded by its pool's
//! `pool.metricsTimeout`), then a health tick.

use crate::exchange::Shared;
use inference_picker_core::duration::duration_ms;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scrape to make: the pool, the endpoint's index in it, its address, path and timeout.
type Job = (usize, usize, String, String, Duration);

pub fn spawn(shared: Arc<Mutex<Shared>>) {
    std::thread::spawn(move || loop {
        let Ok((interval, jobs)) = shared.lock().map(|mut shared| jobs(&mut shared)) else {
            return;
        };
        let fetches: Vec<_> = jobs
            .into_iter()
            .map(|(pool, index, address, path, timeout)| {
                std::thread::spawn(move || (pool, index, fetch(&address, &path, timeout)))
            })
            .collect();
        for fetch in fetches {
            let Ok((pool, index, result)) = fetch.join() else {
                continue;
            };
            let Ok(mut shared) = shared.lock() else {
                return;
            };
            let now = duration_ms(shared.started.elapsed());
            let Some(director) = shared.picker.director_mut(pool) else {
                continue;
            };
            match result {
                Some(body) => {
                    if director.on_scrape_ok(index, now, &body).is_err() {
                        director.on_scrape_failed(index);
                    }
                }
                None => director.on_scrape_failed(index),
            }
        }
        if let Ok(mut shared) = shared.lock() {
            let now = duration_ms(shared.started.elapsed());
            for slot in shared.picker.slots_mut() {
                slot.director.on_tick(now);
            }
        }
        std::thread::sleep(interval);
    });
}

/// Every pool's due scrapes, and how long to wait before the next round.
fn jobs(shared: &mut Shared) -> (Duration, Vec<Job>) {
    let mut interval = Duration::MAX;
    let mut jobs = Vec::new();
    let mut targets = Vec::new();
    for (pool, slot) in shared.picker.slots_mut().iter_mut().enumerate() {
        let director = &mut slot.director;
        director.take_scrape_targets(&mut targets);
        let settings = director.settings();
        interval = interval.min(settings.refresh_metrics_interval);
        let (path, timeout) = (settings.metrics_path.clone(), settings.metrics_timeout);
        jobs.extend(targets.iter().filter_map(|&index| {
            let address = director.address(index)?.to_string();
            Some((pool, index, address, path.clone(), timeout))
        }));
    }
    // No pool: look again in a second.
    let interval = if interval == Duration::MAX {
        Duration::from_secs(1)
    } else {
        interval
    };
    (interval, jobs)
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
