//! Host side of moe.cu: routing, the round's pairs sorted by expert, the grouped GEMMs and the combine.

use cudarc::driver::CudaFunction;

use super::build::Kernels;
use super::{Arg, DevPtr, Gpu, GpuError};

/// Columns of one grouped GEMM block (MOE_BN in moe.cu).
const MOE_COLS: usize = 128;

/// Most experts a row may choose (MOE_MAX_TOPK in moe.cu).
pub const MOE_MAX_TOPK: usize = 16;

/// Dynamic shared memory of a grouped GEMM block of `rows`-row tiles and `stages` stages: per stage the tile's
/// rows of A and 128 rows of W, 40 halves a row.
const fn gemm_smem(rows: usize, stages: usize) -> u32 {
    (stages * (rows + MOE_COLS) * 40 * 2) as u32
}

/// The two tile shapes (the _m64 and _m16 kernels): rows a tile and stages of the ring.
const WIDE: (usize, usize) = (64, 3);
const NARROW: (usize, usize) = (16, 6);

/// Rounds whose experts serve at most this many rows on average take the 16-row tiles.
const NARROW_ROWS: usize = 32;

pub(super) struct MoeKernels {
    logits: CudaFunction,
    route: CudaFunction,
    plan: CudaFunction,
    /// gate_up and down with 64-row tiles, then with 16-row ones.
    gemm: [(CudaFunction, CudaFunction); 2],
    combine: CudaFunction,
}

impl MoeKernels {
    pub(super) fn load(kernels: &Kernels) -> Result<MoeKernels, GpuError> {
        let load = |name: &str| kernels.function(name);
        let gemm =
            [(load("moe_gate_up_m64")?, load("moe_down_m64")?), (load("moe_gate_up_m16")?, load("moe_down_m16")?)];
        let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        for ((gate_up, down), (rows, stages)) in gemm.iter().zip([WIDE, NARROW]) {
            for f in [gate_up, down] {
                f.set_attribute(attr, gemm_smem(rows, stages) as i32)?;
            }
        }
        let (logits, route, plan, combine) =
            (load("moe_logits")?, load("moe_route")?, load("moe_plan")?, load("moe_combine")?);
        Ok(MoeKernels { logits, route, plan, gemm, combine })
    }
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
    /// Slots x h in f32: the experts' outputs.
    pub out: DevPtr,
}

impl MoeScratch {
    /// Bytes of each buffer, in field order, for rounds of `rows` rows.
    pub fn sizes(rows: usize, w: &MoeShape) -> [usize; 11] {
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
        let narrow = pairs <= NARROW_ROWS * ne;
        let ((gate_up_k, down_k), (bm, stages)) = match narrow {
            true => (&k.gemm[1], NARROW),
            false => (&k.gemm[0], WIDE),
        };
        let smem = gemm_smem(bm, stages);
        let plan =
            [Arg::Ptr(s.experts), Arg::Ptr(s.local), Arg::Ptr(s.counts), int(pairs), int(top_k), int(ne), int(bm)];
        let plan: Vec<Arg> = plan
            .into_iter()
            .chain([Arg::Ptr(s.offsets), Arg::Ptr(s.tile_start), Arg::Ptr(s.slot_row), Arg::Ptr(s.pair_slot)])
            .collect();
        self.launch(&k.plan, (1, 1, 1), 1024, (4 * (ne + 1)) as u32, &plan)?;
        // Every expert's tiles fit in this many: each expert wastes less than one.
        let tiles = pairs.div_ceil(bm) + ne.min(pairs);
        let gate_up = [Arg::Ptr(normed), Arg::Ptr(s.slot_row), Arg::Ptr(w.gate_up), Arg::Ptr(s.offsets)];
        let gate_up: Vec<Arg> =
            gate_up.into_iter().chain([Arg::Ptr(s.tile_start), int(ne), int(2 * f), int(h), Arg::Ptr(s.act)]).collect();
        self.launch(gate_up_k, ((2 * f).div_ceil(MOE_COLS), tiles, 1), 128, smem, &gate_up)?;
        let down = [Arg::Ptr(s.act), Arg::Ptr(w.down), Arg::Ptr(s.offsets), Arg::Ptr(s.tile_start)];
        let down: Vec<Arg> = down.into_iter().chain([int(ne), int(h), int(f), Arg::Ptr(s.out)]).collect();
        self.launch(down_k, (h.div_ceil(MOE_COLS), tiles, 1), 128, smem, &down)?;
        let (shared_out, shared_gate) = shared.unwrap_or((0, 0));
        let combine = [Arg::Ptr(s.out), Arg::Ptr(s.pair_slot), Arg::Ptr(s.weights), int(top_k), int(h)];
        let combine: Vec<Arg> =
            combine.into_iter().chain([Arg::Ptr(delta), Arg::Ptr(shared_out), Arg::Ptr(shared_gate)]).collect();
        self.launch(&k.combine, (rows, 1, 1), 256, 0, &combine)
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
        assert!(gemm_smem(NARROW.0, NARROW.1) <= 227 * 1024 && gemm_smem(WIDE.0, WIDE.1) <= 227 * 1024);
        assert!(moe_unfit(&fit).is_none());
        assert!(moe_unfit(&MoeShape { top_k: 17, ..fit }).unwrap().contains("17 experts"));
        assert!(moe_unfit(&MoeShape { f: 100, ..fit }).unwrap().contains("100"));
    }
}
