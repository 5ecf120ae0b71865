//! Host side of the exact Hopper GEMM family: gemm_stream.cu for decode rounds, gemm_tma.cu for wider ones. Both
//! sum each output in gemm_ref.cu's order (K in `family_segments` segments fixed by the weight's shape, each from +0
//! in ascending k16 steps, the segment sums added in order, then the bias), so a row's bits never depend on M.

use std::collections::HashMap;

use cudarc::driver::{sys, CudaFunction};

use super::{Arg, DevPtr, Gpu, GpuError};

/// Weight rows times segments that a decode grid wants in flight; more segments only for narrower weights.
const SEGMENT_ROWS: usize = 16384;

/// Shortest K segment, so that a segment's chain spans several stages of the ring.
const MIN_SEGMENT_K: usize = 384;

/// Rounds of at most this many rows run the decode kernel; wider ones the TMA + wgmma kernels.
pub const STREAM_ROWS: usize = 32;

/// Arrival counters a segmented decode or split launch may use: one per tile run or tile.
pub const GEMM_COUNTERS: usize = 1024;

/// Rounds of up to this many rows give each (tile, K segment) of a long-segment weight its own CTA (`_k` kernels).
pub const SPLIT_ROWS: usize = 128;

/// Shortest K segment that runs split: the fold reads every segment's plane, which pays only for long segments.
const SPLIT_SEGMENT_K: usize = 2048;

/// Threads of a decode block: 8 consumer warps and a producer warp.
const STREAM_THREADS: u32 = 288;

/// Threads of a TMA block: a producer warpgroup and two consumer warpgroups.
pub(super) const TMA_THREADS: u32 = 384;

/// Weight tiles of 8 rows one decode pass holds: the weight box stays within TMA's 256 rows.
const PASS_TILES: usize = 32;

/// Shared memory a decode block may have with one block an SM and with two (1 KB of each SM's 228 KB reserved a block).
const STREAM_SMEM: [usize; 2] = [232448, 115712];

/// Rows of A the CTAs at work together span in the TMA kernels' walk, sharing those tiles in L2.
pub(super) const GROUP_ROWS: usize = 2048;

/// One TMA kernel: (name, tile rows, tile columns, stages, whether a segmented twin `_s` and a split twin `_k` exist).
const TMA_KERNELS: [(&str, usize, usize, usize, bool, bool); 8] = [
    ("gemm_tma_128x256", 128, 256, 4, false, false),
    ("gemm_tma_128x224", 128, 224, 5, false, false),
    ("gemm_tma_128x192", 128, 192, 5, true, false),
    ("gemm_tma_128x128", 128, 128, 7, true, true),
    ("gemm_tma_64x256", 64, 256, 5, true, false),
    ("gemm_tma_64x128", 64, 128, 9, true, true),
    ("gemm_tma_64x64", 64, 64, 14, true, false),
    ("gemm_tma_64x32", 64, 32, 18, true, false),
];

/// Decode kernels by (blocks an SM - 1, A rows / 16 - 1).
const STREAM_KERNELS: [[&str; 2]; 2] =
    [["gemm_stream_m16", "gemm_stream_m32"], ["gemm_stream_m16_x2", "gemm_stream_m32_x2"]];

/// K is summed in this many segments for an `n x k` weight, fixed by the shape: the smallest power of two S with
/// n S >= SEGMENT_ROWS, halving K only while K / S stays a multiple of 64 and at least MIN_SEGMENT_K.
pub fn family_segments(n: usize, k: usize) -> usize {
    let mut s = 1;
    while n * s < SEGMENT_ROWS
        && k.is_multiple_of(2 * s)
        && (k / (2 * s)).is_multiple_of(64)
        && k / (2 * s) >= MIN_SEGMENT_K
    {
        s *= 2;
    }
    s
}

/// Whether `m` rows of an `n x k` weight run on the split kernels: K in long segments and a round of
/// STREAM_ROWS + 1 to SPLIT_ROWS rows, where the segmented tiles alone leave most SMs a long walk over K.
pub(super) fn runs_split(m: usize, n: usize, k: usize) -> bool {
    let segs = family_segments(n, k);
    segs > 1 && k / segs >= SPLIT_SEGMENT_K && m > STREAM_ROWS && m <= SPLIT_ROWS
}

/// The f32 workspace a segmented decode or split launch of an `n x k` weight needs, in floats (0 for an
/// unsegmented one).
pub fn family_workspace(n: usize, k: usize) -> usize {
    let rows = if runs_split(SPLIT_ROWS, n, k) { SPLIT_ROWS } else { STREAM_ROWS };
    match family_segments(n, k) {
        1 => 0,
        s => s * rows * n,
    }
}

