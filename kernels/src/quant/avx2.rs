//! AVX2 + FMA micro-kernels (x86-64, detected at run time).
//!
//! A tile computes `R` weight rows against `C` tokens. For every weight block (Q8) or pair of
//! blocks (Q4, see [`q4_tile`]) and token it runs the same instruction sequence — integer dot
//! products (`maddubs` then `madd`), converted to f32, scaled by the block scales and accumulated
//! with one FMA into an 8-lane accumulator — and the accumulator is reduced in a fixed order.
//! Tiles of any shape therefore give bitwise the same result per output element, which keeps the
//! model batch-invariant.
//!
//! A matrix is streamed from memory once per matmul, row tile after row tile; the kernels
//! prefetch the rows two tiles ahead, which the hardware prefetcher alone does not keep up with
//! (one stream, single-thread decode: 82 -> 100 tok/s).

use std::arch::x86_64::*;

use super::{QK, TOKENS};
use crate::simd::hsum8;

pub(super) use crate::cpu_has_avx2 as available;

/// Quantizes activations block by block (see [`super::QuantizedActs`]): `x.len() / 32` blocks,
/// into `qs`, `d` and `s`.
///
/// # Safety
/// - The CPU must support AVX2, FMA and F16C ([`available`] is true).
/// - `qs.len() >= x.len() / 32 * 32`: each block's 32 bytes are stored through a raw pointer.
///   (`d` and `s` are indexed with bounds checks, so their lengths are the caller's to get
///   right but not a safety matter.)
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_acts(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let sign = _mm256_set1_ps(-0.0);
    let nb = x.len() / QK;
    for b in 0..nb {
        let p = x.as_ptr().add(b * QK);
        let v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))];
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
        let amax = _mm_cvtss_f32(m1);
        let db = amax / 127.0;
        let id = if amax > 0.0 { 1.0 / db } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut qi = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[j], idv));
            qi[j] = _mm256_cvtps_epi32(r);
        }
        let sum = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
        let isum = _mm_cvtsi128_si32(s1);
        // Pack 4x8 i32 to 32 i8; the packs work per 128-bit lane, so restore the order after.
        let p01 = _mm256_packs_epi32(qi[0], qi[1]);
        let p23 = _mm256_packs_epi32(qi[2], qi[3]);
        let p = _mm256_packs_epi16(p01, p23);
        let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, p);
        d[b] = db;
        s[b] = db * isum as f32;
    }
}

/// Unpacks `rows` rows of Q4 nibbles (`nb` blocks each, rows `row_stride` bytes apart) into one
/// byte per weight, `nb * 32` bytes per row, in the order [`q4_tile`] reads: each pair of blocks
/// as its 32 low nibbles (weights 0-15 of both) then its 32 high nibbles (weights 16-31); an odd
/// last block as its low then its high nibbles.
///
/// # Safety
/// - The CPU must support AVX2, FMA and F16C ([`available`] is true).
/// - For every `r < rows`, the `nb * 16` bytes at `qs + r * row_stride` are readable (one
///   packed Q4 row each).
/// - `out.len() >= rows * nb * 32`.
///
/// The prefetch of the next row tile uses a wrapping address and never dereferences it, so it
/// may point past the matrix.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_q4(qs: *const u8, row_stride: usize, rows: usize, nb: usize, out: &mut [u8]) {
    let mask = _mm256_set1_epi8(0x0F);
    for r in 0..rows {
        let src = qs.add(r * row_stride);
        let dst = out.as_mut_ptr().add(r * nb * QK);
        let mut b = 0;
        while b + 2 <= nb {
            if b % 4 == 0 {
                // The next row tile follows these rows: fetch it while these are unpacked.
                _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(rows * row_stride + b * 16) as *const i8);
            }
            let raw = _mm256_loadu_si256(src.add(b * 16) as *const __m256i);
            _mm256_storeu_si256(dst.add(b * QK) as *mut __m256i, _mm256_and_si256(raw, mask));
            _mm256_storeu_si256(dst.add(b * QK + QK) as *mut __m256i, _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask));
            b += 2;
        }
        if b < nb {
            let raw = _mm_loadu_si128(src.add(b * 16) as *const __m128i);
            let m = _mm256_castsi256_si128(mask);
            let w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(raw), m), _mm_and_si128(raw, m));
            _mm256_storeu_si256(dst.add(b * QK) as *mut __m256i, w);
        }
    }
}

