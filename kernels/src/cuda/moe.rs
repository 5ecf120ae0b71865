//! Host side of moe.cu: routing, the round's pairs sorted by expert, the grouped GEMMs and the combine.

use cudarc::driver::CudaFunction;

use super::build::Kernels;
use super::{Arg, DevPtr, Gpu, GpuError};

/// Most experts a row may choose (MOE_MAX_TOPK in moe.cu).
pub const MOE_MAX_TOPK: usize = 16;

/// Most experts a layer may have (MOE_MAX_EXPERTS in moe.cu).
pub const MOE_MAX_EXPERTS: usize = 512;

/// A grouped GEMM kernel's tile: rows, columns and k of a stage, and stages of its ring (its name's _m{}n{}k{}s{}).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tile {
    rows: usize,
    cols: usize,
    k: usize,
    stages: usize,
}

impl Tile {
    /// Dynamic shared memory of a block: per stage the tile's rows of A and its columns' rows of W, k + 8 halves a
    /// row.
    const fn smem(&self) -> u32 {
        (self.stages * (self.rows + self.cols) * (self.k + 8) * 2) as u32
    }

    fn suffix(&self) -> String {
        format!("_m{}n{}k{}s{}", self.rows, self.cols, self.k, self.stages)
    }
}

/// The tiles moe.cu instantiates: wide ones for rounds where experts serve many rows, then narrow ones for decode
/// rounds, each first with k 64 and then with k 32 for a K that 64 does not divide.
const TILES: [Tile; 4] = [
    Tile { rows: 64, cols: 128, k: 64, stages: 3 },
    Tile { rows: 64, cols: 128, k: 32, stages: 3 },
    Tile { rows: 16, cols: 128, k: 64, stages: 8 },
    Tile { rows: 16, cols: 128, k: 32, stages: 6 },
];

/// The first narrow tile in TILES.
const NARROW: usize = 2;

/// Rounds whose experts serve at most this many rows on average take a narrow tile.
const NARROW_ROWS: usize = 32;

