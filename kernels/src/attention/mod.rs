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

use std::any::Any;
use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, DType, Device, Layout, Result, Shape, Tensor};
use half::{bf16, f16};

/// Shape of one layer's K (or V) cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheGeometry {
    /// Blocks in the pool, the null block included.
    pub num_blocks: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl CacheGeometry {
    /// Cache tensor shape `[num_blocks, kv_heads, block_size, head_dim]`.
    pub fn shape(&self) -> (usize, usize, usize, usize) {
        (self.num_blocks, self.kv_heads, self.block_size, self.head_dim)
    }

    /// Elements in one cache tensor.
    pub fn elems(&self) -> usize {
        self.num_blocks * self.kv_heads * self.block_size * self.head_dim
    }

    /// Reads the geometry off a cache tensor.
    pub fn of(cache: &Tensor) -> Result<Self> {
        let (num_blocks, kv_heads, block_size, head_dim) = cache.dims4()?;
        Ok(Self { num_blocks, kv_heads, block_size, head_dim })
    }
}

/// Host view of a step's attention metadata.
#[derive(Debug, Clone, Copy)]
pub struct AttentionMeta<'a> {
    /// Prefix sums of query tokens per sequence (`num_seqs + 1` entries, starting at 0).
    pub cu_seqlens_q: &'a [u32],
    /// Tokens in the cache per sequence after this step's write.
    pub context_lens: &'a [u32],
    /// `num_seqs x max_blocks` block ids, row-major; entries past a sequence's blocks are 0.
    pub block_tables: &'a [u32],
    /// Columns of `block_tables`.
    pub max_blocks: usize,
}

impl AttentionMeta<'_> {
    /// Sequences in the batch.
    pub fn num_seqs(&self) -> usize {
        self.context_lens.len()
    }

    /// The block table of sequence `s`.
    pub fn block_table(&self, s: usize) -> &[u32] {
        &self.block_tables[s * self.max_blocks..(s + 1) * self.max_blocks]
    }

    /// Checks every invariant the kernels rely on to stay in bounds.
    pub fn validate(&self, geo: &CacheGeometry, num_tokens: usize) -> Result<()> {
        let n = self.num_seqs();
        if self.cu_seqlens_q.len() != n + 1 || self.cu_seqlens_q.first() != Some(&0) {
            candle_core::bail!("attention metadata: cu_seqlens_q must have num_seqs + 1 entries from 0");
        }
        if *self.cu_seqlens_q.last().unwrap_or(&0) as usize != num_tokens {
            candle_core::bail!("attention metadata: cu_seqlens_q does not end at the token count");
        }
        if self.block_tables.len() != n * self.max_blocks {
            candle_core::bail!("attention metadata: block_tables is not num_seqs x max_blocks");
        }
        for s in 0..n {
            let (a, b) = (self.cu_seqlens_q[s], self.cu_seqlens_q[s + 1]);
            let ctx = self.context_lens[s] as usize;
            if b < a || ((b - a) as usize) > ctx || ctx == 0 {
                candle_core::bail!("attention metadata: sequence {s} has {} queries for {ctx} tokens", b.wrapping_sub(a));
            }
            let need = ctx.div_ceil(geo.block_size);
            if need > self.max_blocks {
                candle_core::bail!("attention metadata: sequence {s} needs {need} blocks, table holds {}", self.max_blocks);
            }
            if let Some(&bad) = self.block_table(s)[..need].iter().find(|&&blk| blk as usize >= geo.num_blocks) {
                candle_core::bail!("attention metadata: block {bad} out of range ({} blocks)", geo.num_blocks);
            }
        }
        Ok(())
    }
}

/// How the CUDA forward of [`paged_attention`] picks its kernels (the CPU forward has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnOptions {
    /// Run prefill chunks on tensor cores when the cache is f16 or bf16.
    pub tensor_cores: bool,
    /// Keys per split-K partition of the query-at-a-time kernel; `None` picks by context length
    /// and GPU size.
    pub partition: Option<usize>,
}

impl Default for AttnOptions {
    fn default() -> Self {
        Self { tensor_cores: true, partition: None }
    }
}

impl AttnOptions {
    /// The process-wide default: [`AttnOptions::default`], except that `PACE_ATTN_TENSOR_CORES=0`
    /// turns the tensor-core prefill kernel off (read once; an escape hatch for operators).
    pub fn process_default() -> Self {
        static OPTS: OnceLock<AttnOptions> = OnceLock::new();
        *OPTS.get_or_init(|| Self {
            tensor_cores: std::env::var("PACE_ATTN_TENSOR_CORES").map_or(true, |v| v != "0"),
            partition: None,
        })
    }
}

