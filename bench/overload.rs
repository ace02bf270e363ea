//! Part 6, overload and flow control: arrivals at 1.5x what the pods can serve, from two
//! tenants (one sending four times more) at two priorities, through the picker with flow
//! control, the same picker without it, and Envoy's LEAST_REQUEST; TTFT per priority and per
//! tenant, throughput, errors, and how many requests wait inside the pods over time.

use crate::chart::{line_chart_on, YAxis};
use crate::load::{open_loop_each, sorted, Percentiles};
use crate::report::{csv_table, goal, markdown_table, Cell, Chart, Column, Part, Row};
use crate::setup::{filter_stat, plain_envoy};
use crate::support::http1::Client;
use crate::support::{with_endpoints, Envoy, KeepAlive, Sim};
use crate::workloads::{flag_value, prompt_tokens, unique_chat, OUTPUT_TOKENS};
use inference_picker_core::error_response::Dropped;
use inference_picker_core::protocol::DROPPED_REASON_HEADER;
use inference_picker_core::scheduling::rng::Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Overload pods: four sequences at a time, real time, 100 µs per prompt token, 10 ms per
/// output token (slower as the batch grows).
const SIM: [&str; 10] = [
    "--max-num-seqs",
    "4",
    "--time-scale",
    "1",
    "--prefill-us-per-token",
    "100",
    "--decode-ms-per-token",
    "10",
    "--kv-blocks",
    "8192",
];
const PODS: usize = 4;
/// Prompt tokens per request (each prompt unique: no prefix cache effects).
const PROMPT_TOKENS: usize = 256;
const HIGH_PRIORITY_SHARE: f64 = 0.2;
const HEAVY_TENANT_SHARE: f64 = 0.8;
/// Offered load over capacity while overloaded, and while unloaded (the reference TTFT).
const OVERLOAD: f64 = 1.5;
const UNLOADED: f64 = 0.25;
/// `priority-holdback-policy`'s `minCeiling`: the standard band dispatches while the pool is
/// below this share of its slots; the rest is kept for interactive requests.
const HOLDBACK: f64 = 0.7;
/// `defaultRequestTTL`, seconds: under the load client's read timeout, so the queue refuses
/// (429) what the client would otherwise give up on.
const TTL_S: u32 = 50;
const CLIENT_TIMEOUT_S: u64 = 60;

/// One request's class: its tenant (fairness id) and objective (priority).
#[derive(Clone, Copy, PartialEq)]
struct Class {
    heavy: bool,
    high: bool,
}

impl Class {
    fn of(n: usize) -> Class {
        let mut rng = Rng::new(0x0f10 ^ n as u64);
        Class {
            heavy: rng.unit() < HEAVY_TENANT_SHARE,
            high: rng.unit() < HIGH_PRIORITY_SHARE,
        }
    }

    fn headers(self) -> [(&'static str, &'static str); 2] {
        [
            (
                "x-llm-d-inference-fairness-id",
                if self.heavy { "heavy" } else { "light" },
            ),
            (
                "x-llm-d-inference-objective",
                if self.high { "interactive" } else { "standard" },
            ),
        ]
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Contender {
    Picker(Gate),
    LeastRequest,
}

/// The contenders, in the report's order: the default first (the goals judge it).
const CONTENDERS: [Contender; 5] = [
    Contender::Picker(Gate::Default),
    Contender::Picker(Gate::WorkConserving),
    Contender::Picker(Gate::Holdback),
    Contender::Picker(Gate::Off),
    Contender::LeastRequest,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Picker(Gate::Default) => "picker, flow control",
            Contender::Picker(Gate::WorkConserving) => "picker, flow control, work-conserving",
            Contender::Picker(Gate::Holdback) => "picker, flow control with holdback",
            Contender::Picker(Gate::Off) => "picker, no flow control",
            Contender::LeastRequest => "Envoy LEAST_REQUEST",
        }
    }

    /// For the chart's legend.
    fn short_name(self) -> &'static str {
        match self {
            Contender::Picker(Gate::Default) => "flow control",
            Contender::Picker(Gate::WorkConserving) => "work-conserving",
            Contender::Picker(Gate::Holdback) => "holdback",
            Contender::Picker(Gate::Off) => "no flow control",
            Contender::LeastRequest => "LEAST_REQUEST",
        }
    }

    fn start(self, sims: &[&Sim]) -> Envoy {
        match self {
            Contender::Picker(gate) => Envoy::start(&with_endpoints(&picker_config(gate), sims), 2),
            Contender::LeastRequest => plain_envoy(sims, "LEAST_REQUEST"),
        }
    }
}

