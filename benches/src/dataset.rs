//! Prompts of a benchmark: random prompts exact in tokens, ShareGPT conversations, or a JSONL file.
//!
//! Token counts use the model's tokenizer, loaded from the same sources pace loads models from
//! (`--tokenizer`: a `.gguf` file, a Hugging Face model directory or a `tokenizer.json`; default:
//! pace's default model). Counts are without special tokens: a server that adds BOS sees one
//! more, and a chat endpoint adds its template's tokens around the prompt.
//!
//! Random prompts: random ids drawn from the normal (non-special) vocabulary are decoded to text,
//! the text re-encoded, and the ids fixed up (cut to `n`, or topped up with more random ids)
//! until the text encodes to exactly `n` tokens. Every prompt is fresh random text, so a server's
//! prefix cache cannot shorten time to first token; the same seed gives the same prompts.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use pace_models::tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One request's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    /// Prompt text, sent as is (completions) or as the one user message (chat).
    pub text: String,
    /// Its length in tokens under the benchmark's tokenizer.
    pub prompt_len: usize,
    /// Output tokens asked for (`max_tokens`).
    pub output_len: usize,
}

/// Where prompts come from.
#[derive(Debug, Clone, PartialEq)]
pub enum DatasetSpec {
    /// Random token prompts: lengths uniform in `[len * (1 - ratio), len * (1 + ratio)]`.
    Random {
        /// Mean prompt tokens.
        input_len: usize,
        /// Mean output tokens.
        output_len: usize,
        /// Half-width of the length range as a fraction of the mean, in `[0, 1)`.
        range_ratio: f64,
    },
    /// A ShareGPT-format JSON file: the first human turn is the prompt, the reply's length in
    /// tokens the output length (unless `output_len` overrides it).
    ShareGpt {
        /// The file.
        path: PathBuf,
        /// Fixed output length instead of the reply's.
        output_len: Option<usize>,
    },
    /// One JSON object per line: `{"prompt": "...", "output_len": N}`; `output_len` (or
    /// `max_tokens`) is optional and defaults to `default_output_len`.
    Jsonl {
        /// The file.
        path: PathBuf,
        /// Output tokens for lines that do not say.
        default_output_len: usize,
    },
}

/// Loads the tokenizer named by `--tokenizer` (`None`: pace's default model, fetched on first use;
/// `dummy:NAME`: the byte-level tokenizer `pace serve --model dummy:NAME` uses).
pub fn load_tokenizer(path: Option<&Path>) -> Result<Tokenizer> {
    if let Some(name) = path.and_then(|p| p.to_str()).and_then(|s| s.strip_prefix("dummy:")) {
        let preset = name.split(':').next().unwrap_or(name);
        let cfg = pace_models::config::LlamaConfig::preset(preset)?;
        return Ok(Tokenizer::byte_level(cfg.vocab_size)?);
    }
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => pace_models::fetch::default_model_path().context("locating the default model for its tokenizer")?,
    };
    Tokenizer::from_path(&path).with_context(|| format!("loading the tokenizer from {}", path.display()))
}

/// Draws random prompts that encode to exactly a given number of tokens.
pub struct RandomText<'a> {
    tokenizer: &'a Tokenizer,
    /// Normal tokens that decode, alone, to non-empty valid text.
    candidates: Vec<u32>,
}

/// Rounds of decode / re-encode / fix-up before giving up on one prompt.
const MAX_ROUNDS: usize = 64;

impl<'a> RandomText<'a> {
    /// Prepares the candidate vocabulary of `tokenizer`.
    pub fn new(tokenizer: &'a Tokenizer) -> Result<Self> {
        let candidates: Vec<u32> = (0..tokenizer.vocab_size() as u32)
            .filter(|&id| !tokenizer.is_special(id))
            .filter(|&id| tokenizer.decode(&[id], true).is_ok_and(|s| !s.trim().is_empty() && !s.contains('\u{fffd}') && !s.contains('\0')))
            .collect();
        if candidates.len() < 16 {
            bail!("the tokenizer has only {} usable normal tokens", candidates.len());
        }
        Ok(Self { tokenizer, candidates })
    }

    fn draw(&self, rng: &mut StdRng, n: usize, into: &mut Vec<u32>) {
        into.extend((0..n).map(|_| self.candidates[rng.random_range(0..self.candidates.len())]));
    }