/// Reorders quantized activations (`t` rows of `k`) for [`q4_tile`]: in each pair of blocks the
/// first block's high half (values 16-31) and the second's low half (values 0-15) swap places,
/// so the pair reads as its two low halves, then its two high halves. An odd last block stays.
///
/// # Safety
/// - The CPU must support AVX2, FMA and F16C ([`available`] is true).
/// - `qs.len() >= t * k` (row `row` is read and written at `row * k .. row * k + k / 32 * 32`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pair_acts(qs: &mut [i8], t: usize, k: usize) {
    let nb = k / QK;
    for row in 0..t {
        let p = qs.as_mut_ptr().add(row * k);
        let mut b = 0;
        while b + 2 <= nb {
            let q = p.add(b * QK) as *mut __m256i;
            let (x0, x1) = (_mm256_loadu_si256(q), _mm256_loadu_si256(q.add(1)));
            _mm256_storeu_si256(q, _mm256_permute2x128_si256::<0x20>(x0, x1));
            _mm256_storeu_si256(q.add(1), _mm256_permute2x128_si256::<0x31>(x0, x1));
            b += 2;
        }
    }
}

/// Shared arguments of a tile call.
///
/// The kernels taking a `Tile` ([`q4_rows`], [`q8_rows`]) read and write through its raw
/// pointers without bounds checks; their `# Safety` sections list what the pointers must cover.
/// With `R` rows and `ntok` tokens:
/// - `qs`: for each row `r < R`, its weights at `qs + r * row_stride`: `nb * 16` bytes (Q4
///   packed), `nb * 32` bytes (Q4 `UNPACKED`, Q8).
/// - `wd` (and `wm` for Q4): `R * nb + 7` readable f16 values (eight are loaded from any block
///   of any of the rows; the matrix's [`super::SCALE_PAD`] zeros cover the last row's).
/// - `xq`: for each token `c < ntok`, `nb * 32` readable values at `xq + c * k`.
/// - `xd`, `xs`: for each token, `ns` readable values at `c * ns`, with `ns` a multiple of 8
///   and `>= nb` (eight are loaded from every eighth block).
/// - `y`: writable at `c * ldy + r` for `r < R`, `c < ntok`, and accessed by nobody else
///   during the call.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    /// Weights of the tile's first row; rows follow at `row_stride` bytes. Q4: packed nibbles
    /// (16 bytes a block) or, when `UNPACKED`, one byte per weight (32 bytes a block). Q8: 32
    /// signed bytes a block.
    pub qs: *const u8,
    pub row_stride: usize,
    /// The matrix's own f16 scales (and offsets) from the tile's first row, `nb` per row,
    /// padded at the end so eight can be loaded from any block (read when packed).
    pub wd: *const half::f16,
    pub wm: *const half::f16,
    /// Blocks per row.
    pub nb: usize,
    /// Stride of the activations' scale arrays (`xd`, `xs`) per token, a multiple of 8 and at
    /// least `nb` (the weights' own scales are `nb` a row).
    pub ns: usize,
    /// Quantized activations of the tile's first token; tokens follow at `k` values.
    pub xq: *const i8,
    pub xd: *const f32,
    pub xs: *const f32,
    pub k: usize,
    /// Output of (first token, first row); tokens follow at `ldy`.
    pub y: *mut f32,
    pub ldy: usize,
}

/// Lane masks keeping the first `n` of eight 16-bit values.
static TAIL_MASK: [[u16; 8]; 9] = {
    let mut m = [[0u16; 8]; 9];
    let mut n = 0;
    while n <= 8 {
        let mut i = 0;
        while i < n {
            m[n][i] = 0xFFFF;
            i += 1;
        }
        n += 1;
    }
    m
};

/// The first `n` of eight f16 values at `p` as f32, the rest zero (`p` may point up to seven
/// values before the end of a padded scale array).
///
/// # Safety
/// The CPU must support AVX and F16C, and the eight f16 values (16 bytes) at `p` must be
/// readable, whatever `n` is (the mask is applied after the load). `n <= 8` is checked.
#[inline(always)]
unsafe fn load_scales8(p: *const half::f16, n: usize) -> __m256 {
    let v = _mm_loadu_si128(p as *const __m128i);
    let v = _mm_and_si128(v, _mm_loadu_si128(TAIL_MASK[n].as_ptr() as *const __m128i));
    _mm256_cvtph_ps(v)
}

/// Scale products `dw[r][b] * xd[c][b]` for the (up to) eight blocks from `b0`, the weights'
/// scales converted here from the matrix's f16 scales.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `t.wd` must have eight readable values at
/// `r * t.nb + b0` for every `r < R`, and `t.xd` eight at `c * t.ns + b0` for every `c < C`
/// (see [`Tile`]).
#[inline(always)]
unsafe fn scale_products<const R: usize, const C: usize>(t: &Tile, b0: usize, n: usize, sc: &mut [[[f32; 8]; C]; R]) {
    for (r, scr) in sc.iter_mut().enumerate() {
        let dw = load_scales8(t.wd.add(r * t.nb + b0), n);
        for (c, s) in scr.iter_mut().enumerate() {
            let dx = _mm256_loadu_ps(t.xd.add(c * t.ns + b0));
            _mm256_storeu_ps(s.as_mut_ptr(), _mm256_mul_ps(dw, dx));
        }
    }
}

