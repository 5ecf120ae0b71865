//! The one walk over a Llama-family checkpoint that every loader shares: the CPU's and the GPU's read each layer's
//! tensors through it, and the sharded checkpoint of tensor parallelism cuts the same names.

use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::Loader;

/// Names of the checkpoint's tensors: the model's own, and a layer's after `model.layers.{i}.`.
pub(crate) mod names {
    pub const EMBED: &str = "model.embed_tokens.weight";
    pub const NORM: &str = "model.norm.weight";
    pub const LM_HEAD: &str = "lm_head.weight";
    pub const ROPE_FREQS: &str = "rope_freqs.weight";
    pub const LAYERS: &str = "model.layers.";
    pub const INPUT_NORM: &str = "input_layernorm.weight";
    pub const Q: &str = "self_attn.q_proj.weight";
    pub const K: &str = "self_attn.k_proj.weight";
    pub const V: &str = "self_attn.v_proj.weight";
    pub const Q_BIAS: &str = "self_attn.q_proj.bias";
    pub const K_BIAS: &str = "self_attn.k_proj.bias";
    pub const V_BIAS: &str = "self_attn.v_proj.bias";
    pub const Q_NORM: &str = "self_attn.q_norm.weight";
    pub const K_NORM: &str = "self_attn.k_norm.weight";
    pub const O: &str = "self_attn.o_proj.weight";
    pub const O_BIAS: &str = "self_attn.o_proj.bias";
    pub const POST_NORM: &str = "post_attention_layernorm.weight";
    pub const GATE: &str = "mlp.gate_proj.weight";
    pub const UP: &str = "mlp.up_proj.weight";
    pub const DOWN: &str = "mlp.down_proj.weight";
}

/// A matrix of the checkpoint: its name and the shape the config gives it, read when its loader is ready for it.
pub(crate) struct MatrixSpec {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
}

/// One decoder layer: its vectors, read, and its matrices, named and shaped for their loader to read in turn.
pub(crate) struct LayerTensors {
    pub input_norm: Vec<f32>,
    pub q: MatrixSpec,
    pub k: MatrixSpec,
    pub v: MatrixSpec,
    /// The q, k and v biases end to end, where the config has them.
    pub qkv_bias: Option<Vec<f32>>,
    /// The per-head q and k norms, where the config has them.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub o: MatrixSpec,
    /// Present only where the checkpoint holds it.
    pub o_bias: Option<Vec<f32>>,
    pub post_norm: Vec<f32>,
    pub gate: MatrixSpec,
    pub up: MatrixSpec,
    pub down: MatrixSpec,
}

impl Loader<'_> {
    /// Layer `i`: its vectors read and checked, its matrices named with the config's shapes.
    pub(crate) fn layer_tensors(&self, i: usize, c: &ModelConfig) -> Result<LayerTensors, LoadError> {
        let name = |tail: &str| format!("{}{i}.{tail}", names::LAYERS);
        let spec = |tail: &str, rows, cols| MatrixSpec { name: name(tail), rows, cols };
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let qkv_bias = match c.attn_bias {
            true => {
                let mut b = self.vector(&name(names::Q_BIAS), q_dim)?;
                b.extend(self.vector(&name(names::K_BIAS), kv_dim)?);
                b.extend(self.vector(&name(names::V_BIAS), kv_dim)?);
                Some(b)
            }
            false => None,
        };
        let qk_norm = match c.qk_norm {
            true => {
                Some((self.vector(&name(names::Q_NORM), c.head_dim)?, self.vector(&name(names::K_NORM), c.head_dim)?))
            }
            false => None,
        };
        let o_bias = match self.ckpt.contains(&name(names::O_BIAS)) {
            true => Some(self.vector(&name(names::O_BIAS), h)?),
            false => None,
        };
        Ok(LayerTensors {
            input_norm: self.vector(&name(names::INPUT_NORM), h)?,
            q: spec(names::Q, q_dim, h),
            k: spec(names::K, kv_dim, h),
            v: spec(names::V, kv_dim, h),
            qkv_bias,
            qk_norm,
            o: spec(names::O, h, q_dim),
            o_bias,
            post_norm: self.vector(&name(names::POST_NORM), h)?,
            gate: spec(names::GATE, f, h),
            up: spec(names::UP, f, h),
            down: spec(names::DOWN, h, f),
        })
    }

    /// The LM head; None where it is the embedding, tied and not stored.
    pub(crate) fn lm_head(&self, c: &ModelConfig) -> Option<MatrixSpec> {
        let stored = !c.tie_embeddings || self.ckpt.contains(names::LM_HEAD);
        stored.then(|| MatrixSpec { name: names::LM_HEAD.into(), rows: c.vocab_size, cols: c.hidden_size })
    }

    /// GGUF's RoPE frequency factors, where the checkpoint has them.
    pub(crate) fn rope_factors(&self, c: &ModelConfig) -> Result<Option<Vec<f32>>, LoadError> {
        match self.ckpt.contains(names::ROPE_FREQS) {
            true => Ok(Some(self.vector(names::ROPE_FREQS, c.head_dim / 2)?)),
            false => Ok(None),
        }
    }
}