/// Flow control off, or on: as configured by default (two bands: `priority-reserve-policy`
/// keeps the slots the interactive band needs at the rate it arrives), work-conserving
/// (`static-usage-limit-policy` at 1.0: a request waits only while no pod has a free slot), or
/// with `priority-holdback-policy` (a fixed share of the slots kept for the interactive band).
#[derive(Clone, Copy, PartialEq)]
enum Gate {
    Off,
    Default,
    WorkConserving,
    Holdback,
}

/// GIE's default scorers plus llm-d's `active-request-scorer` (the pick follows the filter's
/// own in-flight counts, so a request goes to the pod with the free slot); the concurrency
/// detector at the pods' sequence slots (room = a free slot); with the gate, flow control with
/// a band per objective and tenants taking turns, and with `Holdback` the standard band held
/// back below [`HOLDBACK`] of the slots.
fn picker_config(gate: Gate) -> String {
    let slots = flag_value(&SIM, "--max-num-seqs");
    let (limit_plugin, limit_ref) = match gate {
        Gate::Holdback => (
            format!("- type: priority-holdback-policy\n  parameters: {{minCeiling: {HOLDBACK}}}\n"),
            "  usageLimitPolicyPluginRef: priority-holdback-policy\n",
        ),
        Gate::WorkConserving => (
            "- type: static-usage-limit-policy\n  parameters: {threshold: 1.0}\n".to_owned(),
            "  usageLimitPolicyPluginRef: static-usage-limit-policy\n",
        ),
        Gate::Off | Gate::Default => (String::new(), ""),
    };
    format!(
        "{}plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: active-request-scorer
- type: concurrency-detector
  parameters: {{maxConcurrency: {slots}}}
- type: round-robin-fairness-policy
{limit_plugin}schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
  - {{pluginRef: active-request-scorer, weight: 2}}
saturationDetector: {{pluginRef: concurrency-detector}}
flowControl:
  defaultRequestTTL: {TTL_S}s
{limit_ref}  priorityBands:
  - {{priority: 10, fairnessPolicyRef: round-robin-fairness-policy}}
  - {{priority: 0, fairnessPolicyRef: round-robin-fairness-policy}}
pool:
  objectives: [{{name: interactive, priority: 10}}, {{name: standard, priority: 0}}]
  endpoints: []
",
        if gate == Gate::Off {
            ""
        } else {
            "featureGates: [flowControl]\n"
        }
    )
}

/// What came back for one request: its status, when its first body bytes came (for a stream,
/// the first token's chunk), and how it ended.
struct Answer {
    status: u16,
    first_byte: Duration,
    outcome: Outcome,
}

/// How a request ended, as the goal counts it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Outcome {
    Served,
    /// Refused by the picker's policy because the pool was saturated: flow control's queue
    /// full or TTL expired (429 with `x-llm-d-request-dropped-reason`), or a sheddable
    /// request refused by the saturation detector (429, the filter's JSON error).
    Shed,
    /// Anything else: Envoy's own 503s and resets, the pods' errors, the filter's refusals
    /// that are not shedding (no endpoint, filtered out), no answer at all.
    Failed,
}

/// The saturation detector's refusal of a sheddable request, as the filter words it
/// (`director.rs`; the `shed` stat counts the same refusals).
const SHED_MESSAGE: &str = "the pool is saturated and the request is sheddable";

/// Reads a response: served, shed by the picker's policy (only the filter's own refusals for
/// saturation: a 503 from Envoy, or from the filter for want of an endpoint, is a failure),
/// or failed.
fn outcome(status: u16, dropped_reason: Option<&str>, body: &[u8]) -> Outcome {
    let saturated = [Dropped::QueueFull, Dropped::TtlExpired];
    match (status, dropped_reason) {
        (200, _) => Outcome::Served,
        (429, Some(reason)) if saturated.iter().any(|d| d.reason() == reason) => Outcome::Shed,
        (429, None) if String::from_utf8_lossy(body).contains(SHED_MESSAGE) => Outcome::Shed,
        _ => Outcome::Failed,
    }
}

