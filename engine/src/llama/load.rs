//! Reading a Llama-family model's tensors: by Hugging Face name, shapes checked against the config, each layer's
//! parts put together for the CPU model.

use tensorfold_kernels::matmul::Activations;
use tensorfold_kernels::weight::concat_rows;
use tensorfold_kernels::Weight;

use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::{HybridConfig, ModelConfig};
use crate::llama::cpu::{Attention, Layer, LayerMlp, Mixer, Mlp, QkNorm};
use crate::llama::deltanet::DeltaNet;
use crate::llama::moe::{Expert, MoeMlp, SharedExpert};
use crate::llama::mtp::MtpHead;
use crate::llama::walk::{names, ExpertTensors, LayerKind, LinearTensors, MatrixSpec, QkvzSpec};

/// Loads tensors by Hugging Face name and checks their shapes against the config.
pub(crate) struct Loader<'a> {
    pub(crate) ckpt: &'a dyn Checkpoint,
}

impl Loader<'_> {
    pub(crate) fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Weight, LoadError> {
        let w = self.ckpt.weight(name)?;
        if (w.rows(), w.cols()) != (rows, cols) {
            let fault = format!("shape {}x{} disagrees with the config's {rows}x{cols}", w.rows(), w.cols());
            return Err(LoadError::Tensor { path: self.ckpt.path().into(), name: name.into(), fault });
        }
        Ok(w)
    }

    pub(crate) fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
        Ok(self.matrix(name, 1, len)?.to_f32())
    }

    pub(super) fn layer(&self, i: usize, c: &ModelConfig) -> Result<Layer, LoadError> {
        let kind = LayerKind { prefix: names::LAYERS, linear: c.is_linear(i), moe: c.is_moe_layer(i) };
        self.layer_at(kind, i, c)
    }

    /// The draft head's layers and its own tensors, where the checkpoint has them (Qwen3-Next's MTP).
    pub(super) fn mtp(&self, c: &ModelConfig) -> Result<Option<(Layer, MtpHead)>, LoadError> {
        if c.hybrid.as_ref().is_none_or(|h| h.mtp_layers == 0) {
            return Ok(None);
        }
        let h = c.hidden_size;
        let kind = LayerKind { prefix: names::MTP_LAYERS, linear: false, moe: c.moe.is_some() };
        let centred = |name: &str| -> Result<Vec<f32>, LoadError> { Ok(c.centre_norm(self.vector(name, h)?)) };
        let head = MtpHead {
            fc: self.matrix(names::MTP_FC, h, 2 * h)?,
            norm_embed: centred(names::MTP_NORM_EMBED)?,
            norm_hidden: centred(names::MTP_NORM_HIDDEN)?,
            norm: centred(names::MTP_NORM)?,
        };
        Ok(Some((self.layer_at(kind, 0, c)?, head)))
    }

    fn layer_at(&self, kind: LayerKind, i: usize, c: &ModelConfig) -> Result<Layer, LoadError> {
        let mut t = self.layer_tensors_at(kind, i, c)?;
        let read = |m: &MatrixSpec| self.matrix(&m.name, m.rows, m.cols);
        // A hybrid's norms scale by one plus their weight; the gated norm of its linear layers does not.
        t.input_norm = c.centre_norm(std::mem::take(&mut t.input_norm));
        t.post_norm = c.centre_norm(std::mem::take(&mut t.post_norm));
        t.qk_norm = t.qk_norm.map(|(q, k)| (c.centre_norm(q), c.centre_norm(k)));
        let mixer = match t.linear.take() {
            Some(l) => Mixer::Linear(self.delta_net(l, c)?),
            None => {
                let qkv = concat_rows(&[read(&t.q)?, read(&t.k)?, read(&t.v)?]);
                let qk_norm = t.qk_norm.map(|(q, k)| QkNorm { q, k });
                let (o, o_bias, gated) = (read(&t.o)?, t.o_bias, c.hybrid.is_some());
                Mixer::Attention(Attention { qkv, qkv_bias: t.qkv_bias, qk_norm, o, o_bias, gated })
            }
        };
        let mlp = match &t.experts {
            Some(experts) => LayerMlp::Moe(Box::new(self.experts(experts)?)),
            None => {
                LayerMlp::Dense(Mlp { gate_up: concat_rows(&[read(&t.gate)?, read(&t.up)?]), down: read(&t.down)? })
            }
        };
        Ok(Layer { input_norm: t.input_norm, mixer, post_attn_norm: t.post_norm, mlp })
    }

    fn delta_net(&self, t: LinearTensors, c: &ModelConfig) -> Result<DeltaNet, LoadError> {
        let read = |m: &MatrixSpec| self.matrix(&m.name, m.rows, m.cols);
        let (qkv, z) = match &t.qkvz {
            QkvzSpec::Grouped { qkv, z } => (read(qkv)?, read(z)?),
            QkvzSpec::Interleaved(m) => {
                let (qkv, z) = grouped_rows(c.hybrid.as_ref().expect("a linear layer is a hybrid's"));
                let w = read(m)?;
                (w.select_rows(&qkv), w.select_rows(&z))
            }
        };
        Ok(DeltaNet {
            qkv,
            z,
            ba: read(&t.ba)?,
            conv: read(&t.conv)?.to_f32(),
            neg_a: t.neg_a,
            dt_bias: t.dt_bias,
            norm: t.norm,
            out: read(&t.out)?,
        })
    }

    fn experts(&self, t: &ExpertTensors) -> Result<MoeMlp, LoadError> {
        let read = |m: &MatrixSpec| self.matrix(&m.name, m.rows, m.cols);
        let r = &t.router;
        let router = Weight::F32 { rows: r.rows, cols: r.cols, data: read(r)?.to_f32() };
        let experts = t
            .experts
            .iter()
            .map(|e| Ok(Expert { gate: read(&e.gate)?, up: read(&e.up)?, down: read(&e.down)? }))
            .collect::<Result<_, LoadError>>()?;
        let shared = match &t.shared {
            Some((e, gate)) => Some(SharedExpert {
                mlp: Expert { gate: read(&e.gate)?, up: read(&e.up)?, down: read(&e.down)? },
                gate: Weight::F32 { rows: 1, cols: gate.cols, data: read(gate)?.to_f32() },
            }),
            None => None,
        };
        Ok(MoeMlp { router, experts, top_k: t.top_k, norm_topk_prob: t.norm_topk_prob, shared })
    }
}

