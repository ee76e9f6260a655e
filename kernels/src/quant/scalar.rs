//! Portable micro-kernels: the fallback where AVX2 is missing. Same tiling contract as the AVX2
//! kernels (each output element computed by one fixed sequence of operations).

use super::QK;

/// Arguments of a scalar tile (safe slices; the fallback need not be fast).
pub(super) struct Tile<'a> {
    pub qs: &'a [u8],
    pub row_stride: usize,
    pub dw: &'a [f32],
    pub mw: &'a [f32],
    pub nb: usize,
    /// Stride of scales per row and per token.
    pub ns: usize,
    pub xq: &'a [i8],
    pub xd: &'a [f32],
    pub xs: &'a [f32],
    pub k: usize,
}

/// Q4 weights: row `r` of the tile against token `c`.
pub(super) fn q4_dot(t: &Tile<'_>, r: usize, c: usize) -> f32 {
    let mut acc = 0f32;
    let mut off = 0f32;
    for b in 0..t.nb {
        let w = &t.qs[r * t.row_stride + b * 16..r * t.row_stride + b * 16 + 16];
        let x = &t.xq[c * t.k + b * QK..c * t.k + (b + 1) * QK];
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (w[j] & 0x0F) as i32 * x[j] as i32 + (w[j] >> 4) as i32 * x[j + 16] as i32;
        }
        acc += t.dw[r * t.ns + b] * t.xd[c * t.ns + b] * isum as f32;
        off += t.mw[r * t.ns + b] * t.xs[c * t.ns + b];
    }
    acc + off
}

/// Q8 weights: row `r` of the tile against token `c`.
pub(super) fn q8_dot(t: &Tile<'_>, r: usize, c: usize) -> f32 {
    let mut acc = 0f32;
    for b in 0..t.nb {
        let w = &t.qs[r * t.row_stride + b * QK..r * t.row_stride + (b + 1) * QK];
        let x = &t.xq[c * t.k + b * QK..c * t.k + (b + 1) * QK];
        let isum: i32 = w.iter().zip(x).map(|(&w, &x)| (w as i8) as i32 * x as i32).sum();
        acc += t.dw[r * t.ns + b] * t.xd[c * t.ns + b] * isum as f32;
    }
    acc
}
