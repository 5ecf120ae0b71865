//! Integer matmul as llama.cpp computes it on CPU: each activation row is quantized to 8 bits in blocks of 32, and
//! each block's products with the 32 weights beside it (Q4_0, Q4_1, Q8_0, or a K-quant's sub-block) are summed
//! exactly in integers.
//!
//! The float arithmetic around the exact sums is fixed: block b's eight 4-element partial sums, times `d_w * d_x`,
//! go by fused multiply-add into lanes `8 * (b % 2) + l` in ascending block order, and the 16 lanes are added in
//! one fixed tree. So every instruction set gives the same bits, and a row never depends on the other rows.
// A tile's rows index its activations, accumulators and outputs in step, so the loops run over row indices.
#![allow(clippy::needless_range_loop)]

use rayon::prelude::*;

pub use crate::dot8_block::BLOCK;
use crate::dot8_block::{f16_at, finish, reduce16, Format, Row, LANES};
use crate::out_ptr::OutPtr;

use crate::weight::Weight;

/// Weight rows per parallel task; any value gives the same bits.
const ROWS_PER_TASK: usize = 16;
/// Activation rows that share one pass over a weight row.
const TILE: usize = 4;

/// Activation rows quantized per 32-element block: `q = round(x / d)` with `d = max|x| / 127`.
#[derive(Clone, Debug)]
pub struct Q8Rows {
    num_rows: usize,
    cols: usize,
    /// `q + 128` per element: the unsigned operand of the u8 x i8 dot instructions.
    biased: Vec<u8>,
    /// Each block's `d`, once per lane, so a vector of lanes loads its scales whole.
    scales: Vec<f32>,
    /// Each block's `d * Σq`, which meets a Q4_1 block's minimum.
    sums: Vec<f32>,
}

impl Q8Rows {
    /// Quantizes `num_rows` rows of `x`, each on its own; the width must be whole blocks.
    pub fn quantize(x: &[f32], num_rows: usize) -> Q8Rows {
        let cols = x.len().checked_div(num_rows).unwrap_or(0);
        assert_eq!(x.len(), num_rows * cols, "Q8Rows: {} values are not {num_rows} rows", x.len());
        assert!(cols.is_multiple_of(BLOCK), "Q8Rows: {cols} columns are not whole blocks of {BLOCK}");
        let num_blocks = x.len() / BLOCK;
        let mut biased = vec![0u8; x.len()];
        let mut scales = vec![0f32; num_blocks * LANES];
        let mut sums = vec![0f32; num_blocks];
        let blocks = x.chunks_exact(BLOCK).zip(biased.chunks_exact_mut(BLOCK));
        for (b, (xb, qb)) in blocks.enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                let i = (v * inv).round().clamp(-127.0, 127.0) as i32;
                sum += i;
                *q = (i + 128) as u8;
            }
            scales[b * LANES..(b + 1) * LANES].fill(d);
            sums[b] = d * sum as f32;
        }
        Q8Rows { num_rows, cols, biased, scales, sums }
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn row(&self, r: usize) -> Row<'_> {
        let nb = self.cols / BLOCK;
        Row {
            biased: &self.biased[r * self.cols..(r + 1) * self.cols],
            scales: &self.scales[r * nb * LANES..(r + 1) * nb * LANES],
            sums: &self.sums[r * nb..(r + 1) * nb],
        }
    }
}

/// Whether `w` has an integer path.
pub fn supports(w: &Weight) -> bool {
    matches!(w, Weight::Quant { ty, .. } if Format::of(*ty).is_some())
}

/// The instruction sets of the integer dot products; all give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Scalar,
    /// `vpmaddubsw` then `vpmaddwd`.
    Avx2,
    /// `vpdpbusd` on 256 bits, VEX-encoded.
    AvxVnni,
    /// `vpdpbusd` on 512 bits, two blocks at a time.
    Avx512Vnni,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni];

    /// Whether this machine runs it.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            static VNNI: std::sync::OnceLock<(bool, bool)> = std::sync::OnceLock::new();
            let (avx_vnni, avx512_vnni) = *VNNI.get_or_init(|| {
                let avx512_vnni = is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni");
                (is_x86_feature_detected!("avxvnni"), avx512_vnni)
            });
            let avx2 = crate::simd::has_avx2();
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => avx2,
                Isa::AvxVnni => avx2 && avx_vnni,
                Isa::Avx512Vnni => avx2 && avx512_vnni,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        matches!(self, Isa::Scalar)
    }

    /// The widest one this machine runs, short of AVX-512 when the kernels are kept to AVX2.
    pub fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512Vnni.available() && crate::simd512::has_avx512() {
            return Isa::Avx512Vnni;
        }
        [Isa::AvxVnni, Isa::Avx2].into_iter().find(|i| i.available()).unwrap_or(Isa::Scalar)
    }
}

/// `out[m, n] = Σ_k x[m, k] · w[n, k]` in integers, on the best instruction set here.
pub fn matmul_q8(x: &Q8Rows, w: &Weight, out: &mut [f32]) {
    matmul_q8_on(Isa::best(), x, w, out)
}

