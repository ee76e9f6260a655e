//! Quantized matmul against a dequantize-then-f64 reference, for every supported ggml format,
//! odd shapes included; plus conversion exactness and bitwise batch invariance.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use pace_kernels::quant::{ggml_dequantize, matmul, QFormat, QuantMatrix, QuantizedActs, QK};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale).collect()
}

/// Quantizes with candle (an independent implementation of ggml's formats) and returns raw bytes.
fn ggml_bytes(data: &[f32], rows: usize, cols: usize, dtype: GgmlDType) -> Vec<u8> {
    let t = Tensor::from_slice(data, (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    q.data().unwrap().into_owned()
}

/// Rigorous bound on the activation-quantization error of one dot product: each activation is
/// off by at most half a step (block amax / 254), times |w|, plus float slack.
fn bound(w_row: &[f32], x: &[f32]) -> f64 {
    let mut b = 0f64;
    for (wb, xb) in w_row.chunks(QK).zip(x.chunks(QK)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        let half_step = amax / 254.0;
        b += wb.iter().map(|w| w.abs() as f64).sum::<f64>() * half_step;
    }
    b * 1.01 + 1e-4 * (1.0 + w_row.iter().zip(x).map(|(w, x)| (w * x).abs() as f64).sum::<f64>())
}

fn check_matmul(w: &QuantMatrix, rows: usize, cols: usize, t: usize, rng: &mut StdRng) {
    let deq = w.dequantize();
    let x = random(rng, t * cols, 3.0);
    let mut y = vec![0f32; t * rows];
    matmul(w, &x, t, &mut y);
    for ti in 0..t {
        let xr = &x[ti * cols..(ti + 1) * cols];
        for r in 0..rows {
            let wr = &deq[r * cols..(r + 1) * cols];
            let want: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
            let got = y[ti * rows + r] as f64;
            let tol = bound(wr, xr);
            assert!((got - want).abs() <= tol, "{:?} {rows}x{cols} t={t}: y[{ti},{r}] = {got}, reference {want}, tolerance {tol}", w.format());
        }
    }
}

#[test]
fn conversion_is_exact_for_native_formats() {
    let mut rng = StdRng::seed_from_u64(1);
    for (dtype, rows, cols) in [(GgmlDType::Q4_0, 7, 96), (GgmlDType::Q4_1, 5, 64), (GgmlDType::Q8_0, 3, 160)] {
        let data = random(&mut rng, rows * cols, 2.0);
        let bytes = ggml_bytes(&data, rows, cols, dtype);
        let reference = ggml_dequantize(dtype, &bytes, rows * cols).unwrap();
        let m = QuantMatrix::from_ggml("w", dtype, &bytes, rows, cols).unwrap();
        assert_eq!(m.dequantize(), reference, "{dtype:?}");
    }
}

#[test]
fn conversion_of_other_formats_is_within_tolerance() {
    let mut rng = StdRng::seed_from_u64(2);
    let (rows, cols) = (5, 512);
    for dtype in [GgmlDType::Q4K, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q5K, GgmlDType::Q6K] {
        let data = random(&mut rng, rows * cols, 2.0);
        let bytes = ggml_bytes(&data, rows, cols, dtype);
        let reference = ggml_dequantize(dtype, &bytes, rows * cols).unwrap();
        let m = QuantMatrix::from_ggml("w", dtype, &bytes, rows, cols).unwrap();
        let expected_format = if dtype == GgmlDType::Q4K { QFormat::Q4 } else { QFormat::Q8 };
        assert_eq!(m.format(), expected_format);
        let got = m.dequantize();
        for (blk_ref, blk_got) in reference.chunks(QK).zip(got.chunks(QK)) {
            let amax = blk_ref.iter().fold(0f32, |a, v| a.max(v.abs()));
            // Q4_K: scales rounded to f16 (relative 2^-11); requantized: half a step of 127.
            let tol = if dtype == GgmlDType::Q4K { amax * 2e-3 } else { amax / 254.0 * 1.001 + amax * 2e-3 };
            for (a, b) in blk_ref.iter().zip(blk_got) {
                assert!((a - b).abs() <= tol + 1e-6, "{dtype:?}: {a} vs {b} (tol {tol})");
            }
        }
    }
}

#[test]
fn matmul_matches_reference_for_every_format_and_odd_shapes() {
    let mut rng = StdRng::seed_from_u64(3);
    let shapes = [(1, 32, 1), (3, 64, 2), (5, 96, 7), (13, 256, 4), (37, 512, 11), (64, 576, 1), (9, 1536, 5)];
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q5K, GgmlDType::Q5_0] {
        for &(rows, cols, t) in &shapes {
            if cols % dtype.block_size() != 0 {
                continue;
            }
            let data = random(&mut rng, rows * cols, 1.0);
            let bytes = ggml_bytes(&data, rows, cols, dtype);
            let w = QuantMatrix::from_ggml("w", dtype, &bytes, rows, cols).unwrap();
            check_matmul(&w, rows, cols, t, &mut rng);
        }
    }
}

#[test]
fn matmul_is_bitwise_batch_and_thread_invariant() {
    let mut rng = StdRng::seed_from_u64(4);
    // An even and an odd number of blocks per row (Q4 pairs its blocks; an odd one goes alone).
    for (rows, cols, t) in [(67, 320, 23), (29, 352, 9)] {
        for format in [QFormat::Q4, QFormat::Q8] {
            let w = QuantMatrix::quantize(format, &random(&mut rng, rows * cols, 1.0), rows, cols).unwrap();
            let x = random(&mut rng, t * cols, 2.0);
            let mut batched = vec![0f32; t * rows];
            matmul(&w, &x, t, &mut batched);
            // Alone (the matrix-vector path) and in twos (the packed two-token path).
            for ti in 0..t {
                let mut alone = vec![0f32; rows];
                matmul(&w, &x[ti * cols..(ti + 1) * cols], 1, &mut alone);
                assert_eq!(&batched[ti * rows..(ti + 1) * rows], &alone[..], "{format:?} {cols} cols, token {ti}");
            }
            for ti in (0..t - 1).step_by(2) {
                let mut two = vec![0f32; 2 * rows];
                matmul(&w, &x[ti * cols..(ti + 2) * cols], 2, &mut two);
                assert_eq!(&batched[ti * rows..(ti + 2) * rows], &two[..], "{format:?} {cols} cols, tokens {ti}-{}", ti + 1);
            }
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut y = vec![0f32; t * rows];
                pool.install(|| matmul(&w, &x, t, &mut y));
                assert_eq!(y, batched, "{format:?} {cols} cols, {threads} threads");
            }
        }
    }
}

