//! Weight loading: one interface over GGUF files, Hugging Face safetensors and random "dummy"
//! weights, producing the format-hiding [`Linear`] layers the model is built from.
//!
//! Quantized GGUF weights become pace's CPU kernels' layout on the CPU and candle quantized
//! tensors on a GPU; dense weights become tensors in the compute dtype (f32 on the CPU).

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use pace_kernels::quant::{ggml_dequantize, QFormat, QuantMatrix};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::linear::Linear;

/// A model tensor, named independently of the file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorId {
    /// Token embedding.
    Embed,
    /// Final RMSNorm.
    OutputNorm,
    /// Output projection (absent when tied to the embedding).
    Output,
    /// Per-layer tensors.
    Layer(usize, LayerTensor),
    /// Llama-3.1 RoPE frequency factors (GGUF only).
    RopeFreqs,
}

/// Tensors of one transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    O,
    FfnNorm,
    Gate,
    Up,
    Down,
}

impl TensorId {
    fn gguf_name(self) -> String {
        use LayerTensor::*;
        match self {
            Self::Embed => "token_embd.weight".into(),
            Self::OutputNorm => "output_norm.weight".into(),
            Self::Output => "output.weight".into(),
            Self::RopeFreqs => "rope_freqs.weight".into(),
            Self::Layer(i, t) => {
                let n = match t {
                    AttnNorm => "attn_norm",
                    Q => "attn_q",
                    K => "attn_k",
                    V => "attn_v",
                    O => "attn_output",
                    FfnNorm => "ffn_norm",
                    Gate => "ffn_gate",
                    Up => "ffn_up",
                    Down => "ffn_down",
                };
                format!("blk.{i}.{n}.weight")
            }
        }
    }

    fn hf_name(self) -> String {
        use LayerTensor::*;
        match self {
            Self::Embed => "model.embed_tokens.weight".into(),
            Self::OutputNorm => "model.norm.weight".into(),
            Self::Output => "lm_head.weight".into(),
            Self::RopeFreqs => "rope_freqs".into(),
            Self::Layer(i, t) => {
                let n = match t {
                    AttnNorm => "input_layernorm",
                    Q => "self_attn.q_proj",
                    K => "self_attn.k_proj",
                    V => "self_attn.v_proj",
                    O => "self_attn.o_proj",
                    FfnNorm => "post_attention_layernorm",
                    Gate => "mlp.gate_proj",
                    Up => "mlp.up_proj",
                    Down => "mlp.down_proj",
                };
                format!("model.layers.{i}.{n}.weight")
            }
        }
    }
}

/// How dummy weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DummyStorage {
    /// Dense in this dtype.
    Dense(DType),
    /// Quantized to pace's CPU layout (CPU only).
    Quant(QFormat),
}

enum Source {
    Gguf(Arc<GgufFile>),
    Safetensors(candle_core::safetensors::MmapedSafetensors),
    Dummy { seed: u64, storage: DummyStorage },
}

/// The token embedding.
#[derive(Clone)]
pub enum Embedding {
    /// Quantized rows, gathered on the host (CPU).
    Quant(Arc<QuantMatrix>),
    /// Dense `vocab x hidden`.
    Dense(Tensor),
}

impl Embedding {
    /// Looks up `ids` (given on the host and as a device tensor); returns `tokens x hidden`.
    pub fn forward(&self, ids_host: &[u32], ids: &Tensor, device: &Device) -> Result<Tensor> {
        match self {
            Self::Quant(m) => {
                let mut out = vec![0f32; ids_host.len() * m.cols()];
                m.gather_rows(ids_host, &mut out);
                Ok(Tensor::from_vec(out, (ids_host.len(), m.cols()), device)?)
            }
            Self::Dense(t) => Ok(t.index_select(ids, 0)?),
        }
    }
}

/// Reads model tensors from one source onto one device.
pub struct WeightLoader {
    src: Source,
    device: Device,
    dtype: DType,
}

impl WeightLoader {
    /// Weights from an opened GGUF file. Dense tensors are loaded as `dtype`.
    pub fn gguf(file: Arc<GgufFile>, device: Device, dtype: DType) -> Self {
        Self { src: Source::Gguf(file), device, dtype }
    }

