//! The GEMM's weight layout, its K segments, and recorded launch graphs.

use cudarc::driver::CudaGraph;

use crate::cuda::GpuError;

/// Fewest 32-wide chunks in one K segment.
pub const MIN_SEGMENT_TILES: usize = 16;

/// Decode grids are kept within this many blocks where the segment count allows: one wave of the decode GEMM
/// (two blocks per SM) on a GPU of 128 SMs or more.
pub const MAX_DECODE_BLOCKS: usize = 256;

/// How the GEMM splits K; each field changes the reduction order of every row of a weight alike, never per batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTuning {
    /// Fewest 32-wide chunks in one K segment.
    pub min_segment_tiles: usize,
    /// Most blocks of a decode grid the segment count aims for; 0 for no limit.
    pub max_decode_blocks: usize,
}

impl GemmTuning {
    pub const DEFAULT: GemmTuning =
        GemmTuning { min_segment_tiles: MIN_SEGMENT_TILES, max_decode_blocks: MAX_DECODE_BLOCKS };
}

impl Default for GemmTuning {
    fn default() -> Self {
        GemmTuning::DEFAULT
    }
}

/// K is summed in this many segments, fixed by the weight's shape alone: of 16, 8, 4, 2 and 1, those that split
/// it into whole 32-wide chunks with at least `min_segment_tiles` each (1 when none does); the most of them
/// whose decode grid, n / 8 * S / 16 blocks, stays within `max_decode_blocks` (0 for no limit), else the most.
pub fn gemm_segments(n: usize, k: usize, tuning: GemmTuning) -> usize {
    let max_blocks = match tuning.max_decode_blocks {
        0 => usize::MAX,
        n => n,
    };
    choose_segments(n, k, tuning.min_segment_tiles, max_blocks)
}

fn choose_segments(n: usize, k: usize, min_tiles: usize, max_blocks: usize) -> usize {
    let tiles = k / 32;
    let fits = |s: &usize| tiles.is_multiple_of(*s) && tiles / s >= min_tiles;
    let mut options = [16, 8, 4, 2, 1].into_iter().filter(fits);
    let most = options.clone().next().unwrap_or(1);
    options.find(|s| n.div_ceil(8 * 16 / s) <= max_blocks).unwrap_or(most)
}

/// Row r of the stacked gate and up weights (f rows each) for row `r` of the GEMM: tiles of 8 rows alternate,
/// gate then up, so one block holds both halves of the SwiGLU it fuses.
pub fn gate_up_order(r: usize, f: usize) -> usize {
    let (tile, i) = (r / 8, r % 8);
    (tile % 2) * f + (tile / 2) * 8 + i
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
    fn test_segments_depend_on_the_weight_shape() {
        // A weight this wide fits no bound, so K alone decides.
        let seg = |k| gemm_segments(1 << 20, k, GemmTuning::default());
        assert_eq!([seg(4096), seg(576), seg(1024), seg(32)], [8, 1, 2, 1]);
        assert_eq!([seg(14336), seg(3584), seg(12288)], [16, 4, 16]);
    }

    #[test]
    fn test_a_block_limit_takes_fewer_segments_where_that_fits_the_grid() {
        let seg = |n, k| choose_segments(n, k, MIN_SEGMENT_TILES, MAX_DECODE_BLOCKS);
        // Llama-3.1-8B: down, qkv, o and gate/up fit in 256 blocks with 8, 4, 8 and 1 segments; lm_head with none.
        let llama = [seg(4096, 14336), seg(6144, 4096), seg(4096, 4096), seg(28672, 4096), seg(128256, 4096)];
        assert_eq!(llama, [8, 4, 8, 1, 8]);
        assert_eq!(choose_segments(4096, 14336, MIN_SEGMENT_TILES, usize::MAX), 16);
    }

    #[test]
    fn test_gate_up_order_alternates_tiles_of_gate_and_up() {
        let f = 24;
        let order: Vec<usize> = (0..2 * f).map(|r| gate_up_order(r, f)).collect();
        assert_eq!(&order[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 24, 25]);
        assert_eq!(&order[16..18], &[8, 9]);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..2 * f).collect::<Vec<_>>(), "every row once");
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
