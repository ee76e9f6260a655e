//! Paged attention and the KV-cache write, as candle custom ops.
//!
//! The KV cache of one layer is two tensors, K and V, each
//! `[num_blocks, kv_heads, block_size, head_dim]`: a block holds `block_size` consecutive
//! positions of one sequence, and a sequence reaches its blocks through its block table. Block 0
//! is the null block (never handed out by the scheduler). A step's batch is ragged: sequence `s`
//! contributes query tokens `cu_seqlens_q[s] .. cu_seqlens_q[s+1]`, which are the last positions
//! of its `context_lens[s]` tokens (decode: one token; prefill chunk: several, causal among
//! themselves and over everything cached before).
//!
//! [`reshape_and_cache`] writes the step's new K and V rows into their slots; [`paged_attention`]
//! then attends each query over its visible keys. Each op has a CPU forward here and a CUDA
//! forward in the `cuda` module; callers never know which runs.

pub mod cpu;
pub mod meta;

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use half::{bf16, f16};

pub use meta::{AttentionMeta, AttnOptions, CacheGeometry, PagedAttentionMeta};

fn contiguous_slice<'a, T: candle_core::WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("paged attention: tensor must be contiguous"),
    }
}

/// The KV-cache write: an in-place op on the cache tensor.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct ReshapeAndCache {
    geometry: CacheGeometry,
    num_slots: usize,
}

impl candle_core::InplaceOp3 for ReshapeAndCache {
    fn name(&self) -> &'static str {
        "reshape-and-cache"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dst_l: &Layout, kv: &CpuStorage, kv_l: &Layout, slots: &CpuStorage, slots_l: &Layout) -> Result<()> {
        let kv = contiguous_slice::<f32>(kv, kv_l)?;
        let slots = contiguous_slice::<u32>(slots, slots_l)?;
        let (a, b) = dst_l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("KV cache must be contiguous".into()))?;
        let g = &self.geometry;
        match dst {
            CpuStorage::F32(c) => cpu::write_cache(&mut c[a..b], g, kv, slots),
            CpuStorage::F16(c) => cpu::write_cache::<f16>(&mut c[a..b], g, kv, slots),
            CpuStorage::BF16(c) => cpu::write_cache::<bf16>(&mut c[a..b], g, kv, slots),
            _ => candle_core::bail!("KV cache dtype is not supported on the CPU (use f32, f16 or bf16)"),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dst_l: &Layout,
        kv: &candle_core::CudaStorage,
        kv_l: &Layout,
        slots: &candle_core::CudaStorage,
        slots_l: &Layout,
    ) -> Result<()> {
        crate::cuda::reshape_and_cache(dst, dst_l, (kv, kv_l), (slots, slots_l), &self.geometry, self.num_slots)
    }
}

/// Writes `kv` (`t x kv_heads x head_dim`) into `cache` at `slots` (`t` u32 values,
/// `block * block_size + offset`).
pub fn reshape_and_cache(kv: &Tensor, cache: &Tensor, slots: &Tensor) -> Result<()> {
    let geometry = CacheGeometry::of(cache)?;
    let (t, h, d) = kv.dims3()?;
    if h != geometry.kv_heads || d != geometry.head_dim || slots.dims1()? != t {
        candle_core::bail!("reshape_and_cache: kv {:?} does not fit cache {:?}", kv.shape(), cache.shape());
    }
    if slots.dtype() != DType::U32 {
        candle_core::bail!("reshape_and_cache: slots must be u32");
    }
    let kv = if kv.device().is_cpu() { kv.to_dtype(DType::F32)? } else { kv.to_dtype(cache.dtype())? };
    let kv = kv.contiguous()?;
    cache.inplace_op3(&kv, slots, &ReshapeAndCache { geometry, num_slots: t })
}

/// Checks that every slot lies in the cache (host side, before the write is queued).
pub fn check_slots(slots: &[u32], geometry: &CacheGeometry) -> Result<()> {
    let cap = geometry.num_blocks * geometry.block_size;
    if let Some(&bad) = slots.iter().find(|&&s| s as usize >= cap) {
        candle_core::bail!("slot {bad} is outside the KV cache ({cap} slots)");
    }
    Ok(())
}

struct PagedAttention {
    k_cache: Tensor,
    v_cache: Tensor,
    meta: PagedAttentionMeta,
    heads: usize,
    scale: f32,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    opts: AttnOptions,
}

impl candle_core::CustomOp1 for PagedAttention {
    fn name(&self) -> &'static str {
        "paged-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let q = contiguous_slice::<f32>(s, l)?;
        let g = &self.meta.geometry;
        let t = self.meta.num_tokens();
        let mut out = vec![0f32; t * self.heads * g.head_dim];
        let (ks, kl) = self.k_cache.storage_and_layout();
        let (vs, vl) = self.v_cache.storage_and_layout();
        let (candle_core::Storage::Cpu(ks), candle_core::Storage::Cpu(vs)) = (&*ks, &*vs) else {
            candle_core::bail!("paged attention: cache is not on the CPU");
        };
        let host = self.meta.host();
        macro_rules! run {
            ($t:ty) => {
                cpu::paged_attention::<$t>(q, contiguous_slice::<$t>(ks, kl)?, contiguous_slice::<$t>(vs, vl)?, g, &host, self.heads, self.scale, &mut out)
            };
        }
        match self.k_cache.dtype() {
            DType::F32 => run!(f32),
            DType::F16 => run!(f16),
            DType::BF16 => run!(bf16),
            other => candle_core::bail!("KV cache dtype {other:?} is not supported"),
        }
        Ok((CpuStorage::F32(out), Shape::from((t, self.heads, g.head_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::paged_attention(s, l, &self.k_cache, &self.v_cache, &self.meta, self.heads, self.scale, self.opts)
    }
}

/// Attention of `q` (`t x heads x head_dim`) over the paged cache; returns `t x heads x head_dim`
/// (f32 on the CPU; on a GPU in q's dtype when that is f32 or the cache's dtype, else f32).
pub fn paged_attention(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, meta: &PagedAttentionMeta, scale: f32) -> Result<Tensor> {
    paged_attention_with(q, k_cache, v_cache, meta, scale, AttnOptions::process_default())
}

/// [`paged_attention`] with explicit kernel options.
pub fn paged_attention_with(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, meta: &PagedAttentionMeta, scale: f32, opts: AttnOptions) -> Result<Tensor> {
    let (t, heads, d) = q.dims3()?;
    let g = meta.geometry;
    if CacheGeometry::of(k_cache)? != g || CacheGeometry::of(v_cache)? != g {
        candle_core::bail!("paged attention: caches do not match the metadata's geometry");
    }
    if d != g.head_dim || heads % g.kv_heads != 0 || t != meta.num_tokens() || d > 256 {
        candle_core::bail!("paged attention: q {:?} does not fit the cache {:?}", q.shape(), g);
    }
    if !q.device().same_device(k_cache.device()) || !q.device().same_device(meta.context_lens.device()) {
        candle_core::bail!("paged attention: q, the caches and the metadata are on different devices");
    }
    // The CPU kernel reads f32 queries; the CUDA kernels read f32 or the cache's dtype.
    let q = match q.dtype() {
        DType::F32 => q.clone(),
        dt if !q.device().is_cpu() && dt == k_cache.dtype() => q.clone(),
        _ => q.to_dtype(DType::F32)?,
    };
    let q = q.contiguous()?;
    q.apply_op1_no_bwd(&PagedAttention { k_cache: k_cache.clone(), v_cache: v_cache.clone(), meta: meta.clone(), heads, scale, opts })
}
