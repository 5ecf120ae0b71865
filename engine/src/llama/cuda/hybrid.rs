//! Qwen3-Next on the GPU: what its layers' sizes must be, the round buffers of its Gated DeltaNet layers, gated
//! attention and shared experts, and each linear layer's place in the pool's state plane.

use tensorfold_kernels::cuda::{deltanet_unfit, DeltaNetLayer, DevPtr};

use super::upload::Uploader;
use crate::error::LoadError;
use crate::llama::config::{HybridConfig, ModelConfig};
use crate::memory::MemoryKind;

/// Round buffers a hybrid's layers use beside the dense ones (0 where the model has no such part).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HybridScratch {
    /// f32 rows: convolution inputs (conv_dim), output gates z (value_dim), betas and decay inputs (2 value heads).
    pub conv_in: DevPtr,
    pub z: DevPtr,
    pub ba: DevPtr,
    /// The recurrence's outputs (value_dim, f32), then the gated norm's (bf16) for the output projection.
    pub core: DevPtr,
    pub out: DevPtr,
    /// Gated attention's gates (q_dim, f32).
    pub attn_gate: DevPtr,
    /// The shared expert: gate and up (f32), SwiGLU (bf16), its output (hidden, f32) and its gate logit.
    pub shared_gate_up: DevPtr,
    pub shared_act: DevPtr,
    pub shared_y: DevPtr,
    pub shared_gate: DevPtr,
}

/// The shared expert's width, where the model has one.
fn shared_size(c: &ModelConfig) -> Option<usize> {
    c.moe.as_ref().and_then(|m| m.shared_expert_size)
}

/// A linear layer's sizes and place, without the pool's address and stride (`at` fills them).
pub(super) fn delta_layer(h: &HybridConfig, li: usize, page_tokens: usize) -> DeltaNetLayer {
    DeltaNetLayer {
        states: 0,
        state_elems: 0,
        base: h.index_of_kind(li) * h.page_state_per_layer(page_tokens),
        page_tokens,
        num_k_heads: h.num_k_heads,
        num_v_heads: h.num_v_heads,
        k_head_dim: h.k_head_dim,
        v_head_dim: h.v_head_dim,
        conv_kernel: h.conv_kernel,
    }
}

/// Why the CUDA kernels cannot run `c`'s hybrid parts, if they cannot.
pub(super) fn unfit(c: &ModelConfig) -> Option<String> {
    if let Some(f) = shared_size(c).filter(|f| !f.is_multiple_of(32)) {
        return Some(format!("a shared expert of width {f}: the CUDA kernels need a multiple of 32"));
    }
    let h = c.hybrid.as_ref()?;
    if c.attn_bias {
        return Some("gated attention with q/k/v biases: the CUDA engine splits no biased query projection".into());
    }
    if let Some(why) = h.linear.iter().position(|&l| l).and_then(|li| deltanet_unfit(&delta_layer(h, li, 16))) {
        return Some(why);
    }
    let value_dim = h.value_dim();
    if !value_dim.is_multiple_of(32) {
        return Some(format!("linear attention values {value_dim} wide: the CUDA kernels need a multiple of 32"));
    }
    None
}

/// The GEMM shapes (n, k) a hybrid's layers add to the dense ones.
pub(super) fn gemm_shapes(c: &ModelConfig) -> Vec<(usize, usize)> {
    let hs = c.hidden_size;
    let mut shapes = Vec::new();
    if let Some(h) = &c.hybrid {
        let value_dim = h.value_dim();
        shapes.extend([(h.conv_dim(), hs), (value_dim, hs), (2 * h.num_v_heads, hs), (hs, value_dim)]);
        shapes.push((c.num_heads * c.head_dim, hs));
    }
    if let Some(f) = shared_size(c) {
        shapes.extend([(2 * f, hs), (hs, f)]);
    }
    shapes
}

/// The buffers for rounds of `t` rows, and their bytes.
pub(super) fn scratch(up: &mut Uploader, c: &ModelConfig, t: usize) -> Result<(HybridScratch, usize), LoadError> {
    let (hs, q_dim) = (c.hidden_size, c.num_heads * c.head_dim);
    let (conv_dim, value_dim, nv) =
        c.hybrid.as_ref().map_or((0, 0, 0), |h| (h.conv_dim(), h.value_dim(), h.num_v_heads));
    let gated = if c.hybrid.is_some() { q_dim } else { 0 };
    let f = shared_size(c).unwrap_or(0);
    let shared = if f > 0 { hs } else { 0 };
    let floats = [conv_dim, value_dim, 2 * nv, value_dim, value_dim / 2, gated, 2 * f, f / 2, shared, shared.min(1)];
    let mut p = [0; 10];
    let mut bytes = 0;
    for (ptr, &n) in p.iter_mut().zip(&floats) {
        if n > 0 {
            *ptr = up.buffer(MemoryKind::Activations, 4 * t * n)?;
            bytes += 4 * t * n;
        }
    }
    let [conv_in, z, ba, core, out, attn_gate, shared_gate_up, shared_act, shared_y, shared_gate] = p;
    let s = HybridScratch { conv_in, z, ba, core, out, attn_gate, shared_gate_up, shared_act, shared_y, shared_gate };
    Ok((s, bytes))
}
