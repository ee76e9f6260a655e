//! Repacking ggml block formats into the internal layouts, and quantizing f32 matrices.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use half::f16;

use super::{QFormat, QuantError, QuantMatrix, QK};

/// Dequantizes ggml block data to f32 with candle's reference implementation (an independent
/// implementation, used for formats that are requantized and as a test oracle).
pub fn ggml_dequantize(dtype: GgmlDType, data: &[u8], elems: usize) -> candle_core::Result<Vec<f32>> {
    // Copy into an owned buffer: candle reinterprets the bytes as block structs, which needs the
    // structs' alignment that a slice of a memory map need not have.
    let owned: Vec<u8> = data.to_vec();
    let storage = QStorage::from_data(Cow::Owned(owned), &Device::Cpu, dtype)?;
    let t = QTensor::new(storage, (elems,))?;
    t.dequantize(&Device::Cpu)?.to_vec1::<f32>()
}

pub(super) fn from_ggml(what: &str, dtype: GgmlDType, data: &[u8], rows: usize, cols: usize) -> Result<QuantMatrix, QuantError> {
    let block = dtype.block_size();
    if !cols.is_multiple_of(QK) || !cols.is_multiple_of(block) {
        return Err(QuantError::Shape(format!("{what}: {cols} columns is not a multiple of the {dtype:?} block size")));
    }
    let expected = rows * cols / block * dtype.type_size();
    if data.len() != expected {
        return Err(QuantError::Size { what: what.to_string(), dtype, rows, cols, expected, got: data.len() });
    }
    let nblocks = rows * cols / QK;
    match dtype {
        GgmlDType::Q4_0 => {
            let mut out = empty(QFormat::Q4, rows, cols);
            for blk in data.chunks_exact(18) {
                let d = f16::from_le_bytes([blk[0], blk[1]]);
                out.d.push(d);
                out.m.push(f16::from_f32(-8.0 * d.to_f32()));
                out.qs.extend_from_slice(&blk[2..18]);
            }
            Ok(out.padded())
        }
        GgmlDType::Q4_1 => {
            let mut out = empty(QFormat::Q4, rows, cols);
            for blk in data.chunks_exact(20) {
                out.d.push(f16::from_le_bytes([blk[0], blk[1]]));
                out.m.push(f16::from_le_bytes([blk[2], blk[3]]));
                out.qs.extend_from_slice(&blk[4..20]);
            }
            Ok(out.padded())
        }
        GgmlDType::Q8_0 => {
            let mut out = empty(QFormat::Q8, rows, cols);
            for blk in data.chunks_exact(34) {
                out.d.push(f16::from_le_bytes([blk[0], blk[1]]));
                out.qs.extend_from_slice(&blk[2..34]);
            }
            Ok(out.padded())
        }
        GgmlDType::Q4K => {
            let mut out = empty(QFormat::Q4, rows, cols);
            for blk in data.chunks_exact(144) {
                q4k_block(blk, &mut out);
            }
            Ok(out.padded())
        }
        GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q5K | GgmlDType::Q6K | GgmlDType::Q8K => {
            let f = ggml_dequantize(dtype, data, rows * cols).map_err(|e| QuantError::Shape(format!("{what}: dequantizing {dtype:?}: {e}")))?;
            debug_assert_eq!(f.len() / QK, nblocks);
            quantize_f32(QFormat::Q8, &f, rows, cols)
        }
        other => Err(QuantError::Unsupported(other)),
    }
}

fn empty(format: QFormat, rows: usize, cols: usize) -> QuantMatrix {
    let nb = rows * cols / QK;
    let qbytes = match format {
        QFormat::Q4 => QK / 2,
        QFormat::Q8 => QK,
    };
    QuantMatrix {
        format,
        rows,
        cols,
        qs: Vec::with_capacity(nb * qbytes),
        d: Vec::with_capacity(nb),
        m: Vec::with_capacity(if format == QFormat::Q4 { nb } else { 0 }),
    }
}

/// Q4_K super-block (256 weights: f16 d, f16 dmin, 12 bytes of packed 6-bit sub-block scales and
/// mins, 128 bytes of nibbles) into eight Q4 blocks.
fn q4k_block(blk: &[u8], out: &mut QuantMatrix) {
    let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
    let dmin = f16::from_le_bytes([blk[2], blk[3]]).to_f32();
    let scales = &blk[4..16];
    let qs = &blk[16..144];
    let scale_min = |j: usize| -> (f32, f32) {
        let (sc, m) = if j < 4 {
            (scales[j] & 63, scales[j + 4] & 63)
        } else {
            ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
        };
        (d * sc as f32, dmin * m as f32)
    };
    // Each 64-weight chunk stores its first 32 weights in the low nibbles of 32 bytes and the
    // next 32 in the high nibbles; our blocks want weights j and j+16 in one byte.
    for chunk in 0..4 {
        let q = &qs[chunk * 32..(chunk + 1) * 32];
        for (half, shift) in [(0usize, 0u32), (1, 4)] {
            let (sc, mn) = scale_min(2 * chunk + half);
            out.d.push(f16::from_f32(sc));
            out.m.push(f16::from_f32(-mn));
            for j in 0..16 {
                let lo = (q[j] >> shift) & 0x0F;
                let hi = (q[j + 16] >> shift) & 0x0F;
                out.qs.push(lo | (hi << 4));
            }
        }
    }
}

pub(super) fn quantize_f32(format: QFormat, data: &[f32], rows: usize, cols: usize) -> Result<QuantMatrix, QuantError> {
    if !cols.is_multiple_of(QK) || data.len() != rows * cols {
        return Err(QuantError::Shape(format!("cannot quantize {} values as {rows}x{cols} (columns must be a multiple of {QK})", data.len())));
    }
    let mut out = empty(format, rows, cols);
    for blk in data.chunks_exact(QK) {
        match format {
            QFormat::Q8 => {
                let amax = blk.iter().fold(0f32, |a, &v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.d.push(f16::from_f32(d));
                out.qs.extend(blk.iter().map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
            }
            QFormat::Q4 => {
                let (mn, mx) = blk.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
                let d = (mx - mn) / 15.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.d.push(f16::from_f32(d));
                out.m.push(f16::from_f32(mn));
                let q = |v: f32| ((v - mn) * id).round().clamp(0.0, 15.0) as u8;
                for j in 0..16 {
                    out.qs.push(q(blk[j]) | (q(blk[j + 16]) << 4));
                }
            }
        }
    }
    Ok(out.padded())
}