/// The TMA + wgmma grouped kernels (moe_tma_* in gemm_tma.cu): (name, tile rows, tile columns, stages).
type TmaTile = (&'static str, usize, usize, usize);

const TMA_TILES: [TmaTile; 4] = [
    ("moe_tma_128x256", 128, 256, 4),
    ("moe_tma_64x256", 64, 256, 5),
    ("moe_tma_64x128", 64, 128, 9),
    ("moe_tma_64x64", 64, 64, 14),
];

/// Rounds whose experts serve at least this many rows on average take the TMA kernels' 128-row tiles.
const TMA_TALL_ROWS: usize = 256;

/// The TMA_TILES a round of `pairs` pairs over `ne` experts takes for a GEMM of `n` columns an expert on `sms`
/// SMs: 128-row tiles where experts serve many rows, else the widest 64-row tile whose units still fill the SMs (a
/// decode round's few experts split into narrower column tiles, so that every SM streams weights).
fn tma_tile(pairs: usize, ne: usize, n: usize, sms: usize) -> usize {
    if pairs >= TMA_TALL_ROWS * ne {
        return 0;
    }
    // At most this many row tiles: one an expert chosen, each serving at most 64 rows here on average.
    let tiles = pairs.min(ne).max(pairs.div_ceil(64));
    (1..TMA_TILES.len()).find(|&i| tiles * n.div_ceil(TMA_TILES[i].2) >= sms).unwrap_or(TMA_TILES.len() - 1)
}

pub(super) struct MoeKernels {
    logits: CudaFunction,
    route: CudaFunction,
    plan: CudaFunction,
    /// gate_up and down of each tile of TILES.
    gemm: Vec<(CudaFunction, CudaFunction)>,
    combine: CudaFunction,
    /// On sm_90a with the Hopper family on: the row gather and the TMA_TILES kernels, which every round takes where
    /// 64 divides both K.
    tma: Option<(CudaFunction, [CudaFunction; 4])>,
    /// Whether decode rounds take the narrower TMA column tiles (`KernelOptions::moe_split`).
    split: bool,
}

impl MoeKernels {
    /// The gather and the TMA kernels, where rounds of experts with K of `h` and `f` take them.
    fn tma_for(&self, h: usize, f: usize) -> Option<&(CudaFunction, [CudaFunction; 4])> {
        self.tma.as_ref().filter(|_| h.is_multiple_of(64) && f.is_multiple_of(64))
    }

    pub(super) fn load(kernels: &Kernels, hopper: bool, split: bool) -> Result<MoeKernels, GpuError> {
        let load = |name: &str| kernels.function(name);
        let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let mut gemm = Vec::with_capacity(TILES.len());
        for tile in &TILES {
            let pair = (load(&format!("moe_gate_up{}", tile.suffix()))?, load(&format!("moe_down{}", tile.suffix()))?);
            for f in [&pair.0, &pair.1] {
                f.set_attribute(attr, tile.smem() as i32)?;
            }
            gemm.push(pair);
        }
        let (logits, route, plan, combine) =
            (load("moe_logits")?, load("moe_route")?, load("moe_plan")?, load("moe_combine")?);
        let tma = match hopper {
            false => None,
            true => {
                let [a, b, c, d] = TMA_TILES.map(|(name, ..)| load(name));
                let all = [a?, b?, c?, d?];
                for (f, (_, bm, bn, stages)) in all.iter().zip(TMA_TILES) {
                    f.set_attribute(attr, super::family::tma_smem(bm, bn, stages) as i32)?;
                }
                Some((load("moe_gather")?, all))
            }
        };
        Ok(MoeKernels { logits, route, plan, gemm, combine, tma, split })
    }
}

/// Which of TILES a round of `pairs` (row, expert) pairs over `ne` experts takes, for GEMMs of K `h` and `f`.
fn tile_for(pairs: usize, ne: usize, h: usize, f: usize) -> usize {
    let fits = |i: usize| h.is_multiple_of(TILES[i].k) && f.is_multiple_of(TILES[i].k);
    let range = match pairs > NARROW_ROWS * ne {
        true => 0..NARROW,
        false => NARROW..TILES.len(),
    };
    let last = range.end - 1;
    range.into_iter().find(|&i| fits(i)).unwrap_or(last)
}

/// A layer's experts on the device: `experts` matrices of gate and up (2 f x h, their rows interleaved by 8 as
/// `moe_gate_up_order` says) and of down (h x f), row-major bf16; the router (experts x h) in f32.
#[derive(Clone, Copy, Debug)]
pub struct MoeWeights {
    pub router: DevPtr,
    pub gate_up: DevPtr,
    pub down: DevPtr,
    pub experts: usize,
    pub top_k: usize,
    pub renormalize: bool,
    /// The intermediate size of one expert.
    pub f: usize,
}

/// A round's routing buffers: per row its router logits; per pair (row, rank) its expert, weight, place within its
/// expert's pairs and slot; per expert its count, first slot and first tile; per slot its row.
#[derive(Clone, Copy, Debug, Default)]
pub struct MoeScratch {
    pub logits: DevPtr,
    pub experts: DevPtr,
    pub weights: DevPtr,
    pub local: DevPtr,
    pub pair_slot: DevPtr,
    pub counts: DevPtr,
    pub offsets: DevPtr,
    pub tile_start: DevPtr,
    pub slot_row: DevPtr,
    /// Slots x f in bf16: the experts' SwiGLU.
    pub act: DevPtr,
    /// Slots x h in bf16: the rows in expert order, for the TMA kernels.
    pub sorted: DevPtr,
    /// Slots x h in f32: the experts' outputs.
    pub out: DevPtr,
}

impl MoeScratch {
    /// Bytes of each buffer, in field order, for rounds of `rows` rows; `sorted` only where the TMA kernels run.
    pub fn sizes(rows: usize, w: &MoeShape, tma: bool) -> [usize; 12] {
        let pairs = rows * w.top_k;
        let per_expert = 4 * (w.experts + 1);
        [
            4 * rows * w.experts,
            4 * pairs,
            4 * pairs,
            4 * pairs,
            4 * pairs,
            per_expert,
            per_expert,
            per_expert,
            4 * pairs,
            2 * pairs * w.f,
            if tma { 2 * pairs * w.h } else { 0 },
            4 * pairs * w.h,
        ]
    }
}

/// The sizes a layer's scratch is made for.
#[derive(Clone, Copy, Debug)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
    pub f: usize,
    pub h: usize,
}

