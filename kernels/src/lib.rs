//! pace-kernels: the compute kernels behind pace's model.
//!
//! - [`quant`]: quantized weight layouts and the CPU quantized matmul (AVX2 with a portable
//!   fallback), bitwise batch-invariant.
//! - [`attention`]: the paged KV cache's write (`reshape_and_cache`) and `paged_attention`, as
//!   candle custom ops with a CPU forward (and a CUDA forward with the `cuda` feature: kernels in
//!   `kernels/cuda/*.cu`, compiled by build.rs, launched from the private `cuda` module).
//! - [`device`]: the few device questions the engine asks (is CUDA built in, free memory, a
//!   device's name), answered without `#[cfg]` at the call sites.
//! - [`sample`]: greedy token choice with one tie rule on every device (`argmax_rows`: a CPU
//!   forward and the GPU kernel of kernels/cuda/sample.cu).
//!
//! Every `unsafe` block and impl states why it is sound in a `// SAFETY:` comment (enforced by
//! the lint below), and every `unsafe fn` its callers' obligations in a `# Safety` section. The
//! safe functions that hand caller-supplied slices to raw-pointer kernels check the lengths those
//! kernels rely on once, on entry.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod attention;
#[cfg(feature = "cuda")]
mod cuda;
pub mod device;
pub mod elementwise;
pub mod graph;
pub mod quant;
pub mod roofline;
pub mod sample;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use attention::{paged_attention, reshape_and_cache, AttnOptions, CacheGeometry, PagedAttentionMeta};
pub use elementwise::silu_mul;

/// True when the CPU has AVX2, FMA and F16C (detected once, at run time). The kernels take their
/// vector paths only then, and their portable paths elsewhere.
#[cfg(target_arch = "x86_64")]
pub fn cpu_has_avx2() -> bool {
    use std::sync::OnceLock;
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c"))
}

/// No vector paths off x86-64.
#[cfg(not(target_arch = "x86_64"))]
pub fn cpu_has_avx2() -> bool {
    false
}
