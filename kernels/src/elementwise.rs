//! Fused elementwise ops of the MLP.

use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};

struct SiluMul {
    inter: usize,
}

impl candle_core::CustomOp1 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (a, b) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("silu_mul: input must be contiguous".into()))?;
        let x = &s.as_slice::<f32>()?[a..b];
        let i = self.inter;
        let t = x.len() / (2 * i);
        let mut out = vec![0f32; t * i];
        use rayon::prelude::*;
        let rows_per_task = (4096 / i).max(1);
        out.par_chunks_mut(rows_per_task * i).zip(x.par_chunks(rows_per_task * 2 * i)).for_each(|(o, x)| {
            for (orow, xrow) in o.chunks_exact_mut(i).zip(x.chunks_exact(2 * i)) {
                let (g, u) = xrow.split_at(i);
                silu_mul_row(g, u, orow);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((t, i))))
    }
}

fn silu_mul_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_has_avx2() {
        // SAFETY: `cpu_has_avx2()` just confirmed AVX2, FMA and F16C, the features `simd::silu_mul`
        // is compiled for. It reads and writes only below `min(g, u, out)` lengths, so the slices
        // (`split_at(i)` halves of one row and an `i`-element output row) are never overrun.
        unsafe { crate::simd::silu_mul(g, u, out) };
        return;
    }
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `silu(gate) * up` for the fused gate/up projection output `x` = `[gate | up]` of shape
/// `(tokens, 2 * inter)`; returns `(tokens, inter)`. On the CPU one pass with a vectorized exp;
/// elsewhere candle's ops.
pub fn silu_mul(x: &Tensor, inter: usize) -> Result<Tensor> {
    let (_, w) = x.dims2()?;
    if w != 2 * inter {
        candle_core::bail!("silu_mul: {w} columns is not 2 x {inter}");
    }
    if x.device().is_cpu() && x.dtype() == candle_core::DType::F32 {
        return x.contiguous()?.apply_op1_no_bwd(&SiluMul { inter });
    }
    let g = x.narrow(1, 0, inter)?;
    let u = x.narrow(1, inter, inter)?;
    g.silu()?.mul(&u)
}