/// Row `r` of the stacked gate and up matrix the grouped kernels read: (0 for gate or 1 for up, its row); rows
/// alternate eight of gate and eight of up.
pub fn moe_gate_up_order(r: usize) -> (usize, usize) {
    let (chunk, j) = (r / 16, r % 16);
    match j < 8 {
        true => (0, 8 * chunk + j),
        false => (1, 8 * chunk + j - 8),
    }
}

/// Why the grouped kernels cannot take these sizes, if they cannot.
pub fn moe_unfit(s: &MoeShape) -> Option<String> {
    if s.experts > MOE_MAX_EXPERTS {
        return Some(format!("{} experts: the CUDA kernels take at most {MOE_MAX_EXPERTS}", s.experts));
    }
    if s.top_k == 0 || s.top_k > MOE_MAX_TOPK || s.top_k > s.experts {
        return Some(format!("{} experts a row of {}: the CUDA kernels take 1 to {MOE_MAX_TOPK}", s.top_k, s.experts));
    }
    if !s.f.is_multiple_of(32) || !s.h.is_multiple_of(64) {
        return Some(format!(
            "expert intermediate size {} and hidden size {}: the CUDA kernels need multiples of 32 and 64",
            s.f, s.h
        ));
    }
    None
}

impl Gpu {
    /// Whether rounds of experts of this shape run on the TMA kernels (sm_90a with the Hopper family on).
    pub fn moe_takes_tma(&self, s: &MoeShape) -> bool {
        self.f.moe.tma_for(s.h, s.f).is_some()
    }

    /// out (rows, f32) = each row of `normed` (bf16) dotted with `gate` (h floats), a warp's sum in a fixed lane
    /// order: a shared expert's gate logit. It clears `s`'s first count, which `moe` clears again.
    pub fn moe_shared_gate(
        &self,
        s: &MoeScratch,
        normed: DevPtr,
        gate: DevPtr,
        (rows, h): (usize, usize),
        out: DevPtr,
    ) -> Result<(), GpuError> {
        let args =
            [Arg::Ptr(normed), Arg::Ptr(gate), Arg::Int(h as i32), Arg::Int(1), Arg::Ptr(out), Arg::Ptr(s.counts)];
        self.launch(&self.f.moe.logits, (rows, 1, 1), 256, 0, &args)
    }

