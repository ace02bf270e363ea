//! Part 1, scheduling cost: one full pick natively, and body parsing, per size.

use crate::report::{csv_rows, csv_table, markdown_table, Cell, Column, Part, Row};
use crate::workloads::{half_shared_chats, padded_completion};
use inference_picker::config::load as load_config;
use inference_picker::director::Director;
use inference_picker::endpoint::Health;
use inference_picker::request::{parse_body, ApiKind};
use inference_picker::scheduling::rng::Rng;
use std::fmt::Write as _;
use std::time::Instant;

const INTRO: &str = "## 1. Scheduling cost (native)\n\nOne full pick with GIE's default plugins \
     (queue 2, KV 2, prefix 3, max-score picker), chat prompt, fresh metrics; mean over \
     repeated picks of distinct prompts that share their first half.\n\n";

const BETWEEN: &str =
    "\nThe pick is linear in endpoints (every scorer visits each candidate) and in prompt \
     length (the prompt is hashed once per request into blocks, up to the prefix scorer's \
     `maxPrefixBlocksToMatch`).\n\n\
     Parsing the request body (completions, one prompt string), natively:\n\n";

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
    Part {
        markdown: format!(
            "{INTRO}{}{BETWEEN}{}",
            markdown_table(&picks),
            markdown_table(&parses)
        ),
        csv: csv_table(&picks) + &csv_rows(&parses),
        svg: None,
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
    for request in requests.iter().take(16) {
        let _ = picker.route_parsed(request);
    }
    let started = Instant::now();
    for i in 0..iterations {
        let routed = picker
            .route_parsed(&requests[i % requests.len()])
            .expect("routed");
        picker.release(&routed);
    }
    started.elapsed().as_nanos() as f64 / iterations as f64
}

/// A director over `endpoints` static endpoints, each scraped once with random load.
fn director_with_fresh_metrics(endpoints: usize) -> Director {
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
    let mut picker = Director::new(load_config(&yaml, 7).expect("config"));
    let mut rng = Rng::new(3);
    for i in 0..endpoints {
        let body = format!(
            "vllm:num_requests_waiting {}\nvllm:kv_cache_usage_perc {}\n",
            rng.below(10),
            rng.unit()
        );
        picker.on_scrape_ok(i, 0, &body).expect("metrics");
    }
    picker.on_tick(0);
    assert!(picker
        .pool()
        .endpoints
        .iter()
        .all(|e| e.health == Health::Fresh));
    picker
}
