//! Error bodies returned to clients as local replies, in the shape of the API they called.

use serde::Serialize;

/// Why a request was refused; each maps to one HTTP status and one OpenAI error type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The body is not valid JSON or lacks what the endpoint needs (400).
    BadRequest(String),
    /// The body is larger than the configured limit (413).
    BodyTooLarge { limit: usize },
    /// The pool is saturated and the request is sheddable (429).
    Shed(String),
    /// Filters removed every endpoint (429).
    TooManyRequests(String),
    /// No endpoint can take the request (503).
    NoEndpoint(String),
    /// No pool serves the request's model (404, as a model server answers an unknown model).
    ModelNotFound(String),
    /// Flow control dropped the request instead of dispatching it (429 or 503).
    Dropped(Dropped),
}

/// Why flow control let a held request go without dispatching it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The queue (global or the request's band) was full when it arrived (429).
    QueueFull,
    /// The pool had no endpoint when it arrived and the queue was full (503).
    QueueFullNoEndpoints,
    /// It waited `defaultRequestTTL` (429).
    TtlExpired,
    /// It waited `noEndpointRequestTTL` while the pool had no endpoint (503).
    NoEndpointTtlExpired,
}

impl Dropped {
    pub fn status(self) -> u16 {
        match self {
            Dropped::QueueFull | Dropped::TtlExpired => 429,
            Dropped::QueueFullNoEndpoints | Dropped::NoEndpointTtlExpired => 503,
        }
    }

    /// The `x-llm-d-request-dropped-reason` value, as llm-d sends it.
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::QueueFull => "rejected-saturated",
            Dropped::TtlExpired => "rejected-ttl-expired",
            Dropped::QueueFullNoEndpoints | Dropped::NoEndpointTtlExpired => {
                "rejected-no-endpoints"
            }
        }
    }

    fn message(self) -> &'static str {
        match self {
            Dropped::QueueFull => "request rejected pre-queue: queue at capacity",
            Dropped::QueueFullNoEndpoints => {
                "no endpoints available: request rejected pre-queue: queue at capacity"
            }
            Dropped::TtlExpired => "request timed out in queue: request TTL expired",
            Dropped::NoEndpointTtlExpired => {
                "request timed out in queue and no endpoints are available"
            }
        }
    }
}

/// Which API's error body a refusal is written in; the status is the same in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    /// `{"error":{"message","type","code"}}`, for the OpenAI-compatible APIs.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`, for Anthropic's Messages API.
    Anthropic,
}

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    code: u16,
}

#[derive(Serialize)]
struct AnthropicEnvelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: AnthropicError<'a>,
}

#[derive(Serialize)]
struct AnthropicError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

impl RequestError {
    pub fn status(&self) -> u16 {
        match self {
            RequestError::BadRequest(_) => 400,
            RequestError::BodyTooLarge { .. } => 413,
            RequestError::Shed(_) | RequestError::TooManyRequests(_) => 429,
            RequestError::NoEndpoint(_) => 503,
            RequestError::ModelNotFound(_) => 404,
            RequestError::Dropped(dropped) => dropped.status(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            RequestError::BadRequest(_) | RequestError::BodyTooLarge { .. } => {
                "invalid_request_error"
            }
            RequestError::Shed(_) | RequestError::TooManyRequests(_) => "rate_limit_exceeded",
            RequestError::NoEndpoint(_) => "service_unavailable",
            RequestError::ModelNotFound(_) => "NotFoundError",
            RequestError::Dropped(dropped) if dropped.status() == 429 => "rate_limit_exceeded",
            RequestError::Dropped(_) => "service_unavailable",
        }
    }

    pub fn message(&self) -> String {
        match self {
            RequestError::BadRequest(message)
            | RequestError::Shed(message)
            | RequestError::TooManyRequests(message)
            | RequestError::NoEndpoint(message) => message.clone(),
            RequestError::BodyTooLarge { limit } => {
                format!("request body is larger than the limit of {limit} bytes")
            }
            RequestError::Dropped(dropped) => dropped.message().to_owned(),
            RequestError::ModelNotFound(model) => {
                format!("The model `{model}` does not exist.")
            }
        }
    }

    /// The `x-llm-d-request-dropped-reason` header's value, as llm-d sends it on every shed
    /// or no-endpoint answer, with flow control or without.
    pub fn dropped_reason(&self) -> Option<&'static str> {
        match self {
            RequestError::Dropped(dropped) => Some(dropped.reason()),
            RequestError::Shed(_) => Some(Dropped::QueueFull.reason()),
            RequestError::NoEndpoint(_) => Some(Dropped::NoEndpointTtlExpired.reason()),
            _ => None,
        }
    }