/// Reduces each accumulator to its sum and writes tile output (r, c). Sums go through [`hsum8`],
/// whose per-vector order does not depend on the other vectors, so every tile shape rounds alike.
///
/// # Safety
/// The CPU must support AVX; `t.y` must be writable at `c * t.ldy + r` for every `r < R`,
/// `c < C`, with no other access during the call. `R * C <= 16` (checked by the indexing of
/// `flat`).
#[inline(always)]
unsafe fn store_tile<const R: usize, const C: usize>(t: &Tile, acc: &[[__m256; C]; R]) {
    let mut flat = [_mm256_setzero_ps(); 16];
    for r in 0..R {
        for c in 0..C {
            flat[r * C + c] = acc[r][c];
        }
    }
    let mut sums = [0f32; 16];
    for g in 0..(R * C).div_ceil(8) {
        let v: [__m256; 8] = std::array::from_fn(|i| flat[g * 8 + i]);
        _mm256_storeu_ps(sums.as_mut_ptr().add(g * 8), hsum8(v));
    }
    for r in 0..R {
        for c in 0..C {
            *t.y.add(c * t.ldy + r) = sums[r * C + c];
        }
    }
}

impl Tile {
    /// The same rows, from `c` tokens further on.
    ///
    /// # Safety
    /// Token `c` must be one the tile covers (`c < ntok`, see [`Tile`]), so that every offset
    /// pointer stays inside its buffer.
    #[inline(always)]
    unsafe fn at(&self, c: usize) -> Tile {
        Tile { xq: self.xq.add(c * self.k), xd: self.xd.add(c * self.ns), xs: self.xs.add(c * self.ns), y: self.y.add(c * self.ldy), ..*self }
    }
}

/// `R` rows of Q4 weights against `ntok` tokens, [`TOKENS`] at a time (one call per row tile,
/// so the tiles of a row tile share one set-up).
///
/// # Safety
/// - The CPU must support AVX2, FMA and F16C ([`available`] is true).
/// - `t` covers `R` rows of Q4 weights (packed, or unpacked when `UNPACKED`) and `ntok`
///   tokens as the [`Tile`] docs list, and `t.wm` is the matrix's offsets.
/// - `t.xq` holds the activations reordered by [`pair_acts`] (otherwise the result is wrong,
///   though nothing is read out of bounds).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_rows<const R: usize, const UNPACKED: bool>(t: &Tile, ntok: usize) {
    let mut c = 0;
    while c + TOKENS <= ntok {
        q4_tile::<R, TOKENS, UNPACKED>(&t.at(c));
        c += TOKENS;
    }
    if c < ntok {
        q4_tile::<R, 1, UNPACKED>(&t.at(c));
    }
}

/// `R` rows of Q8 weights against `ntok` tokens, as [`q4_rows`].
///
/// # Safety
/// - The CPU must support AVX2, FMA and F16C ([`available`] is true).
/// - `t` covers `R` rows of Q8 weights and `ntok` tokens as the [`Tile`] docs list (`t.wm` is
///   not read).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_rows<const R: usize>(t: &Tile, ntok: usize) {
    let mut c = 0;
    while c + TOKENS <= ntok {
        q8_tile::<R, TOKENS>(&t.at(c));
        c += TOKENS;
    }
    if c < ntok {
        q8_tile::<R, 1>(&t.at(c));
    }
}

