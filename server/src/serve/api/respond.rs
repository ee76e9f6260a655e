//! Writing a [`Generation`] out: an SSE stream of chunks or one JSON response, in the shape of
//! the completions or the chat endpoint. Delivery times are stamped as each frame is handed to
//! the connection (streaming) or when the whole response is (non-streaming).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use pace_models::tokenizer::Tokenizer;
use pace_scheduler::{FinishReason, SampledToken};
use serde::Serialize;

use super::error::ApiError;
use super::generation::{Frame, Generation};
use super::structured::{self, ToolMode};
use super::types::{
    ChatChoice, ChatChunkChoice, ChatLogprobs, CompletionBody, CompletionChoice, CompletionLogprobs, Delta, FunctionCallDelta, MessageOut, TokenLogprob,
    ToolCall, ToolCallDelta, TopLogprob, Usage,
};
use super::validate::Endpoint;
use crate::serve::engine_thread::EngineHandle;
use crate::serve::metrics;
use crate::serve::state::InflightGuard;

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

impl Meta {
    fn body<C>(&self, object: &'static str, choices: Vec<C>, usage: Option<Usage>) -> CompletionBody<C> {
        CompletionBody { id: self.id.clone(), object, created: self.created, model: self.model.clone(), choices, usage }
    }
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.token_bytes(id).map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default()
}

fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default()
}

/// Chat logprobs of `tokens`.
fn chat_logprobs(tok: &Tokenizer, tokens: &[SampledToken]) -> ChatLogprobs {
    let content = tokens
        .iter()
        .map(|t| TokenLogprob {
            token: token_text(tok, t.token),
            logprob: t.logprob,
            bytes: token_bytes(tok, t.token),
            top_logprobs: t.top_logprobs.iter().map(|&(id, lp)| TopLogprob { token: token_text(tok, id), logprob: lp, bytes: token_bytes(tok, id) }).collect(),
        })
        .collect();
    ChatLogprobs { content }
}

/// Completions logprobs of `tokens`, text offsets counted from `offset`.
fn completion_logprobs(tok: &Tokenizer, tokens: &[SampledToken], mut offset: usize) -> CompletionLogprobs {
    let mut lp = CompletionLogprobs::default();
    for t in tokens {
        let text = token_text(tok, t.token);
        lp.text_offset.push(offset);
        offset += text.len();
        lp.tokens.push(text);
        lp.token_logprobs.push(t.logprob);
        lp.top_logprobs.push(t.top_logprobs.iter().map(|&(id, p)| (token_text(tok, id), p)).collect());
    }
    lp
}

/// OpenAI's `finish_reason` of a choice's last frame.
fn finish_reason(f: Option<FinishReason>) -> Option<&'static str> {
    f.map(|r| if ApiError::from_finish(r).is_some() { "error" } else { metrics::finish_label(r) })
}

/// The `finish_reason` of a reply made of tool calls: `tool_calls` when it ended by itself.
fn tool_finish_reason(f: Option<FinishReason>) -> Option<&'static str> {
    match f {
        Some(FinishReason::Stop) => Some("tool_calls"),
        other => finish_reason(other),
    }
}

/// The whole calls as stream fragments (one per call, each complete).
fn call_deltas(calls: Vec<ToolCall>) -> Vec<ToolCallDelta> {
    calls
        .into_iter()
        .enumerate()
        .map(|(index, c)| ToolCallDelta {
            index,
            id: Some(c.id),
            kind: Some("function"),
            function: FunctionCallDelta { name: Some(c.function.name), arguments: c.function.arguments },
        })
        .collect()
}

/// How one chat choice's text reaches the stream when tools are in play.
enum ChatStream {
    /// Plain text, as it comes.
    Text,
    /// The arguments of a named function, streamed as argument fragments (`id` once sent).
    Named { name: String, id: Option<String> },
    /// `required`: a list of calls whose layout the grammar fixes, streamed call by call and
    /// argument fragment by fragment as it is written; tokens wait for the next fragment.
    Required { calls: structured::RequiredCalls, tokens: Vec<SampledToken> },
    /// `auto`: held back while the text could still become a call.
    Held { text: String, tokens: Vec<SampledToken> },
}

impl ChatStream {
    fn new(mode: &ToolMode) -> Self {
        match mode {
            ToolMode::None => Self::Text,
            ToolMode::Named(name) => Self::Named { name: name.clone(), id: None },
            ToolMode::Required => Self::Required { calls: structured::RequiredCalls::default(), tokens: Vec::new() },
            ToolMode::Auto { .. } => Self::Held { text: String::new(), tokens: Vec::new() },
        }
    }