    /// delta (rows x h, f32) = each row's chosen experts' gated MLPs of `normed` (rows x h, bf16), weighted and
    /// added in rank order; where `shared` is (its output, its gate logits), + sigmoid(gate) x output.
    pub fn moe(
        &self,
        w: &MoeWeights,
        s: &MoeScratch,
        normed: DevPtr,
        (rows, h): (usize, usize),
        delta: DevPtr,
        shared: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), GpuError> {
        let k = &self.f.moe;
        let (ne, top_k, f) = (w.experts, w.top_k, w.f);
        let pairs = rows * top_k;
        let int = |v: usize| Arg::Int(v as i32);
        let logits = [Arg::Ptr(normed), Arg::Ptr(w.router), int(h), int(ne), Arg::Ptr(s.logits), Arg::Ptr(s.counts)];
        self.launch(&k.logits, (rows, ne.div_ceil(8), 1), 256, 0, &logits)?;
        let route = [Arg::Ptr(s.logits), int(ne), int(top_k), int(w.renormalize as usize), Arg::Ptr(s.experts)];
        let route: Vec<Arg> =
            route.into_iter().chain([Arg::Ptr(s.weights), Arg::Ptr(s.local), Arg::Ptr(s.counts)]).collect();
        self.launch(&k.route, (rows, 1, 1), 32, 0, &route)?;
        // Which tiles the GEMMs take changes no bit: every shape sums an output in the same order.
        let at = tile_for(pairs, ne, h, f);
        let ((gate_up_k, down_k), tile) = (&k.gemm[at], TILES[at]);
        let tma = k.tma_for(h, f).filter(|_| s.sorted != 0).map(|(gather, kernels)| {
            // Without the split, a round's units only need to exist: one SM is enough.
            let sms = if k.split { self.sms } else { 1 };
            let [i, j] = [2 * f, h].map(|n| tma_tile(pairs, ne, n, sms));
            (gather, [(&kernels[i], TMA_TILES[i]), (&kernels[j], TMA_TILES[j])])
        });
        // The plan's row tiles are the GEMMs': the 128-row TMA tile is taken by both GEMMs or by neither.
        let bm = tma.as_ref().map_or(tile.rows, |(_, [(_, (_, rows, ..)), _])| *rows);
        let plan =
            [Arg::Ptr(s.experts), Arg::Ptr(s.local), Arg::Ptr(s.counts), int(pairs), int(top_k), int(ne), int(bm)];
        let plan: Vec<Arg> = plan
            .into_iter()
            .chain([Arg::Ptr(s.offsets), Arg::Ptr(s.tile_start), Arg::Ptr(s.slot_row), Arg::Ptr(s.pair_slot)])
            .collect();
        self.launch(&k.plan, (1, 1, 1), 1024, (4 * (ne + 1)) as u32, &plan)?;
        if let Some((gather, kernels)) = tma {
            self.moe_tma(w, s, normed, (pairs, h), gather, kernels)?;
            return self.moe_combine(s, (rows, h), top_k, delta, shared);
        }
        // Every expert's tiles fit in this many: each expert wastes less than one.
        let tiles = pairs.div_ceil(bm) + ne.min(pairs);
        let gate_up = [Arg::Ptr(normed), Arg::Ptr(s.slot_row), Arg::Ptr(w.gate_up), Arg::Ptr(s.offsets)];
        let gate_up: Vec<Arg> =
            gate_up.into_iter().chain([Arg::Ptr(s.tile_start), int(ne), int(2 * f), int(h), Arg::Ptr(s.act)]).collect();
        self.launch(gate_up_k, ((2 * f).div_ceil(tile.cols), tiles, 1), 128, tile.smem(), &gate_up)?;
        let down = [Arg::Ptr(s.act), Arg::Ptr(w.down), Arg::Ptr(s.offsets), Arg::Ptr(s.tile_start)];
        let down: Vec<Arg> = down.into_iter().chain([int(ne), int(h), int(f), Arg::Ptr(s.out)]).collect();
        self.launch(down_k, (h.div_ceil(tile.cols), tiles, 1), 128, tile.smem(), &down)?;
        self.moe_combine(s, (rows, h), top_k, delta, shared)
    }

    /// Each row's experts' outputs weighted and added in rank order, then the shared expert's.
    fn moe_combine(
        &self,
        s: &MoeScratch,
        (rows, h): (usize, usize),
        top_k: usize,
        delta: DevPtr,
        shared: Option<(DevPtr, DevPtr)>,
    ) -> Result<(), GpuError> {
        let (shared_out, shared_gate) = shared.unwrap_or((0, 0));
        let combine = [Arg::Ptr(s.out), Arg::Ptr(s.pair_slot), Arg::Ptr(s.weights), Arg::Int(top_k as i32)];
        let combine: Vec<Arg> = combine
            .into_iter()
            .chain([Arg::Int(h as i32), Arg::Ptr(delta), Arg::Ptr(shared_out), Arg::Ptr(shared_gate)])
            .collect();
        self.launch(&self.f.moe.combine, (rows, h.div_ceil(256), 1), 256, 0, &combine)
    }

