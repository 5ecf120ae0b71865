//! The Llama family (Llama 2/3, Qwen2/2.5, Qwen3, SmolLM2, Qwen3-MoE, Mixtral) on CPU: one model, the variants as
//! config.

use crate::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep, Logits};
use tensorfold_kernels::attention::{attend_from, Query};
use tensorfold_kernels::matmul::{matmul_with, Activations};
use tensorfold_kernels::ops::{self, Rope};
use tensorfold_kernels::Weight;

use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::deltanet::DeltaNet;
use crate::llama::forward::{forward, LayerNorm, LlamaSteps};
use crate::llama::load::{activations_from_env, rope_inv_freq, Loader};
use crate::llama::moe::MoeMlp;
use crate::llama::mtp::MtpHead;
use crate::llama::walk::names;
use crate::tp::collective::Collective;

/// Per-head RMSNorm weights of q and k (Qwen3).
pub(super) struct QkNorm {
    pub(super) q: Vec<f32>,
    pub(super) k: Vec<f32>,
}

pub(super) struct Attention {
    /// q, k and v projections stacked by rows.
    pub(super) qkv: Weight,
    pub(super) qkv_bias: Option<Vec<f32>>,
    pub(super) qk_norm: Option<QkNorm>,
    pub(super) o: Weight,
    pub(super) o_bias: Option<Vec<f32>>,
    /// The query projection also gives each head a gate; the output is scaled by its sigmoid (Qwen3-Next).
    pub(super) gated: bool,
}

/// What mixes a layer's positions: attention over the KV cache, or a linear recurrence.
pub(super) enum Mixer {
    Attention(Attention),
    Linear(DeltaNet),
}

impl Mixer {
    fn num_bytes(&self) -> usize {
        match self {
            Mixer::Attention(a) => a.qkv.num_bytes() + a.o.num_bytes(),
            Mixer::Linear(d) => d.qkv.num_bytes() + d.z.num_bytes() + d.ba.num_bytes() + d.out.num_bytes(),
        }
    }
}

pub(super) struct Mlp {
    /// gate and up projections stacked by rows.
    pub(super) gate_up: Weight,
    pub(super) down: Weight,
}

/// A layer's MLP: dense, or a mixture of experts.
pub(super) enum LayerMlp {
    Dense(Mlp),
    Moe(Box<MoeMlp>),
}

impl LayerMlp {
    fn num_bytes(&self) -> usize {
        match self {
            LayerMlp::Dense(m) => m.gate_up.num_bytes() + m.down.num_bytes(),
            LayerMlp::Moe(m) => m.num_bytes(),
        }
    }
}

pub(super) struct Layer {
    pub(super) input_norm: Vec<f32>,
    pub(super) mixer: Mixer,
    pub(super) post_attn_norm: Vec<f32>,
    pub(super) mlp: LayerMlp,
}