    /// The chunk choice for one frame, or None while text is held back.
    fn chunk(&mut self, mode: &ToolMode, tok: &Tokenizer, logprobs: bool, index: usize, role: Option<&'static str>, frame: &Frame) -> Option<ChatChunkChoice> {
        let lp = |tokens: &[SampledToken]| logprobs.then(|| chat_logprobs(tok, tokens));
        let text_choice = |text: String, tokens: &[SampledToken], finish: Option<&'static str>| ChatChunkChoice {
            index,
            delta: Delta { role, content: Some(text), tool_calls: Vec::new() },
            logprobs: lp(tokens),
            finish_reason: finish,
        };
        match self {
            Self::Text => Some(text_choice(frame.text.clone(), &frame.tokens, finish_reason(frame.finish))),
            Self::Named { name, id } => {
                let first = id.is_none();
                let call_id = id.get_or_insert_with(structured::call_id).clone();
                let call = ToolCallDelta {
                    index: 0,
                    id: first.then_some(call_id),
                    kind: first.then_some("function"),
                    function: FunctionCallDelta { name: first.then(|| name.clone()), arguments: frame.text.clone() },
                };
                Some(ChatChunkChoice {
                    index,
                    delta: Delta { role, content: None, tool_calls: vec![call] },
                    logprobs: lp(&frame.tokens),
                    finish_reason: tool_finish_reason(frame.finish),
                })
            }
            Self::Required { calls, tokens } => {
                tokens.extend(frame.tokens.iter().cloned());
                let fragments = calls.push(&frame.text);
                if frame.finish.is_some() && calls.started() == 0 {
                    // Not the list the grammar writes (cut before the first name): plain text.
                    let text = calls.text().to_string();
                    let tokens = std::mem::take(tokens);
                    return Some(text_choice(text, &tokens, finish_reason(frame.finish)));
                }
                if fragments.is_empty() && frame.finish.is_none() {
                    return None;
                }
                let deltas = fragments
                    .into_iter()
                    .map(|f| {
                        let first = f.name.is_some();
                        ToolCallDelta {
                            index: f.index,
                            id: first.then(structured::call_id),
                            kind: first.then_some("function"),
                            function: FunctionCallDelta { name: f.name, arguments: f.arguments },
                        }
                    })
                    .collect();
                let tokens = std::mem::take(tokens);
                Some(ChatChunkChoice {
                    index,
                    delta: Delta { role, content: None, tool_calls: deltas },
                    logprobs: lp(&tokens),
                    finish_reason: tool_finish_reason(frame.finish),
                })
            }
            Self::Held { text, tokens } => {
                text.push_str(&frame.text);
                tokens.extend(frame.tokens.iter().cloned());
                if frame.finish.is_some() {
                    let (text, tokens) = (std::mem::take(text), std::mem::take(tokens));
                    return Some(match structured::parse_calls(mode, &text) {
                        Some(calls) => ChatChunkChoice {
                            index,
                            delta: Delta { role, content: None, tool_calls: call_deltas(calls) },
                            logprobs: lp(&tokens),
                            finish_reason: tool_finish_reason(frame.finish),
                        },
                        None => text_choice(text, &tokens, finish_reason(frame.finish)),
                    });
                }
                if matches!(mode, ToolMode::Auto { .. }) && !structured::may_be_call(text) {
                    // Not a call: what was held goes out as text, and the rest streams as it comes.
                    let (text, tokens) = (std::mem::take(text), std::mem::take(tokens));
                    *self = Self::Text;
                    return Some(text_choice(text, &tokens, None));
                }
                None
            }
        }
    }
}

fn sse<T: Serialize>(body: &T) -> Result<Event, Infallible> {
    Ok(Event::default().data(serde_json::to_string(body).unwrap_or_default()))
}

