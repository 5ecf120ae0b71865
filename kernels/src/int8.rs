//! Int8 matmul with activations quantized per row to uint8, as onnxruntime's dynamic quantization does per tensor.
//!
//! Each row is quantized on its own (`DynamicQuantizeLinear`'s formulas on that row alone), so a row's result never
//! depends on the other rows. The integer dot products are exact on every path, so the AVX-512 VNNI path and the
//! scalar one give the same bits.
// A tile's rows and column blocks index accumulators and outputs in step, so the loops run over indices.
#![allow(clippy::needless_range_loop)]

use crate::out_ptr::OutPtr;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Output columns in one SIMD accumulator, and k values each column of it sums per step.
const BLOCK_COLS: usize = 16;
const STEP_K: usize = 4;
/// Column blocks and activation rows that one tile computes; outputs are padded up to whole tiles.
const TILE_BLOCKS: usize = 4;
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = TILE_BLOCKS * BLOCK_COLS;

/// Whether the AVX-512 VNNI path runs on this machine.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// An int8 weight `[rows][cols]` (output rows, input columns) with one scale, packed for the dot kernels.
#[derive(Clone, Debug)]
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    scale: f32,
    /// Tiles of `TILE_COLS` outputs; in each, block b, step s, column l, lane i holds `w[16b + l][4s + i]`.
    packed: Vec<i8>,
    /// Per output row, the sum of its weights: the zero point's share of a dot product.
    row_sums: Vec<i32>,
}

impl Int8Matrix {
    /// From `q` laid out `[rows][cols]`, whose values times `scale` are the weight; `cols` must be a multiple of 4.
    pub fn new(q: &[i8], rows: usize, cols: usize, scale: f32) -> Int8Matrix {
        assert_eq!(q.len(), rows * cols, "Int8Matrix: {} values are not {rows} x {cols}", q.len());
        assert_eq!(cols % STEP_K, 0, "Int8Matrix: {cols} columns are not a multiple of {STEP_K}");
        let padded = rows.div_ceil(TILE_COLS) * TILE_COLS;
        let mut packed = vec![0i8; padded * cols];
        for (j, row) in q.chunks_exact(cols).enumerate() {
            let (block, l) = (j / BLOCK_COLS, j % BLOCK_COLS);
            for (k, &v) in row.iter().enumerate() {
                packed[block * BLOCK_COLS * cols + (k / STEP_K) * BLOCK_COLS * STEP_K + l * STEP_K + k % STEP_K] = v;
            }
        }
        let row_sums = q.chunks_exact(cols).map(|r| r.iter().map(|&v| v as i32).sum()).collect();
        Int8Matrix { rows, cols, scale, packed, row_sums }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn tile(&self, t: usize) -> &[i8] {
        &self.packed[t * TILE_COLS * self.cols..(t + 1) * TILE_COLS * self.cols]
    }
}

/// One row quantized to uint8: `x ≈ (q − zero_point) · scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowQuant {
    pub scale: f32,
    pub zero_point: i32,
}

/// DynamicQuantizeLinear on one row: the range widened to hold 0, scale = range / 255, round half to even.
pub fn quantize_row(x: &[f32], q: &mut [u8]) -> RowQuant {
    let (lo, hi) = x.iter().fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let scale = (hi - lo) / 255.0;
    if scale == 0.0 || !scale.is_finite() {
        q.fill(0);
        return RowQuant { scale: 0.0, zero_point: 0 };
    }
    let zero_point = round_half_even(-lo / scale).clamp(0.0, 255.0);
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (round_half_even(v / scale) + zero_point).clamp(0.0, 255.0) as u8;
    }
    RowQuant { scale, zero_point: zero_point as i32 }
}

/// Rounds half to even for |v| below 2^22 (here at most 255), without a libm call, so the loop vectorizes.
#[inline]
fn round_half_even(v: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (v + SHIFT) - SHIFT
}

/// `out[m][j] = Σ_k x[m][k] · w[j][k] · scale + bias[j]`, the activations quantized per row first.
pub fn matmul_int8(x: &[f32], num_rows: usize, w: &Int8Matrix, bias: &[f32], out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), num_rows * k, "matmul_int8: activations are not {num_rows} x {k}");
    assert_eq!(out.len(), num_rows * n, "matmul_int8: output is not {num_rows} x {n}");
    assert_eq!(bias.len(), n, "matmul_int8: bias is not {n} long");
    let padded_rows = num_rows.div_ceil(TILE_ROWS) * TILE_ROWS;
    let mut q = vec![0u8; padded_rows * k];
    let mut quants = vec![RowQuant { scale: 0.0, zero_point: 0 }; padded_rows];
    q.par_chunks_mut(k).zip(quants.par_iter_mut()).zip(x.par_chunks(k)).for_each(|((q, rq), x)| {
        *rq = quantize_row(x, q);
    });
    let ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(TILE_COLS)).into_par_iter().for_each(|t| {
        // The closure must take the Send wrapper whole, not its raw pointer field.
        #[allow(clippy::redundant_locals)]
        let ptr = ptr;
        let tile = w.tile(t);
        let cols = t * TILE_COLS..((t + 1) * TILE_COLS).min(n);
        let mut acc = [[0i32; TILE_COLS]; TILE_ROWS];
        for m in (0..num_rows).step_by(TILE_ROWS) {
            dot_tile(&q[m * k..(m + TILE_ROWS) * k], k, tile, &mut acc);
            for r in 0..TILE_ROWS.min(num_rows - m) {
                let rq = quants[m + r];
                let s = rq.scale * w.scale;
                for (i, j) in cols.clone().enumerate() {
                    let v = (acc[r][i] - rq.zero_point * w.row_sums[j]) as f32 * s + bias[j];
                    // SAFETY: (m + r, j) is in bounds and written by this task alone.
                    unsafe { *ptr.0.add((m + r) * n + j) = v };
                }
            }
        }
    });
}

