//! `config.json` of a Hugging Face model directory: the fields the engine reads, checked into a `ModelConfig`.

use std::path::Path;

use serde::Deserialize;

use crate::error::LoadError;
use crate::llama::config::{HybridConfig, Llama3RopeScaling, ModelConfig, MoeConfig};

/// `config.json` as written by transformers; only the fields the engine reads.
#[derive(Deserialize)]
pub(crate) struct RawConfig {
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRopeScaling>,
    /// Transformers 5 writes `rope_theta` and the scaling together under this key.
    rope_parameters: Option<RawRopeScaling>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
    layer_types: Option<Vec<String>>,
    /// Mixtral attends within this window when it is set and shorter than the context.
    sliding_window: Option<usize>,
    /// Qwen3-MoE's expert count; Mixtral, and transformers 5 for both, call it `num_local_experts`.
    num_experts: Option<usize>,
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    /// Qwen3-MoE's expert width; Mixtral's experts are `intermediate_size` wide.
    moe_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    mlp_only_layers: Option<Vec<usize>>,
    decoder_sparse_step: Option<usize>,
    /// Qwen3-Next's gated shared expert.
    shared_expert_intermediate_size: Option<usize>,
    /// Qwen3-Next's linear attention, and where `layer_types` is absent, every how many layers one is full attention.
    linear_conv_kernel_dim: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    full_attention_interval: Option<usize>,
    /// Published configs write it here; transformers 5 moves it into `rope_parameters`.
    partial_rotary_factor: Option<f64>,
    /// Qwen3-Next's multi-token-prediction layers (`mtp.*`), which transformers does not run.
    num_nextn_predict_layers: Option<usize>,
}

#[derive(Deserialize)]
struct RawRopeScaling {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    /// Older transformers releases wrote `type` instead of `rope_type`.
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f32>,
    low_freq_factor: Option<f32>,
    high_freq_factor: Option<f32>,
    original_max_position_embeddings: Option<usize>,
    partial_rotary_factor: Option<f64>,
}

impl RawConfig {
    /// The engine's config, asking the tensors what `config.json` leaves implicit.
    pub(crate) fn into_model_config(
        self,
        path: &Path,
        has_tensor: impl Fn(&str) -> bool,
    ) -> Result<ModelConfig, LoadError> {
        let bad = |fault: String| LoadError::format(path, fault);
        let arch = self.model_type.clone().ok_or_else(|| bad("missing field `model_type`".into()))?;
        if !matches!(arch.as_str(), "llama" | "qwen2" | "qwen3" | "qwen3_moe" | "mixtral" | "qwen3_next") {
            let expected = "llama, qwen2, qwen3, qwen3_moe, mixtral or qwen3_next";
            return Err(bad(format!("unsupported model_type {arch:?} (expected {expected})")));
        }
        let windowed = arch == "mixtral" && self.sliding_window.is_some_and(|w| w < self.max_position_embeddings);
        let unsupported = [
            (self.hidden_act.as_ref().is_some_and(|act| act != "silu"), "hidden_act other than silu"),
            (self.mlp_bias, "mlp_bias = true"),
            (self.use_sliding_window, "use_sliding_window = true"),
            (windowed, "a sliding_window shorter than max_position_embeddings"),
            (
                self.layer_types
                    .iter()
                    .flatten()
                    .any(|ty| ty != "full_attention" && !(arch == "qwen3_next" && ty == "linear_attention")),
                "a layer type other than full_attention (or linear_attention in qwen3_next)",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(present, _)| *present) {
            return Err(bad(format!("{what} is not supported")));
        }
        let num_heads = self.num_attention_heads;
        let num_kv_heads = self.num_key_value_heads.unwrap_or(num_heads);
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            let fault = format!("{num_heads} attention heads over {num_kv_heads} kv heads");
            return Err(bad(format!("{fault}: heads must be a positive multiple of kv heads")));
        }
        let head_dim = match self.head_dim {
            Some(head_dim) => head_dim,
            None if self.hidden_size.is_multiple_of(num_heads) => self.hidden_size / num_heads,
            None => {
                return Err(bad(format!(
                    "hidden_size {} is not a multiple of num_attention_heads {num_heads}",
                    self.hidden_size
                )))
            }
        };
        let sizes = [self.hidden_size, self.intermediate_size, head_dim, self.vocab_size, self.num_hidden_layers];
        if sizes.contains(&0) {
            return Err(bad("sizes, layer count and vocab_size must be positive".into()));
        }
        let moe = self.moe_config(&arch).map_err(bad)?;
        let mut hybrid = self.hybrid_config(&arch, head_dim).map_err(bad)?;
        if let Some(h) = hybrid.as_mut() {
            // A head the config names but the checkpoint left out (as conversions often do) is no head.
            let stored = has_tensor(crate::llama::walk::names::MTP_FC);
            h.mtp_layers = if stored { self.num_nextn_predict_layers.unwrap_or(0).min(1) } else { 0 };
        }
        let rope_theta = self.rope_parameters.as_ref().and_then(|rope| rope.rope_theta).or(self.rope_theta);
        let rope_scaling = match self.rope_scaling.or(self.rope_parameters) {
            Some(scaling) => parse_rope_scaling(scaling).map_err(bad)?,
            None => None,
        };
        Ok(ModelConfig {
            arch,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            intermediate_size: self.intermediate_size,
            num_layers: self.num_hidden_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_eps: self.rms_norm_eps.unwrap_or(1e-6) as f32,
            rope_theta: rope_theta.unwrap_or(10_000.0) as f32,
            rope_scaling,
            rope_interleaved: false,
            max_position: self.max_position_embeddings,
            tie_embeddings: self.tie_word_embeddings,
            // Qwen2 always has q/k/v bias without saying so in its config.
            attn_bias: self.attention_bias || has_tensor("model.layers.0.self_attn.q_proj.bias"),
            qk_norm: hybrid.is_some() || has_tensor("model.layers.0.self_attn.q_norm.weight"),
            moe,
            hybrid,
        })
    }

