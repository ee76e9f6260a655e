//! Resolves `--model` and `--device` into a loaded model, tokenizer and chat template.
//!
//! `--model` accepts: nothing (the default model, fetched on first use), a `.gguf` file, a
//! Hugging Face model directory (`config.json`, `*.safetensors`, `tokenizer.json`,
//! `tokenizer_config.json`), a Hugging Face id `org/name[:FILE.gguf]` found in the local Hugging
//! Face cache ([`crate::hf_cache`]), or `dummy:NAME[:STORAGE]` — random weights of a named shape
//! (`STORAGE`: `f32`, `f16`, `bf16`, `q4` or `q8`; default f32 on the CPU, bf16 on a GPU).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use pace_kernels::quant::QFormat;

use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::error::{Error, Result};
use crate::fetch;
use crate::gguf::{GgmlType, GgufFile};
use crate::llama::Llama;
use crate::tokenizer::Tokenizer;
use crate::weights::{DummyStorage, WeightLoader};

/// Where the model comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// The default model (see [`crate::fetch`]).
    Default,
    /// A GGUF file.
    Gguf(PathBuf),
    /// A Hugging Face model directory.
    HfDir(PathBuf),
    /// A model by Hugging Face id, resolved in the local Hugging Face cache.
    Hub {
        /// The id as given (`org/name`, without a `:FILE.gguf`): the name it is served under.
        id: String,
        /// What it resolved to: [`ModelSource::Gguf`] or [`ModelSource::HfDir`].
        inner: Box<ModelSource>,
    },
    /// Random weights of a named shape.
    Dummy {
        /// Preset name (see [`LlamaConfig::PRESETS`]).
        name: String,
        /// Storage; `None` picks by device.
        storage: Option<DummyStorage>,
    },
}

impl ModelSource {
    /// Parses a `--model` value (`None`: the default model).
    pub fn parse(spec: Option<&str>) -> Result<Self> {
        let Some(spec) = spec.filter(|s| !s.is_empty()) else { return Ok(Self::Default) };
        if let Some(rest) = spec.strip_prefix("dummy:") {
            let (name, storage) = match rest.split_once(':') {
                Some((n, s)) => (n, Some(parse_dummy_storage(s)?)),
                None => (rest, None),
            };
            LlamaConfig::preset(name)?;
            return Ok(Self::Dummy { name: name.to_string(), storage });
        }
        let path = PathBuf::from(spec);
        if path.is_dir() {
            if !path.join("config.json").is_file() {
                return Err(Error::Invalid(format!("{spec} is a directory without config.json")));
            }
            return Ok(Self::HfDir(path));
        }
        if path.is_file() {
            return Ok(Self::Gguf(path));
        }
        if crate::hf_cache::looks_like_id(spec) {
            return Self::from_hub(spec, &crate::hf_cache::hub_dirs());
        }
        Err(Error::Invalid(format!(
            "--model {spec}: no such file or directory (give a .gguf file, a Hugging Face model directory, \
             a Hugging Face id org/name[:FILE.gguf] in the local cache, or dummy:NAME)"
        )))
    }

    /// Resolves a Hugging Face id in the hub caches `dirs` (the first holding it wins).
    pub fn from_hub(spec: &str, dirs: &[PathBuf]) -> Result<Self> {
        let inner = match crate::hf_cache::resolve(spec, dirs)? {
            crate::hf_cache::Resolved::HfDir(d) => Self::HfDir(d),
            crate::hf_cache::Resolved::Gguf(f) => Self::Gguf(f),
        };
        let id = spec.split_once(':').map_or(spec, |(repo, _)| repo).to_string();
        Ok(Self::Hub { id, inner: Box::new(inner) })
    }

    /// The file or directory the weights come from (the resolved one for a Hugging Face id).
    pub fn local(&self) -> &Self {
        match self {
            Self::Hub { inner, .. } => inner.local(),
            other => other,
        }
    }

    /// The name the model is served under by default.
    pub fn default_name(&self) -> String {
        match self {
            Self::Default => fetch::DEFAULT_MODEL_NAME.to_string(),
            Self::Gguf(p) => p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
            Self::HfDir(p) => p.canonicalize().ok().and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned())).unwrap_or_else(|| "model".into()),
            Self::Dummy { name, .. } => format!("dummy-{name}"),
            Self::Hub { id, .. } => id.clone(),
        }
    }
}

fn parse_dummy_storage(s: &str) -> Result<DummyStorage> {
    Ok(match s {
        "f32" => DummyStorage::Dense(DType::F32),
        "f16" => DummyStorage::Dense(DType::F16),
        "bf16" => DummyStorage::Dense(DType::BF16),
        "q4" => DummyStorage::Quant(QFormat::Q4),
        "q8" => DummyStorage::Quant(QFormat::Q8),
        other => return Err(Error::Invalid(format!("dummy storage '{other}' (use f32, f16, bf16, q4 or q8)"))),
    })
}