/// Integer dots of `TILE_ROWS` rows of `q` (each `k` long) with one packed tile of weights.
fn dot_tile(q: &[u8], k: usize, tile: &[i8], acc: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: the CPU has AVX-512 VNNI; `q` holds TILE_ROWS rows of k bytes and `tile` TILE_COLS columns of k.
        return unsafe { dot_tile_vnni(q, k, tile, acc) };
    }
    dot_tile_scalar(q, k, tile, acc)
}

fn dot_tile_scalar(q: &[u8], k: usize, tile: &[i8], acc: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
    for r in 0..TILE_ROWS {
        let x = &q[r * k..(r + 1) * k];
        for c in 0..TILE_COLS {
            let (block, l) = (c / BLOCK_COLS, c % BLOCK_COLS);
            let w = &tile[block * BLOCK_COLS * k..(block + 1) * BLOCK_COLS * k];
            acc[r][c] = (0..k)
                .map(|i| x[i] as i32 * w[(i / STEP_K) * BLOCK_COLS * STEP_K + l * STEP_K + i % STEP_K] as i32)
                .sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_tile_vnni(q: &[u8], k: usize, tile: &[i8], acc: &mut [[i32; TILE_COLS]; TILE_ROWS]) {
    let mut sums = [[_mm512_setzero_si512(); TILE_BLOCKS]; TILE_ROWS];
    let (x, w) = (q.as_ptr(), tile.as_ptr());
    let mut i = 0;
    while i < k {
        let wv: [__m512i; TILE_BLOCKS] =
            std::array::from_fn(|b| _mm512_loadu_si512(w.add(b * BLOCK_COLS * k + i * BLOCK_COLS) as *const _));
        for r in 0..TILE_ROWS {
            let xv = _mm512_set1_epi32(std::ptr::read_unaligned(x.add(r * k + i) as *const i32));
            for b in 0..TILE_BLOCKS {
                sums[r][b] = _mm512_dpbusd_epi32(sums[r][b], xv, wv[b]);
            }
        }
        i += STEP_K;
    }
    for r in 0..TILE_ROWS {
        for b in 0..TILE_BLOCKS {
            _mm512_storeu_si512(acc[r][b * BLOCK_COLS..].as_mut_ptr() as *mut _, sums[r][b]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn weight(rows: usize, cols: usize, seed: &mut u64) -> (Vec<i8>, Int8Matrix) {
        let q: Vec<i8> = (0..rows * cols).map(|_| (lcg(seed) * 255.9).floor() as i8).collect();
        let m = Int8Matrix::new(&q, rows, cols, 0.01);
        (q, m)
    }

    #[test]
    fn test_quantize_row_follows_dynamic_quantize_linear() {
        let mut q = [0u8; 4];
        let rq = quantize_row(&[-1.0, 0.0, 0.5, 1.55], &mut q);
        assert_eq!(rq.scale, 2.55 / 255.0);
        assert_eq!(rq.zero_point, 100);
        assert_eq!(q, [0, 100, 150, 255]);
        assert_eq!(quantize_row(&[0.0; 4], &mut q), RowQuant { scale: 0.0, zero_point: 0 });
        assert_eq!(quantize_row(&[2.0, 1.0], &mut q[..2]).zero_point, 0);
        for v in [0.5f32, 1.5, 2.5, -0.5, -2.5, 254.5, 3.49, -7.51] {
            assert_eq!(round_half_even(v), v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn test_vnni_dots_equal_scalar_dots() {
        if !has_vnni() {
            return;
        }
        let mut seed = 5;
        let k = 72;
        let (_, w) = weight(TILE_COLS, k, &mut seed);
        let q: Vec<u8> = (0..TILE_ROWS * k).map(|_| ((lcg(&mut seed) + 0.5) * 255.9) as u8).collect();
        let (mut a, mut b) = ([[0; TILE_COLS]; TILE_ROWS], [[0; TILE_COLS]; TILE_ROWS]);
        dot_tile_scalar(&q, k, w.tile(0), &mut a);
        // SAFETY: checked above; the sizes are whole tiles.
        unsafe { dot_tile_vnni(&q, k, w.tile(0), &mut b) };
        assert_eq!(a, b);
    }

    #[test]
    fn test_matmul_int8_is_near_the_float_product_and_rows_are_independent() {
        let mut seed = 9;
        let (n, k, m) = (70, 96, 7);
        let (qw, w) = weight(n, k, &mut seed);
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 4.0).collect();
        let mut out = vec![0f32; m * n];
        matmul_int8(&x, m, &w, &bias, &mut out);
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            let step = row.iter().fold(0f32, |a, v| a.max(v.abs())) * 2.0 / 255.0;
            let mut alone = vec![0f32; n];
            matmul_int8(row, 1, &w, &bias, &mut alone);
            assert_eq!(alone, out[r * n..(r + 1) * n]);
            for j in 0..n {
                let want: f32 = (0..k).map(|i| row[i] * qw[j * k + i] as f32 * 0.01).sum::<f32>() + bias[j];
                let bound = step * 0.01 * 128.0 * (k as f32).sqrt();
                assert!((out[r * n + j] - want).abs() < bound, "row {r} col {j}: {} vs {want}", out[r * n + j]);
            }
        }
    }
}
