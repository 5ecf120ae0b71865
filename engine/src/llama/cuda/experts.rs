//! A mixture of experts on the GPU: each layer's router and experts uploaded for the grouped kernels (moe.cu), and
//! the round's routing buffers.

use tensorfold_kernels::cuda::{moe_gate_up_order, moe_unfit, DevPtr, MoeScratch, MoeShape, MoeWeights};

use super::gpu_err;
use super::pack::{read, Rows};
use super::upload::Uploader;
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::walk::ExpertTensors;
use crate::llama::Loader;
use crate::memory::MemoryKind;

/// The shape every expert layer of `c` has, where it has any.
pub(super) fn moe_shape(c: &ModelConfig) -> Option<MoeShape> {
    let m = c.moe.as_ref()?;
    Some(MoeShape {
        experts: m.num_experts,
        top_k: m.num_experts_per_tok,
        f: m.expert_intermediate_size,
        h: c.hidden_size,
    })
}

/// Why the CUDA engine cannot run `c`'s experts, if it cannot.
pub(super) fn unfit(c: &ModelConfig) -> Option<String> {
    moe_shape(c).and_then(|s| moe_unfit(&s)).or_else(|| super::hybrid::unfit(c))
}

/// Uploads one layer's router (f32) and routed experts (bf16, gate and up interleaved as the grouped kernel reads
/// them); `layer.rs` uploads a shared expert.
pub(super) fn upload(
    up: &mut Uploader,
    ckpt: &dyn Checkpoint,
    ld: &Loader,
    t: &ExpertTensors,
) -> Result<MoeWeights, LoadError> {
    let r = &t.router;
    let router = up.vector(&ld.matrix(&r.name, r.rows, r.cols)?.to_f32())?;
    let (ne, f) = (t.experts.len(), t.experts.first().map_or(0, |e| e.gate.rows));
    let mut gate_up: Vec<Rows> = Vec::with_capacity(2 * ne);
    let mut down: Vec<Rows> = Vec::with_capacity(ne);
    for e in &t.experts {
        for m in [&e.gate, &e.up] {
            gate_up.push(read(ckpt, ld, &m.name, m.rows, m.cols)?);
        }
        down.push(read(ckpt, ld, &e.down.name, e.down.rows, e.down.cols)?);
    }
    let per = 2 * f;
    let gate_up = up.natural_rows(&gate_up, ne * per, |row| {
        let (part, r) = moe_gate_up_order(row % per);
        (2 * (row / per) + part, r)
    })?;
    let h = t.router.cols;
    let down = up.natural_rows(&down, ne * h, |row| (row / h, row % h))?;
    Ok(MoeWeights { router, gate_up, down, experts: ne, top_k: t.top_k, renormalize: t.norm_topk_prob, f })
}

/// The routing buffers for rounds of `rows` rows, the counts zeroed; their bytes.
pub(super) fn scratch(
    up: &mut Uploader,
    gpu: &tensorfold_kernels::cuda::Gpu,
    rows: usize,
    shape: &MoeShape,
) -> Result<(MoeScratch, usize), LoadError> {
    let sizes = MoeScratch::sizes(rows, shape, gpu.moe_takes_tma(shape));
    let mut p: [DevPtr; 12] = [0; 12];
    for (ptr, &bytes) in p.iter_mut().zip(&sizes).filter(|(_, &bytes)| bytes > 0) {
        *ptr = up.buffer(MemoryKind::Activations, bytes)?;
    }
    let [logits, experts, weights, local, pair_slot, counts, offsets, tile_start, slot_row, act, sorted, out] = p;
    gpu.upload(counts, &vec![0u32; shape.experts + 1]).map_err(gpu_err)?;
    let s = MoeScratch {
        logits,
        experts,
        weights,
        local,
        pair_slot,
        counts,
        offsets,
        tile_start,
        slot_row,
        act,
        sorted,
        out,
    };
    Ok((s, sizes.iter().sum()))
}
