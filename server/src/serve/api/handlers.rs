//! Route handlers: the two completion endpoints, models, tokenize/detokenize, health, metrics,
//! version.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use super::extract::ApiJson;
use super::generation::Generation;
use super::respond::{self, Meta};
use super::types::{ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest};
use super::validate::{chat_prompt, check_model, token_ids, Endpoint, ValidRequest};
use crate::serve::metrics;
use crate::serve::state::{AppState, InflightGuard, Loaded, Phase, ServeConfig};

/// The loaded model, or 503 while loading or draining.
pub(super) fn ready(state: &AppState) -> Result<&Loaded, ApiError> {
    match (state.phase(), state.loaded.get()) {
        (Phase::Ready, Some(l)) => Ok(l),
        (Phase::Draining, _) => {
            metrics::record_rejected("draining");
            Err(ApiError::Unavailable { message: "the server is shutting down".into(), retry_after_s: 5.0 })
        }
        (Phase::Failed, _) => Err(ApiError::Unavailable { message: "the model failed to load".into(), retry_after_s: 60.0 }),
        _ => {
            metrics::record_rejected("loading");
            Err(ApiError::Unavailable { message: "the model is loading".into(), retry_after_s: 5.0 })
        }
    }
}

/// Cheap admission pre-check before any tokenization: a full queue answers 429 at once.
fn precheck_queue(state: &AppState, l: &Loaded) -> Result<(), ApiError> {
    let waiting = l.engine.gauges.waiting.load(std::sync::atomic::Ordering::Relaxed);
    if waiting >= state.config.max_queue_requests {
        metrics::record_rejected("queue_full");
        return Err(ApiError::Overloaded { message: format!("the queue is full ({waiting} requests waiting)"), retry_after_s: 1.0 });
    }
    Ok(())
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Arc<AppState>>, headers: HeaderMap, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let class = slo_headers(&headers, &state.config)?;
    generate(&state, &headers, move |cfg, l| with_class(cfg, class, |cfg| ValidRequest::completion(&req, cfg, l))).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<Arc<AppState>>, headers: HeaderMap, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let class = slo_headers(&headers, &state.config)?;
    generate(&state, &headers, move |cfg, l| with_class(cfg, class, |cfg| ValidRequest::chat(&req, cfg, l))).await
}

/// Runs `f` with `class` as the default reading class, when a router's headers set one.
fn with_class<T>(cfg: &ServeConfig, class: Option<pace_scheduler::slo::SloClass>, f: impl FnOnce(&ServeConfig) -> T) -> T {
    match class {
        None => f(cfg),
        Some(class) => f(&ServeConfig { default_class: class, ..cfg.clone() }),
    }
}

/// The prefix-cache salt of a request under `--prefix-cache-isolation api-key`: its bearer
/// token's digest (never the token itself) and its own `cache_salt`, hashed together.
fn key_salt(token: &str, salt: Option<u64>) -> u64 {
    use sha2::Digest;
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    (sha2::Sha256::digest(token.as_bytes()).as_slice(), salt).hash(&mut h);
    h.finish() | 1
}

