//! `--dtype` and `--tokenizer` at load (vLLM's flags): what the CPU path takes, and a
//! tokenizer from another file replacing the model's own.

use candle_core::{DType, Device};
use pace_models::fetch::default_model_path;
use pace_models::loader::{load, LoadOptions, ModelSource};
use pace_models::tokenizer::Tokenizer;

fn dummy() -> ModelSource {
    ModelSource::parse(Some("dummy:smollm2-135m:q4")).unwrap()
}

#[test]
fn the_cpu_path_takes_float32_and_says_so_for_the_others() {
    let opts = |dtype| LoadOptions { max_model_len: Some(64), dtype, ..LoadOptions::on(Device::Cpu) };
    assert!(load(&dummy(), &opts(None)).is_ok());
    assert!(load(&dummy(), &opts(Some(DType::F32))).is_ok());
    for d in [DType::F16, DType::BF16] {
        let e = load(&dummy(), &opts(Some(d))).err().expect("loaded").to_string();
        assert!(e.contains("float32") && e.contains("--device cuda"), "{e}");
    }
}

#[test]
fn a_tokenizer_from_another_file_replaces_the_models_own() {
    let gguf = default_model_path().unwrap();
    let own = load(&dummy(), &LoadOptions { max_model_len: Some(64), ..LoadOptions::on(Device::Cpu) }).unwrap();
    let other = load(&dummy(), &LoadOptions { max_model_len: Some(64), tokenizer: Some(gguf.clone()), ..LoadOptions::on(Device::Cpu) }).unwrap();
    let reference = Tokenizer::from_path(&gguf).unwrap();
    let text = "The capital of France is Paris.";
    let ids = other.tokenizer.encode(text, false).unwrap();
    assert_eq!(ids, reference.encode(text, false).unwrap());
    assert_ne!(ids, own.tokenizer.encode(text, false).unwrap(), "the dummy model's byte-level tokenizer was kept");
    assert_eq!(other.tokenizer.vocab_size(), reference.vocab_size());
    // Its chat template comes with it.
    assert_eq!(other.tokenizer.chat_template(), reference.chat_template());
    // A path that is no tokenizer is an error naming it.
    let e = load(&dummy(), &LoadOptions { tokenizer: Some("/nonexistent/tokenizer.json".into()), ..LoadOptions::on(Device::Cpu) }).err().expect("loaded");
    assert!(e.to_string().contains("/nonexistent"), "{e}");
}
