//! The linear layer, which hides the weight format from the model.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{Module, Tensor};
use pace_kernels::quant::{qmatmul, QuantMatrix};

use crate::error::Result;

/// `y = x · Wᵀ` with `W` of `out x in`, whatever its storage.
#[derive(Clone)]
pub enum Linear {
    /// ggml-quantized weights run by pace's CPU kernels.
    Quant(Arc<QuantMatrix>),
    /// ggml-quantized weights run by candle's quantized matmul (GPU).
    CandleQuant(Arc<QMatMul>, usize, usize),
    /// Dense weights, `out x in`.
    Dense(Tensor),
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Quant(q) => write!(f, "Quant({}x{} {:?})", q.rows(), q.cols(), q.format()),
            Self::CandleQuant(_, o, i) => write!(f, "CandleQuant({o}x{i})"),
            Self::Dense(t) => write!(f, "Dense({:?} {:?})", t.shape(), t.dtype()),
        }
    }
}

impl Linear {
    /// Weights (elements) and the bytes they are stored in: what one pass over the layer reads.
    pub fn footprint(&self) -> (u64, u64) {
        let elems = (self.out_features() * self.in_features()) as u64;
        let bytes = match self {
            Self::Quant(q) => q.size_in_bytes(),
            Self::CandleQuant(m, ..) => match &**m {
                QMatMul::QTensor(t) => t.storage_size_in_bytes(),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.elem_count() * t.dtype().size_in_bytes(),
            },
            Self::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        };
        (elems, bytes as u64)
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        match self {
            Self::Quant(q) => q.rows(),
            Self::CandleQuant(_, o, _) => *o,
            Self::Dense(t) => t.dims()[0],
        }
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        match self {
            Self::Quant(q) => q.cols(),
            Self::CandleQuant(_, _, i) => *i,
            Self::Dense(t) => t.dims()[1],
        }
    }

    /// Applies the layer to `x` of shape `(tokens, in)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Self::Quant(q) => qmatmul(x, q)?,
            Self::CandleQuant(m, _, _) => m.forward(x)?,
            Self::Dense(w) => x.matmul(&w.t()?)?,
        })
    }

    /// Stacks layers that read the same input into one (q/k/v, gate/up), when their storage
    /// allows it; otherwise `None` and the caller keeps them apart.
    pub fn concat_rows(parts: &[&Linear]) -> Result<Option<Linear>> {
        if let Some(qs) = parts
            .iter()
            .map(|p| match p {
                Self::Quant(q) => Some(q.as_ref()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            return Ok(QuantMatrix::concat_rows(&qs).ok().map(|m| Self::Quant(Arc::new(m))));
        }
        if let Some(ds) = parts
            .iter()
            .map(|p| match p {
                Self::Dense(t) => Some(t),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            if ds.windows(2).all(|w| w[0].dtype() == w[1].dtype() && w[0].dims()[1] == w[1].dims()[1]) {
                return Ok(Some(Self::Dense(Tensor::cat(&ds, 0)?)));
            }
        }
        Ok(None)
    }
}

/// Layers that read the same input, fused into one matmul when possible.
#[derive(Debug, Clone)]
pub struct FusedLinear {
    fused: Option<Linear>,
    parts: Vec<Linear>,
    sizes: Vec<usize>,
}

impl FusedLinear {
    /// Fuses `parts` if their storage allows it.
    pub fn new(parts: Vec<Linear>) -> Result<Self> {
        let sizes = parts.iter().map(Linear::out_features).collect();
        let refs: Vec<&Linear> = parts.iter().collect();
        match Linear::concat_rows(&refs)? {
            Some(f) => Ok(Self { fused: Some(f), parts: Vec::new(), sizes }),
            None => Ok(Self { fused: None, parts, sizes }),
        }
    }

    /// Weights and bytes of every part ([`Linear::footprint`]).
    pub fn footprint(&self) -> (u64, u64) {
        self.fused.iter().chain(&self.parts).map(Linear::footprint).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Applies every part to `x` and returns the outputs side by side, `tokens x sum(out)`.
    pub fn forward_concat(&self, x: &Tensor) -> Result<Tensor> {
        match &self.fused {
            Some(f) => f.forward(x),
            None => {
                let parts = self.parts.iter().map(|p| p.forward(x)).collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat(&parts, 1)?)
            }
        }
    }

    /// Applies every part to `x` (`tokens x in`); one output per part.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match &self.fused {
            Some(f) => {
                let y = f.forward(x)?;
                let mut out = Vec::with_capacity(self.sizes.len());
                let mut off = 0;
                for &n in &self.sizes {
                    out.push(y.narrow(1, off, n)?);
                    off += n;
                }
                Ok(out)
            }
            None => self.parts.iter().map(|p| p.forward(x)).collect(),
        }
    }
}
