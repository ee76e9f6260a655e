//! A scripted OpenAI-compatible SSE server on 127.0.0.1 for the client's tests.
//!
//! The prompt text names a scenario (`steady`, `multi`, `reject429`, ...): a fixed sequence of
//! waits, frames, errors and breaks, timed from the moment the request was received. Any other
//! prompt streams `max_tokens` tokens, the first after `first_ms`, then one every `itl_ms`.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// Timing of the default scenario and a request counter.
#[derive(Clone)]
pub struct Cfg {
    /// Delay of the first token, ms.
    pub first_ms: u64,
    /// Delay between tokens, ms.
    pub itl_ms: u64,
    /// Generation requests received.
    pub hits: Arc<AtomicUsize>,
    /// Streams whose client went away before `[DONE]` (the server dropped the body).
    pub disconnects: Arc<AtomicUsize>,
    /// The `priority` of every generation request received (0 when absent), in arrival order.
    pub priorities: Arc<std::sync::Mutex<Vec<i64>>>,
    /// Answer 503 to every request without a negative `priority` (a server that serves only
    /// its priority traffic).
    pub refuse_unprioritized: bool,
}

impl Cfg {
    pub fn new(first_ms: u64, itl_ms: u64) -> Self {
        Self {
            first_ms,
            itl_ms,
            hits: Arc::new(AtomicUsize::new(0)),
            disconnects: Arc::new(AtomicUsize::new(0)),
            priorities: Arc::default(),
            refuse_unprioritized: false,
        }
    }
}

/// Counts a stream dropped before it finished: what a server sees when its client leaves.
struct Watch {
    disconnects: Arc<AtomicUsize>,
    finished: bool,
}

impl Watch {
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if !self.finished {
            self.disconnects.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// One step of a scripted stream.
#[derive(Debug, Clone)]
pub enum Step {
    Wait(u64),
    Token(&'static str, Option<&'static str>),
    Usage(usize),
    Error(&'static str),
    Done,
    Break,
}

use Step::*;

/// A scripted reply: a stream, or an HTTP status with an optional `Retry-After` (seconds).
pub type Reply = Result<Vec<Step>, (u16, Option<u64>)>;

/// The script of a named scenario (`None`: the default stream).
pub fn script(name: &str) -> Option<Reply> {
    Some(Ok(match name {
        // TTFT 150, ITL 100: tokens at 150, 250, 350, 450, 550 ms.
        "steady" => vec![
            Wait(150),
            Token("a", None),
            Wait(100),
            Token("b", None),
            Wait(100),
            Token("c", None),
            Wait(100),
            Token("d", None),
            Wait(100),
            Token("e", Some("length")),
            Usage(5),
            Done,
        ],
        // Two tokens in the first frame (100 ms), one more at 300 ms.
        "multi" => vec![Wait(100), Token("ab", None), Wait(200), Token("c", Some("length")), Usage(3), Done],
        // Completes, but its first token comes at 400 ms.
        "slow" => vec![Wait(400), Token("a", None), Wait(50), Token("b", None), Wait(50), Token("c", Some("length")), Usage(3), Done],
        "reject429" => return Some(Err((429, Some(2)))),
        "reject503" => return Some(Err((503, Some(1)))),
        "http500" => return Some(Err((500, None))),
        // Two tokens, then an engine error event at 300 ms.
        "midstream" => vec![Wait(100), Token("a", None), Wait(100), Token("b", None), Wait(100), Error("internal_error"), Done],
        // One token, then dropped at 300 ms (drop-late's error event).
        "drop" => vec![Wait(100), Token("a", None), Wait(200), Error("request_dropped"), Done],
        // Two tokens, then the connection breaks at 300 ms.
        "broken" => vec![Wait(100), Token("a", None), Wait(100), Token("b", None), Wait(100), Break],
        // One token, then nothing for 10 s.
        "stall" => vec![Wait(100), Token("a", None), Wait(10_000), Token("b", Some("length")), Usage(2), Done],
        _ => return None,
    }))
}

fn chunk(chat: bool, text: &str, finish: Option<&str>) -> Value {
    if chat {
        json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
    } else {
        json!({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]})
    }
}

fn error_body(message: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}})
}