/// Parses `--device`: `auto`, `cpu`, `cuda` or `cuda:N`. `auto` picks the first GPU when one is
/// usable and says so; asking for CUDA where there is none is an error that says why. A CUDA
/// device is readied for pace here (its kernels loaded), so a broken installation fails at start.
pub fn parse_device(spec: &str) -> Result<Device> {
    let cuda = |n: usize| -> Result<Device> {
        if !pace_kernels::device::CUDA_BUILT {
            return Err(Error::Invalid(format!(
                "--device {spec}: this pace binary is the CPU build; GPUs need the CUDA build of \
                 pace (cargo build --release --features cuda -p pace-server, or the image of \
                 deploy/Dockerfile.cuda)"
            )));
        }
        // One stream for every thread (pace_kernels::device::open_cuda), kernels loaded: a broken
        // installation fails here, at start-up.
        let dev = pace_kernels::device::open_cuda(n)
            .map_err(|e| Error::Invalid(format!("--device {spec}: CUDA device {n} is not usable ({})", first_line(&e.to_string()))))?;
        let name = pace_kernels::device::describe(&dev).unwrap_or_else(|| format!("CUDA device {n}"));
        tracing::info!("using {name}");
        Ok(dev)
    };
    match spec {
        "cpu" => Ok(Device::Cpu),
        "auto" => {
            if !pace_kernels::device::CUDA_BUILT {
                tracing::info!("--device auto: the CPU build of pace; using the CPU");
                return Ok(Device::Cpu);
            }
            match cuda(0) {
                Ok(d) => Ok(d),
                Err(e) => {
                    tracing::info!("--device auto: no usable GPU ({e}); using the CPU");
                    Ok(Device::Cpu)
                }
            }
        }
        "cuda" | "gpu" => cuda(0),
        s => match s.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => cuda(n),
            None => Err(Error::Invalid(format!("--device {s}: use auto, cpu, cuda or cuda:N"))),
        },
    }
}

/// candle's CUDA errors carry a backtrace after their first line.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim()
}

/// Options for [`load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Compute device.
    pub device: Device,
    /// Longest sequence to support (prompt + output); `None`: the model's own limit.
    pub max_model_len: Option<usize>,
    /// Seed of dummy weights.
    pub seed: u64,
    /// Compute type of dense weights and activations (`--dtype`); `None`: float32 on the CPU,
    /// the checkpoint's `torch_dtype` (bf16 when it names none) on a GPU.
    pub dtype: Option<DType>,
    /// A tokenizer to use instead of the model's own (`--tokenizer`): a `.gguf` file, a
    /// Hugging Face model directory or a `tokenizer.json`.
    pub tokenizer: Option<PathBuf>,
}

impl LoadOptions {
    /// Defaults on `device`: the model's own length, dtype and tokenizer, weight seed 0.
    pub fn on(device: Device) -> Self {
        Self { device, max_model_len: None, seed: 0, dtype: None, tokenizer: None }
    }
}

/// A model ready to run, with its text front end.
pub struct LoadedModel {
    /// The model.
    pub model: Llama,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template.
    pub chat_template: ChatTemplate,
    /// Default served name.
    pub name: String,
    /// Longest sequence supported.
    pub max_model_len: usize,
    /// What was loaded, for the log.
    pub description: String,
}