/// Per-step data a device backend derives from the metadata once and reuses in every layer (the
/// CUDA kernels' work lists); never set on the CPU.
#[derive(Default)]
pub(crate) struct Derived(OnceLock<Box<dyn Any + Send + Sync>>);

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "Derived(set)" } else { "Derived(empty)" })
    }
}

/// A step's attention metadata, validated once, on the host and on the compute device.
#[derive(Debug, Clone)]
pub struct PagedAttentionMeta {
    host: Arc<HostMeta>,
    derived: Arc<Derived>,
    /// `num_seqs + 1` query prefix sums (u32) on the device.
    pub cu_seqlens_q: Tensor,
    /// `num_seqs` context lengths (u32) on the device.
    pub context_lens: Tensor,
    /// `num_seqs x max_blocks` block tables (u32) on the device.
    pub block_tables: Tensor,
    /// Cache geometry the metadata was validated against.
    pub geometry: CacheGeometry,
    /// Largest context length in the batch.
    pub max_context_len: usize,
}

#[derive(Debug)]
struct HostMeta {
    cu_seqlens_q: Vec<u32>,
    context_lens: Vec<u32>,
    block_tables: Vec<u32>,
    max_blocks: usize,
}

impl PagedAttentionMeta {
    /// Validates host metadata against the cache geometry and copies it to `device`.
    pub fn new(
        cu_seqlens_q: Vec<u32>,
        context_lens: Vec<u32>,
        block_tables: Vec<u32>,
        max_blocks: usize,
        geometry: CacheGeometry,
        device: &Device,
    ) -> Result<Self> {
        let num_tokens = cu_seqlens_q.last().copied().unwrap_or(0) as usize;
        let view = AttentionMeta {
            cu_seqlens_q: &cu_seqlens_q,
            context_lens: &context_lens,
            block_tables: &block_tables,
            max_blocks,
        };
        view.validate(&geometry, num_tokens)?;
        let n = context_lens.len();
        let max_context_len = context_lens.iter().copied().max().unwrap_or(0) as usize;
        Ok(Self {
            cu_seqlens_q: Tensor::from_slice(&cu_seqlens_q, n + 1, device)?,
            context_lens: Tensor::from_slice(&context_lens, n, device)?,
            block_tables: Tensor::from_slice(&block_tables, (n, max_blocks), device)?,
            host: Arc::new(HostMeta { cu_seqlens_q, context_lens, block_tables, max_blocks }),
            derived: Arc::default(),
            geometry,
            max_context_len,
        })
    }

    /// Host view.
    pub fn host(&self) -> AttentionMeta<'_> {
        AttentionMeta {
            cu_seqlens_q: &self.host.cu_seqlens_q,
            context_lens: &self.host.context_lens,
            block_tables: &self.host.block_tables,
            max_blocks: self.host.max_blocks,
        }
    }

    /// Query tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.host.cu_seqlens_q.last().copied().unwrap_or(0) as usize
    }

    /// The slot for data derived from this metadata (shared by its clones).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn derived(&self) -> &OnceLock<Box<dyn Any + Send + Sync>> {
        &self.derived.0
    }
}

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

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        kv: &CpuStorage,
        kv_l: &Layout,
        slots: &CpuStorage,
        slots_l: &Layout,
    ) -> Result<()> {
        let kv = contiguous_slice::<f32>(kv, kv_l)?;
        let slots = contiguous_slice::<u32>(slots, slots_l)?;
        let (a, b) = dst_l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("KV cache must be contiguous".into()))?;
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
                cpu::paged_attention::<$t>(
                    q,
                    contiguous_slice::<$t>(ks, kl)?,
                    contiguous_slice::<$t>(vs, vl)?,
                    g,
                    &host,
                    self.heads,
                    self.scale,
                    &mut out,
                )
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
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMeta,
    scale: f32,
) -> Result<Tensor> {
    paged_attention_with(q, k_cache, v_cache, meta, scale, AttnOptions::process_default())
}

/// [`paged_attention`] with explicit kernel options.
pub fn paged_attention_with(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMeta,
    scale: f32,
    opts: AttnOptions,
) -> Result<Tensor> {
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
    q.apply_op1_no_bwd(&PagedAttention {
        k_cache: k_cache.clone(),
        v_cache: v_cache.clone(),
        meta: meta.clone(),
        heads,
        scale,
        opts,
    })
}
