//! The machine's own limits, measured where the engine runs (`pace engine-bench --roofline`)
//!
//! Memory bandwidth comes from a STREAM-style triad over buffers far larger than the last-level
//! cache, and the peak rates of the two arithmetic kernels the CPU matmul is built from, f32
//! fused multiply-add and the int8 dot (`vpmaddubsw` -> `vpmaddwd` -> `vpaddd`), from
//! register-resident loops with enough independent chains to hide latency.
//!
//! Every kernel runs on `threads` OS threads at once (one per core the engine uses) and the
//! best of a few repetitions is kept, as STREAM does.

use std::hint::black_box;
use std::time::Instant;

/// Runs the jobs on one thread each, started together; returns the wall time from the common
/// start to the last one's end, seconds.
fn timed<F: FnOnce() + Send>(jobs: Vec<F>) -> f64 {
    let barrier = std::sync::Barrier::new(jobs.len() + 1);
    std::thread::scope(|s| {
        for job in jobs {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                job();
                barrier.wait();
            });
        }
        barrier.wait();
        let t0 = Instant::now();
        barrier.wait();
        t0.elapsed().as_secs_f64()
    })
}

/// Memory bandwidth, bytes a second: `a[i] = b[i] + s * c[i]` over f32 arrays of `mib` MiB
/// each, split evenly over `threads`, counting 12 bytes an element (two reads, one write), the
/// best of `reps` passes after one to fault the pages in.
pub fn triad_bandwidth(threads: usize, mib: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let n = (mib.max(1) << 20) / 4;
    let chunk = n.div_ceil(threads);
    let mut a = vec![0f32; n];
    let b = vec![1f32; n];
    let c = vec![2f32; n];
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) + 1 {
        let jobs: Vec<_> = a
            .chunks_mut(chunk)
            .zip(b.chunks(chunk).zip(c.chunks(chunk)))
            .map(|(out, (b, c))| {
                move || {
                    for ((x, y), z) in out.iter_mut().zip(b).zip(c) {
                        *x = y + 3.0 * z;
                    }
                }
            })
            .collect();
        best = best.min(timed(jobs));
    }
    black_box(&a);
    (12 * n) as f64 / best
}

/// Peak f32 fused multiply-add rate, floating-point operations a second (2 per lane and FMA),
/// on `threads` threads; `None` without AVX2 and FMA.
pub fn fma_peak(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_has_avx2() {
        const ITERS: usize = 20_000_000;
        let best = (0..3).map(|_| timed(vec![|| x86::fma_loop(ITERS); threads.max(1)])).fold(f64::INFINITY, f64::min);
        return Some((threads.max(1) * ITERS * x86::CHAINS * 8 * 2) as f64 / best);
    }
    let _ = threads;
    None
}

