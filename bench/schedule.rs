//! Part 1, scheduling cost: one full pick natively, and body parsing, per size.

use crate::load::all_of;
use crate::report::{csv_rows, csv_table, goal, markdown_table, Cell, Column, Part, Row};
use crate::workloads::{half_shared_chats, padded_completion};
use inference_picker_core::config::load as load_config;
use inference_picker_core::endpoint::Health;
use inference_picker_core::host::{HostError, MetricKind, Metrics};
use inference_picker_core::request::{parse_body, ApiKind};
use inference_picker_core::router::PoolSlot;
use inference_picker_core::router::STATS_PREFIX;
use inference_picker_core::scheduling::rng::Rng;
use inference_picker_core::stats::Stats;
use inference_picker_core::vm::configure::configure;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

const INTRO: &str = "## 1. Scheduling cost (native)\n\nOne full pick with GIE's default plugins \
     (queue 2, KV 2, prefix 3, max-score picker), chat prompt, fresh metrics; mean over \
     repeated picks of distinct prompts that share their first half.\n\n";

const BETWEEN: &str =
    "Every scorer visits each candidate, and the prompt is hashed once per request into \
     blocks, up to the prefix scorer's `maxPrefixBlocksToMatch`.\n\n\
     Parsing the request body (completions, one prompt string), natively:\n\n";

const CONFIGURE: &str = "\nConfiguring one VM, natively: loading and validating the YAML \
     configuration with N static endpoints (the shipped plugins), building each pool's rooms \
     (`vm::configure::configure`), and defining every stat (five per endpoint; here in an \
     in-memory name table, in Envoy a host call each). Envoy logs the same step per VM \
     (`configured with N endpoints in X ms`), which part 4 reports.\n\n";

/// Pool sizes whose configuration is timed.
const CONFIGURED: [usize; 5] = [1024, 4096, 16384, 20000, 65_536];

/// (endpoints, prompt characters) of each pick measured.
const PICKS: [(usize, usize); 5] = [(8, 8000), (64, 8000), (256, 8000), (64, 2000), (64, 32000)];
const BODIES: [usize; 4] = [1024, 32 * 1024, 220 * 1024, 1024 * 1024];

struct PickRow {
    endpoints: usize,
    prompt_chars: usize,
    ns_per_pick: f64,
}

impl Row for PickRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("endpoints", "endpoints"),
        Column::both("prompt chars", "prompt_chars"),
        Column::both("ns per pick", "ns_per_pick"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Count(self.endpoints),
            Cell::Count(self.prompt_chars),
            Cell::Fixed(self.ns_per_pick, 0),
        ]
    }
}

/// In the CSV these rows follow the picks' rows, marked `parse`, in nanoseconds.
struct ParseRow {
    body_bytes: usize,
    us_per_parse: f64,
}

impl Row for ParseRow {
    const COLUMNS: &'static [Column] = &[
        Column::csv("kind"),
        Column::both("body", "body_bytes"),
        Column::markdown("µs per parse"),
        Column::csv("ns_per_parse"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text("parse".into()),
            Cell::Kilobytes(self.body_bytes),
            Cell::Fixed(self.us_per_parse, 1),
            Cell::Fixed(self.us_per_parse * 1000.0, 0),
        ]
    }
}

/// In the CSV these rows follow the parses', marked `configure`, in milliseconds.
struct ConfigureRow {
    endpoints: usize,
    load_ms: f64,
    stats_ms: f64,
}

impl Row for ConfigureRow {
    const COLUMNS: &'static [Column] = &[
        Column::csv("kind"),
        Column::both("endpoints", "endpoints"),
        Column::both("load + director ms", "load_ms"),
        Column::both("stats ms", "stats_ms"),
        Column::markdown("total ms"),
    ];

    fn cells(&self) -> Vec<Cell> {
        vec![
            Cell::Text("configure".into()),
            Cell::Count(self.endpoints),
            Cell::Measure(self.load_ms, 1),
            Cell::Measure(self.stats_ms, 1),
            Cell::Measure(self.load_ms + self.stats_ms, 1),
        ]
    }
}

/// Stats defined in a name table, as Envoy looks a stat up by name before creating it.
#[derive(Default)]
struct NamedStats(RefCell<HashMap<String, u32>>);

