//! What routers in front of several replicas read (docs/fleet.md): SGLang's model gateway and
//! vLLM's router ask for a replica's load, its model and shape, and the token ids a request
//! would be prefilled with.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::ApiJson;
use super::types::{ChatRequest, CompletionRequest};
use super::validate::ValidRequest;
use crate::serve::state::{AppState, Loaded, ServeConfig};
use crate::serve::LoadFormat;

/// `?format=` of `/get_load`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadQuery {
    format: Option<String>,
}

/// `GET /get_load`, in the shape `--load-format` (or `?format=`) names: SGLang's,
/// `[{"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}]` (the gateway's `power_of_two`
/// sends to the replica with fewer `num_tokens`, summed over the list) with pace's
/// `predicted_wait_s` added, or vLLM's `{"load": N}`, N the requests running and waiting.
/// `num_tokens` is the work on the replica in tokens: the prompt tokens still to prefill and
/// the tokens the running requests hold.
pub async fn get_load(State(state): State<Arc<AppState>>, Query(q): Query<LoadQuery>) -> Result<Response, ApiError> {
    let g = &loaded(&state)?.engine.gauges;
    let (running, waiting) = (g.running.load(Ordering::Relaxed), g.waiting.load(Ordering::Relaxed));
    let tokens = g.queued_tokens.load(Ordering::Relaxed) + g.running_tokens.load(Ordering::Relaxed);
    let wait = g.predicted_wait_us.load(Ordering::Relaxed) as f64 / 1e6;
    let format = match q.format.as_deref() {
        None => state.config.load_format,
        Some("sglang") => LoadFormat::Sglang,
        Some("vllm") => LoadFormat::Vllm,
        Some(other) => return Err(ApiError::param("format", format!("format '{other}' is not known (use 'sglang' or 'vllm')"))),
    };
    match format {
        LoadFormat::Sglang => Ok(axum::Json(json!([{
            "dp_rank": 0,
            "num_reqs": running + waiting,
            "num_waiting_reqs": waiting,
            "num_tokens": tokens,
            "predicted_wait_s": wait,
        }]))
        .into_response()),
        LoadFormat::Vllm => Ok(axum::Json(json!({"load": running + waiting})).into_response()),
    }
}

/// `GET /server_info` (and SGLang's older `/get_server_info`): the served name and the engine's
/// shape, in SGLang's field names where it has one.
pub async fn server_info(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let l = loaded(&state)?;
    let s = &l.shape;
    Ok(axum::Json(json!({
        "served_model_name": state.model_name(),
        "model_path": s.model_path,
        "context_length": l.max_model_len,
        "page_size": s.block_size,
        "max_total_num_tokens": s.block_size * s.num_blocks,
        "max_total_tokens": s.block_size * s.num_blocks,
        "max_running_requests": s.max_num_seqs,
        "chunked_prefill_size": s.max_batch_tokens,
        "max_prefill_tokens": s.max_batch_tokens,
        "max_queued_requests": state.config.max_queue_requests,
        "scheduler": l.scheduler,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response())
}

/// `GET /model_info` (and `/get_model_info`): SGLang's fields.
pub async fn model_info(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let l = loaded(&state)?;
    Ok(axum::Json(json!({
        "model_path": l.shape.model_path,
        "tokenizer_path": l.shape.model_path,
        "served_model_name": state.model_name(),
        "is_generation": true,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "max_model_len": l.max_model_len,
    }))
    .into_response())
}

fn loaded(state: &AppState) -> Result<&Loaded, ApiError> {
    state.loaded.get().ok_or_else(|| ApiError::Unavailable { message: "the model is loading".into(), retry_after_s: 5.0 })
}

/// `POST /v1/chat/completions/render`: the request validated exactly as the completion would be
/// (the same template, tools and grammar checks, the same 400s) and the token ids it would be
/// prefilled with, `{"token_ids": [...]}`; nothing is generated.
pub async fn render_chat(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<ChatRequest>) -> Result<Response, ApiError> {
    let mut prompts = render(&state, move |cfg, l| ValidRequest::chat(&req, cfg, l)).await?;
    Ok(axum::Json(prompts.swap_remove(0)).into_response())
}

/// `POST /v1/completions/render`: as [`render_chat`], one `{"token_ids"}` per prompt in a list,
/// as vLLM answers (llm-d's token producer reads that shape).
pub async fn render_completion(State(state): State<Arc<AppState>>, ApiJson(req): ApiJson<CompletionRequest>) -> Result<Response, ApiError> {
    let prompts = render(&state, move |cfg, l| ValidRequest::completion(&req, cfg, l)).await?;
    Ok(axum::Json(prompts).into_response())
}

/// Each prompt of the validated request as `{"token_ids": [...]}` (at least one: validation
/// refuses an empty request).
async fn render(
    state: &Arc<AppState>,
    validate: impl FnOnce(&ServeConfig, &Loaded) -> Result<ValidRequest, ApiError> + Send + 'static,
) -> Result<Vec<Value>, ApiError> {
    super::handlers::ready(state)?;
    let v = super::handlers::off_the_workers(state, validate).await?;
    let prompts: Vec<_> = v.prompts.iter().map(|p| json!({"token_ids": p.tokens})).collect();
    if prompts.is_empty() {
        return Err(ApiError::param("prompt", "the request has no prompt"));
    }
    Ok(prompts)
}
