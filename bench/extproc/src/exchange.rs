//! One HTTP request as seen over an ext_proc stream, run through the filter's own request flow:
//! the stream's messages are the flow's callbacks, and what the flow writes (headers, body,
//! a refusal) becomes the replies.

use crate::proto::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeaderValue, HeaderValueOption,
    HeadersResponse, HttpHeaders, HttpStatus, ImmediateResponse, Mutation, ProcessingRequest,
    ProcessingResponse, Request, Response, StreamedBodyResponse, TrailersResponse,
    OVERWRITE_IF_EXISTS_OR_ADD,
};
use inference_picker_core::duration::duration_ms;
use inference_picker_core::host::fake::FakeHost;
use inference_picker_core::router::PoolRouter;
use inference_picker_core::request_driver::{Next, Outcome, RequestDriver};
use std::collections::HashMap;
use std::time::Instant;

/// The picker every stream uses, and when the process started (its clock).
pub struct Shared {
    pub router: PoolRouter,
    pub started: Instant,
}

/// One stream's request, in the core's in-memory host: the flow reads and writes it there,
/// and what it changed becomes the replies.
#[derive(Default)]
pub struct Exchange {
    stream: FakeHost,
    /// The request headers as Envoy sent them.
    sent: HashMap<String, String>,
    request: RequestDriver,
    /// The decision's replies went out: later body chunks pass straight back.
    decided: bool,
}

impl Exchange {
    /// The replies to one message, in the order Envoy expects them (headers before body).
    pub fn on_message(
        &mut self,
        message: ProcessingRequest,
        shared: &mut Shared,
    ) -> Vec<ProcessingResponse> {
        self.stream.now_ms.set(duration_ms(shared.started.elapsed()));
        let router = &mut shared.router;
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                self.sent = pairs(&headers).collect();
                *self.stream.headers.borrow_mut() = self.sent.clone();
                let flow = self
                    .request
                    .on_headers(&self.stream, router, headers.end_of_stream);
                self.after(flow, false)
            }
            Some(Request::RequestBody(chunk)) if self.decided => {
                vec![streamed(chunk.body, chunk.end_of_stream)]
            }
            Some(Request::RequestBody(chunk)) => {
                self.stream.body.borrow_mut().extend_from_slice(&chunk.body);
                let size = self.stream.body.borrow().len();
                let flow = self
                    .request
                    .on_body(&self.stream, router, size, chunk.end_of_stream);
                self.after(flow, true)
            }
            Some(Request::RequestTrailers(_)) => {
                let flow = self.request.on_trailers(&self.stream, router);
                let mut replies = self.after(flow, true);
                replies.push(reply(Response::RequestTrailers(
                    TrailersResponse::default(),
                )));
                replies
            }
            Some(Request::ResponseHeaders(headers)) => {
                let mut response = self.stream.response_headers.borrow_mut();
                response.extend(pairs(&headers).filter(|(name, _)| name == ":status"));
                drop(response);
                self.request.on_response_headers(&self.stream, router);
                let written: Vec<(String, String)> = self
                    .stream
                    .response_headers
                    .take()
                    .into_iter()
                    .filter(|(name, _)| name != ":status")
                    .collect();
                vec![reply(Response::ResponseHeaders(HeadersResponse {
                    response: Some(CommonResponse {
                        header_mutation: Some(mutation(&written, &[])),
                        ..CommonResponse::default()
                    }),
                }))]
            }
            Some(Request::ResponseBody(_)) => {
                vec![reply(Response::ResponseBody(BodyResponse::default()))]
            }
            Some(Request::ResponseTrailers(_)) => {
                vec![reply(Response::ResponseTrailers(
                    TrailersResponse::default(),
                ))]
            }
            None => Vec::new(),
        }
    }

    /// The stream ended: the request's in-flight slot is given back, exactly once.
    pub fn finish(&mut self, shared: &mut Shared) {
        let now_ms = duration_ms(shared.started.elapsed());
        let store = &self.stream.shared;
        self.request.on_done(&mut shared.router, now_ms, store);
    }

    /// The replies once the flow has decided: its refusal, or the headers it changed (and the
    /// buffered body, streamed back, when it came with one). Nothing while it waits.
    fn after(&mut self, flow: Next, with_body: bool) -> Vec<ProcessingResponse> {
        if let Some((status, body)) = self.stream.reply.take() {
            return vec![refusal(status, body)];
        }
        if flow == Next::Pause || self.request.outcome == Outcome::Pending {
            return Vec::new();
        }
        self.decided = true;
        let headers = self.stream.headers.borrow();
        let set: Vec<(String, String)> = headers
            .iter()
            .filter(|(name, value)| self.sent.get(*name) != Some(value))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect();
        let removed: Vec<String> = self
            .sent
            .keys()
            .filter(|name| !headers.contains_key(*name))
            .cloned()
            .collect();
        let mut replies = vec![reply(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(mutation(&set, &removed)),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        }))];
        if with_body {
            replies.push(streamed(self.stream.body.take(), true));
        }
        replies
    }
}

fn pairs(headers: &HttpHeaders) -> impl Iterator<Item = (String, String)> + '_ {
    let map = headers.headers.iter().flat_map(|map| &map.headers);
    map.map(|h| {
        let value = String::from_utf8_lossy(&h.raw_value).into_owned();
        (h.key.clone(), value)
    })
}

/// The same OpenAI-style error the filter answers with, as an ext_proc immediate response.
fn refusal(status: u16, body: Vec<u8>) -> ProcessingResponse {
    let content_type = [("content-type".to_owned(), "application/json".to_owned())];
    reply(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(status),
        }),
        headers: Some(mutation(&content_type, &[])),
        body,
        details: "inference_picker_refused".into(),
    }))
}

fn mutation(set: &[(String, String)], removed: &[String]) -> HeaderMutation {
    let set_headers = set
        .iter()
        .map(|(key, value)| HeaderValueOption {
            header: Some(HeaderValue {
                key: key.clone(),
                raw_value: value.clone().into_bytes(),
                ..HeaderValue::default()
            }),
            append_action: OVERWRITE_IF_EXISTS_OR_ADD,
        })
        .collect();
    HeaderMutation {
        set_headers,
        remove_headers: removed.to_vec(),
    }
}

fn streamed(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    reply(Response::RequestBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                })),
            }),
            ..CommonResponse::default()
        }),
    }))
}

fn reply(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
    }
}