impl Metrics for NamedStats {
    fn define(&self, _kind: MetricKind, name: &str) -> Result<u32, HostError> {
        let mut names = self.0.borrow_mut();
        let next = u32::try_from(names.len()).unwrap_or(u32::MAX);
        Ok(*names.entry(name.to_owned()).or_insert(next))
    }
    fn increment(&self, _id: u32, _offset: i64) -> Result<(), HostError> {
        Ok(())
    }
    fn record(&self, _id: u32, _value: u64) -> Result<(), HostError> {
        Ok(())
    }
}

/// Milliseconds to load a configuration of `endpoints` and to define its stats (best of 3).
fn time_configure(endpoints: usize) -> ConfigureRow {
    let mut yaml = String::from(
        "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n\
         - type: prefix-cache-scorer\n- type: lora-affinity-scorer\n- type: max-score-picker\n\
         pool:\n  endpoints:\n",
    );
    for i in 0..endpoints {
        let _ = writeln!(
            yaml,
            "  - address: 10.{}.{}.{}:8000\n    labels: {{llm-d.ai/role: decode}}",
            i / 65536,
            (i / 256) % 256,
            i % 256
        );
    }
    let (mut load_ms, mut stats_ms) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        let started = Instant::now();
        let configured = configure(yaml.as_bytes(), 7).expect("config");
        load_ms = load_ms.min(started.elapsed().as_secs_f64() * 1e3);
        let started = Instant::now();
        let slot = configured.router.slot(0).expect("one pool");
        let stats = Stats::define(NamedStats::default(), slot, STATS_PREFIX);
        stats_ms = stats_ms.min(started.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(stats);
    }
    ConfigureRow {
        endpoints,
        load_ms,
        stats_ms,
    }
}

pub fn run() -> Part {
    println!("schedule: one pick, default plugins + prefix scorer");
    let picks: Vec<PickRow> = PICKS
        .iter()
        .map(|&(endpoints, prompt_chars)| {
            let ns_per_pick = time_picks(endpoints, prompt_chars);
            println!(
                "  {endpoints:>4} endpoints, {prompt_chars:>6} chars: {ns_per_pick:>9.0} ns/pick"
            );
            PickRow {
                endpoints,
                prompt_chars,
                ns_per_pick,
            }
        })
        .collect();
    let parses: Vec<ParseRow> = BODIES
        .iter()
        .map(|&body_bytes| {
            let us_per_parse = time_parse(body_bytes);
            println!(
                "  parse {:>5} KB: {us_per_parse:>8.1} µs",
                body_bytes / 1024
            );
            ParseRow {
                body_bytes,
                us_per_parse,
            }
        })
        .collect();
    let configures: Vec<ConfigureRow> = CONFIGURED
        .iter()
        .map(|&endpoints| {
            let row = time_configure(endpoints);
            println!(
                "  configure {endpoints:>6} endpoints: {:>8.1} ms + stats {:>7.1} ms",
                row.load_ms, row.stats_ms
            );
            row
        })
        .collect();
    Part {
        markdown: format!(
            "{INTRO}{}\n{}{BETWEEN}{}{CONFIGURE}{}",
            markdown_table(&picks),
            scaling_goal(&picks),
            markdown_table(&parses),
            markdown_table(&configures)
        ),
        csv: csv_table(&picks) + &csv_rows(&parses) + &csv_rows(&configures),
        charts: Vec::new(),
    }
}

/// Microseconds per parse of a completions body of `bytes`.
fn time_parse(bytes: usize) -> f64 {
    let body = padded_completion(bytes);
    let iterations = (64 * 1024 * 1024 / bytes).clamp(20, 20_000);
    let started = Instant::now();
    for _ in 0..iterations {
        let parsed = parse_body(ApiKind::Completions, body.as_bytes()).expect("body");
        std::hint::black_box(parsed);
    }
    started.elapsed().as_secs_f64() * 1e6 / iterations as f64
}

/// Nanoseconds per pick (and release) among `endpoints` fresh endpoints, prompts of `chars`.
fn time_picks(endpoints: usize, chars: usize) -> f64 {
    let mut picker = director_with_fresh_metrics(endpoints);
    let bodies = half_shared_chats(64, chars);
    let requests: Vec<_> = bodies
        .iter()
        .map(|b| parse_body(ApiKind::ChatCompletions, b.as_bytes()).expect("body"))
        .collect();
    let iterations = (400_000 / endpoints.max(1)).clamp(200, 5000);
    let PoolSlot { director, data, .. } = &mut picker;
    for request in requests.iter().take(16) {
        let _ = director.route_parsed(data, request);
    }
    let started = Instant::now();
    for i in 0..iterations {
        let routed = director
            .route_parsed(data, &requests[i % requests.len()])
            .expect("routed");
        director.request_ended(data, &routed);
    }
    started.elapsed().as_nanos() as f64 / iterations as f64
}

