//! Tokenizer tests on real vocabularies, no network.
//!
//! - Exact token ids against llama.cpp (fixtures made by tests/fixtures/make_tokenizer_fixtures.sh
//!   over tests/fixtures/tokenizer_corpus.json) for the default model, SmolLM2-135M-Instruct,
//!   and, when the llama.cpp source tree is present, for the vocab-only GGUFs llama.cpp ships
//!   (GPT-2, Llama 3, Llama 2 SentencePiece, StarCoder, Qwen 2).
//! - decode(encode(x)) == x over the corpus.
//! - Incremental decoding of characters split across byte tokens.
//! - Stop strings over a token stream.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use pace_models::gguf::GgufFile;
use pace_models::tokenizer::{EncodeOptions, IncrementalDecoder, StopMatcher, StopOutput, Tokenizer};
use serde_json::Value;

/// The default model, fetched on first use.
fn default_model_path() -> PathBuf {
    pace_models::fetch::default_model_path().unwrap_or_else(|e| panic!("default model: {e}"))
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The default model's tokenizer, loaded once for all tests of this file.
fn smollm2() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = default_model_path();
        let t0 = std::time::Instant::now();
        let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("tokenizer: {e}"));
        eprintln!("SmolLM2 GGUF opened and tokenizer built in {:?}", t0.elapsed());
        Arc::new(tok)
    })
    .clone()
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn corpus() -> Vec<String> {
    serde_json::from_value(read_json(&fixtures_dir().join("tokenizer_corpus.json"))).unwrap_or_default()
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().into_iter().flatten().filter_map(Value::as_u64).map(|x| x as u32).collect()
}

/// Compares the tokenizer with every case of a fixture file; returns a description of each
/// mismatch.
fn check_fixture(tok: &Tokenizer, fixture: &Value) -> Vec<String> {
    let mut failures = Vec::new();
    let cases = fixture["cases"].as_array().cloned().unwrap_or_default();
    assert!(cases.len() >= 60, "fixture has only {} cases", cases.len());
    for case in &cases {
        let text = case["text"].as_str().unwrap_or_default();
        for (key, parse_special) in [("ids", true), ("ids_no_special", false)] {
            let want = ids_of(&case[key]);
            let got = tok.encode_with(text, EncodeOptions { add_special_tokens: true, parse_special });
            match got {
                Ok(got) if got == want => {}
                Ok(got) => failures.push(format!("{key} {text:?}\n   llama.cpp {want:?}\n   pace      {got:?}")),
                Err(e) => failures.push(format!("{key} {text:?}: error {e}")),
            }
        }
    }
    failures
}

#[test]
fn smollm2_matches_llama_cpp() {
    let tok = smollm2();
    let fixture = read_json(&fixtures_dir().join("tokenizer_smollm2.json"));
    let failures = check_fixture(&tok, &fixture);
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// llama.cpp's vocab-only test GGUFs (in its source tree, not shipped with pace).
fn llama_cpp_vocab(name: &str) -> Option<PathBuf> {
    let src = std::env::var_os("LLAMA_CPP_SRC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/llama-cpp/src/vendor/llama.cpp"));
    let p = src.join("models").join(format!("ggml-vocab-{name}.gguf"));
    p.is_file().then_some(p)
}

#[test]
fn llama_cpp_vocabularies_match_llama_cpp() {
    use sha2::{Digest, Sha256};
    let mut ran = Vec::new();
    let mut failures = Vec::new();
    for name in ["gpt-2", "llama-bpe", "llama-spm", "starcoder", "qwen2"] {
        let fixture = read_json(&fixtures_dir().join(format!("tokenizer_{name}.json")));
        let Some(path) = llama_cpp_vocab(name) else {
            eprintln!("skipping {name}: llama.cpp source tree not found (set LLAMA_CPP_SRC)");
            continue;
        };
        let bytes = std::fs::read(&path).unwrap_or_default();
        let sha = format!("{:x}", Sha256::digest(&bytes));
        if fixture["sha256"].as_str() != Some(sha.as_str()) {
            eprintln!("skipping {name}: {} differs from the fixture's vocabulary", path.display());
            continue;
        }
        let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
        failures.extend(check_fixture(&tok, &fixture).into_iter().map(|f| format!("[{name}] {f}")));
        ran.push(name);
    }
    eprintln!("checked llama.cpp vocabularies: {ran:?}");
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_special_tokens_and_metadata() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_id(), Some(2));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    // <|endoftext|> (0) and <|im_end|> (2) both end generation.
    assert_eq!(tok.eos_token_ids(), &[0, 2]);
    assert!(!tok.adds_bos());
    assert!(tok.chat_template().is_some_and(|t| t.contains("<|im_start|>")));
    assert_eq!(tok.token_str(1), Some("<|im_start|>"));
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert!(tok.is_special(2) && !tok.is_special(100));
    assert_eq!(tok.token_bytes(216), Some(&b" "[..]));
    // Out-of-vocabulary ids are an error, not a panic.
    assert!(tok.decode(&[49152], false).is_err());
}

