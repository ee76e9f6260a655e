//! Small AVX2 helpers shared by the kernels.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

/// exp(x) for x clamped to [-87, 88]: range reduction by ln 2 and a degree-6 polynomial
/// (Cephes' coefficients), relative error about 2e-7.
///
/// # Safety
/// The CPU must support AVX2 and FMA (as [`crate::cpu_has_avx2`] reports); callers are
/// `#[target_feature(enable = "avx2,fma,f16c")]` functions, reached only after that check.
#[inline(always)]
pub(crate) unsafe fn exp(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    // 2^n as a float; n = 128 (x near 88) is split in two factors to stay representable.
    let ni = _mm256_cvtps_epi32(n);
    let half = _mm256_srai_epi32::<1>(ni);
    let a = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(half, _mm256_set1_epi32(127))));
    let b = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127))));
    _mm256_mul_ps(_mm256_mul_ps(p, a), b)
}

/// `out = g * sigmoid(g) * u`, elementwise, over the first `min(g.len(), u.len(), out.len())`
/// elements (the vector loads and stores stay below that bound, so any lengths are fine).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C: call it only when [`crate::cpu_has_avx2`] is true.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len().min(u.len()).min(out.len());
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(g.as_ptr().add(i));
        let e = exp(_mm256_sub_ps(zero, gv));
        let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i))));
        i += 8;
    }
    while i < n {
        out[i] = g[i] / (1.0 + (-g[i]).exp()) * u[i];
        i += 1;
    }
}

/// Sum of the eight lanes, added in a fixed order.
///
/// # Safety
/// The CPU must support AVX (every caller runs under [`crate::cpu_has_avx2`]).
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Largest of the eight lanes.
///
/// # Safety
/// The CPU must support AVX (every caller runs under [`crate::cpu_has_avx2`]).
#[inline(always)]
pub(crate) unsafe fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Eight horizontal sums at once: lane i of the result is the sum of `v[i]`'s lanes, always
/// added as ((0+1)+(2+3)) + ((4+5)+(6+7)), whatever the other vectors hold.
///
/// # Safety
/// The CPU must support AVX (every caller runs under [`crate::cpu_has_avx2`]).
#[inline(always)]
pub(crate) unsafe fn hsum8(v: [__m256; 8]) -> __m256 {
    let a = _mm256_hadd_ps(v[0], v[1]);
    let b = _mm256_hadd_ps(v[2], v[3]);
    let c = _mm256_hadd_ps(v[4], v[5]);
    let d = _mm256_hadd_ps(v[6], v[7]);
    let ab = _mm256_hadd_ps(a, b);
    let cd = _mm256_hadd_ps(c, d);
    let lo = _mm256_permute2f128_ps::<0x20>(ab, cd);
    let hi = _mm256_permute2f128_ps::<0x31>(ab, cd);
    _mm256_add_ps(lo, hi)
}
