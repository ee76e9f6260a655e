//! Quick timing of the quantized matmul at SmolLM2-135M's layer shapes: `cargo run --release -p pace-kernels --example qbench [threads]`.
use pace_kernels::quant::{matmul, QFormat, QuantMatrix};
use std::time::Instant;

/// Process CPU seconds: robust to other processes sharing the cores.
fn cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().unwrap();
    let shapes = [(960usize, 576usize), (576, 576), (3072, 576), (576, 1536)];
    let layers = 30;
    let mats: Vec<QuantMatrix> = shapes
        .iter()
        .map(|&(r, c)| {
            let data: Vec<f32> = (0..r * c).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
            QuantMatrix::quantize(QFormat::Q4, &data, r, c).unwrap()
        })
        .collect();
    // distinct copies per layer so decode streams weights from memory like the real model
    let all: Vec<Vec<QuantMatrix>> = (0..layers).map(|_| mats.clone()).collect();
    let head_data: Vec<f32> = (0..49152 * 576).map(|i| ((i * 31 % 997) as f32 / 498.0) - 1.0).collect();
    let head = QuantMatrix::quantize(QFormat::Q8, &head_data, 49152, 576).unwrap();
    for &t in &[1usize, 4, 16, 64, 512] {
        let x: Vec<f32> = (0..t * 1536).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
        let mut y = vec![0f32; t * 3072];
        let reps = if t >= 64 { 3 } else { 20 };
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = cpu();
            for l in &all {
                for m in l {
                    matmul(m, &x[..t * m.cols()], t, &mut y[..t * m.rows()]);
                }
            }
            best = best.min(cpu() - s);
        }
        let macs: f64 = shapes.iter().map(|&(r, c)| (r * c) as f64).sum::<f64>() * layers as f64 * t as f64;
        println!("t={t:4}: layers (cpu) {:8.3} ms  {:7.1} tok/s  {:6.1} GMAC/s", best * 1e3, t as f64 / best, macs / best / 1e9);
    }
    let x: Vec<f32> = (0..576).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
    let mut y = vec![0f32; 49152];
    let s = Instant::now();
    for _ in 0..20 {
        matmul(&head, &x, 1, &mut y);
    }
    println!("lm head t=1: {:.3} ms", s.elapsed().as_secs_f64() / 20.0 * 1e3);
}