    /// The experts of a Qwen3-MoE or Mixtral config; None for the dense architectures.
    fn moe_config(&self, arch: &str) -> Result<Option<MoeConfig>, String> {
        let (experts_key, num_experts, width_key, width, norm_topk_prob) = match arch {
            "qwen3_moe" | "qwen3_next" => {
                // Transformers 5 writes Qwen3-MoE's expert count as `num_local_experts` too.
                let num_experts = self.num_experts.or(self.num_local_experts);
                // Each family's own default where the config leaves it out.
                let norm = self.norm_topk_prob.unwrap_or(arch == "qwen3_next");
                ("num_experts", num_experts, "moe_intermediate_size", self.moe_intermediate_size, norm)
            }
            "mixtral" => {
                let width = Some(self.intermediate_size);
                ("num_local_experts", self.num_local_experts, "intermediate_size", width, true)
            }
            _ => return Ok(None),
        };
        let missing = |key: &str| format!("{arch} config is missing `{key}`");
        let num_experts = num_experts.ok_or_else(|| missing(experts_key))?;
        let num_experts_per_tok = self.num_experts_per_tok.ok_or_else(|| missing("num_experts_per_tok"))?;
        let expert_intermediate_size = width.ok_or_else(|| missing(width_key))?;
        if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
            return Err(format!(
                "num_experts_per_tok {num_experts_per_tok} is not between 1 and {experts_key} {num_experts}"
            ));
        }
        if expert_intermediate_size == 0 {
            return Err(format!("{width_key} must be positive"));
        }
        let sparse_step = self.decoder_sparse_step.unwrap_or(1);
        if sparse_step == 0 {
            return Err("decoder_sparse_step must be positive".into());
        }
        let dense_layers = self.mlp_only_layers.clone().unwrap_or_default();
        Ok(Some(MoeConfig {
            num_experts,
            num_experts_per_tok,
            expert_intermediate_size,
            norm_topk_prob,
            dense_layers,
            sparse_step,
            shared_expert_size: self.shared_expert_intermediate_size.filter(|&n| n > 0),
        }))
    }

    /// Qwen3-Next's linear-attention layers and partial rotary; None for the other architectures.
    fn hybrid_config(&self, arch: &str, head_dim: usize) -> Result<Option<HybridConfig>, String> {
        if arch != "qwen3_next" {
            return Ok(None);
        }
        let need = |value: Option<usize>, key: &str| match value {
            Some(v) if v > 0 => Ok(v),
            Some(_) => Err(format!("{key} must be positive")),
            None => Err(format!("{arch} config is missing `{key}`")),
        };
        let layers = self.num_hidden_layers;
        let linear: Vec<bool> = match &self.layer_types {
            Some(types) if types.len() != layers => {
                return Err(format!("layer_types has {} entries for {layers} layers", types.len()))
            }
            Some(types) => types.iter().map(|ty| ty == "linear_attention").collect(),
            None => {
                let interval = need(self.full_attention_interval.or(Some(4)), "full_attention_interval")?;
                (0..layers).map(|i| !(i + 1).is_multiple_of(interval)).collect()
            }
        };
        let (num_k_heads, num_v_heads) = (
            need(self.linear_num_key_heads, "linear_num_key_heads")?,
            need(self.linear_num_value_heads, "linear_num_value_heads")?,
        );
        if !num_v_heads.is_multiple_of(num_k_heads) {
            return Err(format!(
                "linear_num_value_heads {num_v_heads} is not a multiple of linear_num_key_heads {num_k_heads}"
            ));
        }
        let factor = self.rope_parameters.as_ref().and_then(|r| r.partial_rotary_factor).or(self.partial_rotary_factor);
        let rotary_dim = (head_dim as f64 * factor.unwrap_or(0.25)) as usize;
        if rotary_dim == 0 || rotary_dim > head_dim || rotary_dim % 2 == 1 {
            return Err(format!("partial_rotary_factor gives {rotary_dim} rotated dimensions of {head_dim}"));
        }
        Ok(Some(HybridConfig {
            linear,
            num_k_heads,
            num_v_heads,
            k_head_dim: need(self.linear_key_head_dim, "linear_key_head_dim")?,
            v_head_dim: need(self.linear_value_head_dim, "linear_value_head_dim")?,
            conv_kernel: need(self.linear_conv_kernel_dim, "linear_conv_kernel_dim")?,
            rotary_dim,
            mtp_layers: 0,
            centred_norms: true,
        }))
    }
}

