//! The OpenAI-compatible HTTP API. [`app`] builds the router, so tests can drive it without a
//! socket; the server binds it in `serve`.

pub mod error;
pub mod extract;
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

/// The router: inference routes behind the API key (when one is set); `/health`, `/metrics` and
/// `/version` stay open for probes and scrapers.
pub fn app(state: Arc<AppState>) -> Router {
    let inference = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/models", get(handlers::models))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(inference)
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/version", get(handlers::version))
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

/// Bearer-token check, constant time: both sides are hashed to equal length first, and every
/// configured key is compared.
async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if state.config.api_keys.is_empty() {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .unwrap_or("");
    let given = Sha256::digest(given.as_bytes());
    let mut ok = subtle::Choice::from(0u8);
    for key in &state.config.api_keys {
        ok |= Sha256::digest(key.as_bytes()).ct_eq(&given);
    }
    if bool::from(ok) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}
