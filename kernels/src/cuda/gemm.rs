//! Host side of the GEMM kernels (gemm.cu, gemm_tiled.cu, gemm_wgmma.cu): which kernel a shape runs, and its launch.

use super::family::runs_split;
use super::{gemm_segments, Arg, DevPtr, Functions, GemmScratch, Gpu, GpuError, STREAM_ROWS};
use cudarc::driver::sys;

/// Dynamic shared memory of a decode GEMM block: 16 warps with rings of `GEMM_RING` (gemm.cu) 512-byte tiles.
const RING_BYTES: u32 = 16 * 8 * 512;

/// Dynamic shared memory of a tiled GEMM block of `rows` rows (gemm_tiled.cu): its stages of 2 chunks of A and of
/// 128 weight rows (4 stages for 128 rows with `fold`, else 3), then with `fold` one float per output of the block
/// for the segment sums.
const fn tiled_smem(rows: u32, fold: bool) -> u32 {
    let stages = if rows == 128 && fold { 4 } else { 3 };
    stages * 2 * (rows + 128) * 64 + if fold { rows * 128 * 4 } else { 0 }
}

/// Stages of an untiled wide GEMM block's rings (gemm_wide in gemm.cu): three up to 8 segments and 64 rows; two
/// with 16 segments, to fit an SM, and over 64 rows, where the grid has several blocks an SM to keep resident.
const fn wide_stages(m: usize, segments: usize) -> usize {
    if segments > 8 || m > 64 {
        2
    } else {
        3
    }
}

/// Dynamic shared memory of an untiled wide GEMM block: per warp (one per segment), a ring of `stages` stages of 4
/// weight tiles and 8 activation rows, 16 bytes a lane each.
const fn wide_smem(segments: usize, stages: usize) -> u32 {
    (segments * stages * 12 * 32 * 16) as u32
}

/// Dynamic shared memory of a wgmma GEMM block (gemm_wgmma.cu): 3 stages of two 32-wide chunks of 128 activation
/// rows in bf16, then one float per output of the block for the segment sums.
const WGMMA_SMEM: u32 = 3 * 2 * 128 * 32 * 2 + 128 * 128 * 4;

/// Tiled GEMM blocks below which the 64-row tiles run instead of the 128-row ones: two per SM of a large GPU.
const TILED_WIDE_BLOCKS: usize = 264;

/// 64-row tiled blocks below which the untiled wide kernel runs instead: one per SM of a large GPU.
const TILED_MIN_BLOCKS: usize = 132;

/// Shared memory behind the ring for the rows a norm-folding GEMM norms: rows x K in bf16.
const NORM_BYTES: u32 = 32 * 1024;

/// What a norm-folding GEMM multiplies: A = rms_norm(x + delta) * w row by row, the bits `add_rms_norm` gives;
/// `delta` 0 for none. x + delta goes to `x_out`, which must not be `x`.
#[derive(Clone, Copy, Debug)]
pub struct NormIn {
    pub x: DevPtr,
    pub delta: DevPtr,
    pub w: DevPtr,
    pub x_out: DevPtr,
    pub eps: f32,
}

/// Lets each GEMM kernel take the dynamic shared memory its launches ask for, beyond the default 48 KiB.
pub(super) fn allow_shared_memory(f: &Functions) -> Result<(), GpuError> {
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    for func in [&f.gemm_m8, &f.gemm_m16] {
        func.set_attribute(attr, RING_BYTES as i32)?;
    }
    f.gemm_norm_m8.set_attribute(attr, (RING_BYTES + NORM_BYTES) as i32)?;
    f.gemm_t128.set_attribute(attr, tiled_smem(128, false) as i32)?;
    f.gemm_t128_fold.set_attribute(attr, tiled_smem(128, true) as i32)?;
    f.gemm_t64.set_attribute(attr, tiled_smem(64, true) as i32)?;
    f.gemm_m64.set_attribute(attr, wide_smem(8, 3) as i32)?;
    f.gemm_m64_r2.set_attribute(attr, wide_smem(16, 2) as i32)?;
    if let Some(wg) = &f.gemm_wg128 {
        wg.set_attribute(attr, WGMMA_SMEM as i32)?;
    }
    Ok(())
}