/// `TF_CPU_ACTIVATIONS` (`int8` or `f32`) picks the arithmetic of quantized weights; unset, the default.
pub(super) fn activations_from_env(ckpt: &dyn Checkpoint) -> Result<Activations, LoadError> {
    match std::env::var("TF_CPU_ACTIVATIONS") {
        Err(_) => Ok(Activations::default()),
        Ok(name) => Activations::parse(&name)
            .ok_or_else(|| LoadError::format(ckpt.path(), format!("TF_CPU_ACTIVATIONS is {name:?}, not int8 or f32"))),
    }
}

/// Inverse frequencies as Hugging Face computes them, with Llama 3 scaling or GGUF frequency factors.
pub(crate) fn rope_inv_freq(c: &ModelConfig, factors: Option<&[f32]>) -> Vec<f32> {
    let d = c.hybrid.as_ref().map_or(c.head_dim, |h| h.rotary_dim);
    let base: Vec<f32> =
        (0..d / 2).map(|i| (1.0 / (c.rope_theta as f64).powf((2 * i) as f64 / d as f64)) as f32).collect();
    if let Some(factors) = factors {
        return base.iter().zip(factors).map(|(f, s)| f / s).collect();
    }
    let Some(s) = &c.rope_scaling else {
        return base;
    };
    let old = s.original_max_position as f32;
    let (low_wavelen, high_wavelen) = (old / s.low_freq_factor, old / s.high_freq_factor);
    base.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / s.factor
            } else {
                let smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * f / s.factor + smooth * f
            }
        })
        .collect()
}

/// Rows of an interleaved q/k/v/z projection (each key head's group end to end) in grouped order: every q, every k,
/// every v (together the convolution's channels), then every z.
pub(super) fn grouped_rows(hc: &HybridConfig) -> (Vec<usize>, Vec<usize>) {
    let (nk, dk, group_v) = (hc.num_k_heads, hc.k_head_dim, hc.num_v_heads / hc.num_k_heads * hc.v_head_dim);
    let group = 2 * dk + 2 * group_v;
    let part = |offset: usize, len: usize| (0..nk).flat_map(move |g| g * group + offset..g * group + offset + len);
    let qkv = part(0, dk).chain(part(dk, dk)).chain(part(2 * dk, group_v)).collect();
    (qkv, part(2 * dk + group_v, group_v).collect())
}
