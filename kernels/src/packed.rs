//! f32 matmul over weights packed in blocks of 16 output columns: each output is one fused multiply-add chain
//! over k in order, so the AVX-512, AVX2 and scalar paths give the same bits and a row never depends on the others.
// A tile's rows and column blocks index accumulators and outputs in step, so the loops run over indices.
#![allow(clippy::needless_range_loop)]

use crate::out_ptr::OutPtr;
use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Output columns per packed block, and blocks and activation rows per tile.
const BLOCK_COLS: usize = 16;
const TILE_BLOCKS: usize = 4;
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = TILE_BLOCKS * BLOCK_COLS;

/// A weight `[rows][cols]` (output rows, input columns) packed for the tile kernels.
#[derive(Clone, Debug)]
pub struct PackedF32 {
    rows: usize,
    cols: usize,
    /// Block b, input k, column l holds `w[16b + l][k]`; columns past `rows` are zero.
    packed: Vec<f32>,
}

impl PackedF32 {
    /// From `w` laid out `[rows][cols]`.
    pub fn new(w: &[f32], rows: usize, cols: usize) -> PackedF32 {
        assert_eq!(w.len(), rows * cols, "PackedF32: {} values are not {rows} x {cols}", w.len());
        let padded = rows.div_ceil(TILE_COLS) * TILE_COLS;
        let mut packed = vec![0f32; padded * cols];
        for (j, row) in w.chunks_exact(cols).enumerate() {
            let (block, l) = (j / BLOCK_COLS, j % BLOCK_COLS);
            for (k, &v) in row.iter().enumerate() {
                packed[(block * cols + k) * BLOCK_COLS + l] = v;
            }
        }
        PackedF32 { rows, cols, packed }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn tile(&self, t: usize) -> &[f32] {
        &self.packed[t * TILE_COLS * self.cols..(t + 1) * TILE_COLS * self.cols]
    }
}

/// `out[m][j] = Σ_k x[m][k] · w[j][k] + bias[j]`, the sum a fused chain from k = 0 up.
pub fn matmul_packed(x: &[f32], num_rows: usize, w: &PackedF32, bias: &[f32], out: &mut [f32]) {
    let (n, k) = (w.rows, w.cols);
    assert_eq!(x.len(), num_rows * k, "matmul_packed: activations are not {num_rows} x {k}");
    assert_eq!(out.len(), num_rows * n, "matmul_packed: output is not {num_rows} x {n}");
    assert_eq!(bias.len(), n, "matmul_packed: bias is not {n} long");
    if num_rows == 0 {
        return;
    }
    let ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(TILE_COLS)).into_par_iter().for_each(|t| {
        // The closure must take the Send wrapper whole, not its raw pointer field.
        #[allow(clippy::redundant_locals)]
        let ptr = ptr;
        let tile = w.tile(t);
        let cols = t * TILE_COLS..((t + 1) * TILE_COLS).min(n);
        let mut acc = [[0f32; TILE_COLS]; TILE_ROWS];
        for m in (0..num_rows).step_by(TILE_ROWS) {
            // Rows past the end repeat the last row; their sums are dropped.
            let rows: [&[f32]; TILE_ROWS] = std::array::from_fn(|r| {
                let row = (m + r).min(num_rows - 1);
                &x[row * k..(row + 1) * k]
            });
            dot_tile(&rows, tile, &mut acc);
            for r in 0..TILE_ROWS.min(num_rows - m) {
                for (i, j) in cols.clone().enumerate() {
                    // SAFETY: (m + r, j) is in bounds and written by this task alone.
                    unsafe { *ptr.0.add((m + r) * n + j) = acc[r][i] + bias[j] };
                }
            }
        }
    });
}

fn dot_tile(rows: &[&[f32]; TILE_ROWS], tile: &[f32], acc: &mut [[f32; TILE_COLS]; TILE_ROWS]) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd512::has_avx512() {
            // SAFETY: the CPU has AVX-512F; each row holds k values and `tile` TILE_COLS columns of k.
            return unsafe { dot_tile_avx512(rows, tile, acc) };
        }
        if crate::simd::has_avx2() {
            // SAFETY: the CPU has AVX2 and FMA; as above.
            return unsafe { dot_tile_avx2(rows, tile, acc) };
        }
    }
    dot_tile_scalar(rows, tile, acc)
}

