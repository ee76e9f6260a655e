//! Route handlers: the two completion endpoints, models, tokenize/detokenize, health, metrics,
//! version.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pace_models::chat::ChatMessage;
use serde_json::json;

use super::error::ApiError;
use super::extract::ApiJson;
use super::generation::{Generation, Prompt};
use super::respond::{self, Endpoint, Meta};
use super::types::{ChatRequest, CompletionRequest, Content, DetokenizeRequest, MessageIn, PromptInput, TokenizeRequest};
use super::validate::{check_lengths, check_model, gen_params};
use crate::serve::state::{AppState, InflightGuard, Loaded, Phase};

/// The loaded model, or 503 while loading or draining.
fn ready(state: &AppState) -> Result<&Loaded, ApiError> {
    match (state.phase(), state.loaded.get()) {
        (Phase::Ready, Some(l)) => Ok(l),
        (Phase::Draining, _) => {
            metrics::counter!("pace_requests_rejected_total", "reason" => "draining").increment(1);
            Err(ApiError::Unavailable { message: "the server is shutting down".into(), retry_after_s: 5.0 })
        }
        (Phase::Failed, _) => Err(ApiError::Unavailable { message: "the model failed to load".into(), retry_after_s: 60.0 }),
        _ => {
            metrics::counter!("pace_requests_rejected_total", "reason" => "loading").increment(1);
            Err(ApiError::Unavailable { message: "the model is loading".into(), retry_after_s: 5.0 })
        }
    }
}

/// Cheap admission pre-check before any tokenization: a full queue answers 429 at once.
fn precheck_queue(state: &AppState, l: &Loaded) -> Result<(), ApiError> {
    let waiting = l.engine.gauges.waiting.load(std::sync::atomic::Ordering::Relaxed);
    if waiting >= state.config.max_queue_requests {
        metrics::counter!("pace_requests_rejected_total", "reason" => "queue_full").increment(1);
        return Err(ApiError::Overloaded { message: format!("the queue is full ({waiting} requests waiting)"), retry_after_s: 1.0 });
    }
    Ok(())
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let l = ready(&state)?;
    let arrival = l.engine.now();
    let guard = InflightGuard::new(&state);
    precheck_queue(&state, l)?;
    let common = req.common();
    let vocab = l.tokenizer.vocab_size();
    let logprobs = match req.logprobs {
        None => None,
        Some(v) if v >= 0 => Some(v as usize),
        Some(v) => return Err(ApiError::param("logprobs", format!("logprobs must be >= 0, got {v}"))),
    };
    let params = gen_params(&common, &state.config, vocab, (common.max_tokens, "max_tokens"), logprobs)?;
    if req.best_of.is_some_and(|b| b != params.n as i64 && b != 1) {
        return Err(ApiError::param("best_of", "best_of other than n is not supported"));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param("suffix", "suffix is not supported"));
    }
    let echo = req.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        return Err(ApiError::param("echo", "echo together with logprobs is not supported"));
    }
    let add_special = req.add_special_tokens.unwrap_or(true);
    let prompts = completion_prompts(&req.prompt, l, add_special, state.config.max_prompts)?;
    check_lengths(&prompts, &params, l.max_model_len, "prompt")?;
    let gen = Generation::start(&state, &l.engine, &l.tokenizer, &prompts, &params, l.max_model_len, arrival).await?;
    let endpoint = Endpoint::Completion { echo: echo.then(|| prompts.iter().map(|p| p.text.clone()).collect()), n: params.n, logprobs: logprobs.is_some() };
    let meta = Meta { id: random_id("cmpl"), created: now_unix(), model: state.model_name().to_string() };
    if params.stream {
        Ok(respond::stream(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta, params.include_usage, guard))
    } else {
        let r = respond::collect(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta).await;
        drop(guard);
        r
    }
}

fn completion_prompts(input: &PromptInput, l: &Loaded, add_special: bool, max_prompts: usize) -> Result<Vec<Prompt>, ApiError> {
    let vocab = l.tokenizer.vocab_size();
    let from_ids = |ids: &[i64]| -> Result<Prompt, ApiError> {
        let tokens = ids
            .iter()
            .map(|&t| {
                if t >= 0 && (t as usize) < vocab {
                    Ok(t as u32)
                } else {
                    Err(ApiError::param("prompt", format!("token id {t} is outside the vocabulary (size {vocab})")))
                }
            })
            .collect::<Result<Vec<u32>, _>>()?;
        let text = l.tokenizer.decode(&tokens, false).unwrap_or_default();
        Ok(Prompt { tokens, text })
    };
    let from_text = |text: &str| -> Result<Prompt, ApiError> {
        let tokens = l.tokenizer.encode(text, add_special).map_err(|e| ApiError::param("prompt", e.to_string()))?;
        Ok(Prompt { tokens, text: text.to_string() })
    };
    let prompts: Vec<Prompt> = match input {
        PromptInput::Text(t) => vec![from_text(t)?],
        PromptInput::Tokens(ids) => vec![from_ids(ids)?],
        PromptInput::Texts(ts) => ts.iter().map(|t| from_text(t)).collect::<Result<_, _>>()?,
        PromptInput::TokenLists(ls) => ls.iter().map(|ids| from_ids(ids)).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::param("prompt", "the prompt list is empty"));
    }
    if prompts.len() > max_prompts {
        return Err(ApiError::param("prompt", format!("at most {max_prompts} prompts per request, got {}", prompts.len())));
    }
    Ok(prompts)
}