/// The client's `X-Request-Id`, if it sent one: 1 to 128 characters of `A-Z a-z 0-9 - _ . :`
/// (anything else is a 400, so a log line or a header never carries what a client injected).
fn client_request_id(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("x-request-id") else { return Ok(None) };
    let ok = |s: &str| (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    match v.to_str() {
        Ok(s) if ok(s) => Ok(Some(s.to_string())),
        _ => Err(ApiError::invalid("X-Request-Id must be 1 to 128 characters of A-Z, a-z, 0-9, '-', '_', '.' and ':'", None)),
    }
}

/// The llm-d router's per-request objectives, `x-llm-d-slo-ttft-ms` and `x-llm-d-slo-tpot-ms`:
/// they become the request's defaults for `ttft_grace` (the TTFT objective) and `reading_rate`
/// (one token per TPOT objective, clamped into `--reading-rate-range` as a body's would be), so
/// a request's own body fields still win. A header that is not a positive number of
/// milliseconds is a 400.
fn slo_headers(headers: &HeaderMap, cfg: &ServeConfig) -> Result<Option<pace_scheduler::slo::SloClass>, ApiError> {
    let ms = |name: &str| -> Result<Option<f64>, ApiError> {
        let Some(v) = headers.get(name) else { return Ok(None) };
        match v.to_str().ok().and_then(|s| s.trim().parse::<f64>().ok()) {
            Some(x) if x.is_finite() && x > 0.0 && x <= 3.6e6 => Ok(Some(x)),
            _ => Err(ApiError::invalid(format!("header {name} must be a positive number of milliseconds (at most an hour)"), None)),
        }
    };
    let (ttft, tpot) = (ms("x-llm-d-slo-ttft-ms")?, ms("x-llm-d-slo-tpot-ms")?);
    if ttft.is_none() && tpot.is_none() {
        return Ok(None);
    }
    let mut class = cfg.default_class;
    if let Some(t) = ttft {
        class.grace = t / 1000.0;
    }
    if let Some(t) = tpot {
        let (lo, hi) = cfg.reading_rate_range;
        class.reading_rate = (1000.0 / t).clamp(lo, hi);
    }
    Ok(Some(class))
}

/// Runs CPU-heavy request work (tokenization, chat templates, grammars) on tokio's blocking
/// pool, so the async workers (two on a 2-core machine) keep answering `/health` and streaming
/// tokens. The queue for it is bounded (`--max-preparing`: more is a 429) and lives here, in the
/// handler: a request whose client leaves while it waits drops out of the queue with its
/// handler, and is never prepared.
pub(super) async fn off_the_workers<T: Send + 'static>(
    state: &Arc<AppState>,
    work: impl FnOnce(&ServeConfig, &Loaded) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let Ok(place) = state.preparing.clone().try_acquire_owned() else {
        metrics::record_rejected("preparing_full");
        let n = state.config.max_preparing;
        // Busy, not unready: a 429, as every refusal of work; 503 means loading or draining.
        return Err(ApiError::Overloaded { message: format!("too many requests are being prepared ({n}); retry shortly"), retry_after_s: 1.0 });
    };
    let turn = state.preparing_now.clone().acquire_owned().await.map_err(|_| ApiError::Internal("request preparation is closed".into()))?;
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let _held = (place, turn);
        let t0 = std::time::Instant::now();
        if state.config.prepare_stall_s > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(state.config.prepare_stall_s));
        }
        let out = match state.loaded.get() {
            Some(l) => work(&state.config, l),
            None => Err(ApiError::Unavailable { message: "the model is loading".into(), retry_after_s: 5.0 }),
        };
        metrics::record_preparation(t0.elapsed().as_secs_f64());
        state.prepared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        out
    })
    .await
    .map_err(|e| ApiError::Internal(format!("request preparation failed: {e}")))?
}