impl Gpu {
    /// c[m x n] = a[m x k] * w[n x k]^T (+ bias), bf16 in, f32 out; `bias` 0 for none; `w` laid out by
    /// `pack_weight`, or row-major where `natural(n, k)`; `scratch` is the family's workspace.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        a: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        c: DevPtr,
        (m, n, k): (usize, usize, usize),
        scratch: &GemmScratch,
    ) -> Result<(), GpuError> {
        self.gemm_launch(a, w, bias, c, 0, (m, n, k), None, scratch)
    }

    /// Whether `gemm_norm` takes `m` rows of width `k`: only the older kernels fold a norm.
    pub fn folds_norm(&self, m: usize, k: usize) -> bool {
        !self.natural(1, k) && (1..=8).contains(&m) && m * k * 2 <= NORM_BYTES as usize
    }

    /// `gemm` or, with `act`, `gemm_swiglu` of A = `norm`'s rows (k wide), normed inside each block.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_norm(
        &self,
        norm: &NormIn,
        w: DevPtr,
        bias: DevPtr,
        c: DevPtr,
        act: DevPtr,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        assert!(self.folds_norm(m, k) && norm.x != norm.x_out, "gemm_norm: {m} rows of {k} cannot fold");
        assert!(act == 0 || (self.fuses_swiglu(m, n, k) && n.is_multiple_of(16)), "gemm_norm: no SwiGLU here");
        self.gemm_launch(0, w, bias, c, act, (m, n, k), Some(norm), &GemmScratch::default())
    }

    /// Whether `gemm_swiglu` can run for this many rows and this K.
    pub fn fuses_swiglu(&self, m: usize, n: usize, k: usize) -> bool {
        match self.natural(n, k) {
            true => m > STREAM_ROWS && n.is_multiple_of(16) && !runs_split(m, n, k),
            false => m > 16 || (16 / gemm_segments(n, k, self.gemm)).is_multiple_of(2),
        }
    }

    /// act[m x n/2] = SwiGLU of gate and up as bf16, their rows of `w` stacked by `gate_up_order`; no f32 output.
    pub fn gemm_swiglu(
        &self,
        a: DevPtr,
        w: DevPtr,
        act: DevPtr,
        (m, n, k): (usize, usize, usize),
        scratch: &GemmScratch,
    ) -> Result<(), GpuError> {
        assert!(self.fuses_swiglu(m, n, k) && n.is_multiple_of(16), "gemm_swiglu: {m} x {n} x {k} cannot fuse");
        self.gemm_launch(a, w, 0, 0, act, (m, n, k), None, scratch)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_launch(
        &self,
        a: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        c: DevPtr,
        act: DevPtr,
        (m, n, k): (usize, usize, usize),
        norm: Option<&NormIn>,
        scratch: &GemmScratch,
    ) -> Result<(), GpuError> {
        if self.natural(n, k) {
            assert!(norm.is_none(), "gemm: the family folds no norm");
            return self.family_gemm(a, w, bias, c, act, (m, n, k), scratch);
        }
        assert!(k.is_multiple_of(32), "gemm: K = {k} is not a multiple of 32");
        let segments = gemm_segments(n, k, self.gemm);
        // Narrow kernels: 16 warps, one per (8-column tile, segment); the tiled ones: 8 warps over 128 columns; the
        // untiled wide one: a warp per segment over 32 columns. All sum each element in the same order.
        let col_blocks = n.div_ceil(128);
        let (func, grid, threads, smem) = match (m, &self.f.gemm_wg128) {
            (0..=8, _) => (&self.f.gemm_m8, (n.div_ceil(8 * 16 / segments), 1, 1), 512, RING_BYTES),
            (9..=16, _) => (&self.f.gemm_m16, (n.div_ceil(8 * 16 / segments), 1, 1), 512, RING_BYTES),
            (_, Some(wg)) => (wg, (n.div_ceil(8).div_ceil(16), m.div_ceil(128), 1), 256, WGMMA_SMEM),
            _ if m.div_ceil(128) * col_blocks >= TILED_WIDE_BLOCKS => match segments {
                1 => (&self.f.gemm_t128, (m.div_ceil(128) * col_blocks, 1, 1), 256, tiled_smem(128, false)),
                _ => (&self.f.gemm_t128_fold, (m.div_ceil(128) * col_blocks, 1, 1), 256, tiled_smem(128, true)),
            },
            _ if m.div_ceil(64) * col_blocks >= TILED_MIN_BLOCKS => {
                (&self.f.gemm_t64, (m.div_ceil(64) * col_blocks, 1, 1), 256, tiled_smem(64, true))
            }
            _ => {
                let stages = wide_stages(m, segments);
                let func = if stages == 2 { &self.f.gemm_m64_r2 } else { &self.f.gemm_m64 };
                (func, (n.div_ceil(32), m.div_ceil(64), 1), 32 * segments as u32, wide_smem(segments, stages))
            }
        };
        let dims = [m, n, k, segments].map(|v| Arg::Int(v as i32));
        let tail = [Arg::Ptr(w), Arg::Ptr(bias), Arg::Ptr(c), Arg::Ptr(act), dims[0], dims[1], dims[2], dims[3]];
        let Some(nm) = norm else {
            return self.launch(func, grid, threads, smem, &[&[Arg::Ptr(a)], &tail[..]].concat());
        };
        let head = [Arg::Ptr(nm.x), Arg::Ptr(nm.delta), Arg::Ptr(nm.w), Arg::Ptr(nm.x_out), Arg::Float(nm.eps)];
        let smem = RING_BYTES + (m * k * 2) as u32;
        self.launch(&self.f.gemm_norm_m8, grid, threads, smem, &[&head[..], &tail[..]].concat())
    }
}