/// Q4 weights: `R` rows by `C` tokens.
///
/// Blocks go in pairs: one 32-byte load holds both blocks' nibbles, whose low nibbles (weights
/// 0-15 of the two blocks) and high nibbles (weights 16-31) each meet the matching halves of the
/// two activation blocks in one `maddubs`. The two products are added as 16-bit values (at most
/// 4 * 15 * 127, exact), so a lane of the 32-bit sums holds eight products of one block, lanes
/// 0-3 the first block's and 4-7 the second's, and one FMA with the two blocks' scales spread
/// over their lanes accumulates both. An odd last block goes alone. Every path (packed or
/// unpacked, any tile shape) pairs the blocks the same way, so results stay bitwise the same.
///
/// The offset terms `m * d_x * Σq_x` of eight blocks go into the same accumulators, one FMA per
/// (row, token) per eight blocks: an accumulator's lanes are summed at the end anyway, and a
/// second set of accumulators would not fit in the sixteen registers.
///
/// # Safety
/// As [`q4_rows`] with `ntok = C`. The prefetch of the rows two tiles ahead uses a wrapping
/// address and never dereferences it, so it may point past the matrix.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_tile<const R: usize, const C: usize, const UNPACKED: bool>(t: &Tile) {
    let nb = t.nb;
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut sc = [[[0f32; 8]; C]; R];
    // Scale products of each block pair spread over the pair's lanes (lanes 0-3 the first
    // block's, 4-7 the second's), computed before the dot products that use them.
    let mut spread = [[[_mm256_setzero_ps(); 4]; C]; R];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(8);
        scale_products::<R, C>(t, b0, n, &mut sc);
        for (scr, spr) in sc.iter().zip(spread.iter_mut()) {
            for (s, sp) in scr.iter().zip(spr.iter_mut()) {
                let v = _mm256_loadu_ps(s.as_ptr());
                for (i, x) in sp.iter_mut().enumerate() {
                    let idx = _mm256_add_epi32(_mm256_set1_epi32(2 * i as i32), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
                    *x = _mm256_permutevar8x32_ps(v, idx);
                }
            }
        }
        // Offsets of these blocks (zero past nb in both operands).
        for (r, ar) in acc.iter_mut().enumerate() {
            let m = load_scales8(t.wm.add(r * nb + b0), n);
            for (c, a) in ar.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(m, _mm256_loadu_ps(t.xs.add(c * t.ns + b0)), *a);
            }
        }
        let mut j = 0;
        while j + 2 <= n {
            let b = b0 + j;
            for r in 0..R {
                let (lo, hi) = if UNPACKED {
                    let p = t.qs.add(r * t.row_stride + b * QK);
                    (_mm256_loadu_si256(p as *const __m256i), _mm256_loadu_si256(p.add(QK) as *const __m256i))
                } else {
                    if C == 1 && j % 4 == 0 {
                        // A matrix-vector product streams the matrix from memory once: fetch
                        // the rows two tiles ahead while these are computed.
                        _mm_prefetch::<_MM_HINT_T0>(t.qs.wrapping_add((r + 2 * R) * t.row_stride + b * 16) as *const i8);
                    }
                    let raw = _mm256_loadu_si256(t.qs.add(r * t.row_stride + b * 16) as *const __m256i);
                    (_mm256_and_si256(raw, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask))
                };
                for c in 0..C {
                    // Activations are stored paired (see `pair_acts`): the pair's low halves,
                    // then its high halves.
                    let xp = t.xq.add(c * t.k + b * QK) as *const __m256i;
                    let (xlo, xhi) = (_mm256_loadu_si256(xp), _mm256_loadu_si256(xp.add(1)));
                    let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
                    let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
                    acc[r][c] = _mm256_fmadd_ps(spread[r][c][j / 2], p, acc[r][c]);
                }
            }
            j += 2;
        }
        if j < n {
            let b = b0 + j;
            for r in 0..R {
                let w = if UNPACKED {
                    _mm256_loadu_si256(t.qs.add(r * t.row_stride + b * QK) as *const __m256i)
                } else {
                    let raw = _mm_loadu_si128(t.qs.add(r * t.row_stride + b * 16) as *const __m128i);
                    let m = _mm256_castsi256_si128(mask);
                    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(raw), m), _mm_and_si128(raw, m))
                };
                for c in 0..C {
                    let x = _mm256_loadu_si256(t.xq.add(c * t.k + b * QK) as *const __m256i);
                    let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][c][j]), p, acc[r][c]);
                }
            }
        }
        b0 += n;
    }
    store_tile(t, &acc);
}

/// Q8 weights: `R` rows by `C` tokens.
///
/// # Safety
/// As [`q8_rows`] with `ntok = C`; the prefetch is as in [`q4_tile`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `j` indexes the block, the prefetch and `sc` alike
unsafe fn q8_tile<const R: usize, const C: usize>(t: &Tile) {
    let nb = t.nb;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut sc = [[[0f32; 8]; C]; R];
    let mut b0 = 0;
    while b0 < nb {
        let n = (nb - b0).min(8);
        scale_products::<R, C>(t, b0, n, &mut sc);
        for j in 0..n {
            let b = b0 + j;
            for r in 0..R {
                if j % 2 == 0 {
                    // As in q4_tile: fetch the rows two tiles ahead (a line per two blocks).
                    _mm_prefetch::<_MM_HINT_T0>(t.qs.wrapping_add((r + 2 * R) * t.row_stride + b * QK) as *const i8);
                }
                let w = _mm256_loadu_si256(t.qs.add(r * t.row_stride + b * QK) as *const __m256i);
                let aw = _mm256_sign_epi8(w, w);
                for c in 0..C {
                    let x = _mm256_loadu_si256(t.xq.add(c * t.k + b * QK) as *const __m256i);
                    let sx = _mm256_sign_epi8(x, w);
                    let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][c][j]), p, acc[r][c]);
                }
            }
        }
        b0 += n;
    }
    store_tile(t, &acc);
}
