//! Hugging Face tensor names as llama.cpp's GGUF files name them.

use std::borrow::Cow;

/// One expert's projection by its Hugging Face name, `model.layers.{layer}.mlp.experts.{expert}.{kind}_proj.weight`.
pub(crate) struct ExpertName {
    layer: usize,
    pub(crate) expert: usize,
    /// llama.cpp's word for the projection: gate, up or down.
    kind: &'static str,
}

impl ExpertName {
    pub(crate) fn parse(hf: &str) -> Option<ExpertName> {
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once(".mlp.experts.")?;
        let (expert, proj) = rest.split_once('.')?;
        let kind = match proj {
            "gate_proj.weight" => "gate",
            "up_proj.weight" => "up",
            "down_proj.weight" => "down",
            _ => return None,
        };
        Some(ExpertName { layer: layer.parse().ok()?, expert: expert.parse().ok()?, kind })
    }

    /// The expert's own tensor, as older Mixtral files store it.
    pub(crate) fn own_name(&self) -> String {
        format!("blk.{}.ffn_{}.{}.weight", self.layer, self.kind, self.expert)
    }

    /// The layer's tensor of every expert's matrix of this kind, experts slowest.
    pub(crate) fn stacked_name(&self) -> String {
        format!("blk.{}.ffn_{}_exps.weight", self.layer, self.kind)
    }
}

/// The GGUF name of a Hugging Face tensor name; other names come back unchanged.
pub fn gguf_name(hf: &str) -> Cow<'_, str> {
    let global = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "lm_head.weight" => Some("output.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        _ => None,
    };
    if let Some(name) = global {
        return Cow::Borrowed(name);
    }
    layer_name(hf).map_or(Cow::Borrowed(hf), Cow::Owned)
}

fn layer_name(hf: &str) -> Option<String> {
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = rest.rsplit_once('.')?;
    let gguf = match (module, kind) {
        ("input_layernorm", "weight") => "attn_norm",
        ("post_attention_layernorm", "weight") => "ffn_norm",
        ("self_attn.q_proj", _) => "attn_q",
        ("self_attn.k_proj", _) => "attn_k",
        ("self_attn.v_proj", _) => "attn_v",
        ("self_attn.o_proj", _) => "attn_output",
        ("self_attn.q_norm", "weight") => "attn_q_norm",
        ("self_attn.k_norm", "weight") => "attn_k_norm",
        ("mlp.gate_proj", "weight") => "ffn_gate",
        ("mlp.up_proj", "weight") => "ffn_up",
        ("mlp.down_proj", "weight") => "ffn_down",
        ("mlp.gate", "weight") => "ffn_gate_inp",
        ("mlp.shared_expert.gate_proj", "weight") => "ffn_gate_shexp",
        ("mlp.shared_expert.up_proj", "weight") => "ffn_up_shexp",
        ("mlp.shared_expert.down_proj", "weight") => "ffn_down_shexp",
        ("mlp.shared_expert_gate", "weight") => "ffn_gate_inp_shexp",
        ("linear_attn.in_proj_qkvz", "weight") => "ssm_in",
        ("linear_attn.in_proj_ba", "weight") => "ssm_ba",
        ("linear_attn.conv1d", "weight") => "ssm_conv1d",
        ("linear_attn.norm", "weight") => "ssm_norm",
        ("linear_attn.out_proj", "weight") => "ssm_out",
        ("linear_attn", "dt_bias") => return Some(format!("blk.{layer}.ssm_dt.bias")),
        _ => return None,
    };
    matches!(kind, "weight" | "bias").then(|| format!("blk.{layer}.{gguf}.{kind}"))
}

/// A Hugging Face name in the file's terms before `gguf_name`: a Qwen3-Next MTP head's tensors are block
/// `num_layers`'s (its own as `nextn.*`), and Qwen3-Next calls the norm after attention `post_attention_norm`.
pub(crate) fn alias<'a>(hf: &'a str, arch: &str, num_layers: usize) -> Cow<'a, str> {
    let own = match hf {
        "mtp.fc.weight" => Some("nextn.eh_proj.weight"),
        "mtp.pre_fc_norm_embedding.weight" => Some("nextn.enorm.weight"),
        "mtp.pre_fc_norm_hidden.weight" => Some("nextn.hnorm.weight"),
        "mtp.norm.weight" => Some("nextn.shared_head_norm.weight"),
        _ => None,
    };
    if let Some(own) = own {
        return Cow::Owned(format!("blk.{num_layers}.{own}"));
    }
    let hf: Cow<str> = match hf.strip_prefix("mtp.layers.0.") {
        Some(rest) => Cow::Owned(format!("model.layers.{num_layers}.{rest}")),
        None => Cow::Borrowed(hf),
    };
    match (arch, hf.strip_suffix(".post_attention_layernorm.weight")) {
        ("qwen3next", Some(layer)) => {
            let layer = layer.strip_prefix("model.layers.").unwrap_or(layer);
            Cow::Owned(format!("blk.{layer}.post_attention_norm.weight"))
        }
        _ => hf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_qwen3_next_names_are_llama_cpps() {
        let name = |hf: &str| gguf_name(&alias(hf, "qwen3next", 4)).into_owned();
        assert_eq!(name("model.layers.0.linear_attn.dt_bias"), "blk.0.ssm_dt.bias");
        assert_eq!(name("model.layers.3.linear_attn.conv1d.weight"), "blk.3.ssm_conv1d.weight");
        assert_eq!(name("model.layers.1.mlp.shared_expert_gate.weight"), "blk.1.ffn_gate_inp_shexp.weight");
        assert_eq!(name("model.layers.2.post_attention_layernorm.weight"), "blk.2.post_attention_norm.weight");
        assert_eq!(name("mtp.layers.0.self_attn.q_proj.weight"), "blk.4.attn_q.weight");
        assert_eq!(name("mtp.layers.0.post_attention_layernorm.weight"), "blk.4.post_attention_norm.weight");
        assert_eq!(name("mtp.pre_fc_norm_hidden.weight"), "blk.4.nextn.hnorm.weight");
        // Other architectures keep their own names.
        assert_eq!(
            gguf_name(&alias("model.layers.2.post_attention_layernorm.weight", "qwen3", 4)),
            "blk.2.ffn_norm.weight"
        );
    }
}
