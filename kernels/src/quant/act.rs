//! Activations quantized to signed 8-bit blocks, one row per token.

use super::QK;

/// A `t x k` activation matrix quantized per block of 32 values: `x ≈ d * q`, with `s = d * Σq`
/// kept per block for the offset term of [`super::QFormat::Q4`] weights.
///
/// Each value is `q = round_ties_even(x / d)` with `d = max|x| / 127`; the same operations run on
/// every path, so a token's quantization does not depend on the rest of the batch.
#[derive(Debug, Clone, Default)]
pub struct QuantizedActs {
    /// Tokens (rows).
    pub t: usize,
    /// Values per token (columns), a multiple of 32.
    pub k: usize,
    /// `t * k` quantized values.
    pub qs: Vec<i8>,
    /// Block scales, `ns` per token (the blocks past `k / 32` are zero).
    pub d: Vec<f32>,
    /// Block sums `d * Σq`, laid out like `d`.
    pub s: Vec<f32>,
    /// Stride of `d` and `s` per token: `k / 32` rounded up to a multiple of 8, so the kernels
    /// read whole vectors of scales.
    pub ns: usize,
}

/// Blocks per row rounded up to whole vectors of eight scales.
pub(super) fn padded_blocks(nb: usize) -> usize {
    nb.div_ceil(8) * 8
}

impl QuantizedActs {
    /// Quantizes `x` (`t` rows of `k` values, row-major) into `self`, reusing its buffers.
    pub fn quantize_into(&mut self, x: &[f32], t: usize, k: usize) {
        assert!(k.is_multiple_of(QK) && t.checked_mul(k) == Some(x.len()), "activations must be t x k with k % 32 == 0");
        let (nb, ns) = (k / QK, padded_blocks(k / QK));
        self.t = t;
        self.k = k;
        self.ns = ns;
        self.qs.resize(t * k, 0);
        self.d.clear();
        self.d.resize(t * ns, 0.0);
        self.s.clear();
        self.s.resize(t * ns, 0.0);
        for r in 0..t {
            let (x, qs) = (&x[r * k..(r + 1) * k], &mut self.qs[r * k..(r + 1) * k]);
            let (d, s) = (&mut self.d[r * ns..r * ns + nb], &mut self.s[r * ns..r * ns + nb]);
            #[cfg(target_arch = "x86_64")]
            if super::avx2::available() {
                // SAFETY: `avx2::available()` (`cpu_has_avx2`) confirmed AVX2, FMA and F16C, the
                // features `quantize_acts` is compiled for. `x` and `qs` are this row's `k`-element
                // slices, so its 32-value block loads from `x` and stores to `qs` stay inside both;
                // `d` and `s` it indexes with bounds checks.
                unsafe { super::avx2::quantize_acts(x, qs, d, s) };
                continue;
            }
            quantize_scalar(x, qs, d, s);
        }
    }

    /// Quantizes `x` into a new buffer.
    pub fn quantize(x: &[f32], t: usize, k: usize) -> Self {
        let mut q = Self::default();
        q.quantize_into(x, t, k);
        q
    }
}

pub(super) fn quantize_scalar(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    for (b, blk) in x.chunks_exact(QK).enumerate() {
        let amax = blk.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if amax > 0.0 { 1.0 / db } else { 0.0 };
        let mut sum = 0i32;
        for (j, &v) in blk.iter().enumerate() {
            let q = (v * id).round_ties_even() as i32;
            qs[b * QK + j] = q as i8;
            sum += q;
        }
        d[b] = db;
        s[b] = db * sum as f32;
    }
}
