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
    pub const QKVZ: &str = "linear_attn.in_proj_qkvz.weight";
    pub const BA: &str = "linear_attn.in_proj_ba.weight";
    pub const CONV: &str = "linear_attn.conv1d.weight";
    pub const A_LOG: &str = "linear_attn.A_log";
    pub const DT_BIAS: &str = "linear_attn.dt_bias";
    pub const LINEAR_NORM: &str = "linear_attn.norm.weight";
    pub const LINEAR_OUT: &str = "linear_attn.out_proj.weight";
    pub const SHARED: &str = "mlp.shared_expert.";
    pub const SHARED_GATE: &str = "mlp.shared_expert_gate.weight";
    pub const MTP_LAYERS: &str = "mtp.layers.";
    pub const MTP_FC: &str = "mtp.fc.weight";
    pub const MTP_NORM_EMBED: &str = "mtp.pre_fc_norm_embedding.weight";
    pub const MTP_NORM_HIDDEN: &str = "mtp.pre_fc_norm_hidden.weight";
    pub const MTP_NORM: &str = "mtp.norm.weight";
}

/// Where a layer's experts live and what their projections are called.
pub(crate) struct ExpertLayout {
    pub router: &'static str,
    /// Expert `e`'s projections follow this and `{e}.`.
    pub experts: &'static str,
    pub gate: &'static str,
    pub up: &'static str,
    pub down: &'static str,
}

/// Qwen-MoE's names, which transformers 5's stacked experts also unstack into.
pub(crate) const QWEN_EXPERTS: ExpertLayout = ExpertLayout {
    router: "mlp.gate.weight",
    experts: "mlp.experts.",
    gate: "gate_proj.weight",
    up: "up_proj.weight",
    down: "down_proj.weight",
};

/// Mixtral's names as its published checkpoints hold them.
pub(crate) const MIXTRAL_EXPERTS: ExpertLayout = ExpertLayout {
    router: "block_sparse_moe.gate.weight",
    experts: "block_sparse_moe.experts.",
    gate: "w1.weight",
    up: "w3.weight",
    down: "w2.weight",
};

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
    /// The dense MLP; where `experts` is present, these name nothing and are not read.
    pub gate: MatrixSpec,
    pub up: MatrixSpec,
    pub down: MatrixSpec,
    /// The mixture of experts that replaces the dense MLP in this layer, where it does.
    pub experts: Option<ExpertTensors>,
    /// Linear attention in place of attention, where the layer has it; the attention specs then name nothing.
    pub linear: Option<LinearTensors>,
}

/// Where a layer's tensors are named and what it holds.
#[derive(Clone, Copy)]
pub(crate) struct LayerKind {
    pub prefix: &'static str,
    pub linear: bool,
    pub moe: bool,
}

/// How a checkpoint stores a Gated DeltaNet layer's input projection.
pub(crate) enum QkvzSpec {
    /// q, k, v and the output gate z of every key head's group, end to end per group (Hugging Face, older GGUF).
    Interleaved(MatrixSpec),
    /// Every q, every k and every v in one matrix, every z in another (llama.cpp's `attn_qkv` and `attn_gate`).
    Grouped { qkv: MatrixSpec, z: MatrixSpec },
}

/// A Gated DeltaNet layer's tensors (Qwen3-Next's layout).
pub(crate) struct LinearTensors {
    pub qkvz: QkvzSpec,
    /// Beta, then the decay's input, of every key head's group.
    pub ba: MatrixSpec,
    /// The depthwise convolution: channels x taps.
    pub conv: MatrixSpec,
    /// -exp(A_log) per value head: the decay's rate.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated norm's weight, shared by the value heads.
    pub norm: Vec<f32>,
    pub out: MatrixSpec,
}

/// A layer's mixture of experts: the router (experts x hidden) and each expert's gated MLP, named and shaped.
pub(crate) struct ExpertTensors {
    pub router: MatrixSpec,
    pub experts: Vec<ExpertMlp>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    /// The shared expert and its gate (1 x hidden), where the layer has one.
    pub shared: Option<(ExpertMlp, MatrixSpec)>,
}

pub(crate) struct ExpertMlp {
    pub gate: MatrixSpec,
    pub up: MatrixSpec,
    pub down: MatrixSpec,
}