fn parse_rope_scaling(raw: RawRopeScaling) -> Result<Option<Llama3RopeScaling>, String> {
    // Guessing a missing type (or a nested per-layer layout) would silently mis-rotate every position.
    let rope_type = raw.rope_type.or(raw.legacy_type).ok_or("rope_scaling / rope_parameters has no rope_type")?;
    match rope_type.as_str() {
        "default" => Ok(None),
        "llama3" => {
            let missing = |field: &str| format!("rope_scaling (llama3) is missing `{field}`");
            Ok(Some(Llama3RopeScaling {
                factor: raw.factor.ok_or_else(|| missing("factor"))?,
                low_freq_factor: raw.low_freq_factor.ok_or_else(|| missing("low_freq_factor"))?,
                high_freq_factor: raw.high_freq_factor.ok_or_else(|| missing("high_freq_factor"))?,
                original_max_position: raw
                    .original_max_position_embeddings
                    .ok_or_else(|| missing("original_max_position_embeddings"))?,
            }))
        }
        other => Err(format!("unsupported rope_scaling type {other:?} (only llama3 is supported)")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn qwen3_moe() -> Value {
        json!({
            "model_type": "qwen3_moe", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": 64, "num_experts": 6, "num_experts_per_tok": 2,
            "moe_intermediate_size": 4, "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3]
        })
    }

    fn mixtral() -> Value {
        json!({
            "model_type": "mixtral", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null
        })
    }

    fn parse(config: &Value) -> Result<ModelConfig, String> {
        let raw: RawConfig = serde_json::from_value(config.clone()).map_err(|e| e.to_string())?;
        raw.into_model_config(Path::new("config.json"), |_| false).map_err(|e| e.to_string())
    }

    #[test]
    fn test_qwen3_moe_reads_its_experts_and_dense_layers() {
        let c = parse(&qwen3_moe()).unwrap();
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.expert_intermediate_size), (6, 2, 4));
        assert!(moe.norm_topk_prob && c.intermediate_size == 12);
        // Every second layer from one is sparse, except layer 3 named dense.
        assert_eq!((0..4).map(|li| c.is_moe_layer(li)).collect::<Vec<_>>(), [false, true, false, false]);
        let mut config = qwen3_moe();
        for key in ["norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"] {
            config.as_object_mut().unwrap().remove(key);
        }
        let c = parse(&config).unwrap();
        assert!(!c.moe.as_ref().unwrap().norm_topk_prob && (0..4).all(|li| c.is_moe_layer(li)));
        let experts = config.as_object_mut().unwrap().remove("num_experts").unwrap();
        config["num_local_experts"] = experts;
        assert_eq!(parse(&config).unwrap().moe.unwrap().num_experts, 6);
    }

    #[test]
    fn test_mixtral_experts_are_intermediate_size_wide_and_renormalized() {
        let c = parse(&mixtral()).unwrap();
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.expert_intermediate_size), (8, 2, 12));
        assert!(moe.norm_topk_prob && c.is_moe_layer(0) && c.is_moe_layer(1));
        let mut long_window = mixtral();
        long_window["sliding_window"] = json!(64);
        assert!(parse(&long_window).is_ok());
    }

    #[test]
    fn test_dense_architectures_have_no_experts() {
        let mut config = qwen3_moe();
        config["model_type"] = json!("qwen3");
        let c = parse(&config).unwrap();
        assert!(c.moe.is_none() && !c.is_moe_layer(1));
    }

    fn qwen3_next() -> Value {
        json!({
            "model_type": "qwen3_next", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
            "num_hidden_layers": 8, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "max_position_embeddings": 64, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 4,
            "shared_expert_intermediate_size": 6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 4,
            "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "partial_rotary_factor": 0.25
        })
    }

    #[test]
    fn test_qwen3_next_reads_its_linear_layers_shared_expert_and_partial_rotary() {
        let c = parse(&qwen3_next()).unwrap();
        let h = c.hybrid.as_ref().unwrap();
        // Without layer_types, every fourth layer is full attention.
        assert_eq!(h.linear, [true, true, true, false, true, true, true, false]);
        assert_eq!((h.num_k_heads, h.num_v_heads, h.k_head_dim, h.v_head_dim, h.conv_kernel), (2, 4, 4, 8, 4));
        assert_eq!((h.rotary_dim, h.conv_dim(), h.row_width()), (4, 2 * 8 + 32, 48 + 8));
        let moe = c.moe.as_ref().unwrap();
        assert!(moe.norm_topk_prob && moe.shared_expert_size == Some(6) && c.qk_norm);
        // The KV pool holds the two attention layers; pages hold the six linear layers' rows and states.
        let layout = c.kv_layout(16);
        assert_eq!((layout.num_layers, layout.state_elems), (2, 6 * (16 * 56 + 4 * 4 * 8)));
        assert_eq!((c.pool_layer(3), c.pool_layer(4), c.pool_layer(7)), (0, 3, 1));
        let mut config = qwen3_next();
        config["layer_types"] = json!(["full_attention", "linear_attention"].repeat(4));
        config["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5});
        let h = parse(&config).unwrap().hybrid.unwrap();
        assert_eq!((h.linear[..2].to_vec(), h.rotary_dim), (vec![false, true], 8));
    }

    #[test]
    fn test_moe_config_faults_name_the_field() {
        let with = |base: Value, key: &str, value: Value| {
            let mut config = base;
            match value {
                Value::Null => config.as_object_mut().unwrap().remove(key),
                v => config.as_object_mut().unwrap().insert(key.into(), v),
            };
            config
        };
        let cases = [
            (with(qwen3_moe(), "num_experts", Value::Null), "missing `num_experts`"),
            (with(qwen3_moe(), "moe_intermediate_size", Value::Null), "missing `moe_intermediate_size`"),
            (with(qwen3_moe(), "num_experts_per_tok", json!(7)), "num_experts_per_tok 7 is not between 1 and"),
            (with(qwen3_moe(), "num_experts_per_tok", json!(0)), "num_experts_per_tok 0"),
            (with(qwen3_moe(), "decoder_sparse_step", json!(0)), "decoder_sparse_step must be positive"),
            (with(qwen3_moe(), "moe_intermediate_size", json!(0)), "moe_intermediate_size must be positive"),
            (with(mixtral(), "num_local_experts", Value::Null), "missing `num_local_experts`"),
            (with(mixtral(), "sliding_window", json!(32)), "sliding_window shorter than"),
            (with(mixtral(), "model_type", json!("deepseek_v3")), "mixtral or qwen3_next"),
            (with(qwen3_next(), "linear_key_head_dim", Value::Null), "missing `linear_key_head_dim`"),
            (with(qwen3_next(), "linear_num_value_heads", json!(3)), "not a multiple of linear_num_key_heads"),
            (with(qwen3_next(), "layer_types", json!(["linear_attention"])), "layer_types has 1 entries for 8"),
            (with(qwen3_next(), "partial_rotary_factor", json!(0.01)), "gives 0 rotated dimensions"),
            (with(qwen3_moe(), "layer_types", json!(["linear_attention"])), "or linear_attention in qwen3_next"),
        ];
        for (config, fault) in cases {
            let err = parse(&config).unwrap_err();
            assert!(err.contains(fault) && err.contains("config.json"), "{err} lacks {fault}");
        }
    }
}
