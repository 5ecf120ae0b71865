//! The Llama-family configuration: one struct whose fields are the variants.

/// Llama 3 style frequency-dependent RoPE scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture name as the checkpoint gives it (llama, qwen2, qwen3).
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
}

impl ModelConfig {
    /// The KV pool shape for pages of `page_tokens` positions.
    pub fn kv_layout(&self, page_tokens: usize) -> crate::boundary::KvLayout {
        let (num_layers, num_kv_heads, head_dim) = (self.num_layers, self.num_kv_heads, self.head_dim);
        crate::boundary::KvLayout { num_layers, num_kv_heads, head_dim, page_tokens, elem_bytes: 4 }
    }
}