/// As `matmul_q8`, on `isa`, which must be available.
pub fn matmul_q8_on(isa: Isa, x: &Q8Rows, w: &Weight, out: &mut [f32]) {
    let Weight::Quant { ty, rows: n, cols: k, data } = w else {
        panic!("matmul_q8: f32 weights have no integer path");
    };
    let fmt = Format::of(*ty).unwrap_or_else(|| panic!("matmul_q8: {ty:?} weights have no integer path"));
    let (n, k, num_rows) = (*n, *k, x.num_rows);
    assert_eq!(x.cols, k, "matmul_q8: activations are {} wide, weights {k}", x.cols);
    assert_eq!(out.len(), num_rows * n, "matmul_q8: output is not {num_rows} x {n}");
    assert!(isa.available(), "matmul_q8: {isa:?} does not run here");
    let row_bytes = k / fmt.unit_len() * fmt.unit_bytes();
    let rows: Vec<Row> = (0..num_rows).map(|r| x.row(r)).collect();
    let ptr = OutPtr(out.as_mut_ptr());
    (0..n.div_ceil(ROWS_PER_TASK)).into_par_iter().for_each(|task| {
        // The closure must take the Send wrapper whole, not its raw pointer field.
        #[allow(clippy::redundant_locals)]
        let ptr = ptr;
        let mut m = 0;
        while m < num_rows {
            let take = (num_rows - m).min(TILE);
            for j in task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(n) {
                let w_row = &data[j * row_bytes..(j + 1) * row_bytes];
                let mut res = [0f32; TILE];
                match take {
                    4 => tile::<4>(isa, fmt, w_row, &rows[m..], &mut res),
                    3 => tile::<3>(isa, fmt, w_row, &rows[m..], &mut res),
                    2 => tile::<2>(isa, fmt, w_row, &rows[m..], &mut res),
                    _ => tile::<1>(isa, fmt, w_row, &rows[m..], &mut res),
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

fn tile<const R: usize>(isa: Isa, fmt: Format, w: &[u8], rows: &[Row], res: &mut [f32; TILE]) {
    let t: [Row; R] = std::array::from_fn(|r| rows[r]);
    let mut out = [0f32; R];
    match isa {
        // SAFETY (all three): the caller checked the instruction set; every row holds the blocks of `w`.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { crate::dot8_x86::dot_avx2(fmt, w, &t, &mut out) },
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => unsafe { crate::dot8_x86::dot_avx_vnni(fmt, w, &t, &mut out) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => unsafe { crate::dot8_x86::dot_avx512_vnni(fmt, w, &t, &mut out) },
        _ => dot_scalar(fmt, w, &t, &mut out),
    }
    res[..R].copy_from_slice(&out);
}

/// Block `b` of a weight row as 32 signed integers, the scales of its elements 0..16 and 16..32, and its minimum.
pub(crate) fn decode(fmt: Format, row: &[u8], b: usize) -> ([i8; BLOCK], [f32; 2], f32) {
    if fmt.is_k() {
        let sup = &row[b / 8 * fmt.unit_bytes()..(b / 8 + 1) * fmt.unit_bytes()];
        return crate::dot8_k::decode(fmt, sup, b % 8);
    }
    let blk = &row[b * fmt.unit_bytes()..(b + 1) * fmt.unit_bytes()];
    let mut w = [0i8; BLOCK];
    match fmt {
        Format::Q8_0 => w.iter_mut().zip(&blk[2..34]).for_each(|(w, &q)| *w = q as i8),
        _ => {
            let (qs, offset) = if fmt == Format::Q4_1 { (&blk[4..20], 0) } else { (&blk[2..18], 8) };
            for (i, &q) in qs.iter().enumerate() {
                w[i] = (q & 15) as i8 - offset;
                w[i + 16] = (q >> 4) as i8 - offset;
            }
        }
    }
    let min = if fmt == Format::Q4_1 { f16_at(blk, 2) } else { 0.0 };
    let d = f16_at(blk, 0);
    (w, [d, d], min)
}

/// The reference arithmetic that the SIMD forms reproduce.
fn dot_scalar<const R: usize>(fmt: Format, w: &[u8], rows: &[Row; R], out: &mut [f32; R]) {
    let mut acc = [[0f32; 2 * LANES]; R];
    let mut mins = [0f32; R];
    let num_blocks = w.len() / fmt.unit_bytes() * (fmt.unit_len() / BLOCK);
    for b in 0..num_blocks {
        let (wq, dw, mw) = decode(fmt, w, b);
        for r in 0..R {
            let x = &rows[r].biased[b * BLOCK..(b + 1) * BLOCK];
            for l in 0..LANES {
                let scale = dw[l / 4] * rows[r].scales[b * LANES + l];
                let lane: i32 = (4 * l..4 * l + 4).map(|i| (x[i] as i32 - 128) * wq[i] as i32).sum();
                let a = &mut acc[r][LANES * (b % 2) + l];
                *a = scale.mul_add(lane as f32, *a);
            }
            if fmt.has_mins() {
                mins[r] = mw.mul_add(rows[r].sums[b], mins[r]);
            }
        }
    }
    for r in 0..R {
        out[r] = finish(fmt, reduce16(&acc[r]), mins[r]);
    }
}

#[cfg(test)]
#[path = "dot8_tests.rs"]
mod tests;
