//! Command-line arguments shared by the subcommands that run the model, and loading the model
//! they name (the engine is built from them in [`crate::engine_setup`]).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::DType;
use pace_models::llama::Llama;
use pace_models::loader::{load, parse_device, LoadOptions, LoadedModel, ModelSource};

/// Model, device and engine-shape flags.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Model: a .gguf file, a Hugging Face model directory, or dummy:NAME[:f32|f16|bf16|q4|q8].
    /// Default: SmolLM2-135M-Instruct (Q4_1 GGUF), fetched into $PACE_HOME or ~/.cache/pace on
    /// first use.
    #[arg(long, env = "PACE_MODEL")]
    pub model: Option<String>,
    /// Compute device: auto, cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", env = "PACE_DEVICE")]
    pub device: String,
    /// CPU threads for the model's kernels (default: all cores).
    #[arg(long, env = "PACE_THREADS")]
    pub threads: Option<usize>,
    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256), env = "PACE_BLOCK_SIZE")]
    pub block_size: u32,
    /// KV-cache blocks (overrides --kv-cache-memory and --gpu-memory-utilization).
    #[arg(long, visible_alias = "num-gpu-blocks-override", env = "PACE_KV_CACHE_BLOCKS")]
    pub kv_cache_blocks: Option<usize>,
    /// Memory for the KV cache, e.g. 2GiB or 512MiB. Default: 2GiB on the CPU; on a GPU, what
    /// --gpu-memory-utilization leaves after the weights and the activations of the largest step.
    #[arg(long, value_parser = parse_bytes, env = "PACE_KV_CACHE_MEMORY")]
    pub kv_cache_memory: Option<u64>,
    /// Share of the GPU's memory pace may take in all (weights, activations, KV cache), as vLLM's
    /// flag: sizes the KV cache on a GPU when neither --kv-cache-blocks nor --kv-cache-memory is
    /// given.
    #[arg(long, default_value_t = 0.9, value_parser = parse_fraction, env = "PACE_GPU_MEMORY_UTILIZATION")]
    pub gpu_memory_utilization: f64,
    /// KV-cache element type: auto (f16 on the CPU, bf16 on a GPU), f32, f16 or bf16.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto, env = "PACE_KV_CACHE_DTYPE")]
    pub kv_cache_dtype: KvCacheDtype,
    /// Longest sequence (prompt + output) served; default: the model's context length.
    #[arg(long, env = "PACE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Most sequences in one step.
    #[arg(long, default_value_t = 256, env = "PACE_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Most tokens in one step (prefill chunks + decodes); default 512 on the CPU, 8192 on a GPU.
    #[arg(long, visible_alias = "max-num-batched-tokens", env = "PACE_MAX_BATCH_TOKENS")]
    pub max_batch_tokens: Option<usize>,
    /// Seed of dummy weights.
    #[arg(long, default_value_t = 0, env = "PACE_WEIGHT_SEED")]
    pub weight_seed: u64,
    /// Compute type of dense weights and activations, as vLLM's flag: auto (float32 on the CPU;
    /// on a GPU the checkpoint's torch_dtype, bf16 when it names none), float32 (float),
    /// float16 (half) or bfloat16. The CPU path computes in float32 only; quantized GGUF
    /// weights take float32 activations.
    #[arg(long, value_enum, default_value_t = ModelDtype::Auto, env = "PACE_DTYPE")]
    pub dtype: ModelDtype,
    /// Tokenizer to use instead of the model's own, as vLLM's flag: a .gguf file, a Hugging
    /// Face model directory or a tokenizer.json (its chat template comes with it).
    #[arg(long, env = "PACE_TOKENIZER")]
    pub tokenizer: Option<std::path::PathBuf>,
    /// Reuse the KV blocks of prefixes other requests computed (on by default, as in vLLM v1;
    /// `--enable-prefix-caching false` or `--no-enable-prefix-caching` turns it off).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "PACE_ENABLE_PREFIX_CACHING")]
    pub enable_prefix_caching: bool,
    /// Turn prefix caching off (vLLM's spelling).
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
}

impl EngineArgs {
    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        self.enable_prefix_caching && !self.no_enable_prefix_caching
    }
}

/// `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelDtype {
    Auto,
    #[value(alias = "float", alias = "fp32")]
    Float32,
    #[value(alias = "half", alias = "fp16")]
    Float16,
    #[value(alias = "bf16")]
    Bfloat16,
}

impl ModelDtype {
    /// The candle type asked for (`None`: auto).
    pub fn candle(self) -> Option<DType> {
        match self {
            Self::Auto => None,
            Self::Float32 => Some(DType::F32),
            Self::Float16 => Some(DType::F16),
            Self::Bfloat16 => Some(DType::BF16),
        }
    }
}

/// `--kv-cache-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    // f16 on the CPU, bf16 on a GPU.
    Auto,
    F32,
    F16,
    Bf16,
}

/// Parses a byte size with an optional unit (B, KiB, MiB, GiB, KB, MB, GB).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("'{s}' is not a size like 2GiB"))?;
    let mul = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' in '{s}'")),
    };
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("'{s}' must be a positive size"));
    }
    Ok((v * mul) as u64)
}

pub fn parse_fraction(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("'{s}' is not a fraction in (0, 1]")),
    }
}

/// Builds rayon's global pool once (the kernels' threads). Idle workers sleep rather than spin.
/// A process that loads a second model (in-process tests) keeps the pool it has.
pub fn init_threads(threads: Option<usize>) -> Result<()> {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if n == 0 {
        bail!("--threads must be at least 1");
    }
    let mut result = Ok(());
    BUILT.call_once(|| {
        result = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("pace-kernel-{i}"))
            .build_global()
            .context("starting the kernel thread pool");
    });
    if result.is_ok() && rayon::current_num_threads() != n {
        tracing::warn!("the kernel thread pool already has {} threads; --threads {n} is not applied", rayon::current_num_threads());
    }
    result
}

impl EngineArgs {
    /// Loads the model named by the flags.
    pub fn load(&self) -> Result<LoadedModel> {
        init_threads(self.threads)?;
        let device = parse_device(&self.device)?;
        let source = ModelSource::parse(self.model.as_deref())?;
        tracing::info!("loading {source:?} on {device:?}");
        let t0 = Instant::now();
        let opts = LoadOptions {
            max_model_len: self.max_model_len,
            seed: self.weight_seed,
            dtype: self.dtype.candle(),
            tokenizer: self.tokenizer.clone(),
            ..LoadOptions::on(device)
        };
        let m = load(&source, &opts)?;
        tracing::info!("loaded {} in {:.1} s", m.description, t0.elapsed().as_secs_f64());
        Ok(m)
    }

    /// The KV cache's element type for `model`'s device.
    pub fn kv_dtype(&self, model: &Llama) -> DType {
        match self.kv_cache_dtype {
            KvCacheDtype::F32 => DType::F32,
            KvCacheDtype::F16 => DType::F16,
            KvCacheDtype::Bf16 => DType::BF16,
            KvCacheDtype::Auto if model.device().is_cpu() => DType::F16,
            KvCacheDtype::Auto => DType::BF16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_and_sizes_parse_or_say_why() {
        assert_eq!(parse_fraction("0.9"), Ok(0.9));
        assert!(parse_fraction("0").is_err() && parse_fraction("1.5").is_err() && parse_fraction("x").is_err());
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
    }
}
