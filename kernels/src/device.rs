//! Device questions the engine asks, answered the same way with and without the `cuda` feature,
//! so that callers carry no `#[cfg(feature = "cuda")]`.

use candle_core::{Device, Result};

/// True when this build has CUDA forwards (the `cuda` feature).
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// Readies a device for pace: on CUDA, loads pace's kernels (a broken installation fails here,
/// at start-up, rather than at the first step) and turns candle's per-allocation event tracking
/// off, pace running each device's ops on one stream per thread. Nothing on the CPU.
pub fn prepare(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    return crate::cuda::prepare(device);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(())
    }
}

/// Free and total memory of a CUDA device in bytes; `None` on the CPU.
pub fn memory_info(device: &Device) -> Option<(usize, usize)> {
    #[cfg(feature = "cuda")]
    return crate::cuda::memory_info(device);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        None
    }
}

/// A CUDA device's name, compute capability and multiprocessor count; `None` on the CPU.
pub fn describe(device: &Device) -> Option<String> {
    #[cfg(feature = "cuda")]
    return crate::cuda::describe(device);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        None
    }
}
