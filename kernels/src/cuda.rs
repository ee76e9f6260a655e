//! CUDA forwards of the attention ops: kernel selection by dtype and head size, launch
//! configurations, and the per-step work lists.
//!
//! The kernels (kernels/cuda/*.cu) are compiled by build.rs into fat binaries — machine code for
//! sm_80 and sm_90 and PTX for newer GPUs — embedded here and loaded once per device through
//! cudarc, on candle's CUDA context. Every launch goes to the device's stream, so the kernels are
//! ordered with candle's own ops.
//!
//! Paged attention splits a step's query tokens between two kernels:
//! - `pa_mma_*` (tensor cores, attention_mma.cu) takes the sequences with a prefill chunk of at
//!   least [`MMA_MIN_QUERIES`] tokens when the cache is f16 or bf16 and the head size 64 or 128;
//! - `pa_simt_*` (attention.cu) takes every other query token (decodes, short chunks, f32 caches),
//!   split into partitions of the context (split-K, merged by `pa_reduce_*`) when the batch alone
//!   would leave the GPU idle or the context is long.
//!
//! The work lists depend only on the step's metadata, so they are built and uploaded once per step
//! and reused by every layer (see [`PagedAttentionMeta`]'s derived-data slot).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaModule, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{CudaStorageSlice, DeviceId, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, Layout, Result, Shape, Tensor};

use crate::attention::meta::{AttnOptions, CacheGeometry, PagedAttentionMeta};

static CACHE_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cache.fatbin"));
static SIMT_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin"));
static MMA_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/attention_mma.fatbin"));
static SAMPLE_FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sample.fatbin"));
/// ptxas's registers, spills and shared memory per kernel and architecture, recorded by build.rs.
pub(crate) static PTXAS_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/ptxas.tsv"));

/// Prefill chunks at least this long go to the tensor-core kernel.
pub const MMA_MIN_QUERIES: usize = 8;
/// Threads per block of every attention kernel (kernels/cuda: SIMT_THREADS, MMA_THREADS).
const THREADS: u32 = 128;
/// Rows (query token x head) per tensor-core block (attention_mma.cu: BLOCK_M).
const MMA_ROWS: usize = 64;
/// Most partitions pa_reduce merges (attention.cu: MAX_PARTS).
const MAX_PARTS: usize = 1024;
/// Longest context one SIMT block walks alone before the split-K path takes over.
const MAX_KEYS_PER_BLOCK: usize = 8192;

/// Mirrors `pace::AttnParams` in kernels/cuda/common.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AttnParams {
    q: u64,
    out: u64,
    k_cache: u64,
    v_cache: u64,
    block_tables: u64,
    context_lens: u64,
    cu_seqlens_q: u64,
    work: u64,
    part_out: u64,
    part_ml: u64,
    num_work: u32,
    num_heads: u32,
    kv_heads: u32,
    block_size: u32,
    max_blocks: u32,
    num_parts: u32,
    part_size: u32,
    head_dim: u32,
    pad: u32,
    scale_log2: f32,
}
const _: () = assert!(std::mem::size_of::<AttnParams>() == 10 * 8 + 10 * 4);
// SAFETY: plain old data: `#[repr(C)]` with only u64, u32 and f32 fields and an explicit `pad`,
// so no padding bytes (the size is asserted above), field for field the layout of
// `pace::AttnParams`; its bytes are what the kernels receive as their by-value parameter.
unsafe impl DeviceRepr for AttnParams {}

/// Mirrors `pace::CacheParams` in kernels/cuda/common.cuh.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CacheParams {
    kv: u64,
    cache: u64,
    slots: u64,
    num_tokens: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    num_slots: u32,
    pad: u32,
}
const _: () = assert!(std::mem::size_of::<CacheParams>() == 3 * 8 + 6 * 4);
// SAFETY: as for `AttnParams`: `#[repr(C)]` plain old data with an explicit `pad` and no padding
// bytes (size asserted above), laid out as `pace::CacheParams`.
unsafe impl DeviceRepr for CacheParams {}

/// The kernels, loaded on one device.
struct Kernels {
    modules: [Arc<CudaModule>; 4],
    functions: Mutex<HashMap<String, CudaFunction>>,
    num_sms: usize,
}

