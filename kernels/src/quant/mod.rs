//! Quantized matrix multiplication on the CPU.
//!
//! Weights arrive in one of ggml's block formats and are repacked once, at load, into one of two
//! internal layouts that the kernels understand:
//!
//! | layout | per 32 weights | holds exactly | holds after requantization |
//! |---|---|---|---|
//! | [`QFormat::Q4`] | 16 bytes of nibbles, f16 scale `d`, f16 offset `m`: `w = d*q + m` | Q4_0 (`m = -8d`), Q4_1, Q4_K (sub-block scales rounded to f16) | |
//! | [`QFormat::Q8`] | 32 signed bytes, f16 scale `d`: `w = d*q` | Q8_0 | Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, Q8_K |
//!
//! Scales live in their own arrays (structure of arrays), so the kernels load them as vectors
//! and the nibbles stream contiguously per row. The formats that are requantized to 8 bits gain
//! at most half a step of a 127-level grid per block (about 0.4% of the block's largest weight),
//! far below their own quantization error, and cost 8.5 bits per weight.
//!
//! Activations are quantized per token to signed 8-bit blocks of 32 with an f32 scale
//! ([`QuantizedActs`]); a block dot product is an integer dot product (AVX2 `maddubs`) scaled by
//! the two block scales. Every output element is computed by one sequence of operations that does
//! not depend on the batch size, the tile shape or the thread count, so results are bitwise
//! batch-invariant: a token's output is the same alone or inside any batch.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod convert;
mod gemm;
mod op;
mod scalar;

pub use act::QuantizedActs;

/// True when the AVX2 kernels run on this CPU.
fn avx2_available() -> bool {
    crate::cpu_has_avx2()
}
pub use convert::ggml_dequantize;
pub use gemm::matmul;
pub use op::qmatmul;

use candle_core::quantized::GgmlDType;
use half::f16;

/// Weights per quantization block.
pub const QK: usize = 32;

/// Tokens per tile of the matrix kernels (the portable ones and AVX2's).
pub(crate) const TOKENS: usize = 2;

/// Internal weight layout (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QFormat {
    /// 4-bit unsigned nibbles with scale and offset per block.
    Q4,
    /// 8-bit signed values with a scale per block.
    Q8,
}

/// A quantized weight matrix of `rows` output features by `cols` input features, row-major.
#[derive(Clone)]
pub struct QuantMatrix {
    format: QFormat,
    rows: usize,
    cols: usize,
    /// Q4: `rows * cols / 2` bytes; in each 16-byte block, byte j holds weight j in its low
    /// nibble and weight j+16 in its high nibble. Q8: `rows * cols` signed bytes.
    qs: Vec<u8>,
    /// Per-block scale, `rows * cols / 32`, then [`SCALE_PAD`] zeros so the kernels can load
    /// eight scales from any block of any row.
    d: Vec<f16>,
    /// Per-block offset (Q4 only; empty for Q8), laid out like `d`.
    m: Vec<f16>,
}

/// Zero scales after the last row's, for whole-vector loads.
pub(crate) const SCALE_PAD: usize = 8;

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix").field("format", &self.format).field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

/// Errors from building a quantized matrix.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The byte count does not match the shape and format.
    #[error("{what}: expected {expected} bytes for {rows}x{cols} {dtype:?}, got {got}")]
    Size {
        /// Which tensor.
        what: String,
        /// Format.
        dtype: GgmlDType,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Expected bytes.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The shape is not usable (columns must be a multiple of the block size).
    #[error("{0}")]
    Shape(String),
    /// The format is not a quantized ggml format pace can use.
    #[error("unsupported weight format {0:?}")]
    Unsupported(GgmlDType),
}

impl QuantMatrix {
    /// Appends the scale padding (once, after the rows are filled).
    pub(crate) fn padded(mut self) -> Self {
        self.d.extend(std::iter::repeat_n(f16::ZERO, SCALE_PAD));
        if self.format == QFormat::Q4 {
            self.m.extend(std::iter::repeat_n(f16::ZERO, SCALE_PAD));
        }
        self
    }

    /// Internal layout.
    pub fn format(&self) -> QFormat {
        self.format
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / QK
    }

    /// Bytes of one row's weights in `qs` (16 a block for Q4, 32 for Q8).
    pub(crate) fn row_bytes(&self) -> usize {
        match self.format {
            QFormat::Q4 => self.blocks_per_row() * QK / 2,
            QFormat::Q8 => self.blocks_per_row() * QK,
        }
    }

    /// Bytes of weight data held.
    pub fn size_in_bytes(&self) -> usize {
        self.qs.len() + 2 * (self.d.len() + self.m.len())
    }

    /// Converts ggml block data (`rows` rows of `cols` weights, row-major) into the internal
    /// layout. See the module docs for which formats are exact.
    pub fn from_ggml(what: &str, dtype: GgmlDType, data: &[u8], rows: usize, cols: usize) -> Result<Self, QuantError> {
        convert::from_ggml(what, dtype, data, rows, cols)
    }

    /// Quantizes an f32 row-major matrix to the given internal layout (tests, dummy weights).
    pub fn quantize(format: QFormat, data: &[f32], rows: usize, cols: usize) -> Result<Self, QuantError> {
        convert::quantize_f32(format, data, rows, cols)
    }

    /// Stacks matrices with the same column count and format vertically (used to fuse the q/k/v
    /// and gate/up projections into one matmul).
    pub fn concat_rows(parts: &[&QuantMatrix]) -> Result<Self, QuantError> {
        let first = parts.first().ok_or_else(|| QuantError::Shape("concat of nothing".into()))?;
        if parts.iter().any(|p| p.cols != first.cols || p.format != first.format) {
            return Err(QuantError::Shape("concatenated matrices must share columns and format".into()));
        }
        let mut out =
            QuantMatrix { format: first.format, rows: parts.iter().map(|p| p.rows).sum(), cols: first.cols, qs: Vec::new(), d: Vec::new(), m: Vec::new() };
        for p in parts {
            let n = p.rows * p.blocks_per_row();
            out.qs.extend_from_slice(&p.qs);
            out.d.extend_from_slice(&p.d[..n]);
            if p.format == QFormat::Q4 {
                out.m.extend_from_slice(&p.m[..n]);
            }
        }
        Ok(out.padded())
    }

    /// Dequantizes row `r` into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let nb = self.blocks_per_row();
        for b in 0..nb {
            let d = self.d[r * nb + b].to_f32();
            let o = &mut out[b * QK..(b + 1) * QK];
            match self.format {
                QFormat::Q4 => {
                    let m = self.m[r * nb + b].to_f32();
                    let q = &self.qs[(r * nb + b) * 16..(r * nb + b + 1) * 16];
                    for j in 0..16 {
                        o[j] = d * (q[j] & 0x0F) as f32 + m;
                        o[j + 16] = d * (q[j] >> 4) as f32 + m;
                    }
                }
                QFormat::Q8 => {
                    let q = &self.qs[(r * nb + b) * QK..(r * nb + b + 1) * QK];
                    for j in 0..QK {
                        o[j] = d * (q[j] as i8) as f32;
                    }
                }
            }
        }
    }

    /// Dequantizes the whole matrix (row-major f32).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }

    /// Gathers rows as f32 (an embedding lookup). Ids must be `< rows`.
    pub fn gather_rows(&self, ids: &[u32], out: &mut [f32]) {
        for (i, &id) in ids.iter().enumerate() {
            self.dequantize_row(id as usize, &mut out[i * self.cols..(i + 1) * self.cols]);
        }
    }
}