/// The path every completion request takes: ready, counted in flight, the queue pre-check,
/// validation (off the async workers), admission of every choice, then the response (streamed
/// or collected).
async fn generate(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    validate: impl FnOnce(&ServeConfig, &Loaded) -> Result<ValidRequest, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    let client_id = client_request_id(headers)?;
    let l = ready(state)?;
    let arrival = l.engine.now();
    let guard = InflightGuard::new(state);
    precheck_queue(state, l)?;
    let ValidRequest { prompts, mut params, endpoint } = off_the_workers(state, validate).await?;
    if params.sampling.seed.is_none() {
        params.sampling.seed = state.next_unseeded();
    }
    if state.config.cache_per_key {
        params.cache_salt = Some(key_salt(super::bearer(headers), params.cache_salt));
    }
    let prefix = match endpoint {
        Endpoint::Completion { .. } => "cmpl",
        Endpoint::Chat { .. } => "chatcmpl",
    };
    // vLLM's rule: the response id is the prefix and the client's X-Request-Id when it sent one.
    let id = match &client_id {
        Some(c) => format!("{prefix}-{c}"),
        None => random_id(prefix),
    };
    let gen = Generation::start(state, &l.engine, &l.tokenizer, &prompts, &params, l.max_model_len, arrival, &id).await?;
    let echo = HeaderValue::from_str(client_id.as_deref().unwrap_or(&id)).ok();
    let meta = Meta { id, created: now_unix(), model: state.model_name().to_string() };
    let mut resp = if params.stream {
        respond::stream(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta, params.include_usage, guard, state.config.sse_keepalive_s)
    } else {
        let r = respond::collect(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta).await;
        drop(guard);
        r?
    };
    if let Some(v) = echo {
        resp.headers_mut().insert("x-request-id", v);
    }
    Ok(resp)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    let max_len = state.loaded.get().map(|l| l.max_model_len);
    let data: Vec<_> = state
        .config
        .served_model_names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": state.created, "owned_by": "pace", "max_model_len": max_len}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `POST /tokenize`: `{"prompt": "..."}` or `{"messages": [...]}` → `{"tokens", "count", "max_model_len"}`.
pub async fn tokenize(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<TokenizeRequest>) -> Result<Response, ApiError> {
    ready(&state)?;
    check_model(&req.model, &state.config)?;
    let (tokens, max_model_len) = off_the_workers(&state, move |_, l| {
        let tokens = match (&req.prompt, &req.messages) {
            (Some(p), None) => l.tokenizer.encode(p, req.add_special_tokens.unwrap_or(true)).map_err(|e| ApiError::param("prompt", e.to_string()))?,
            (None, Some(m)) => chat_prompt(l, m, req.add_generation_prompt.unwrap_or(true))?.tokens,
            _ => return Err(ApiError::param("prompt", "give exactly one of 'prompt' or 'messages'")),
        };
        Ok((tokens, l.max_model_len))
    })
    .await?;
    Ok(axum::Json(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": max_model_len})).into_response())
}

/// `POST /detokenize`: `{"tokens": [...]}` → `{"prompt": "..."}`.
pub async fn detokenize(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<DetokenizeRequest>) -> Result<Response, ApiError> {
    ready(&state)?;
    check_model(&req.model, &state.config)?;
    let prompt = off_the_workers(&state, move |_, l| {
        let ids = token_ids(&req.tokens, l.tokenizer.vocab_size(), "tokens")?;
        l.tokenizer.decode(&ids, false).map_err(|e| ApiError::param("tokens", e.to_string()))
    })
    .await?;
    Ok(axum::Json(json!({"prompt": prompt})).into_response())
}

/// `GET /health`: 200 when serving; 503 while loading, draining, after a failed load, once the
/// engine has stopped or hung, or while model steps keep failing.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (code, status) = match (state.phase(), state.loaded.get()) {
        (Phase::Ready, Some(l)) => {
            let failures = l.engine.gauges.consecutive_failures.load(std::sync::atomic::Ordering::Relaxed);
            if l.engine.gauges.hung.load(std::sync::atomic::Ordering::Acquire) {
                (StatusCode::SERVICE_UNAVAILABLE, "engine hung: a step made no progress")
            } else if l.engine.gauges.stopped.load(std::sync::atomic::Ordering::Acquire) {
                (StatusCode::SERVICE_UNAVAILABLE, "engine stopped")
            } else if failures >= state.config.unhealthy_after_failures {
                (StatusCode::SERVICE_UNAVAILABLE, "unhealthy: model steps are failing")
            } else {
                (StatusCode::OK, "ok")
            }
        }
        (Phase::Draining, _) => (StatusCode::SERVICE_UNAVAILABLE, "draining"),
        (Phase::Failed, _) => (StatusCode::SERVICE_UNAVAILABLE, "model failed to load"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
    };
    (code, axum::Json(json!({"status": status}))).into_response()
}

/// `GET /live`: liveness, for an orchestrator deciding whether to restart the process: 200
/// while it loads, serves or drains; 503 only for what a restart cures (the engine hung or
/// stopped, model steps failing). `/health` is readiness: routers and load balancers stop
/// sending when it turns 503, draining included (docs/fleet.md).
pub async fn live(State(state): State<Arc<AppState>>) -> Response {
    let broken = state.loaded.get().and_then(|l| {
        let g = &l.engine.gauges;
        if g.hung.load(std::sync::atomic::Ordering::Acquire) {
            Some("engine hung: a step made no progress")
        } else if g.stopped.load(std::sync::atomic::Ordering::Acquire) && state.phase() != Phase::Draining {
            Some("engine stopped")
        } else if g.consecutive_failures.load(std::sync::atomic::Ordering::Relaxed) >= state.config.unhealthy_after_failures {
            Some("unhealthy: model steps are failing")
        } else {
            None
        }
    });
    let broken = broken.or((state.phase() == Phase::Failed).then_some("model failed to load"));
    match broken {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": why}))).into_response(),
        None => axum::Json(json!({"status": "alive"})).into_response(),
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Some(l) = state.loaded.get() {
        state.window.update_gauges(l.engine.now());
        if let Some(g) = &l.grammars {
            metrics::publish_structured(g.stats());
        }
    }
    metrics::collect_process();
    state.metrics.run_upkeep();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// `GET /version`.
pub async fn version(State(state): State<Arc<AppState>>) -> Response {
    let scheduler = state.loaded.get().map(|l| l.scheduler.clone());
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION"), "scheduler": scheduler})).into_response()
}
