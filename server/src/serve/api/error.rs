//! The API's one error type. Every status code the server answers with is decided here, in
//! [`ApiError::status`], and every error body has OpenAI's shape:
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use pace_scheduler::{FinishReason, RejectReason, Rejection};
use serde_json::json;

use crate::serve::metrics;

/// Everything a request can fail with.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// Malformed or invalid input (400), naming the parameter when there is one.
    Invalid { message: String, param: Option<String>, code: Option<&'static str> },
    /// The body is not `application/json` (415).
    UnsupportedMediaType(String),
    /// The body is over the size limit (413).
    PayloadTooLarge { limit: usize },
    /// The body did not arrive within `--body-timeout` seconds (408).
    RequestTimeout { seconds: f64 },
    /// Missing or wrong API key (401).
    Unauthorized,
    /// The `model` field names no served model (404).
    ModelNotFound(String),
    /// No such route (404).
    NotFound(String),
    /// Wrong method for the route (405).
    MethodNotAllowed,
    /// Refused at admission: too much load right now (429), retry later.
    Overloaded { message: String, retry_after_s: f64 },
    /// Not serving: loading, draining or unhealthy (503).
    Unavailable { message: String, retry_after_s: f64 },
    /// Something failed inside the server (500).
    Internal(String),
    /// Admitted, then dropped by the `drop-late` policy for missing its SLO (503).
    Dropped,
}

impl ApiError {
    /// A 400 naming the offending parameter.
    pub fn invalid(message: impl Into<String>, param: impl Into<Option<String>>) -> Self {
        Self::Invalid { message: message.into(), param: param.into(), code: None }
    }

    /// A 400 for `param`.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message, Some(param.to_string()))
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::ModelNotFound(_) | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Dropped => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// OpenAI's `error.type`.
    fn kind(&self) -> &'static str {
        match self {
            Self::Invalid { .. }
            | Self::UnsupportedMediaType(_)
            | Self::PayloadTooLarge { .. }
            | Self::RequestTimeout { .. }
            | Self::ModelNotFound(_)
            | Self::NotFound(_)
            | Self::MethodNotAllowed => "invalid_request_error",
            Self::Unauthorized => "authentication_error",
            Self::Overloaded { .. } => "rate_limit_error",
            Self::Unavailable { .. } => "service_unavailable_error",
            Self::Internal(_) | Self::Dropped => "server_error",
        }
    }

    /// The error object (also used for an error event inside a stream).
    pub fn body(&self) -> serde_json::Value {
        let (message, param, code): (String, Option<String>, Option<&str>) = match self {
            Self::Invalid { message, param, code } => (message.clone(), param.clone(), *code),
            Self::UnsupportedMediaType(ct) => (format!("Content-Type must be application/json, got '{ct}'"), None, Some("unsupported_media_type")),
            Self::PayloadTooLarge { limit } => (format!("request body is larger than the {limit}-byte limit"), None, Some("payload_too_large")),
            Self::RequestTimeout { seconds } => (format!("the request body did not arrive within {seconds} s"), None, Some("request_timeout")),
            Self::Unauthorized => ("missing or invalid API key".into(), None, Some("invalid_api_key")),
            Self::ModelNotFound(m) => (format!("The model `{m}` does not exist."), Some("model".into()), Some("model_not_found")),
            Self::NotFound(p) => (format!("no route for {p}"), None, Some("not_found")),
            Self::MethodNotAllowed => ("method not allowed for this route".into(), None, Some("method_not_allowed")),
            Self::Overloaded { message, .. } => (message.clone(), None, Some("overloaded")),
            Self::Unavailable { message, .. } => (message.clone(), None, Some("unavailable")),
            Self::Internal(m) => (m.clone(), None, Some("internal_error")),
            Self::Dropped => ("the request missed its SLO and was dropped by the drop-late scheduler".into(), None, Some("dropped")),
        };
        json!({ "error": { "message": message, "type": self.kind(), "param": param, "code": code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        let retry = match &self {
            Self::Overloaded { retry_after_s, .. } | Self::Unavailable { retry_after_s, .. } => Some(*retry_after_s),
            Self::Dropped => Some(1.0),
            _ => None,
        };
        if let Some(s) = retry {
            // Whole seconds, at least one (RFC 9110 delay-seconds).
            let secs = s.ceil().clamp(1.0, 3600.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        if matches!(self, Self::Unauthorized) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// A refusal at admission: 429 with the predicted Retry-After when smooth predicts the request
/// would be served too late or a queue bound is full (the reason is in the message); 400 when
/// retrying cannot help.
impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        let label = metrics::reject_label(r.reason);
        let message = format!("request rejected at admission ({label}); retry after {:.1} s", r.retry_after_s);
        match r.reason {
            RejectReason::PredictedLate | RejectReason::QueueFull | RejectReason::QueueTokens => Self::Overloaded { message, retry_after_s: r.retry_after_s },
            RejectReason::TooLong | RejectReason::Invalid => Self::invalid(format!("request cannot be served ({label})"), None),
        }
    }
}

impl ApiError {
    /// The error a choice that ended with `reason` reports instead of a `finish_reason`
    /// (dropped by drop-late, a failed engine step), or `None` for an ordinary end.
    pub fn from_finish(reason: FinishReason) -> Option<Self> {
        match reason {
            FinishReason::Stop | FinishReason::Length | FinishReason::Abort => None,
            FinishReason::Dropped => Some(Self::Dropped),
            FinishReason::Error => Some(Self::Internal(
                "the engine failed on this request (a failed or stuck model step, or logits that were not finite; the server log says which)".into(),
            )),
            FinishReason::Rejected => Some(Self::Overloaded { message: "rejected".into(), retry_after_s: 1.0 }),
        }
    }
}

/// A 400 with `code: "context_length_exceeded"` and the message clients parse; `param` is
/// `prompt` or `messages`.
pub fn context_length_exceeded(max_model_len: usize, prompt_tokens: usize, param: &str) -> ApiError {
    ApiError::Invalid {
        message: format!(
            "This model's maximum context length is {max_model_len} tokens. However, you requested {prompt_tokens} tokens in the messages/prompt. Please reduce the length of the messages/prompt."
        ),
        param: Some(param.into()),
        code: Some("context_length_exceeded"),
    }
}
