//! One HTTP request as seen over an ext_proc stream: what to answer to each message.

use crate::proto::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeaderValue, HeaderValueOption,
    HeadersResponse, HttpStatus, ImmediateResponse, Mutation, ProcessingRequest,
    ProcessingResponse, Request, Response, StreamedBodyResponse, TrailersResponse,
    OVERWRITE_IF_EXISTS_OR_ADD,
};
use inference_picker::error_response::RequestError;
use inference_picker::director::{Director, Routed};
use inference_picker::request::{ApiKind, RequestHeaders};
use inference_picker::protocol::DESTINATION_HEADER;

#[derive(Default)]
pub struct Exchange {
    api: Option<ApiKind>,
    body: Vec<u8>,
    routed: Option<Routed>,
}

impl Exchange {
    /// The replies to one message, in the order Envoy expects them (headers before body).
    pub fn on_message(
        &mut self,
        message: ProcessingRequest,
        picker: &mut Director,
    ) -> Vec<ProcessingResponse> {
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                let path = headers
                    .headers
                    .iter()
                    .flat_map(|map| &map.headers)
                    .find(|h| h.key == ":path")
                    .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
                    .unwrap_or_default();
                let api = ApiKind::from_path(path.as_bytes());
                self.api = Some(api);
                if headers.end_of_stream || !api.is_inference() {
                    return self.route(picker, None);
                }
                // Full-duplex: the header answer waits for the whole body.
                Vec::new()
            }
            Some(Request::RequestBody(chunk)) => {
                self.body.extend_from_slice(&chunk.body);
                if chunk.end_of_stream {
                    let body = std::mem::take(&mut self.body);
                    return self.route(picker, Some(body));
                }
                Vec::new()
            }
            Some(Request::RequestTrailers(_)) => {
                let body = std::mem::take(&mut self.body);
                let mut replies = self.route(picker, Some(body));
                replies.push(reply(
                    Response::RequestTrailers(TrailersResponse::default()),
                ));
                replies
            }
            Some(Request::ResponseHeaders(headers)) => {
                let status = headers
                    .headers
                    .iter()
                    .flat_map(|map| &map.headers)
                    .find(|h| h.key == ":status")
                    .map(|h| h.raw_value.first() == Some(&b'5'))
                    .unwrap_or(false);
                if let (true, Some(routed)) = (status, &self.routed) {
                    picker.report_upstream_failure(routed);
                }
                vec![reply(Response::ResponseHeaders(HeadersResponse::default()))]
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
    pub fn finish(&mut self, picker: &mut Director) {
        if let Some(routed) = self.routed.take() {
            picker.release(&routed);
        }
    }

    fn route(&mut self, picker: &mut Director, body: Option<Vec<u8>>) -> Vec<ProcessingResponse> {
        let api = self.api.unwrap_or(ApiKind::Other);
        let routed = match picker.route(api, body.as_deref(), RequestHeaders::default()) {
            Ok(routed) => routed,
            Err(error) => return vec![refusal(&error)],
        };
        let headers = HeaderMutation {
            set_headers: vec![HeaderValueOption {
                header: Some(HeaderValue {
                    key: DESTINATION_HEADER.into(),
                    raw_value: routed.header.clone().into_bytes(),
                    ..HeaderValue::default()
                }),
                append_action: OVERWRITE_IF_EXISTS_OR_ADD,
            }],
            remove_headers: Vec::new(),
        };
        self.routed = Some(routed);
        let mut replies = vec![reply(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(headers),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        }))];
        if let Some(body) = body {
            replies.push(reply(Response::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                            body,
                            end_of_stream: true,
                        })),
                    }),
                    ..CommonResponse::default()
                }),
            })));
        }
        replies
    }
}

fn reply(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
    }
}

/// The same OpenAI-style error the filter answers with, as an ext_proc immediate response.
fn refusal(error: &RequestError) -> ProcessingResponse {
    let content_type = HeaderValueOption {
        header: Some(HeaderValue {
            key: "content-type".into(),
            raw_value: b"application/json".to_vec(),
            ..HeaderValue::default()
        }),
        append_action: OVERWRITE_IF_EXISTS_OR_ADD,
    };
    reply(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(error.status()),
        }),
        headers: Some(HeaderMutation {
            set_headers: vec![content_type],
            remove_headers: Vec::new(),
        }),
        body: error.to_json(),
        details: "inference_picker_refused".into(),
    }))
}