#[test]
fn round_trip_over_the_corpus() {
    let tok = smollm2();
    for text in corpus() {
        let ids = tok.encode(&text, false).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let back = tok.decode(&ids, false).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(back, text, "ids {ids:?}");
    }
}

#[test]
fn round_trip_sentencepiece_when_available() {
    let Some(path) = llama_cpp_vocab("llama-spm") else {
        eprintln!("skipping: llama.cpp source tree not found");
        return;
    };
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
    let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{e}"));
    // SentencePiece writes spaces as U+2581, so a text containing U+2581 cannot round-trip.
    for text in corpus().into_iter().filter(|t| !t.contains('\u{2581}')) {
        let ids = tok.encode_with(&text, EncodeOptions { add_special_tokens: true, parse_special: false }).unwrap_or_default();
        // The prepended space is dropped again; BOS is skipped.
        assert_eq!(tok.decode(&ids, true).ok(), Some(text.clone()), "ids {ids:?}");
    }
}

#[test]
fn skip_special_tokens_when_decoding() {
    let tok = smollm2();
    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap_or_default();
    assert_eq!(tok.decode(&ids, false).ok().as_deref(), Some("<|im_start|>user\nHi<|im_end|>"));
    assert_eq!(tok.decode(&ids, true).ok().as_deref(), Some("user\nHi"));
}

/// Decodes ids one at a time, checking every piece is valid (it is a String) and that no
/// replacement character appears unless the full decode has one.
fn incremental(tok: &Arc<Tokenizer>, ids: &[u32]) -> (Vec<String>, String) {
    let mut dec = IncrementalDecoder::new(tok.clone(), false);
    let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap_or_else(|e| panic!("{e}"))).collect();
    pieces.push(dec.finish());
    let joined = pieces.concat();
    (pieces, joined)
}

#[test]
fn incremental_decoding_never_splits_a_character() {
    let tok = smollm2();
    // Emoji, ZWJ sequences and flags are several byte tokens each in SmolLM2's vocabulary.
    for text in ["😀", "👨‍👩‍👧‍👦 family", "🇫🇷🇩🇪", "I ❤️ Rust 🦀!", "中文测试：你好", "naïve café"] {
        let ids = tok.encode(text, false).unwrap_or_default();
        let (pieces, joined) = incremental(&tok, &ids);
        assert_eq!(joined, text);
        assert_eq!(joined, tok.decode(&ids, false).unwrap_or_default());
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    }
    // 😀 is F0 9F 98 80: four tokens, one per byte, and the text appears only with the last.
    let ids = tok.encode("😀", false).unwrap_or_default();
    assert!(ids.len() > 1, "{ids:?}");
    let (pieces, _) = incremental(&tok, &ids);
    assert!(pieces[..ids.len() - 1].iter().all(String::is_empty), "{pieces:?}");
    assert_eq!(pieces[ids.len() - 1], "😀");
}

#[test]
fn incremental_decoding_equals_full_decode_over_the_corpus() {
    let tok = smollm2();
    let mut all = Vec::new();
    for text in corpus() {
        let ids = tok.encode(&text, false).unwrap_or_default();
        assert_eq!(incremental(&tok, &ids).1, tok.decode(&ids, false).unwrap_or_default());
        all.extend(ids);
    }
    // Cut mid-character: a stream that ends inside an emoji flushes U+FFFD, like decode.
    let emoji = tok.encode("ab😀", false).unwrap_or_default();
    let cut = &emoji[..emoji.len() - 1];
    assert_eq!(incremental(&tok, cut).1, tok.decode(cut, false).unwrap_or_default());
    assert!(tok.decode(cut, false).unwrap_or_default().ends_with('\u{FFFD}'));
    // And the whole corpus as one stream.
    assert_eq!(incremental(&tok, &all).1, tok.decode(&all, false).unwrap_or_default());
}