/// A pool of `endpoints` static endpoints, each scraped once with random load.
fn director_with_fresh_metrics(endpoints: usize) -> PoolSlot {
    let mut yaml = String::from("pool:\n  endpoints:\n");
    for i in 0..endpoints {
        let _ = writeln!(
            yaml,
            "  - address: 10.{}.{}.{}:8000",
            i / 65536,
            (i / 256) % 256,
            i % 256
        );
    }
    let mut picker = PoolSlot::new("bench".into(), load_config(&yaml, 7).expect("config"));
    let mut rng = Rng::new(3);
    for i in 0..endpoints {
        let body = format!(
            "vllm:num_requests_waiting {}\nvllm:kv_cache_usage_perc {}\n",
            rng.below(10),
            rng.unit()
        );
        picker.data.scrape_answered(i, 0, &body).expect("metrics");
    }
    picker.data.refresh_health(0);
    assert!(picker
        .data
        .pool()
        .endpoints
        .iter()
        .all(|e| e.health == Health::Fresh));
    picker
}

/// From each size to the next along one axis (the other held): `(from, to, time ratio)`.
fn steps_along(
    picks: &[PickRow],
    size: impl Fn(&PickRow) -> usize,
    held: impl Fn(&PickRow) -> bool,
) -> Vec<(usize, usize, f64)> {
    let mut along: Vec<&PickRow> = picks.iter().filter(|p| held(p)).collect();
    along.sort_by_key(|p| size(p));
    along
        .windows(2)
        .map(|w| (size(w[0]), size(w[1]), w[1].ns_per_pick / w[0].ns_per_pick))
        .collect()
}

/// No faster than linear from one size to the next: the time grows by at most the size's
/// factor. Not measured without a finite figure.
fn linear_verdict(from: usize, to: usize, time_ratio: f64) -> Option<bool> {
    time_ratio
        .is_finite()
        .then_some(time_ratio <= to as f64 / from as f64)
}

/// Issue 5's goal: "Scaling must be close to linear in endpoints and in prompt length".
fn scaling_goal(picks: &[PickRow]) -> String {
    let prompt = PICKS[0].1;
    let endpoints = PICKS[3].0;
    let axes = [
        (
            "endpoints",
            steps_along(picks, |p| p.endpoints, |p| p.prompt_chars == prompt),
        ),
        (
            "prompt chars",
            steps_along(picks, |p| p.prompt_chars, |p| p.endpoints == endpoints),
        ),
    ];
    let mut figures = Vec::new();
    let mut verdicts = Vec::new();
    for (axis, steps) in &axes {
        if steps.is_empty() {
            verdicts.push(None);
            figures.push(format!("{axis}: not measured"));
        }
        for &(from, to, ratio) in steps {
            verdicts.push(linear_verdict(from, to, ratio));
            figures.push(format!(
                "{axis} {from} -> {to} ({:.1}x): {ratio:.2}x the time",
                to as f64 / from as f64
            ));
        }
    }
    goal(
        "scaling must be close to linear in endpoints and in prompt length (from each size to \
         the next, the time per pick grows no faster than the size)",
        all_of(verdicts),
        &figures.join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(endpoints: usize, prompt_chars: usize, ns_per_pick: f64) -> PickRow {
        PickRow {
            endpoints,
            prompt_chars,
            ns_per_pick,
        }
    }

    #[test]
    fn scaling_is_judged_on_every_step_of_both_axes() {
        let linear = [
            pick(8, 8000, 1000.0),
            pick(64, 8000, 2000.0),
            pick(256, 8000, 4000.0),
            pick(64, 2000, 1000.0),
            pick(64, 32000, 5000.0),
        ];
        assert!(scaling_goal(&linear).contains("**met**"));
        // Quadratic from 64 to 256 endpoints: 4x the endpoints, 16x the time.
        let quadratic = [
            pick(8, 8000, 1000.0),
            pick(64, 8000, 2000.0),
            pick(256, 8000, 32000.0),
            pick(64, 2000, 1000.0),
            pick(64, 32000, 5000.0),
        ];
        assert!(scaling_goal(&quadratic).contains("**not met**"));
        // Zero against zero is no figure.
        let nothing = [pick(8, 8000, 0.0), pick(64, 8000, 0.0)];
        assert!(scaling_goal(&nothing).contains("**not measured**"));
    }
}
