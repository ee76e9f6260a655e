//! Chat template tests on the default model's own template.
//!
//! Expected strings were produced by rendering the same template from the GGUF with Python
//! jinja2 (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`, as
//! transformers' `apply_chat_template` does) and agree with llama.cpp's `llama-server --jinja`
//! `POST /apply-template` for the generation-prompt cases.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use pace_models::chat::{ChatMessage, ChatTemplate};
use pace_models::gguf::GgufFile;
use pace_models::tokenizer::Tokenizer;
use pace_models::Error;

/// The default model, fetched on first use.
fn default_model_path() -> PathBuf {
    pace_models::fetch::default_model_path().unwrap_or_else(|e| panic!("default model: {e}"))
}

/// The default model's tokenizer, loaded once for all tests of this file.
fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let gguf = GgufFile::open(&default_model_path()).unwrap_or_else(|e| panic!("{e}"));
        Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"))
    })
}

const DEFAULT_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

#[test]
fn smollm2_template_renders_like_jinja2() {
    let tok = smollm2();
    let t = ChatTemplate::for_tokenizer(tok).unwrap_or_else(|e| panic!("{e}"));
    let user = ChatMessage::new("user", "What is the capital of France?");

    let got = t.render(std::slice::from_ref(&user), true).unwrap_or_else(|e| panic!("{e}"));
    let want = format!("{DEFAULT_SYSTEM}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(got, want);

    let got = t.render(std::slice::from_ref(&user), false).unwrap_or_default();
    assert_eq!(got, format!("{DEFAULT_SYSTEM}<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"));

    let with_system = [ChatMessage::new("system", "You are terse."), user.clone()];
    let got = t.render(&with_system, true).unwrap_or_default();
    assert_eq!(
        got,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n\
         <|im_start|>assistant\n"
    );

    let turns = [ChatMessage::new("user", "Hi"), ChatMessage::new("assistant", "Hello! How can I help?"), ChatMessage::new("user", "Tell me a joke.")];
    let got = t.render(&turns, true).unwrap_or_default();
    assert_eq!(
        got,
        format!(
            "{DEFAULT_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n\
             <|im_start|>user\nTell me a joke.<|im_end|>\n<|im_start|>assistant\n"
        )
    );

    // No messages renders the generation prompt alone, no panic.
    assert_eq!(t.render(&[], true).ok().as_deref(), Some("<|im_start|>assistant\n"));
}

#[test]
fn rendered_prompt_encodes_special_tokens() {
    let tok = smollm2();
    let t = ChatTemplate::for_tokenizer(tok).unwrap_or_else(|e| panic!("{e}"));
    let prompt = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap_or_default();
    let ids = tok.encode(&prompt, false).unwrap_or_default();
    assert_eq!(ids.first(), Some(&1)); // <|im_start|>
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2); // <|im_end|>
    assert_eq!(tok.decode(&ids, false).ok(), Some(prompt));
}

#[test]
fn default_template_is_chatml() {
    let t = ChatTemplate::chatml(None, None).unwrap_or_else(|e| panic!("{e}"));
    let msgs = [ChatMessage::new("system", "S"), ChatMessage::new("user", "U")];
    assert_eq!(t.render(&msgs, true).ok().as_deref(), Some("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"));
    assert_eq!(t.render(&msgs[1..], false).ok().as_deref(), Some("<|im_start|>user\nU<|im_end|>\n"));
}

#[test]
fn raise_exception_is_an_error_not_a_panic() {
    // The alternation check Llama 2 / Mistral templates carry.
    let src = "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
               {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
               {% endif %}[INST] {{ m['content'] }} [/INST]{% endfor %}";
    let t = ChatTemplate::new(src, Some("<s>"), Some("</s>")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.render(&[ChatMessage::new("user", "a")], false).ok().as_deref(), Some("[INST] a [/INST]"));
    let bad = [ChatMessage::new("assistant", "a")];
    match t.render(&bad, false) {
        Err(Error::Template(msg)) => assert!(msg.contains("must alternate"), "{msg}"),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn syntax_errors_fail_at_load() {
    match ChatTemplate::new("{% for m in messages %}{{ m.content }", None, None) {
        Err(Error::Template(msg)) => assert!(msg.contains("invalid chat template"), "{msg}"),
        other => panic!("expected a template error, got {other:?}"),
    }
    // Calling something undefined fails at render time, as an error.
    let t = ChatTemplate::new("{{ no_such_function() }}", None, None).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(t.render(&[], false), Err(Error::Template(_))));
}

#[test]
fn hf_helpers_strftime_tojson_and_trim_blocks() {
    // A Llama-3.1-like header: date, JSON, and block tags on their own lines (expected string
    // checked with jinja2 and Hugging Face's tojson definition).
    let src = "{{ bos_token }}\n{% if true %}\n    Today Date: {{ strftime_now('%d %b %Y') }}\n{% endif %}\n\
               {{ messages | tojson }}";
    let t = ChatTemplate::new(src, Some("<|begin_of_text|>"), None).unwrap_or_else(|e| panic!("{e}"));
    let now = UNIX_EPOCH + Duration::from_secs(1_721_865_600); // 2024-07-25
    let got = t.render_at(&[ChatMessage::new("user", "é \"q\"")], false, now).unwrap_or_default();
    assert_eq!(got, "<|begin_of_text|>\n    Today Date: 25 Jul 2024\n[{\"role\": \"user\", \"content\": \"é \\\"q\\\"\"}]");
}

/// Tool definitions reach a template that renders `tools` (the server passes them as that
/// variable); templates without it report so, and the server offers the tools in a system
/// message instead.
#[test]
fn templates_that_render_tools_get_them() {
    let src = "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}={{ t.function.parameters | tojson }}{% endfor %}<|im_end|>\n{% endif %}\
               {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let t = ChatTemplate::new(src, None, None).unwrap();
    assert!(t.uses_tools());
    let tools: serde_json::Value = serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let mut extra = serde_json::Map::new();
    extra.insert("tools".into(), tools);
    let out = t.render_with(&[ChatMessage::new("user", "hi")], false, &extra).unwrap();
    assert_eq!(out, "<|im_start|>system\nTools: get_weather={\"type\": \"object\"}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
    assert!(!ChatTemplate::new(ChatTemplate::CHATML, None, None).unwrap().uses_tools());
    assert!(!ChatTemplate::for_tokenizer(smollm2()).unwrap().uses_tools());
}
