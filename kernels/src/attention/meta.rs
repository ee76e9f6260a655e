//! A step's attention metadata and the cache geometry it is checked against, shared by the CPU
//! and the CUDA forwards of the attention ops (kept apart from both, so neither imports the
//! other's module for its types).

use std::any::Any;
use std::sync::{Arc, OnceLock};

use candle_core::{Device, Result, Tensor};

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
        *OPTS.get_or_init(|| Self { tensor_cores: std::env::var("PACE_ATTN_TENSOR_CORES").map_or(true, |v| v != "0"), partition: None })
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
        let view = AttentionMeta { cu_seqlens_q: &cu_seqlens_q, context_lens: &context_lens, block_tables: &block_tables, max_blocks };
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