    /// Weights from Hugging Face safetensors files, loaded as `dtype`.
    pub fn safetensors(paths: &[PathBuf], device: Device, dtype: DType) -> Result<Self> {
        // SAFETY: the files are memory-mapped read-only and must not change while pace runs;
        // the safetensors crate validates the header and every tensor's byte range.
        let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(paths) }.map_err(|e| Error::Format(format!("safetensors: {e}")))?;
        Ok(Self { src: Source::Safetensors(st), device, dtype })
    }

    /// Random weights (seeded, identical on every device) of the model's shape.
    pub fn dummy(seed: u64, storage: DummyStorage, device: Device, dtype: DType) -> Self {
        Self { src: Source::Dummy { seed, storage }, device, dtype }
    }

    /// The compute device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Dtype of dense tensors and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    fn gguf_info<'a>(g: &'a GgufFile, id: TensorId, shape: &[usize]) -> Result<&'a TensorInfo> {
        let name = id.gguf_name();
        let info = g.tensor(&name).ok_or_else(|| Error::Format(format!("GGUF tensor {name} is missing")))?;
        if info.shape() != shape {
            return Err(Error::Format(format!("GGUF tensor {name} has shape {:?}, expected {shape:?}", info.shape())));
        }
        Ok(info)
    }

    fn st_tensor(&self, st: &candle_core::safetensors::MmapedSafetensors, id: TensorId, shape: &[usize]) -> Result<Tensor> {
        let name = id.hf_name();
        let t = st.load(&name, &Device::Cpu).map_err(|e| Error::Format(format!("safetensors tensor {name}: {e}")))?;
        if t.dims() != shape {
            return Err(Error::Format(format!("tensor {name} has shape {:?}, expected {shape:?}", t.dims())));
        }
        Ok(t.to_dtype(self.dtype)?.to_device(&self.device)?)
    }

    fn dummy_values(seed: u64, id: TensorId, n: usize, std: f32) -> Vec<f32> {
        // A deterministic stream per tensor, generated in parallel chunks with their own seeds,
        // so the values do not depend on the thread count or the device.
        let tag = format!("{id:?}");
        let base = tag.bytes().fold(seed ^ 0x9E37_79B9_7F4A_7C15, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3));
        let a = std * 3f32.sqrt();
        const CHUNK: usize = 1 << 16;
        let mut out = vec![0f32; n];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
            let mut rng = SmallRng::seed_from_u64(base.wrapping_add(i as u64));
            for v in c {
                *v = (rng.random::<f32>() * 2.0 - 1.0) * a;
            }
        });
        out
    }

    /// A `out x in` projection.
    pub fn linear(&self, id: TensorId, out: usize, inp: usize) -> Result<Linear> {
        match &self.src {
            Source::Gguf(g) => {
                let info = Self::gguf_info(g, id, &[out, inp])?;
                self.gguf_linear(g, info, out, inp)
            }
            Source::Safetensors(st) => Ok(Linear::Dense(self.st_tensor(st, id, &[out, inp])?)),
            Source::Dummy { seed, storage } => {
                let v = Self::dummy_values(*seed, id, out * inp, 0.02);
                match storage {
                    DummyStorage::Quant(f) if self.device.is_cpu() => {
                        Ok(Linear::Quant(Arc::new(QuantMatrix::quantize(*f, &v, out, inp).map_err(|e| Error::Format(e.to_string()))?)))
                    }
                    DummyStorage::Quant(_) => Err(Error::Invalid("quantized dummy weights run on the CPU only".into())),
                    DummyStorage::Dense(dt) => Ok(Linear::Dense(host_tensor(v, (out, inp), *dt)?.to_device(&self.device)?.to_dtype(self.dtype)?)),
                }
            }
        }
    }

    fn gguf_linear(&self, g: &GgufFile, info: &TensorInfo, out: usize, inp: usize) -> Result<Linear> {
        let data = g.tensor_data(info);
        match info.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Ok(Linear::Dense(self.gguf_dense(g, info)?)),
            q if self.device.is_cpu() => {
                let m = QuantMatrix::from_ggml(&info.name, candle_dtype(q), data, out, inp).map_err(|e| Error::Format(e.to_string()))?;
                Ok(Linear::Quant(Arc::new(m)))
            }
            q => {
                let qt = self.candle_qtensor(info, q, data, out, inp)?;
                Ok(Linear::CandleQuant(Arc::new(QMatMul::from_arc(Arc::new(qt))?), out, inp))
            }
        }
    }

    fn candle_qtensor(&self, info: &TensorInfo, q: GgmlType, data: &[u8], out: usize, inp: usize) -> Result<QTensor> {
        let storage =
            QStorage::from_data(Cow::Owned(data.to_vec()), &self.device, candle_dtype(q)).map_err(|e| Error::Format(format!("{}: {e}", info.name)))?;
        Ok(QTensor::new(storage, (out, inp))?)
    }

    fn gguf_dense(&self, g: &GgufFile, info: &TensorInfo) -> Result<Tensor> {
        let data = g.tensor_data(info);
        let shape = info.shape();
        let t = match info.dtype {
            GgmlType::F32 => Tensor::from_raw_buffer(data, DType::F32, &shape, &Device::Cpu)?,
            GgmlType::F16 => Tensor::from_raw_buffer(data, DType::F16, &shape, &Device::Cpu)?,
            GgmlType::BF16 => Tensor::from_raw_buffer(data, DType::BF16, &shape, &Device::Cpu)?,
            q => {
                let v = ggml_dequantize(candle_dtype(q), data, info.elems() as usize)?;
                Tensor::from_vec(v, shape, &Device::Cpu)?
            }
        };
        Ok(t.to_dtype(self.dtype)?.to_device(&self.device)?)
    }

    /// A norm weight of `len` values.
    pub fn vector(&self, id: TensorId, len: usize) -> Result<Tensor> {
        match &self.src {
            Source::Gguf(g) => self.gguf_dense(g, Self::gguf_info(g, id, &[len])?),
            Source::Safetensors(st) => self.st_tensor(st, id, &[len]),
            Source::Dummy { .. } => Ok(Tensor::ones(len, self.dtype, &self.device)?),
        }
    }

    /// The token embedding (`vocab x hidden`).
    pub fn embedding(&self, vocab: usize, hidden: usize) -> Result<Embedding> {
        match &self.src {
            Source::Gguf(g) => {
                let info = Self::gguf_info(g, TensorId::Embed, &[vocab, hidden])?;
                match info.dtype {
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Ok(Embedding::Dense(self.gguf_dense(g, info)?)),
                    q if self.device.is_cpu() => Ok(Embedding::Quant(Arc::new(
                        QuantMatrix::from_ggml(&info.name, candle_dtype(q), g.tensor_data(info), vocab, hidden).map_err(|e| Error::Format(e.to_string()))?,
                    ))),
                    _ => Ok(Embedding::Dense(self.gguf_dense(g, info)?)),
                }
            }
            _ => match self.linear(TensorId::Embed, vocab, hidden)? {
                Linear::Quant(m) => Ok(Embedding::Quant(m)),
                Linear::Dense(t) => Ok(Embedding::Dense(t)),
                Linear::CandleQuant(..) => Err(Error::Unsupported("quantized dummy embedding on a GPU".into())),
            },
        }
    }

    /// The output projection: its own tensor, or the embedding when tied.
    pub fn lm_head(&self, vocab: usize, hidden: usize, tied: bool, embedding: &Embedding) -> Result<Linear> {
        if !tied {
            return self.linear(TensorId::Output, vocab, hidden);
        }
        match (&self.src, embedding) {
            (_, Embedding::Quant(m)) => Ok(Linear::Quant(m.clone())),
            (Source::Gguf(g), Embedding::Dense(t)) => {
                let info = Self::gguf_info(g, TensorId::Embed, &[vocab, hidden])?;
                match info.dtype {
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Ok(Linear::Dense(t.clone())),
                    q => {
                        let qt = self.candle_qtensor(info, q, g.tensor_data(info), vocab, hidden)?;
                        Ok(Linear::CandleQuant(Arc::new(QMatMul::from_arc(Arc::new(qt))?), vocab, hidden))
                    }
                }
            }
            (_, Embedding::Dense(t)) => Ok(Linear::Dense(t.clone())),
        }
    }

    /// Llama-3.1 RoPE frequency factors stored in a GGUF file, if any.
    pub fn rope_freq_factors(&self, half_dim: usize) -> Result<Option<Vec<f32>>> {
        match &self.src {
            Source::Gguf(g) if g.tensor(&TensorId::RopeFreqs.gguf_name()).is_some() => {
                let info = Self::gguf_info(g, TensorId::RopeFreqs, &[half_dim])?;
                Ok(Some(self.gguf_dense(g, info)?.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.to_vec1()?))
            }
            _ => Ok(None),
        }
    }
}

/// `v` as a host tensor of `dtype`, converted on every core (an 8B-parameter dummy model is 8G
/// conversions; rounding is the same as candle's `to_dtype`).
fn host_tensor(v: Vec<f32>, shape: (usize, usize), dtype: DType) -> Result<Tensor> {
    Ok(match dtype {
        DType::BF16 => Tensor::from_vec(v.par_iter().map(|&x| half::bf16::from_f32(x)).collect::<Vec<_>>(), shape, &Device::Cpu)?,
        DType::F16 => Tensor::from_vec(v.par_iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>(), shape, &Device::Cpu)?,
        _ => Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)?,
    })
}

fn candle_dtype(t: GgmlType) -> GgmlDType {
    match t {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q8_1 => GgmlDType::Q8_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::Q8_K => GgmlDType::Q8K,
    }
}
