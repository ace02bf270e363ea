//! `extproc-picker`: inference-picker's request flow behind Envoy's `ext_proc` gRPC protocol,
//! shaped like GIE's endpoint picker (EPP): request headers and the whole body stream to it
//! (`FULL_DUPLEX_STREAMED`), it buffers the body, picks, answers with the
//! `x-gateway-destination-endpoint` header and streams the body back; response headers tell it
//! the request ended. The benchmarks compare it with the in-Envoy wasm filter.
//!
//! ```text
//! extproc-picker --port 9002 --config picker.yaml
//! ```
//! The config is the filter's own (GIE `EndpointPickerConfig` + `pool`); a thread scrapes each
//! endpoint's `/metrics` every `pool.refreshMetricsInterval` as the filter's timer does.
//! Binds loopback only; prints `listening on ADDRESS` first.

mod exchange;
mod proto;
mod scrape;

use exchange::Shared;
use proto::{ProcessingRequest, ProcessingResponse};
use std::sync::{Arc, Mutex};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{empty_body, http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::{Status, Streaming};

const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

#[derive(Clone)]
struct ExternalProcessor {
    router: Arc<Mutex<Shared>>,
}

impl tonic::server::NamedService for ExternalProcessor {
    const NAME: &'static str = "envoy.service.ext_proc.v3.ExternalProcessor";
}

impl<B> Service<http::Request<B>> for ExternalProcessor
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != PROCESS_PATH {
            return Box::pin(async { Ok(unimplemented_method()) });
        }
        let process = Process(self.router.clone());
        Box::pin(async move {
            let codec =
                tonic::codec::ProstCodec::<ProcessingResponse, ProcessingRequest>::default();
            Ok(tonic::server::Grpc::new(codec)
                .streaming(process, request)
                .await)
        })
    }
}

fn unimplemented_method() -> http::Response<tonic::body::BoxBody> {
    let mut response = http::Response::new(empty_body());
    let headers = response.headers_mut();
    headers.insert("grpc-status", http::HeaderValue::from_static("12"));
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// One `Process` stream: one HTTP request and its response.
struct Process(Arc<Mutex<Shared>>);

impl tonic::server::StreamingService<ProcessingRequest> for Process {
    type Response = ProcessingResponse;
    type ResponseStream = ReceiverStream<Result<ProcessingResponse, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<ProcessingRequest>>) -> Self::Future {
        let router = self.0.clone();
        let mut inbound = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut exchange = exchange::Exchange::default();
            while let Ok(Some(message)) = inbound.message().await {
                let replies = match router.lock() {
                    Ok(mut router) => exchange.on_message(message, &mut router),
                    Err(_) => return,
                };
                for reply in replies {
                    if sender.send(Ok(reply)).await.is_err() {
                        break;
                    }
                }
            }
            // The client went away before the response: the pod's slot is free again.
            if let Ok(mut router) = router.lock() {
                exchange.finish(&mut router);
            }
        });
        Box::pin(async move { Ok(tonic::Response::new(ReceiverStream::new(receiver))) })
    }
}

fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let port: u16 = flag("--port").and_then(|p| p.parse().ok()).unwrap_or(0);
    let Some(config_path) = flag("--config") else {
        eprintln!("usage: extproc-picker --port N --config router.yaml");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&config_path).unwrap_or_else(|error| {
        eprintln!("extproc-picker: {config_path}: {error}");
        std::process::exit(2);
    });
    let configured = configure(text.as_bytes()).unwrap_or_else(|error| {
        eprintln!("extproc-picker: {config_path}: {error}");
        std::process::exit(2);
    });
    let router = Arc::new(Mutex::new(Shared {
        router: configured.router,
        started: std::time::Instant::now(),
    }));
    scrape::spawn(router.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|error| {
            eprintln!("extproc-picker: runtime: {error}");
            std::process::exit(2);
        });
    runtime.block_on(serve(port, router));
}

/// The filter's own configuration loader; flow control (which holds requests across VMs) is
/// the filter's alone.
fn configure(text: &[u8]) -> Result<inference_picker_core::vm::configure::Configured, String> {
    let configured = inference_picker_core::vm::configure::configure(text, 7)?;
    let slots = configured.router.slots();
    if slots.iter().any(|slot| slot.queue.is_some()) {
        return Err("flow control is not supported by the ext_proc baseline".into());
    }
    Ok(configured)
}

async fn serve(port: u16, router: Arc<Mutex<Shared>>) {
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("extproc-picker: cannot bind 127.0.0.1:{port}: {error}");
            std::process::exit(2);
        }
    };
    if let Ok(address) = listener.local_addr() {
        println!("listening on {address}");
    }
    // Envoy's gRPC client sets TCP_NODELAY; without it here too, each small answer waits for
    // a delayed ACK (~40 ms).
    let incoming = tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |stream| {
            stream.inspect(|s| {
                let _ = s.set_nodelay(true);
            })
        },
    );
    let served = tonic::transport::Server::builder()
        .add_service(ExternalProcessor { router })
        .serve_with_incoming(incoming)
        .await;
    if let Err(error) = served {
        eprintln!("extproc-picker: {error}");
        std::process::exit(1);
    }
}