impl Kernels {
    fn function(&self, module: usize, name: &str) -> Result<CudaFunction> {
        let mut f = self.functions.lock().map_err(|_| candle_core::Error::Msg("kernel table poisoned".into()))?;
        if let Some(func) = f.get(name) {
            return Ok(func.clone());
        }
        let func = self.modules[module].load_function(name).w()?;
        f.insert(name.to_string(), func.clone());
        Ok(func)
    }
}

fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
    static LOADED: OnceLock<Mutex<HashMap<DeviceId, Arc<Kernels>>>> = OnceLock::new();
    let mut loaded = LOADED.get_or_init(Default::default).lock().map_err(|_| candle_core::Error::Msg("kernel registry poisoned".into()))?;
    if let Some(k) = loaded.get(&dev.id()) {
        return Ok(k.clone());
    }
    let stream = dev.cuda_stream();
    let ctx = stream.context();
    let load = |image: &[u8]| ctx.load_module(Ptx::from_binary(image.to_vec())).w();
    let num_sms = ctx.attribute(candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).w()? as usize;
    let k = Arc::new(Kernels {
        modules: [load(CACHE_FATBIN)?, load(SIMT_FATBIN)?, load(MMA_FATBIN)?, load(SAMPLE_FATBIN)?],
        functions: Mutex::new(HashMap::new()),
        num_sms: num_sms.max(1),
    });
    loaded.insert(dev.id(), k.clone());
    Ok(k)
}

/// Device address of the first element of a contiguous layout.
fn address(s: &CudaStorage, l: &Layout, what: &str) -> Result<u64> {
    let Some((start, _)) = l.contiguous_offsets() else { bail!("{what} must be contiguous") };
    let stream = s.device.cuda_stream();
    let (base, size) = match &s.slice {
        CudaStorageSlice::F32(x) => (x.device_ptr(&stream).0, 4),
        CudaStorageSlice::F16(x) => (x.device_ptr(&stream).0, 2),
        CudaStorageSlice::BF16(x) => (x.device_ptr(&stream).0, 2),
        CudaStorageSlice::U32(x) => (x.device_ptr(&stream).0, 4),
        _ => bail!("{what}: unsupported dtype {:?}", s.dtype()),
    };
    Ok(base + (start * size) as u64)
}

fn tensor_address(t: &Tensor, what: &str) -> Result<u64> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        candle_core::Storage::Cuda(c) => address(c, l, what),
        _ => bail!("{what} is not on the CUDA device"),
    }
}

fn slice_address<T>(s: &CudaSlice<T>, dev: &CudaDevice) -> u64 {
    s.device_ptr(&dev.cuda_stream()).0
}

fn dtype_name(d: DType) -> Result<&'static str> {
    Ok(match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("paged attention on CUDA: dtype {other:?} is not supported (f32, f16, bf16)"),
    })
}