/// Where a segmented decode launch keeps its partial sums: `ws_floats` floats at `ws`, and GEMM_COUNTERS zeroed
/// int32 arrival counters at `counters`, which the kernel leaves zero.
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmScratch {
    pub ws: DevPtr,
    pub ws_floats: usize,
    pub counters: DevPtr,
}

/// A TMA kernel with its segmented and split twins, where they exist.
type TmaTwins = (CudaFunction, Option<CudaFunction>, Option<CudaFunction>);

/// The family's kernels, loaded where the GPU is an sm_90a one.
pub(super) struct Family {
    tma: Vec<TmaTwins>,
    stream: [[CudaFunction; 2]; 2],
    sms: usize,
}

/// A decode launch: kernel, A box rows, grid, tiles a pass, chunks a stage, stages, shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StreamPlan {
    per_sm: usize,
    rows: usize,
    grid: usize,
    pt: usize,
    kc: usize,
    slots: usize,
    smem: usize,
}

/// The decode plan for `m` rows of an `n x k` weight in `segs` segments on `sms` SMs: stages aim at `stage_bytes`
/// of weights, fewer where that would leave under `min_slots` stages in the ring.
fn stream_plan(m: usize, n: usize, k: usize, sms: usize, segs: usize) -> StreamPlan {
    // One block an SM with long stages for the narrowest rounds; two blocks, shorter stages, from 5 rows.
    let (per_sm, stage_bytes, min_slots) = if m <= 4 { (1, 64 << 10, 3) } else { (2, 16 << 10, 3) };
    let rows = if m <= 16 { 16 } else { 32 };
    let tiles = n.div_ceil(8);
    let runs = (sms * per_sm / segs).max(1).min(tiles);
    let most = tiles.div_ceil(runs);
    let pt = most.div_ceil(most.div_ceil(PASS_TILES));
    let (w_chunk, a_chunk) = (pt * 1024, rows / 16 * 2048);
    let mut kc = ((stage_bytes as f64 / w_chunk as f64).round() as usize).clamp(1, (k / segs / 64).clamp(1, 16));
    let budget = STREAM_SMEM[per_sm - 1] - 1024;
    while kc > 1 && budget / (kc * (w_chunk + a_chunk) + 16) < min_slots {
        kc -= 1;
    }
    let slots = (budget / (kc * (w_chunk + a_chunk) + 16)).min(16);
    let smem = 1024 + slots * (kc * (w_chunk + a_chunk) + 16);
    StreamPlan { per_sm, rows, grid: runs * segs, pt, kc, slots, smem }
}

/// The TMA kernel for `m` rows of an `n`-wide output: the largest useful tile that still gives about 70% of the SMs
/// a unit, else the one with the most units; with `segs` > 1 only those with a segmented twin, or with `split` those
/// with a split twin, whose units are (tile, segment) pairs.
fn tma_choice(m: usize, n: usize, sms: usize, segs: usize, split: bool) -> usize {
    let fits = |&i: &usize| if split { TMA_KERNELS[i].5 } else { segs == 1 || TMA_KERNELS[i].4 };
    let per_tile = if split { segs } else { 1 };
    let units = |i: usize| m.div_ceil(TMA_KERNELS[i].1) * n.div_ceil(TMA_KERNELS[i].2) * per_tile;
    // Ties go to the tile that wastes fewer rows, then to the taller one, which reads the weights fewer times.
    let useful = |i: usize| {
        let bm = TMA_KERNELS[i].1;
        (bm.min(m) * TMA_KERNELS[i].2, usize::MAX - (m.div_ceil(bm) * bm - m), bm)
    };
    let candidates = (0..TMA_KERNELS.len()).filter(fits);
    let busy = candidates.clone().filter(|&i| 10 * units(i) >= 7 * sms).max_by_key(|&i| useful(i));
    busy.unwrap_or_else(|| candidates.max_by_key(|&i| (units(i), useful(i))).expect("a TMA kernel fits"))
}

pub(super) const fn tma_smem(bm: usize, bn: usize, stages: usize) -> usize {
    1024 + stages * ((bm + bn) * 128 + 16)
}

impl Family {
    /// Loads the kernels from `module` and lets each take the shared memory its launches ask for.
    pub(super) fn load(module: &super::build::Kernels, sms: usize) -> Result<Family, GpuError> {
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let mut tma = Vec::with_capacity(TMA_KERNELS.len());
        for (name, bm, bn, stages, seg, split) in TMA_KERNELS {
            let load = |name: &str| -> Result<CudaFunction, GpuError> {
                let f = module.function(name)?;
                f.set_attribute(attr, tma_smem(bm, bn, stages) as i32)?;
                Ok(f)
            };
            let twin = if seg { Some(load(&format!("{name}_s"))?) } else { None };
            let split_twin = if split { Some(load(&format!("{name}_k"))?) } else { None };
            tma.push((load(name)?, twin, split_twin));
        }
        let stream_fn = |per_sm: usize, i: usize| -> Result<CudaFunction, GpuError> {
            let f = module.function(STREAM_KERNELS[per_sm][i])?;
            f.set_attribute(attr, STREAM_SMEM[per_sm] as i32)?;
            Ok(f)
        };
        let stream = [[stream_fn(0, 0)?, stream_fn(0, 1)?], [stream_fn(1, 0)?, stream_fn(1, 1)?]];
        Ok(Family { tma, stream, sms })
    }
}

