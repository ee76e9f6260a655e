//! `--seed` and `--chat-template` in-process (their own test binary, so no other request moves
//! the seed sequence): requests that send no seed take theirs from the sequence `--seed` starts,
//! in the order they are admitted, so they are reproducible: each answer equals the same request
//! sent with that sequence's seed; a template given by flag replaces the model's.

use axum::body::Body;
use axum::http::{header, Request};
use clap::Parser;
use pace_server::serve::state::seed_sequence;
use pace_server::serve::{api, in_process, ServeArgs};
use serde_json::{json, Value};
use tower::ServiceExt;

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unseeded_requests_follow_the_server_seed() {
    let args = Args::parse_from([
        "serve",
        "--model",
        "dummy:smollm2-135m:q4",
        "--threads",
        "2",
        "--max-model-len",
        "256",
        "--kv-cache-memory",
        "32MiB",
        "--seed",
        "7",
    ]);
    let state = in_process(&args.serve).expect("in-process server");
    let complete = |body: Value| {
        let state = state.clone();
        async move {
            let req = Request::post("/v1/completions").header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap();
            let resp = api::app(state).oneshot(req).await.unwrap();
            assert_eq!(resp.status(), 200);
            let v: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
            v["choices"][0]["text"].as_str().unwrap().to_string()
        }
    };
    let body = json!({"prompt": "Once", "max_tokens": 12, "temperature": 1.0, "ignore_eos": true});
    // Admitted one after the other: the sequence's first and second seeds.
    let first = complete(body.clone()).await;
    let second = complete(body.clone()).await;
    let with = |k: u64| {
        let mut b = body.clone();
        b["seed"] = json!(seed_sequence(7, k));
        b
    };
    assert_eq!(complete(with(0)).await, first);
    assert_eq!(complete(with(1)).await, second);
    assert_ne!(first, second, "two seeds of the sequence gave the same 12 tokens at temperature 1");
}

/// `--chat-template`, inline or from a file (vLLM's flag): what the conversation renders to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_template_given_by_flag_replaces_the_models() {
    let template = "{% for m in messages %}<<{{ m['role'] }}|{{ m['content'] }}>>{% endfor %}{% if add_generation_prompt %}[bot]{% endif %}";
    let file = std::env::temp_dir().join(format!("pace-template-{}.jinja", std::process::id()));
    std::fs::write(&file, template).unwrap();
    for value in [template.to_string(), file.to_str().unwrap().to_string()] {
        let args = Args::parse_from([
            "serve",
            "--model",
            "dummy:smollm2-135m:q4",
            "--threads",
            "2",
            "--max-model-len",
            "256",
            "--kv-cache-memory",
            "16MiB",
            "--chat-template",
            &value,
        ]);
        let state = in_process(&args.serve).expect("in-process server");
        let req = Request::post("/tokenize")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({"messages": [{"role": "user", "content": "hi"}]}).to_string()))
            .unwrap();
        let resp = api::app(state.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
        let ids: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let text = state.loaded.get().unwrap().tokenizer.decode(&ids, false).unwrap();
        assert_eq!(text, "<<user|hi>>[bot]", "{value}");
    }
    let bad = Args::parse_from(["serve", "--model", "dummy:smollm2-135m:q4", "--chat-template", "no-such-file.jinja"]);
    assert!(in_process(&bad.serve).is_err());
}

