//! One decoder layer's weights on the GPU: attention (gated in a hybrid) or Gated DeltaNet, then the dense MLP or
//! the experts with their shared expert.

use tensorfold_kernels::cuda::{DevPtr, MoeWeights};

use super::experts;
use super::pack::{read, Rows};
use super::upload::Uploader;
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::load::grouped_rows;
use crate::llama::walk::{ExpertMlp, LayerTensors, LinearTensors, MatrixSpec, QkvzSpec};
use crate::llama::Loader;

pub(super) struct GpuLayer {
    pub input_norm: DevPtr,
    pub qkv: DevPtr,
    pub qkv_bias: DevPtr,
    pub q_norm: DevPtr,
    pub k_norm: DevPtr,
    /// Gated attention's gate rows (q_dim x hidden), moved out of the query projection; 0 for plain attention.
    pub gate: DevPtr,
    pub o: DevPtr,
    pub o_bias: DevPtr,
    pub post_norm: DevPtr,
    pub gate_up: DevPtr,
    pub down: DevPtr,
    /// Gated DeltaNet in place of attention (the attention weights are then 0).
    pub linear: Option<LinearWeights>,
    /// The layer's experts, where its MLP is a mixture of them (gate_up and down are then 0).
    pub moe: Option<MoeWeights>,
    /// The shared expert every row also runs, beside the experts.
    pub shared: Option<SharedWeights>,
}

impl GpuLayer {
    /// Whether one GEMM alone reads the input norm (plain attention's qkv), so it may fold into it; gated
    /// attention's two GEMMs and a linear layer's three read it from `normed`.
    pub fn input_folds(&self) -> bool {
        self.gate == 0 && self.linear.is_none()
    }
}

/// A Gated DeltaNet layer: its projections packed for the GEMM, the rest f32 as the kernels read them.
pub(super) struct LinearWeights {
    /// Convolution inputs: every q, every k, every v (conv_dim x hidden).
    pub qkv: DevPtr,
    /// The output gate z (value_dim x hidden).
    pub z: DevPtr,
    /// Betas and decay inputs of every key head's group (2 value heads x hidden).
    pub ba: DevPtr,
    /// The depthwise convolution, channels x taps.
    pub conv: DevPtr,
    pub neg_a: DevPtr,
    pub dt_bias: DevPtr,
    pub norm: DevPtr,
    pub out: DevPtr,
}

/// A shared expert: its gated MLP (gate and up in `gate_up_order`), and its gate's row in f32.
pub(super) struct SharedWeights {
    pub gate_up: DevPtr,
    pub down: DevPtr,
    pub gate: DevPtr,
    pub f: usize,
}

/// Uploads the layer whose tensors `t` names: one of the main layers, or a draft head's.
pub(super) fn upload(
    up: &mut Uploader,
    ckpt: &dyn Checkpoint,
    ld: &Loader,
    mut t: LayerTensors,
    c: &ModelConfig,
) -> Result<GpuLayer, LoadError> {
    let spec = |m: &MatrixSpec| read(ckpt, ld, &m.name, m.rows, m.cols);
    // A hybrid's norms scale by one plus their weight; the gated norm of its linear layers does not.
    let mut layer = GpuLayer {
        input_norm: up.vector(&c.centre_norm(std::mem::take(&mut t.input_norm)))?,
        qkv: 0,
        qkv_bias: 0,
        q_norm: 0,
        k_norm: 0,
        gate: 0,
        o: 0,
        o_bias: 0,
        post_norm: up.vector(&c.centre_norm(std::mem::take(&mut t.post_norm)))?,
        gate_up: 0,
        down: 0,
        linear: None,
        moe: None,
        shared: None,
    };
    match t.linear.take() {
        Some(l) => layer.linear = Some(linear(up, ckpt, ld, l, c)?),
        None => {
            (layer.qkv, layer.gate) = attention(up, [spec(&t.q)?, spec(&t.k)?, spec(&t.v)?], c)?;
            layer.qkv_bias = some_vector(up, t.qkv_bias)?;
            if let Some((q, k)) = t.qk_norm {
                (layer.q_norm, layer.k_norm) = (up.vector(&c.centre_norm(q))?, up.vector(&c.centre_norm(k))?);
            }
            layer.o = up.matrices(&[spec(&t.o)?])?;
            layer.o_bias = some_vector(up, t.o_bias)?;
        }
    }
    match &t.experts {
        Some(e) => {
            layer.moe = Some(experts::upload(up, ckpt, ld, e)?);
            if let Some((mlp, gate)) = &e.shared {
                layer.shared = Some(shared(up, ckpt, ld, mlp, gate)?);
            }
        }
        None => {
            layer.gate_up = up.gate_up(spec(&t.gate)?, spec(&t.up)?)?;
            layer.down = up.matrices(&[spec(&t.down)?])?;
        }
    }
    Ok(layer)
}

