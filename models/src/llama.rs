//! The Llama-family model over a paged KV cache.
//!
//! Llama 2/3, SmolLM2, TinyLlama and Mistral-style models: pre-norm transformer blocks with
//! RMSNorm, grouped-query attention with RoPE (Llama-3 frequency scaling when configured), and a
//! SwiGLU MLP (Touvron et al. 2023, arXiv 2302.13971; the reference is Hugging Face's
//! `modeling_llama.py`). One model serves every weight format: projections are [`Linear`]
//! layers that hide how their weights are stored.
//!
//! Where this departs from the reference: the forward pass takes one ragged batch (prefill
//! chunks and decode tokens of many sequences, flattened to `tokens x hidden`), writes K/V into
//! the paged cache, attends through block tables, and computes logits only for the positions
//! that will be sampled.

use candle_core::{DType, Device, Tensor, D};
use pace_kernels::{paged_attention, reshape_and_cache, PagedAttentionMeta};

use crate::config::{LlamaConfig, RopeStyle};
use crate::error::{Error, Result};
use crate::kv_cache::KvCache;
use crate::linear::{FusedLinear, Linear};
use crate::weights::{Embedding, LayerTensor, TensorId, WeightLoader};

/// One step's inputs, on the model's device.
pub struct StepInput {
    /// Token ids, host copy (the CPU embedding gathers on the host).
    pub token_ids_host: Vec<u32>,
    /// Token ids `(tokens,)` u32.
    pub token_ids: Tensor,
    /// Position of each token `(tokens,)` u32.
    pub positions: Tensor,
    /// KV-cache slot of each token `(tokens,)` u32.
    pub slots: Tensor,
    /// Paged attention metadata.
    pub attn: PagedAttentionMeta,
    /// Indices of the tokens whose logits are wanted `(samples,)` u32.
    pub sample_idx: Tensor,
}

struct Block {
    attn_norm: Tensor,
    qkv: FusedLinear,
    o: Linear,
    ffn_norm: Tensor,
    gate_up: FusedLinear,
    down: Linear,
}

/// A loaded Llama-family model.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    cos: Tensor,
    sin: Tensor,
    device: Device,
    dtype: DType,
    max_positions: usize,
}

