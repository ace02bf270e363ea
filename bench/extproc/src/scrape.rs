//! Keeps the pool's metrics fresh: every `pool.refreshMetricsInterval`, a `GET /metrics` to each
//! endpoint (in parallel, each bounded by `pool.metricsTimeout`), then a health tick.

use inference_picker::director::Director;
use inference_picker::duration::duration_ms;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn spawn(picker: Arc<Mutex<Director>>) {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut targets = Vec::new();
        loop {
            let (interval, timeout, path, jobs) = {
                let Ok(mut picker) = picker.lock() else {
                    return;
                };
                picker.take_scrape_targets(&mut targets);
                let settings = picker.settings();
                let jobs: Vec<(usize, String)> = targets
                    .iter()
                    .filter_map(|&i| Some((i, picker.address(i)?.to_string())))
                    .collect();
                (
                    settings.refresh_metrics_interval,
                    settings.metrics_timeout,
                    settings.metrics_path.clone(),
                    jobs,
                )
            };
            let fetches: Vec<_> = jobs
                .into_iter()
                .map(|(index, address)| {
                    let path = path.clone();
                    std::thread::spawn(move || (index, fetch(&address, &path, timeout)))
                })
                .collect();
            for fetch in fetches {
                let Ok((index, result)) = fetch.join() else {
                    continue;
                };
                let Ok(mut picker) = picker.lock() else {
                    return;
                };
                let now = duration_ms(started.elapsed());
                match result {
                    Some(body) => {
                        if picker.on_scrape_ok(index, now, &body).is_err() {
                            picker.on_scrape_failed(index);
                        }
                    }
                    None => picker.on_scrape_failed(index),
                }
            }
            if let Ok(mut picker) = picker.lock() {
                picker.on_tick(duration_ms(started.elapsed()));
            }
            std::thread::sleep(interval);
        }
    });
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
