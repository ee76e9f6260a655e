//! Fuzzing the request path, CI-sized (proptest, a bounded number of cases): raw bytes and
//! structure-aware JSON bodies through `parse_body` and validation into a `ValidRequest`, for
//! both endpoints, on an in-process server's tokenizer and template (dummy weights). No case
//! may panic; every refusal is a 4xx; no single allocation exceeds [`MAX_ALLOC`]. Inputs that
//! once got through are a fixed corpus ([`past_failures_stay_fixed`]); a failing proptest case
//! is also saved beside this file (`regressions/`) and run first.

use std::sync::{Arc, OnceLock};

use clap::Parser;
use pace_server::serve::api::extract::parse_body;
use pace_server::serve::api::types::{ChatRequest, CompletionRequest};
use pace_server::serve::api::validate::ValidRequest;
use pace_server::serve::state::AppState;
use pace_server::serve::{in_process, ServeArgs};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const MAX_ALLOC: usize = 64 << 20;

#[path = "../../models/tests/common/track_alloc.rs"]
mod track_alloc;
use track_alloc::tracked;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

fn state() -> Arc<AppState> {
    static S: OnceLock<Arc<AppState>> = OnceLock::new();
    S.get_or_init(|| {
        let args = Args::parse_from(["serve", "--model", "dummy:smollm2-135m:q4", "--threads", "2", "--max-model-len", "512", "--kv-cache-memory", "16MiB"]);
        in_process(&args.serve).expect("in-process server")
    })
    .clone()
}

/// Parses and validates `body` for both endpoints: each answer is a request or a 4xx. Returns
/// how many of the two refused it.
fn check(body: &[u8]) -> Result<usize, TestCaseError> {
    let s = state();
    let l = s.loaded.get().unwrap();
    let (outcome, largest) = tracked(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut statuses = Vec::new();
            match parse_body::<CompletionRequest>(body) {
                Ok(r) => statuses.extend(ValidRequest::completion(&r, &s.config, l).err().map(|e| e.status().as_u16())),
                Err(e) => statuses.push(e.status().as_u16()),
            }
            match parse_body::<ChatRequest>(body) {
                Ok(r) => statuses.extend(ValidRequest::chat(&r, &s.config, l).err().map(|e| e.status().as_u16())),
                Err(e) => statuses.push(e.status().as_u16()),
            }
            statuses
        }))
    });
    let statuses = outcome.map_err(|_| TestCaseError::fail(format!("panicked on {:?}", String::from_utf8_lossy(body))))?;
    prop_assert!(statuses.iter().all(|s| (400..500).contains(s)), "{statuses:?} for {:?}", String::from_utf8_lossy(body));
    prop_assert!(largest <= MAX_ALLOC, "an allocation of {largest} bytes");
    Ok(statuses.len())
}

/// JSON values of every kind, nested a little, with the numbers and strings that break parsers.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0i64), Just(-1), Just(1), Just(i64::MAX), Just(i64::MIN), Just(49151), Just(49152), any::<i64>()].prop_map(|v| json!(v)),
        prop_oneof![Just(0.0f64), Just(-0.5), Just(1e308), Just(2.0000001), any::<f64>()].prop_map(|v| json!(v)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,10}", inner), 0..5).prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

const FIELDS: [&str; 31] = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "stop_token_ids",
    "seed",
    "logprobs",
    "top_logprobs",
    "echo",
    "best_of",
    "ignore_eos",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "priority",
    "reading_rate",
    "ttft_grace",
    "cache_salt",
    "response_format",
    "tools",
    "add_generation_prompt",
];

/// A body built from the endpoints' own fields, each given a random value, over a valid base.
fn field_body() -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), prop::collection::vec((prop::sample::select(&FIELDS[..]), any_json()), 0..5)).prop_map(|(chat, fields)| {
        let mut b = if chat { json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}) } else { json!({"prompt": "hi", "max_tokens": 4}) };
        for (k, v) in fields {
            b[k] = v;
        }
        serde_json::to_vec(&b).unwrap()
    })
}

/// Schema-shaped JSON: objects made of JSON-schema keywords with random values, nested.
fn any_schema() -> impl Strategy<Value = Value> {
    const KEYS: [&str; 22] = [
        "type",
        "properties",
        "items",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "required",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "$ref",
        "$defs",
        "additionalProperties",
        "format",
        "prefixItems",
        "x-guidance",
    ];
    let leaf = prop_oneof![
        prop::sample::select(&["object", "array", "string", "integer", "number", "boolean", "null", "#/$defs/a", "#", "date-time", "email"][..])
            .prop_map(|s| json!(s)),
        any_json(),
        regex_like().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec((prop::sample::select(&KEYS[..]), inner.clone()), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>())),
            prop::collection::vec(("[a-c]{1,2}", inner.clone()), 0..4)
                .prop_map(|kv| json!({"type": "object", "properties": kv.into_iter().collect::<Map<_, _>>()})),
            prop::collection::vec(inner, 0..4).prop_map(Value::Array),
        ]
    })
}

