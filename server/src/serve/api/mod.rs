//! The OpenAI-compatible HTTP API. [`app`] builds the router, so tests can drive it without a
//! socket; the server binds it in `serve`.

pub mod error;
pub mod extract;
pub mod fleet;
pub mod generation;
pub mod handlers;
pub mod respond;
pub mod structured;
pub mod types;
pub mod validate;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use error::ApiError;

use super::state::AppState;

/// The router: inference routes behind the Host check and the API key (when they are set);
/// `/health`, `/metrics`, `/version` and what routers poll (`/get_load`, `/server_info`,
/// `/model_info`) stay open for probes, scrapers and routers.
pub fn app(state: Arc<AppState>) -> Router {
    let inference = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route("/v1/chat/completions/render", post(fleet::render_chat))
        .route("/v1/completions/render", post(fleet::render_completion))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), check_host));
    Router::new()
        .merge(inference)
        .route("/health", get(handlers::health))
        .route("/ready", get(handlers::health))
        .route("/live", get(handlers::live))
        .route("/metrics", get(handlers::metrics))
        .route("/version", get(handlers::version))
        .route("/get_load", get(fleet::get_load))
        .route("/server_info", get(fleet::server_info))
        .route("/get_server_info", get(fleet::server_info))
        .route("/model_info", get(fleet::model_info))
        .route("/get_model_info", get(fleet::model_info))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn(count_http))
        .with_state(state)
}

/// Counts every HTTP request in `pace_http_requests_total{handler, status}` when its response
/// head is ready (a stream counts its 200 when it starts). A request whose client closed the
/// connection before that counts as status `499` (nginx's "client closed request"), so every
/// request the server read is accounted for. `handler` is the route pattern, `other` for paths
/// no route matches (a client cannot create series).
async fn count_http(req: Request, next: Next) -> Response {
    let handler = match req.extensions().get::<MatchedPath>().map(|p| p.as_str()) {
        Some(p) => super::metrics::http_handler_label(p),
        None => "other",
    };
    let mut pending = HttpCount { handler, status: None };
    let response = next.run(req).await;
    pending.status = Some(response.status().as_u16());
    response
}

struct HttpCount {
    handler: &'static str,
    status: Option<u16>,
}

impl Drop for HttpCount {
    fn drop(&mut self) {
        super::metrics::record_http(self.handler, self.status.unwrap_or(499));
    }
}

async fn not_found(req: Request) -> Response {
    ApiError::NotFound(req.uri().path().to_string()).into_response()
}

/// The host a request names (the URI's authority, as HTTP/2 sends it, else `Host`), lower case,
/// without its port or an IPv6 address's brackets.
fn request_host(req: &Request) -> Option<String> {
    let raw = match req.uri().host() {
        Some(h) => h.to_string(),
        None => req.headers().get(axum::http::header::HOST)?.to_str().ok()?.to_string(),
    };
    let host = match raw.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => raw.rsplit_once(':').map_or(raw.as_str(), |(h, _)| h),
    };
    Some(host.to_ascii_lowercase())
}

/// `--allowed-hosts`: whether `host` is one of them (`*.example.com` names any subdomain).
pub fn host_allowed(allowed: &[String], host: &str) -> bool {
    allowed
        .iter()
        .any(|a| a == host || a.strip_prefix("*.").is_some_and(|suffix| host.strip_suffix(suffix).is_some_and(|sub| sub.ends_with('.') && sub.len() > 1)))
}

/// With `--allowed-hosts`, an inference request naming any other host is a 400: a web page on
/// a rebound DNS name cannot reach a server that listens on 127.0.0.1.
async fn check_host(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let allowed = &state.config.allowed_hosts;
    if allowed.is_empty() {
        return next.run(req).await;
    }
    match request_host(&req) {
        Some(h) if host_allowed(allowed, &h) => next.run(req).await,
        h => ApiError::invalid(format!("the Host '{}' is not one this server answers for (--allowed-hosts)", h.unwrap_or_default()), None).into_response(),
    }
}

/// The bearer token of `Authorization` ("" when none).
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> &str {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .unwrap_or("")
}

/// Bearer-token check, constant time: the given token is hashed to the keys' length (only their
/// SHA-256 digests are kept, so no key sits in memory a `Debug` could print), and every key is
/// compared.
async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if state.config.api_key_digests.is_empty() {
        return next.run(req).await;
    }
    let given = Sha256::digest(bearer(req.headers()).as_bytes());
    let mut ok = subtle::Choice::from(0u8);
    for key in &state.config.api_key_digests {
        ok |= key.as_slice().ct_eq(given.as_slice());
    }
    if bool::from(ok) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}
