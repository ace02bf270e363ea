//! The config checker: loads a configuration with the exact loader the filter uses.
//!
//! ```text
//! inference-picker check CONFIG
//! inference-picker explain CONFIG --metrics FILE [--metrics FILE ...] --body FILE
//!                          [--path /v1/completions] [--header name:value ...]
//! ```
//! `check` prints the errors (with the key or the line and column), the warnings, and the
//! effective configuration with every default filled in. `explain` runs a worker VM as the
//! filter does on an in-memory host: its scrapes answered with one `/metrics` file per endpoint
//! (in `pool.endpoints` order), then the request through the same callbacks; it prints every
//! scorer's score per endpoint and the winner, and with flow control on, the pool's
//! saturation, the bands, and whether the request would wait.

use inference_picker_core::config::{load_set, PoolSet};
use inference_picker_core::endpoint::Health;
use inference_picker_core::flow_control::DEFAULT_FAIRNESS_ID;
use inference_picker_core::host::fake::FakeVm;
use inference_picker_core::protocol::{
    FAIRNESS_ID_HEADER, LLMD_FAIRNESS_ID_HEADER, MODEL_REWRITE_HEADER, SUBSET_HINT_KEY,
};
use inference_picker_core::request::{parse_body, ApiKind};
use inference_picker_core::request_driver::{Outcome, RequestDriver};
use inference_picker_core::router::PoolRouter;
use inference_picker_core::router::PoolSlot;
use inference_picker_core::scheduling::flow_policy_plugins::{fairness_type, ordering_type};
use inference_picker_core::vm::WorkerVm;
use std::process::ExitCode;

const USAGE: &str = "usage: inference-picker check CONFIG
       inference-picker explain CONFIG --metrics FILE [--metrics FILE ...] --body FILE [--path PATH] [--header NAME:VALUE ...]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("check") => args
            .get(1)
            .ok_or(USAGE.to_string())
            .and_then(|path| check(path)),
        Some("explain") => explain(&args[1..]),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|error| format!("{path}: {error}"))
}

fn load_file(path: &str, with_effective: bool) -> Result<PoolSet, String> {
    load_set(&read(path)?, 1, with_effective).map_err(|error| format!("{path}: {error}"))
}

fn check(path: &str) -> Result<(), String> {
    let set = load_file(path, true)?;
    println!("{path}: ok");
    let many = set.listed;
    for pool in &set.pools {
        let models = pool
            .models
            .as_ref()
            .map_or("every model no other pool lists".into(), |m| m.join(", "));
        if many {
            println!("# pool {}: {models}", pool.name);
        }
        for warning in &pool.config.warnings {
            println!("warning: {warning}");
        }
        println!("# effective configuration");
        let effective = pool.effective.clone().unwrap_or_default();
        print!(
            "{}",
            serde_yaml::to_string(&effective).map_err(|e| e.to_string())?
        );
    }
    if let Some(header) = &set.pool_header {
        println!("# the chosen pool's name is written to {header}");
    }
    Ok(())
}

struct ExplainArgs {
    config: String,
    metrics: Vec<String>,
    body: Option<String>,
    path: String,
    headers: Vec<(String, String)>,
}