/// Strings made of regex and Lark metacharacters.
fn regex_like() -> impl Strategy<Value = String> {
    "[a-c0-9()|*+?{}\\[\\]^$.,:\"/\\\\ \n%-]{0,24}"
}

/// A body with one structured-output or tool field holding a hostile value.
fn structured_body() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        any_schema().prop_map(|s| ("response_format", json!({"type": "json_schema", "json_schema": {"name": "x", "schema": s}}))),
        any_schema().prop_map(|s| ("structured_outputs", json!({"json": s}))),
        any_schema().prop_map(|s| ("guided_json", s)),
        regex_like().prop_map(|r| ("structured_outputs", json!({"regex": r}))),
        regex_like().prop_map(|g| ("structured_outputs", json!({"grammar": format!("start: {g}")}))),
        prop::collection::vec("\\PC{0,6}", 0..5).prop_map(|c| ("guided_choice", json!(c))),
        (any_schema(), prop_oneof![Just(json!("required")), Just(json!("auto")), Just(json!({"type": "function", "function": {"name": "f"}})), any_json()])
            .prop_map(|(p, choice)| ("tools", json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": p}}], "tool_choice": choice}))),
    ];
    (any::<bool>(), field).prop_map(|(chat, (k, v))| {
        let mut b = if chat { json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}) } else { json!({"prompt": "hi", "max_tokens": 4}) };
        if k == "tools" {
            b["tools"] = v["tools"].clone();
            b["tool_choice"] = v["tool_choice"].clone();
        } else {
            b[k] = v;
        }
        serde_json::to_vec(&b).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))), ..ProptestConfig::default() })]

    /// Grammars from clients (schemas, regexes, Lark, choices, tools) compile or are refused with a 4xx,
    /// without a panic or an allocation past the bound.
    #[test]
    fn hostile_grammars_compile_or_are_refused(body in structured_body()) {
        check(&body)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn raw_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
        check(&body)?;
    }

    #[test]
    fn bodies_of_the_endpoints_fields_never_panic_and_are_refused_with_a_4xx(body in field_body()) {
        check(&body)?;
    }

    /// Messages of every shape (roles, content parts, nesting).
    #[test]
    fn chat_messages_of_any_shape(messages in any_json(), extra in prop::option::of(any_json())) {
        let mut b = json!({"messages": messages, "max_tokens": 2});
        if let Some(e) = extra {
            b["messages"] = json!([{"role": "user", "content": e}]);
        }
        check(&serde_json::to_vec(&b).unwrap())?;
    }
}

/// The corpus of inputs that once got through (issue 14's findings and the fuzzers' own), run
/// every time: each is refused with a 4xx, without panicking or allocating past the bound. A
/// case the fuzzers above find is added here with its date.
#[test]
fn past_failures_stay_fixed() {
    let million_prompts = format!("{{\"prompt\": [{}], \"max_tokens\": 1}}", vec!["\"a\""; 1_000_000].join(","));
    let corpus: Vec<(&str, Vec<u8>)> = vec![
        // Accepted and served before the stop-string cap: one stop string of 600 KB.
        ("a 600 KB stop string", serde_json::to_vec(&json!({"prompt": "hi", "max_tokens": 4, "stop": "x".repeat(600_000)})).unwrap()),
        ("17 stop strings", serde_json::to_vec(&json!({"prompt": "hi", "max_tokens": 4, "stop": vec!["s"; 17]})).unwrap()),
        // Tokenized in full before the prompt count was checked.
        ("a million tiny prompts", million_prompts.into_bytes()),
        // About 10 GB of buffered output from a 1 KB body before the output-token cap.
        (
            "n x prompts x max_tokens x logprobs",
            serde_json::to_vec(&json!({"prompt": vec!["a"; 64], "n": 16, "max_tokens": 1_000_000_000u64, "logprobs": 20})).unwrap(),
        ),
        (
            "max_completion_tokens past the cap",
            serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "hi"}], "n": 16, "max_completion_tokens": 1u64 << 40})).unwrap(),
        ),
        // Ids past the vocabulary must never reach a batch.
        ("a token id past the vocabulary", serde_json::to_vec(&json!({"prompt": [1, 49152], "max_tokens": 2})).unwrap()),
        ("a negative token id", serde_json::to_vec(&json!({"prompt": [[-1]], "max_tokens": 2})).unwrap()),
        ("max_tokens of i64::MAX", serde_json::to_vec(&json!({"prompt": "hi", "max_tokens": i64::MAX})).unwrap()),
        ("a deeply nested content", format!("{{\"messages\": [{{\"role\": \"user\", \"content\": {}1{}}}]}}", "[".repeat(5000), "]".repeat(5000)).into_bytes()),
    ];
    for (what, body) in corpus {
        // Each body is meant for one endpoint and malformed for the other: both refuse it.
        let refused = check(&body).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(refused, 2, "{what} was accepted");
    }
}