    /// A text of exactly `n` tokens (`n >= 1`).
    pub fn prompt(&self, n: usize, rng: &mut StdRng) -> Result<String> {
        let n = n.max(1);
        let mut ids = Vec::with_capacity(n + 8);
        self.draw(rng, n, &mut ids);
        for _ in 0..MAX_ROUNDS {
            let text = self.tokenizer.decode(&ids, true)?;
            let again = self.tokenizer.encode(&text, false)?;
            match again.len().cmp(&n) {
                std::cmp::Ordering::Equal => return Ok(text),
                std::cmp::Ordering::Greater => ids = again[..n].to_vec(),
                std::cmp::Ordering::Less => {
                    ids = again;
                    let missing = n - ids.len();
                    self.draw(rng, missing, &mut ids);
                }
            }
        }
        bail!("could not build a prompt of exactly {n} tokens in {MAX_ROUNDS} rounds")
    }
}

/// A length uniform in `[mean * (1 - ratio), mean * (1 + ratio)]`, at least 1.
fn sample_len(mean: usize, ratio: f64, rng: &mut StdRng) -> usize {
    if ratio <= 0.0 || mean == 0 {
        return mean.max(1);
    }
    let lo = ((mean as f64) * (1.0 - ratio)).floor().max(1.0) as usize;
    let hi = ((mean as f64) * (1.0 + ratio)).ceil().max(lo as f64) as usize;
    rng.random_range(lo..=hi)
}

/// `n` prompts from `spec`, reproducible from `seed`.
pub fn load_prompts(spec: &DatasetSpec, tokenizer: &Tokenizer, n: usize, seed: u64) -> Result<Vec<Prompt>> {
    let mut rng = StdRng::seed_from_u64(seed);
    match spec {
        DatasetSpec::Random { input_len, output_len, range_ratio } => {
            if !(0.0..1.0).contains(range_ratio) {
                bail!("--random-range-ratio must be in [0, 1), got {range_ratio}");
            }
            let gen = RandomText::new(tokenizer)?;
            (0..n)
                .map(|_| {
                    let prompt_len = sample_len(*input_len, *range_ratio, &mut rng);
                    let output_len = sample_len(*output_len, *range_ratio, &mut rng);
                    Ok(Prompt { text: gen.prompt(prompt_len, &mut rng)?, prompt_len, output_len })
                })
                .collect()
        }
        DatasetSpec::ShareGpt { path, output_len } => {
            let pool = sharegpt(path, tokenizer, *output_len)?;
            Ok(pick(pool, n, &mut rng))
        }
        DatasetSpec::Jsonl { path, default_output_len } => {
            let pool = jsonl(path, tokenizer, *default_output_len)?;
            Ok(pick(pool, n, &mut rng))
        }
    }
}

/// `n` entries of `pool` in a seeded random order, cycling through reshuffles when it is short.
fn pick(pool: Vec<Prompt>, n: usize, rng: &mut StdRng) -> Vec<Prompt> {
    let mut out = Vec::with_capacity(n);
    let mut order: Vec<usize> = (0..pool.len()).collect();
    while out.len() < n && !pool.is_empty() {
        order.shuffle(rng);
        out.extend(order.iter().take(n - out.len()).map(|&i| pool[i].clone()));
    }
    out
}

fn count(tokenizer: &Tokenizer, text: &str) -> Result<usize> {
    Ok(tokenizer.encode(text, false)?.len())
}

/// Usable ShareGPT conversations, filtered as vLLM does (prompt and reply at least 4 tokens,
/// prompt at most 1024, both together at most 2048).
fn sharegpt(path: &Path, tokenizer: &Tokenizer, output_len: Option<usize>) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(&text).with_context(|| format!("{}: not a ShareGPT JSON array", path.display()))?;
    let mut pool = Vec::new();
    for e in &entries {
        let Some(turns) = e.get("conversations").and_then(|c| c.as_array()) else { continue };
        let field = |t: &serde_json::Value, k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let Some(i) = turns.iter().position(|t| field(t, "from").as_deref() == Some("human")) else { continue };
        let Some(reply) = turns.get(i + 1).filter(|t| field(t, "from").as_deref() == Some("gpt")) else { continue };
        let (Some(prompt), Some(answer)) = (field(&turns[i], "value"), field(reply, "value")) else { continue };
        let prompt_len = count(tokenizer, &prompt)?;
        let reply_len = count(tokenizer, &answer)?;
        let out = output_len.unwrap_or(reply_len);
        if prompt_len < 4 || (output_len.is_none() && reply_len < 4) || prompt_len > 1024 || prompt_len + out > 2048 {
            continue;
        }
        pool.push(Prompt { text: prompt, prompt_len, output_len: out.max(1) });
    }
    if pool.is_empty() {
        bail!("{}: no usable conversation (a human turn followed by a gpt turn, within the length filters)", path.display());
    }
    Ok(pool)
}

