//! Structured outputs and tool calls in-process (`tower::oneshot`, no socket) on
//! `dummy:smollm2-135m` (random weights, a byte-level tokenizer). Random weights write arbitrary
//! tokens, so every valid output here is the grammar's doing: these checks fail if a mask is
//! wrong, missing or applied to the wrong request. The real model through a real socket and the
//! OpenAI client are in `api.rs`.

#[path = "common/schema.rs"]
mod schema;

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

fn state() -> Arc<AppState> {
    static S: OnceLock<Arc<AppState>> = OnceLock::new();
    S.get_or_init(|| {
        let args = Args::parse_from([
            "serve",
            "--model",
            "dummy:smollm2-135m:q4",
            "--served-model-name",
            "m",
            "--threads",
            "2",
            "--scheduler",
            "fcfs",
            "--max-n",
            "4",
            "--max-model-len",
            "2048",
            "--kv-cache-memory",
            "192MiB",
        ]);
        in_process(&args.serve).expect("in-process server")
    })
    .clone()
}

/// POST through the router: (status, content type, body text).
async fn call(path: &str, body: &Value) -> (u16, String, String) {
    let req = Request::builder().method(Method::POST).uri(path).header(header::CONTENT_TYPE, "application/json");
    let resp = api::app(state()).oneshot(req.body(Body::from(serde_json::to_vec(body).unwrap())).unwrap()).await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, ct, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn post(path: &str, body: &Value) -> (u16, Value) {
    let (st, _, b) = call(path, body).await;
    (st, serde_json::from_str(&b).unwrap_or(Value::Null))
}

/// A streamed request's chunks (the JSON objects before `[DONE]`).
async fn stream(path: &str, body: &Value) -> Vec<Value> {
    let mut b = body.clone();
    b["stream"] = json!(true);
    let (st, ct, text) = call(path, &b).await;
    assert_eq!(st, 200, "{text}");
    assert!(ct.starts_with("text/event-stream"), "{ct}: {text}");
    // SSE comments (`: keep-alive`, sent while a held-back tool call is silent) carry no data.
    let frames: Vec<&str> = text
        .split("\n\n")
        .filter(|f| !f.is_empty() && !f.starts_with(':'))
        .map(|f| f.strip_prefix("data: ").unwrap_or_else(|| panic!("not a data frame: {f:?}")))
        .collect();
    assert_eq!(frames.last(), Some(&"[DONE]"));
    frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect()
}

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Nested objects, enums, arrays, required and optional fields; bounded so random weights finish.
fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "scores": {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "verified": {"type": "boolean"}},
                "required": ["city", "verified"],
                "additionalProperties": false
            },
            "nickname": {"type": "string", "maxLength": 6}
        },
        "required": ["name", "age", "role", "scores", "address"],
        "additionalProperties": false
    })
}

