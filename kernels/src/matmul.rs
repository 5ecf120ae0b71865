//! `out = x · Wᵀ`, split across output columns only, so a row's result never depends on the other rows.

use crate::out_ptr::OutPtr;
use rayon::prelude::*;

use crate::dot8;
use crate::quant::{dequantize, GgmlType};
use crate::simd::{self, Tile};
use crate::weight::Weight;

/// Weight rows per parallel task; any value gives the same bits.
const ROWS_PER_TASK: usize = 16;
/// Activation rows that share one pass over a weight row: 8 for 8- and 4-bit rows under AVX-512 (the block's
/// conversion then serves twice the rows), 4 otherwise (AVX2 has registers for no more).
const TILE: usize = 8;

fn tile_rows(w: &Weight) -> usize {
    let legacy = matches!(w, Weight::Quant { ty: GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1, .. });
    if legacy && simd::wide_tiles() {
        TILE
    } else {
        4
    }
}

/// The arithmetic a quantized weight (legacy or K-quant) meets its activations in; f32 weights always take f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// Each row quantized to 8 bits per block of 32, integer dot products: llama.cpp's CPU arithmetic.
    Int8,
    /// f32 activations against weights dequantized on the fly; the default, as it holds the f32 reference's tokens.
    #[default]
    F32,
}

impl Activations {
    /// From its name, `int8` or `f32`.
    pub fn parse(name: &str) -> Option<Activations> {
        match name {
            "int8" => Some(Activations::Int8),
            "f32" => Some(Activations::F32),
            _ => None,
        }
    }
}

/// `matmul`, with quantized weights meeting the activations in `activations`' arithmetic.
pub fn matmul_with(x: &[f32], num_rows: usize, w: &Weight, out: &mut [f32], activations: Activations) {
    if activations == Activations::Int8 && dot8::supports(w) && num_rows > 0 {
        return dot8::matmul_q8(&dot8::Q8Rows::quantize(x, num_rows), w, out);
    }
    matmul(x, num_rows, w, out)
}

/// `out[m, n] = Σ_k x[m, k] · w[n, k]` for `num_rows` rows of `x`, in f32.
pub fn matmul(x: &[f32], num_rows: usize, w: &Weight, out: &mut [f32]) {
    let (n, k) = (w.rows(), w.cols());
    assert_eq!(x.len(), num_rows * k, "matmul: activations are not {num_rows} x {k}");
    assert_eq!(out.len(), num_rows * n, "matmul: output is not {num_rows} x {n}");
    let block_sums = match w {
        Weight::Quant { ty: GgmlType::Q4_0 | GgmlType::Q4_1, .. } => {
            x.chunks_exact(32).map(|b| b.iter().fold(0f32, |s, v| s + v)).collect()
        }
        _ => Vec::new(),
    };
    let rows: Vec<&[f32]> = x.chunks_exact(k).collect();
    let sums: Vec<&[f32]> =
        if block_sums.is_empty() { vec![&[][..]; num_rows] } else { block_sums.chunks_exact(k / 32).collect() };
    let ptr = OutPtr(out.as_mut_ptr());
    let num_tasks = n.div_ceil(ROWS_PER_TASK);
    let tile = tile_rows(w);
    (0..num_tasks).into_par_iter().for_each(|task| {
        // The closure must take the Send wrapper whole, not its raw pointer field.
        #[allow(clippy::redundant_locals)]
        let ptr = ptr;
        let (j0, j1) = (task * ROWS_PER_TASK, ((task + 1) * ROWS_PER_TASK).min(n));
        let dense = dense_rows(w, j0, j1);
        let w = dense.as_ref().unwrap_or(w);
        let mut m = 0;
        // A tile of activations meets every weight row of the task while both sit in L1.
        while m < num_rows {
            let take = (num_rows - m).min(tile);
            for j in j0..j1 {
                let mut res = [0f32; TILE];
                let at = if dense.is_some() { j - j0 } else { j };
                match take {
                    8 => row_dot::<8>(w, at, &rows[m..], &sums[m..], &mut res),
                    7 => row_dot::<7>(w, at, &rows[m..], &sums[m..], &mut res),
                    6 => row_dot::<6>(w, at, &rows[m..], &sums[m..], &mut res),
                    5 => row_dot::<5>(w, at, &rows[m..], &sums[m..], &mut res),
                    4 => row_dot::<4>(w, at, &rows[m..], &sums[m..], &mut res),
                    3 => row_dot::<3>(w, at, &rows[m..], &sums[m..], &mut res),
                    2 => row_dot::<2>(w, at, &rows[m..], &sums[m..], &mut res),
                    _ => row_dot::<1>(w, at, &rows[m..], &sums[m..], &mut res),
                }
                for (r, v) in res[..take].iter().enumerate() {
                    // SAFETY: (m + r, j) is in bounds and written by this task alone.
                    unsafe { *ptr.0.add((m + r) * n + j) = *v };
                }
            }
            m += take;
        }
    });
}