    /// The grouped GEMMs of a round on the TMA + wgmma family: the rows gathered in expert order, then gate and
    /// up with the SwiGLU, then down, each kernel's persistent CTAs walking the round's (tile, column tile) units.
    fn moe_tma(
        &self,
        w: &MoeWeights,
        s: &MoeScratch,
        normed: DevPtr,
        (pairs, h): (usize, usize),
        gather: &CudaFunction,
        kernels: [(&CudaFunction, TmaTile); 2],
    ) -> Result<(), GpuError> {
        let (ne, f) = (w.experts, w.f);
        let int = |v: usize| Arg::Int(v as i32);
        let args = [Arg::Ptr(normed), Arg::Ptr(s.slot_row), int(h), Arg::Ptr(s.sorted)];
        self.launch(gather, (pairs, 1, 1), 256, 0, &args)?;
        // (A, its columns, W, its rows, C or 0, act or 0, N): gate and up, then down.
        let gemms = [(s.sorted, h, w.gate_up, ne * 2 * f, 0, s.act, 2 * f), (s.act, f, w.down, ne * h, s.out, 0, h)];
        for ((a, k, wt, w_rows, c, act, n), (kernel, (_, bm, bn, stages))) in gemms.into_iter().zip(kernels) {
            let smem = super::family::tma_smem(bm, bn, stages) as u32;
            let args = [
                Arg::Map(self.tensor_map(a, pairs, k, bm)?),
                Arg::Map(self.tensor_map(wt, w_rows, k, bn)?),
                Arg::Ptr(0),
                Arg::Ptr(c),
                Arg::Ptr(act),
                Arg::Ptr(0),
                Arg::Ptr(0),
                int(pairs),
                int(n),
                int(k),
                int(super::family::GROUP_ROWS / bm),
                int(1),
                Arg::Ptr(s.offsets),
                Arg::Ptr(s.tile_start),
                int(ne),
            ];
            self.launch(kernel, (self.sms, 1, 1), super::family::TMA_THREADS, smem, &args)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_gate_up_order_puts_gate_and_up_of_the_same_columns_in_one_warp_tile() {
        let f = 96;
        let rows: Vec<(usize, usize)> = (0..2 * f).map(moe_gate_up_order).collect();
        for (r, &(part, row)) in rows.iter().enumerate() {
            // Column tiles 2u and 2u + 1 are gate and up of intermediate columns 8u ..+ 8.
            let (u, tile) = (r / 16, r / 8);
            assert_eq!(part, tile % 2, "row {r}");
            assert_eq!(row, 8 * u + r % 8, "row {r}");
        }
        let mut seen: Vec<(usize, usize)> = rows.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 2 * f, "every gate and up row appears once");
    }

    #[test]
    fn test_sizes_the_kernels_cannot_take_are_named() {
        let fit = MoeShape { experts: 128, top_k: 8, f: 768, h: 2048 };
        assert!(TILES.iter().all(|t| t.smem() <= 227 * 1024));
        assert!(moe_unfit(&fit).is_none());
        assert!(moe_unfit(&MoeShape { top_k: 17, ..fit }).unwrap().contains("17 experts"));
        assert!(moe_unfit(&MoeShape { f: 100, ..fit }).unwrap().contains("100"));
        assert!(moe_unfit(&MoeShape { experts: 513, ..fit }).unwrap().contains("513 experts"));
    }

    #[test]
    fn test_decode_rounds_split_the_tma_columns_until_every_sm_streams() {
        // Qwen3-30B-A3B's experts (128 of gate and up 1,536 wide and down 2,048) on 132 SMs.
        let names = |pairs: usize| [1536, 2048].map(|n| TMA_TILES[tma_tile(pairs, 128, n, 132)].0);
        assert_eq!(names(8), ["moe_tma_64x64", "moe_tma_64x64"]);
        assert_eq!(names(16), ["moe_tma_64x128", "moe_tma_64x128"]);
        assert_eq!(names(32), ["moe_tma_64x256", "moe_tma_64x256"]);
        assert_eq!(names(2048 * 8), ["moe_tma_64x256", "moe_tma_64x256"]);
        assert_eq!(names(256 * 128), ["moe_tma_128x256", "moe_tma_128x256"]);
        assert!(TMA_TILES.iter().all(|&(_, bm, bn, stages)| super::super::family::tma_smem(bm, bn, stages) <= 232448));
    }

    #[test]
    fn test_rounds_take_the_wide_tile_with_many_rows_an_expert_and_a_k_that_divides() {
        let (wide, narrow) = (TILES[tile_for(2048 * 8, 128, 2048, 768)], TILES[tile_for(8, 128, 2048, 768)]);
        assert_eq!((wide.rows, wide.k, narrow.rows, narrow.k), (64, 64, 16, 64));
        // An intermediate size of 96 is no multiple of 64: k32 tiles.
        let (wide, narrow) = (TILES[tile_for(2048 * 8, 128, 2048, 96)], TILES[tile_for(8, 128, 2048, 96)]);
        assert_eq!((wide.rows, wide.k, narrow.rows, narrow.k), (64, 32, 16, 32));
    }
}