/// `--generation-config` (vLLM's flag): a request that leaves out temperature and max_tokens
/// gets the file's; one that sends them keeps its own; `--override-generation-config` wins over
/// the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_defaults_come_from_the_generation_config() {
    let dir = std::env::temp_dir().join(format!("pace-genconfig-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"temperature": 0.0, "max_new_tokens": 5, "bos_token_id": 1}"#).unwrap();
    let start = |extra: &[&str]| {
        let mut argv = vec![
            "serve",
            "--model",
            "dummy:smollm2-135m:q4",
            "--threads",
            "2",
            "--max-model-len",
            "256",
            "--kv-cache-memory",
            "16MiB",
            "--generation-config",
            dir.to_str().unwrap(),
        ];
        argv.extend_from_slice(extra);
        in_process(&Args::parse_from(argv).serve).expect("in-process server")
    };
    let complete = |state: std::sync::Arc<pace_server::serve::state::AppState>, body: Value| async move {
        let req = Request::post("/v1/completions").header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap();
        let resp = api::app(state).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let v: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
        (v["choices"][0]["text"].as_str().unwrap().to_string(), v["usage"]["completion_tokens"].as_u64().unwrap())
    };
    let state = start(&[]);
    // Greedy by default: two different seeds give the same text; 5 tokens by default.
    let (a, n) = complete(state.clone(), json!({"prompt": "Once", "ignore_eos": true, "seed": 1})).await;
    let (b, _) = complete(state.clone(), json!({"prompt": "Once", "ignore_eos": true, "seed": 2})).await;
    assert_eq!((a.clone(), n), (b, 5));
    // What the request sends wins.
    let (_, n) = complete(state.clone(), json!({"prompt": "Once", "ignore_eos": true, "max_tokens": 7})).await;
    assert_eq!(n, 7);
    let (c, _) = complete(state.clone(), json!({"prompt": "Once", "ignore_eos": true, "seed": 1, "temperature": 1.0, "max_tokens": 12})).await;
    let (d, _) = complete(state, json!({"prompt": "Once", "ignore_eos": true, "seed": 2, "temperature": 1.0, "max_tokens": 12})).await;
    assert_ne!(c, d, "temperature 1 with two seeds gave the same 12 tokens");
    // The override wins over the file.
    let state = start(&["--override-generation-config", r#"{"max_new_tokens": 3}"#]);
    assert_eq!(complete(state, json!({"prompt": "Once", "ignore_eos": true})).await.1, 3);
    // A file that is not a generation config is an error at start.
    let bad = Args::parse_from(["serve", "--model", "dummy:smollm2-135m:q4", "--generation-config", "/nonexistent"]);
    assert!(in_process(&bad.serve).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

/// vLLM's chat extras: `chat_template_kwargs` reach the template, `continue_final_message`
/// cuts the rendering after the final assistant text, and the fields pace does not implement
/// are refused by name. (Prompt lengths in bytes: the dummy model's tokenizer is byte-level.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_chat_extras_render_as_vllm_renders_them() {
    let template = "{% if greeting %}{{ greeting }}{% endif %}{% for m in messages %}<<{{ m['role'] }}|{{ m['content'] }}>>{% endfor %}{% if add_generation_prompt %}[bot]{% endif %}";
    let args = Args::parse_from([
        "serve",
        "--model",
        "dummy:smollm2-135m:q4",
        "--threads",
        "2",
        "--max-model-len",
        "256",
        "--kv-cache-memory",
        "16MiB",
        "--chat-template",
        template,
    ]);
    let state = in_process(&args.serve).expect("in-process server");
    let chat = |extra: Value| {
        let state = state.clone();
        async move {
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once upon"}], "max_tokens": 1});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let req = Request::post("/v1/chat/completions").header(header::CONTENT_TYPE, "application/json").body(Body::from(body.to_string())).unwrap();
            let resp = api::app(state).oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let v: Value = serde_json::from_slice(&axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap()).unwrap();
            (status, v)
        }
    };
    let prompt_len = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap();
    // "<<user|hi>><<assistant|Once upon>>[bot]": 11 + 23 + 5 bytes.
    let (st, v) = chat(json!({})).await;
    assert_eq!((st, prompt_len(&v)), (200, 39), "{v}");
    let (_, v) = chat(json!({"chat_template_kwargs": {"greeting": "HELLO"}})).await;
    assert_eq!(prompt_len(&v), 44, "the kwarg reached the template: {v}");
    let (_, v) = chat(json!({"chat_template_kwargs": {"add_generation_prompt": false}})).await;
    assert_eq!(prompt_len(&v), 39, "a kwarg cannot override add_generation_prompt: {v}");
    // "<<user|hi>><<assistant|Once upon": the reply continues the assistant's text.
    let (st, v) = chat(json!({"continue_final_message": true})).await;
    assert_eq!((st, prompt_len(&v)), (200, 32), "{v}");
    let (_, v) = chat(json!({"continue_final_message": true, "add_generation_prompt": false})).await;
    assert_eq!(prompt_len(&v), 32);
    // Refusals name the field.
    for (extra, param) in [
        (json!({"continue_final_message": true, "add_generation_prompt": true}), "continue_final_message"),
        (json!({"spaces_between_special_tokens": true, "skip_special_tokens": false}), "spaces_between_special_tokens"),
        (json!({"use_beam_search": true}), "use_beam_search"),
        (json!({"structural_tag": {}}), "structural_tag"),
    ] {
        let (st, v) = chat(extra.clone()).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(param)), "{extra}: {v}");
    }
    let (_, v) = chat(json!({"use_beam_search": true})).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("vLLM extension that pace does not support"), "{v}");
    let (_, v) = chat(json!({"no_such_field": 1})).await;
    assert!(v["error"]["message"].as_str().unwrap().contains("Unrecognized request argument"), "{v}");
    // Continuing needs a final assistant message.
    let req = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": true, "max_tokens": 1}).to_string()))
        .unwrap();
    assert_eq!(api::app(state.clone()).oneshot(req).await.unwrap().status(), 400);
    // spaces_between_special_tokens is harmless while special tokens are skipped (the default).
    assert_eq!(chat(json!({"spaces_between_special_tokens": true})).await.0, 200);
}
