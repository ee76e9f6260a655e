//! Prefix caching through the API, in-process on dummy weights (byte-level tokenizer: a prompt
//! of N bytes is N tokens): a shared system prompt is computed once and reported as
//! `usage.prompt_tokens_details.cached_tokens`, greedy answers are the same as with caching
//! off, `cache_salt` keeps requests of different salts apart, and `--prefix-cache-isolation
//! api-key` keeps tenants with different API keys apart.

use axum::body::Body;
use axum::http::{header, Request};
use clap::Parser;
use pace_server::serve::{api, in_process, ServeArgs};
use serde_json::{json, Value};
use tower::ServiceExt;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

async fn post(state: &std::sync::Arc<pace_server::serve::state::AppState>, path: &str, body: Value) -> (u16, Value) {
    post_as(state, None, path, body).await
}

async fn post_as(state: &std::sync::Arc<pace_server::serve::state::AppState>, key: Option<&str>, path: &str, body: Value) -> (u16, Value) {
    let mut req = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = req.body(Body::from(body.to_string())).unwrap();
    let resp = api::app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return (status, v);
    }
    // A stream: the usage chunk comes last before [DONE]; collect the text of every chunk.
    let mut out = String::new();
    let mut usage = Value::Null;
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|l| *l != "[DONE]") {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(t) = v["choices"][0]["text"].as_str() {
            out.push_str(t);
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (status, json!({"choices": [{"text": out}], "usage": usage}))
}

/// An in-process server on dummy weights, 16-token blocks, with `extra` flags.
fn start(extra: &[&str]) -> std::sync::Arc<pace_server::serve::state::AppState> {
    let mut argv =
        vec!["serve", "--model", "dummy:smollm2-135m:q4", "--threads", "2", "--max-model-len", "1024", "--kv-cache-memory", "64MiB", "--block-size", "16"];
    argv.extend_from_slice(extra);
    in_process(&Args::parse_from(argv).serve).expect("in-process server")
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_computed_once_and_answers_do_not_change() {
    let on = start(&[]);
    let off = start(&["--no-enable-prefix-caching"]);
    let system = "You are a careful assistant. Answer briefly, cite nothing, and never invent facts. ".repeat(3); // 258 bytes
    let shared = system.len() as u64;
    for (i, q) in ["Why is the sky blue?", "Name a prime.", "What is rust?", "Count to three."].iter().enumerate() {
        let body = json!({"prompt": format!("{system}{q}"), "max_tokens": 8, "temperature": 0, "ignore_eos": true});
        let (st, a) = post(&on, "/v1/completions", body.clone()).await;
        assert_eq!(st, 200, "{a}");
        let (_, b) = post(&off, "/v1/completions", body.clone()).await;
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "question {i}: greedy answers differ with caching");
        assert_eq!(cached(&b), 0, "caching off reports nothing cached");
        let c = cached(&a);
        if i == 0 {
            assert_eq!(c, 0, "the first request computes the whole prompt");
        } else {
            assert_eq!(c, shared / 16 * 16, "question {i}: the system prompt's full blocks are reused");
        }
        assert!(c < a["usage"]["prompt_tokens"].as_u64().unwrap());
    }
    // A request that ends in its first step (one token) still reports what it reused.
    let (_, one) = post(&on, "/v1/completions", json!({"prompt": format!("{system}Hello"), "max_tokens": 1})).await;
    assert_eq!(cached(&one), shared / 16 * 16, "{one}");
    // Streaming reports it in the usage chunk; the text is the same as non-streaming.
    let body = json!({"prompt": format!("{system}Name a prime."), "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (_, plain) = post(&on, "/v1/completions", body.clone()).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (st, s) = post(&on, "/v1/completions", streamed).await;
    assert_eq!(st, 200);
    assert_eq!(s["choices"][0]["text"], plain["choices"][0]["text"]);
    // The whole prompt is cached now but its last token, whose logits must be computed: every
    // full block before it.
    let prompt_len = plain["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(cached(&s), (prompt_len - 1) / 16 * 16);

    // A salt shares only with its own kind.
    let salted = |salt: &str| {
        let mut b = body.clone();
        b["cache_salt"] = json!(salt);
        b
    };
    let (_, first) = post(&on, "/v1/completions", salted("tenant-a")).await;
    assert_eq!(cached(&first), 0, "a new salt finds nothing of the unsalted requests");
    let (_, again) = post(&on, "/v1/completions", salted("tenant-a")).await;
    assert_eq!(cached(&again), (prompt_len - 1) / 16 * 16);
    let (_, other) = post(&on, "/v1/completions", salted("tenant-b")).await;
    assert_eq!(cached(&other), 0);
    assert_eq!(first["choices"][0]["text"], plain["choices"][0]["text"]);
    let (st, bad) = post(&on, "/v1/completions", salted("")).await;
    assert_eq!(st, 400);
    assert_eq!(bad["error"]["param"], "cache_salt", "{bad}");

    // A multi-turn chat: the second turn reuses the first turn's prompt and answer.
    let turn1 =
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi!"}], "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (_, r1) = post(&on, "/v1/chat/completions", turn1).await;
    let answer = r1["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let turn2 = json!({"messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}
    ], "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (_, r2) = post(&on, "/v1/chat/completions", turn2).await;
    // Turn 1's whole prompt was computed (its full blocks registered), and it begins turn 2's.
    let p1 = r1["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached(&r2) >= p1 / 16 * 16, "turn 2 reuses turn 1's prompt ({p1} tokens): {r2}");
    assert!(cached(&r2) > shared / 16 * 16, "the second turn reuses more than the system prompt: {r2}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_scopes_the_prefix_cache_when_asked() {
    let prompt = "Tenant A's confidential preamble, which tenant B must not be able to time. ".repeat(2);
    let body = |salt: Option<&str>| {
        let mut b = json!({"prompt": prompt, "max_tokens": 2, "temperature": 0});
        if let Some(s) = salt {
            b["cache_salt"] = json!(s);
        }
        b
    };
    let full = |v: &Value| (v["usage"]["prompt_tokens"].as_u64().unwrap() - 1) / 16 * 16;
    let isolated = start(&["--api-key", "key-a,key-b", "--prefix-cache-isolation", "api-key"]);
    let (st, a1) = post_as(&isolated, Some("key-a"), "/v1/completions", body(None)).await;
    assert_eq!((st, cached(&a1)), (200, 0), "{a1}");
    let (_, a2) = post_as(&isolated, Some("key-a"), "/v1/completions", body(None)).await;
    assert_eq!(cached(&a2), full(&a2), "the same key reuses its own prefix");
    let (_, b1) = post_as(&isolated, Some("key-b"), "/v1/completions", body(None)).await;
    assert_eq!(cached(&b1), 0, "another key finds nothing of key-a's: {b1}");
    assert_eq!(a1["choices"][0]["text"], b1["choices"][0]["text"], "isolation changes no answer");
    // A salt divides a key's scope further, and stays within it.
    let (_, a3) = post_as(&isolated, Some("key-a"), "/v1/completions", body(Some("s"))).await;
    assert_eq!(cached(&a3), 0);
    let (_, b2) = post_as(&isolated, Some("key-b"), "/v1/completions", body(Some("s"))).await;
    assert_eq!(cached(&b2), 0, "the same salt under another key shares nothing");
    let (st, none) = post_as(&isolated, None, "/v1/completions", body(None)).await;
    assert_eq!(st, 401, "{none}");
    // Without isolation the two keys share.
    let shared = start(&["--api-key", "key-a,key-b"]);
    let (_, a) = post_as(&shared, Some("key-a"), "/v1/completions", body(None)).await;
    let (_, b) = post_as(&shared, Some("key-b"), "/v1/completions", body(None)).await;
    assert_eq!((cached(&a), cached(&b)), (0, full(&b)));
}