/// Writes `kv` (`num_slots x kv_heads x head_dim`, the cache's dtype) into the cache at `slots`.
pub(crate) fn reshape_and_cache(
    dst: &mut CudaStorage,
    dst_l: &Layout,
    (kv, kv_l): (&CudaStorage, &Layout),
    (slots, slots_l): (&CudaStorage, &Layout),
    geo: &CacheGeometry,
    num_slots: usize,
) -> Result<()> {
    if num_slots == 0 {
        return Ok(());
    }
    if kv.dtype() != dst.dtype() {
        bail!("reshape_and_cache: kv is {:?}, the cache {:?}", kv.dtype(), dst.dtype());
    }
    if slots.dtype() != DType::U32 {
        bail!("reshape_and_cache: slots must be u32");
    }
    // The kernel trusts these sizes (checked once per call, host side).
    if kv_l.shape().elem_count() != num_slots * geo.kv_heads * geo.head_dim
        || slots_l.shape().elem_count() != num_slots
        || dst_l.shape().elem_count() != geo.elems()
    {
        bail!("reshape_and_cache: kv, slots or the cache do not fit {num_slots} slots of {geo:?}");
    }
    let module = match dst.dtype() {
        DType::F16 | DType::BF16 => "reshape_and_cache_b16",
        DType::F32 => "reshape_and_cache_b32",
        other => bail!("reshape_and_cache on CUDA: cache dtype {other:?} is not supported"),
    };
    let dev = dst.device.clone();
    let k = kernels(&dev)?;
    let func = k.function(0, module)?;
    let capacity = geo.num_blocks * geo.block_size;
    if capacity > u32::MAX as usize {
        bail!("reshape_and_cache: the cache has more than 2^32 slots");
    }
    let p = CacheParams {
        kv: address(kv, kv_l, "reshape_and_cache: kv")?,
        cache: address(dst, dst_l, "reshape_and_cache: cache")?,
        slots: address(slots, slots_l, "reshape_and_cache: slots")?,
        num_tokens: num_slots as u32,
        kv_heads: geo.kv_heads as u32,
        head_dim: geo.head_dim as u32,
        block_size: geo.block_size as u32,
        num_slots: capacity as u32,
        pad: 0,
    };
    let cfg = LaunchConfig { grid_dim: (num_slots as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let stream = dev.cuda_stream();
    // SAFETY: `reshape_and_cache_b16`/`_b32` take one `CacheParams` by value, as passed, and
    // match the cache's element size (and kv's: same dtype, checked). Block `t < num_slots`
    // reads `slots[t]` and kv row `t`: `slots` holds `num_slots` u32 and kv `num_slots *
    // kv_heads * head_dim` elements (checked above). It skips slots `>= capacity`, so its writes
    // land inside the cache's `geo.elems()` elements (checked above). The buffers are borrowed
    // for this call and freed stream-ordered, after the kernel, on the device's one stream.
    unsafe { stream.launch_builder(&func).arg(&p).launch(cfg) }.w()?;
    Ok(())
}

/// One step's work lists, built from the host metadata and uploaded once.
pub(crate) struct StepPlan {
    /// Query heads per KV head and whether tensor cores were allowed: the plan's inputs.
    key: (usize, bool),
    /// Pairs (query token, sequence) for the SIMT kernel.
    simt: Option<CudaSlice<u32>>,
    simt_len: usize,
    /// Longest visible context among the SIMT queries.
    simt_max_visible: usize,
    /// Pairs (sequence, first row) for the tensor-core kernel, heaviest first.
    mma: Option<CudaSlice<u32>>,
    mma_len: usize,
}

fn build_plan(meta: &PagedAttentionMeta, group: usize, use_mma: bool, dev: &CudaDevice) -> Result<StepPlan> {
    let host = meta.host();
    let mut simt = Vec::new();
    let mut mma: Vec<(u32, u32, usize)> = Vec::new();
    let mut simt_max_visible = 0;
    for s in 0..host.num_seqs() {
        let (a, b) = (host.cu_seqlens_q[s] as usize, host.cu_seqlens_q[s + 1] as usize);
        let ctx = host.context_lens[s] as usize;
        let qlen = b - a;
        if use_mma && qlen >= MMA_MIN_QUERIES {
            let rows = qlen * group;
            for r in (0..rows).step_by(MMA_ROWS) {
                let last = (r + MMA_ROWS).min(rows) - 1;
                let keys = ctx - qlen + last / group + 1;
                mma.push((s as u32, r as u32, keys));
            }
        } else {
            for t in a..b {
                simt.extend([t as u32, s as u32]);
            }
            simt_max_visible = simt_max_visible.max(ctx);
        }
    }
    // Longest tiles first, so the last wave is made of short ones.
    mma.sort_by(|x, y| y.2.cmp(&x.2));
    let mma_flat: Vec<u32> = mma.iter().flat_map(|&(s, r, _)| [s, r]).collect();
    let upload = |v: &[u32]| -> Result<Option<CudaSlice<u32>>> {
        if v.is_empty() {
            Ok(None)
        } else {
            dev.clone_htod(v).map(Some)
        }
    };
    Ok(StepPlan { key: (group, use_mma), simt: upload(&simt)?, simt_len: simt.len() / 2, simt_max_visible, mma: upload(&mma_flat)?, mma_len: mma.len() })
}

/// The step's plan: cached in the metadata for the common case, built afresh otherwise.
fn plan(meta: &PagedAttentionMeta, group: usize, use_mma: bool, dev: &CudaDevice) -> Result<Arc<StepPlan>> {
    let slot = meta.derived();
    if let Some(p) = slot.get().and_then(|b| b.downcast_ref::<Arc<StepPlan>>()) {
        if p.key == (group, use_mma) {
            return Ok(p.clone());
        }
        return Ok(Arc::new(build_plan(meta, group, use_mma, dev)?));
    }
    let p = Arc::new(build_plan(meta, group, use_mma, dev)?);
    let _ = slot.set(Box::new(p.clone()));
    Ok(p)
}

/// Keys per split-K partition: one partition when the batch fills the GPU and contexts are
/// moderate; otherwise enough partitions for about two blocks per multiprocessor, none longer
/// than MAX_KEYS_PER_BLOCK and none shorter than 128 keys.
pub fn partition_size(max_visible: usize, units: usize, num_sms: usize) -> usize {
    let target = 2 * num_sms;
    let by_occupancy = target.div_ceil(units.max(1));
    let by_length = max_visible.div_ceil(MAX_KEYS_PER_BLOCK);
    let parts = by_occupancy.max(by_length).clamp(1, MAX_PARTS);
    let size = max_visible.div_ceil(parts).max(1).next_multiple_of(128);
    size.max(max_visible.div_ceil(MAX_PARTS).next_multiple_of(128))
}

/// Paged attention of `q` (`t x heads x head_dim`, f32 or the cache's dtype) over the cache.
/// Returns `t x heads x head_dim` in q's dtype.
pub(crate) fn paged_attention(
    q: &CudaStorage,
    q_l: &Layout,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttentionMeta,
    heads: usize,
    scale: f32,
    opts: AttnOptions,
) -> Result<(CudaStorage, Shape)> {
    let g = meta.geometry;
    let d = g.head_dim;
    let t = meta.num_tokens();
    let cache_dt = k_cache.dtype();
    if v_cache.dtype() != cache_dt {
        bail!("paged attention: K and V caches have different dtypes");
    }
    let q_dt = q.dtype();
    if q_dt != DType::F32 && q_dt != cache_dt {
        bail!("paged attention on CUDA: q must be f32 or the cache's dtype ({cache_dt:?}), not {q_dt:?}");
    }
    if d != 64 && d != 128 {
        bail!("paged attention on CUDA supports head sizes 64 and 128, not {d}");
    }
    if g.block_size == 0 || heads % g.kv_heads != 0 {
        bail!("paged attention: {heads} query heads do not fit {} KV heads", g.kv_heads);
    }
    // The kernels trust these sizes (the public entry point checks them too; checked again here,
    // once per call, so that the launches' safety does not rest on it).
    if q_l.shape().elem_count() != t * heads * d || CacheGeometry::of(k_cache)? != g || CacheGeometry::of(v_cache)? != g {
        bail!("paged attention: q {:?} or the caches do not fit the metadata's {g:?}", q_l.shape());
    }
    let (cn, qn) = (dtype_name(cache_dt)?, dtype_name(q_dt)?);
    let dev = q.device.clone();
    let k = kernels(&dev)?;
    let group = heads / g.kv_heads;
    let use_mma = opts.tensor_cores && cache_dt != DType::F32;
    let plan = plan(meta, group, use_mma, &dev)?;

    let out_len = t * heads * d;
    // `alloc` returns uninitialised memory, and every element of `out` is written before
    // anything reads it: the plan puts each sequence's query tokens either in the SIMT work list
    // (a block per token, KV head and group chunk, writing its rows of `out` directly or through
    // pa_reduce) or in tensor-core tiles covering all its `qlen * group` rows for every KV head.
    // With `t == 0` the one placeholder element is never read.
    let out: CudaStorage = match q_dt {
        // SAFETY: uninitialised f32 output that the launches below fill before any read (see above).
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(out_len.max(1))? }, dev.clone()),
        // SAFETY: as for f32, in f16.
        DType::F16 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(out_len.max(1))? }, dev.clone()),
        // SAFETY: as for f32, in bf16 (`dtype_name` admitted no other dtype).
        _ => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(out_len.max(1))? }, dev.clone()),
    };
    let q_addr = address(q, q_l, "paged attention: q")?;
    if q_addr % 16 != 0 {
        bail!("paged attention: q is not 16-byte aligned");
    }
    let mut p = AttnParams {
        q: q_addr,
        out: address(&out, &Layout::contiguous(out_len.max(1)), "paged attention: out")?,
        k_cache: tensor_address(k_cache, "the K cache")?,
        v_cache: tensor_address(v_cache, "the V cache")?,
        block_tables: tensor_address(&meta.block_tables, "block tables")?,
        context_lens: tensor_address(&meta.context_lens, "context lengths")?,
        cu_seqlens_q: tensor_address(&meta.cu_seqlens_q, "query offsets")?,
        num_heads: heads as u32,
        kv_heads: g.kv_heads as u32,
        block_size: g.block_size as u32,
        max_blocks: meta.host().max_blocks as u32,
        head_dim: d as u32,
        scale_log2: scale * std::f32::consts::LOG2_E,
        ..Default::default()
    };
    if p.k_cache % 16 != 0 || p.v_cache % 16 != 0 {
        bail!("paged attention: the caches are not 16-byte aligned");
    }
    let stream = dev.cuda_stream();

    if let Some(work) = &plan.simt {
        let n = plan.simt_len;
        let gmax = if group <= 4 { 4 } else { 8 };
        let chunks = group.div_ceil(gmax);
        let units = n * g.kv_heads * chunks;
        let part = opts.partition.map(|s| s.max(1).next_multiple_of(128)).unwrap_or_else(|| partition_size(plan.simt_max_visible, units, k.num_sms));
        let parts = plan.simt_max_visible.div_ceil(part).max(1);
        if parts > MAX_PARTS || g.kv_heads * chunks > 65535 {
            bail!("paged attention: {parts} partitions of {part} keys is more than the kernels support");
        }
        p.work = slice_address(work, &dev);
        p.num_work = n as u32;
        p.num_parts = parts as u32;
        p.part_size = part as u32;
        // Split-K scratch, released (stream-ordered) when this function returns. Uninitialised:
        // pa_reduce reads only the partitions the SIMT kernel wrote.
        let scratch = if parts > 1 {
            // SAFETY: uninitialised scratch (see above): pa_reduce reads only the partitions the
            // SIMT kernel wrote, and both index `(work * heads + head) * parts + part < n * heads
            // * parts` slots of `d` values.
            let o = unsafe { dev.alloc::<f32>(n * heads * parts * d)? };
            // SAFETY: as for `o`, with two values (max, sum) a slot.
            let ml = unsafe { dev.alloc::<f32>(n * heads * parts * 2)? };
            p.part_out = slice_address(&o, &dev);
            p.part_ml = slice_address(&ml, &dev);
            Some((o, ml))
        } else {
            None
        };
        let func = k.function(1, &format!("pa_simt_{cn}_{qn}_{d}_g{gmax}"))?;
        let cfg = LaunchConfig { grid_dim: (n as u32, (g.kv_heads * chunks) as u32, parts as u32), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `pa_simt_*` takes one `AttnParams` by value, as passed, and is the
        // instantiation for this cache dtype, q dtype, head size and group width. Every address
        // in `p` is a live buffer on this device of the size the kernel indexes: q and `out`
        // (`t * heads * d`, checked and allocated above), the caches (`geo.elems()`, geometry
        // checked above, 16-byte aligned), the work list (`n` pairs) and, with `parts > 1`, the
        // scratch. The block tables, context lengths and query offsets are the device copies of
        // the host metadata `PagedAttentionMeta::new` validated against this geometry (they are
        // public fields: this rests on callers not replacing them). All launches go to the
        // device's one stream, so the buffers outlive the kernel.
        unsafe { stream.launch_builder(&func).arg(&p).launch(cfg) }.w()?;
        if parts > 1 {
            let func = k.function(1, &format!("pa_reduce_{qn}"))?;
            let cfg = LaunchConfig { grid_dim: (n as u32, heads as u32, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: as for the SIMT launch (same `p`); `pa_reduce_*` reads the partials the
            // SIMT launch wrote, ordered before it on this stream, and writes `out`.
            unsafe { stream.launch_builder(&func).arg(&p).launch(cfg) }.w()?;
        }
        drop(scratch);
    }
    if let Some(work) = &plan.mma {
        p.work = slice_address(work, &dev);
        p.num_work = plan.mma_len as u32;
        p.num_parts = 1;
        let func = k.function(2, &format!("pa_mma_{cn}_{qn}_{d}"))?;
        let cfg = LaunchConfig { grid_dim: (plan.mma_len as u32, g.kv_heads as u32, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: as for the SIMT launch, with the tensor-core work list (`mma_len` pairs) in
        // `p.work` and no scratch (`num_parts == 1`); `pa_mma_*` is the instantiation for these
        // dtypes and head size.
        unsafe { stream.launch_builder(&func).arg(&p).launch(cfg) }.w()?;
    }
    Ok((out, Shape::from((t, heads, d))))
}

/// The greedy token of each row of `[rows, cols]` logits (kernels/cuda/sample.cu).
pub(crate) fn argmax_rows(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (rows, cols) = l.shape().dims2()?;
    let name = match s.dtype() {
        DType::F32 => "argmax_f32",
        DType::F16 => "argmax_f16",
        DType::BF16 => "argmax_bf16",
        other => bail!("argmax_rows on CUDA: dtype {other:?} is not supported (f32, f16, bf16)"),
    };
    if cols > u32::MAX as usize || rows > i32::MAX as usize {
        bail!("argmax_rows: {rows} x {cols} logits are too many");
    }
    let dev = s.device.clone();
    let k = kernels(&dev)?;
    let func = k.function(3, name)?;
    let src = address(s, l, "argmax_rows: logits")?;
    // SAFETY: `alloc` returns uninitialised memory; the kernel below writes every one of the
    // `rows` elements before anything reads them (with `rows == 0` the placeholder is unread).
    let out = unsafe { dev.alloc::<u32>(rows.max(1))? };
    if rows > 0 {
        let dst = slice_address(&out, &dev);
        let cols = cols as u32;
        let cfg = LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let stream = dev.cuda_stream();
        // SAFETY: `argmax_*(logits, out, cols)` takes a device pointer, a device pointer and a
        // u32, as passed. `src` holds `rows x cols` contiguous elements of the kernel's dtype
        // (`address` checked the layout is contiguous) and `dst` `rows` u32s; one block per row
        // reads its row and writes its element, nothing else.
        unsafe { stream.launch_builder(&func).arg(&src).arg(&dst).arg(&cols).launch(cfg) }.w()?;
    }
    Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
}

/// Free and total memory of a CUDA device, in bytes.
pub(crate) fn memory_info(dev: &Device) -> Option<(usize, usize)> {
    match dev {
        Device::Cuda(d) => d.cuda_stream().context().mem_get_info().ok(),
        _ => None,
    }
}

/// Opens CUDA device `ordinal` for pace: one stream of its own that every thread launches on
/// (see [`prepare`]), pace's kernels loaded.
pub(crate) fn open(ordinal: usize) -> Result<Device> {
    let dev = Device::new_cuda_with_stream(ordinal)?;
    prepare(&dev)?;
    Ok(dev)
}

/// Prepares a CUDA device for pace: checks that it runs on one explicit stream, turns
/// per-allocation event tracking off and loads the kernels.
///
/// One stream, because a step's work is issued from more than one host thread (the engine
/// thread uploads the step's inputs and copies the tokens back; start-up and gpu-check time steps
/// from theirs). candle's `Device::new_cuda` gives each host thread its own per-thread default
/// stream, and nothing would order those: the argmax could read logits before the output layer
/// wrote them, a step's attention could read KV slots the step before had not yet written, and a
/// freed buffer could be reused while a kernel still read it. On one stream, launches run in the
/// order the host issued them, whichever thread issued them. Event tracking would only order
/// tensors between streams, so with one stream it costs two driver calls per allocation for
/// nothing.
pub(crate) fn prepare(dev: &Device) -> Result<()> {
    if let Device::Cuda(d) = dev {
        let raw = d.cuda_stream().cu_stream() as usize;
        if let Some(why) = crate::graph::shared_stream_problem(raw) {
            bail!("{why}: create the device with Device::new_cuda_with_stream (pace_kernels::device::open_cuda)");
        }
        // SAFETY: event tracking only orders a tensor's uses across streams. Every tensor of
        // this device lives on its one explicit stream (`shared_stream_problem` just confirmed
        // the device has one, and pace launches everything on it), so no tensor is freed,
        // used or written from another stream, which is what candle asks of the caller.
        unsafe { d.disable_event_tracking() };
        kernels(d)?;
    }
    Ok(())
}

/// Waits until every stream of the device's context has finished its work.
pub(crate) fn synchronize(dev: &Device) -> Result<()> {
    if let Device::Cuda(d) = dev {
        d.cuda_stream().context().synchronize().w()?;
    }
    Ok(())
}

/// GPU time between two events recorded on the device's stream around `f`, with the host time
/// `f` took to return (the enqueue time when `f` does not wait on the GPU).
pub(crate) fn time_on_gpu<R, E: From<candle_core::Error>>(
    d: &CudaDevice,
    f: impl FnOnce() -> std::result::Result<R, E>,
) -> std::result::Result<(R, f64, f64), E> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
    let stream = d.cuda_stream();
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).w()?;
    let t0 = std::time::Instant::now();
    let r = f()?;
    let host = t0.elapsed().as_secs_f64();
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).w()?;
    let ms = start.elapsed_ms(&end).w()?;
    Ok((r, host, ms as f64 / 1e3))
}

/// A captured and instantiated CUDA graph of one step's work.
pub(crate) struct Captured {
    graph: candle_core::cuda_backend::cudarc::driver::CudaGraph,
    pub counts: crate::graph::GraphCounts,
}

impl Captured {
    /// Launches the graph on the stream it was captured from. Its allocations are those of the
    /// previous launch, freed and made again: a result of the capture must be dropped first.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch().w()
    }
}

