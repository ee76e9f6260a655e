//! Writing a [`Generation`] out: an SSE stream of chunks or one JSON response, in the shape of
//! the completions or the chat endpoint. Delivery times are stamped as each frame is handed to
//! the connection (streaming) or when the whole response is (non-streaming).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use pace_models::tokenizer::Tokenizer;
use pace_scheduler::SampledToken;
use serde_json::{json, Value};

use super::error::ApiError;
use super::generation::{Finish, Frame, Generation};
use crate::serve::engine_thread::EngineHandle;
use crate::serve::state::InflightGuard;

/// Which endpoint's shapes to write.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `/v1/completions`; `echo` holds each prompt's text when echo was asked for.
    Completion { echo: Option<Vec<String>>, n: usize, logprobs: bool },
    /// `/v1/chat/completions`.
    Chat { logprobs: bool },
}

/// Response metadata.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model name.
    pub model: String,
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.token_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
}

fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default()
}

/// Chat logprobs content entries for `tokens`.
fn chat_logprobs(tok: &Tokenizer, tokens: &[SampledToken]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let top: Vec<Value> = t
                .top_logprobs
                .iter()
                .map(|&(id, lp)| json!({"token": token_text(tok, id), "logprob": lp, "bytes": token_bytes(tok, id)}))
                .collect();
            json!({"token": token_text(tok, t.token), "logprob": t.logprob, "bytes": token_bytes(tok, t.token), "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// Completions logprobs object for `tokens`, text offsets counted from `offset`.
fn completion_logprobs(tok: &Tokenizer, tokens: &[SampledToken], mut offset: usize) -> Value {
    let mut texts = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for t in tokens {
        let text = token_text(tok, t.token);
        offsets.push(offset);
        offset += text.len();
        texts.push(text);
        lps.push(json!(t.logprob));
        let m: serde_json::Map<String, Value> = t.top_logprobs.iter().map(|&(id, lp)| (token_text(tok, id), json!(lp))).collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

fn finish_str(f: &Option<Finish>) -> Value {
    match f {
        Some(Finish::Reason(r)) => json!(r),
        Some(Finish::Error(_)) => json!("error"),
        None => Value::Null,
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// Streams the generation as SSE: chunks, then (if asked) one usage chunk with no choices, then
/// `data: [DONE]`. A server-side end that is an error (dropped, engine failure) becomes an
/// `{"error": …}` event for that choice.
pub fn stream(mut gen: Generation, engine: EngineHandle, tok: Arc<Tokenizer>, endpoint: Endpoint, meta: Meta, include_usage: bool, guard: InflightGuard) -> Response {
    let object = match endpoint {
        Endpoint::Completion { .. } => "text_completion",
        Endpoint::Chat { .. } => "chat.completion.chunk",
    };
    let body = async_stream::stream! {
        let _guard = guard;
        let chunk = |choices: Value| json!({"id": meta.id, "object": object, "created": meta.created, "model": meta.model, "choices": choices});
        let mut role_sent = vec![false; gen.num_choices()];
        let mut text_offset = vec![0usize; gen.num_choices()];
        if let Endpoint::Completion { echo: Some(texts), n, .. } = &endpoint {
            for (pi, text) in texts.iter().enumerate() {
                for c in 0..*n {
                    let index = pi * n + c;
                    text_offset[index] = text.len();
                    let choice = json!([{"index": index, "text": text, "logprobs": null, "finish_reason": null}]);
                    yield Ok::<Event, Infallible>(Event::default().data(chunk(choice).to_string()));
                }
            }
        }
        while let Some(frame) = gen.next_frame().await {
            let Frame { index, text, tokens, finish } = &frame;
            if let Some(Finish::Error(e)) = finish {
                let now = engine.now();
                gen.delivered(&frame, now);
                let mut body = e.body();
                body["error"]["index"] = json!(index);
                yield Ok(Event::default().data(body.to_string()));
                continue;
            }
            let choice = match &endpoint {
                Endpoint::Completion { logprobs, .. } => {
                    let lp = if *logprobs { completion_logprobs(&tok, tokens, text_offset[*index]) } else { Value::Null };
                    text_offset[*index] += text.len();
                    json!({"index": index, "text": text, "logprobs": lp, "finish_reason": finish_str(finish)})
                }
                Endpoint::Chat { logprobs } => {
                    let mut delta = json!({"content": text});
                    if !role_sent[*index] {
                        role_sent[*index] = true;
                        delta["role"] = json!("assistant");
                    }
                    let lp = if *logprobs { chat_logprobs(&tok, tokens) } else { Value::Null };
                    json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_str(finish)})
                }
            };
            let data = chunk(json!([choice])).to_string();
            let now = engine.now();
            gen.delivered(&frame, now);
            yield Ok(Event::default().data(data));
        }
        if include_usage {
            let mut u = chunk(json!([]));
            u["usage"] = usage(gen.prompt_tokens, gen.completion_tokens());
            yield Ok(Event::default().data(u.to_string()));
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    Sse::new(body).into_response()
}

/// Runs the generation to the end and answers with one JSON object. Any choice that ended in an
/// error makes the whole response that error (decided before the first byte).
pub async fn collect(mut gen: Generation, engine: EngineHandle, tok: Arc<Tokenizer>, endpoint: Endpoint, meta: Meta) -> Result<Response, ApiError> {
    let n = gen.num_choices();
    let mut texts = vec![String::new(); n];
    let mut tokens: Vec<Vec<SampledToken>> = vec![Vec::new(); n];
    let mut finishes: Vec<Option<Finish>> = vec![None; n];
    let mut frames = Vec::new();
    while let Some(mut frame) = gen.next_frame().await {
        texts[frame.index].push_str(&frame.text);
        tokens[frame.index].extend(frame.tokens.iter().cloned());
        if frame.finish.is_some() {
            finishes[frame.index] = frame.finish.clone();
        }
        frame.text.clear();
        frames.push(frame);
    }
    let now = engine.now();
    for f in &frames {
        gen.delivered(f, now);
    }
    if let Some(Finish::Error(e)) = finishes.iter().flatten().find(|f| matches!(f, Finish::Error(_))) {
        return Err(e.clone());
    }
    let choices: Vec<Value> = (0..n)
        .map(|i| match &endpoint {
            Endpoint::Completion { echo, n: per, logprobs } => {
                let prefix = echo.as_ref().map(|e| e[i / per].clone()).unwrap_or_default();
                let lp = if *logprobs { completion_logprobs(&tok, &tokens[i], prefix.len()) } else { Value::Null };
                json!({"index": i, "text": format!("{prefix}{}", texts[i]), "logprobs": lp, "finish_reason": finish_str(&finishes[i])})
            }
            Endpoint::Chat { logprobs } => {
                let lp = if *logprobs { chat_logprobs(&tok, &tokens[i]) } else { Value::Null };
                json!({"index": i, "message": {"role": "assistant", "content": texts[i]}, "logprobs": lp, "finish_reason": finish_str(&finishes[i])})
            }
        })
        .collect();
    let object = match endpoint {
        Endpoint::Completion { .. } => "text_completion",
        Endpoint::Chat { .. } => "chat.completion",
    };
    let body = json!({
        "id": meta.id, "object": object, "created": meta.created, "model": meta.model,
        "choices": choices, "usage": usage(gen.prompt_tokens, gen.completion_tokens()),
    });
    Ok(axum::Json(body).into_response())
}