/// One request with the class's headers on its own connection, timed as `KeepAlive` times
/// it, its refusal read from the response.
fn post(address: &str, class: Class, body: &str) -> std::io::Result<Answer> {
    let mut client = Client::connect(address, Duration::from_secs(CLIENT_TIMEOUT_S))?;
    let mut headers = vec![("host", "bench"), ("content-type", "application/json")];
    headers.extend_from_slice(&class.headers());
    let started = Instant::now();
    let mut first_byte = None;
    let response = client.send(
        "POST",
        "/v1/chat/completions",
        &headers,
        body.as_bytes(),
        &mut |_| {
            first_byte.get_or_insert_with(|| started.elapsed());
        },
    )?;
    let total = started.elapsed();
    // A served stream's body is not kept: only a refusal's is read.
    let refusal: &[u8] = if response.status == 200 {
        &[]
    } else {
        &response.body
    };
    Ok(Answer {
        status: response.status,
        first_byte: first_byte.unwrap_or(total),
        outcome: outcome(
            response.status,
            response.header(DROPPED_REASON_HEADER),
            refusal,
        ),
    })
}

/// One request as the client saw it.
struct Sent {
    class: Class,
    sent_at: f64,
    answer: Option<Answer>,
}

impl Sent {
    fn outcome(&self) -> Outcome {
        self.answer.as_ref().map_or(Outcome::Failed, |a| a.outcome)
    }

    fn ok(&self) -> bool {
        self.outcome() == Outcome::Served
    }

    fn ttft_ms(&self) -> Option<f64> {
        self.answer
            .as_ref()
            .filter(|a| a.outcome == Outcome::Served)
            .map(|a| a.first_byte.as_secs_f64() * 1e3)
    }
}

/// A contender's run: what every request got, the queue samples, how long it took.
struct Run {
    sent: Vec<Sent>,
    /// `(seconds, requests waiting in the pods, requests held in Envoy)`.
    samples: Vec<(f64, f64, f64)>,
    elapsed: f64,
}

impl Run {
    fn ttft(&self, keep: impl Fn(Class) -> bool) -> Percentiles {
        Percentiles::of(&sorted(
            self.sent
                .iter()
                .filter(|s| keep(s.class))
                .filter_map(Sent::ttft_ms)
                .collect(),
        ))
    }

    /// Requests of one flow answered before an earlier one of the same flow, by more than
    /// the pods' per-request jitter (50 ms), over pairs of consecutive requests of a flow.
    fn order_inversions(&self) -> f64 {
        let mut inverted = 0usize;
        let mut pairs = 0usize;
        for heavy in [true, false] {
            for high in [true, false] {
                let mut flow: Vec<(f64, f64)> = self
                    .sent
                    .iter()
                    .filter(|s| s.class == Class { heavy, high })
                    .filter_map(|s| Some((s.sent_at, s.sent_at + s.ttft_ms()? / 1e3)))
                    .collect();
                flow.sort_by(|a, b| a.0.total_cmp(&b.0));
                for pair in flow.windows(2) {
                    pairs += 1;
                    if pair[1].1 + 0.05 < pair[0].1 {
                        inverted += 1;
                    }
                }
            }
        }
        inverted as f64 / pairs.max(1) as f64
    }
}

struct OverloadRow {
    contender: &'static str,
    offered: f64,
    served: usize,
    shed: usize,
    failed: usize,
    /// The failures by status (0: no answer), most frequent first.
    failed_by_status: Vec<(u16, usize)>,
    throughput: f64,
    high: Percentiles,
    standard: Percentiles,
    heavy: Percentiles,
    light: Percentiles,
    peak_pod_queue: f64,
    peak_held: f64,
    inversions: f64,
}

impl Row for OverloadRow {
    const COLUMNS: &'static [Column] = &[
        Column::both("gateway", "gateway").left(),
        Column::both("offered req/s", "offered_rps"),
        Column::both("served", "served"),
        Column::both("shed by policy", "shed"),
        Column::both("failed", "failed"),
        Column::both("throughput req/s", "throughput_rps"),
        Column::both(
            "interactive TTFT p50 / p90 ms",
            "interactive_ttft_p50_p90_ms",
        ),
        Column::both("standard TTFT p50 / p90 ms", "standard_ttft_p50_p90_ms"),
        Column::both("heavy tenant p50 / p90 ms", "heavy_ttft_p50_p90_ms"),
        Column::both("light tenant p50 / p90 ms", "light_ttft_p50_p90_ms"),
        Column::both("peak pod queue", "peak_pod_queue"),
        Column::both("peak held in Envoy", "peak_held"),
        Column::both("order inversions", "order_inversions"),
    ];

    fn cells(&self) -> Vec<Cell> {
        let pair = |p: &Percentiles| Cell::Series(vec![p.p50, p.p90], 0);
        vec![
            Cell::Text(self.contender.into()),
            Cell::Measure(self.offered, 1),
            Cell::Count(self.served),
            Cell::Count(self.shed),
            Cell::Count(self.failed),
            Cell::Measure(self.throughput, 1),
            pair(&self.high),
            pair(&self.standard),
            pair(&self.heavy),
            pair(&self.light),
            Cell::Fixed(self.peak_pod_queue, 0),
            Cell::Fixed(self.peak_held, 0),
            Cell::Percent(self.inversions),
        ]
    }
}

