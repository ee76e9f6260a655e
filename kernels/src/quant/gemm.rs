//! The matmul driver: activation quantization, tiling, and the split of work across threads.
//!
//! Output rows are cut into chunks that rayon's pool runs; a chunk computes its rows for every
//! token, in token chunks small enough for their quantized activations to stay in L2, and within
//! a chunk in tiles of `ROWS x TOKENS`. Rayon's workers sleep when idle instead of spinning, so
//! a busy neighbour process slows pace down in proportion rather than collapsing it; work is cut
//! finer than the thread count so that a stalled thread's chunks are stolen by the others.

use std::cell::RefCell;

use rayon::prelude::*;

use super::act::QuantizedActs;
use super::{QFormat, QuantMatrix, QK, TOKENS};

/// Rows per tile.
const ROWS: usize = 3;
/// Rows per tile when there is a single token (a matrix-vector product): more rows in flight
/// hide memory latency, and there is no token dimension to spend registers on.
const ROWS_GEMV: usize = 4;
// The kernels are instantiated for row tiles of 1 to 4 (see `run_tiles`).
const _: () = assert!(ROWS <= 4 && ROWS_GEMV <= 4);
/// Tokens whose activations are processed together (kept in L2).
const TOKEN_CHUNK: usize = 96;
/// Work chunks per thread, for load balance under contention.
const CHUNKS_PER_THREAD: usize = 4;
/// Multiply-accumulates below which a matmul is cut into one chunk per thread.
const SMALL_WORK: usize = 1 << 20;