fn sse(steps: Vec<Step>, chat: bool, usage: bool, disconnects: Arc<AtomicUsize>) -> Response {
    let frames = steps.into_iter().filter(move |s| usage || !matches!(s, Usage(_)));
    let watch = Watch { disconnects, finished: false };
    let stream = futures_util::stream::unfold((frames, watch), move |(mut it, mut watch)| async move {
        loop {
            let Some(step) = it.next() else {
                watch.finish();
                return None;
            };
            let data = match step {
                Wait(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    continue;
                }
                Token(t, f) => chunk(chat, t, f).to_string(),
                Usage(n) => json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}}).to_string(),
                Error(code) => error_body(&format!("scripted {code}"), code).to_string(),
                Done => {
                    watch.finish();
                    "[DONE]".to_string()
                }
                Break => {
                    watch.finish();
                    return Some((Err(std::io::Error::other("scripted break")), (it, watch)));
                }
            };
            return Some((Ok::<_, std::io::Error>(Bytes::from(format!("data: {data}\n\n"))), (it, watch)));
        }
    });
    Response::builder().header("content-type", "text/event-stream").body(Body::from_stream(stream)).expect("valid response")
}

async fn generate(State(cfg): State<Cfg>, chat: bool, body: Value) -> Response {
    cfg.hits.fetch_add(1, Ordering::SeqCst);
    let prompt = if chat { body.pointer("/messages/0/content") } else { body.get("prompt") };
    let max = if chat { body.get("max_completion_tokens") } else { body.get("max_tokens") };
    let (Some(prompt), Some(max)) = (prompt.and_then(|p| p.as_str()), max.and_then(|m| m.as_u64())) else {
        return (StatusCode::BAD_REQUEST, Json(error_body("bad request", "invalid_request"))).into_response();
    };
    if body.get("stream") != Some(&json!(true)) {
        return (StatusCode::BAD_REQUEST, Json(error_body("stream must be true", "invalid_request"))).into_response();
    }
    let usage = body.pointer("/stream_options/include_usage") == Some(&json!(true));
    let priority = body.get("priority").and_then(Value::as_i64).unwrap_or(0);
    cfg.priorities.lock().expect("not poisoned").push(priority);
    if cfg.refuse_unprioritized && priority >= 0 {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(error_body("scripted: priority traffic only", "overloaded"))).into_response();
    }
    match script(prompt) {
        Some(Ok(steps)) => sse(steps, chat, usage, cfg.disconnects.clone()),
        Some(Err((status, retry))) => {
            let mut r = (StatusCode::from_u16(status).expect("status"), Json(error_body("scripted refusal", "overloaded"))).into_response();
            if let Some(s) = retry {
                r.headers_mut().insert("retry-after", s.to_string().parse().expect("header"));
            }
            r
        }
        None => {
            let mut steps = vec![Wait(cfg.first_ms)];
            for i in 0..max {
                if i > 0 {
                    steps.push(Wait(cfg.itl_ms));
                }
                steps.push(Token("x", (i + 1 == max).then_some("length")));
            }
            steps.extend([Usage(max as usize), Done]);
            sse(steps, chat, usage, cfg.disconnects.clone())
        }
    }
}

/// The scripted app.
pub fn app(cfg: Cfg) -> Router {
    Router::new()
        .route("/v1/completions", post(|s: State<Cfg>, Json(b): Json<Value>| generate(s, false, b)))
        .route("/v1/chat/completions", post(|s: State<Cfg>, Json(b): Json<Value>| generate(s, true, b)))
        .route("/v1/models", get(|| async { Json(json!({"object": "list", "data": [{"id": "scripted-model", "object": "model"}]})) }))
        .route("/health", get(|| async { Ok::<_, Infallible>("ok") }))
        .with_state(cfg)
}

/// Serves `app(cfg)` on a free 127.0.0.1 port; returns its base URL.
pub async fn start(cfg: Cfg) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app(cfg)).await.ok();
    });
    format!("http://{addr}")
}