/// What the pods can serve: every slot busy, each request taking its prefill plus its
/// output at the step time of a full batch.
fn capacity(prompt_tokens: usize) -> f64 {
    let flag = |name| flag_value(&SIM, name);
    let slots = flag("--max-num-seqs");
    let step_ms = flag("--decode-ms-per-token") * (1.0 + 0.02 * slots);
    let service_s = (prompt_tokens as f64 * flag("--prefill-us-per-token") / 1e3
        + OUTPUT_TOKENS as f64 * step_ms)
        * flag("--time-scale")
        / 1e3;
    PODS as f64 * slots / service_s
}

pub fn run(quick: bool) -> Part {
    println!("overload: 1.5x capacity, two tenants, two priorities; flow control vs none vs LEAST_REQUEST");
    let seconds = if quick { 6.0 } else { 60.0 };
    let probe = Sim::start("probe", &SIM);
    let tokens = prompt_tokens(&probe, &[unique_chat(0, PROMPT_TOKENS)])
        .first()
        .map_or(PROMPT_TOKENS, Vec::len);
    drop(probe);
    let capacity = capacity(tokens);
    let unloaded = measure(
        Contender::Picker(Gate::Default),
        capacity * UNLOADED,
        seconds / 2.0,
        1,
    );
    let unloaded = Unloaded {
        high: unloaded.ttft(|c| c.high),
        standard: unloaded.ttft(|c| !c.high),
    };
    println!(
        "  unloaded ({:.1} req/s): TTFT p90 interactive {:.0} ms, standard {:.0} ms",
        capacity * UNLOADED,
        unloaded.high.p90,
        unloaded.standard.p90
    );
    let offered = capacity * OVERLOAD;
    let mut rows = Vec::new();
    let mut series = Vec::new();
    // `BENCH_ONLY=a|b` runs the contenders whose short name holds a or b (a trial: nothing
    // is written).
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let chosen = |contender: &Contender| {
        only.is_empty()
            || only
                .split('|')
                .any(|part| contender.short_name().contains(part))
    };
    for contender in CONTENDERS.into_iter().filter(chosen) {
        let run = measure(contender, offered, seconds, 2);
        let row = row(contender, offered, &run);
        println!(
            "  {}: interactive p90 {:.0} ms, standard p90 {:.0} ms, served {}, shed {}, failed {}, peak pod queue {:.0}",
            contender.name(),
            row.high.p90,
            row.standard.p90,
            row.served,
            row.shed,
            row.failed,
            row.peak_pod_queue
        );
        if !only.is_empty() {
            print_trial_detail(&run);
        }
        let queue: Vec<(f64, f64)> = run.samples.iter().map(|&(t, pods, _)| (t, pods)).collect();
        series.push((format!("{}: pods", contender.short_name()), queue));
        if contender == Contender::Picker(Gate::Default) {
            let held: Vec<(f64, f64)> = run.samples.iter().map(|&(t, _, held)| (t, held)).collect();
            series.push((format!("{}: Envoy", contender.short_name()), held));
        }
        rows.push(row);
    }
    let chart = line_chart_on(
        YAxis::Linear,
        &format!("Requests waiting, {OVERLOAD}x capacity"),
        "seconds",
        "requests waiting",
        &series,
    );
    Part {
        markdown: format!(
            "{}{}{}",
            intro(capacity, tokens, seconds),
            markdown_table(&rows),
            goals(&rows, &unloaded)
        ),
        csv: csv_table(&rows),
        charts: vec![Chart::main(chart)],
    }
}

/// A trial's extra detail: the interactive TTFT's deciles, and how often the pods held a
/// queue of their own (what a gate that lets too much through shows).
fn print_trial_detail(run: &Run) {
    let interactive = sorted(
        run.sent
            .iter()
            .filter(|s| s.class.high)
            .filter_map(Sent::ttft_ms)
            .collect(),
    );
    let deciles: Vec<String> = [10.0, 25.0, 50.0, 75.0, 80.0, 90.0, 95.0, 99.0]
        .iter()
        .map(|&p| format!("p{p:.0} {:.0}", crate::load::percentile(&interactive, p)))
        .collect();
    let queued = run.samples.iter().filter(|s| s.1 > 0.0).count();
    println!(
        "    interactive TTFT ms: {}; pods held a queue in {queued} of {} samples; elapsed {:.1} s",
        deciles.join(", "),
        run.samples.len(),
        run.elapsed
    );
}

