//! Seeded random mixture-of-experts checkpoints, small enough to write per test: Qwen3-MoE with a dense layer
//! among its sparse ones, and Mixtral; experts one tensor each as published, or stacked as transformers 5 saves.

use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use super::Rng;

const VOCAB: usize = 96;
const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const DENSE_WIDTH: usize = 48;
const EXPERT_WIDTH: usize = 24;

/// Which architecture, and how its experts are stored.
#[derive(Clone, Copy, Debug)]
pub enum MoeShape {
    /// 3 layers, layer 1 dense, 16 experts, top 4, renormalized.
    Qwen3Moe,
    /// 2 layers, 8 experts, top 2.
    Mixtral,
}

impl MoeShape {
    fn num_layers(self) -> usize {
        match self {
            MoeShape::Qwen3Moe => 3,
            MoeShape::Mixtral => 2,
        }
    }

    fn num_experts(self) -> usize {
        match self {
            MoeShape::Qwen3Moe => 16,
            MoeShape::Mixtral => 8,
        }
    }

    fn is_moe_layer(self, li: usize) -> bool {
        !matches!(self, MoeShape::Qwen3Moe if li == 1)
    }

    fn config(self) -> serde_json::Value {
        let mut c = json!({
            "vocab_size": VOCAB, "hidden_size": HIDDEN, "num_hidden_layers": self.num_layers(),
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "tie_word_embeddings": false,
        });
        let extra = match self {
            MoeShape::Qwen3Moe => json!({
                "model_type": "qwen3_moe", "intermediate_size": DENSE_WIDTH, "num_experts": 16,
                "num_experts_per_tok": 4, "moe_intermediate_size": EXPERT_WIDTH, "norm_topk_prob": true,
                "decoder_sparse_step": 1, "mlp_only_layers": [1],
            }),
            MoeShape::Mixtral => json!({
                "model_type": "mixtral", "intermediate_size": EXPERT_WIDTH, "num_local_experts": 8,
                "num_experts_per_tok": 2, "sliding_window": null,
            }),
        };
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    }
}

/// A tensor to write: name, shape, values.
type Tensor = (String, Vec<usize>, Vec<f32>);

/// Uniform values in (-scale, scale), or around 1 for norms.
fn values(rng: &mut Rng, len: usize, scale: f32, around_one: bool) -> Vec<f32> {
    let mut one = || (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
    (0..len).map(|_| if around_one { 1.0 + 0.2 * one() } else { scale * one() }).collect()
}

/// Writes `shape`'s checkpoint into `dir` from `seed`; the same seed gives the same values in either layout.
pub fn write(dir: &Path, shape: MoeShape, stacked: bool, seed: u64) {
    let mut rng = Rng(seed);
    let mut tensors: Vec<Tensor> = Vec::new();
    let add = |tensors: &mut Vec<Tensor>, rng: &mut Rng, name: String, dims: Vec<usize>, norm: bool| {
        let v = values(rng, dims.iter().product(), 0.35, norm);
        tensors.push((name, dims, v));
    };
    add(&mut tensors, &mut rng, "model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN], false);
    for li in 0..shape.num_layers() {
        let l = |tail: &str| format!("model.layers.{li}.{tail}");
        add(&mut tensors, &mut rng, l("input_layernorm.weight"), vec![HIDDEN], true);
        add(&mut tensors, &mut rng, l("post_attention_layernorm.weight"), vec![HIDDEN], true);
        add(&mut tensors, &mut rng, l("self_attn.q_proj.weight"), vec![HEADS * HEAD_DIM, HIDDEN], false);
        add(&mut tensors, &mut rng, l("self_attn.k_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], false);
        add(&mut tensors, &mut rng, l("self_attn.v_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], false);
        add(&mut tensors, &mut rng, l("self_attn.o_proj.weight"), vec![HIDDEN, HEADS * HEAD_DIM], false);
        if matches!(shape, MoeShape::Qwen3Moe) {
            add(&mut tensors, &mut rng, l("self_attn.q_norm.weight"), vec![HEAD_DIM], true);
            add(&mut tensors, &mut rng, l("self_attn.k_norm.weight"), vec![HEAD_DIM], true);
        }
        if !shape.is_moe_layer(li) {
            add(&mut tensors, &mut rng, l("mlp.gate_proj.weight"), vec![DENSE_WIDTH, HIDDEN], false);
            add(&mut tensors, &mut rng, l("mlp.up_proj.weight"), vec![DENSE_WIDTH, HIDDEN], false);
            add(&mut tensors, &mut rng, l("mlp.down_proj.weight"), vec![HIDDEN, DENSE_WIDTH], false);
            continue;
        }
        let (block, names) = match (shape, stacked) {
            (MoeShape::Mixtral, false) => ("block_sparse_moe", ["w1", "w3", "w2"]),
            _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
        };
        let num_experts = shape.num_experts();
        add(&mut tensors, &mut rng, l(&format!("{block}.gate.weight")), vec![num_experts, HIDDEN], false);
        let mut experts = Vec::new();
        for e in 0..num_experts {
            let proj = |p: &str| l(&format!("{block}.experts.{e}.{p}.weight"));
            experts.push([
                (proj(names[0]), vec![EXPERT_WIDTH, HIDDEN], values(&mut rng, EXPERT_WIDTH * HIDDEN, 0.35, false)),
                (proj(names[1]), vec![EXPERT_WIDTH, HIDDEN], values(&mut rng, EXPERT_WIDTH * HIDDEN, 0.35, false)),
                (proj(names[2]), vec![HIDDEN, EXPERT_WIDTH], values(&mut rng, HIDDEN * EXPERT_WIDTH, 0.35, false)),
            ]);
        }
        if stacked {
            let gate_up = experts.iter().flat_map(|[g, u, _]| g.2.iter().chain(&u.2).copied()).collect();
            let down = experts.iter().flat_map(|[_, _, d]| d.2.iter().copied()).collect();
            tensors.push((l("mlp.experts.gate_up_proj"), vec![num_experts, 2 * EXPERT_WIDTH, HIDDEN], gate_up));
            tensors.push((l("mlp.experts.down_proj"), vec![num_experts, HIDDEN, EXPERT_WIDTH], down));
        } else {
            tensors.extend(experts.into_iter().flatten());
        }
    }
    add(&mut tensors, &mut rng, "model.norm.weight".into(), vec![HIDDEN], true);
    add(&mut tensors, &mut rng, "lm_head.weight".into(), vec![VOCAB, HIDDEN], false);
    std::fs::write(dir.join("config.json"), shape.config().to_string()).unwrap();
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, dims, _), b)| (name.as_str(), TensorView::new(Dtype::F32, dims.clone(), b).unwrap()));
    safetensors::serialize_to_file(views, &None, &dir.join("model.safetensors")).unwrap();
}
