//! Truncated, corrupted or hostile model files give an error, never a panic or a huge
//! allocation (docs/reliability.md, "Security basics").

use std::io::Write;

use candle_core::Device;
use pace_models::fetch::default_model_path;
use pace_models::gguf::GgufFile;
use pace_models::loader::{load, LoadOptions, ModelSource};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn write_tmp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pace-corrupt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

fn load_path(p: &std::path::Path) -> pace_models::Result<pace_models::loader::LoadedModel> {
    let src = ModelSource::parse(Some(p.to_str().unwrap()))?;
    load(&src, &LoadOptions { max_model_len: Some(256), ..LoadOptions::on(Device::Cpu) })
}

#[test]
fn truncated_gguf_is_an_error() {
    let bytes = std::fs::read(default_model_path().unwrap()).unwrap();
    // Header only partly there; metadata cut mid-vocabulary; tensor directory present but data cut.
    for cut in [0, 3, 4, 8, 20, 24, 1000, 300_000, 2_000_000, bytes.len() / 2, bytes.len() - 1] {
        let p = write_tmp(&format!("cut-{cut}.gguf"), &bytes[..cut]);
        assert!(GgufFile::open(&p).is_err(), "a GGUF cut at {cut} bytes opened");
        assert!(load_path(&p).is_err(), "a GGUF cut at {cut} bytes loaded");
    }
}

#[test]
fn hostile_counts_and_random_corruption_never_panic() {
    let bytes = std::fs::read(default_model_path().unwrap()).unwrap();
    // Only the header matters for these cases; keep the files small.
    let head = &bytes[..4 << 20];
    // tensor count and metadata count set to huge values
    for (off, val) in [(8usize, u64::MAX), (16, u64::MAX), (8, 1 << 40), (16, 1 << 33)] {
        let mut b = head.to_vec();
        b[off..off + 8].copy_from_slice(&val.to_le_bytes());
        let p = write_tmp("counts.gguf", &b);
        assert!(GgufFile::open(&p).is_err(), "count {val} at {off} accepted");
    }
    // a string length field made huge (first key's length)
    let mut b = head.to_vec();
    b[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(GgufFile::open(&write_tmp("strlen.gguf", &b)).is_err());
    // random byte flips in the first 64 KiB: open may fail or succeed, but never panics
    let mut rng = StdRng::seed_from_u64(99);
    for i in 0..300 {
        let mut b = head.to_vec();
        for _ in 0..rng.random_range(1..8) {
            let pos = rng.random_range(0..65536);
            b[pos] = rng.random();
        }
        let p = write_tmp("flip.gguf", &b);
        let _ = std::panic::catch_unwind(|| GgufFile::open(&p)).unwrap_or_else(|_| panic!("GGUF reader panicked on mutation {i}"));
    }
    assert!(GgufFile::open(&write_tmp("magic.gguf", b"GGUF\x03\x00\x00\x00")).is_err());
    assert!(GgufFile::open(&write_tmp("text.gguf", b"not a model at all")).is_err());
}

#[test]
fn truncated_or_corrupt_safetensors_is_an_error() {
    // A tiny Hugging Face directory: valid config, then a safetensors file that is cut or lies.
    let dir = std::env::temp_dir().join(format!("pace-corrupt-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
            "num_attention_heads":2,"num_key_value_heads":1,"vocab_size":300,"tie_word_embeddings":true}"#,
    )
    .unwrap();
    let t = candle_core::Tensor::zeros((300, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&std::collections::HashMap::from([("model.embed_tokens.weight".to_string(), t)]), &file).unwrap();
    let good = std::fs::read(&file).unwrap();
    let mut cases: Vec<Vec<u8>> = vec![good[..good.len() / 2].to_vec(), good[..7].to_vec(), vec![]];
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes()); // header length far beyond the file
    cases.push(huge);
    let mut lie = good.clone();
    let hdr_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let hdr = String::from_utf8_lossy(&good[8..8 + hdr_len]).replace("[300,64]", "[3000,64]");
    lie.splice(8..8 + hdr_len, hdr.bytes());
    cases.push(lie);
    for (i, bytes) in cases.iter().enumerate() {
        std::fs::write(&file, bytes).unwrap();
        let src = ModelSource::parse(Some(dir.to_str().unwrap())).unwrap();
        let r = std::panic::catch_unwind(|| load(&src, &LoadOptions { max_model_len: Some(64), ..LoadOptions::on(Device::Cpu) }));
        match r {
            Ok(Err(e)) => assert!(e.to_string().contains("safetensors"), "case {i}: unexpected error {e}"),
            Ok(Ok(_)) => panic!("case {i}: corrupt safetensors loaded"),
            Err(_) => panic!("case {i}: loading corrupt safetensors panicked"),
        }
    }
}

#[test]
fn bad_config_is_an_error() {
    for cfg in [
        r#"{"hidden_size":0,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":1,"vocab_size":10}"#,
        r#"{"hidden_size":64,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2,"vocab_size":10}"#,
        r#"{"architectures":["GPT2LMHeadModel"],"hidden_size":64,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":1,"vocab_size":10}"#,
        r#"{"hidden_size":64"#,
    ] {
        assert!(pace_models::config::LlamaConfig::from_hf_json(cfg).is_err(), "{cfg}");
    }
}

/// A GGUF header of `n_kv` key-values given as raw bytes after the counts.
fn gguf_header(n_kv: u64, kvs: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(kvs);
    b
}

/// One key-value: an array of `n` u8 elements, all present in the file.
fn u8_array_kv(n: usize) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'x');
    b.extend_from_slice(&9u32.to_le_bytes()); // array
    b.extend_from_slice(&0u32.to_le_bytes()); // of u8
    b.extend_from_slice(&(n as u64).to_le_bytes());
    b.extend(std::iter::repeat_n(7u8, n));
    b
}