/// Captures what `f` launches on the device's stream into a CUDA graph (relaxed mode), launches
/// the graph once and counts its nodes. `f` runs twice: once to warm up, once captured.
///
/// - candle uploads small parameter vectors (index-select and strided-copy layouts) from host
///   vectors it frees at once; captured, those copies would read freed memory at every replay.
///   Its graph upload cache (`enable_cuda_graph_htod_cache`, on for this thread throughout)
///   keeps them on the device: the warm-up fills it, the capture reuses it. pace's own per-step
///   uploads (attention work lists) are made once per step's metadata, so the warm-up makes them.
/// - Memory the captured work allocates becomes the graph's: it exists once the graph has run,
///   so the graph runs once before `f`'s result (whose buffers are such memory) is handed back.
///   When the graph never ran, that result is leaked rather than freed (freeing it would fail).
///   The graph frees its previous launch's allocations when launched again.
/// - The capture always ends: an error a Drop recorded in the context during `f` (which would
///   make cudarc's `end_capture` return before ending it) is taken first.
pub(crate) fn capture<R, E: From<candle_core::Error>>(
    d: &CudaDevice,
    mut f: impl FnMut() -> std::result::Result<R, E>,
) -> std::result::Result<(R, Captured), E> {
    let stream = d.cuda_stream();
    let _uploads = d.enable_cuda_graph_htod_cache();
    drop(f()?);
    stream.synchronize().w()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).w()?;
    let r = f();
    let pending = stream.context().check_err();
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    let r = r?;
    let launched = pending.and_then(|()| ended).w().and_then(|g| {
        let g = g.ok_or_else(|| candle_core::Error::Msg("the stream captured nothing".into()))?;
        g.launch().w()?;
        stream.synchronize().w()?;
        Ok(g)
    });
    let graph = match launched {
        Ok(g) => g,
        Err(e) => {
            std::mem::forget(r);
            return Err(e.into());
        }
    };
    let counts = count_nodes(graph.cu_graph())?;
    Ok((r, Captured { graph, counts }))
}