/// Streams the generation as SSE: chunks, then (if asked) one usage chunk with no choices, then
/// `data: [DONE]`. A server-side end that is an error (dropped, engine failure) becomes an
/// `{"error": …}` event for that choice.
#[allow(clippy::too_many_arguments)]
pub fn stream(
    mut gen: Generation,
    engine: EngineHandle,
    tok: Arc<Tokenizer>,
    endpoint: Endpoint,
    meta: Meta,
    include_usage: bool,
    guard: InflightGuard,
    keepalive_s: f64,
) -> Response {
    let body = async_stream::stream! {
        let _guard = guard;
        let mut role_sent = vec![false; gen.num_choices()];
        // Frames whose text is held back (tool calls): delivered when their text goes out.
        let mut held: Vec<Vec<Frame>> = (0..gen.num_choices()).map(|_| Vec::new()).collect();
        let mut chat_streams: Vec<ChatStream> = match &endpoint {
            Endpoint::Chat { tools, .. } => (0..gen.num_choices()).map(|_| ChatStream::new(tools)).collect(),
            Endpoint::Completion { .. } => Vec::new(),
        };
        let mut text_offset = vec![0usize; gen.num_choices()];
        if let Endpoint::Completion { echo: Some(texts), n, .. } = &endpoint {
            for (pi, text) in texts.iter().enumerate() {
                for c in 0..*n {
                    let index = pi * n + c;
                    text_offset[index] = text.len();
                    let choice = CompletionChoice { index, text: text.clone(), logprobs: None, finish_reason: None };
                    yield sse(&meta.body("text_completion", vec![choice], None));
                }
            }
        }
        while let Some(frame) = gen.next_frame().await {
            let Frame { index, text, tokens, finish } = &frame;
            if let Some(e) = finish.and_then(ApiError::from_finish) {
                let now = engine.now();
                for f in std::mem::take(&mut held[*index]) {
                    gen.delivered(&f, now);
                }
                gen.delivered(&frame, now);
                let mut body = e.body();
                body["error"]["index"] = serde_json::json!(index);
                yield sse(&body);
                continue;
            }
            let data = match &endpoint {
                Endpoint::Completion { logprobs, .. } => {
                    let lp = logprobs.then(|| completion_logprobs(&tok, tokens, text_offset[*index]));
                    text_offset[*index] += text.len();
                    let choice = CompletionChoice { index: *index, text: text.clone(), logprobs: lp, finish_reason: finish_reason(*finish) };
                    sse(&meta.body("text_completion", vec![choice], None))
                }
                Endpoint::Chat { logprobs, tools } => {
                    let role = (!role_sent[*index]).then_some("assistant");
                    match chat_streams[*index].chunk(tools, &tok, *logprobs, *index, role, &frame) {
                        Some(choice) => {
                            role_sent[*index] = true;
                            sse(&meta.body("chat.completion.chunk", vec![choice], None))
                        }
                        None => {
                            held[*index].push(Frame { index: *index, text: String::new(), tokens: tokens.clone(), finish: None });
                            continue;
                        }
                    }
                }
            };
            let now = engine.now();
            for f in std::mem::take(&mut held[*index]) {
                gen.delivered(&f, now);
            }
            gen.delivered(&frame, now);
            yield data;
        }
        if include_usage {
            let usage = Some(Usage::new(gen.prompt_tokens, gen.cached_tokens(), gen.completion_tokens()));
            yield match &endpoint {
                Endpoint::Completion { .. } => sse(&meta.body::<CompletionChoice>("text_completion", vec![], usage)),
                Endpoint::Chat { .. } => sse(&meta.body::<ChatChunkChoice>("chat.completion.chunk", vec![], usage)),
            };
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    if keepalive_s > 0.0 {
        Sse::new(body).keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs_f64(keepalive_s)).text("keep-alive")).into_response()
    } else {
        Sse::new(body).into_response()
    }
}

/// Runs the generation to the end and answers with one JSON object. Any choice that ended in an
/// error makes the whole response that error (decided before the first byte).
pub async fn collect(mut gen: Generation, engine: EngineHandle, tok: Arc<Tokenizer>, endpoint: Endpoint, meta: Meta) -> Result<Response, ApiError> {
    let n = gen.num_choices();
    let mut texts = vec![String::new(); n];
    let mut tokens: Vec<Vec<SampledToken>> = vec![Vec::new(); n];
    let mut finishes: Vec<Option<FinishReason>> = vec![None; n];
    let mut frames = Vec::new();
    while let Some(mut frame) = gen.next_frame().await {
        texts[frame.index].push_str(&frame.text);
        tokens[frame.index].extend(frame.tokens.iter().cloned());
        if frame.finish.is_some() {
            finishes[frame.index] = frame.finish;
        }
        frame.text.clear();
        frames.push(frame);
    }
    let now = engine.now();
    for f in &frames {
        gen.delivered(f, now);
    }
    if let Some(e) = finishes.iter().flatten().find_map(|&r| ApiError::from_finish(r)) {
        return Err(e);
    }
    let usage = Some(Usage::new(gen.prompt_tokens, gen.cached_tokens(), gen.completion_tokens()));
    let body = match &endpoint {
        Endpoint::Completion { echo, n: per, logprobs } => {
            let choices = (0..n)
                .map(|i| {
                    let prefix = echo.as_ref().map(|e| e[i / per].clone()).unwrap_or_default();
                    let lp = logprobs.then(|| completion_logprobs(&tok, &tokens[i], prefix.len()));
                    CompletionChoice { index: i, text: format!("{prefix}{}", texts[i]), logprobs: lp, finish_reason: finish_reason(finishes[i]) }
                })
                .collect();
            serde_json::to_value(meta.body("text_completion", choices, usage))
        }
        Endpoint::Chat { logprobs, tools } => {
            let choices = (0..n)
                .map(|i| {
                    let text = std::mem::take(&mut texts[i]);
                    let (message, finish) = match structured::parse_calls(tools, &text) {
                        // A named call cut by max_tokens is still that call (its arguments incomplete).
                        Some(calls) => (MessageOut { role: "assistant", content: None, tool_calls: calls }, tool_finish_reason(finishes[i])),
                        None => (MessageOut { role: "assistant", content: Some(text), tool_calls: Vec::new() }, finish_reason(finishes[i])),
                    };
                    ChatChoice { index: i, message, logprobs: logprobs.then(|| chat_logprobs(&tok, &tokens[i])), finish_reason: finish }
                })
                .collect();
            serde_json::to_value(meta.body("chat.completion", choices, usage))
        }
    };
    let body = body.map_err(|e| ApiError::Internal(format!("writing the response: {e}")))?;
    Ok(axum::Json(body).into_response())
}
