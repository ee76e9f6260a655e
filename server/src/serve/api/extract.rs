//! `ApiJson<T>`: the body extractor of every JSON route. Checks the Content-Type (415), reads the
//! body under the size limit (413) and the time limit (408), parses it (400 for malformed JSON or a body that is not an
//! object) and deserializes it, turning serde's errors into a 400 that names the parameter.

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::serve::state::AppState;

/// A JSON request body, validated for shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let ct = req.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if mime != "application/json" {
            return Err(ApiError::UnsupportedMediaType(ct));
        }
        let limit = state.config.max_body_bytes;
        let seconds = state.config.body_timeout_s;
        let read = axum::body::to_bytes(req.into_body(), limit);
        let bytes = match tokio::time::timeout(std::time::Duration::from_secs_f64(seconds), read).await {
            Err(_) => return Err(ApiError::RequestTimeout { seconds }),
            Ok(Ok(b)) => b,
            // axum wraps http-body-util's `LengthLimitError`; anything else is a broken upload.
            Ok(Err(e)) if format!("{e:#}").contains("length limit") => return Err(ApiError::PayloadTooLarge { limit }),
            Ok(Err(e)) => return Err(ApiError::invalid(format!("reading the request body failed: {e}"), None)),
        };
        parse_body(&bytes).map(ApiJson)
    }
}

/// Parses a request body (exposed for tests and fuzzing). The body is read straight into the
/// request type, never into a `serde_json::Value` first: a `Value` is 72 bytes a node (serde_json's
/// `preserve_order`, which llguidance turns on), so a 4 MiB body of a million tiny array items
/// would take over 70 MiB as a `Value`.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let malformed = |e: &dyn std::fmt::Display| ApiError::invalid(format!("malformed JSON body: {e}"), None);
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        // Valid JSON that is not an object, or not JSON at all.
        _ => {
            return Err(match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Ok(_) => ApiError::invalid("the request body must be a JSON object", None),
                Err(e) => malformed(&e),
            })
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize(&mut de) {
        Ok(v) => v,
        Err(e) if e.inner().is_syntax() || e.inner().is_eof() => return Err(malformed(e.inner())),
        Err(e) => return Err(field_error(e)),
    };
    de.end().map_err(|e| malformed(&e))?;
    Ok(value)
}

/// A body that is JSON but does not fit the request type: a 400 naming the field.
fn field_error(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner().to_string();
    let join = |field: &str| {
        if path == "." || path.is_empty() {
            field.to_string()
        } else if path == field || path.ends_with(&format!(".{field}")) {
            path.clone()
        } else {
            format!("{path}.{field}")
        }
    };
    if let Some(field) = unknown_field(&inner) {
        let param = join(field);
        if VLLM_ONLY.contains(&field) && param == field {
            return ApiError::invalid(format!("'{param}' is a vLLM extension that pace does not support"), Some(param));
        }
        return ApiError::invalid(format!("Unrecognized request argument supplied: {param}"), Some(param));
    }
    if let Some(field) = missing_field(&inner) {
        let param = join(field);
        return ApiError::invalid(format!("Missing required parameter: '{param}'."), Some(param));
    }
    let param = if path == "." { None } else { Some(path.clone()) };
    // serde's message ends with " at line L column C"; drop that.
    let msg = inner.split(" at line ").next().unwrap_or(&inner).to_string();
    ApiError::invalid(format!("Invalid value for '{path}': {msg}"), param)
}

/// Request fields vLLM's API takes that pace does not: a 400 that says so, rather than
/// "unrecognized". (vLLM's fields pace implements are in `types.rs`.)
pub const VLLM_ONLY: [&str; 15] = [
    "use_beam_search",
    "length_penalty",
    "bad_words",
    "allowed_token_ids",
    "prompt_logprobs",
    "truncate_prompt_tokens",
    "return_tokens_as_token_ids",
    "return_token_ids",
    "structural_tag",
    "documents",
    "mm_processor_kwargs",
    "logits_processors",
    "request_id",
    "kv_transfer_params",
    "vllm_xargs",
];

fn quoted_after<'a>(msg: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = msg.strip_prefix(prefix)?;
    let rest = rest.strip_prefix('`')?;
    rest.split('`').next()
}

fn unknown_field(msg: &str) -> Option<&str> {
    quoted_after(msg, "unknown field ")
}

fn missing_field(msg: &str) -> Option<&str> {
    quoted_after(msg, "missing field ")
}