/// Nodes of a CUDA graph by kind.
fn count_nodes(cu: sys::CUgraph) -> Result<crate::graph::GraphCounts> {
    let mut n = 0usize;
    // SAFETY: a null node array asks for the count only; `cu` is the live graph `graph` owns.
    let rc = unsafe { sys::cuGraphGetNodes(cu, std::ptr::null_mut(), &mut n) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        bail!("cuGraphGetNodes: {rc:?}");
    }
    let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for the `n` nodes the call above counted.
    let rc = unsafe { sys::cuGraphGetNodes(cu, nodes.as_mut_ptr(), &mut n) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        bail!("cuGraphGetNodes: {rc:?}");
    }
    let mut counts = crate::graph::GraphCounts::default();
    for &node in &nodes[..n] {
        // Read as a plain integer: a newer driver may report kinds this binding has no variant for.
        let mut kind: u32 = u32::MAX;
        // SAFETY: `node` belongs to the live graph; the driver writes one 4-byte enum value.
        let rc = unsafe { sys::cuGraphNodeGetType(node, (&mut kind as *mut u32).cast()) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            bail!("cuGraphNodeGetType: {rc:?}");
        }
        match kind {
            0 => counts.kernels += 1,
            1 => counts.copies += 1,
            2 => counts.memsets += 1,
            10 => counts.allocs += 1,
            11 => counts.frees += 1,
            _ => counts.other += 1,
        }
    }
    Ok(counts)
}

/// The name of a CUDA device and its compute capability.
pub(crate) fn describe(dev: &Device) -> Option<String> {
    use sys::CUdevice_attribute as A;
    let Device::Cuda(d) = dev else { return None };
    let ctx = d.cuda_stream().context().clone();
    let (major, minor) = ctx.compute_capability().ok()?;
    let sms = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).ok()?;
    let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
    Some(format!("{name} (compute capability {major}.{minor}, {sms} SMs)"))
}
