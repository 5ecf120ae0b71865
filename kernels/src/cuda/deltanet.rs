//! Host side of deltanet.cu: Gated DeltaNet's rows, recurrence and gated norm over the pool's state plane.

use cudarc::driver::CudaFunction;

use super::build::Kernels;
use super::{Arg, DevPtr, Gpu, GpuError};

/// Key head sizes the recurrence kernel is built for.
pub const DELTANET_KEY_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Largest value head the recurrence kernel takes (a thread per column of the state).
pub const DELTANET_MAX_VALUE_DIM: usize = 256;

pub(super) struct DeltaNetKernels {
    rows: CudaFunction,
    /// `deltanet_heads_k{DK}` for each of `DELTANET_KEY_DIMS`.
    heads: [CudaFunction; 4],
    gated_norm: CudaFunction,
    output_gate: CudaFunction,
    hidden_store: CudaFunction,
    join: CudaFunction,
}

impl DeltaNetKernels {
    pub(super) fn load(kernels: &Kernels) -> Result<DeltaNetKernels, GpuError> {
        let load = |name: &str| kernels.function(name);
        Ok(DeltaNetKernels {
            rows: load("deltanet_rows")?,
            heads: [
                load("deltanet_heads_k16")?,
                load("deltanet_heads_k32")?,
                load("deltanet_heads_k64")?,
                load("deltanet_heads_k128")?,
            ],
            gated_norm: load("deltanet_gated_norm")?,
            output_gate: load("attention_output_gate")?,
            hidden_store: load("mtp_hidden_store")?,
            join: load("mtp_join")?,
        })
    }
}

/// One linear layer's place in the pool's state plane and its sizes.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetLayer {
    /// f32 state plane of every page: `state_elems` floats a page.
    pub states: DevPtr,
    pub state_elems: usize,
    /// This layer's first float within a page's state.
    pub base: usize,
    pub page_tokens: usize,
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
}

impl DeltaNetLayer {
    fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim
    }
}

/// Why the kernels cannot take this layer's sizes, if they cannot.
pub fn deltanet_unfit(l: &DeltaNetLayer) -> Option<String> {
    if !DELTANET_KEY_DIMS.contains(&l.k_head_dim) || l.v_head_dim > DELTANET_MAX_VALUE_DIM {
        return Some(format!(
            "linear attention heads of {} x {}: the CUDA kernels take key heads of {DELTANET_KEY_DIMS:?} and value \
             heads of at most {DELTANET_MAX_VALUE_DIM}",
            l.k_head_dim, l.v_head_dim
        ));
    }
    if l.num_k_heads == 0 || !l.num_v_heads.is_multiple_of(l.num_k_heads) {
        return Some(format!("{} value heads over {} key heads", l.num_v_heads, l.num_k_heads));
    }
    None
}

/// A round's tables on the device (u32): each row's position and page-table offset, the page tables, and per lane
/// its first row, start position, row count and page-table offset.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetRound {
    pub rows: usize,
    pub lanes: usize,
    pub pos: DevPtr,
    pub table_off: DevPtr,
    pub page_table: DevPtr,
    pub lane_table: DevPtr,
}

/// Where a hybrid's pages keep each position's final hidden state for its draft head: f32, `h` floats a position,
/// from float `base` of a page's state.
#[derive(Clone, Copy, Debug)]
pub struct HiddenPlane {
    pub states: DevPtr,
    pub state_elems: usize,
    pub base: usize,
    pub page_tokens: usize,
    pub h: usize,
}

impl HiddenPlane {
    /// The plane as the kernels take it: states, floats a page, base and page size.
    fn args(&self) -> [Arg; 4] {
        let int = |v: usize| Arg::Int(v as i32);
        [Arg::Ptr(self.states), Arg::Ptr(self.state_elems as u64), int(self.base), int(self.page_tokens)]
    }
}

/// u32 tables on the device naming positions of lanes: entry i is position `at[i]` of the lane whose page table
/// starts at `table_off[i]` in `page_table`.
#[derive(Clone, Copy, Debug)]
pub struct PageRows {
    pub at: DevPtr,
    pub table_off: DevPtr,
    pub page_table: DevPtr,
}

impl Gpu {
    /// For `n` entries: x's row `rows[i]` (row i where `rows` is 0), normed with `w` and `eps`, becomes the hidden
    /// state of the position entry i of `to` names.
    pub fn mtp_hidden_store(
        &self,
        plane: &HiddenPlane,
        to: &PageRows,
        (x, rows, n): (DevPtr, DevPtr, usize),
        (w, eps): (DevPtr, f32),
    ) -> Result<(), GpuError> {
        let args = [Arg::Ptr(x), Arg::Ptr(rows), Arg::Ptr(to.at), Arg::Ptr(to.table_off), Arg::Ptr(to.page_table)];
        let norm = [Arg::Ptr(w), Arg::Float(eps), Arg::Int(plane.h as i32)];
        let all = [&args[..], &plane.args(), &norm].concat();
        self.launch(&self.f.deltanet.hidden_store, (n, 1, 1), 256, 0, &all)
    }