fn dot_tile_scalar(rows: &[&[f32]; TILE_ROWS], tile: &[f32], acc: &mut [[f32; TILE_COLS]; TILE_ROWS]) {
    let k = rows[0].len();
    for r in 0..TILE_ROWS {
        for c in 0..TILE_COLS {
            let (block, l) = (c / BLOCK_COLS, c % BLOCK_COLS);
            let w = &tile[block * k * BLOCK_COLS..];
            acc[r][c] = (0..k).fold(0f32, |s, i| rows[r][i].mul_add(w[i * BLOCK_COLS + l], s));
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_tile_avx512(rows: &[&[f32]; TILE_ROWS], tile: &[f32], acc: &mut [[f32; TILE_COLS]; TILE_ROWS]) {
    let k = rows[0].len();
    let w = tile.as_ptr();
    let mut sums = [[_mm512_setzero_ps(); TILE_BLOCKS]; TILE_ROWS];
    for i in 0..k {
        let wv: [__m512; TILE_BLOCKS] = std::array::from_fn(|b| _mm512_loadu_ps(w.add((b * k + i) * BLOCK_COLS)));
        for r in 0..TILE_ROWS {
            let xv = _mm512_set1_ps(*rows[r].get_unchecked(i));
            for b in 0..TILE_BLOCKS {
                sums[r][b] = _mm512_fmadd_ps(xv, wv[b], sums[r][b]);
            }
        }
    }
    for r in 0..TILE_ROWS {
        for b in 0..TILE_BLOCKS {
            _mm512_storeu_ps(acc[r][b * BLOCK_COLS..].as_mut_ptr(), sums[r][b]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_tile_avx2(rows: &[&[f32]; TILE_ROWS], tile: &[f32], acc: &mut [[f32; TILE_COLS]; TILE_ROWS]) {
    let k = rows[0].len();
    let w = tile.as_ptr();
    // Two tile halves of two blocks each, so the accumulators fit in sixteen registers.
    for half in 0..2 {
        let mut sums = [[_mm256_setzero_ps(); 4]; TILE_ROWS];
        for i in 0..k {
            let wv: [__m256; 4] = std::array::from_fn(|v| {
                _mm256_loadu_ps(w.add(((2 * half + v / 2) * k + i) * BLOCK_COLS + (v % 2) * 8))
            });
            for r in 0..TILE_ROWS {
                let xv = _mm256_set1_ps(*rows[r].get_unchecked(i));
                for v in 0..4 {
                    sums[r][v] = _mm256_fmadd_ps(xv, wv[v], sums[r][v]);
                }
            }
        }
        for r in 0..TILE_ROWS {
            for v in 0..4 {
                _mm256_storeu_ps(acc[r][half * 2 * BLOCK_COLS + v * 8..].as_mut_ptr(), sums[r][v]);
            }
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

    #[test]
    fn test_every_path_gives_the_scalar_chain_bit_for_bit() {
        let mut seed = 3;
        let k = 37;
        let w: Vec<f32> = (0..TILE_COLS * k).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..TILE_ROWS * k).map(|_| lcg(&mut seed)).collect();
        let p = PackedF32::new(&w, TILE_COLS, k);
        let rows: [&[f32]; TILE_ROWS] = std::array::from_fn(|r| &x[r * k..(r + 1) * k]);
        let mut want = [[0f32; TILE_COLS]; TILE_ROWS];
        dot_tile_scalar(&rows, p.tile(0), &mut want);
        for r in 0..TILE_ROWS {
            for c in 0..TILE_COLS {
                let chain = (0..k).fold(0f32, |s, i| x[r * k + i].mul_add(w[c * k + i], s));
                assert_eq!(want[r][c].to_bits(), chain.to_bits());
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            let mut got = [[0f32; TILE_COLS]; TILE_ROWS];
            if crate::simd512::has_avx512() {
                // SAFETY: checked; whole tiles.
                unsafe { dot_tile_avx512(&rows, p.tile(0), &mut got) };
                assert_eq!(got, want);
            }
            if crate::simd::has_avx2() {
                // SAFETY: checked; whole tiles.
                unsafe { dot_tile_avx2(&rows, p.tile(0), &mut got) };
                assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn test_matmul_packed_matches_the_float_product_and_rows_are_independent() {
        let mut seed = 8;
        let (n, k, m) = (70, 45, 7);
        let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut seed)).collect();
        let bias: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
        let p = PackedF32::new(&w, n, k);
        let mut out = vec![0f32; m * n];
        matmul_packed(&x, m, &p, &bias, &mut out);
        for r in 0..m {
            let mut alone = vec![0f32; n];
            matmul_packed(&x[r * k..(r + 1) * k], 1, &p, &bias, &mut alone);
            assert_eq!(alone, out[r * n..(r + 1) * n]);
            for j in 0..n {
                let want: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[j * k + i] as f64).sum::<f64>() + bias[j] as f64;
                assert!((out[r * n + j] as f64 - want).abs() < 1e-5, "{} vs {want}", out[r * n + j]);
            }
        }
    }
}
