//! Fuzzing, CI-sized (proptest, fixed seeds, a bounded number of cases): the GGUF reader from
//! mutated bytes of a small valid file, through config, tokenizer and chat-template
//! construction; the incremental detokenizer and the stop matcher on random token streams. No
//! case may panic, and no single allocation may exceed [`MAX_ALLOC`]. Cases that once failed
//! are kept in `proptest-regressions/fuzz.txt` and run first.

use std::sync::Arc;

use pace_models::chat::ChatTemplate;
use pace_models::config::LlamaConfig;
use pace_models::fetch::default_model_path;
use pace_models::gguf::GgufFile;
use pace_models::tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};
use proptest::prelude::*;

/// The largest single allocation any case may make.
const MAX_ALLOC: usize = 64 << 20;

#[path = "common/track_alloc.rs"]
mod track_alloc;
use track_alloc::tracked;

/// A GGUF writer that remembers where every count and length lies (for structure-aware
/// mutations).
#[derive(Default)]
struct Gguf {
    bytes: Vec<u8>,
    /// Offsets of u64 counts and lengths.
    counts: Vec<usize>,
}

impl Gguf {
    fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn u64_count(&mut self, v: u64) {
        self.counts.push(self.bytes.len());
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u64_count(s.len() as u64);
        self.bytes.extend_from_slice(s.as_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        self.str(k);
        self.u32(8);
        self.str(v);
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        self.str(k);
        self.u32(4);
        self.u32(v);
    }
    fn kv_strs(&mut self, k: &str, vs: &[String]) {
        self.str(k);
        self.u32(9);
        self.u32(8);
        self.u64_count(vs.len() as u64);
        for v in vs {
            self.str(v);
        }
    }
    /// An array of 4-byte numbers of GGUF type `ty` (5: i32, 6: f32).
    fn kv_nums(&mut self, k: &str, ty: u32, vs: &[[u8; 4]]) {
        self.str(k);
        self.u32(9);
        self.u32(ty);
        self.u64_count(vs.len() as u64);
        for v in vs {
            self.bytes.extend_from_slice(v);
        }
    }
}

/// A small valid GGUF: a 2-layer Llama shape, a SentencePiece vocabulary of 3 specials, 256 byte
/// pieces and a few words, a chat template. No tensors.
fn small_gguf() -> Gguf {
    let mut pieces: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    pieces.extend(["▁", "▁the", "▁a", "he", "ll", "o", "▁hello", "▁world"].map(String::from));
    let scores: Vec<f32> = (0..pieces.len()).map(|i| -(i as f32)).collect();
    // unknown, control x2, 256 bytes, normal words
    let types: Vec<i32> = (0..pieces.len())
        .map(|i| match i {
            0 => 2,
            1 | 2 => 3,
            3..=258 => 6,
            _ => 1,
        })
        .collect();
    let mut g = Gguf::default();
    g.bytes.extend_from_slice(b"GGUF");
    g.u32(3);
    g.u64_count(0); // tensors
    g.u64_count(14); // key-values
    g.kv_str("general.architecture", "llama");
    g.kv_u32("llama.embedding_length", 64);
    g.kv_u32("llama.block_count", 2);
    g.kv_u32("llama.feed_forward_length", 128);
    g.kv_u32("llama.attention.head_count", 4);
    g.kv_u32("llama.attention.head_count_kv", 2);
    g.kv_u32("llama.context_length", 256);
    g.kv_str("tokenizer.ggml.model", "llama");
    g.kv_strs("tokenizer.ggml.tokens", &pieces);
    g.kv_nums("tokenizer.ggml.scores", 6, &scores.iter().map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    g.kv_nums("tokenizer.ggml.token_type", 5, &types.iter().map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    g.kv_u32("tokenizer.ggml.bos_token_id", 1);
    g.kv_u32("tokenizer.ggml.eos_token_id", 2);
    g.kv_str("tokenizer.chat_template", ChatTemplate::CHATML);
    g
}

/// Everything a model file feeds before any weight: parse, config, tokenizer, chat template,
/// and one render and encode. Errors are fine; panics are not.
fn load_front(bytes: &[u8]) {
    let dir = std::env::temp_dir().join(format!("pace-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{:?}.gguf", std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&path, bytes).unwrap();
    let Ok(g) = GgufFile::open(&path) else { return };
    let _ = LlamaConfig::from_gguf(&g).and_then(|c| c.validate());
    let Ok(tok) = Tokenizer::from_gguf(&g) else { return };
    let _ = tok.encode("hello the world", true);
    if let Ok(t) = ChatTemplate::for_tokenizer(&tok) {
        let _ = t.render(&[pace_models::chat::ChatMessage::new("user", "hello")], true);
    }
}

#[test]
fn the_small_file_is_valid() {
    let g = small_gguf();
    let dir = std::env::temp_dir().join(format!("pace-fuzz-valid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("small.gguf");
    std::fs::write(&p, &g.bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    LlamaConfig::from_gguf(&f).unwrap().validate().unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert!(!tok.encode("hello world", false).unwrap().is_empty());
    ChatTemplate::for_tokenizer(&tok).unwrap();
}

/// Values a count or length is set to.
fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(255), Just(1 << 20), Just(u32::MAX as u64), Just(1 << 40), Just(u64::MAX), Just(u64::MAX / 2), any::<u64>()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))), ..ProptestConfig::default() })]