fn assert_valid(text: &str, schema: &Value, what: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text:?}"));
    schema::check(&v, schema).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_outputs_validate_at_any_temperature() {
    let schema = person_schema();
    for t in [0.0, 1.0] {
        let body = json!({
            "messages": user("Describe a person."), "temperature": t, "n": 2, "seed": 7, "max_tokens": 300,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}}
        });
        let (st, v) = post(CHAT, &body).await;
        assert_eq!(st, 200, "{v}");
        for c in v["choices"].as_array().unwrap() {
            assert_eq!(c["finish_reason"], "stop", "{c}");
            assert_valid(c["message"]["content"].as_str().unwrap(), &schema, &format!("t={t}"));
        }
    }
    // An array at the top, $defs and $ref, an anyOf.
    let schema = json!({
        "type": "array", "minItems": 2, "maxItems": 4,
        "items": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "boolean"}]},
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"const": "up"}},
                            "required": ["x", "y"], "additionalProperties": false}}
    });
    for seed in 0..3 {
        let body = json!({"prompt": "points:", "temperature": 1.0, "seed": seed, "max_tokens": 200, "structured_outputs": {"json": schema}});
        let (st, v) = post(COMPLETIONS, &body).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        assert_valid(v["choices"][0]["text"].as_str().unwrap(), &schema, "array schema");
    }
    // guided_json as JSON text (vLLM's older field) on completions.
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "max_tokens": 300, "guided_json": person_schema().to_string()})).await;
    assert_eq!(st, 200, "{v}");
    assert_valid(v["choices"][0]["text"].as_str().unwrap(), &person_schema(), "guided_json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_choice_grammar_and_json_object() {
    for (field, value) in [
        ("regex", json!("[A-Z][a-z]{2,5}-[0-9]{3}")),
        ("choice", json!(["yes", "no", "maybe later"])),
        ("grammar", json!("start: \"(\" NUM (\",\" NUM)* \")\"\nNUM: /[0-9]{1,3}/")),
    ] {
        for seed in 0..3 {
            let mut body = json!({"messages": user("answer"), "temperature": 1.0, "seed": seed, "max_tokens": 60, "structured_outputs": {}});
            body["structured_outputs"][field] = value.clone();
            let (st, v) = post(CHAT, &body).await;
            assert_eq!(st, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "stop", "{field}: {c}");
            let text = c["message"]["content"].as_str().unwrap();
            let ok = match field {
                "regex" => {
                    let b = text.as_bytes();
                    b.len() >= 7
                        && b[0].is_ascii_uppercase()
                        && text.ends_with(|ch: char| ch.is_ascii_digit())
                        && text.contains('-')
                        && text[text.find('-').unwrap() + 1..].len() == 3
                }
                "choice" => ["yes", "no", "maybe later"].contains(&text),
                _ => {
                    text.starts_with('(')
                        && text.ends_with(')')
                        && text[1..text.len() - 1].split(',').all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_digit()))
                }
            };
            assert!(ok, "{field}: {text:?}");
            if field != "regex" {
                // The grammar is complete with its last byte (nothing can extend it): the output
                // ends there, without a step spent on EOS (one byte-level token per byte).
                assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(text.len() as u64), "{field}: {v}");
            }
        }
    }
    // The older top-level fields.
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "p", "guided_choice": ["left", "right"], "max_tokens": 10})).await;
    assert_eq!(st, 200, "{v}");
    assert!(["left", "right"].contains(&v["choices"][0]["text"].as_str().unwrap()), "{v}");
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "p", "guided_regex": "[0-9]{4}", "max_tokens": 10})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap().len(), 4, "{v}");
    // json_object: an object whenever it finishes (random weights may run to max_tokens).
    for seed in 0..3 {
        let (st, v) = post(CHAT, &json!({"messages": user("json"), "seed": seed, "max_tokens": 120, "response_format": {"type": "json_object"}})).await;
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        let text = c["message"]["content"].as_str().unwrap();
        assert!(text.starts_with('{'), "{text:?}");
        if c["finish_reason"] == "stop" {
            assert!(serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()), "{text:?}");
        } else {
            assert_eq!(c["finish_reason"], "length");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_gives_the_same_text_and_constrained_requests_batch_with_plain_ones() {
    let schema = person_schema();
    let body = json!({"messages": user("who?"), "temperature": 0, "max_tokens": 300, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}});
    let (st, whole) = post(CHAT, &body).await;
    assert_eq!(st, 200);
    let chunks = stream(CHAT, &body).await;
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, whole["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");

    // Eight at once: constrained and plain in the same batches; a too-small max_tokens ends with
    // `length` (an incomplete value, no error); the plain ones are unaffected.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let body = match i % 4 {
            0 => {
                json!({"messages": user("a"), "temperature": 1.0, "seed": i, "max_tokens": 300, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
            }
            1 => {
                json!({"messages": user("b"), "temperature": 0, "max_tokens": 5, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
            }
            2 => json!({"messages": user("c"), "temperature": 1.0, "seed": i, "max_tokens": 12, "ignore_eos": true}),
            _ => json!({"messages": user("d"), "temperature": 1.0, "seed": i, "max_tokens": 40, "structured_outputs": {"regex": "(ab|cd)+!"}}),
        };
        tasks.push(tokio::spawn(async move { (i, post(CHAT, &body).await) }));
    }
    for t in tasks {
        let (i, (st, v)) = t.await.unwrap();
        assert_eq!(st, 200, "{i}: {v}");
        let c = &v["choices"][0];
        let text = c["message"]["content"].as_str().unwrap();
        match i % 4 {
            0 => {
                assert_eq!(c["finish_reason"], "stop");
                assert_valid(text, &schema, "batched");
            }
            1 => {
                assert_eq!(c["finish_reason"], "length");
                assert_eq!(v["usage"]["completion_tokens"], 5);
                assert!(text.starts_with('{'), "{text:?}");
            }
            2 => assert_eq!(v["usage"]["completion_tokens"], 12),
            _ => {
                if c["finish_reason"] == "stop" {
                    let body = text.strip_suffix('!').unwrap_or_else(|| panic!("{text:?}"));
                    assert!(body.len() % 2 == 0 && body.as_bytes().chunks(2).all(|p| p == b"ab" || p == b"cd"), "{text:?}");
                }
            }
        }
    }
    // The masks were counted.
    let resp = api::app(state()).oneshot(Request::builder().uri("/metrics").body(Body::empty()).unwrap()).await.unwrap();
    let text = String::from_utf8(axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap().to_vec()).unwrap();
    let masks: f64 = text.lines().find(|l| l.starts_with("pace_structured_output_masks_total")).and_then(|l| l.split(' ').nth(1)).unwrap().parse().unwrap();
    assert!(masks > 100.0, "{masks} masks");
    assert!(text.lines().any(|l| l.starts_with("pace_structured_output_compile_seconds_count{") && l.contains("kind=\"json_schema\"")), "no compile histogram");
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
                           "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"], "additionalProperties": false}}}
    ])
}

