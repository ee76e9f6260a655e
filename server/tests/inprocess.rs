//! The API contract in-process: `pace_server::serve::api::app` driven with
//! `tower::ServiceExt::oneshot`, no socket, on `dummy:smollm2-135m` (random weights, a
//! byte-level tokenizer): every bad input gets an OpenAI-shaped error before any SSE byte and
//! the server keeps serving (docs/reliability.md); tokenize, detokenize, models, version,
//! health. What needs the real model or a real connection (streaming semantics, batch
//! invariance, the OpenAI client, disconnects, signals) is in `api.rs` and `lifecycle.rs`.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{header, Method, Request};
use clap::Parser;
use pace_server::serve::state::AppState;
use pace_server::serve::{api, in_process, ServeArgs};
use serde_json::{json, Value};
use tower::ServiceExt;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

/// One in-process server for this file's tests (they only read state that concurrency cannot
/// change).
fn state() -> Arc<AppState> {
    static S: OnceLock<Arc<AppState>> = OnceLock::new();
    S.get_or_init(|| {
        let args = Args::parse_from([
            "serve",
            "--model",
            "dummy:smollm2-135m:q4",
            "--served-model-name",
            "SmolLM2-135M-Instruct",
            "--threads",
            "2",
            "--scheduler",
            "fcfs",
            "--max-n",
            "4",
            "--max-body-bytes",
            "65536",
            "--max-model-len",
            "512",
            "--kv-cache-memory",
            "64MiB",
        ]);
        in_process(&args.serve).expect("in-process server")
    })
    .clone()
}

/// A request through the router: (status, content type, body bytes).
async fn call(method: Method, path: &str, content_type: Option<&str>, body: Vec<u8>) -> (u16, String, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let resp = api::app(state()).oneshot(req.body(Body::from(body)).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, ct, bytes.to_vec())
}

