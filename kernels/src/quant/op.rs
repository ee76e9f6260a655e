//! The quantized matmul as a candle op, so model code stays in tensors.

use std::sync::Arc;

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

use super::QuantMatrix;

struct QMatMul(Arc<QuantMatrix>);

impl candle_core::CustomOp1 for QMatMul {
    fn name(&self) -> &'static str {
        "pace-qmatmul"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (a, b) = l.contiguous_offsets().ok_or_else(|| candle_core::Error::Msg("qmatmul: input must be contiguous".into()))?;
        let x = &s.as_slice::<f32>()?[a..b];
        let dims = l.shape().dims();
        let k = *dims.last().unwrap_or(&0);
        let t = x.len() / k.max(1);
        let mut y = vec![0f32; t * self.0.rows()];
        super::matmul(&self.0, x, t, &mut y);
        let mut out_dims = dims.to_vec();
        if let Some(last) = out_dims.last_mut() {
            *last = self.0.rows();
        }
        Ok((CpuStorage::F32(y), Shape::from(out_dims)))
    }
}

/// `x · wᵀ` on the CPU: `x` is `(..., cols)`, the result `(..., rows)` in f32.
pub fn qmatmul(x: &Tensor, w: &Arc<QuantMatrix>) -> Result<Tensor> {
    if !x.device().is_cpu() {
        candle_core::bail!("pace's quantized matmul runs on the CPU; use candle's QMatMul on a GPU");
    }
    if x.dims().last() != Some(&w.cols()) {
        candle_core::bail!("qmatmul: input {:?} does not match weight with {} columns", x.shape(), w.cols());
    }
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    x.apply_op1_no_bwd(&QMatMul(w.clone()))
}