    /// Anthropic's error type for the status: its SDKs pick the exception class from it.
    fn anthropic_kind(&self) -> &'static str {
        match self.status() {
            400 => "invalid_request_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The JSON body in the shape the client's API uses.
    pub fn to_json_for(&self, shape: ErrorShape) -> Vec<u8> {
        match shape {
            ErrorShape::OpenAi => self.to_json(),
            ErrorShape::Anthropic => {
                let message = self.message();
                let envelope = AnthropicEnvelope {
                    kind: "error",
                    error: AnthropicError {
                        kind: self.anthropic_kind(),
                        message: &message,
                    },
                };
                serde_json::to_vec(&envelope)
                    .unwrap_or_else(|_| b"{\"type\":\"error\",\"error\":{}}".to_vec())
            }
        }
    }

    /// The JSON body: `{"error":{"message":..,"type":..,"code":..}}`.
    pub fn to_json(&self) -> Vec<u8> {
        let message = self.message();
        let envelope = ErrorEnvelope {
            error: ErrorBody {
                message: &message,
                kind: self.kind(),
                code: self.status(),
            },
        };
        serde_json::to_vec(&envelope).unwrap_or_else(|_| b"{\"error\":{}}".to_vec())
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status(), self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn bad_request_is_openai_shaped() {
        let error = RequestError::BadRequest("missing \"model\"".into());
        let body: serde_json::Value = serde_json::from_slice(&error.to_json()).unwrap();
        assert_eq!(body["error"]["message"], "missing \"model\"");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], 400);
    }

    #[test]
    fn anthropic_shape_keeps_the_status_and_names_the_type() {
        let cases = [
            (
                RequestError::BadRequest("bad".into()),
                "invalid_request_error",
            ),
            (RequestError::BodyTooLarge { limit: 1 }, "request_too_large"),
            (
                RequestError::TooManyRequests("busy".into()),
                "rate_limit_error",
            ),
            (RequestError::NoEndpoint("none".into()), "overloaded_error"),
            (
                RequestError::Dropped(Dropped::TtlExpired),
                "rate_limit_error",
            ),
            (
                RequestError::Dropped(Dropped::QueueFullNoEndpoints),
                "overloaded_error",
            ),
        ];
        for (error, kind) in cases {
            let body: serde_json::Value =
                serde_json::from_slice(&error.to_json_for(ErrorShape::Anthropic)).unwrap();
            assert_eq!(body["type"], "error", "{error}");
            assert_eq!(body["error"]["type"], kind, "{error}");
            assert_eq!(body["error"]["message"], error.message().as_str());
            assert!(body["error"].get("code").is_none(), "{body}");
            assert_eq!(error.to_json_for(ErrorShape::OpenAi), error.to_json());
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(RequestError::BodyTooLarge { limit: 1 }.status(), 413);
        assert_eq!(RequestError::TooManyRequests(String::new()).status(), 429);
        assert_eq!(RequestError::NoEndpoint(String::new()).status(), 503);
        assert_eq!(RequestError::ModelNotFound(String::new()).status(), 404);
        let expired = RequestError::Dropped(Dropped::TtlExpired);
        assert_eq!(
            (expired.status(), expired.dropped_reason()),
            (429, Some("rejected-ttl-expired"))
        );
        let empty = RequestError::Dropped(Dropped::NoEndpointTtlExpired);
        assert_eq!(
            (empty.status(), empty.dropped_reason()),
            (503, Some("rejected-no-endpoints"))
        );
    }

    #[test]
    fn every_shed_or_no_endpoint_answer_says_why_as_llm_d_does() {
        let shed = RequestError::Shed("the pool is saturated".into());
        assert_eq!(
            (shed.status(), shed.dropped_reason()),
            (429, Some("rejected-saturated"))
        );
        let none = RequestError::NoEndpoint("no endpoint is reachable".into());
        assert_eq!(
            (none.status(), none.dropped_reason()),
            (503, Some("rejected-no-endpoints"))
        );
        for other in [
            RequestError::BadRequest(String::new()),
            RequestError::TooManyRequests(String::new()),
            RequestError::ModelNotFound(String::new()),
        ] {
            assert_eq!(other.dropped_reason(), None, "{other}");
        }
    }
}
