//! The config checker: loads a configuration with the exact loader the filter uses.
//!
//! ```text
//! inference-picker check CONFIG
//! inference-picker explain CONFIG --metrics FILE [--metrics FILE ...] --body FILE
//!                          [--path /v1/completions] [--header name:value ...]
//! ```
//! `check` prints the errors (with the key or the line and column), the warnings, and the
//! effective configuration with every default filled in. `explain` also feeds one `/metrics`
//! file per endpoint (in `pool.endpoints` order) and a request body to the director, and prints
//! every scorer's score per endpoint and the winner; with flow control on, the pool's
//! saturation, the bands, and whether the request would wait.

use inference_picker::config::{load_set, NamedPool, PoolSet};
use inference_picker::director::{Admission, Director, Routed};
use inference_picker::error_response::RequestError;
use inference_picker::flow_control::policy::{fairness_type, ordering_type};
use inference_picker::flow_control::{Arrival, DEFAULT_FAIRNESS_ID};
use inference_picker::host::{HostError, SharedData};
use inference_picker::picker::ModelRouter;
use inference_picker::protocol::{FAIRNESS_ID_HEADER, LLMD_FAIRNESS_ID_HEADER};
use inference_picker::request::{ApiKind, RequestHeaders};
use std::cell::RefCell;
use std::collections::HashMap;
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

/// The pool a request body's model names (after a model rewrite header).
fn pool_for(set: PoolSet, model: Option<String>) -> Result<NamedPool, String> {
    let models: Vec<Option<Vec<String>>> = set.pools.iter().map(NamedPool::router_models).collect();
    let router = ModelRouter::new(&models);
    let index = match &model {
        Some(model) => router
            .route(model)
            .ok_or_else(|| format!("refused with 404: no pool serves the model {model:?}"))?,
        None => router.without_model(),
    };
    let many = set.pools.len() > 1;
    let pool = set.pools.into_iter().nth(index).ok_or("no pool")?;
    if many {
        println!(
            "pool: {} (model {:?})",
            pool.name,
            model.unwrap_or_default()
        );
    }
    Ok(pool)
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

fn explain(args: &[String]) -> Result<(), String> {
    let args = explain_args(args)?;
    let set = load_file(&args.config, false)?;
    let body = args.body.as_deref().map(read).transpose()?;
    let api = ApiKind::from_path(args.path.as_bytes());
    let rewrite = args
        .headers
        .iter()
        .find(|(n, _)| n == "x-gateway-model-name-rewrite")
        .map(|(_, v)| v.clone());
    let model = match (&body, api.is_inference()) {
        (Some(body), true) => rewrite.or_else(|| {
            inference_picker::request::parse_body(api, body.as_bytes())
                .ok()
                .map(|r| r.model)
        }),
        _ => None,
    };
    let mut director = Director::new(pool_for(set, model)?.config);
    let endpoints = director.pool().len();
    if args.metrics.len() != endpoints {
        return Err(format!(
            "{} has {endpoints} endpoints but {} --metrics files were given (one per endpoint, in order)",
            args.config,
            args.metrics.len()
        ));
    }
    for (index, path) in args.metrics.iter().enumerate() {
        match director.on_scrape_ok(index, 0, &read(path)?) {
            Ok(Some(warning)) => println!("warning: {warning}"),
            Ok(None) => {}
            Err(error) => println!("warning: {path}: {error}; the endpoint counts as unreachable"),
        }
    }
    director.on_tick(0);
    let header = |name: &str| {
        args.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let headers = RequestHeaders {
        session_token: header("x-session-token"),
        test_endpoint_selection: header("test-epp-endpoint-selection"),
        objective: header("x-gateway-inference-objective"),
        model_rewrite: header("x-gateway-model-name-rewrite"),
        // `--header x-gateway-destination-endpoint-subset:a,b` stands for the proxy's hint.
        subset_hint: header("x-gateway-destination-endpoint-subset")
            .map(|list| inference_picker::protocol::parse_subset_hint(list.as_bytes())),
    };
    let body = body.as_deref().map(str::as_bytes);
    if director.flow_control().is_some() {
        print_flow_control(&director);
        let prepared = director
            .prepare(api, body, headers)
            .map_err(|error| format!("refused with {}: {}", error.status(), error.message()))?;
        let arrival = Arrival {
            id: 1,
            request_id: "explain".into(),
            priority: prepared.request.priority,
            fairness_id: header(LLMD_FAIRNESS_ID_HEADER)
                .or_else(|| header(FAIRNESS_ID_HEADER))
                .unwrap_or_else(|| DEFAULT_FAIRNESS_ID.into()),
            bytes: prepared.body_size as u64,
            slo_ttft_ms: None,
        };
        let (priority, fairness_id) = (arrival.priority, arrival.fairness_id.clone());
        return match director.admit(prepared, arrival, 0, &MemoryStore::default()) {
            Admission::Now(prepared) => report(&director.route_prepared(*prepared), &director),
            Admission::Held => {
                println!(
                    "held: flow control queues it (priority {priority}, flow {fairness_id:?}) until the pool's saturation drops below its band's ceiling"
                );
                Ok(())
            }
            Admission::Refused(error) => Err(format!(
                "refused with {}: {}",
                error.status(),
                error.message()
            )),
        };
    }
    let routed = director.route(api, body, headers);
    report(&routed, &director)
}

/// Flow control's view of the pool: its saturation against the usage limit, and the bands.
fn print_flow_control(director: &Director) {
    let Some(flow) = director.flow_control() else {
        return;
    };
    let config = flow.config();
    match director.pool_saturation(0) {
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
            match director.pool_saturation(0) {
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

/// In-memory shared data: the CLI is one VM.
#[derive(Default)]
struct MemoryStore(RefCell<HashMap<String, (Vec<u8>, u32)>>);

impl SharedData for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        Ok(self.0.borrow().get(key).cloned())
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<bool, HostError> {
        let mut data = self.0.borrow_mut();
        let current = data.get(key).map_or(0, |(_, cas)| *cas);
        if cas.is_some_and(|cas| cas != current) {
            return Ok(false);
        }
        data.insert(key.to_owned(), (value.to_vec(), current + 1));
        Ok(true)
    }
}

fn report(routed: &Result<Routed, RequestError>, director: &Director) -> Result<(), String> {
    for row in director.explain_rows() {
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
    match routed {
        Ok(routed) => {
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
        Err(error) => Err(format!(
            "refused with {}: {}",
            error.status(),
            error.message()
        )),
    }
}
