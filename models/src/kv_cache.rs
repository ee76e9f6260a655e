//! The paged KV cache: per layer one K and one V pool of fixed-size blocks, allocated once.

use candle_core::{DType, Device, Tensor};
use pace_kernels::CacheGeometry;

use crate::config::LlamaConfig;
use crate::error::Result;

/// K and V block pools for every layer, `[num_blocks, kv_heads, block_size, head_dim]` each.
pub struct KvCache {
    /// K pool per layer.
    pub k: Vec<Tensor>,
    /// V pool per layer.
    pub v: Vec<Tensor>,
    /// Shape of each pool.
    pub geometry: CacheGeometry,
}

impl KvCache {
    /// Allocates the pools (zeroed) on `device`.
    pub fn new(cfg: &LlamaConfig, num_blocks: usize, block_size: usize, dtype: DType, device: &Device) -> Result<Self> {
        let geometry = CacheGeometry { num_blocks, kv_heads: cfg.num_kv_heads, block_size, head_dim: cfg.head_dim };
        let mut k = Vec::with_capacity(cfg.num_layers);
        let mut v = Vec::with_capacity(cfg.num_layers);
        for _ in 0..cfg.num_layers {
            k.push(Tensor::zeros(geometry.shape(), dtype, device)?);
            v.push(Tensor::zeros(geometry.shape(), dtype, device)?);
        }
        Ok(Self { k, v, geometry })
    }

    /// Bytes one block takes across all layers, K and V.
    pub fn bytes_per_block(cfg: &LlamaConfig, block_size: usize, dtype: DType) -> usize {
        cfg.num_layers * 2 * cfg.num_kv_heads * block_size * cfg.head_dim * dtype.size_in_bytes()
    }
}