#[test]
fn a_header_cannot_make_the_reader_allocate_many_times_the_file() {
    // Every element is in the file, so counting bytes left accepts it; in memory each u8 would
    // take a whole metadata value (32 bytes): 8 MiB of file, 256 MiB of memory.
    let p = write_tmp("u8-array.gguf", &gguf_header(1, &u8_array_kv(8 << 20)));
    let e = GgufFile::open(&p).err().expect("a metadata array 32 times the file was read");
    assert!(e.to_string().contains("memory"), "{e}");
    // A plain one opens.
    let p = write_tmp("u8-small.gguf", &gguf_header(1, &u8_array_kv(1000)));
    assert!(GgufFile::open(&p).is_ok());
}

/// The default model with the u32 metadata value of `key` set to `value`.
fn model_with_u32(key: &str, value: u32) -> std::path::PathBuf {
    let mut bytes = std::fs::read(default_model_path().unwrap()).unwrap();
    let needle = format!("{key}\u{4}\0\0\0");
    let at = bytes.windows(needle.len()).position(|w| w == needle.as_bytes()).expect("key present as u32") + needle.len();
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    write_tmp(&format!("{key}-{value}.gguf"), &bytes)
}

#[test]
fn an_absurd_context_length_or_a_tokenizer_larger_than_the_model_is_refused_at_load() {
    let src = |p: &std::path::Path| ModelSource::parse(Some(p.to_str().unwrap())).unwrap();
    // The RoPE tables are sized from the context length when --max-model-len is not given.
    let p = model_with_u32("llama.context_length", u32::MAX);
    let e = load(&src(&p), &LoadOptions { max_model_len: None, ..LoadOptions::on(Device::Cpu) }).err().expect("loaded");
    assert!(e.to_string().contains("context length"), "{e}");
    // A --max-model-len past the model's context.
    let e = load(&src(&default_model_path().unwrap()), &LoadOptions { max_model_len: Some(1 << 16), ..LoadOptions::on(Device::Cpu) }).err().expect("loaded");
    assert!(e.to_string().contains("--max-model-len"), "{e}");
    // 49,152 tokens for a model of 1,000 rows: token ids past 1,000 would index past the table.
    let p = model_with_u32("llama.vocab_size", 1000);
    let e = load(&src(&p), &LoadOptions { max_model_len: Some(256), ..LoadOptions::on(Device::Cpu) }).err().expect("loaded");
    assert!(e.to_string().contains("tokenizer has 49152 tokens"), "{e}");
}

#[test]
fn a_chat_template_that_runs_forever_is_stopped() {
    use pace_models::chat::{ChatMessage, ChatTemplate};
    let t = ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", None, None).unwrap();
    let e = t.render(&[ChatMessage::new("user".to_string(), "hi".to_string())], true).expect_err("ten billion iterations rendered");
    assert!(e.to_string().contains("fuel"), "{e}");
}
