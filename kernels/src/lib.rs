//! pace-kernels: the compute kernels behind pace's model.
//!
//! - [`quant`]: quantized weight layouts and the CPU quantized matmul (AVX2 with a portable
//!   fallback), bitwise batch-invariant.

pub mod quant;
