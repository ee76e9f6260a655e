//! Device questions the engine asks, answered the same way with and without the `cuda` feature,
//! so that callers carry no `#[cfg(feature = "cuda")]`.

use candle_core::{Device, DeviceLocation, Result};

pub use crate::graph::{shared_stream_problem, GraphCounts};

/// True when this build has CUDA forwards (the `cuda` feature).
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// Opens CUDA device `ordinal` the way pace needs it: one explicit stream that every host thread
/// launches on (candle's `Device::new_cuda` gives each thread its own default stream, and a step
/// touches the device from more than one thread), event tracking off, pace's kernels loaded. An
/// error on the CPU build.
pub fn open_cuda(ordinal: usize) -> Result<Device> {
    #[cfg(feature = "cuda")]
    return crate::cuda::open(ordinal);
    #[cfg(not(feature = "cuda"))]
    candle_core::bail!("CUDA device {ordinal}: this is the CPU build of pace-kernels")
}

/// Readies a device for pace: on CUDA, refuses a device whose stream is not one shared stream
/// (see [`open_cuda`]), turns candle's per-allocation event tracking off and loads pace's kernels
/// (a broken installation fails here, at start-up, rather than at the first step). Nothing on
/// the CPU.
pub fn prepare(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    return crate::cuda::prepare(device);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(())
    }
}

/// Whether the model's forward pass should run inside the kernel pool (rayon) rather than on the
/// calling thread. On the CPU it should: the kernels' parallel loops then start inside the pool.
/// On a GPU it must not leave the calling thread: the forward pass only enqueues launches, and
/// the thread that uploads a step's inputs and reads its tokens back is the one that orders them.
pub fn forward_on_kernel_pool(location: DeviceLocation) -> bool {
    matches!(location, DeviceLocation::Cpu)
}

/// Waits until all of a device's work, on every stream of its context, is done. Nothing on the
/// CPU.
pub fn synchronize(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    return crate::cuda::synchronize(device);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(())
    }
}

/// Times `f`: the host seconds it took to return and, on a GPU, the GPU seconds between events
/// recorded on the device's stream before and after it. When `f` does not wait for the GPU, the
/// host time is the enqueue time and the GPU time what the launches took.
pub fn time_on_device<R, E: From<candle_core::Error>>(device: &Device, f: impl FnOnce() -> std::result::Result<R, E>) -> std::result::Result<(R, Timing), E> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let (r, host, gpu) = crate::cuda::time_on_gpu(d, f)?;
        return Ok((r, Timing { host_s: host, gpu_s: Some(gpu) }));
    }
    let _ = device;
    let t0 = std::time::Instant::now();
    let r = f()?;
    Ok((r, Timing { host_s: t0.elapsed().as_secs_f64(), gpu_s: None }))
}

/// What [`time_on_device`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub host_s: f64,
    pub gpu_s: Option<f64>,
}

/// A stretch of device work captured as a CUDA graph, ready to replay.
pub struct CapturedGraph {
    #[cfg(feature = "cuda")]
    inner: crate::cuda::Captured,
}

impl CapturedGraph {
    /// Its nodes by kind: `kernels` is the number of kernel launches the stretch made.
    pub fn counts(&self) -> GraphCounts {
        #[cfg(feature = "cuda")]
        return self.inner.counts;
        #[cfg(not(feature = "cuda"))]
        GraphCounts::default()
    }

    /// Runs the captured work again, on the stream it was captured from.
    pub fn replay(&self) -> Result<()> {
        #[cfg(feature = "cuda")]
        return self.inner.replay();
        #[cfg(not(feature = "cuda"))]
        Ok(())
    }
}

/// Captures what `f` launches on a GPU's stream into a CUDA graph and runs the graph once in its
/// place (a diagnostic: how many launches a step makes, and what replaying them as one graph
/// costs). `f` runs twice, a warm-up and the capture. An error on the CPU, or when something in
/// `f` cannot be captured (a synchronous copy, a synchronisation). Drop the returned result
/// before [`CapturedGraph::replay`]: a replay remakes the graph's allocations.
pub fn capture<R, E: From<candle_core::Error>>(device: &Device, f: impl FnMut() -> std::result::Result<R, E>) -> std::result::Result<(R, CapturedGraph), E> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        let (r, inner) = crate::cuda::capture(d, f)?;
        return Ok((r, CapturedGraph { inner }));
    }
    let _ = (device, f);
    Err(candle_core::Error::Msg("graph capture needs a CUDA device".into()).into())
}

/// ptxas's registers, spill bytes and shared memory for each of pace's kernels and each machine
/// architecture, recorded when this binary was built (tab-separated, a header line first);
/// `None` on the CPU build.
pub fn ptxas_report() -> Option<&'static str> {
    #[cfg(feature = "cuda")]
    return Some(crate::cuda::PTXAS_REPORT);
    #[cfg(not(feature = "cuda"))]
    None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_forward_stays_on_the_thread_that_orders_the_step() {
        assert!(forward_on_kernel_pool(DeviceLocation::Cpu));
        assert!(!forward_on_kernel_pool(DeviceLocation::Cuda { gpu_id: 0 }));
        assert!(!forward_on_kernel_pool(DeviceLocation::Cuda { gpu_id: 3 }));
    }

    #[test]
    fn the_cpu_build_opens_no_gpu_and_times_on_the_host() {
        if CUDA_BUILT {
            return;
        }
        assert!(open_cuda(0).is_err());
        assert!(ptxas_report().is_none());
        let (v, t) = time_on_device(&Device::Cpu, || Ok::<_, candle_core::Error>(7)).unwrap();
        assert_eq!(v, 7);
        assert!(t.gpu_s.is_none() && t.host_s >= 0.0);
        assert!(capture(&Device::Cpu, || Ok::<_, candle_core::Error>(())).is_err());
        synchronize(&Device::Cpu).unwrap();
    }
}