#[test]
fn activation_quantization_round_trips_within_half_a_step() {
    let mut rng = StdRng::seed_from_u64(5);
    let (t, k) = (3, 128);
    let mut x = random(&mut rng, t * k, 5.0);
    x[40] = 0.0;
    x[64..96].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
    let q = QuantizedActs::quantize(&x, t, k);
    let scale = |b: usize| (b / (k / QK)) * q.ns + b % (k / QK);
    for (i, &v) in x.iter().enumerate() {
        let b = scale(i / QK);
        let back = q.d[b] * q.qs[i] as f32;
        assert!((back - v).abs() <= q.d[b] * 0.5 + 1e-6, "value {i}: {v} -> {back}");
    }
    for b in 0..t * k / QK {
        let sum: i32 = q.qs[b * QK..(b + 1) * QK].iter().map(|&v| v as i32).sum();
        assert_eq!(q.s[scale(b)], q.d[scale(b)] * sum as f32);
    }
}

#[test]
fn bad_sizes_are_errors_not_panics() {
    assert!(QuantMatrix::from_ggml("w", GgmlDType::Q4_1, &[0u8; 19], 1, 32).is_err());
    assert!(QuantMatrix::from_ggml("w", GgmlDType::Q4_1, &[0u8; 20], 1, 33).is_err());
    assert!(QuantMatrix::from_ggml("w", GgmlDType::F32, &[0u8; 128], 1, 32).is_err());
    assert!(QuantMatrix::quantize(QFormat::Q8, &[0.0; 10], 1, 10).is_err());
}