/// q, k and v stacked; in a hybrid, whose query projection gives each head's query rows then its gate rows, the
/// gate rows go to a matrix of their own.
fn attention(up: &mut Uploader, parts: [Rows; 3], c: &ModelConfig) -> Result<(DevPtr, DevPtr), LoadError> {
    if c.hybrid.is_none() {
        return Ok((up.matrices(&parts)?, 0));
    }
    let (d, q_dim, kv_dim) = (c.head_dim, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let qkv = up.packed(&parts, q_dim + 2 * kv_dim, |r| match r {
        r if r < q_dim => (0, r / d * 2 * d + r % d),
        r if r < q_dim + kv_dim => (1, r - q_dim),
        r => (2, r - q_dim - kv_dim),
    })?;
    let gate = up.packed(&parts[..1], q_dim, |r| (0, r / d * 2 * d + d + r % d))?;
    Ok((qkv, gate))
}

fn linear(
    up: &mut Uploader,
    ckpt: &dyn Checkpoint,
    ld: &Loader,
    t: LinearTensors,
    c: &ModelConfig,
) -> Result<LinearWeights, LoadError> {
    let spec = |m: &MatrixSpec| read(ckpt, ld, &m.name, m.rows, m.cols);
    let (qkv, z) = match &t.qkvz {
        QkvzSpec::Grouped { qkv, z } => (up.matrices(&[spec(qkv)?])?, up.matrices(&[spec(z)?])?),
        QkvzSpec::Interleaved(m) => {
            let (qkv_rows, z_rows) = grouped_rows(c.hybrid.as_ref().expect("a linear layer is a hybrid's"));
            let w = [spec(m)?];
            let qkv = up.packed(&w, qkv_rows.len(), |r| (0, qkv_rows[r]))?;
            (qkv, up.packed(&w, z_rows.len(), |r| (0, z_rows[r]))?)
        }
    };
    let conv = ld.matrix(&t.conv.name, t.conv.rows, t.conv.cols)?.to_f32();
    Ok(LinearWeights {
        qkv,
        z,
        ba: up.matrices(&[spec(&t.ba)?])?,
        conv: up.vector(&conv)?,
        neg_a: up.vector(&t.neg_a)?,
        dt_bias: up.vector(&t.dt_bias)?,
        norm: up.vector(&t.norm)?,
        out: up.matrices(&[spec(&t.out)?])?,
    })
}

fn shared(
    up: &mut Uploader,
    ckpt: &dyn Checkpoint,
    ld: &Loader,
    mlp: &ExpertMlp,
    gate: &MatrixSpec,
) -> Result<SharedWeights, LoadError> {
    let spec = |m: &MatrixSpec| read(ckpt, ld, &m.name, m.rows, m.cols);
    let gate_row = ld.matrix(&gate.name, gate.rows, gate.cols)?.to_f32();
    Ok(SharedWeights {
        gate_up: up.gate_up(spec(&mlp.gate)?, spec(&mlp.up)?)?,
        down: up.matrices(&[spec(&mlp.down)?])?,
        gate: up.vector(&gate_row)?,
        f: mlp.gate.rows,
    })
}

/// An optional vector on the GPU, or address 0 where there is none.
fn some_vector(up: &mut Uploader, v: Option<Vec<f32>>) -> Result<DevPtr, LoadError> {
    v.map_or(Ok(0), |v| up.vector(&v))
}