/// Rows `j0..j1` of a K-quant weight as f32, which meet the activations as an f32 weight's rows would.
fn dense_rows(w: &Weight, j0: usize, j1: usize) -> Option<Weight> {
    let Weight::Quant { ty: ty @ (GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K), cols, data, .. } = w else {
        return None;
    };
    let row_bytes = cols / ty.block_len() * ty.block_bytes();
    let mut out = vec![0f32; (j1 - j0) * cols];
    dequantize(*ty, &data[j0 * row_bytes..j1 * row_bytes], &mut out);
    Some(Weight::F32 { rows: j1 - j0, cols: *cols, data: out })
}

fn row_dot<const R: usize>(w: &Weight, j: usize, rows: &[&[f32]], sums: &[&[f32]], res: &mut [f32; TILE]) {
    let tile = Tile::<R> { rows: std::array::from_fn(|r| rows[r]), block_sums: std::array::from_fn(|r| sums[r]) };
    let mut out = [0f32; R];
    match w {
        Weight::F32 { cols, data, .. } => simd::f32_dot(&data[j * cols..(j + 1) * cols], &tile, &mut out),
        Weight::Quant { ty, cols, data, .. } => {
            let row_bytes = cols / ty.block_len() * ty.block_bytes();
            let row = &data[j * row_bytes..(j + 1) * row_bytes];
            match ty {
                GgmlType::Q8_0 => simd::q8_0_dot(row, &tile, &mut out),
                GgmlType::Q4_0 => simd::q4_dot(row, &tile, &mut out, false),
                GgmlType::Q4_1 => simd::q4_dot(row, &tile, &mut out, true),
                other => panic!("matmul: {other:?} rows are dequantized per task"),
            }
        }
    }
    res[..R].copy_from_slice(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn quant_weight(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Weight {
        let n = rows * cols / 32 * ty.block_bytes();
        let mut data: Vec<u8> = (0..n).map(|_| (lcg(seed) * 255.0) as i32 as u8).collect();
        for b in data.chunks_exact_mut(ty.block_bytes()) {
            let scale = half::f16::from_f32(lcg(seed) * 0.1).to_le_bytes();
            b[..2].copy_from_slice(&scale);
            if ty == GgmlType::Q4_1 {
                b[2..4].copy_from_slice(&half::f16::from_f32(lcg(seed) * 0.1).to_le_bytes());
            }
        }
        Weight::Quant { ty, rows, cols, data: data.into() }
    }

    fn weights() -> Vec<Weight> {
        let mut seed = 7;
        let (rows, cols) = (37, 96);
        let f = Weight::F32 { rows, cols: 99, data: (0..rows * 99).map(|_| lcg(&mut seed)).collect() };
        let q = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1].map(|t| quant_weight(t, rows, cols, &mut seed));
        std::iter::once(f).chain(q).collect()
    }

    #[test]
    fn test_row_alone_equals_row_in_batches_of_1_3_17() {
        let mut seed = 11;
        for w in weights() {
            let k = w.cols();
            let rows: Vec<f32> = (0..17 * k).map(|_| lcg(&mut seed)).collect();
            let mut alone = vec![0f32; w.rows()];
            let probe = &rows[5 * k..6 * k];
            matmul(probe, 1, &w, &mut alone);
            for batch in [1usize, 3, 17] {
                let mut x = rows[..batch * k].to_vec();
                let at = batch / 2;
                x[at * k..(at + 1) * k].copy_from_slice(probe);
                let mut out = vec![0f32; batch * w.rows()];
                matmul(&x, batch, &w, &mut out);
                let got = &out[at * w.rows()..(at + 1) * w.rows()];
                assert!(got.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()), "{w:?} batch {batch}");
            }
        }
    }

    #[test]
    fn test_matmul_matches_dequantized_reference() {
        let mut seed = 3;
        for w in weights() {
            let k = w.cols();
            let x: Vec<f32> = (0..5 * k).map(|_| lcg(&mut seed)).collect();
            let mut out = vec![0f32; 5 * w.rows()];
            matmul(&x, 5, &w, &mut out);
            let dense = w.to_f32();
            for m in 0..5 {
                for j in 0..w.rows() {
                    let want: f64 = (0..k).map(|i| x[m * k + i] as f64 * dense[j * k + i] as f64).sum();
                    let got = out[m * w.rows() + j] as f64;
                    assert!((got - want).abs() < 1e-4 * (1.0 + want.abs()), "{got} vs {want}");
                }
            }
        }
    }
}
