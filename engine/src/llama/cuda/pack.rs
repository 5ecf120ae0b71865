//! Weights packed for the GEMM straight from the checkpoint: stored bf16 values are copied, others rounded from f32.

use half::bf16;
use rayon::prelude::*;
use tensorfold_kernels::cuda::packed_rows;
use tensorfold_kernels::Weight;

use crate::checkpoint::{Bf16Rows, Checkpoint};
use crate::error::LoadError;
use crate::llama::Loader;

/// One weight's rows as the checkpoint gives them.
pub(super) enum Rows<'a> {
    /// Stored in bf16: copied bit for bit.
    Bf16(Bf16Rows<'a>),
    /// Any other format, read as f32 and rounded to bf16: `data`, `rows`, `cols`.
    F32(Vec<f32>, usize, usize),
}

impl Rows<'_> {
    pub(super) fn rows(&self) -> usize {
        match self {
            Rows::Bf16(b) => b.rows,
            Rows::F32(_, rows, _) => *rows,
        }
    }

    pub(super) fn cols(&self) -> usize {
        match self {
            Rows::Bf16(b) => b.cols,
            Rows::F32(_, _, cols) => *cols,
        }
    }

    /// Values `at..at + dst.len()` of row `r`, as bf16.
    fn copy(&self, r: usize, at: usize, dst: &mut [bf16]) {
        match self {
            Rows::Bf16(b) => {
                let from = &b.bytes[2 * (r * b.cols + at)..][..2 * dst.len()];
                copy_le(from, dst);
            }
            Rows::F32(data, _, cols) => {
                for (d, &v) in dst.iter_mut().zip(&data[r * cols + at..]) {
                    *d = bf16::from_f32(v);
                }
            }
        }
    }
}

/// Little-endian bf16 bytes into values: one copy of the bytes on a little-endian host.
fn copy_le(from: &[u8], dst: &mut [bf16]) {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: bf16 is a plain u16 in host order, little-endian here, and `from` holds its 2 * len bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), 2 * dst.len()) };
        bytes.copy_from_slice(from);
    }
    #[cfg(not(target_endian = "little"))]
    for (d, pair) in dst.iter_mut().zip(from.chunks_exact(2)) {
        *d = bf16::from_le_bytes([pair[0], pair[1]]);
    }
}

/// The `rows` x `cols` matrix `name`: its stored bf16 values where it has them, else its values as f32.
pub(super) fn read<'a>(
    ckpt: &'a dyn Checkpoint,
    ld: &Loader,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Rows<'a>, LoadError> {
    if let Some(b) = ckpt.bf16_rows(name).filter(|b| (b.rows, b.cols) == (rows, cols)) {
        return Ok(Rows::Bf16(b));
    }
    let data = match ld.matrix(name, rows, cols)? {
        Weight::F32 { data, .. } => data,
        quant => quant.to_f32(),
    };
    Ok(Rows::F32(data, rows, cols))
}

/// Packs `n` rows of `k` columns in the GEMM's 8 x 32 tiles (rows padded to a multiple of 8), as
/// `tensorfold_kernels::cuda::pack_weight` lays them out, or row-major where `natural`; row `r` is row
/// `source(r).1` of part `source(r).0`.
pub(super) fn pack_rows(
    parts: &[Rows],
    n: usize,
    k: usize,
    natural: bool,
    source: impl Fn(usize) -> (usize, usize) + Sync,
) -> Vec<bf16> {
    assert!(k.is_multiple_of(32), "pack_rows: K = {k} is not a multiple of 32");
    let mut out = vec![bf16::ZERO; packed_rows(n) * k];
    if natural {
        out.par_chunks_mut(k).take(n).enumerate().for_each(|(row, dst)| {
            let (part, part_row) = source(row);
            for (kb, chunk) in dst.chunks_mut(32).enumerate() {
                parts[part].copy(part_row, kb * 32, chunk);
            }
        });
        return out;
    }
    out.par_chunks_mut(8 * k).enumerate().for_each(|(group, tiles)| {
        for (kb, tile) in tiles.chunks_mut(256).enumerate() {
            for (r, dst) in tile.chunks_mut(32).enumerate() {
                let row = group * 8 + r;
                if row < n {
                    let (part, part_row) = source(row);
                    parts[part].copy(part_row, kb * 32, dst);
                }
            }
        }
    });
    out
}

/// The part and its row for row `r` of parts stacked in order.
pub(super) fn stacked(parts: &[Rows], mut r: usize) -> (usize, usize) {
    for (i, p) in parts.iter().enumerate() {
        if r < p.rows() {
            return (i, r);
        }
        r -= p.rows();
    }
    panic!("row {r} is past the stacked parts")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_kernels::cuda::{gate_up_order, pack_weight};

    #[test]
    fn test_stored_bf16_packs_to_the_bits_the_f32_path_packs() {
        let (n, k) = (13, 64);
        let values: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(((i * 37) % 101) as f32 * 0.013 - 0.6)).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let stored = [Rows::Bf16(Bf16Rows { rows: n, cols: k, bytes: &bytes })];
        let read = [Rows::F32(values.iter().map(|v| v.to_f32()).collect(), n, k)];
        let want = pack_weight(&values, n, k);
        let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&pack_rows(&stored, n, k, false, |r| (0, r))), bits(&want));
        assert_eq!(bits(&pack_rows(&read, n, k, false, |r| (0, r))), bits(&want));
        let natural = bits(&pack_rows(&stored, n, k, true, |r| (0, r)));
        assert_eq!(natural[..n * k], bits(&values)[..], "row-major rows as stored");
        assert_eq!(natural[n * k..], vec![0; 3 * k][..], "the padding rows are zero");
    }

    #[test]
    fn test_stacked_and_interleaved_rows_follow_their_parts() {
        let (f, k) = (16, 32);
        let part = |seed: usize| -> Vec<f32> { (0..f * k).map(|i| (i * seed % 97) as f32).collect() };
        let (g, u) = (part(3), part(5));
        let parts = [Rows::F32(g.clone(), f, k), Rows::F32(u.clone(), f, k)];
        let order = |r| match gate_up_order(r, f) {
            src if src < f => (0, src),
            src => (1, src - f),
        };
        let mut rows = vec![bf16::ZERO; 2 * f * k];
        for (r, dst) in rows.chunks_mut(k).enumerate() {
            let (p, pr) = order(r);
            let from = if p == 0 { &g } else { &u };
            dst.iter_mut().zip(&from[pr * k..]).for_each(|(d, &v)| *d = bf16::from_f32(v));
        }
        assert_eq!(pack_rows(&parts, 2 * f, k, false, order), pack_weight(&rows, 2 * f, k));
        assert_eq!(pack_rows(&parts, 2 * f, k, true, order), rows);
        let stacked_rows: Vec<bf16> = g.iter().chain(&u).map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(pack_rows(&parts, 2 * f, k, false, |r| stacked(&parts, r)), pack_weight(&stacked_rows, 2 * f, k));
    }
}