/// How many of `sent` ended as `outcome`.
fn count(sent: &[Sent], outcome: Outcome) -> usize {
    sent.iter().filter(|s| s.outcome() == outcome).count()
}

/// The failed requests by status (0: no answer), most frequent first.
fn failed_by_status(sent: &[Sent]) -> Vec<(u16, usize)> {
    let mut counts: Vec<(u16, usize)> = Vec::new();
    for s in sent.iter().filter(|s| s.outcome() == Outcome::Failed) {
        let status = s.answer.as_ref().map_or(0, |a| a.status);
        match counts.iter_mut().find(|(c, _)| *c == status) {
            Some((_, n)) => *n += 1,
            None => counts.push((status, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts
}

fn row(contender: Contender, offered: f64, run: &Run) -> OverloadRow {
    OverloadRow {
        contender: contender.name(),
        offered,
        served: count(&run.sent, Outcome::Served),
        shed: count(&run.sent, Outcome::Shed),
        failed: count(&run.sent, Outcome::Failed),
        failed_by_status: failed_by_status(&run.sent),
        throughput: run.sent.iter().filter(|s| s.ok()).count() as f64 / run.elapsed,
        high: run.ttft(|c| c.high),
        standard: run.ttft(|c| !c.high),
        heavy: run.ttft(|c| c.heavy),
        light: run.ttft(|c| !c.heavy),
        peak_pod_queue: run.samples.iter().map(|s| s.1).fold(0.0, f64::max),
        peak_held: run.samples.iter().map(|s| s.2).fold(0.0, f64::max),
        inversions: run.order_inversions(),
    }
}

/// One contender on fresh pods: `rate` requests per second for `seconds`, the queues sampled
/// every 250 ms until the last answer.
fn measure(contender: Contender, rate: f64, seconds: f64, seed: u64) -> Run {
    let sims: Vec<Sim> = (0..PODS)
        .map(|i| Sim::start(&format!("pod-{i}"), &SIM))
        .collect();
    let refs: Vec<&Sim> = sims.iter().collect();
    let envoy = contender.start(&refs);
    if contender != Contender::LeastRequest {
        // The picker routes once it has scraped every pod (plain Envoy scrapes nothing).
        for sim in &refs {
            sim.wait_for_scrapes(2);
        }
    }
    let count = (rate * seconds).round() as usize;
    let bodies: Vec<String> = (0..count)
        .map(|n| unique_chat(n + 1, PROMPT_TOKENS))
        .collect();
    let address = envoy.address();
    let done = AtomicBool::new(false);
    let samples = Mutex::new(Vec::new());
    let started = Instant::now();
    let sent = std::thread::scope(|scope| {
        scope.spawn(|| sample_queues(&refs, &envoy, &done, &samples, started));
        let sent = open_loop_each(count, rate, seed, &|n, _client: &mut Option<KeepAlive>| {
            post(&address, Class::of(n), &bodies[n])
        });
        done.store(true, Ordering::Relaxed);
        sent
    });
    let elapsed = started.elapsed().as_secs_f64();
    Run {
        sent: sent
            .into_iter()
            .map(|(n, sent_at, answer)| Sent {
                class: Class::of(n),
                sent_at,
                answer,
            })
            .collect(),
        samples: samples.into_inner().expect("samples"),
        elapsed,
    }
}

fn sample_queues(
    sims: &[&Sim],
    envoy: &Envoy,
    done: &AtomicBool,
    samples: &Mutex<Vec<(f64, f64, f64)>>,
    started: Instant,
) {
    while !done.load(Ordering::Relaxed) {
        let pods: f64 = sims
            .iter()
            .map(|sim| sim.stats()["waiting"].as_f64().unwrap_or(0.0))
            .sum();
        let held: f64 = ["10", "0"]
            .iter()
            .map(|band| filter_stat(envoy, &format!("flow_control.band.{band}.queue_size")))
            .filter(|v| v.is_finite())
            .sum();
        let at = (started.elapsed().as_secs_f64() * 4.0).round() / 4.0;
        samples.lock().expect("samples").push((at, pods, held));
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn intro(capacity: f64, tokens: usize, seconds: f64) -> String {
    let flag = |name| flag_value(&SIM, name);
    let slots = flag("--max-num-seqs");
    format!(
        "## 6. Overload: flow control\n\n{PODS} pods ({slots} sequences each, real time: {tokens} \
         prompt tokens at {} µs, {OUTPUT_TOKENS} output tokens at {} ms a step, slower as the \
         batch fills) can serve {capacity:.1} req/s. Arrivals at {OVERLOAD}x that for \
         {seconds:.0} s, open loop (Poisson), unique prompts, streamed: tenant `heavy` sends \
         {:.0} % of them, `light` the rest (`x-llm-d-inference-fairness-id`), and {:.0} % of \
         each ask for objective `interactive` (priority 10), the rest `standard` (priority 0). \
         The same run through the picker (GIE's default scorers plus llm-d's \
         `active-request-scorer`, weight 2, so a pick goes where the filter's own in-flight \
         count says a slot is free) with flow control (`concurrency-detector` at the \
         pods' {slots} slots as the gate, round-robin fairness in both bands, \
         `defaultRequestTTL: {TTL_S}s`, under the client's {CLIENT_TIMEOUT_S} s timeout): as \
         configured by default (`priority-reserve-policy`: the standard band leaves free the \
         slots the interactive band needs at the rate it is arriving, so that 9 in 10 of its \
         arrivals find one, at most a quarter of the pool, none while it is idle), \
         work-conserving (`static-usage-limit-policy` at 1.0: a request waits only while no \
         pod has a free slot, the interactive band going first when one frees), and with \
         `priority-holdback-policy` at `minCeiling: {HOLDBACK}` (the standard band stops at \
         {:.0} % of the slots, the rest is kept for interactive requests); the same picker \
         without the gate, and Envoy's LEAST_REQUEST; fresh pods each, Envoy \
         `--concurrency 2`, route timeout 600 s, so nothing fails for waiting. TTFT is to the \
         first streamed token as the client sees it, waiting in Envoy included. \"Shed by \
         policy\": the filter's own 429 for a saturated pool (flow control's, with \
         `{DROPPED_REASON_HEADER}: {}` or `{}`, or the saturation detector's refusal of a \
         sheddable request); every other answer but a 200, Envoy's own 503s included, and no \
         answer at all count as failed. \"Order \
         inversions\": pairs of consecutive requests of one flow (tenant and priority) where \
         the later one got its first token more than 50 ms before the earlier one, which \
         measures how FCFS the queue stays across the two worker VMs. The chart samples, every \
         250 ms, the requests waiting inside the pods and, with flow control, those held in \
         Envoy.\n\n![pod queues over time](results/6-overload.svg)\n\n",
        flag("--prefill-us-per-token"),
        flag("--decode-ms-per-token"),
        HEAVY_TENANT_SHARE * 100.0,
        HIGH_PRIORITY_SHARE * 100.0,
        HOLDBACK * 100.0,
        Dropped::QueueFull.reason(),
        Dropped::TtlExpired.reason(),
    )
}

/// Each priority's TTFT in the unloaded run: what the goals compare with.
struct Unloaded {
    high: Percentiles,
    standard: Percentiles,
}

/// Issue 14's goals, one statement each, judged on the flow-control run: "with flow control the
/// high-priority tenant's TTFT p90 stays within 2x of its unloaded value while the pool is
/// overloaded, the low-priority traffic absorbs the wait, and no request is lost other than
/// those the policy sheds (counted and reported)". The first one's factor:
const WITHIN: f64 = 2.0;

/// Within [`WITHIN`] of the unloaded p90; not measured without both figures.
fn within_verdict(overloaded_p90: f64, unloaded_p90: f64) -> Option<bool> {
    let ratio = overloaded_p90 / unloaded_p90;
    (ratio.is_finite() && unloaded_p90 > 0.0).then_some(ratio <= WITHIN)
}

/// The low priority absorbs the wait: its p90 rises over its unloaded value, and by more
/// than the high priority's does. Not measured without the figures.
fn absorbs_verdict(flow: &OverloadRow, unloaded: &Unloaded) -> Option<bool> {
    let standard = flow.standard.p90 - unloaded.standard.p90;
    let high = flow.high.p90 - unloaded.high.p90;
    (standard.is_finite() && high.is_finite()).then_some(standard > 0.0 && standard > high)
}

/// Issue 27's goal: "throughput with flow control at least 97 % of the picker without it,
/// while high-priority TTFT p90 stays within 2x of unloaded".
const THROUGHPUT_SHARE: f64 = 0.97;

/// Work-conserving: the throughput share holds and the high priority stays within [`WITHIN`];
/// not measured without both throughputs and the p90s.
fn conserving_verdict(
    flow: &OverloadRow,
    ungated: &OverloadRow,
    unloaded: &Unloaded,
) -> Option<bool> {
    let share = flow.throughput / ungated.throughput;
    let within = within_verdict(flow.high.p90, unloaded.high.p90)?;
    (share.is_finite() && ungated.throughput > 0.0).then_some(share >= THROUGHPUT_SHARE && within)
}

/// Nothing lost but what the policy shed; not measured when nothing was sent.
fn lost_verdict(flow: &OverloadRow) -> Option<bool> {
    (flow.served + flow.shed + flow.failed > 0).then_some(flow.failed == 0)
}

fn goals(rows: &[OverloadRow], unloaded: &Unloaded) -> String {
    let flow = rows
        .iter()
        .find(|r| r.contender == Contender::Picker(Gate::Default).name());
    let Some(flow) = flow else {
        return String::new();
    };
    let ungated = rows
        .iter()
        .find(|r| r.contender == Contender::Picker(Gate::Off).name());
    let conserving = goal(
        &format!(
            "throughput with flow control at least {:.0} % of the picker without it, while \
             high-priority TTFT p90 stays within {WITHIN}x of unloaded",
            THROUGHPUT_SHARE * 100.0
        ),
        ungated.and_then(|ungated| conserving_verdict(flow, ungated, unloaded)),
        &ungated.map_or("no run without flow control".to_owned(), |ungated| {
            format!(
                "{:.1} vs {:.1} req/s = {:.1} %; interactive p90 {:.0} ms = {:.2}x of {:.0} ms",
                flow.throughput,
                ungated.throughput,
                flow.throughput / ungated.throughput * 100.0,
                flow.high.p90,
                flow.high.p90 / unloaded.high.p90,
                unloaded.high.p90
            )
        }),
    );
    let others: Vec<String> = rows
        .iter()
        .filter(|r| r.contender != flow.contender)
        .map(|r| format!("{} {:.0} ms", r.contender, r.high.p90))
        .collect();
    let failures: Vec<String> = flow
        .failed_by_status
        .iter()
        .map(|&(status, n)| match status {
            0 => format!("{n} with no answer"),
            status => format!("{n} answered {status}"),
        })
        .collect();
    let rise = |overloaded: f64, unloaded: f64| {
        format!(
            "{overloaded:.0} ms (unloaded {unloaded:.0}, {:+.0})",
            overloaded - unloaded
        )
    };
    format!(
        "\nUnloaded ({UNLOADED}x capacity, same pods and mix, flow control on): TTFT p90 \
         {:.0} ms interactive, {:.0} ms standard.\n\n{}{}{}{}",
        unloaded.high.p90,
        unloaded.standard.p90,
        goal(
            &format!(
                "with flow control the high-priority tenant's TTFT p90 stays within {WITHIN}x of its \
                 unloaded value while the pool is overloaded"
            ),
            within_verdict(flow.high.p90, unloaded.high.p90),
            &format!(
                "{:.0} ms = {:.2}x of {:.0} ms{}",
                flow.high.p90,
                flow.high.p90 / unloaded.high.p90,
                unloaded.high.p90,
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; {}", others.join(", "))
                }
            )
        ),
        goal(
            "the low-priority traffic absorbs the wait (its TTFT p90 rises over its unloaded value, \
             and by more than the high priority's)",
            absorbs_verdict(flow, unloaded),
            &format!(
                "standard p90 {} vs interactive {}",
                rise(flow.standard.p90, unloaded.standard.p90),
                rise(flow.high.p90, unloaded.high.p90)
            )
        ),
        goal(
            "no request is lost other than those the policy sheds (counted and reported)",
            lost_verdict(flow),
            &format!(
                "{} served, {} shed by policy (the filter's 429s for a saturated pool), {} failed{}",
                flow.served,
                flow.shed,
                flow.failed,
                if failures.is_empty() {
                    String::new()
                } else {
                    format!(": {}", failures.join(", "))
                }
            )
        ),
        conserving,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn percentiles(p90: f64) -> Percentiles {
        Percentiles {
            p50: p90 / 2.0,
            p90,
            p99: p90,
        }
    }

    fn flow(
        high_p90: f64,
        standard_p90: f64,
        served: usize,
        shed: usize,
        failed: usize,
    ) -> OverloadRow {
        OverloadRow {
            contender: Contender::Picker(Gate::Default).name(),
            offered: 10.0,
            served,
            shed,
            failed,
            failed_by_status: if failed > 0 {
                vec![(503, failed)]
            } else {
                Vec::new()
            },
            throughput: 1.0,
            high: percentiles(high_p90),
            standard: percentiles(standard_p90),
            heavy: percentiles(high_p90),
            light: percentiles(high_p90),
            peak_pod_queue: 0.0,
            peak_held: 0.0,
            inversions: 0.0,
        }
    }

    #[test]
    fn an_envoy_503_is_not_a_shed() {
        assert_eq!(
            outcome(
                503,
                None,
                b"upstream connect error or disconnect/reset before headers"
            ),
            Outcome::Failed
        );
        assert_eq!(outcome(503, None, b"no healthy upstream"), Outcome::Failed);
        // The filter's own 503 for want of an endpoint is a loss, not shedding.
        let no_endpoints = Dropped::NoEndpointTtlExpired.reason();
        assert_eq!(outcome(503, Some(no_endpoints), b"{}"), Outcome::Failed);
        // A 429 that is not the filter's (no header, not its words) is a failure too.
        assert_eq!(outcome(429, None, b"rate limited"), Outcome::Failed);
    }

    #[test]
    fn the_filters_saturation_refusals_are_sheds() {
        for dropped in [Dropped::QueueFull, Dropped::TtlExpired] {
            assert_eq!(
                outcome(dropped.status(), Some(dropped.reason()), b"{}"),
                Outcome::Shed
            );
        }
        let body = inference_picker_core::error_response::RequestError::Shed(format!(
            "{SHED_MESSAGE} (priority -1)"
        ))
        .to_json();
        assert_eq!(outcome(429, None, &body), Outcome::Shed);
        assert_eq!(outcome(200, None, b""), Outcome::Served);
    }

    #[test]
    fn a_request_lost_with_a_503_fails_the_goal() {
        let unloaded = Unloaded {
            high: percentiles(36.0),
            standard: percentiles(38.0),
        };
        let text = goals(&[flow(40.0, 5000.0, 100, 10, 1)], &unloaded);
        assert!(
            text.contains("the policy sheds (counted and reported): **not met**"),
            "{text}"
        );
        assert!(text.contains("1 answered 503"), "{text}");
        let clean = goals(&[flow(40.0, 5000.0, 100, 10, 0)], &unloaded);
        assert!(!clean.contains("**not met"), "{clean}");
        assert!(
            clean.contains("within 2x of unloaded: **not measured**"),
            "no run without flow control: {clean}"
        );
        assert_eq!(lost_verdict(&flow(40.0, 50.0, 0, 0, 0)), None);
    }

    #[test]
    fn flow_control_must_keep_the_throughput_of_the_picker_without_it() {
        let unloaded = Unloaded {
            high: percentiles(36.0),
            standard: percentiles(38.0),
        };
        let with_throughput = |throughput, high_p90| OverloadRow {
            throughput,
            ..flow(high_p90, 5000.0, 100, 0, 0)
        };
        let ungated = with_throughput(21.8, 900.0);
        let conserving = |throughput, high_p90| {
            conserving_verdict(&with_throughput(throughput, high_p90), &ungated, &unloaded)
        };
        assert_eq!(conserving(21.2, 60.0), Some(true), "97.2 %");
        assert_eq!(conserving(17.1, 60.0), Some(false), "78 %, the holdback");
        assert_eq!(
            conserving(21.8, 80.0),
            Some(false),
            "interactive p90 past 2x"
        );
        assert_eq!(conserving(21.8, f64::NAN), None);
        let none = with_throughput(0.0, 60.0);
        assert_eq!(conserving_verdict(&none, &none, &unloaded), None);
    }

    #[test]
    fn goals_need_their_figures() {
        assert_eq!(within_verdict(40.0, f64::NAN), None);
        assert_eq!(within_verdict(0.0, 0.0), None);
        assert_eq!(within_verdict(72.0, 36.0), Some(true));
        assert_eq!(within_verdict(73.0, 36.0), Some(false));
        let unloaded = Unloaded {
            high: percentiles(36.0),
            standard: percentiles(38.0),
        };
        // The standard band must rise, and by more than the interactive one.
        assert_eq!(
            absorbs_verdict(&flow(40.0, 5000.0, 1, 0, 0), &unloaded),
            Some(true)
        );
        assert_eq!(
            absorbs_verdict(&flow(400.0, 300.0, 1, 0, 0), &unloaded),
            Some(false)
        );
        assert_eq!(
            absorbs_verdict(&flow(30.0, 30.0, 1, 0, 0), &unloaded),
            Some(false)
        );
        assert_eq!(
            absorbs_verdict(&flow(f64::NAN, 300.0, 1, 0, 0), &unloaded),
            None
        );
    }
}