impl Llama {
    /// Loads the model's weights; RoPE tables are built for `max_positions` positions.
    pub fn load(cfg: &LlamaConfig, w: &WeightLoader, max_positions: usize) -> Result<Self> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_heads * d, cfg.num_kv_heads * d);
        let embed = w.embedding(cfg.vocab_size, h)?;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        // One line of progress, rewritten per layer, on a terminal only (logs stay clean).
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr()) && cfg.num_layers > 1;
        for i in 0..cfg.num_layers {
            if progress {
                eprint!("\rpace: loading weights: layer {}/{}", i + 1, cfg.num_layers);
                if i + 1 == cfg.num_layers {
                    eprintln!();
                }
            }
            let t = |x| TensorId::Layer(i, x);
            let qkv = vec![w.linear(t(LayerTensor::Q), nq, h)?, w.linear(t(LayerTensor::K), nkv, h)?, w.linear(t(LayerTensor::V), nkv, h)?];
            let gate_up = vec![w.linear(t(LayerTensor::Gate), cfg.intermediate_size, h)?, w.linear(t(LayerTensor::Up), cfg.intermediate_size, h)?];
            blocks.push(Block {
                attn_norm: w.vector(t(LayerTensor::AttnNorm), h)?,
                qkv: FusedLinear::new(qkv)?,
                o: w.linear(t(LayerTensor::O), h, nq)?,
                ffn_norm: w.vector(t(LayerTensor::FfnNorm), h)?,
                gate_up: FusedLinear::new(gate_up)?,
                down: w.linear(t(LayerTensor::Down), h, cfg.intermediate_size)?,
            });
        }
        let norm = w.vector(TensorId::OutputNorm, h)?;
        let lm_head = w.lm_head(cfg.vocab_size, h, cfg.tie_word_embeddings, &embed)?;
        let mut inv = cfg.rope_inv_freqs();
        if let Some(factors) = w.rope_freq_factors(d / 2)? {
            for (f, s) in inv.iter_mut().zip(factors) {
                *f /= s as f64;
            }
        }
        let max_positions = max_positions.max(1);
        let mut cos = Vec::with_capacity(max_positions * d / 2);
        let mut sin = Vec::with_capacity(max_positions * d / 2);
        for p in 0..max_positions {
            for f in &inv {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        let device = w.device().clone();
        let dtype = w.dtype();
        let table = |v: Vec<f32>| -> Result<Tensor> { Ok(Tensor::from_vec(v, (max_positions, d / 2), &Device::Cpu)?.to_dtype(dtype)?.to_device(&device)?) };
        Ok(Self { cfg: cfg.clone(), embed, blocks, norm, lm_head, cos: table(cos)?, sin: table(sin)?, device, dtype, max_positions })
    }

    /// The matmul weights a token passes through (every block's projections and the output
    /// head): elements and stored bytes. A batch-1 decode step reads all of them once; a
    /// prefill token costs two operations per element.
    pub fn matmul_footprint(&self) -> (u64, u64) {
        let add = |a: (u64, u64), b: (u64, u64)| (a.0 + b.0, a.1 + b.1);
        let blocks = self.blocks.iter().map(|b| add(add(b.qkv.footprint(), b.o.footprint()), add(b.gate_up.footprint(), b.down.footprint())));
        blocks.fold(self.lm_head.footprint(), add)
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// The compute device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Dtype of activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Positions the RoPE tables cover.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match self.cfg.rope_style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(x, cos, sin)?,
        })
    }

    /// Runs one step: writes the batch's K/V into `cache` and returns the logits of the sampled
    /// positions, `(samples, vocab)` in f32 (on the host when there are none).
    pub fn forward(&self, input: &StepInput, cache: &KvCache) -> Result<Tensor> {
        let cfg = &self.cfg;
        let t = input.token_ids_host.len();
        let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let eps = cfg.rms_norm_eps as f32;
        let scale = 1.0 / (d as f32).sqrt();
        if cache.k.len() != self.blocks.len() {
            return Err(Error::Invalid("KV cache has the wrong number of layers".into()));
        }
        let cos = self.cos.index_select(&input.positions, 0)?.reshape((t, 1, d / 2))?;
        let sin = self.sin.index_select(&input.positions, 0)?.reshape((t, 1, d / 2))?;
        let mut x = self.embed.forward(&input.token_ids_host, &input.token_ids, &self.device)?.to_dtype(self.dtype)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &b.attn_norm, eps)?;
            let [q, k, v]: [Tensor; 3] = b.qkv.forward(&h)?.try_into().map_err(|_| Error::Invalid("q/k/v projection returned the wrong parts".into()))?;
            let q = self.rope(&q.reshape((t, hq, 1, d))?.contiguous()?, &cos, &sin)?.reshape((t, hq, d))?;
            let k = self.rope(&k.reshape((t, hkv, 1, d))?.contiguous()?, &cos, &sin)?.reshape((t, hkv, d))?;
            let v = v.reshape((t, hkv, d))?;
            reshape_and_cache(&k, &cache.k[i], &input.slots)?;
            reshape_and_cache(&v, &cache.v[i], &input.slots)?;
            let a = paged_attention(&q, &cache.k[i], &cache.v[i], &input.attn, scale)?.to_dtype(self.dtype)?.reshape((t, hq * d))?;
            x = (x + b.o.forward(&a)?.to_dtype(self.dtype)?)?;
            let h = candle_nn::ops::rms_norm(&x, &b.ffn_norm, eps)?;
            let m = pace_kernels::silu_mul(&b.gate_up.forward_concat(&h)?, cfg.intermediate_size)?;
            x = (x + b.down.forward(&m)?.to_dtype(self.dtype)?)?;
        }
        if input.sample_idx.dim(0)? == 0 {
            // On the host: a GPU cannot allocate an empty buffer.
            return Ok(Tensor::zeros((0, cfg.vocab_size), DType::F32, &Device::Cpu)?);
        }
        let x = x.index_select(&input.sample_idx, 0)?;
        let x = candle_nn::ops::rms_norm(&x, &self.norm, eps)?;
        let logits = self.lm_head.forward(&x)?.to_dtype(DType::F32)?;
        debug_assert_eq!(logits.dim(D::Minus1)?, cfg.vocab_size);
        Ok(logits)
    }
}