pub struct Llama {
    cfg: ModelConfig,
    embed: Weight,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None` when the head is tied to the embedding.
    lm_head: Option<Weight>,
    rope: Rope,
    /// The group this model is one tensor-parallel rank of, if any.
    collective: Option<Box<dyn Collective>>,
    /// The arithmetic quantized weights meet activations in.
    activations: Activations,
    /// The draft head (multi-token prediction), whose decoder layer is `layers[num_layers]`.
    pub(super) mtp: Option<MtpHead>,
}

impl Llama {
    pub fn load(ckpt: &dyn Checkpoint) -> Result<Llama, LoadError> {
        Llama::load_with_progress(ckpt, &mut |_, _| {})
    }

    /// Loads, calling `progress(layers_done, num_layers)` after each layer.
    pub fn load_with_progress(
        ckpt: &dyn Checkpoint,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Llama, LoadError> {
        let c = ckpt.config().clone();
        let ld = Loader { ckpt };
        let embed = ld.matrix(names::EMBED, c.vocab_size, c.hidden_size)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            layers.push(ld.layer(i, &c)?);
            progress(i + 1, c.num_layers);
        }
        let norm = c.centre_norm(ld.vector(names::NORM, c.hidden_size)?);
        let lm_head = ld.lm_head(&c).map(|m| ld.matrix(&m.name, m.rows, m.cols)).transpose()?;
        let factors = ld.rope_factors(&c)?;
        let rope = Rope { inv_freq: rope_inv_freq(&c, factors.as_deref()), interleaved: c.rope_interleaved };
        let activations = activations_from_env(ckpt)?;
        let mtp = match ld.mtp(&c)? {
            Some((layer, head)) => {
                layers.push(layer);
                Some(head)
            }
            None => None,
        };
        Ok(Llama { cfg: c, embed, layers, norm, lm_head, rope, collective: None, activations, mtp })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub(super) fn activations(&self) -> Activations {
        self.activations
    }

    /// The output projection: its own, or the embedding where they are tied.
    pub(super) fn head_weight(&self) -> &Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Layer `li`'s attention; only the forward pass's attention steps ask, and only of attention layers.
    fn attention(&self, li: usize) -> &Attention {
        match &self.layers[li].mixer {
            Mixer::Attention(a) => a,
            Mixer::Linear(_) => unreachable!("layer {li} is linear attention"),
        }
    }

    /// Sets the arithmetic quantized weights meet activations in: f32 by default, or integer as llama.cpp's CPU path.
    pub fn set_activations(&mut self, activations: Activations) {
        self.activations = activations;
    }

    /// Makes this model (loaded from a shard) a rank of `group`: its partial sums are added with the others'.
    pub fn join(&mut self, group: Box<dyn Collective>) {
        self.collective = Some(group);
    }

    /// Bytes held by the weights.
    pub fn num_weight_bytes(&self) -> usize {
        let l = |l: &Layer| l.mixer.num_bytes() + l.mlp.num_bytes();
        self.embed.num_bytes()
            + self.lm_head.as_ref().map_or(0, Weight::num_bytes)
            + self.layers.iter().map(l).sum::<usize>()
    }

    /// Upper bound of one round's activation bytes for `num_tokens` tokens over `num_lanes` lanes.
    pub fn activation_bytes(&self, num_tokens: usize, num_lanes: usize) -> usize {
        let c = &self.cfg;
        let qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
        let experts = c.moe.as_ref().map_or(0, |m| {
            m.num_experts + m.num_experts_per_tok * (3 * c.hidden_size + 3 * m.expert_intermediate_size)
        });
        let linear = c.hybrid.as_ref().map_or(0, |h| 3 * h.row_width() + 2 * h.num_v_heads * h.v_head_dim);
        let per_token =
            4 * c.hidden_size + 2 * qkv + c.num_heads * c.head_dim + 3 * c.intermediate_size + experts + linear;
        4 * (num_tokens * per_token + num_lanes * (c.vocab_size + c.hidden_size))
    }
}

impl Engine for Llama {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.cfg.kv_layout(page_tokens)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        Ok(self.run(pool, lanes))
    }

    fn has_draft_head(&self) -> bool {
        Llama::has_draft_head(self)
    }

    fn draft_head(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.try_draft_head(pool, lanes)
    }

    fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
        (self.num_weight_bytes(), self.activation_bytes(round_tokens, lanes))
    }
}

/// The CPU model keeps nothing between rounds, so drivers may share one by reference.
impl Engine for &Llama {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        self.cfg.kv_layout(page_tokens)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        Ok(self.run(pool, lanes))
    }

    fn has_draft_head(&self) -> bool {
        Llama::has_draft_head(self)
    }

    fn draft_head(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.try_draft_head(pool, lanes)
    }

    fn host_bytes(&self, round_tokens: usize, lanes: usize) -> (usize, usize) {
        (self.num_weight_bytes(), self.activation_bytes(round_tokens, lanes))
    }
}

impl Llama {
    /// Every lane in one batched pass; returns each lane's requested logits rows.
    pub fn run(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<LaneRows> {
        // The pass runs on a compute thread, so its many parallel kernels are not each handed over from outside.
        rayon::scope(|_| self.forward_on_pool(pool, lanes))
    }

    fn forward_on_pool(&self, pool: &mut KvPool, lanes: &[LaneStep]) -> Vec<LaneRows> {
        let mut pass = self.pass(pool, lanes);
        let Ok(()) = forward(&mut pass, self.cfg.num_layers);
        pass.out
    }

    /// A pass over `lanes`' rows with empty buffers.
    pub(super) fn pass<'a, 'l>(&'a self, pool: &'a mut KvPool, lanes: &'a [LaneStep<'l>]) -> CpuPass<'a, 'l> {
        let queries: Vec<(usize, &[u32])> =
            lanes.iter().flat_map(|l| (0..l.tokens.len()).map(move |i| (l.start_pos + i, l.pages))).collect();
        CpuPass {
            m: self,
            pool,
            lanes,
            queries,
            x: Vec::new(),
            normed: Vec::new(),
            qkv: Vec::new(),
            gate: Vec::new(),
            attn: Vec::new(),
            delta: Vec::new(),
            act: Vec::new(),
            out: Vec::new(),
        }
    }
}

/// Each lane's rows, within the round's, that its step's `Logits` asks for: its last ones.
pub(super) fn wanted_rows(lanes: &[LaneStep]) -> Vec<std::ops::Range<usize>> {
    let mut start = 0;
    lanes
        .iter()
        .map(|l| {
            start += l.tokens.len();
            start - l.logits.rows(l.tokens.len())..start
        })
        .collect()
}

/// One CPU pass over a round's rows: the buffers the steps of `forward` read and write.
pub(super) struct CpuPass<'a, 'l> {
    pub(super) m: &'a Llama,
    pub(super) pool: &'a mut KvPool,
    pub(super) lanes: &'a [LaneStep<'l>],
    /// Each row's position and its lane's pages.
    pub(super) queries: Vec<(usize, &'l [u32])>,
    pub(super) x: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    /// Each row's attention output gates, where the attention is gated.
    gate: Vec<f32>,
    attn: Vec<f32>,
    delta: Vec<f32>,
    act: Vec<f32>,
    pub(super) out: Vec<LaneRows>,
}

impl LlamaSteps for CpuPass<'_, '_> {
    type Error = std::convert::Infallible;

    fn embed(&mut self) -> Result<(), Self::Error> {
        let h = self.m.cfg.hidden_size;
        let tokens = self.lanes.iter().flat_map(|l| l.tokens.iter().copied());
        self.x = vec![0f32; self.queries.len() * h];
        for (row, tok) in self.x.chunks_exact_mut(h).zip(tokens) {
            self.m.embed.row_f32(tok as usize, row);
        }
        Ok(())
    }

    fn norm(&mut self, li: usize, which: LayerNorm) -> Result<(), Self::Error> {
        let layer = &self.m.layers[li];
        let w = match which {
            LayerNorm::Input => &layer.input_norm,
            LayerNorm::PostAttention => &layer.post_attn_norm,
        };
        self.normed = vec![0f32; self.x.len()];
        ops::rms_norm(&self.x, w, self.m.cfg.rms_eps, &mut self.normed);
        Ok(())
    }

    fn qkv(&mut self, li: usize) -> Result<(), Self::Error> {
        let (c, attn) = (&self.m.cfg, self.m.attention(li));
        let (q_dim, width) = (c.num_heads * c.head_dim, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
        self.qkv = vec![0f32; self.queries.len() * attn.qkv.rows()];
        matmul_with(&self.normed, self.queries.len(), &attn.qkv, &mut self.qkv, self.m.activations);
        if let Some(b) = &attn.qkv_bias {
            ops::add_bias(&mut self.qkv, b);
        }
        if attn.gated {
            // Each head's query is followed by its gate: the gates move out, the rows become q, k, v.
            let (d, rows) = (c.head_dim, self.queries.len());
            let (mut qkv, mut gate) = (vec![0f32; rows * width], vec![0f32; rows * q_dim]);
            for ((src, dst), g) in
                self.qkv.chunks_exact(width + q_dim).zip(qkv.chunks_exact_mut(width)).zip(gate.chunks_exact_mut(q_dim))
            {
                for (h, pair) in src[..2 * q_dim].chunks_exact(2 * d).enumerate() {
                    dst[h * d..(h + 1) * d].copy_from_slice(&pair[..d]);
                    g[h * d..(h + 1) * d].copy_from_slice(&pair[d..]);
                }
                dst[q_dim..].copy_from_slice(&src[2 * q_dim..]);
            }
            (self.qkv, self.gate) = (qkv, gate);
        }
        Ok(())
    }

    fn rope_store(&mut self, li: usize) -> Result<(), Self::Error> {
        let (c, attn) = (&self.m.cfg, self.m.attention(li));
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let layer = c.pool_layer(li);
        for (row, &(pos, pages)) in self.qkv.chunks_exact_mut(q_dim + 2 * kv_dim).zip(&self.queries) {
            let (q, kv) = row.split_at_mut(q_dim);
            let (k, v) = kv.split_at_mut(kv_dim);
            if let Some(n) = &attn.qk_norm {
                ops::rms_norm_in_place(q, &n.q, c.rms_eps);
                ops::rms_norm_in_place(k, &n.k, c.rms_eps);
            }
            self.m.rope.apply_partial(q, c.head_dim, pos);
            self.m.rope.apply_partial(k, c.head_dim, pos);
            // A draft head's row runs at its token's position less one but keeps its keys at its token's own.
            let slot = if li >= c.num_layers { pos + 1 } else { pos };
            self.pool.write(layer, pages, slot, k, v);
        }
        Ok(())
    }

    fn attend(&mut self, li: usize) -> Result<(), Self::Error> {
        let c = &self.m.cfg;
        let q_dim = c.num_heads * c.head_dim;
        let width = q_dim + 2 * c.num_kv_heads * c.head_dim;
        let qs: Vec<Query> = self
            .qkv
            .chunks_exact(width)
            .zip(&self.queries)
            .map(|(r, &(pos, pages))| Query { q: &r[..q_dim], pos: pos + usize::from(li >= c.num_layers), pages })
            .collect();
        self.attn = vec![0f32; self.queries.len() * q_dim];
        // A draft head's keys start at token 1's slot: token 0 has no row.
        let first = usize::from(li >= c.num_layers);
        attend_from(self.pool, c.pool_layer(li), &qs, c.num_heads, first, &mut self.attn);
        Ok(())
    }

    fn o_proj(&mut self, li: usize) -> Result<(), Self::Error> {
        let attn = self.m.attention(li);
        if attn.gated {
            self.attn.iter_mut().zip(&self.gate).for_each(|(a, &g)| *a *= 1.0 / (1.0 + (-g).exp()));
        }
        self.delta = vec![0f32; self.x.len()];
        matmul_with(&self.attn, self.queries.len(), &attn.o, &mut self.delta, self.m.activations);
        if let Some(b) = &attn.o_bias {
            ops::add_bias(&mut self.delta, b);
        }
        Ok(())
    }

    fn gate_up(&mut self, li: usize) -> Result<(), Self::Error> {
        let (f, t) = (self.m.cfg.intermediate_size, self.queries.len());
        let LayerMlp::Dense(mlp) = &self.m.layers[li].mlp else { unreachable!("mlp runs a mixture of experts") };
        let mut gate_up = vec![0f32; t * 2 * f];
        matmul_with(&self.normed, t, &mlp.gate_up, &mut gate_up, self.m.activations);
        self.act = vec![0f32; t * f];
        ops::swiglu(&gate_up, f, &mut self.act);
        Ok(())
    }

    fn down(&mut self, li: usize) -> Result<(), Self::Error> {
        self.delta = vec![0f32; self.x.len()];
        let LayerMlp::Dense(mlp) = &self.m.layers[li].mlp else { unreachable!("mlp runs a mixture of experts") };
        matmul_with(&self.act, self.queries.len(), &mlp.down, &mut self.delta, self.m.activations);
        Ok(())
    }

    fn mlp(&mut self, li: usize) -> Result<(), Self::Error> {
        match &self.m.layers[li].mlp {
            LayerMlp::Dense(_) => {
                self.gate_up(li)?;
                self.down(li)
            }
            LayerMlp::Moe(moe) => {
                self.delta = moe.forward(&self.normed, self.queries.len(), self.m.activations);
                Ok(())
            }
        }
    }

    fn is_linear(&self, li: usize) -> bool {
        matches!(self.m.layers[li].mixer, Mixer::Linear(_))
    }

    fn linear(&mut self, li: usize) -> Result<(), Self::Error> {
        let (m, c) = (self.m, &self.m.cfg);
        let (Mixer::Linear(net), Some(hc)) = (&m.layers[li].mixer, &c.hybrid) else {
            unreachable!("layer {li} is not linear attention")
        };
        self.delta = net.forward(hc, c.pool_layer(li), c.rms_eps, self.pool, self.lanes, &self.normed, m.activations);
        Ok(())
    }

    fn reduce(&mut self) -> Result<(), Self::Error> {
        if let Some(group) = &self.m.collective {
            // The ranks run the same rounds in step, so a failed sum is a bug of the group, not of a request.
            group.all_reduce_sum(&mut self.delta).unwrap_or_else(|e| panic!("{e}"));
        }
        Ok(())
    }

    fn add(&mut self) -> Result<(), Self::Error> {
        ops::add_in_place(&mut self.x, &self.delta);
        Ok(())
    }

    fn logits(&mut self) -> Result<(), Self::Error> {
        let (m, h) = (self.m, self.m.cfg.hidden_size);
        let all = (m.cfg.hidden_rows() > 0).then(|| {
            // Every row's final hidden state stays in its page for the draft head.
            let mut all = vec![0f32; self.x.len()];
            ops::rms_norm(&self.x, &m.norm, m.cfg.rms_eps, &mut all);
            for (row, &(pos, pages)) in all.chunks_exact(h).zip(&self.queries) {
                m.write_hidden(self.pool, pages, pos, row);
            }
            all
        });
        let rows = wanted_rows(self.lanes);
        let pick =
            |x: &[f32]| -> Vec<f32> { rows.iter().flat_map(|r| x[r.start * h..r.end * h].iter().copied()).collect() };
        // Each row is normed alone, so picking before or after the norm gives the same bits.
        let normed = match all {
            Some(all) => pick(&all),
            None => {
                let picked = pick(&self.x);
                let mut normed = vec![0f32; picked.len()];
                ops::rms_norm(&picked, &m.norm, m.cfg.rms_eps, &mut normed);
                normed
            }
        };
        // Hidden rows leave after the final norm; only the others go through the output projection.
        let is_hidden = |lane: &LaneStep| lane.logits == Logits::Hidden;
        let to_head: std::borrow::Cow<[f32]> = match self.lanes.iter().any(is_hidden) {
            false => (&normed[..]).into(),
            true => {
                let (mut head, mut at) = (Vec::new(), 0);
                for (r, lane) in rows.iter().zip(self.lanes) {
                    let len = (r.end - r.start) * h;
                    if !is_hidden(lane) {
                        head.extend_from_slice(&normed[at..at + len]);
                    }
                    at += len;
                }
                head.into()
            }
        };
        let num = to_head.len() / h;
        let vocab = m.cfg.vocab_size;
        let mut logits = vec![0f32; num * vocab];
        matmul_with(&to_head, num, m.lm_head.as_ref().unwrap_or(&m.embed), &mut logits, m.activations);
        let (mut at_normed, mut at_logits) = (0, 0);
        self.out = rows
            .iter()
            .zip(self.lanes)
            .map(|(r, lane)| {
                let k = r.end - r.start;
                at_normed += k * h;
                if is_hidden(lane) {
                    return LaneRows::Hidden(normed[at_normed - k * h..at_normed].to_vec());
                }
                at_logits += k * vocab;
                lane.logits.take(&logits[at_logits - k * vocab..at_logits], vocab)
            })
            .collect();
        Ok(())
    }
}