/// A tensor map's identity: base address, rows, columns, box rows.
pub(super) type MapKey = (DevPtr, usize, usize, usize);

impl Gpu {
    /// Whether an `n x k` weight runs on the family: on an sm_90a GPU, K a multiple of 64. Such weights are stored
    /// row-major (`natural`) instead of in the older kernels' tiles.
    pub fn natural(&self, n: usize, k: usize) -> bool {
        self.f.family.is_some() && k.is_multiple_of(64) && n > 0 && n < (1 << 30)
    }

    /// The 128-byte-swizzled map of a row-major bf16 `rows x cols` matrix at `ptr`, boxes of `box_rows` x 64.
    pub(super) fn tensor_map(
        &self,
        ptr: DevPtr,
        rows: usize,
        cols: usize,
        box_rows: usize,
    ) -> Result<[u64; 16], GpuError> {
        let key = (ptr, rows, cols, box_rows);
        let mut maps = self.maps.lock().expect("the tensor map cache");
        if let Some(found) = maps.get(&key) {
            return Ok(*found);
        }
        // SAFETY: a zeroed map is plain data that the call overwrites.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        let dims = [cols as u64, rows as u64];
        let strides = [2 * cols as u64];
        let boxes = [64u32, box_rows as u32];
        let steps = [1u32, 1];
        // SAFETY: the arrays outlive the call, which only encodes the map on the host.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()?;
        if maps.len() > 1 << 16 {
            maps.clear();
        }
        maps.insert(key, map.opaque);
        Ok(map.opaque)
    }

    /// c[m x n] = a[m x k] * w[n x k]^T (+ bias) on the family, or with `act` (c 0) the SwiGLU of w's interleaved
    /// 8-row gate and up tiles as bf16 [m x n / 2], which only the wide kernels write (`fuses_swiglu`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn family_gemm(
        &self,
        a: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        c: DevPtr,
        act: DevPtr,
        dims: (usize, usize, usize),
        scratch: &GemmScratch,
    ) -> Result<(), GpuError> {
        let (m, n, k) = dims;
        let family = self.f.family.as_ref().expect("the family is loaded");
        let segs = family_segments(n, k);
        if m == 0 {
            return Ok(());
        }
        let int = |v: usize| Arg::Int(v as i32);
        if m <= STREAM_ROWS {
            assert!(act == 0, "gemm: the decode kernel writes no SwiGLU");
            let p = stream_plan(m, n, k, family.sms, segs);
            if segs > 1 {
                assert!(
                    scratch.ws_floats >= segs * m * n,
                    "gemm: a workspace of {} floats for {m} x {n}",
                    scratch.ws_floats
                );
                assert!(p.grid / segs <= GEMM_COUNTERS, "gemm: more tile runs than arrival counters");
            }
            let func = &family.stream[p.per_sm - 1][p.rows / 16 - 1];
            let args = [
                Arg::Map(self.tensor_map(a, m, k, p.rows)?),
                Arg::Map(self.tensor_map(w, n, k, 8 * p.pt)?),
                Arg::Ptr(bias),
                Arg::Ptr(c),
                Arg::Ptr(if segs > 1 { scratch.ws } else { 0 }),
                Arg::Ptr(if segs > 1 { scratch.counters } else { 0 }),
                int(m),
                int(n),
                int(k),
                int(p.slots),
                int(p.kc),
                int(p.pt),
                int(segs),
            ];
            return self.launch(func, (p.grid, 1, 1), STREAM_THREADS, p.smem as u32, &args);
        }
        let split = runs_split(m, n, k);
        let i = tma_choice(m, n, family.sms, segs, split);
        let (_, bm, bn, stages, _, _) = TMA_KERNELS[i];
        let (plain, twin, split_twin) = &family.tma[i];
        let func = match (split, segs > 1) {
            (true, _) => split_twin.as_ref().expect("tma_choice picks a split twin"),
            (false, true) => twin.as_ref().expect("tma_choice picks a segmented twin"),
            (false, false) => plain,
        };
        let (mu, nu) = (m.div_ceil(bm), n.div_ceil(bn));
        if split {
            assert!(act == 0, "gemm: the split kernels write no SwiGLU");
            assert!(
                scratch.ws_floats >= segs * m * n,
                "gemm: a workspace of {} floats for {m} x {n}",
                scratch.ws_floats
            );
            assert!(mu * nu <= GEMM_COUNTERS, "gemm: more tiles than arrival counters");
        }
        let grid = family.sms.min(mu * nu * if split { segs } else { 1 });
        let group = (GROUP_ROWS / bm).clamp(1, mu);
        let args = [
            Arg::Map(self.tensor_map(a, m, k, bm)?),
            Arg::Map(self.tensor_map(w, n, k, bn)?),
            Arg::Ptr(bias),
            Arg::Ptr(c),
            Arg::Ptr(act),
            // The split kernels' workspace planes and arrival counters, one a tile.
            Arg::Ptr(if split { scratch.ws } else { 0 }),
            Arg::Ptr(if split { scratch.counters } else { 0 }),
            int(m),
            int(n),
            int(k),
            int(group),
            int(segs),
        ];
        self.launch(func, (grid, 1, 1), TMA_THREADS, tma_smem(bm, bn, stages) as u32, &args)
    }
}