thread_local! {
    static ACTS: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
    static UNPACKED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    static SCALES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y = x · wᵀ`: `x` is `t x cols` (row-major f32), `y` is `t x rows`.
///
/// # Panics
/// If the slice lengths do not match the shapes (a caller bug, never input-dependent).
pub fn matmul(w: &QuantMatrix, x: &[f32], t: usize, y: &mut [f32]) {
    assert_eq!(Some(x.len()), t.checked_mul(w.cols), "matmul: x has the wrong length");
    assert_eq!(Some(y.len()), t.checked_mul(w.rows), "matmul: y has the wrong length");
    if t == 0 {
        return;
    }
    let mut run = |acts: &mut QuantizedActs| {
        quantize_parallel(acts, x, t, w.cols);
        #[cfg(target_arch = "x86_64")]
        if w.format == QFormat::Q4 && super::avx2_available() {
            // SAFETY: `avx2_available()` confirmed AVX2, FMA and F16C. `quantize_parallel` just
            // sized `acts.qs` to `t * w.cols` (the product is `x.len()`, checked above, so it did
            // not overflow), which is what `pair_acts` reads and writes.
            unsafe { super::avx2::pair_acts(&mut acts.qs, t, w.cols) };
        }
        matmul_quantized(w, acts, y);
    };
    // The caller waits inside rayon while the matmul runs, and may meanwhile steal a job that is
    // itself a matmul (two engines in one process share the pool): the buffer is then taken,
    // and that inner matmul uses a fresh one.
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => run(&mut acts),
        Err(_) => run(&mut QuantizedActs::default()),
    });
}

fn quantize_parallel(acts: &mut QuantizedActs, x: &[f32], t: usize, k: usize) {
    const PAR_MIN_TOKENS: usize = 8;
    if t < PAR_MIN_TOKENS {
        acts.quantize_into(x, t, k);
        return;
    }
    let ns = super::act::padded_blocks(k / QK);
    acts.t = t;
    acts.k = k;
    acts.ns = ns;
    acts.qs.resize(t * k, 0);
    acts.d.resize(t * ns, 0.0);
    acts.s.resize(t * ns, 0.0);
    let per = t.div_ceil(rayon::current_num_threads() * CHUNKS_PER_THREAD).max(1);
    x.par_chunks(per * k).zip(acts.qs.par_chunks_mut(per * k)).zip(acts.d.par_chunks_mut(per * ns).zip(acts.s.par_chunks_mut(per * ns))).for_each(
        |((x, qs), (d, s))| {
            let mut tmp = QuantizedActs::default();
            let rows = x.len() / k;
            tmp.quantize_into(x, rows, k);
            qs.copy_from_slice(&tmp.qs);
            d.copy_from_slice(&tmp.d);
            s.copy_from_slice(&tmp.s);
        },
    );
}

/// Raw output pointer shared by the chunks, which write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the pointer is only dereferenced inside `matmul_quantized`'s parallel loop, whose
// chunks write disjoint output elements (distinct weight rows) of a `y` that the function
// borrows mutably until every chunk has finished; moving it to another thread is then sound.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: the threads sharing it write disjoint elements, and nothing reads
// them until the parallel loop has returned.
unsafe impl Sync for OutPtr {}

/// `y = acts · wᵀ` for already-quantized activations.
///
/// # Panics
/// If `acts` and `y` do not fit `w` (checked once, here: the kernels below index through raw
/// pointers on the strength of these checks, and `QuantizedActs`'s fields are public).
pub(crate) fn matmul_quantized(w: &QuantMatrix, acts: &QuantizedActs, y: &mut [f32]) {
    let nb = w.blocks_per_row();
    assert_eq!(acts.k, w.cols, "matmul: activations have {} columns, the matrix {}", acts.k, w.cols);
    assert_eq!(acts.ns, super::act::padded_blocks(nb), "matmul: activation scale stride is not padded_blocks(k / 32)");
    assert!(acts.t.checked_mul(acts.k).is_some_and(|n| acts.qs.len() >= n), "matmul: quantized activations hold fewer than t x k values");
    assert!(acts.t.checked_mul(acts.ns).is_some_and(|n| acts.d.len() >= n && acts.s.len() >= n), "matmul: activation scales hold fewer than t x ns values");
    assert_eq!(Some(y.len()), acts.t.checked_mul(w.rows), "matmul: y has the wrong length");
    let units = w.rows.div_ceil(if acts.t == 1 { ROWS_GEMV } else { ROWS });
    // Small products (one decode token through a small matrix) are split once per thread:
    // finer pieces would cost more in scheduling than they could balance.
    let per_thread = if acts.t * w.rows * w.cols < SMALL_WORK { 1 } else { CHUNKS_PER_THREAD };
    let chunks = (rayon::current_num_threads() * per_thread).min(units).max(1);
    let units_per_chunk = units.div_ceil(chunks);
    let out = OutPtr(y.as_mut_ptr());
    let unit_rows = if acts.t == 1 { ROWS_GEMV } else { ROWS };
    (0..chunks).into_par_iter().for_each(|ci| {
        let r0 = (ci * units_per_chunk * unit_rows).min(w.rows);
        let r1 = ((ci + 1) * units_per_chunk * unit_rows).min(w.rows);
        if r0 < r1 {
            // The whole wrapper, not its bare (non-Send) pointer field.
            #[allow(clippy::redundant_locals)]
            let out = out;
            // SAFETY: `out.0` is `y`'s pointer, `y` holds `acts.t * w.rows` values (checked
            // above) and stays borrowed until the loop ends; chunk `ci` alone owns rows
            // `r0..r1 <= w.rows` (the chunks' row ranges do not overlap); `acts` fits `w` as
            // checked on entry.
            unsafe { compute_rows(w, acts, r0, r1, out.0) };
        }
    });
}

/// Output rows `r0..r1` for every token.
///
/// # Safety
/// - `y` is valid for writes of `acts.t * w.rows` f32 values (row-major, `w.rows` per token),
///   and nobody else reads or writes rows `r0..r1` of it during the call.
/// - `r0 <= r1 <= w.rows`.
/// - `acts` fits `w` as [`matmul_quantized`] checks (`k`, `ns`, and the lengths of `qs`, `d`
///   and `s`).
unsafe fn compute_rows(w: &QuantMatrix, acts: &QuantizedActs, r0: usize, r1: usize, y: *mut f32) {
    let nb = w.blocks_per_row();
    let ns = super::act::padded_blocks(nb);
    UNPACKED.with(|unpacked| {
        SCALES.with(|scales| {
            let mut unpacked = unpacked.borrow_mut();
            let mut scales = scales.borrow_mut();
            // The padding past nb in each row is zeroed here and never written.
            let rows = if acts.t == 1 { ROWS_GEMV } else { ROWS };
            scales.clear();
            scales.resize(2 * rows * ns, 0.0);
            let (dw, mw) = scales.split_at_mut(rows * ns);
            for t0 in (0..acts.t).step_by(TOKEN_CHUNK) {
                let t1 = (t0 + TOKEN_CHUNK).min(acts.t);
                // With more than one token group per row tile, unpacking the nibbles once into
                // bytes (in L1) beats unpacking them again for every group.
                let unpack = w.format == QFormat::Q4 && t1 - t0 > TOKENS && super::avx2_available();
                for rt in (r0..r1).step_by(rows) {
                    let nr = rows.min(r1 - rt);
                    // The portable kernels read f32 scales from scratch; the AVX2 kernels
                    // convert the matrix's f16 scales in registers.
                    if !super::avx2_available() {
                        convert_scales(w, rt, nr, dw, mw);
                    }
                    let weights = if unpack {
                        unpacked.resize(ROWS * nb * QK, 0);
                        unpack_rows(w, rt, nr, &mut unpacked);
                        Weights::Unpacked(&unpacked[..nr * nb * QK])
                    } else {
                        Weights::Packed
                    };
                    // SAFETY: the caller's contract on `y`, `r0..r1` and `acts` covers this tile:
                    // `1 <= nr <= rows <= 4` and `rt + nr <= r1 <= w.rows`; `t0 < t1 <= acts.t`;
                    // unpacked weights are Q4 (`unpack` requires it) and `nr` rows long (sliced
                    // just above).
                    unsafe { run_tiles(w, acts, rt, nr, t0, t1 - t0, dw, mw, weights, y) };
                }
            }
        })
    });
}

/// Scales (and offsets) of rows `r..r+nr` as f32, `padded_blocks(nb)` per row (portable path).
fn convert_scales(w: &QuantMatrix, r: usize, nr: usize, dw: &mut [f32], mw: &mut [f32]) {
    let nb = w.blocks_per_row();
    let ns = super::act::padded_blocks(nb);
    for i in 0..nr {
        for b in 0..nb {
            dw[i * ns + b] = w.d[(r + i) * nb + b].to_f32();
            if w.format == QFormat::Q4 {
                mw[i * ns + b] = w.m[(r + i) * nb + b].to_f32();
            }
        }
    }
}

/// Where a tile reads its weights from.
#[derive(Clone, Copy)]
enum Weights<'a> {
    /// The matrix itself.
    Packed,
    /// Q4 rows unpacked to one byte per weight (the tile's rows only).
    Unpacked(&'a [u8]),
}

/// Unpacks Q4 rows `r..r+nr` into `out` (`nb * 32` bytes a row).
///
/// # Panics
/// Unless `w` is Q4, the AVX2 kernels run here, rows `r..r+nr` exist and `out` holds them
/// (checked once per call: a few comparisons against unpacking `nr` whole rows).
fn unpack_rows(w: &QuantMatrix, r: usize, nr: usize, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(w.format == QFormat::Q4 && super::avx2::available(), "unpack_rows: Q4 weights and AVX2 only");
        let (nb, rb) = (w.blocks_per_row(), w.row_bytes());
        let src = &w.qs[r * rb..(r + nr) * rb];
        let out = &mut out[..nr * nb * QK];
        // SAFETY: AVX2, FMA and F16C were confirmed just above. `src` holds the `nr` packed Q4
        // rows of `rb = nb * 16` bytes that `unpack_q4` reads, and `out` the `nr * nb * 32`
        // bytes it writes (both sliced with bounds checks).
        unsafe { super::avx2::unpack_q4(src.as_ptr(), rb, nr, nb, out) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, r, nr, out);
}

/// Rows `r..r+nr` against tokens `tok..tok+ntok`.
///
/// # Safety
/// - `y` is valid for writes of `acts.t * w.rows` f32 values, and nobody else reads or writes
///   its elements (`tok..tok+ntok`, `r..r+nr`) during the call.
/// - `1 <= nr <= 4` and `r + nr <= w.rows`; `ntok >= 1` and `tok + ntok <= acts.t`.
/// - `acts` fits `w` as [`matmul_quantized`] checks.
/// - `Weights::Unpacked(u)` only for Q4 weights, with `u` holding the `nr` rows unpacked
///   (`u.len() >= nr * nb * 32`).
#[allow(clippy::too_many_arguments)]
unsafe fn run_tiles(
    w: &QuantMatrix,
    acts: &QuantizedActs,
    r: usize,
    nr: usize,
    tok: usize,
    ntok: usize,
    dw: &[f32],
    mw: &[f32],
    weights: Weights<'_>,
    y: *mut f32,
) {
    #[cfg(target_arch = "x86_64")]
    if super::avx2::available() {
        use super::avx2::{q4_rows, q8_rows, Tile};
        let nb = w.blocks_per_row();
        let (qs, row_stride) = match weights {
            Weights::Packed => (w.qs[r * w.row_bytes()..].as_ptr(), w.row_bytes()),
            Weights::Unpacked(u) => (u.as_ptr(), nb * QK),
        };
        let t = Tile {
            qs,
            row_stride,
            wd: w.d[r * nb..].as_ptr(),
            wm: if w.format == QFormat::Q4 { w.m[r * nb..].as_ptr() } else { std::ptr::null() },
            nb,
            ns: acts.ns,
            xq: acts.qs[tok * acts.k..].as_ptr(),
            xd: acts.d[tok * acts.ns..].as_ptr(),
            xs: acts.s[tok * acts.ns..].as_ptr(),
            k: acts.k,
            // SAFETY: `tok < acts.t` and `r < w.rows` (the contract), so element (tok, r) lies
            // inside `y`'s `acts.t * w.rows` values.
            y: unsafe { y.add(tok * w.rows + r) },
            ldy: w.rows,
        };
        macro_rules! dispatch {
            ($f:ident $(, $u:expr)?) => {
                // SAFETY: `avx2::available()` confirmed AVX2, FMA and F16C. `t` covers what
                // `Tile` requires for `nr` rows (`R = nr`, as `1 <= nr <= 4`) and `ntok`
                // tokens: the weights are rows `r..r+nr <= w.rows` of the matrix (`row_bytes`
                // each), or `u` holding them unpacked (the contract); `wd`/`wm` start at row
                // `r` of scale arrays with `rows * nb + SCALE_PAD` entries, covering
                // `nr * nb + 7`; `acts.k == w.cols`, `acts.ns == padded_blocks(nb)` and the
                // lengths of `acts.qs`, `acts.d` and `acts.s` (checked by `matmul_quantized`)
                // cover tokens `tok..tok+ntok <= acts.t`; and `y`'s elements for these rows and
                // tokens are this call's alone.
                unsafe {
                    match nr {
                        4 => $f::<4 $(, $u)?>(&t, ntok),
                        3 => $f::<3 $(, $u)?>(&t, ntok),
                        2 => $f::<2 $(, $u)?>(&t, ntok),
                        _ => $f::<1 $(, $u)?>(&t, ntok),
                    }
                }
            };
        }
        match (w.format, weights) {
            (QFormat::Q4, Weights::Packed) => dispatch!(q4_rows, false),
            (QFormat::Q4, Weights::Unpacked(_)) => dispatch!(q4_rows, true),
            (QFormat::Q8, _) => dispatch!(q8_rows),
        }
        return;
    }
    for tt in (tok..tok + ntok).step_by(TOKENS) {
        // SAFETY: rows `r..r+nr` and tokens `tt..tt+nc`, `nc = min(TOKENS, tok + ntok - tt)`, lie
        // within this call's, which the contract gives to it alone inside `y`.
        unsafe { run_tile_portable(w, acts, r, nr, tt, TOKENS.min(tok + ntok - tt), dw, mw, y) };
    }
}

/// The portable kernels: `nr` rows against `nc` tokens from `tok`.
///
/// # Safety
/// `y` is valid for writes of `acts.t * w.rows` f32 values, `r + nr <= w.rows`,
/// `tok + nc <= acts.t`, and nobody else reads or writes those elements during the call. (The
/// weights and activations are read through bounds-checked slices.)
#[allow(clippy::too_many_arguments)]
unsafe fn run_tile_portable(w: &QuantMatrix, acts: &QuantizedActs, r: usize, nr: usize, tok: usize, nc: usize, dw: &[f32], mw: &[f32], y: *mut f32) {
    let nb = w.blocks_per_row();
    let t = super::scalar::Tile {
        qs: &w.qs[r * w.row_bytes()..],
        row_stride: w.row_bytes(),
        dw,
        mw,
        nb,
        ns: acts.ns,
        xq: &acts.qs[tok * acts.k..],
        xd: &acts.d[tok * acts.ns..],
        xs: &acts.s[tok * acts.ns..],
        k: acts.k,
    };
    for c in 0..nc {
        for rr in 0..nr {
            let v = match w.format {
                QFormat::Q4 => super::scalar::q4_dot(&t, rr, c),
                QFormat::Q8 => super::scalar::q8_dot(&t, rr, c),
            };
            // SAFETY: `tok + c < tok + nc <= acts.t` and `r + rr < r + nr <= w.rows` (the
            // contract), so the element lies inside `y`, which this call alone writes there.
            unsafe { *y.add((tok + c) * w.rows + r + rr) = v };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With 32 x 32 weights and `t = 2^61 + 1`, `t * cols` and `t * rows` wrap to 32 (and
    /// `t * ns` to 8): unchecked, 32-value `x` and `y` passed the length checks, and the first
    /// tile wrote 96 tokens' outputs into `y`'s 32 values.
    #[test]
    #[should_panic(expected = "x has the wrong length")]
    fn overflowing_shapes_are_refused() {
        let w = QuantMatrix::quantize(QFormat::Q4, &[0.0; 32 * 32], 32, 32).unwrap();
        matmul(&w, &[0.0; 32], (1 << 61) + 1, &mut [0.0; 32]);
    }

    #[test]
    #[should_panic(expected = "activation scales")]
    fn inconsistent_acts_are_refused() {
        let w = QuantMatrix::quantize(QFormat::Q8, &[0.5; 2 * 64], 2, 64).unwrap();
        let mut acts = QuantizedActs::quantize(&[1.0; 3 * 64], 3, 64);
        acts.d.truncate(1);
        matmul_quantized(&w, &acts, &mut [0.0; 3 * 2]);
    }
}