/// Loads the model named by `source`.
pub fn load(source: &ModelSource, opts: &LoadOptions) -> Result<LoadedModel> {
    let dev = &opts.device;
    if dev.is_cpu() && opts.dtype.is_some_and(|d| d != DType::F32) {
        return Err(Error::Unsupported(format!(
            "--dtype {:?}: pace's CPU path computes in float32 (a quantized GGUF saves the memory); float16 and bfloat16 are for --device cuda",
            opts.dtype.unwrap_or(DType::F32)
        )));
    }
    let (cfg, loader, tokenizer, description) = match source.local() {
        ModelSource::Hub { .. } => unreachable!("local() resolves a hub id"),
        ModelSource::Default => {
            let path = fetch::default_model_path()?;
            gguf_parts(&path, dev, opts.dtype)?
        }
        ModelSource::Gguf(p) => gguf_parts(p, dev, opts.dtype)?,
        ModelSource::HfDir(dir) => {
            let text = read(&dir.join("config.json"))?;
            let cfg = LlamaConfig::from_hf_json(&text)?;
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(Error::Invalid(format!("{}: no *.safetensors files", dir.display())));
            }
            let dtype = if dev.is_cpu() { DType::F32 } else { opts.dtype.unwrap_or_else(|| hf_dtype(&text)) };
            let loader = WeightLoader::safetensors(&files, dev.clone(), dtype)?;
            let tokenizer = Tokenizer::from_file(dir)?;
            (cfg, loader, tokenizer, format!("{} ({} safetensors files, {dtype:?})", dir.display(), files.len()))
        }
        ModelSource::Dummy { name, storage } => {
            let cfg = LlamaConfig::preset(name)?;
            let storage = storage.unwrap_or(if dev.is_cpu() { DummyStorage::Dense(DType::F32) } else { DummyStorage::Dense(DType::BF16) });
            let dtype = match (dev.is_cpu(), storage) {
                (true, _) => DType::F32,
                (false, DummyStorage::Dense(d)) => opts.dtype.unwrap_or(d),
                (false, DummyStorage::Quant(_)) => quantized_dtype(opts.dtype)?,
            };
            let loader = WeightLoader::dummy(opts.seed, storage, dev.clone(), dtype);
            let tokenizer = Tokenizer::byte_level(cfg.vocab_size)?;
            (cfg, loader, tokenizer, format!("dummy {name} ({storage:?}, seed {})", opts.seed))
        }
    };
    let tokenizer = match &opts.tokenizer {
        Some(p) => Tokenizer::from_path(p)?,
        None => tokenizer,
    };
    if !dev.is_cpu() && cfg.head_dim != 64 && cfg.head_dim != 128 {
        return Err(Error::Unsupported(format!("head size {}: pace's CUDA attention kernels take head sizes 64 and 128 (use --device cpu)", cfg.head_dim)));
    }
    let max_model_len = opts.max_model_len.unwrap_or(cfg.max_position_embeddings);
    if max_model_len == 0 {
        return Err(Error::Invalid("--max-model-len must be positive".into()));
    }
    if max_model_len > cfg.max_position_embeddings {
        return Err(Error::Invalid(format!("--max-model-len {max_model_len} is longer than the model's context length ({})", cfg.max_position_embeddings)));
    }
    // Every id the tokenizer can produce (and the API accepts) must have an embedding row.
    if tokenizer.vocab_size() > cfg.vocab_size {
        return Err(Error::Format(format!(
            "the tokenizer has {} tokens but the model's vocabulary has {}: ids past it would reach the model",
            tokenizer.vocab_size(),
            cfg.vocab_size
        )));
    }
    let model = Llama::load(&cfg, &loader, max_model_len)?;
    // Weights were copied from this thread; the engine runs on another one. Its launches share
    // this device's one stream, so they would be ordered after the copies anyway; waiting here
    // also makes a failed copy fail the load.
    pace_kernels::device::synchronize(dev)?;
    let chat_template = ChatTemplate::for_tokenizer(&tokenizer)?;
    Ok(LoadedModel { model, tokenizer, chat_template, name: source.default_name(), max_model_len, description })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// The checkpoint's `torch_dtype` for GPU compute (bf16 unless it says f16).
fn hf_dtype(config_json: &str) -> DType {
    let v: serde_json::Value = serde_json::from_str(config_json).unwrap_or_default();
    match v.get("torch_dtype").and_then(|d| d.as_str()) {
        Some("float16") => DType::F16,
        Some("float32") => DType::F32,
        _ => DType::BF16,
    }
}

/// Quantized weights take float32 activations (pace's CPU kernels and candle's GPU ones alike).
fn quantized_dtype(asked: Option<DType>) -> Result<DType> {
    match asked {
        None | Some(DType::F32) => Ok(DType::F32),
        Some(d) => Err(Error::Unsupported(format!("--dtype {d:?}: a quantized model computes in float32; leave --dtype at auto"))),
    }
}

fn gguf_parts(path: &Path, dev: &Device, asked: Option<DType>) -> Result<(LlamaConfig, WeightLoader, Tokenizer, String)> {
    let g = Arc::new(GgufFile::open(path)?);
    let cfg = LlamaConfig::from_gguf(&g)?;
    let tokenizer = Tokenizer::from_gguf(&g)?;
    let quantized = g.tensors.iter().any(|t| !matches!(t.dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16));
    // A dense GGUF on a GPU computes in bf16 unless --dtype says otherwise.
    let dtype = if quantized {
        quantized_dtype(asked)?
    } else if dev.is_cpu() {
        DType::F32
    } else {
        asked.unwrap_or(DType::BF16)
    };
    let desc = format!("{} (GGUF v{}, {} tensors)", path.display(), g.version, g.tensors.len());
    Ok((cfg, WeightLoader::gguf(g, dev.clone(), dtype), tokenizer, desc))
}
