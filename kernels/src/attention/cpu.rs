//! CPU paged attention and KV-cache write.
//!
//! Every query token is computed by one self-contained routine — scores over its visible keys in
//! key order, a softmax, then the value sum in key order — so its output does not depend on the
//! other queries of the batch, on how its sequence's prompt was chunked, or on the thread count.
//! Work is split across rayon's pool in items of (sequence, KV head, run of query tokens); the
//! query heads that share a KV head are computed together so its keys are read from cache once.

use std::cell::RefCell;

use half::{bf16, f16};
use rayon::prelude::*;

use super::{AttentionMeta, CacheGeometry};

/// Element types the KV cache can hold on the CPU.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Converts from f32 when writing the cache.
    fn from_f32(v: f32) -> Self;
    /// Converts to f32 when reading the cache.
    fn to_f32(self) -> f32;
    /// Loads 8 consecutive elements as f32 (AVX2 path).
    ///
    /// # Safety
    /// `p` must point to 8 readable elements; AVX2 and F16C must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl KvElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

impl KvElem for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
    }
}

/// Writes `kv` (`t x kv_heads x head_dim`, f32) into `cache` at `slots` (one per token;
/// `slot = block * block_size + offset`). Slots must be in range (checked by the caller).
pub fn write_cache<E: KvElem>(cache: &mut [E], geo: &CacheGeometry, kv: &[f32], slots: &[u32]) {
    let (h, d, bs) = (geo.kv_heads, geo.head_dim, geo.block_size);
    for (t, &slot) in slots.iter().enumerate() {
        let (blk, off) = (slot as usize / bs, slot as usize % bs);
        for g in 0..h {
            let src = &kv[(t * h + g) * d..(t * h + g + 1) * d];
            let base = ((blk * h + g) * bs + off) * d;
            for (dst, &v) in cache[base..base + d].iter_mut().zip(src) {
                *dst = E::from_f32(v);
            }
        }
    }
}

/// Query tokens per work item.
const QUERIES_PER_ITEM: usize = 16;

