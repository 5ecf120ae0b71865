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
    /// Width of the shared expert every row also runs, weighted by a sigmoid gate (Qwen3-Next).
    pub shared_expert_size: Option<usize>,
}

impl MoeConfig {
    /// Whether layer `li`'s MLP is a mixture of experts, by Qwen3-MoE's rule.
    pub fn is_moe_layer(&self, li: usize) -> bool {
        !self.dense_layers.contains(&li) && self.num_experts > 0 && (li + 1).is_multiple_of(self.sparse_step)
    }
}

/// Gated DeltaNet linear attention in place of attention on some layers (Qwen3-Next, the Flash Next family).
#[derive(Clone, Debug, PartialEq)]
pub struct HybridConfig {
    /// Per layer, whether it is linear attention; the others are gated full attention.
    pub linear: Vec<bool>,
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    /// Taps of the causal depthwise convolution over q, k and v.
    pub conv_kernel: usize,
    /// Leading dimensions of each attention head that RoPE rotates; the rest pass through.
    pub rotary_dim: usize,
    /// Layers of the multi-token-prediction draft head the checkpoint holds (0 or 1).
    pub mtp_layers: usize,
    /// The checkpoint stores the norms that scale by one plus their weight as the weight alone (Hugging Face); a
    /// GGUF file stores them with the one added.
    pub centred_norms: bool,
}

impl HybridConfig {
    /// Channels of the convolution: q and k of every key head, then v of every value head.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_k_heads * self.k_head_dim + self.value_dim()
    }

    /// Width of the values (and of the output gate z): every value head's.
    pub fn value_dim(&self) -> usize {
        self.num_v_heads * self.v_head_dim
    }

    /// Floats a position keeps per linear layer: its convolution input, then each value head's decay and beta.
    pub fn row_width(&self) -> usize {
        self.conv_dim() + 2 * self.num_v_heads
    }

    /// Floats of one recurrent state: a k x v matrix per value head.
    pub fn state_size(&self) -> usize {
        self.num_v_heads * self.k_head_dim * self.v_head_dim
    }

    /// Floats a page holds per linear layer: its positions' rows, then the state after its last position.
    pub fn page_state_per_layer(&self, page_tokens: usize) -> usize {
        page_tokens * self.row_width() + self.state_size()
    }

    pub fn num_linear(&self) -> usize {
        self.linear.iter().filter(|&&l| l).count()
    }

    /// Layer `li`'s index among the layers of its own kind.
    pub fn index_of_kind(&self, li: usize) -> usize {
        self.linear[..li].iter().filter(|&&l| l == self.linear[li]).count()
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
    /// Linear-attention layers beside gated attention ones, where the model is a hybrid.
    pub hybrid: Option<HybridConfig>,
}

impl ModelConfig {
    /// Whether layer `li`'s MLP is a mixture of experts.
    pub fn is_moe_layer(&self, li: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.is_moe_layer(li))
    }

    /// Whether the loader adds one to the norms' stored weights.
    pub fn adds_one_to_norms(&self) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.centred_norms)
    }

    /// A norm's weights as it scales by them: where the loader adds one to the stored weights, with the one added.
    pub fn centre_norm(&self, mut w: Vec<f32>) -> Vec<f32> {
        if self.adds_one_to_norms() {
            w.iter_mut().for_each(|v| *v += 1.0);
        }
        w
    }

    /// Leading dimensions of each attention head that RoPE rotates: all but in a hybrid with partial rotary.
    pub fn rotary_dim(&self) -> usize {
        self.hybrid.as_ref().map_or(self.head_dim, |h| h.rotary_dim)
    }

    /// Whether layer `li` is linear attention.
    pub fn is_linear(&self, li: usize) -> bool {
        self.hybrid.as_ref().is_some_and(|h| h.linear.get(li) == Some(&true))
    }

    /// Layer `li`'s layer in the KV pool (attention layers only) or in the page states (linear layers only); a
    /// draft head's layers (from `num_layers` on) follow the attention layers in the pool.
    pub fn pool_layer(&self, li: usize) -> usize {
        match &self.hybrid {
            None => li,
            Some(h) if li >= self.num_layers => self.num_layers - h.num_linear() + li - self.num_layers,
            Some(h) => h.index_of_kind(li),
        }
    }

    /// Floats a page holds per position of the final hidden state, which a draft head reads.
    pub fn hidden_rows(&self) -> usize {
        self.hybrid.as_ref().filter(|h| h.mtp_layers > 0).map_or(0, |_| self.hidden_size)
    }

    /// The KV pool shape for pages of `page_tokens` positions: keys and values of the attention layers, and the
    /// recurrent rows and state of the linear ones.
    pub fn kv_layout(&self, page_tokens: usize) -> crate::boundary::KvLayout {
        let (num_kv_heads, head_dim) = (self.num_kv_heads, self.head_dim);
        let (num_layers, state_elems) = match &self.hybrid {
            None => (self.num_layers, 0),
            Some(h) => (
                self.num_layers - h.num_linear() + h.mtp_layers,
                h.num_linear() * h.page_state_per_layer(page_tokens) + page_tokens * self.hidden_rows(),
            ),
        };
        crate::boundary::KvLayout { num_layers, num_kv_heads, head_dim, page_tokens, elem_bytes: 4, state_elems }
    }
}
