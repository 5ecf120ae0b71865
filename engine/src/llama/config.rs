//! The Llama-family configuration: one struct whose fields are the variants.

/// Llama 3 style frequency-dependent RoPE scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: usize,
}

/// A mixture of experts in place of the dense MLP (Qwen3-MoE, Mixtral).
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// Experts each row is routed to.
    pub num_experts_per_tok: usize,
    /// Each expert's gated MLP width.
    pub expert_intermediate_size: usize,
    /// The chosen experts' probabilities are divided by their sum (always so in Mixtral).
    pub norm_topk_prob: bool,
    /// Layers that keep the dense MLP whatever the step says.
    pub dense_layers: Vec<usize>,
    /// Every `sparse_step`-th layer (counting from one) is a mixture of experts.
    pub sparse_step: usize,
}

impl MoeConfig {
    /// Whether layer `li`'s MLP is a mixture of experts, by Qwen3-MoE's rule.
    pub fn is_moe_layer(&self, li: usize) -> bool {
        !self.dense_layers.contains(&li) && self.num_experts > 0 && (li + 1).is_multiple_of(self.sparse_step)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture name as the checkpoint gives it (llama, qwen2, qwen3, qwen3_moe, mixtral).
    pub arch: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// RoPE rotates adjacent pairs (GGUF Llama) instead of the two halves (Hugging Face, GGUF Qwen).
    pub rope_interleaved: bool,
    pub max_position: usize,
    pub tie_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attn_bias: bool,
    /// q and k are RMS-normalized per head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The mixture of experts, where the model has one.
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    /// Whether layer `li`'s MLP is a mixture of experts.
    pub fn is_moe_layer(&self, li: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe_layer(li))
    }

    /// The KV pool shape for pages of `page_tokens` positions.
    pub fn kv_layout(&self, page_tokens: usize) -> crate::boundary::KvLayout {
        let (num_layers, num_kv_heads, head_dim) = (self.num_layers, self.num_kv_heads, self.head_dim);
        crate::boundary::KvLayout { num_layers, num_kv_heads, head_dim, page_tokens, elem_bytes: 4 }
    }
}