/// One unit of parallel work.
struct Item {
    seq: usize,
    kv_head: usize,
    /// Query token range, absolute indices into the batch.
    q0: usize,
    q1: usize,
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the pointer is only dereferenced inside `paged_attention`'s parallel loop, whose work
// items write disjoint (token, head) rows of an `out` the function borrows mutably until every
// item has finished; moving it to another thread is then sound.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: the threads sharing it write disjoint rows, and nothing reads them until
// the parallel loop has returned.
unsafe impl Sync for OutPtr {}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Paged attention over a ragged batch. `q` and `out` are `t x heads x head_dim` (f32), with
/// `t` the last entry of `meta.cu_seqlens_q`; `k_cache` and `v_cache` hold `geo.elems()`
/// values each.
///
/// # Panics
/// If the metadata fails [`AttentionMeta::validate`] against `geo`, or a slice has the wrong
/// length. Both are checked once per call, on entry: the AVX2 kernel reads the caches through
/// raw pointers on the strength of them (the op's caller validated the metadata already; this
/// function is public and must not rely on that).
#[allow(clippy::too_many_arguments)] // the kernel's inputs, as the CUDA one takes them
pub fn paged_attention<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    geo: &CacheGeometry,
    meta: &AttentionMeta<'_>,
    heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    let t = meta.cu_seqlens_q.last().map_or(0, |&n| n as usize);
    if let Err(e) = meta.validate(geo, t) {
        panic!("paged_attention: {e}");
    }
    let rows_len = t.checked_mul(heads).and_then(|n| n.checked_mul(geo.head_dim));
    assert!(rows_len == Some(q.len()) && rows_len == Some(out.len()), "paged_attention: q and out must be t x heads x head_dim");
    let cache_len = geo.num_blocks.checked_mul(geo.kv_heads).and_then(|n| n.checked_mul(geo.block_size)).and_then(|n| n.checked_mul(geo.head_dim));
    assert!(
        cache_len == Some(k_cache.len()) && cache_len == Some(v_cache.len()),
        "paged_attention: the caches must be num_blocks x kv_heads x block_size x head_dim"
    );
    let group = heads / geo.kv_heads;
    let mut items = Vec::new();
    for s in 0..meta.num_seqs() {
        let (a, b) = (meta.cu_seqlens_q[s] as usize, meta.cu_seqlens_q[s + 1] as usize);
        for g in 0..geo.kv_heads {
            let mut q0 = a;
            while q0 < b {
                let q1 = (q0 + QUERIES_PER_ITEM).min(b);
                items.push(Item { seq: s, kv_head: g, q0, q1 });
                q0 = q1;
            }
        }
    }
    let optr = OutPtr(out.as_mut_ptr());
    let d = geo.head_dim;
    items.par_iter().for_each(|it| {
        // Moves the whole wrapper into the closure (a field capture would take the bare
        // pointer, which is not Send).
        #[allow(clippy::redundant_locals)]
        let optr = optr;
        let ctx = meta.context_lens[it.seq] as usize;
        let qlen = (meta.cu_seqlens_q[it.seq + 1] - meta.cu_seqlens_q[it.seq]) as usize;
        let first_pos = ctx - qlen;
        let start = meta.cu_seqlens_q[it.seq] as usize;
        let table = meta.block_table(it.seq);
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_has_avx2() {
            let rows: Vec<(usize, usize)> =
                (it.q0..it.q1).flat_map(|tok| (0..group).map(move |hh| (tok * heads + it.kv_head * group + hh, first_pos + (tok - start) + 1))).collect();
            // SAFETY: `cpu_has_avx2()` confirmed AVX2, FMA and F16C. `validate` (on entry)
            // gives `qlen <= ctx`, so each row's visible count `first_pos + (tok - start) + 1`
            // is at most `ctx`, and `table` holds `ctx.div_ceil(block_size)` blocks, all below
            // `num_blocks`: every key read lies inside the caches, which hold `geo.elems()`
            // values (checked on entry), and `block_size >= 1` (`validate` divides by it).
            // Each row index `tok * heads + kv_head * group + hh < t * heads`, so its
            // `head_dim` values lie inside `q` and `out` (lengths checked on entry). The items
            // split the tokens of disjoint sequence ranges (`cu_seqlens_q` is non-decreasing)
            // by KV head, so no other item touches these rows of `out`, which stays borrowed
            // until the loop ends.
            unsafe { avx2::attend_item(q, k_cache, v_cache, geo, table, it.kv_head, &rows, scale, optr.0) };
            return;
        }
        SCORES.with(|sc| {
            let mut sc = sc.borrow_mut();
            sc.resize(ctx, 0.0);
            for tok in it.q0..it.q1 {
                // Causal: token at position p sees keys 0..=p.
                let visible = first_pos + (tok - start) + 1;
                for hh in 0..group {
                    let h = it.kv_head * group + hh;
                    let qv = &q[(tok * heads + h) * d..(tok * heads + h + 1) * d];
                    // SAFETY: `tok < t` and `h < heads`, so the row's `d` values lie inside `out`
                    // (`t * heads * d` long, checked on entry, borrowed until the loop ends), and
                    // no other reference to them exists: each (tok, h) row belongs to exactly
                    // one item (see the AVX2 branch) and this slice ends with the iteration.
                    let o = unsafe { std::slice::from_raw_parts_mut(optr.0.add((tok * heads + h) * d), d) };
                    attend_one(qv, k_cache, v_cache, geo, table, it.kv_head, visible, scale, &mut sc[..visible], o);
                }
            }
        });
    });
}

