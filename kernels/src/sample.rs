//! Greedy token choice, one rule on every device: the index of the largest logit, the lowest
//! index on ties, NaN never chosen, and 0 for a row of nothing but -inf and NaN.
//!
//! [`argmax`] is the rule on a host row (the sampler's greedy path); [`argmax_rows`] applies it
//! to every row of a logits tensor where the tensor lives: on the CPU through [`argmax`], on a
//! GPU with kernels/cuda/sample.cu (one block per row). The GPU's choice is the CPU's choice
//! from the same logits, which candle's own argmax does not promise on ties.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

/// Index of the highest logit, lowest index on ties, NaN never chosen (0 when every logit is
/// -inf or NaN); one pass in eight lanes so it vectorises.
pub fn argmax(logits: &[f32]) -> u32 {
    const L: usize = 8;
    let mut best = [f32::NEG_INFINITY; L];
    let mut at = [u32::MAX; L];
    let chunks = logits.chunks_exact(L);
    let tail = chunks.remainder();
    for (c, chunk) in chunks.enumerate() {
        for j in 0..L {
            let better = chunk[j] > best[j];
            best[j] = if better { chunk[j] } else { best[j] };
            at[j] = if better { (c * L + j) as u32 } else { at[j] };
        }
    }
    let base = logits.len() - tail.len();
    let mut b = f32::NEG_INFINITY;
    let mut i = u32::MAX;
    for (j, &x) in tail.iter().enumerate() {
        if x > b {
            b = x;
            i = (base + j) as u32;
        }
    }
    for j in 0..L {
        if best[j] > b || (best[j] == b && at[j] < i) {
            b = best[j];
            i = at[j];
        }
    }
    if i == u32::MAX {
        0 // all -inf or NaN
    } else {
        i
    }
}

struct ArgmaxRows;

impl candle_core::CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "argmax-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        let Some((start, end)) = l.contiguous_offsets() else { candle_core::bail!("argmax_rows: logits must be contiguous") };
        let row_of = |r: usize, v: &dyn Fn(usize) -> f32| -> u32 {
            let row: Vec<f32> = (0..cols).map(|c| v(start + r * cols + c)).collect();
            argmax(&row)
        };
        let ids: Vec<u32> = match s {
            CpuStorage::F32(x) => (0..rows).map(|r| argmax(&x[start + r * cols..start + (r + 1) * cols])).collect(),
            CpuStorage::F16(x) => (0..rows).map(|r| row_of(r, &|i| x[i].to_f32())).collect(),
            CpuStorage::BF16(x) => (0..rows).map(|r| row_of(r, &|i| x[i].to_f32())).collect(),
            other => candle_core::bail!("argmax_rows: dtype {:?} is not supported (f32, f16, bf16)", other.dtype()),
        };
        debug_assert!(end - start == rows * cols);
        Ok((CpuStorage::U32(ids), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::argmax_rows(s, l)
    }
}

/// The greedy token of every row of `logits` (`[rows, vocab]`, f32, f16 or bf16), as a `[rows]`
/// u32 tensor on the logits' device.
pub fn argmax_rows(logits: &Tensor) -> Result<Tensor> {
    let logits = logits.contiguous()?;
    if !matches!(logits.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        candle_core::bail!("argmax_rows: dtype {:?} is not supported (f32, f16, bf16)", logits.dtype());
    }
    logits.apply_op1_no_bwd(&ArgmaxRows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_highest_logit_wins_ties_go_to_the_lowest_id_and_nan_never_wins() {
        let l = [0.5, 2.0, -1.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, f32::NAN];
        assert_eq!(argmax(&l), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::INFINITY, 3.0, f32::INFINITY]), 1);
        // The tie in the last of eight lanes against an earlier one in the tail.
        let mut v = vec![0.0f32; 21];
        v[7] = 5.0;
        v[20] = 5.0;
        assert_eq!(argmax(&v), 7);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn every_row_and_dtype_follows_the_rule() {
        let rows: Vec<Vec<f32>> = vec![
            vec![1.0, 3.0, 3.0, -2.0, 3.0],
            vec![f32::NAN, f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY, f32::NAN],
            vec![-1.0, -1.0, -1.0, -1.0, f32::INFINITY],
            vec![0.25, 0.5, f32::NAN, 0.5, 0.125],
        ];
        let want: Vec<u32> = rows.iter().map(|r| argmax(r)).collect();
        assert_eq!(want, [1, 0, 4, 1]);
        let flat: Vec<f32> = rows.concat();
        let t = Tensor::from_vec(flat, (4, 5), &Device::Cpu).unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let got: Vec<u32> = argmax_rows(&t.to_dtype(dtype).unwrap()).unwrap().to_vec1().unwrap();
            assert_eq!(got, want, "{dtype:?}");
        }
        // A strided view (the last four columns) is made contiguous first.
        let view = t.narrow(1, 1, 4).unwrap();
        let got: Vec<u32> = argmax_rows(&view).unwrap().to_vec1().unwrap();
        assert_eq!(got, [0, 0, 3, 0]);
        assert!(argmax_rows(&t.to_dtype(DType::U32).unwrap()).is_err());
    }
}
