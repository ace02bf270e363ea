//! OpenAI-style error bodies returned to clients as local replies.

use serde::Serialize;

/// Why a request was refused; each maps to one HTTP status and one OpenAI error type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The body is not valid JSON or lacks what the endpoint needs (400).
    BadRequest(String),
    /// The body is larger than the configured limit (413).
    BodyTooLarge { limit: usize },
    /// Saturated pool and a sheddable request, or filters removed every endpoint (429).
    TooManyRequests(String),
    /// No endpoint can take the request (503).
    NoEndpoint(String),
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

impl RequestError {
    pub fn status(&self) -> u16 {
        match self {
            RequestError::BadRequest(_) => 400,
            RequestError::BodyTooLarge { .. } => 413,
            RequestError::TooManyRequests(_) => 429,
            RequestError::NoEndpoint(_) => 503,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            RequestError::BadRequest(_) | RequestError::BodyTooLarge { .. } => {
                "invalid_request_error"
            }
            RequestError::TooManyRequests(_) => "rate_limit_exceeded",
            RequestError::NoEndpoint(_) => "service_unavailable",
        }
    }

    pub fn message(&self) -> String {
        match self {
            RequestError::BadRequest(message)
            | RequestError::TooManyRequests(message)
            | RequestError::NoEndpoint(message) => message.clone(),
            RequestError::BodyTooLarge { limit } => {
                format!("request body is larger than the limit of {limit} bytes")
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
    fn statuses() {
        assert_eq!(RequestError::BodyTooLarge { limit: 1 }.status(), 413);
        assert_eq!(RequestError::TooManyRequests(String::new()).status(), 429);
        assert_eq!(RequestError::NoEndpoint(String::new()).status(), 503);
    }
}