    #[test]
    fn mutated_gguf_headers_never_panic_or_allocate_without_bound(
        counts in prop::collection::vec((any::<prop::sample::Index>(), interesting()), 0..3),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let g = small_gguf();
        let mut b = g.bytes.clone();
        for (i, v) in &counts {
            let at = g.counts[i.index(g.counts.len())];
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (i, v) in &flips {
            let at = i.index(b.len());
            b[at] = *v;
        }
        if let Some(c) = cut {
            b.truncate(c.index(b.len()));
        }
        let (r, largest) = tracked(|| std::panic::catch_unwind(|| load_front(&b)));
        prop_assert!(r.is_ok(), "panicked");
        prop_assert!(largest <= MAX_ALLOC, "an allocation of {largest} bytes");
    }
}

fn model_tokenizer() -> Arc<Tokenizer> {
    static T: std::sync::OnceLock<Arc<Tokenizer>> = std::sync::OnceLock::new();
    T.get_or_init(|| Arc::new(Tokenizer::from_gguf(&GgufFile::open(&default_model_path().unwrap()).unwrap()).unwrap())).clone()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::WithSource("regressions"))), ..ProptestConfig::default() })]

    /// Random ids (specials, byte pieces, anything in the vocabulary) through the incremental
    /// detokenizer, and its text through the stop matcher: what is sent before a stop never
    /// holds the stop string, and with no stop string in the text everything is sent.
    #[test]
    fn the_detokenizer_and_stop_matcher_hold_on_random_streams(
        ids in prop::collection::vec(0u32..49152, 0..64),
        stops in prop::collection::vec("[a-z ]{1,4}|\\PC{1,3}", 1..4),
        skip_special in any::<bool>(),
    ) {
        let tok = model_tokenizer();
        let ((full, sent, stopped), largest) = tracked(|| {
            let mut dec = IncrementalDecoder::new(tok.clone(), skip_special);
            let mut m = StopMatcher::new(stops.clone()).unwrap();
            let (mut full, mut sent) = (String::new(), String::new());
            for &id in &ids {
                let piece = dec.push(id).unwrap_or_default();
                full.push_str(&piece);
                let out = m.push(&piece);
                sent.push_str(&out.text);
                if out.stopped.is_some() {
                    return (full, sent, true);
                }
            }
            let rest = dec.finish();
            full.push_str(&rest);
            sent.push_str(&m.push(&rest).text);
            sent.push_str(&m.finish());
            (full, sent, false)
        });
        prop_assert!(largest <= MAX_ALLOC, "an allocation of {largest} bytes");
        if !stopped && stops.iter().all(|s| !full.contains(s.as_str())) {
            prop_assert_eq!(&sent, &full);
        }
        for s in &stops {
            prop_assert!(!sent.contains(s.as_str()), "sent text holds stop {:?}: {:?}", s, sent);
        }
    }
}