fn params_of(tools: &Value, name: &str) -> Value {
    tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap()["function"]["parameters"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_are_valid_calls() {
    let tools = weather_tools();
    // Named function.
    for t in [0.0, 1.0] {
        let body = json!({"messages": user("Weather in Paris?"), "tools": tools, "temperature": t, "seed": 3, "max_tokens": 100,
                          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
        let (st, v) = post(CHAT, &body).await;
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{c}");
        assert!(c["message"]["content"].is_null(), "{c}");
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let args = calls[0]["function"]["arguments"].as_str().unwrap();
        assert_valid(args, &params_of(&tools, "get_weather"), "named arguments");

        // Streamed: the first fragment names the call, the arguments add up to the same text
        // at temperature 0.
        let chunks = stream(CHAT, &body).await;
        let first = &chunks[0]["choices"][0]["delta"];
        assert_eq!(first["role"], "assistant");
        assert_eq!(first["tool_calls"][0]["function"]["name"], "get_weather");
        assert!(first["tool_calls"][0]["id"].as_str().unwrap().starts_with("call_"));
        let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()).collect();
        assert!(chunks.iter().all(|c| c["choices"][0]["delta"].get("content").is_none()), "text content in a call stream");
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
        assert_valid(&streamed, &params_of(&tools, "get_weather"), "streamed arguments");
        if t == 0.0 {
            assert_eq!(streamed, args);
        }
    }
    // Required: one or more calls, each to a known tool with valid arguments; one when
    // parallel_tool_calls is false.
    for (seed, parallel) in [(1, true), (2, true), (3, false), (4, false)] {
        let body = json!({"messages": user("Weather and time?"), "tools": tools, "tool_choice": "required", "parallel_tool_calls": parallel,
                          "temperature": 1.0, "seed": seed, "max_tokens": 300});
        for streaming in [false, true] {
            let calls: Vec<Value> = if streaming {
                let chunks = stream(CHAT, &body).await;
                assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
                // Fragments: a call's first names it (with its id), later ones add arguments.
                let mut calls: Vec<Value> = Vec::new();
                for d in chunks.iter().flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default()) {
                    let i = d["index"].as_u64().unwrap() as usize;
                    if d["function"]["name"].is_string() {
                        assert_eq!(i, calls.len(), "calls start in order: {d}");
                        assert!(d["id"].as_str().unwrap().starts_with("call_"));
                        calls.push(json!({"function": {"name": d["function"]["name"], "arguments": ""}}));
                    } else {
                        assert!(d.get("id").is_none(), "{d}");
                    }
                    let args = format!("{}{}", calls[i]["function"]["arguments"].as_str().unwrap(), d["function"]["arguments"].as_str().unwrap());
                    calls[i]["function"]["arguments"] = json!(args);
                }
                // Streamed as written: more chunks carry call fragments than there are calls.
                let with_calls = chunks.iter().filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array()).count();
                assert!(with_calls > calls.len() + 1, "{with_calls} chunks for {} calls", calls.len());
                calls
            } else {
                let (st, v) = post(CHAT, &body).await;
                assert_eq!(st, 200, "{v}");
                assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
                v["choices"][0]["message"]["tool_calls"].as_array().unwrap().clone()
            };
            assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{calls:?}");
            for c in &calls {
                let name = c["function"]["name"].as_str().unwrap();
                assert_valid(c["function"]["arguments"].as_str().unwrap(), &params_of(&tools, name), name);
            }
        }
    }
    // A conversation that carries an earlier call and its result.
    let messages = json!([
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"}
    ]);
    let (st, v) = post(CHAT, &json!({"messages": messages, "tools": tools, "tool_choice": "none", "max_tokens": 4})).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string());
    // auto: whatever random weights write comes back as text or calls, never an error.
    let (st, v) = post(CHAT, &json!({"messages": user("hi"), "tools": tools, "max_tokens": 8})).await;
    assert_eq!(st, 200, "{v}");
    let chunks = stream(CHAT, &json!({"messages": user("hi"), "tools": tools, "max_tokens": 8})).await;
    assert!(!chunks.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_grammars_and_tool_settings_are_400s_before_any_sse_byte() {
    let tools = weather_tools();
    let rf = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let cases: Vec<(&str, Value, &str)> = vec![
        (CHAT, json!({"messages": user("x"), "response_format": rf(json!({"type": "nonsense"}))}), "response_format"),
        (CHAT, json!({"messages": user("x"), "response_format": rf(json!(17))}), "response_format"),
        (CHAT, json!({"messages": user("x"), "response_format": {"type": "json_schema"}}), "response_format"),
        (CHAT, json!({"messages": user("x"), "response_format": {"type": "xml"}}), "response_format"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"regex": "(unclosed"}}), "structured_outputs"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"grammar": "start: nothing_defined"}}), "structured_outputs"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"choice": []}}), "structured_outputs"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}}), "structured_outputs"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"json": "{not json"}}), "structured_outputs"),
        (COMPLETIONS, json!({"prompt": "x", "structured_outputs": {"regex": "a"}, "guided_regex": "b"}), "guided_regex"),
        (COMPLETIONS, json!({"prompt": "x", "guided_regex": "a+", "min_tokens": 3}), "min_tokens"),
        (CHAT, json!({"messages": user("x"), "tools": []}), "tools"),
        (CHAT, json!({"messages": user("x"), "tool_choice": "required"}), "tool_choice"),
        (CHAT, json!({"messages": user("x"), "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (CHAT, json!({"messages": user("x"), "tools": tools, "tool_choice": "always"}), "tool_choice"),
        (CHAT, json!({"messages": user("x"), "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}}), "response_format"),
        (CHAT, json!({"messages": user("x"), "tools": [{"type": "function", "function": {"name": "bad name!"}}]}), "tools[0].function.name"),
        (CHAT, json!({"messages": user("x"), "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}), "tools[0].function.parameters"),
        (
            CHAT,
            json!({"messages": user("x"), "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}], "tool_choice": "required"}),
            "tools",
        ),
        (CHAT, json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]}), "messages[0].tool_calls[0]"),
    ];
    for (path, body, param) in &cases {
        for streaming in [false, true] {
            let mut b = body.clone();
            b["stream"] = json!(streaming);
            let (st, ct, text) = call(path, &b).await;
            assert!(ct.starts_with("application/json"), "{b}: answered {ct}");
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(st, 400, "{b}: {v}");
            assert_eq!(v["error"]["param"], *param, "{b}: {v}");
            assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
    // ignore_eos does not extend a structured output (what `pace bench`'s random prompts send):
    // it ends where its grammar does.
    for seed in 0..4 {
        let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "guided_regex": "(ab)+", "ignore_eos": true, "max_tokens": 60, "seed": seed})).await;
        assert_eq!(st, 200, "{v}");
        let text = v["choices"][0]["text"].as_str().unwrap();
        assert!(!text.is_empty() && text.len() % 2 == 0 && text.as_bytes().chunks(2).all(|p| p == b"ab"), "{text:?}");
        if v["choices"][0]["finish_reason"] == "stop" {
            assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 60, "{v}");
        }
    }
    // Still serving, constrained and not.
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "guided_choice": ["ok"], "max_tokens": 5})).await;
    assert_eq!((st, v["choices"][0]["text"].as_str()), (200, Some("ok")), "{v}");
}

/// Hostile grammars: each is a 200 (bounded by max_tokens and llguidance's per-mask limits) or
/// a 400, never a 5xx, and none holds the server for long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_grammars_are_bounded() {
    let mut deep = json!({"type": "integer"});
    for _ in 0..60 {
        deep = json!({"type": "object", "properties": {"a": deep}, "required": ["a"]});
    }
    let huge_enum: Vec<String> = (0..5000).map(|i| format!("value-{i}-{}", "x".repeat(i % 40))).collect();
    // Chains of references: llguidance compiles them recursively, a few KiB of stack per link
    // (300 links overflowed the 2 MiB stack of the thread that compiled them, and the process
    // aborted).
    let lark_chain = |n: usize, name: &str| {
        let rules: Vec<String> = (0..n).map(|i| format!("{name}{i}: \"a\" {name}{} | \"b\"", i + 1)).collect();
        format!("start: {name}0\n{}\n{name}{n}: \"z\"", rules.join("\n"))
    };
    let ref_chain = |n: usize| {
        let mut defs: serde_json::Map<String, Value> =
            (0..n).map(|i| (format!("d{i}"), json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}}))).collect();
        defs.insert(format!("d{n}"), json!({"type": "integer"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    };
    let cases: Vec<Value> = vec![
        json!({"structured_outputs": {"json": deep}}),
        json!({"structured_outputs": {"json": {"enum": huge_enum}}}),
        json!({"structured_outputs": {"regex": "(a*)*b"}}),
        json!({"structured_outputs": {"regex": "(a|aa|aaa)*c(x|y){1,999}"}}),
        json!({"structured_outputs": {"regex": "[a-z]{100000}"}}),
        json!({"structured_outputs": {"regex": "(?:(?:(?:a{1,50}){1,50}){1,50})"}}),
        json!({"structured_outputs": {"grammar": "start: start \"a\" | \"b\""}}),
        json!({"structured_outputs": {"grammar": "start: x\nx: x x | \"a\" | \"(\" x \")\""}}),
        json!({"structured_outputs": {"json": {"type": "string", "minLength": 100000}}}),
        json!({"structured_outputs": {"json": {"type": "string", "pattern": "(\\w+\\s*)*!"}}}),
        json!({"structured_outputs": {"json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}),
        json!({"structured_outputs": {"json": {"$ref": "https://example.com/schema.json"}}}),
        json!({"structured_outputs": {"json": {"anyOf": [{"type": "object"}, {"type": "array"}], "not": {"type": "null"}}}}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "items": {"type": "array", "items": {"type": "array"}}, "minItems": 1000000}}}}),
        json!({"structured_outputs": {"grammar": lark_chain(5_000, "r")}}),
        json!({"structured_outputs": {"grammar": lark_chain(5_000, "T")}}),
        json!({"structured_outputs": {"json": ref_chain(3_000)}}),
    ];
    for extra in cases {
        let mut body = json!({"prompt": "go", "max_tokens": 24, "temperature": 1.0, "seed": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let t = std::time::Instant::now();
        let (st, v) = post(COMPLETIONS, &body).await;
        let secs = t.elapsed().as_secs_f64();
        let what = extra.to_string();
        let what = &what[..what.len().min(120)];
        assert!(st == 200 || st == 400, "{what}: {st} {v}");
        if st == 400 {
            assert!(v["error"]["message"].is_string(), "{what}: {v}");
        } else {
            assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 24, "{what}: {v}");
        }
        assert!(secs < 60.0, "{what}: took {secs:.1} s");
        eprintln!("{what}: {st} in {secs:.2} s");
    }
    // Past the limits: a 400 that names them.
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "structured_outputs": {"grammar": lark_chain(20_001, "r")}})).await;
    assert!(st == 400 && v["error"]["message"].as_str().unwrap().contains("rule definitions"), "{st} {v}");
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "structured_outputs": {"json": {"enum": (0..100_001).collect::<Vec<u32>>()}}})).await;
    assert!(st == 400 && v["error"]["message"].as_str().unwrap().contains("values"), "{st} {v}");
    let (st, v) = post(COMPLETIONS, &json!({"prompt": "x", "guided_choice": ["fine"], "max_tokens": 5})).await;
    assert_eq!((st, v["choices"][0]["text"].as_str()), (200, Some("fine")), "{v}");
}
