//! Model hyper-parameters, read from GGUF metadata, a Hugging Face `config.json`, or a named
//! preset for dummy weights.

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// Llama-3 style frequency-dependent RoPE scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Llama3RopeScaling {
    /// Overall scale factor for low frequencies.
    pub factor: f64,
    /// Wavelengths longer than `original / low_freq_factor` are scaled fully.
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original / high_freq_factor` are not scaled.
    pub high_freq_factor: f64,
    /// Context length the model was pretrained with.
    pub original_max_position_embeddings: usize,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (0, d/2), (1, d/2+1), ...: Hugging Face checkpoints.
    Halves,
    /// Pairs (0, 1), (2, 3), ...: GGUF files, whose converter permuted the q/k rows for it.
    Interleaved,
}

/// Hyper-parameters of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Model width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f64,
    /// Optional Llama-3 RoPE scaling.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// Context length the model supports.
    pub max_position_embeddings: usize,
    /// Whether the output projection reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// RoPE dimension pairing.
    pub rope_style: RopeStyle,
}

impl LlamaConfig {
    /// Reads a GGUF file's `llama.*` metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.get_str("general.architecture").unwrap_or("llama");
        if arch != "llama" && arch != "mistral" {
            return Err(Error::Unsupported(format!("GGUF architecture '{arch}' (pace serves Llama-family models)")));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = g.get_u64(&key("embedding_length"))? as usize;
        let num_heads = g.get_u64(&key("attention.head_count"))? as usize;
        let num_kv_heads = match g.get(&key("attention.head_count_kv")) {
            Some(v) => v.as_u64().ok_or_else(|| Error::Format("head_count_kv is not an integer".into()))? as usize,
            None => num_heads,
        };
        let head_dim = match g.get(&key("attention.key_length")).and_then(|v| v.as_u64()) {
            Some(d) => d as usize,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        let vocab_size = match g.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
            Some(v) => v as usize,
            None => g
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or_else(|| Error::Format("no vocabulary size in the GGUF metadata".into()))?,
        };
        let cfg = Self {
            hidden_size,
            intermediate_size: g.get_u64(&key("feed_forward_length"))? as usize,
            num_layers: g.get_u64(&key("block_count"))? as usize,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: g.get(&key("attention.layer_norm_rms_epsilon")).and_then(|v| v.as_f64()).unwrap_or(1e-5),
            rope_theta: g.get(&key("rope.freq_base")).and_then(|v| v.as_f64()).unwrap_or(10_000.0),
            // Llama-3.1 GGUFs carry their scaling as a `rope_freqs.weight` tensor instead.
            rope_scaling: None,
            max_position_embeddings: g.get(&key("context_length")).and_then(|v| v.as_u64()).unwrap_or(4096) as usize,
            tie_word_embeddings: g.tensor("output.weight").is_none(),
            rope_style: RopeStyle::Interleaved,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str) -> Result<Self> {
        #[derive(Deserialize)]
        struct Hf {
            #[serde(default)]
            architectures: Vec<String>,
            hidden_size: usize,
            intermediate_size: usize,
            num_hidden_layers: usize,
            num_attention_heads: usize,
            num_key_value_heads: Option<usize>,
            head_dim: Option<usize>,
            vocab_size: usize,
            #[serde(default = "default_eps")]
            rms_norm_eps: f64,
            #[serde(default = "default_theta")]
            rope_theta: f64,
            rope_scaling: Option<serde_json::Value>,
            #[serde(default = "default_max_pos")]
            max_position_embeddings: usize,
            #[serde(default)]
            tie_word_embeddings: bool,
        }
        fn default_eps() -> f64 {
            1e-5
        }
        fn default_theta() -> f64 {
            10_000.0
        }
        fn default_max_pos() -> usize {
            4096
        }
        let hf: Hf = serde_json::from_str(text).map_err(|e| Error::Format(format!("config.json: {e}")))?;
        if let Some(a) = hf.architectures.iter().find(|a| !matches!(a.as_str(), "LlamaForCausalLM" | "MistralForCausalLM")) {
            return Err(Error::Unsupported(format!("architecture {a} (pace serves Llama-family models)")));
        }
        let rope_scaling = match hf.rope_scaling {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("");
                if kind != "llama3" {
                    return Err(Error::Unsupported(format!("rope_scaling type '{kind}'")));
                }
                Some(serde_json::from_value(v).map_err(|e| Error::Format(format!("rope_scaling: {e}")))?)
            }
        };
        let cfg = Self {
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads: hf.num_key_value_heads.unwrap_or(hf.num_attention_heads),
            head_dim: hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1)),
            vocab_size: hf.vocab_size,
            rms_norm_eps: hf.rms_norm_eps,
            rope_theta: hf.rope_theta,
            rope_scaling,
            max_position_embeddings: hf.max_position_embeddings,
            tie_word_embeddings: hf.tie_word_embeddings,
            rope_style: RopeStyle::Halves,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Shapes of well-known models, for `dummy:NAME` random weights.
    pub fn preset(name: &str) -> Result<Self> {
        let base = |hidden, inter, layers, heads, kv, vocab, theta, tie, max| Self {
            hidden_size: hidden,
            intermediate_size: inter,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv,
            head_dim: hidden / heads,
            vocab_size: vocab,
            rms_norm_eps: 1e-5,
            rope_theta: theta,
            rope_scaling: None,
            max_position_embeddings: max,
            tie_word_embeddings: tie,
            rope_style: RopeStyle::Halves,
        };
        let llama3_scaling = Llama3RopeScaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192 };
        Ok(match name {
            "smollm2-135m" => base(576, 1536, 30, 9, 3, 49152, 100_000.0, true, 8192),
            "smollm2-360m" => base(960, 2560, 32, 15, 5, 49152, 100_000.0, true, 8192),
            "tinyllama-1.1b" => base(2048, 5632, 22, 32, 4, 32000, 10_000.0, false, 2048),
            "llama-3.2-1b" => Self { rope_scaling: Some(llama3_scaling), ..base(2048, 8192, 16, 32, 8, 128_256, 500_000.0, true, 131_072) },
            "llama-3-8b" => base(4096, 14336, 32, 32, 8, 128_256, 500_000.0, false, 8192),
            "llama-3.1-8b" => Self {
                rope_scaling: Some(Llama3RopeScaling { factor: 8.0, ..llama3_scaling }),
                ..base(4096, 14336, 32, 32, 8, 128_256, 500_000.0, false, 131_072)
            },
            other => return Err(Error::Invalid(format!("unknown dummy model '{other}'; known: {}", Self::PRESETS.join(", ")))),
        })
    }

    /// Names accepted by [`LlamaConfig::preset`].
    pub const PRESETS: &'static [&'static str] = &["smollm2-135m", "smollm2-360m", "tinyllama-1.1b", "llama-3.2-1b", "llama-3-8b", "llama-3.1-8b"];

    /// Checks the shape is usable; a malformed file gives an error here, not a panic later.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Format(m));
        if self.hidden_size == 0 || self.num_layers == 0 || self.num_heads == 0 || self.num_kv_heads == 0 {
            return bad(format!("degenerate model shape {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!("{} heads are not a multiple of {} KV heads", self.num_heads, self.num_kv_heads));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 256 {
            return bad(format!("head dimension {} (must be even and at most 256)", self.head_dim));
        }
        if self.vocab_size == 0 || self.intermediate_size == 0 {
            return bad("empty vocabulary or MLP".into());
        }
        const LIMIT: usize = 1 << 20;
        if [self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers].iter().any(|&v| v > LIMIT) {
            return bad(format!("implausibly large model shape {self:?}"));
        }
        // The RoPE tables are sized from the context length (unless --max-model-len is smaller).
        if self.max_position_embeddings == 0 || self.max_position_embeddings > LIMIT {
            return bad(format!("context length {} (pace takes 1 to {LIMIT} tokens)", self.max_position_embeddings));
        }
        Ok(())
    }

    /// RoPE inverse frequencies for one head (`head_dim / 2` values), Llama-3 scaling applied.
    pub fn rope_inv_freqs(&self) -> Vec<f64> {
        let d = self.head_dim;
        let mut f: Vec<f64> = (0..d / 2).map(|i| 1.0 / self.rope_theta.powf(2.0 * i as f64 / d as f64)).collect();
        if let Some(s) = &self.rope_scaling {
            let low_wavelen = s.original_max_position_embeddings as f64 / s.low_freq_factor;
            let high_wavelen = s.original_max_position_embeddings as f64 / s.high_freq_factor;
            for freq in f.iter_mut() {
                let wavelen = 2.0 * std::f64::consts::PI / *freq;
                *freq = if wavelen < high_wavelen {
                    *freq
                } else if wavelen > low_wavelen {
                    *freq / s.factor
                } else {
                    let smooth = (s.original_max_position_embeddings as f64 / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * *freq / s.factor + smooth * *freq
                };
            }
        }
        f
    }

    /// Parameters (weights) in the model.
    pub fn num_params(&self) -> usize {
        let attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads);
        let mlp = 3 * self.hidden_size * self.intermediate_size;
        let embed = self.vocab_size * self.hidden_size * if self.tie_word_embeddings { 1 } else { 2 };
        self.num_layers * (attn + mlp + 2 * self.hidden_size) + embed + self.hidden_size
    }
}