/// Streams `text` token by token through a decoder and a stop matcher; returns the emitted
/// text and which stop string matched.
fn stream_with_stops(tok: &Arc<Tokenizer>, text: &str, stops: &[&str]) -> (String, Option<usize>) {
    let ids = tok.encode(text, false).unwrap_or_default();
    let mut dec = IncrementalDecoder::new(tok.clone(), false);
    let mut stop = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect()).unwrap_or_else(|e| panic!("{e}"));
    let mut out = String::new();
    for id in ids {
        let StopOutput { text, stopped } = stop.push(&dec.push(id).unwrap_or_default());
        out.push_str(&text);
        if stopped.is_some() {
            return (out, stopped);
        }
    }
    let StopOutput { text, stopped } = stop.push(&dec.finish());
    out.push_str(&text);
    if stopped.is_none() {
        out.push_str(&stop.finish());
    }
    (out, stopped)
}

#[test]
fn stop_strings_over_a_token_stream() {
    let tok = smollm2();
    // A stop string spanning several tokens.
    assert_eq!(stream_with_stops(&tok, "The answer is 42. Observation: done", &["Observation:"]), ("The answer is 42. ".to_string(), Some(0)));
    // Several stop strings: the earliest in the text wins, whatever its index.
    assert_eq!(stream_with_stops(&tok, "one two three four", &["four", "two"]), ("one ".to_string(), Some(1)));
    // Stop at the very start.
    assert_eq!(stream_with_stops(&tok, "STOP here", &["STOP"]), (String::new(), Some(0)));
    // No match: everything comes out, including a held partial match at the end.
    assert_eq!(stream_with_stops(&tok, "almost a sto", &["stop"]), ("almost a sto".to_string(), None));
    // A stop string inside an emoji sequence (split across byte tokens).
    assert_eq!(stream_with_stops(&tok, "go 🦀🦀 now", &["🦀🦀"]), ("go ".to_string(), Some(0)));
}

#[test]
fn stop_matcher_holds_back_only_possible_prefixes() {
    let mut m = StopMatcher::new(vec!["abc".into(), "bcd".into()]).unwrap_or_else(|e| panic!("{e}"));
    // "ab" could start "abc"; "b" could start "bcd": hold "ab".
    assert_eq!(m.push("xxab").text, "xx");
    // "abx" kills both.
    assert_eq!(m.push("x").text, "abx");
    // Overlapping prefixes: "ab" held, then "bcd" completes starting inside the held text.
    assert_eq!(m.push("ab").text, "");
    let out = m.push("cd");
    assert_eq!(out, StopOutput { text: String::new(), stopped: Some(0) }); // "abc" at 0 comes first
    let mut m = StopMatcher::new(vec!["bcd".into()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.push("ab").text, "a");
    assert_eq!(m.push("cd!"), StopOutput { text: String::new(), stopped: Some(0) });
    // Repeated prefix characters: "aab" with stop "ab".
    let mut m = StopMatcher::new(vec!["ab".into()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.push("a").text, "");
    assert_eq!(m.push("a").text, "a");
    assert_eq!(m.push("b"), StopOutput { text: String::new(), stopped: Some(0) });
    // Multi-byte stop strings are held on character boundaries.
    let mut m = StopMatcher::new(vec!["é!".into()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.push("café").text, "caf");
    assert_eq!(m.finish(), "é");
}

/// Writes a Hugging Face `tokenizer.json` for SmolLM2 (same structure as the one on the Hub:
/// Digits + ByteLevel pre-tokenizer, ByteLevel decoder, special added tokens 0..=16) from the
/// GGUF's vocabulary, with the given config files next to it.
fn write_hf_dir(name: &str, config: &Value, generation: Option<&Value>, post_processor: Value) -> PathBuf {
    use serde_json::json;
    let gguf = GgufFile::open(&default_model_path()).unwrap_or_else(|e| panic!("{e}"));
    let strings = |key: &str| -> Vec<String> {
        let arr = gguf.get(key).and_then(|v| v.as_array()).unwrap_or_default();
        arr.iter().filter_map(|v| v.as_str()).map(str::to_owned).collect()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    let merges: Vec<Value> = strings("tokenizer.ggml.merges").iter().filter_map(|m| m.split_once(' ').map(|(a, b)| json!([a, b]))).collect();
    let vocab: serde_json::Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let added: Vec<Value> = (0..=16)
        .map(|i| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let doc = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<|endoftext|>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                  "byte_fallback": false, "vocab": vocab, "merges": merges},
    });
    let dir = std::env::temp_dir().join(format!("pace-tokenizer-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let write = |file: &str, v: &Value| {
        std::fs::write(dir.join(file), v.to_string()).unwrap_or_else(|e| panic!("{e}"));
    };
    write("tokenizer.json", &doc);
    write("tokenizer_config.json", config);
    if let Some(g) = generation {
        write("generation_config.json", g);
    }
    dir
}

#[test]
fn tokenizer_json_matches_llama_cpp_too() {
    use serde_json::json;
    let template = "{% for m in messages %}{{ m['content'] }}{% endfor %}";
    let config = json!({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
                        "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]});
    let post = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true});
    let dir = write_hf_dir("plain", &config, Some(&json!({"eos_token_id": [2, 0]})), post);
    let tok = Tokenizer::from_file(&dir).unwrap_or_else(|e| panic!("{e}"));
    let fixture = read_json(&fixtures_dir().join("tokenizer_smollm2.json"));
    let failures = check_fixture(&tok, &fixture);
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    assert_eq!((tok.bos_token_id(), tok.eos_token_id()), (Some(1), Some(2)));
    assert_eq!(tok.eos_token_ids(), &[0, 2]);
    assert_eq!(tok.chat_template(), Some(template));
    assert!(!tok.adds_bos());
    for text in corpus() {
        let ids = tok.encode(&text, false).unwrap_or_default();
        assert_eq!(tok.decode(&ids, false).ok(), Some(text));
    }
    // A direct path to tokenizer.json reads the configs next to it.
    let direct = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(direct.chat_template(), Some(template));
    std::fs::remove_dir_all(&dir).ok();

    // BOS from a TemplateProcessing post-processor (Llama 3 style), and from add_bos_token.
    let post = json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}});
    let dir = write_hf_dir("bos", &json!({}), None, post);
    let tok = Tokenizer::from_file(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tok.encode("Hi", true).ok(), Some(vec![1, 26843]));
    assert_eq!(tok.encode("Hi", false).ok(), Some(vec![26843]));
    assert_eq!(tok.bos_token_id(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
    let dir = write_hf_dir("addbos", &json!({"bos_token": "<|im_start|>", "add_bos_token": true}), None, Value::Null);
    let tok = Tokenizer::from_file(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tok.encode("Hi", true).ok(), Some(vec![1, 26843]));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_or_malformed_files_are_errors() {
    assert!(Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).is_err());
    let dir = std::env::temp_dir().join(format!("pace-tokenizer-test-{}-bad", std::process::id()));
    std::fs::create_dir_all(&dir).ok();
    std::fs::write(dir.join("tokenizer.json"), "{ not json").ok();
    assert!(matches!(Tokenizer::from_file(&dir), Err(pace_models::Error::Format(_))));
    std::fs::write(dir.join("tokenizer.json"), r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}}}"#).ok();
    assert!(matches!(Tokenizer::from_file(&dir), Err(pace_models::Error::Unsupported(_))));
    std::fs::remove_dir_all(&dir).ok();
}

