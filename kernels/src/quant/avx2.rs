//! AVX2 + FMA micro-kernels (x86-64, detected at run time).
//!
//! A tile computes `R` weight rows against `C` tokens. For every weight block and token it runs
//! the same instruction sequence — an integer dot product of 32 pairs (`maddubs` then `madd`),
//! converted to f32, scaled by the product of the two block scales and accumulated with one FMA
//! into an 8-lane accumulator — and the accumulator is reduced in a fixed order. Tiles of any
//! shape therefore give bitwise the same result per output element, which keeps the model
//! batch-invariant.

use std::arch::x86_64::*;

use super::QK;

pub(super) use crate::cpu_has_avx2 as available;

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Quantizes activations block by block (see [`super::QuantizedActs`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_acts(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let sign = _mm256_set1_ps(-0.0);
    let nb = x.len() / QK;
    for b in 0..nb {
        let p = x.as_ptr().add(b * QK);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
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
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(v[j], idv),
            );
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

/// Converts `n` f16 values to f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    while i < n {
        dst[i] = src[i].to_f32();
        i += 1;
    }
}

/// `Σ_b a[b] * b[b]` with 8-lane FMA accumulation and a fixed reduction order.
#[inline(always)]
unsafe fn dot_f32(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc);
        i += 8;
    }
    let mut tail = 0f32;
    while i < n {
        tail += *a.add(i) * *b.add(i);
        i += 1;
    }
    hsum(acc) + tail
}

/// Shared arguments of a tile call.
pub(super) struct Tile<'a> {
    /// Quantized weights of the tile's first row; rows follow at `row_stride` bytes.
    pub qs: *const u8,
    pub row_stride: usize,
    /// f32 scales (and offsets for Q4) of the tile's rows, `nb` per row.
    pub dw: &'a [f32],
    pub mw: &'a [f32],
    /// Blocks per row.
    pub nb: usize,
    /// Quantized activations of the tile's first token; tokens follow at `k` values.
    pub xq: *const i8,
    pub xd: *const f32,
    pub xs: *const f32,
    pub k: usize,
    /// Output of (first token, first row); tokens follow at `ldy`.
    pub y: *mut f32,
    pub ldy: usize,
}

/// Q4 weights: `R` rows by `C` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_tile<const R: usize, const C: usize>(t: &Tile<'_>) {
    let nb = t.nb;
    let mask = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for b in 0..nb {
        for r in 0..R {
            let raw = _mm_loadu_si128(t.qs.add(r * t.row_stride + b * 16) as *const __m128i);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
            let w = _mm256_set_m128i(hi, lo);
            let dw = _mm256_set1_ps(*t.dw.get_unchecked(r * nb + b));
            for c in 0..C {
                let x = _mm256_loadu_si256(t.xq.add(c * t.k + b * QK) as *const __m256i);
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
                let sc = _mm256_mul_ps(dw, _mm256_set1_ps(*t.xd.add(c * nb + b)));
                acc[r][c] = _mm256_fmadd_ps(sc, p, acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            let off = dot_f32(t.mw.as_ptr().add(r * nb), t.xs.add(c * nb), nb);
            *t.y.add(c * t.ldy + r) = hsum(acc[r][c]) + off;
        }
    }
}

/// Q8 weights: `R` rows by `C` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_tile<const R: usize, const C: usize>(t: &Tile<'_>) {
    let nb = t.nb;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    for b in 0..nb {
        for r in 0..R {
            let w = _mm256_loadu_si256(t.qs.add(r * t.row_stride + b * QK) as *const __m256i);
            let aw = _mm256_sign_epi8(w, w);
            let dw = _mm256_set1_ps(*t.dw.get_unchecked(r * nb + b));
            for c in 0..C {
                let x = _mm256_loadu_si256(t.xq.add(c * t.k + b * QK) as *const __m256i);
                let sx = _mm256_sign_epi8(x, w);
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
                let sc = _mm256_mul_ps(dw, _mm256_set1_ps(*t.xd.add(c * nb + b)));
                acc[r][c] = _mm256_fmadd_ps(sc, p, acc[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *t.y.add(c * t.ldy + r) = hsum(acc[r][c]);
        }
    }
}