/// A JSON POST: (status, content type, parsed body or Null).
async fn post(path: &str, body: &Value) -> (u16, String, Value) {
    let (st, ct, b) = call(Method::POST, path, Some("application/json"), serde_json::to_vec(body).unwrap()).await;
    (st, ct, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

async fn get(path: &str) -> (u16, Value) {
    let (st, _, b) = call(Method::GET, path, None, vec![]).await;
    (st, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

const COMPLETIONS: &str = "/v1/completions";
const CHAT: &str = "/v1/chat/completions";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Asserts an OpenAI error body with `status`, and optionally its `param` and `code`.
fn assert_error(status: u16, body: &Value, want: u16, param: Option<&str>, code: Option<&str>, what: &str) {
    assert_eq!(status, want, "{what}: status (body {body})");
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: no message in {body}");
    assert!(e["type"].is_string(), "{what}: no type in {body}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "{what}: param/code keys missing in {body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{what}: param in {body}");
    }
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{what}: code in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_openai_errors_before_any_sse_byte_and_the_server_keeps_serving() {
    // Raw bodies.
    for (body, what) in [("{", "malformed"), ("\"text\"", "string"), ("[1,2]", "list"), ("42", "number"), ("null", "null"), ("", "empty")] {
        let (st, ct, b) = call(Method::POST, COMPLETIONS, Some("application/json"), body.as_bytes().to_vec()).await;
        let v: Value = serde_json::from_slice(&b).unwrap_or(Value::Null);
        assert!(ct.starts_with("application/json"), "{what}: content type {ct}");
        assert_error(st, &v, 400, None, None, what);
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    let (st, _, b) = call(Method::POST, COMPLETIONS, Some("text/plain"), b"{\"prompt\":\"hi\"}".to_vec()).await;
    assert_error(st, &serde_json::from_slice(&b).unwrap(), 415, None, None, "wrong content type");
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(70_000));
    let (st, _, b) = call(Method::POST, COMPLETIONS, Some("application/json"), big.into_bytes()).await;
    assert_error(st, &serde_json::from_slice(&b).unwrap(), 413, None, None, "body over the limit");

    // Field-level errors, each also with stream: true (same status, JSON body, no SSE).
    let long_prompt = "hello ".repeat(600);
    // (route, body, status, param, code)
    type Case = (&'static str, Value, u16, Option<&'static str>, Option<&'static str>);
    let cases: Vec<Case> = vec![
        (COMPLETIONS, json!({"max_tokens": 4}), 400, Some("prompt"), None),
        (CHAT, json!({"max_tokens": 4}), 400, Some("messages"), None),
        (COMPLETIONS, json!({"prompt": 5}), 400, Some("prompt"), None),
        (CHAT, json!({"messages": "hi"}), 400, Some("messages"), None),
        (COMPLETIONS, json!({"prompt": "hi", "temperature": "hot"}), 400, Some("temperature"), None),
        (COMPLETIONS, json!({"prompt": "hi", "frobnicate": true}), 400, Some("frobnicate"), None),
        (COMPLETIONS, json!({"prompt": long_prompt}), 400, Some("prompt"), Some("context_length_exceeded")),
        (CHAT, json!({"messages": user(&long_prompt)}), 400, Some("messages"), Some("context_length_exceeded")),
        (COMPLETIONS, json!({"prompt": "hi", "max_tokens": 600}), 400, Some("max_tokens"), None),
        (COMPLETIONS, json!({"prompt": "hi", "max_tokens": 0}), 400, Some("max_tokens"), None),
        (COMPLETIONS, json!({"prompt": "hi", "max_tokens": -3}), 400, Some("max_tokens"), None),
        (COMPLETIONS, json!({"prompt": "hi", "temperature": -0.1}), 400, Some("temperature"), None),
        (COMPLETIONS, json!({"prompt": "hi", "temperature": 2.5}), 400, Some("temperature"), None),
        (COMPLETIONS, json!({"prompt": "hi", "top_p": 0}), 400, Some("top_p"), None),
        (COMPLETIONS, json!({"prompt": "hi", "top_p": 1.5}), 400, Some("top_p"), None),
        (COMPLETIONS, json!({"prompt": "hi", "n": 0}), 400, Some("n"), None),
        (COMPLETIONS, json!({"prompt": "hi", "n": 5}), 400, Some("n"), None),
        (COMPLETIONS, json!({"prompt": "hi", "stop": [""]}), 400, Some("stop"), None),
        (COMPLETIONS, json!({"prompt": "hi", "logprobs": 21}), 400, Some("logprobs"), None),
        (CHAT, json!({"messages": user("hi"), "logprobs": true, "top_logprobs": 50}), 400, Some("logprobs"), None),
        (COMPLETIONS, json!({"prompt": "hi", "stream_options": {"include_usage": true}}), 400, Some("stream_options"), None),
        (COMPLETIONS, json!({"prompt": "hi", "model": "gpt-4"}), 404, Some("model"), Some("model_not_found")),
        (CHAT, json!({"messages": user("hi"), "model": "nope"}), 404, Some("model"), Some("model_not_found")),
        (COMPLETIONS, json!({"prompt": [1, 2, 49152]}), 400, Some("prompt"), None),
        (COMPLETIONS, json!({"prompt": [1, -2]}), 400, Some("prompt"), None),
        (COMPLETIONS, json!({"prompt": "hi", "stop_token_ids": [49152]}), 400, Some("stop_token_ids"), None),
        (CHAT, json!({"messages": []}), 400, Some("messages"), None),
        (CHAT, json!({"messages": [{"role": "wizard", "content": "x"}]}), 400, Some("messages[0].role"), None),
        (CHAT, json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400, Some("messages[0].content[0]"), None),
        (CHAT, json!({"messages": user("hi"), "tools": [{"type": "function"}]}), 400, Some("tools[0].function"), None),
        (CHAT, json!({"messages": user("hi"), "top_logprobs": 2}), 400, Some("top_logprobs"), None),
        (COMPLETIONS, json!({"prompt": "hi", "echo": true, "logprobs": 1}), 400, Some("echo"), None),
        (COMPLETIONS, json!({"prompt": "hi", "priority": 11}), 400, Some("priority"), None),
        (CHAT, json!({"messages": user("hi"), "priority": 1.5}), 400, Some("priority"), None),
    ];
    for (path, body, want, param, code) in &cases {
        for streaming in [false, true] {
            let mut b = body.clone();
            if streaming && *param != Some("stream_options") {
                b["stream"] = json!(true);
            }
            let (st, ct, v) = post(path, &b).await;
            assert!(ct.starts_with("application/json"), "{b}: answered {ct}, not a JSON error");
            assert_error(st, &v, *want, *param, *code, &b.to_string());
        }
    }
    let (st, _, v) = post(COMPLETIONS, &json!({"prompt": long_prompt})).await;
    assert!(v["error"]["message"].as_str().unwrap().starts_with("This model's maximum context length is 512 tokens"), "{st} {v}");
    // vLLM's priority, lower first: any integer from -10 to 10.
    for p in [-10, 0, 3, 10] {
        let (st, _, v) = post(CHAT, &json!({"messages": user("hi"), "priority": p, "max_tokens": 2})).await;
        assert_eq!(st, 200, "priority {p}: {v}");
    }
    // top_p = 1.0 and temperature = 2 are valid.
    let (st, _, v) = post(COMPLETIONS, &json!({"prompt": "hi", "top_p": 1.0, "temperature": 2.0, "max_tokens": 2})).await;
    assert_eq!(st, 200, "{v}");
    // Unknown routes and methods.
    assert_eq!(call(Method::GET, "/v1/nothing", None, vec![]).await.0, 404);
    assert_eq!(call(Method::DELETE, COMPLETIONS, None, vec![]).await.0, 405);
    // And the server still serves, in both shapes.
    let (st, _, v) = post(COMPLETIONS, &json!({"prompt": "The sky is", "max_tokens": 4, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (st, ct, b) = call(
        Method::POST,
        CHAT,
        Some("application/json"),
        serde_json::to_vec(&json!({"messages": user("hi"), "max_tokens": 3, "stream": true, "ignore_eos": true})).unwrap(),
    )
    .await;
    assert_eq!(st, 200);
    assert!(ct.starts_with("text/event-stream"), "{ct}");
    let text = String::from_utf8(b).unwrap();
    let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).map(|f| f.strip_prefix("data: ").unwrap()).collect();
    assert_eq!(frames.last(), Some(&"[DONE]"));
    let first: Value = serde_json::from_str(frames[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_detokenize_models_version_health() {
    let (st, _, v) = post("/tokenize", &json!({"prompt": "Hello world"})).await;
    assert_eq!(st, 200);
    let toks = v["tokens"].as_array().unwrap().clone();
    assert_eq!(v["count"], toks.len());
    assert_eq!(v["max_model_len"], 512);
    let (_, _, d) = post("/detokenize", &json!({"tokens": toks})).await;
    assert_eq!(d["prompt"], "Hello world");
    let (_, _, c) = post("/tokenize", &json!({"messages": user("Hi")})).await;
    assert!(c["count"].as_u64().unwrap() > 5, "the chat template adds tokens: {c}");
    let (st, _, e) = post("/detokenize", &json!({"tokens": [999999]})).await;
    assert_error(st, &e, 400, Some("tokens"), None, "detokenize out of vocabulary");
    let (st, _, e) = post("/tokenize", &json!({})).await;
    assert_eq!(st, 400, "{e}");
    let (st, m) = get("/v1/models").await;
    assert_eq!(st, 200);
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "SmolLM2-135M-Instruct");
    assert_eq!(m["data"][0]["max_model_len"], 512);
    let (_, ver) = get("/version").await;
    assert!(ver["version"].is_string());
    assert_eq!(ver["scheduler"], "fcfs");
    let (st, h) = get("/health").await;
    assert_eq!((st, h["status"].as_str()), (200, Some("ok")));
    let (st, _, metrics) = call(Method::GET, "/metrics", None, vec![]).await;
    assert_eq!(st, 200);
    assert!(String::from_utf8(metrics).unwrap().contains("pace_requests_total"));
}

/// `X-Request-Id` (vLLM's rule): the response id is the endpoint's prefix and the client's id,
/// which comes back in the response header; without one the header carries the id pace made.
/// A malformed one is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_request_id_round_trips() {
    let send = |path: &'static str, id: Option<&'static str>, body: Value| async move {
        let mut req = Request::builder().method(Method::POST).uri(path).header(header::CONTENT_TYPE, "application/json");
        if let Some(id) = id {
            req = req.header("x-request-id", id);
        }
        let resp = api::app(state()).oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let echo = resp.headers().get("x-request-id").map(|v| v.to_str().unwrap().to_string());
        let status = resp.status().as_u16();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        (status, echo, bytes)
    };
    let (st, echo, b) = send(COMPLETIONS, Some("trace-42.a:b_c"), json!({"prompt": "hi", "max_tokens": 2})).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((st, v["id"].as_str(), echo.as_deref()), (200, Some("cmpl-trace-42.a:b_c"), Some("trace-42.a:b_c")), "{v}");
    let (st, echo, b) = send(CHAT, Some("abc"), json!({"messages": user("hi"), "max_tokens": 2, "stream": true})).await;
    assert_eq!((st, echo.as_deref()), (200, Some("abc")));
    assert!(String::from_utf8_lossy(&b).contains("\"id\":\"chatcmpl-abc\""));
    let (st, echo, b) = send(CHAT, None, json!({"messages": user("hi"), "max_tokens": 2})).await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(st, 200);
    assert_eq!(echo.as_deref(), v["id"].as_str(), "{v}");
    for bad in ["has space", "a\"b", &"x".repeat(129)] {
        let bad: &'static str = Box::leak(bad.to_string().into_boxed_str());
        let (st, _, b) = send(COMPLETIONS, Some(bad), json!({"prompt": "hi", "max_tokens": 2})).await;
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_error(st, &v, 400, None, None, bad);
    }
}