    /// A draft head's input rows (bf16, `n` x 2h): row r's embedding in `x` normed with `w_embed`, then the hidden
    /// state of the position row r of `from` names normed with `w_hidden`.
    pub fn mtp_join(
        &self,
        plane: &HiddenPlane,
        from: &PageRows,
        (x, n): (DevPtr, usize),
        (w_embed, w_hidden, eps): (DevPtr, DevPtr, f32),
        out: DevPtr,
    ) -> Result<(), GpuError> {
        let args = [Arg::Ptr(x), Arg::Ptr(from.at), Arg::Ptr(from.table_off), Arg::Ptr(from.page_table)];
        let norm = [Arg::Ptr(w_embed), Arg::Ptr(w_hidden), Arg::Float(eps), Arg::Int(plane.h as i32), Arg::Ptr(out)];
        self.launch(&self.f.deltanet.join, (n, 1, 1), 256, 0, &[&args[..], &plane.args(), &norm].concat())
    }

    /// Writes each row's convolution inputs (`qkv`, f32) and gates (from `ba`, f32) to its page's row slot.
    pub fn deltanet_rows(
        &self,
        l: &DeltaNetLayer,
        r: &DeltaNetRound,
        (qkv, ba): (DevPtr, DevPtr),
        (neg_a, dt_bias): (DevPtr, DevPtr),
    ) -> Result<(), GpuError> {
        let int = |v: usize| Arg::Int(v as i32);
        let args = [Arg::Ptr(qkv), Arg::Ptr(ba), Arg::Ptr(neg_a), Arg::Ptr(dt_bias), Arg::Ptr(r.pos)];
        let tail = [Arg::Ptr(r.table_off), Arg::Ptr(r.page_table), Arg::Ptr(l.states), Arg::Ptr(l.state_elems as u64)];
        let sizes = [int(l.base), int(l.page_tokens), int(l.conv_dim()), int(l.num_v_heads)];
        let ratio = int(l.num_v_heads / l.num_k_heads);
        self.launch(&self.f.deltanet.rows, (r.rows, 1, 1), 128, 0, &[&args[..], &tail, &sizes, &[ratio]].concat())
    }

    /// Each lane's value heads run their recurrences from the state before its step's first page; outputs go to
    /// `core` (rows x value heads x v_head_dim, f32); every page the step ends gets its state.
    pub fn deltanet_heads(
        &self,
        l: &DeltaNetLayer,
        r: &DeltaNetRound,
        conv: DevPtr,
        core: DevPtr,
    ) -> Result<(), GpuError> {
        let at = DELTANET_KEY_DIMS.iter().position(|&d| d == l.k_head_dim).expect("a key head size the kernels take");
        let int = |v: usize| Arg::Int(v as i32);
        let args = [Arg::Ptr(conv), Arg::Ptr(r.lane_table), Arg::Ptr(r.page_table), Arg::Ptr(l.states)];
        let tail = [Arg::Ptr(l.state_elems as u64), int(l.base), int(l.page_tokens), int(l.conv_kernel)];
        let heads = [int(l.num_k_heads), int(l.num_v_heads), int(l.v_head_dim), Arg::Ptr(core)];
        let threads = l.v_head_dim.max(32) as u32;
        self.launch(
            &self.f.deltanet.heads[at],
            (r.lanes, l.num_v_heads, 1),
            threads,
            0,
            &[&args[..], &tail, &heads].concat(),
        )
    }

    /// out (bf16) = each value head's `core` row normed with `w` and `eps`, times silu of its gate `z` (f32).
    #[allow(clippy::too_many_arguments)]
    pub fn deltanet_gated_norm(
        &self,
        core: DevPtr,
        z: DevPtr,
        w: DevPtr,
        out: DevPtr,
        (rows, nv, dv): (usize, usize, usize),
        eps: f32,
    ) -> Result<(), GpuError> {
        let int = |v: usize| Arg::Int(v as i32);
        let args = [Arg::Ptr(core), Arg::Ptr(z), Arg::Ptr(w), Arg::Ptr(out), int(nv), int(dv), Arg::Float(eps)];
        self.launch(&self.f.deltanet.gated_norm, (rows, nv, 1), 32, 0, &args)
    }

    /// attn (rows x width, bf16) *= sigmoid(gate) element by element, `gate` f32: gated attention's output.
    pub fn attention_output_gate(&self, attn: DevPtr, gate: DevPtr, rows: usize, width: usize) -> Result<(), GpuError> {
        let args = [Arg::Ptr(attn), Arg::Ptr(gate), Arg::Int(width as i32)];
        self.launch(&self.f.deltanet.output_gate, (rows, 1, 1), 256, 0, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_sizes_the_recurrence_cannot_take_are_named() {
        let next = DeltaNetLayer {
            states: 0,
            state_elems: 0,
            base: 0,
            page_tokens: 16,
            num_k_heads: 16,
            num_v_heads: 32,
            k_head_dim: 128,
            v_head_dim: 128,
            conv_kernel: 4,
        };
        assert!(deltanet_unfit(&next).is_none());
        assert!(deltanet_unfit(&DeltaNetLayer { k_head_dim: 96, ..next }).unwrap().contains("96"));
        assert!(deltanet_unfit(&DeltaNetLayer { num_v_heads: 24, ..next }).unwrap().contains("24 value heads"));
    }
}