impl Loader<'_> {
    /// Layer `i`: its vectors read and checked, its matrices named with the config's shapes.
    pub(crate) fn layer_tensors(&self, i: usize, c: &ModelConfig) -> Result<LayerTensors, LoadError> {
        let kind = LayerKind { prefix: names::LAYERS, linear: c.is_linear(i), moe: c.is_moe_layer(i) };
        self.layer_tensors_at(kind, i, c)
    }

    /// Layer `i` under `kind.prefix`, of that kind: the main layers, or a draft head's (`mtp.layers.`).
    pub(crate) fn layer_tensors_at(
        &self,
        kind: LayerKind,
        i: usize,
        c: &ModelConfig,
    ) -> Result<LayerTensors, LoadError> {
        let name = |tail: &str| format!("{}{i}.{tail}", kind.prefix);
        let spec = |tail: &str, rows, cols| MatrixSpec { name: name(tail), rows, cols };
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let linear = kind.linear;
        let qkv_bias = match c.attn_bias && !linear {
            true => {
                let mut b = self.vector(&name(names::Q_BIAS), q_dim)?;
                b.extend(self.vector(&name(names::K_BIAS), kv_dim)?);
                b.extend(self.vector(&name(names::V_BIAS), kv_dim)?);
                Some(b)
            }
            false => None,
        };
        let qk_norm = match c.qk_norm && !linear {
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
            // A hybrid's attention gates its output by a sigmoid that its query projection also gives.
            q: spec(names::Q, if c.hybrid.is_some() { 2 * q_dim } else { q_dim }, h),
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
            experts: self.expert_tensors(kind, i, c),
            linear: match linear {
                true => Some(self.linear_tensors(i, c)?),
                false => None,
            },
        })
    }

    /// Layer `i`'s Gated DeltaNet, its vectors read.
    fn linear_tensors(&self, i: usize, c: &ModelConfig) -> Result<LinearTensors, LoadError> {
        let hc = c.hybrid.as_ref().expect("a linear layer is a hybrid's");
        let name = |tail: &str| format!("{}{i}.{tail}", names::LAYERS);
        let spec = |tail: &str, rows, cols| MatrixSpec { name: name(tail), rows, cols };
        let (h, nv) = (c.hidden_size, hc.num_v_heads);
        let value_dim = hc.value_dim();
        // llama.cpp's files split the projection and store -exp(A_log) under their own names.
        let raw = |tail: &str| format!("blk.{i}.{tail}.weight");
        let qkvz = match self.ckpt.contains(&name(names::QKVZ)) {
            true => QkvzSpec::Interleaved(spec(names::QKVZ, hc.conv_dim() + value_dim, h)),
            false => QkvzSpec::Grouped {
                qkv: MatrixSpec { name: raw("attn_qkv"), rows: hc.conv_dim(), cols: h },
                z: MatrixSpec { name: raw("attn_gate"), rows: value_dim, cols: h },
            },
        };
        let neg_a = match self.ckpt.contains(&name(names::A_LOG)) {
            true => self.vector(&name(names::A_LOG), nv)?.iter().map(|a| -a.exp()).collect(),
            false => self.vector(&format!("blk.{i}.ssm_a"), nv)?,
        };
        Ok(LinearTensors {
            qkvz,
            ba: spec(names::BA, 2 * nv, h),
            conv: spec(names::CONV, hc.conv_dim(), hc.conv_kernel),
            neg_a,
            dt_bias: self.vector(&name(names::DT_BIAS), nv)?,
            norm: self.vector(&name(names::LINEAR_NORM), hc.v_head_dim)?,
            out: spec(names::LINEAR_OUT, h, value_dim),
        })
    }

    /// Layer `i`'s experts, in the layout the checkpoint holds, where the config makes it a mixture of experts.
    fn expert_tensors(&self, kind: LayerKind, i: usize, c: &ModelConfig) -> Option<ExpertTensors> {
        let moe = c.moe.as_ref().filter(|_| kind.moe)?;
        let name = |tail: &str| format!("{}{i}.{tail}", kind.prefix);
        let layout = match self.ckpt.contains(&name(MIXTRAL_EXPERTS.router)) {
            true => &MIXTRAL_EXPERTS,
            false => &QWEN_EXPERTS,
        };
        let (h, f) = (c.hidden_size, moe.expert_intermediate_size);
        let router = MatrixSpec { name: name(layout.router), rows: moe.num_experts, cols: h };
        let expert = |e: usize| {
            let spec = |tail: &str, rows, cols| MatrixSpec {
                name: name(&format!("{}{e}.{tail}", layout.experts)),
                rows,
                cols,
            };
            ExpertMlp { gate: spec(layout.gate, f, h), up: spec(layout.up, f, h), down: spec(layout.down, h, f) }
        };
        let experts = (0..moe.num_experts).map(expert).collect();
        let shared = moe.shared_expert_size.map(|s| {
            let spec =
                |tail: &str, rows, cols| MatrixSpec { name: name(&format!("{}{tail}", names::SHARED)), rows, cols };
            let mlp = ExpertMlp {
                gate: spec(QWEN_EXPERTS.gate, s, h),
                up: spec(QWEN_EXPERTS.up, s, h),
                down: spec(QWEN_EXPERTS.down, h, s),
            };
            (mlp, MatrixSpec { name: name(names::SHARED_GATE), rows: 1, cols: h })
        });
        let (top_k, norm_topk_prob) = (moe.num_experts_per_tok, moe.norm_topk_prob);
        Some(ExpertTensors { router, experts, top_k, norm_topk_prob, shared })
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