/// Dummy models get a byte-level tokenizer: one token per byte, exact round trip.
#[test]
fn byte_level_tokenizer_round_trips() {
    let t = pace_models::tokenizer::Tokenizer::byte_level(1000).unwrap();
    assert_eq!(t.vocab_size(), 1000);
    let text = "héllo, wörld 🎉 <|im_start|>";
    let ids = t.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len());
    assert!(ids.iter().all(|&i| i < 256));
    assert_eq!(t.decode(&ids, false).unwrap(), text);
    assert_eq!(t.eos_token_ids(), &[256]);
    assert!(pace_models::tokenizer::Tokenizer::byte_level(100).is_err());
}

/// The grammar engine's view of the vocabulary: each id's exact output bytes, special tokens
/// marked so that text never matches them, unused ids empty.
#[test]
fn grammar_words_are_the_output_bytes() {
    let t = pace_models::tokenizer::Tokenizer::byte_level(300).unwrap();
    let words = t.grammar_words();
    assert_eq!(words.len(), 300);
    for id in 0..256u32 {
        assert_eq!(words[id as usize], t.token_bytes(id).unwrap(), "id {id}");
    }
    assert_eq!(words[256], b"\xFF<|endoftext|>");
    assert!(words[257..].iter().all(Vec::is_empty));

    let t = smollm2();
    let words = t.grammar_words();
    assert_eq!(words.len(), t.vocab_size());
    let im_end = t.token_id("<|im_end|>").unwrap();
    assert_eq!(words[im_end as usize], b"\xFF<|im_end|>");
    let mut normal = 0;
    for (id, w) in words.iter().enumerate() {
        let id = id as u32;
        if t.is_special(id) {
            assert_eq!(w[0], 0xFF, "special {id} unmarked");
        } else {
            assert_eq!(&w[..], t.token_bytes(id).unwrap(), "id {id}");
            normal += 1;
        }
    }
    assert!(normal > 49_000, "{normal} normal tokens");
    // " the" is one token whose word is its bytes, space included.
    let ids = t.encode(" the", false).unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(words[ids[0] as usize], b" the");
}