/// Peak int8 dot rate, multiply-adds a second, through the instruction sequence the quantized
/// matmul's inner loop uses (32 u8 x i8 products a `vpmaddubsw`, widened and accumulated to
/// i32), on `threads` threads; `None` without AVX2.
pub fn int8_dot_peak(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_has_avx2() {
        const ITERS: usize = 20_000_000;
        let best = (0..3).map(|_| timed(vec![|| x86::dot_loop(ITERS); threads.max(1)])).fold(f64::INFINITY, f64::min);
        return Some((threads.max(1) * ITERS * x86::CHAINS * 32) as f64 / best);
    }
    let _ = threads;
    None
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Independent accumulators: more than an FMA's latency times its throughput (4 x 2).
    pub const CHAINS: usize = 10;

    pub fn fma_loop(iters: usize) {
        // SAFETY: callers check `cpu_has_avx2()` (AVX2 and FMA present) first.
        unsafe { fma_inner(iters) }
    }

    pub fn dot_loop(iters: usize) {
        // SAFETY: as above.
        unsafe { dot_inner(iters) }
    }

    #[target_feature(enable = "avx2,fma")]
    fn fma_inner(iters: usize) {
        let (x, y) = (_mm256_set1_ps(black_box(0.999_999)), _mm256_set1_ps(black_box(1e-7)));
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..iters {
            for a in &mut acc {
                *a = _mm256_fmadd_ps(*a, x, y);
            }
        }
        black_box(acc);
    }

    /// The dot chain in assembly: written as intrinsics, the products of loop-invariant inputs
    /// are hoisted out of the loop and only the additions remain. Ten accumulators, three
    /// rotating temporaries (renaming makes their reuse free), 32 multiply-adds a chain and
    /// iteration.
    #[target_feature(enable = "avx2")]
    fn dot_inner(iters: usize) {
        let (w, x, ones) = (_mm256_set1_epi8(black_box(3)), _mm256_set1_epi8(black_box(-2)), _mm256_set1_epi16(1));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        let [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9] = &mut acc;
        for _ in 0..iters {
            // SAFETY: register-only AVX2 arithmetic (no memory, no stack, flags untouched); the
            // enclosing function enables AVX2 and its callers check the CPU has it.
            unsafe {
                std::arch::asm!(
                    "vpmaddubsw {t0}, {w}, {x}", "vpmaddwd {t0}, {t0}, {o}", "vpaddd {a0}, {a0}, {t0}",
                    "vpmaddubsw {t1}, {w}, {x}", "vpmaddwd {t1}, {t1}, {o}", "vpaddd {a1}, {a1}, {t1}",
                    "vpmaddubsw {t2}, {w}, {x}", "vpmaddwd {t2}, {t2}, {o}", "vpaddd {a2}, {a2}, {t2}",
                    "vpmaddubsw {t0}, {w}, {x}", "vpmaddwd {t0}, {t0}, {o}", "vpaddd {a3}, {a3}, {t0}",
                    "vpmaddubsw {t1}, {w}, {x}", "vpmaddwd {t1}, {t1}, {o}", "vpaddd {a4}, {a4}, {t1}",
                    "vpmaddubsw {t2}, {w}, {x}", "vpmaddwd {t2}, {t2}, {o}", "vpaddd {a5}, {a5}, {t2}",
                    "vpmaddubsw {t0}, {w}, {x}", "vpmaddwd {t0}, {t0}, {o}", "vpaddd {a6}, {a6}, {t0}",
                    "vpmaddubsw {t1}, {w}, {x}", "vpmaddwd {t1}, {t1}, {o}", "vpaddd {a7}, {a7}, {t1}",
                    "vpmaddubsw {t2}, {w}, {x}", "vpmaddwd {t2}, {t2}, {o}", "vpaddd {a8}, {a8}, {t2}",
                    "vpmaddubsw {t0}, {w}, {x}", "vpmaddwd {t0}, {t0}, {o}", "vpaddd {a9}, {a9}, {t0}",
                    w = in(ymm_reg) w, x = in(ymm_reg) x, o = in(ymm_reg) ones,
                    a0 = inout(ymm_reg) *a0, a1 = inout(ymm_reg) *a1, a2 = inout(ymm_reg) *a2, a3 = inout(ymm_reg) *a3,
                    a4 = inout(ymm_reg) *a4, a5 = inout(ymm_reg) *a5, a6 = inout(ymm_reg) *a6, a7 = inout(ymm_reg) *a7,
                    a8 = inout(ymm_reg) *a8, a9 = inout(ymm_reg) *a9,
                    t0 = out(ymm_reg) _, t1 = out(ymm_reg) _, t2 = out(ymm_reg) _,
                    options(pure, nomem, nostack, preserves_flags),
                );
            }
        }
        black_box(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_measured_and_scale_with_work() {
        let bw = triad_bandwidth(1, 16, 1);
        assert!(bw > 1e8 && bw < 1e13, "{bw}");
        if let (Some(fma), Some(dot)) = (fma_peak(1), int8_dot_peak(1)) {
            // A core does at least a GFLOP/s and at most a few hundred.
            assert!(fma > 1e9 && fma < 1e12, "{fma}");
            assert!(dot > 1e9 && dot < 1e12, "{dot}");
        }
    }
}
