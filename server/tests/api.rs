//! The HTTP API through real HTTP against a real `pace serve` on the default model: streaming
//! semantics, batch invariance, choices, logprobs, stop strings and seeds, the OpenAI Python
//! client. The contract that needs no real model (every bad input's error, tokenize, models,
//! health) is tested in-process in `inprocess.rs`.

mod common;

use std::sync::OnceLock;

use common::{post, stream, stream_text, Server};
use serde_json::{json, Value};

/// One server for this file's tests (they only read state that concurrency cannot change).
fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        // Spawned from a thread that lives as long as the process: the child's parent-death
        // signal is tied to the spawning thread.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let s = Server::start(&["--scheduler", "fcfs", "--max-n", "4", "--max-body-bytes", "65536", "--max-model-len", "512"]);
            tx.send(s).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap()
    })
}

fn completions() -> String {
    server().url("/v1/completions")
}

fn chat() -> String {
    server().url("/v1/chat/completions")
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_frames_finish_once_and_usage_comes_last() {
    for (url, mut body) in [
        (completions(), json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0})),
        (chat(), json!({"messages": user("Tell me a story."), "max_tokens": 12, "temperature": 0})),
    ] {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (st, frames) = stream(&url, &body).await;
        assert_eq!(st, 200);
        assert_eq!(frames.last().unwrap().data, "[DONE]", "ends with [DONE]");
        let parsed: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(&f.data).unwrap()).collect();
        let usage: Vec<&Value> = parsed.iter().filter(|v| v.get("usage").is_some_and(|u| !u.is_null())).collect();
        assert_eq!(usage.len(), 1, "exactly one usage chunk");
        assert_eq!(usage[0]["choices"], json!([]), "usage chunk has no choices");
        assert!(std::ptr::eq(usage[0], parsed.last().unwrap()), "usage chunk is last before [DONE]");
        let finishes: Vec<&Value> = parsed.iter().flat_map(|v| v["choices"].as_array().unwrap()).filter(|c| !c["finish_reason"].is_null()).collect();
        assert_eq!(finishes.len(), 1, "finish_reason appears once");
        assert_eq!(finishes[0]["finish_reason"], "length");
        let last_content = parsed.iter().rev().find(|v| !v["choices"].as_array().unwrap().is_empty()).unwrap();
        assert!(!last_content["choices"][0]["finish_reason"].is_null(), "finish_reason is on the last content chunk");
        assert_eq!(usage[0]["usage"]["completion_tokens"], 12);
        assert!(usage[0]["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
        for v in &parsed {
            assert!(v["id"].is_string() && v["created"].is_u64() && v["model"] == "SmolLM2-135M-Instruct", "{v}");
        }
        // Without include_usage there is no usage chunk.
        body["stream_options"] = json!({"include_usage": false});
        let (_, frames) = stream(&url, &body).await;
        assert!(frames.iter().all(|f| !f.data.contains("\"usage\"")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_equals_non_streamed_text_at_temperature_zero() {
    for (url, body) in [
        (completions(), json!({"prompt": "The three primary colors are", "max_tokens": 24, "temperature": 0})),
        (chat(), json!({"messages": user("List three fruits with emoji 🍎."), "max_tokens": 24, "temperature": 0})),
    ] {
        let (st, _, whole) = post(&url, &body).await;
        assert_eq!(st, 200, "{whole}");
        let c = &whole["choices"][0];
        let text = c["text"].as_str().or(c["message"]["content"].as_str()).unwrap().to_string();
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (_, frames) = stream(&url, &sb).await;
        assert_eq!(stream_text(&frames, 0), text, "{body}");
        // A stop string taken from the middle of that text: both forms stop right before it.
        let chars: Vec<char> = text.chars().collect();
        let cut = chars.len() / 2;
        let stop: String = chars[cut..(cut + 3).min(chars.len())].iter().collect();
        let before: String = text[..text.find(&stop).unwrap()].to_string();
        let mut with_stop = body.clone();
        with_stop["stop"] = json!(["never-appears-xyz", stop]);
        let (_, _, v) = post(&url, &with_stop).await;
        let c = &v["choices"][0];
        assert_eq!(c["text"].as_str().or(c["message"]["content"].as_str()).unwrap(), before, "stop {stop:?}");
        assert_eq!(c["finish_reason"], "stop");
        with_stop["stream"] = json!(true);
        let (_, frames) = stream(&url, &with_stop).await;
        assert_eq!(stream_text(&frames, 0), before, "streamed, stop {stop:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_mixed_requests_give_the_text_they_give_alone() {
    // Chat, completions and JSON-schema-constrained chat, each greedy: batched they must give
    // exactly what they give alone.
    let prompts = [
        "Write a limerick about a cat.",
        "What is 17 times 23?",
        "Name a famous painter.",
        "Describe the ocean in one sentence.",
        "Translate 'thank you' to French.",
        "Give me a synonym for happy.",
        "What color is the sky on Mars?",
        "Tell me a fun fact about owls.",
    ];
    let bodies: Vec<(String, Value)> = (0..16)
        .map(|i| {
            let p = prompts[i % prompts.len()];
            let max = 6 + (i * 5) % 23;
            if i % 4 == 2 {
                // Constrained rows in the same batches: their masks must not touch the others.
                let schema = json!({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}, "sure": {"type": "boolean"}},
                                    "required": ["answer", "sure"], "additionalProperties": false});
                (chat(), json!({"messages": user(p), "max_tokens": 30, "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}))
            } else if i % 2 == 0 {
                (chat(), json!({"messages": user(p), "max_tokens": max, "temperature": 0}))
            } else {
                (completions(), json!({"prompt": format!("Q: {p}\nA:"), "max_tokens": max, "temperature": 0}))
            }
        })
        .collect();
    let text = |v: &Value| {
        let c = &v["choices"][0];
        c["text"].as_str().or(c["message"]["content"].as_str()).unwrap().to_string()
    };
    let mut alone = Vec::new();
    for (url, b) in &bodies {
        let (st, _, v) = post(url, b).await;
        assert_eq!(st, 200, "{v}");
        alone.push(text(&v));
    }
    let together = futures_util::future::join_all(bodies.iter().map(|(url, b)| post(url, b))).await;
    for (i, (st, _, v)) in together.iter().enumerate() {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(text(v), alone[i], "request {i} changed inside the batch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_logprobs_stop_and_seed() {
    // n choices with a seed: distinct indexes, reproducible.
    let body = json!({"prompt": "My favourite animal is", "max_tokens": 8, "n": 3, "temperature": 1.0, "seed": 7});
    let (st, _, a) = post(&completions(), &body).await;
    assert_eq!(st, 200, "{a}");
    let (_, _, b) = post(&completions(), &body).await;
    let idx: Vec<u64> = a["choices"].as_array().unwrap().iter().map(|c| c["index"].as_u64().unwrap()).collect();
    assert_eq!(idx.len(), 3);
    assert_eq!(a["choices"], b["choices"], "seeded sampling is reproducible");
    assert_eq!(a["usage"]["completion_tokens"], 24);
    // Streaming n = 2: both indexes end once.
    let (_, frames) = stream(&completions(), &json!({"prompt": "Hi", "max_tokens": 5, "n": 2, "stream": true, "temperature": 0})).await;
    for i in 0..2 {
        let ends = frames
            .iter()
            .filter(|f| f.data != "[DONE]")
            .filter_map(|f| {
                let v: Value = serde_json::from_str(&f.data).unwrap();
                v["choices"].as_array().unwrap().iter().find(|c| c["index"] == i && !c["finish_reason"].is_null()).cloned()
            })
            .count();
        assert_eq!(ends, 1, "choice {i}");
        assert!(!stream_text(&frames, i).is_empty());
    }
    // Completions logprobs: top-3 per token, chosen token's logprob included, <= 0.
    let (st, _, v) = post(&completions(), &json!({"prompt": "2 + 2 =", "max_tokens": 3, "logprobs": 3, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    for (t, l) in lp["token_logprobs"].as_array().unwrap().iter().zip(lp["top_logprobs"].as_array().unwrap()) {
        let t = t.as_f64().unwrap();
        assert!(t <= 0.0);
        let top = l.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 3);
        let best = top.values().map(|x| x.as_f64().unwrap()).fold(f64::MIN, f64::max);
        assert!((best - t).abs() < 1e-4, "greedy token is the most likely: {best} vs {t}");
    }
    // Chat logprobs shape.
    let (st, _, v) = post(&chat(), &json!({"messages": user("Hi"), "max_tokens": 2, "logprobs": true, "top_logprobs": 2, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    for e in content {
        assert!(e["token"].is_string() && e["logprob"].as_f64().unwrap() <= 0.0 && e["bytes"].is_array());
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    // Token-id prompts and prompt lists.
    let (st, _, v) = post(&completions(), &json!({"prompt": [[504, 3458, 314], [19556]], "max_tokens": 2, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    // echo
    let (_, _, v) = post(&completions(), &json!({"prompt": "Echo this", "max_tokens": 2, "echo": true})).await;
    assert!(v["choices"][0]["text"].as_str().unwrap().starts_with("Echo this"));
}

/// A Python interpreter with the `openai` package: `PACE_PYTHON` if set, else `python3` if it
/// has it, else a venv under target/ that this installs it into (pip, from the package index).
fn python_with_openai() -> String {
    if let Ok(p) = std::env::var("PACE_PYTHON") {
        return p;
    }
    let has = |py: &str| std::process::Command::new(py).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if has("python3") {
        return "python3".into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-venv");
    let py = venv.join("bin/python").to_string_lossy().into_owned();
    if !has(&py) {
        let ok = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
            && std::process::Command::new(&py)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "openai>=1.40,<3"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "could not install the openai package into {}", venv.display());
    }
    py
}

/// The OpenAI Python client (a real third-party client), streaming and non-streaming, chat and
/// completions, structured outputs through its `parse()` helper, and forced tool calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_works() {
    let python = python_with_openai();
    let script = format!(
        r#"
import openai
c = openai.OpenAI(base_url="{base}/v1", api_key="none")
r = c.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=5, temperature=0)
assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5, r
s = "".join(ch.choices[0].text for ch in c.completions.create(model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=5, temperature=0, stream=True) if ch.choices)
assert s == r.choices[0].text, (s, r.choices[0].text)
m = c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{{"role": "user", "content": "Say hello"}}], max_tokens=6, temperature=0)
assert m.choices[0].message.role == "assistant" and m.usage.completion_tokens == 6, m
parts = []
usage = None
for ch in c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{{"role": "user", "content": "Say hello"}}], max_tokens=6, temperature=0, stream=True, stream_options={{"include_usage": True}}):
    if ch.usage: usage = ch.usage
    for x in ch.choices:
        parts.append(x.delta.content or "")
assert "".join(parts) == m.choices[0].message.content, parts
assert usage.completion_tokens == 6
try:
    c.chat.completions.create(model="nope", messages=[{{"role": "user", "content": "x"}}])
    raise SystemExit("expected NotFoundError")
except openai.NotFoundError as e:
    assert e.body["code"] == "model_not_found", e.body

# Structured outputs through the client's parse() helper (a Pydantic model as a strict schema).
import json
from typing import Literal
from pydantic import BaseModel, Field
class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]
    population_millions: int = Field(ge=0, le=100)
parse = c.chat.completions.parse if hasattr(c.chat.completions, "parse") else c.beta.chat.completions.parse
p = parse(model="SmolLM2-135M-Instruct", messages=[{{"role": "user", "content": "Describe Paris as JSON."}}], response_format=City, temperature=0, max_tokens=120)
city = p.choices[0].message.parsed
assert isinstance(city, City), p
assert p.choices[0].finish_reason == "stop", p

# A forced tool call: valid arguments for the tool's schema.
tools = [{{"type": "function", "function": {{"name": "get_weather", "description": "Weather in a city",
          "parameters": {{"type": "object", "properties": {{"city": {{"type": "string", "maxLength": 30}}, "unit": {{"enum": ["celsius", "fahrenheit"]}}}},
                         "required": ["city", "unit"], "additionalProperties": False}}}}}}]
for choice in ["required", {{"type": "function", "function": {{"name": "get_weather"}}}}]:
    m = c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{{"role": "user", "content": "What is the weather in Paris?"}}],
                                  tools=tools, tool_choice=choice, temperature=0, max_tokens=80)
    call = m.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and m.choices[0].finish_reason == "tool_calls", m
    args = json.loads(call.function.arguments)
    assert set(args) == {{"city", "unit"}} and args["unit"] in ("celsius", "fahrenheit"), args
    streamed = [d for ch in c.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{{"role": "user", "content": "What is the weather in Paris?"}}],
                tools=tools, tool_choice=choice, temperature=0, max_tokens=80, stream=True) for x in ch.choices for d in (x.delta.tool_calls or [])]
    assert streamed[0].function.name == "get_weather", streamed
    assert json.loads("".join(d.function.arguments or "" for d in streamed if d.index == 0)) == args, streamed
print("ok")
"#,
        base = server().base
    );
    let out = std::process::Command::new(&python).args(["-c", &script]).output().expect("running python");
    assert!(out.status.success(), "the OpenAI Python client failed:\n{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// `tool_choice: "required"` cut by `max_tokens` (issue 47's report: greedy, the model writes
/// a list of calls whose third `max_tokens` cuts, and the reply came back as the list's raw
/// text): the calls written in full come back as `tool_calls`, with no content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_tool_calls_cut_by_max_tokens_keep_the_whole_ones() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let body = json!({"messages": user("What is the weather in Paris, London and Rome?"), "tools": tools, "tool_choice": "required",
                      "temperature": 0, "max_tokens": 80});
    let (st, _, v) = post(&chat(), &body).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length", "this prompt's calls outrun 80 tokens: {c}");
    assert!(c["message"]["content"].as_str().is_none_or(str::is_empty), "{c}");
    let calls = c["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool_calls: {c}"));
    assert!(!calls.is_empty(), "{c}");
    for call in calls {
        assert_eq!(call["function"]["name"], "get_weather", "{c}");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {c}"));
        assert!(args["city"].is_string(), "{c}");
    }
}

/// The default model under JSON schemas (nested objects, enums, arrays, required and optional
/// fields), greedy and sampled: every output parses and validates, and ends by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_outputs_of_the_real_model_validate() {
    let schemas = [
        json!({"type": "object", "properties": {
            "title": {"type": "string", "maxLength": 40},
            "year": {"type": "integer", "minimum": 1800, "maximum": 2100},
            "genre": {"enum": ["drama", "comedy", "action", "documentary"]},
            "cast": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 3},
            "studio": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 20}},
                       "required": ["name"], "additionalProperties": false}},
            "required": ["title", "year", "genre", "cast", "studio"], "additionalProperties": false}),
        json!({"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "sunny": {"type": "boolean"}, "temp_c": {"type": "number", "minimum": -50, "maximum": 60}},
            "required": ["city", "sunny", "temp_c"], "additionalProperties": false}}),
    ];
    let prompts = ["Describe a famous movie as JSON.", "Give the weather in a few European cities as JSON."];
    for (schema, prompt) in schemas.iter().zip(prompts) {
        for (t, seed) in [(0.0, 0), (1.0, 1), (1.0, 2)] {
            let body = json!({"messages": user(prompt), "temperature": t, "seed": seed, "max_tokens": 200,
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}});
            let (st, _, v) = post(&chat(), &body).await;
            assert_eq!(st, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "stop", "t={t}: {c}");
            let text = c["message"]["content"].as_str().unwrap();
            let parsed: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("t={t}: not JSON ({e}): {text}"));
            common::schema::check(&parsed, schema).unwrap_or_else(|e| panic!("t={t}: {e}: {text}"));
        }
    }
    // A schema without bounds (issue 47's report): greedy, this prompt's integer ran
    // "81112222342234444444..." into max_tokens; the default bounds make the model close it
    // after 18 digits.
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                        "required": ["city", "population"], "additionalProperties": false});
    let body = json!({"messages": user("Describe New York as JSON."), "temperature": 0, "max_tokens": 120,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}});
    let (st, _, v) = post(&chat(), &body).await;
    let c = &v["choices"][0];
    assert_eq!((st, c["finish_reason"].as_str()), (200, Some("stop")), "{v}");
    let parsed: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap_or_else(|e| panic!("not JSON ({e}): {c}"));
    assert!(parsed["population"].as_i64().is_some_and(|n| n.unsigned_abs() <= 1_000_000_000_000_000_000), "{parsed}");
}