/// Tensor maps by identity, kept for the launches that follow.
pub(super) type MapCache = HashMap<MapKey, [u64; 16]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_segments_are_the_bench_tables() {
        // Llama-3.1-8B: qkv, o, gate/up, down, lm_head; Orpheus-3B: qkv, o, gate/up, down, lm_head.
        let llama = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)];
        assert_eq!(llama.map(|(n, k)| family_segments(n, k)), [4, 4, 1, 4, 1]);
        let orpheus = [(5120, 3072), (3072, 3072), (16384, 3072), (3072, 8192), (156940, 3072)];
        assert_eq!(orpheus.map(|(n, k)| family_segments(n, k)), [4, 8, 1, 8, 1]);
        // K too short to halve, or not a multiple of 128.
        assert_eq!([family_segments(64, 576), family_segments(64, 704)], [1, 1]);
    }

    #[test]
    fn test_decode_plans_fit_shared_memory_and_the_box_limit() {
        for (n, k) in [(6144, 4096), (4096, 14336), (128256, 4096), (3072, 8192), (96, 576), (8, 64)] {
            let segs = family_segments(n, k);
            for m in [1, 4, 5, 16, 17, 32] {
                let p = stream_plan(m, n, k, 132, segs);
                assert!(p.smem <= STREAM_SMEM[p.per_sm - 1], "{n} x {k} at {m}: {p:?}");
                assert!(p.slots >= 2 && p.pt <= PASS_TILES && p.kc >= 1, "{n} x {k} at {m}: {p:?}");
                assert!(p.rows >= m && p.grid.is_multiple_of(segs) && p.grid / segs <= GEMM_COUNTERS);
            }
        }
    }

    #[test]
    fn test_wide_choices_follow_the_bench() {
        let name = |m, n, segs| TMA_KERNELS[tma_choice(m, n, 132, segs, false)].0;
        assert_eq!(name(64, 4096, 4), "gemm_tma_64x32");
        assert_eq!(name(64, 6144, 4), "gemm_tma_64x64");
        assert_eq!(name(128, 4096, 4), "gemm_tma_64x64");
        assert_eq!(name(256, 4096, 4), "gemm_tma_64x128");
        assert_eq!(name(512, 4096, 4), "gemm_tma_128x128");
        assert_eq!(name(64, 28672, 1), "gemm_tma_64x256");
        assert_eq!(name(8192, 128256, 1), "gemm_tma_128x256");
        // A tiny model's weights still get a kernel.
        assert_eq!(name(40, 96, 1), "gemm_tma_64x32");
    }

    #[test]
    fn test_split_kernels_serve_long_segments_at_33_to_128_rows() {
        // Llama-3.1-8B's down (segments of 3,584) at 33 to 128 rows; its qkv and o and Orpheus' down never.
        assert!([33, 64, 128].iter().all(|&m| runs_split(m, 4096, 14336)));
        assert!(!runs_split(32, 4096, 14336) && !runs_split(129, 4096, 14336));
        assert!(!runs_split(64, 6144, 4096) && !runs_split(64, 4096, 4096) && !runs_split(64, 3072, 8192));
        let name = |m| TMA_KERNELS[tma_choice(m, 4096, 132, 4, true)].0;
        assert_eq!([name(33), name(64), name(128)], ["gemm_tma_64x128", "gemm_tma_64x128", "gemm_tma_128x128"]);
        // The workspace holds a 128-row split launch's planes, and a decode launch's elsewhere.
        assert_eq!(family_workspace(4096, 14336), 4 * SPLIT_ROWS * 4096);
        assert_eq!(family_workspace(6144, 4096), 4 * STREAM_ROWS * 6144);
    }
}
