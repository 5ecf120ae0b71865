//! The GEMM's weight layout, its K segments, and recorded launch graphs.

use cudarc::driver::CudaGraph;

use crate::cuda::GpuError;

/// Fewest 32-wide chunks in one K segment.
pub const MIN_SEGMENT_TILES: usize = 16;

/// K is summed in this many segments, fixed by K alone: the most of 16, 8, 4, 2 or 1 that splits it into whole
/// 32-wide chunks with at least `MIN_SEGMENT_TILES` each (1 when none does).
pub fn gemm_segments(k: usize) -> usize {
    static MIN_TILES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // TENSORFOLD_GEMM_MIN_TILES sets another minimum, for tuning; it changes the reduction order of every row alike.
    let min_tiles = *MIN_TILES.get_or_init(|| {
        std::env::var("TENSORFOLD_GEMM_MIN_TILES").ok().and_then(|v| v.parse().ok()).unwrap_or(MIN_SEGMENT_TILES)
    });
    let tiles = k / 32;
    [16, 8, 4, 2, 1].into_iter().find(|s| tiles.is_multiple_of(*s) && tiles / s >= min_tiles).unwrap_or(1)
}

/// Rows of a packed weight: whole tiles of 8.
pub fn packed_rows(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Where element (r, i) of an `n x k` row-major weight sits once packed in the GEMM's 8 x 32 tiles.
pub fn packed_index(r: usize, i: usize, k: usize) -> usize {
    ((r / 8) * (k / 32) + i / 32) * 256 + (r % 8) * 32 + i % 32
}

/// Packs a row-major `n x k` weight (k a multiple of 32) into the GEMM's tiles, padding rows to a multiple of 8.
pub fn pack_weight<T: Copy + Default + Send + Sync>(data: &[T], n: usize, k: usize) -> Vec<T> {
    use rayon::prelude::*;
    assert!(k.is_multiple_of(32) && data.len() == n * k, "pack_weight: {n} x {k} from {} values", data.len());
    let mut out = vec![T::default(); packed_rows(n) * k];
    out.par_chunks_mut(8 * k).enumerate().for_each(|(group, tiles)| {
        for (kb, tile) in tiles.chunks_mut(256).enumerate() {
            for (r, dst) in tile.chunks_mut(32).enumerate() {
                let row = group * 8 + r;
                if row < n {
                    dst.copy_from_slice(&data[row * k + kb * 32..row * k + kb * 32 + 32]);
                }
            }
        }
    });
    out
}

/// A recorded sequence of launches on the GPU's stream, replayed as one.
pub struct Graph(pub(crate) CudaGraph);

// SAFETY: a graph is only launched or dropped by whoever owns it, one call at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Queues the recorded launches on the stream.
    pub fn launch(&self) -> Result<(), GpuError> {
        Ok(self.0.launch()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_segments_depend_on_k_alone() {
        assert_eq!([gemm_segments(4096), gemm_segments(576), gemm_segments(1024), gemm_segments(32)], [8, 1, 2, 1]);
        assert_eq!([gemm_segments(14336), gemm_segments(3584), gemm_segments(12288)], [16, 4, 16]);
    }

    #[test]
    fn test_packed_weight_puts_each_element_where_the_kernels_read_it() {
        let (n, k) = (13, 96);
        let data: Vec<u32> = (0..(n * k) as u32).map(|v| v + 1).collect();
        let packed = pack_weight(&data, n, k);
        assert_eq!(packed.len(), 16 * k);
        for r in 0..n {
            for i in 0..k {
                assert_eq!(packed[packed_index(r, i, k)], data[r * k + i], "element ({r}, {i})");
            }
        }
        // The padding rows are zero and nothing else is.
        assert_eq!(packed.iter().filter(|&&v| v == 0).count(), 3 * k);
        // Lane l of a warp reads 8 values of row l / 4 from k offset 8 (l % 4) of the tile.
        let lane = 13;
        assert_eq!(packed[256 + 8 * lane], data[(lane / 4) * k + 32 + 8 * (lane % 4)]);
    }
}