fn jsonl(path: &Path, tokenizer: &Tokenizer, default_output_len: usize) -> Result<Vec<Prompt>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut pool = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let prompt = v.get("prompt").and_then(|p| p.as_str()).with_context(|| format!("{}:{}: no \"prompt\" string", path.display(), i + 1))?;
        let output_len = v.get("output_len").or_else(|| v.get("max_tokens")).and_then(|n| n.as_u64()).map_or(default_output_len, |n| n as usize);
        pool.push(Prompt { text: prompt.to_string(), prompt_len: count(tokenizer, prompt)?, output_len: output_len.max(1) });
    }
    if pool.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real default model's tokenizer (fetched once into the cache, as the models tests do).
    fn smollm2() -> Tokenizer {
        load_tokenizer(None).expect("default model tokenizer")
    }

    #[test]
    fn random_prompts_are_exact_in_tokens_and_fresh_unless_seeded() {
        let tok = smollm2();
        let spec = DatasetSpec::Random { input_len: 100, output_len: 20, range_ratio: 0.5 };
        let a = load_prompts(&spec, &tok, 40, 11).unwrap();
        for p in &a {
            assert_eq!(tok.encode(&p.text, false).unwrap().len(), p.prompt_len, "{:?}", p.text);
            assert!((50..=150).contains(&p.prompt_len) && (10..=30).contains(&p.output_len));
        }
        assert_eq!(a, load_prompts(&spec, &tok, 40, 11).unwrap());
        let b = load_prompts(&spec, &tok, 40, 12).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x.text != y.text));
        let exact = DatasetSpec::Random { input_len: 256, output_len: 128, range_ratio: 0.0 };
        for p in load_prompts(&exact, &tok, 20, 3).unwrap() {
            assert_eq!((p.prompt_len, p.output_len), (256, 128));
            assert_eq!(tok.encode(&p.text, false).unwrap().len(), 256);
        }
        let one = DatasetSpec::Random { input_len: 1, output_len: 1, range_ratio: 0.0 };
        assert!(load_prompts(&one, &tok, 20, 3).unwrap().iter().all(|p| tok.encode(&p.text, false).unwrap().len() == 1));
    }

    #[test]
    fn sharegpt_and_jsonl_files() {
        let tok = smollm2();
        let dir = std::env::temp_dir().join(format!("pace-bench-dataset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sg = dir.join("sg.json");
        std::fs::write(
            &sg,
            r#"[{"conversations": [{"from": "human", "value": "Tell me a short story about a cat and a dog."},
                                  {"from": "gpt", "value": "Once upon a time a cat and a dog became the best of friends."}]},
               {"conversations": [{"from": "gpt", "value": "orphan reply"}]},
               {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]"#,
        )
        .unwrap();
        let got = load_prompts(&DatasetSpec::ShareGpt { path: sg.clone(), output_len: None }, &tok, 3, 1).unwrap();
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|p| p.text.starts_with("Tell me") && p.output_len >= 4));
        assert_eq!(got[0].prompt_len, tok.encode(&got[0].text, false).unwrap().len());
        let fixed = load_prompts(&DatasetSpec::ShareGpt { path: sg, output_len: Some(7) }, &tok, 1, 1).unwrap();
        assert_eq!(fixed[0].output_len, 7);
        let jl = dir.join("p.jsonl");
        std::fs::write(&jl, "{\"prompt\": \"one two three\", \"output_len\": 5}\n\n{\"prompt\": \"four\"}\n").unwrap();
        let got = load_prompts(&DatasetSpec::Jsonl { path: jl.clone(), default_output_len: 9 }, &tok, 4, 2).unwrap();
        let mut lens: Vec<usize> = got.iter().map(|p| p.output_len).collect();
        lens.sort();
        assert_eq!(lens, vec![5, 5, 9, 9]);
        std::fs::write(&jl, "{\"text\": 1}\n").unwrap();
        assert!(load_prompts(&DatasetSpec::Jsonl { path: jl, default_output_len: 9 }, &tok, 1, 2).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