/// Flattens OpenAI messages into the template's messages (text content only).
fn chat_messages(messages: &[MessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::param("messages", "messages must not be empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" => m.role.clone(),
                "developer" => "system".to_string(),
                other => return Err(ApiError::param(&format!("messages[{i}].role"), format!("unsupported role '{other}' (use system, developer, user or assistant)"))),
            };
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut s = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => s.push_str(t),
                            _ => return Err(ApiError::param(&format!("messages[{i}].content[{j}]"), "only text content parts are supported")),
                        }
                    }
                    s
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

fn render_chat(l: &Loaded, messages: &[MessageIn], add_generation_prompt: bool) -> Result<Prompt, ApiError> {
    let msgs = chat_messages(messages)?;
    let text = l.template.render(&msgs, add_generation_prompt).map_err(|e| ApiError::param("messages", e.to_string()))?;
    let tokens = l.tokenizer.encode(&text, false).map_err(|e| ApiError::param("messages", e.to_string()))?;
    Ok(Prompt { tokens, text })
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let l = ready(&state)?;
    let arrival = l.engine.now();
    let guard = InflightGuard::new(&state);
    precheck_queue(&state, l)?;
    let common = req.common();
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::param("tools", "tools are not supported"));
    }
    match &req.tool_choice {
        None => {}
        Some(v) if v == "none" => {}
        Some(_) => return Err(ApiError::param("tool_choice", "tool_choice is not supported")),
    }
    if let Some(f) = &req.response_format {
        if f.kind != "text" {
            return Err(ApiError::param("response_format", format!("response_format '{}' is not supported", f.kind)));
        }
    }
    let want_logprobs = req.logprobs.unwrap_or(false);
    let top = match req.top_logprobs {
        None => 0,
        Some(v) if v >= 0 => v as usize,
        Some(v) => return Err(ApiError::param("top_logprobs", format!("top_logprobs must be >= 0, got {v}"))),
    };
    if top > 0 && !want_logprobs {
        return Err(ApiError::param("top_logprobs", "top_logprobs requires logprobs to be true"));
    }
    let logprobs = want_logprobs.then_some(top);
    let (max_tokens, name) = match req.max_completion_tokens {
        Some(v) => (Some(v), "max_completion_tokens"),
        None => (common.max_tokens, "max_tokens"),
    };
    let params = gen_params(&common, &state.config, l.tokenizer.vocab_size(), (max_tokens, name), logprobs)?;
    let prompt = render_chat(l, &req.messages, req.add_generation_prompt.unwrap_or(true))?;
    let prompts = [prompt];
    check_lengths(&prompts, &params, l.max_model_len, "messages")?;
    let gen = Generation::start(&state, &l.engine, &l.tokenizer, &prompts, &params, l.max_model_len, arrival).await?;
    let endpoint = Endpoint::Chat { logprobs: want_logprobs };
    let meta = Meta { id: random_id("chatcmpl"), created: now_unix(), model: state.model_name().to_string() };
    if params.stream {
        Ok(respond::stream(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta, params.include_usage, guard))
    } else {
        let r = respond::collect(gen, l.engine.clone(), l.tokenizer.clone(), endpoint, meta).await;
        drop(guard);
        r
    }
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
    let l = ready(&state)?;
    check_model(&req.model, &state.config)?;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(p), None) => l.tokenizer.encode(p, req.add_special_tokens.unwrap_or(true)).map_err(|e| ApiError::param("prompt", e.to_string()))?,
        (None, Some(m)) => render_chat(l, m, req.add_generation_prompt.unwrap_or(true))?.tokens,
        _ => return Err(ApiError::param("prompt", "give exactly one of 'prompt' or 'messages'")),
    };
    Ok(axum::Json(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": l.max_model_len})).into_response())
}

/// `POST /detokenize`: `{"tokens": [...]}` → `{"prompt": "..."}`.
pub async fn detokenize(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<DetokenizeRequest>) -> Result<Response, ApiError> {
    let l = ready(&state)?;
    check_model(&req.model, &state.config)?;
    let vocab = l.tokenizer.vocab_size();
    let ids = req
        .tokens
        .iter()
        .map(|&t| if t >= 0 && (t as usize) < vocab { Ok(t as u32) } else { Err(ApiError::param("tokens", format!("token id {t} is outside the vocabulary (size {vocab})"))) })
        .collect::<Result<Vec<u32>, _>>()?;
    let prompt = l.tokenizer.decode(&ids, false).map_err(|e| ApiError::param("tokens", e.to_string()))?;
    Ok(axum::Json(json!({"prompt": prompt})).into_response())
}

/// `GET /health`: 200 when serving; 503 while loading, draining, after a failed load, or while
/// model steps keep failing.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let (code, status) = match (state.phase(), state.loaded.get()) {
        (Phase::Ready, Some(l)) => {
            let failures = l.engine.gauges.consecutive_failures.load(std::sync::atomic::Ordering::Relaxed);
            if l.engine.gauges.stopped.load(std::sync::atomic::Ordering::Acquire) {
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

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    if let Some(l) = state.loaded.get() {
        state.window.update_gauges(l.engine.now());
    }
    state.metrics.run_upkeep();
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

/// `GET /version`.
pub async fn version(State(state): State<Arc<AppState>>) -> Response {
    let scheduler = state.loaded.get().map(|l| l.scheduler.clone());
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION"), "scheduler": scheduler})).into_response()
}
