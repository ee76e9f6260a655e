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
    /// `t * k / 32` block scales.
    pub d: Vec<f32>,
    /// `t * k / 32` block sums `d * Σq`.
    pub s: Vec<f32>,
}

impl QuantizedActs {
    /// Quantizes `x` (`t` rows of `k` values, row-major) into `self`, reusing its buffers.
    pub fn quantize_into(&mut self, x: &[f32], t: usize, k: usize) {
        assert!(k % QK == 0 && x.len() == t * k, "activations must be t x k with k % 32 == 0");
        let nb = t * k / QK;
        self.t = t;
        self.k = k;
        self.qs.resize(t * k, 0);
        self.d.resize(nb, 0.0);
        self.s.resize(nb, 0.0);
        #[cfg(target_arch = "x86_64")]
        if super::avx2::available() {
            // SAFETY: AVX2 and FMA were detected at run time.
            unsafe { super::avx2::quantize_acts(x, &mut self.qs, &mut self.d, &mut self.s) };
            return;
        }
        quantize_scalar(x, &mut self.qs, &mut self.d, &mut self.s);
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