/// Attention of one query row over its `visible` keys (the portable path: two passes).
#[allow(clippy::too_many_arguments)]
fn attend_one<E: KvElem>(
    q: &[f32],
    k_cache: &[E],
    v_cache: &[E],
    geo: &CacheGeometry,
    table: &[u32],
    g: usize,
    _visible: usize,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (d, bs, h) = (geo.head_dim, geo.block_size, geo.kv_heads);
    let row = |j: usize| ((table[j / bs] as usize * h + g) * bs + j % bs) * d;
    let mut max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        let k = &k_cache[row(j)..row(j) + d];
        *s = q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum::<f32>() * scale;
        max = max.max(*s);
    }
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    for (j, &p) in scores.iter().enumerate() {
        let v = &v_cache[row(j)..row(j) + d];
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x.to_f32();
        }
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{CacheGeometry, KvElem};
    use crate::simd::{hmax, hsum, hsum8};

    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// exp of one value through the vector routine (same rounding as the vector lanes).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA (callers run under `cpu_has_avx2`).
    #[inline(always)]
    unsafe fn exp1(x: f32) -> f32 {
        _mm256_cvtss_f32(crate::simd::exp(_mm256_set1_ps(x)))
    }

    /// Attention of the query rows of one work item (one sequence, one KV head): `rows` holds
    /// each row's index into `q`/`out` (in units of `head_dim`) and its visible key count.
    ///
    /// Keys are visited block by block; each block's K and V rows are converted to f32 once and
    /// shared by every row of the item (the query heads of the group, the tokens of a chunk).
    /// Each row keeps its own online-softmax state, updated by the same operations in the same
    /// order whatever the other rows are, so a row's result does not depend on the batch.
    ///
    /// # Safety
    /// - The CPU must support AVX2, FMA and F16C (`cpu_has_avx2` is true).
    /// - `geo.block_size >= 1`, `g < geo.kv_heads`, and `k_cache` and `v_cache` hold
    ///   `geo.elems()` values each.
    /// - With `max_vis` the largest visible count in `rows`: `table` holds at least
    ///   `max_vis.div_ceil(block_size)` entries, each below `geo.num_blocks` (the blocks are
    ///   read unchecked).
    /// - For every `(row, _)` in `rows`: `(row + 1) * head_dim <= q.len()`, and `out` is valid
    ///   for writes of `head_dim` values at `row * head_dim`, which nobody else accesses during
    ///   the call.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_item<E: KvElem>(
        q: &[f32],
        k_cache: &[E],
        v_cache: &[E],
        geo: &CacheGeometry,
        table: &[u32],
        g: usize,
        rows: &[(usize, usize)],
        scale: f32,
        out: *mut f32,
    ) {
        let (d, bs, h) = (geo.head_dim, geo.block_size, geo.kv_heads);
        let d8 = d / 8 * 8;
        let nr = rows.len();
        let max_vis = rows.iter().map(|r| r.1).max().unwrap_or(0);
        SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            // kf, vf: bs x d; acc: nr x d; m, l: nr; scores: bs (+8 slack).
            let need = 2 * bs * d + nr * d + 2 * nr + bs + 8;
            buf.clear();
            buf.resize(need, 0.0);
            let (kf, rest) = buf.split_at_mut(bs * d);
            let (vf, rest) = rest.split_at_mut(bs * d);
            let (acc, rest) = rest.split_at_mut(nr * d);
            let (m, rest) = rest.split_at_mut(nr);
            let (l, scores) = rest.split_at_mut(nr);
            m.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
            let scale_v = _mm256_set1_ps(scale);
            let mut kb = 0;
            while kb * bs < max_vis {
                let base = kb * bs;
                let nk_max = bs.min(max_vis - base);
                let blk = *table.get_unchecked(kb) as usize;
                let src = (blk * h + g) * bs * d;
                // Keys and values two blocks on, fetched a row at a time alongside this block's
                // conversion: blocks lie anywhere in the pool, where the hardware prefetcher
                // does not follow.
                let ahead = if (kb + 2) * bs < max_vis { Some((*table.get_unchecked(kb + 2) as usize * h + g) * bs * d) } else { None };
                let row_bytes = d * std::mem::size_of::<E>();
                for j in 0..nk_max {
                    if let Some(a) = ahead {
                        for off in (0..row_bytes).step_by(64) {
                            _mm_prefetch::<_MM_HINT_T0>((k_cache.as_ptr().add(a + j * d) as *const i8).add(off));
                            _mm_prefetch::<_MM_HINT_T0>((v_cache.as_ptr().add(a + j * d) as *const i8).add(off));
                        }
                    }
                    let (ks, vs) = (k_cache.as_ptr().add(src + j * d), v_cache.as_ptr().add(src + j * d));
                    let mut i = 0;
                    while i < d8 {
                        _mm256_storeu_ps(kf.as_mut_ptr().add(j * d + i), E::load8(ks.add(i)));
                        _mm256_storeu_ps(vf.as_mut_ptr().add(j * d + i), E::load8(vs.add(i)));
                        i += 8;
                    }
                    for i in d8..d {
                        kf[j * d + i] = (*ks.add(i)).to_f32();
                        vf[j * d + i] = (*vs.add(i)).to_f32();
                    }
                }
                for (r, &(row, vis)) in rows.iter().enumerate() {
                    if base >= vis {
                        continue;
                    }
                    let nk = bs.min(vis - base);
                    let qp = q.as_ptr().add(row * d);
                    if d == 64 {
                        // The same operations in the same order as below, with the query row and
                        // the accumulator held in registers.
                        let bmax = scores_64(qp, kf.as_ptr(), nk, scale_v, scale, scores);
                        let m_new = m[r].max(bmax);
                        let alpha = exp1(m[r] - m_new);
                        m[r] = m_new;
                        l[r] = l[r] * alpha + exp_scores(scores, nk, m_new);
                        accumulate_64(acc.as_mut_ptr().add(r * d), alpha, &scores[..nk], vf.as_ptr());
                        continue;
                    }
                    let dot = |j: usize| -> __m256 {
                        let k = kf.as_ptr().add(j * d);
                        let mut a = _mm256_setzero_ps();
                        let mut i = 0;
                        while i < d8 {
                            a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i)), a);
                            i += 8;
                        }
                        a
                    };
                    let tail = |j: usize| -> f32 { (d8..d).map(|i| *qp.add(i) * kf[j * d + i]).sum() };
                    // Scores of this block, eight keys at a time, then singles.
                    let mut j = 0;
                    let mut bmax = f32::NEG_INFINITY;
                    while j + 8 <= nk {
                        let mut sv = hsum8([dot(j), dot(j + 1), dot(j + 2), dot(j + 3), dot(j + 4), dot(j + 5), dot(j + 6), dot(j + 7)]);
                        if d8 < d {
                            let t: [f32; 8] = std::array::from_fn(|x| tail(j + x));
                            sv = _mm256_add_ps(sv, _mm256_loadu_ps(t.as_ptr()));
                        }
                        sv = _mm256_mul_ps(sv, scale_v);
                        _mm256_storeu_ps(scores.as_mut_ptr().add(j), sv);
                        bmax = bmax.max(hmax(sv));
                        j += 8;
                    }
                    while j < nk {
                        let s = (hsum(dot(j)) + if d8 < d { tail(j) } else { 0.0 }) * scale;
                        scores[j] = s;
                        bmax = bmax.max(s);
                        j += 1;
                    }
                    // Online softmax update.
                    let m_new = m[r].max(bmax);
                    let alpha = exp1(m[r] - m_new);
                    m[r] = m_new;
                    l[r] = l[r] * alpha + exp_scores(scores, nk, m_new);
                    let a = acc.as_mut_ptr().add(r * d);
                    let av = _mm256_set1_ps(alpha);
                    let mut i = 0;
                    while i < d8 {
                        let mut v = _mm256_mul_ps(_mm256_loadu_ps(a.add(i)), av);
                        for (jj, &p) in scores[..nk].iter().enumerate() {
                            v = _mm256_fmadd_ps(_mm256_set1_ps(p), _mm256_loadu_ps(vf.as_ptr().add(jj * d + i)), v);
                        }
                        _mm256_storeu_ps(a.add(i), v);
                        i += 8;
                    }
                    for i in d8..d {
                        let mut v = *a.add(i) * alpha;
                        for (jj, &p) in scores[..nk].iter().enumerate() {
                            v += p * vf[jj * d + i];
                        }
                        *a.add(i) = v;
                    }
                }
                kb += 1;
            }
            for (r, &(row, _)) in rows.iter().enumerate() {
                let inv = 1.0 / l[r];
                let o = out.add(row * d);
                for i in 0..d {
                    *o.add(i) = acc[r * d + i] * inv;
                }
            }
        });
    }

    /// Scores of one block's `nk` keys (f32 rows of 64 in `kf`) against one query row of 64,
    /// into `scores`; returns their maximum. Each score is the same chain of eight FMAs, then
    /// the same horizontal sum, as the generic path: only the loads differ (the query row stays
    /// in registers instead of being reloaded for every key).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `qp` must have 64 readable values, `kf`
    /// `nk * 64`, and `scores.len() >= nk` (the vector stores are unchecked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_64(qp: *const f32, kf: *const f32, nk: usize, scale_v: __m256, scale: f32, scores: &mut [f32]) -> f32 {
        let qv: [__m256; 8] = std::array::from_fn(|c| _mm256_loadu_ps(qp.add(8 * c)));
        let dot = |j: usize| -> __m256 {
            let k = kf.add(j * 64);
            let mut a = _mm256_setzero_ps();
            for (c, qc) in qv.iter().enumerate() {
                a = _mm256_fmadd_ps(*qc, _mm256_loadu_ps(k.add(8 * c)), a);
            }
            a
        };
        let mut bmax = f32::NEG_INFINITY;
        let mut j = 0;
        while j + 8 <= nk {
            let sv = _mm256_mul_ps(hsum8(std::array::from_fn(|x| dot(j + x))), scale_v);
            _mm256_storeu_ps(scores.as_mut_ptr().add(j), sv);
            bmax = bmax.max(hmax(sv));
            j += 8;
        }
        while j < nk {
            let s = hsum(dot(j)) * scale;
            scores[j] = s;
            bmax = bmax.max(s);
            j += 1;
        }
        bmax
    }

    /// Replaces `scores[..nk]` by `exp(score - m)` and returns their sum.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and `scores.len() >= nk` (the vector loads and
    /// stores are unchecked).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp_scores(scores: &mut [f32], nk: usize, m: f32) -> f32 {
        let mb = _mm256_set1_ps(m);
        let mut sumv = _mm256_setzero_ps();
        let mut j = 0;
        while j + 8 <= nk {
            let e = crate::simd::exp(_mm256_sub_ps(_mm256_loadu_ps(scores.as_ptr().add(j)), mb));
            sumv = _mm256_add_ps(sumv, e);
            _mm256_storeu_ps(scores.as_mut_ptr().add(j), e);
            j += 8;
        }
        let mut sum = hsum(sumv);
        while j < nk {
            let e = exp1(scores[j] - m);
            scores[j] = e;
            sum += e;
            j += 1;
        }
        sum
    }

    /// `acc = acc * alpha + sum_j p[j] * v[j]` over one row of 64, keys in order (each element
    /// sees the same FMAs in the same order as the generic path), the row held in registers.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `acc` must be valid for reads and writes of 64
    /// values, and `vf` for reads of `p.len() * 64`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate_64(acc: *mut f32, alpha: f32, p: &[f32], vf: *const f32) {
        let av = _mm256_set1_ps(alpha);
        let mut a: [__m256; 8] = std::array::from_fn(|c| _mm256_mul_ps(_mm256_loadu_ps(acc.add(8 * c)), av));
        for (jj, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            let v = vf.add(jj * 64);
            for (c, ac) in a.iter_mut().enumerate() {
                *ac = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.add(8 * c)), *ac);
            }
        }
        for (c, ac) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(8 * c), *ac);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: CacheGeometry = CacheGeometry { num_blocks: 2, kv_heads: 1, block_size: 4, head_dim: 8 };

    fn run(block: u32, q_len: usize) {
        let meta = AttentionMeta { cu_seqlens_q: &[0, 1], context_lens: &[3], block_tables: &[block], max_blocks: 1 };
        let cache = vec![0f32; GEO.elems()];
        let mut out = vec![0f32; 8];
        paged_attention(&vec![0f32; q_len], &cache, &cache, &GEO, &meta, 1, 1.0, &mut out);
    }

    #[test]
    fn valid_input_runs() {
        run(1, 8);
    }

    /// Block 5 of a 2-block cache: the kernel would read past the caches.
    #[test]
    #[should_panic(expected = "out of range")]
    fn block_outside_the_cache_is_refused() {
        run(5, 8);
    }

    #[test]
    #[should_panic(expected = "q and out")]
    fn short_q_is_refused() {
        run(1, 4);
    }
}
