//! The part of Envoy's `envoy.service.ext_proc.v3` protocol this picker uses, as prost messages.
//! Field numbers follow `api/envoy/service/ext_proc/v3/external_processor.proto` and
//! `api/envoy/config/core/v3/base.proto`; fields the picker never reads or sets are left out
//! (protobuf skips unknown fields when decoding).

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "Request", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<Request>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "2")]
    RequestHeaders(HttpHeaders),
    #[prost(message, tag = "3")]
    ResponseHeaders(HttpHeaders),
    #[prost(message, tag = "4")]
    RequestBody(HttpBody),
    #[prost(message, tag = "5")]
    ResponseBody(HttpBody),
    #[prost(message, tag = "6")]
    RequestTrailers(HttpTrailers),
    #[prost(message, tag = "7")]
    ResponseTrailers(HttpTrailers),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpBody {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpTrailers {
    #[prost(message, optional, tag = "1")]
    pub trailers: Option<HeaderMap>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<HeaderValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    /// Envoy sends header values here.
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    /// `OVERWRITE_IF_EXISTS_OR_ADD` = 2: a client's own value never survives.
    #[prost(int32, tag = "3")]
    pub append_action: i32,
}

pub const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingResponse {
    #[prost(oneof = "Response", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    RequestHeaders(HeadersResponse),
    #[prost(message, tag = "2")]
    ResponseHeaders(HeadersResponse),
    #[prost(message, tag = "3")]
    RequestBody(BodyResponse),
    #[prost(message, tag = "4")]
    ResponseBody(BodyResponse),
    #[prost(message, tag = "5")]
    RequestTrailers(TrailersResponse),
    #[prost(message, tag = "6")]
    ResponseTrailers(TrailersResponse),
    #[prost(message, tag = "7")]
    ImmediateResponse(ImmediateResponse),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeadersResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TrailersResponse {
    #[prost(message, optional, tag = "1")]
    pub header_mutation: Option<HeaderMutation>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommonResponse {
    #[prost(message, optional, tag = "2")]
    pub header_mutation: Option<HeaderMutation>,
    #[prost(message, optional, tag = "3")]
    pub body_mutation: Option<BodyMutation>,
    /// The destination header is read by the ORIGINAL_DST cluster, not the route, but GIE's
    /// picker clears the route cache as well; so does this one, to pay the same cost.
    #[prost(bool, tag = "5")]
    pub clear_route_cache: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMutation {
    #[prost(message, repeated, tag = "1")]
    pub set_headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "2")]
    pub remove_headers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyMutation {
    #[prost(oneof = "Mutation", tags = "3")]
    pub mutation: Option<Mutation>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Mutation {
    #[prost(message, tag = "3")]
    StreamedResponse(StreamedBodyResponse),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamedBodyResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImmediateResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, optional, tag = "2")]
    pub headers: Option<HeaderMutation>,
    #[prost(bytes = "vec", tag = "3")]
    pub body: Vec<u8>,
    #[prost(string, tag = "5")]
    pub details: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
}