fn explain_args(args: &[String]) -> Result<ExplainArgs, String> {
    let mut parsed = ExplainArgs {
        config: args.first().cloned().ok_or(USAGE)?,
        metrics: Vec::new(),
        body: None,
        path: "/v1/completions".into(),
        headers: Vec::new(),
    };
    let mut rest = args.iter().skip(1);
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--metrics" => parsed.metrics.push(value.clone()),
            "--body" => parsed.body = Some(value.clone()),
            "--path" => parsed.path = value.clone(),
            "--header" => {
                let (name, value) = value
                    .split_once(':')
                    .ok_or(format!("--header {value}: expected NAME:VALUE"))?;
                parsed
                    .headers
                    .push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    Ok(parsed)
}

/// The VM `explain` runs: its root context, and the request's stream.
const ROOT_ID: u32 = 1;
const STREAM_ID: u32 = 2;
/// Where the VM's clock starts (any time after 0: metrics are as old as the clock says).
const START_MS: u64 = 1_000_000;

/// Runs the request the way the filter does: a worker VM on the in-memory host, one tick whose
/// scrapes of the request's pool are answered with the `--metrics` files, the next tick, then
/// the request's headers and body through the same callbacks Envoy calls.
fn explain(args: &[String]) -> Result<(), String> {
    let args = explain_args(args)?;
    let text = read(&args.config)?;
    let body = args.body.as_deref().map(read).transpose()?;
    let _ = log::set_logger(&WARNINGS).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let host = FakeVm::default();
    host.clock.advance(START_MS);
    let mut vm = WorkerVm::configure(host.clone(), ROOT_ID, text.as_bytes())
        .map_err(|error| format!("{}: {error}", args.config))?;
    let pool = chosen_pool(vm.router(), &args, body.as_deref())?;
    feed_metrics(&host, &mut vm, pool, &args)?;
    let now_ms = host.clock.0.get();
    if let Some(slot) = vm.router().slot(pool) {
        print_flow_control(slot, now_ms);
    }
    let mut headers: Vec<(&str, &str)> = args
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    headers.extend([(":path", args.path.as_str()), (":method", "POST")]);
    let stream = host.open_stream(STREAM_ID, &headers, body.as_deref().unwrap_or_default());
    // `--header x-gateway-destination-endpoint-subset:a,b` stands for the proxy's hint.
    *stream.subset_hint.borrow_mut() = header(&args, SUBSET_HINT_KEY).map(String::into_bytes);
    let mut request = RequestDriver::new(STREAM_ID);
    vm.on_request_headers(&mut request, body.is_none());
    if let Some(body) = &body {
        vm.on_request_body(&mut request, body.len(), true);
    }
    let slot = vm.router().slot(request.pool()).ok_or("no pool")?;
    report(&request.outcome, slot, &args)
}

fn header(args: &ExplainArgs, name: &str) -> Option<String> {
    args.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

/// The pool the request's model names (after a model rewrite header): the pool whose pods the
/// `--metrics` files describe.
fn chosen_pool(
    router: &PoolRouter,
    args: &ExplainArgs,
    body: Option<&str>,
) -> Result<usize, String> {
    let api = ApiKind::from_path(args.path.as_bytes());
    let model = match (body, api.is_inference()) {
        (Some(body), true) => header(args, MODEL_REWRITE_HEADER)
            .or_else(|| parse_body(api, body.as_bytes()).ok().map(|r| r.model)),
        _ => None,
    };
    let pool = router
        .pool_for(model.as_deref())
        .ok_or_else(|| format!("refused with 404: no pool serves the model {model:?}"))?;
    if router.len() > 1 {
        let name = router
            .slots()
            .get(pool)
            .map_or("-", |slot| slot.name.as_str());
        println!("pool: {name} (model {:?})", model.unwrap_or_default());
    }
    Ok(pool)
}

/// One tick sends the scrapes; those of `pool` are answered with the `--metrics` files (one
/// per endpoint, in `pool.endpoints` order), and the pool's next tick takes them in.
fn feed_metrics(
    host: &FakeVm,
    vm: &mut WorkerVm<FakeVm>,
    pool: usize,
    args: &ExplainArgs,
) -> Result<(), String> {
    let slot = vm.router().slot(pool).ok_or("no pool")?;
    let addresses: Vec<String> = slot
        .data
        .pool()
        .endpoints
        .iter()
        .map(|endpoint| endpoint.address.clone())
        .collect();
    if args.metrics.len() != addresses.len() {
        return Err(format!(
            "{} has {} endpoints but {} --metrics files were given (one per endpoint, in order)",
            args.config,
            addresses.len(),
            args.metrics.len()
        ));
    }
    let texts = args
        .metrics
        .iter()
        .map(|path| read(path))
        .collect::<Result<Vec<_>, _>>()?;
    vm.on_tick();
    // A large pool's scrapes go out as answers free room: answer until none is left.
    loop {
        let sent = host.callouts.take_sent();
        if sent.is_empty() {
            break;
        }
        for call in sent {
            let index = call
                .authority()
                .and_then(|authority| addresses.iter().position(|a| a == authority));
            let text = index.and_then(|index| texts.get(index));
            let cap = vm.callout_body_cap(call.token).unwrap_or(0);
            let text = text.map_or("", String::as_str);
            let answer = host.callouts.answer(call.token, Some("200"), text, cap);
            vm.on_callout_response(call.token, answer);
        }
    }
    host.clock.advance(vm.interval_ms(pool).unwrap_or(0));
    vm.on_tick();
    let slot = vm.router().slot(pool).ok_or("no pool")?;
    for (endpoint, path) in slot.data.pool().endpoints.iter().zip(&args.metrics) {
        if endpoint.health != Health::Fresh {
            println!(
                "warning: {path}: no usable metrics in it; the endpoint counts as unreachable"
            );
        }
    }
    Ok(())
}

/// Flow control's view of the pool: its saturation against the usage limit, and the bands.
fn print_flow_control(slot: &PoolSlot, now_ms: u64) {
    let Some(queue) = &slot.queue else {
        return;
    };
    let config = queue.control().config();
    let saturation = slot.director.pool_saturation(&slot.data, now_ms);
    match saturation {
        Some(saturation) => println!("flow control: pool saturation {saturation:.2}"),
        None => println!(
            "flow control: no routable endpoint: requests wait up to noEndpointRequestTTL, then 503"
        ),
    }
    for band in &config.bands {
        println!(
            "  band {:>4}: ceiling {:.2} ({}) maxRequests {} maxBytes {} {} {}",
            band.priority,
            band.ceiling,
            match saturation {
                Some(s) if s < band.ceiling => "room, goes at once",
                _ => "saturated, waits",
            },
            band.max_requests,
            band.max_bytes,
            fairness_type(band.fairness),
            ordering_type(band.ordering)
        );
    }
}

/// Every score behind the decision, then the decision.
fn report(outcome: &Outcome, slot: &PoolSlot, args: &ExplainArgs) -> Result<(), String> {
    for row in slot.director.explain_rows(&slot.data) {
        let scores: Vec<String> = row
            .scores
            .iter()
            .map(|(name, score, weight)| format!("{name}={score:.3}x{weight}"))
            .collect();
        println!(
            "{:<10} {:<24} total={:<8.3} {}",
            row.profile,
            row.address,
            row.total,
            scores.join(" ")
        );
    }
    match outcome {
        Outcome::Routed(routed) => {
            println!("picked: {}", routed.destination);
            if !routed.fallbacks.is_empty() {
                println!("fallbacks: {}", routed.fallbacks);
            }
            if let Some(prefill) = &routed.prefill {
                println!("prefill: {prefill}");
            }
            if routed.degraded {
                println!("(degraded: no endpoint had usable metrics)");
            }
            Ok(())
        }
        Outcome::Held => {
            let flow = header(args, LLMD_FAIRNESS_ID_HEADER)
                .or_else(|| header(args, FAIRNESS_ID_HEADER))
                .unwrap_or_else(|| DEFAULT_FAIRNESS_ID.into());
            let band = slot
                .queue
                .as_ref()
                .and_then(|queue| queue.control().band_of(STREAM_ID))
                .map_or("-".into(), |band| band.to_string());
            println!(
                "held: flow control queues it (band {band}, flow {flow:?}) until the pool's saturation drops below its band's ceiling"
            );
            Ok(())
        }
        Outcome::Rejected(error) => Err(format!(
            "refused with {}: {}",
            error.status(),
            error.message()
        )),
        Outcome::Pending => Err("the request did not reach a decision".into()),
    }
}

/// Prints what the filter would log at warning level or above (a configuration warning, a
/// scrape it cannot use), as `warning: ...`.
struct WarningPrinter;

static WARNINGS: WarningPrinter = WarningPrinter;

impl log::Log for WarningPrinter {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            let line = record.args().to_string();
            let line = line.strip_prefix("inference-picker: ").unwrap_or(&line);
            println!("warning: {line}");
        }
    }

    fn flush(&self) {}
}
