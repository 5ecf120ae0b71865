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

/// One decoder layer's tensors, each matrix as its loader reads it (`M`), each checked against the config's shape.
pub(crate) struct LayerTensors<M> {
    pub input_norm: Vec<f32>,
    pub q: M,
    pub k: M,
    pub v: M,
    /// The q, k and v biases end to end, where the config has them.
    pub qkv_bias: Option<Vec<f32>>,
    /// The per-head q and k norms, where the config has them.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub o: M,
    /// Present only where the checkpoint holds it.
    pub o_bias: Option<Vec<f32>>,
    pub post_norm: Vec<f32>,
    pub gate: M,
    pub up: M,
    pub down: M,
}

impl Loader<'_> {
    /// Layer `i`'s tensors, each matrix read by `matrix(name, rows, cols)`.
    pub(crate) fn layer_tensors<M>(
        &self,
        i: usize,
        c: &ModelConfig,
        matrix: impl Fn(&str, usize, usize) -> Result<M, LoadError>,
    ) -> Result<LayerTensors<M>, LoadError> {
        let name = |tail: &str| format!("{}{i}.{tail}", names::LAYERS);
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
            q: matrix(&name(names::Q), q_dim, h)?,
            k: matrix(&name(names::K), kv_dim, h)?,
            v: matrix(&name(names::V), kv_dim, h)?,
            qkv_bias,
            qk_norm,
            o: matrix(&name(names::O), h, q_dim)?,
            o_bias,
            post_norm: self.vector(&name(names::POST_NORM), h)?,
            gate: matrix(&name(names::GATE), f, h)?,
            up: matrix(&name(names::UP), f, h)?,
            down: matrix(&name(names::DOWN), h, f)?,
        })
    }

    /// The LM head, read by `matrix`; None where it is the embedding, tied and not stored.
    pub(crate) fn lm_head<M>(
        &self,
        c: &ModelConfig,
        matrix: impl Fn(&str, usize, usize) -> Result<M, LoadError>,
    ) -> Result<Option<M>, LoadError> {
        match c.tie_embeddings && !self.ckpt.contains(names::LM_HEAD) {
            true => Ok(None),
            false => Ok(Some(matrix(names::LM_HEAD, c.vocab_size, c.hidden_size)?)),
        }
    }

    /// GGUF's RoPE frequency factors, where the checkpoint has them.
    pub(crate) fn rope_factors(&self, c: &ModelConfig) -> Result<Option<Vec<f32>>, LoadError> {
        match self.ckpt.contains(names::ROPE_FREQS) {
            true => Ok(Some(self.vector(names::ROPE_FREQS, c.head_dim / 2)?)),
            false => Ok(None),
        }
    }
}
