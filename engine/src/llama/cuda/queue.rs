//! The kernels of one round, queued on the GPU's stream: the steps of `forward` as launches.

use tensorfold_kernels::cuda::{
    AttentionArgs, DeltaNetLayer, DeltaNetRound, DevPtr, GpuError, HiddenPlane, NormIn, PageRows, QkvArgs,
};

use super::round::Filled;
use super::{Caches, Net, SPLIT_BLOCKS, SPLIT_ROWS, WIDE_SPLIT_ROWS};
use crate::llama::forward::{forward, layer, LayerNorm, LlamaSteps};

/// Where the round's residual stream is: its buffer, and the one the next folded norm stores the sum to.
struct Residual {
    x: DevPtr,
    spare: DevPtr,
}

impl Residual {
    /// A norm whose sum with `delta` (0 for none) lands in the spare buffer, which then holds the stream.
    fn norm(&mut self, delta: DevPtr, w: DevPtr, eps: f32) -> NormIn {
        let norm = NormIn { x: self.x, delta, w, x_out: self.spare, eps };
        if delta != 0 {
            std::mem::swap(&mut self.x, &mut self.spare);
        }
        norm
    }
}

impl Net {
    /// Queues the kernels of the round whose uploaded tables `f` describes; `fuse_rope` (only where every lane has one
    /// token) does RoPE and the cache write inside attention.
    /// Rounds of few rows fold each norm into the GEMM that reads it (`Gpu::folds_norm`): the same bits.
    pub(super) fn queue(&self, cache: &Caches, f: &Filled, fuse_rope: bool, fold: bool) -> Result<(), GpuError> {
        forward(&mut self.pass(cache, f, fuse_rope, fold, false), self.cfg.num_layers)
    }

    /// Queues a draft head's round (`mtp.rs`) whose tables `f` describes: each row's token embedded and joined with
    /// the hidden state before it, `fc`, the head's layer, then the head's norm and the output head.
    pub(super) fn queue_head(&self, cache: &Caches, f: &Filled) -> Result<(), GpuError> {
        let (g, s, c) = (&*self.gpu, &self.scratch, &self.cfg);
        let Some(head) = &self.mtp else { unreachable!("a draft head's round runs only where the model has one") };
        let (t, h) = (f.rows, c.hidden_size);
        let mut pass = self.pass(cache, f, false, false, true);
        pass.embed()?;
        let from = PageRows {
            at: pass.at(self.meta.pos),
            table_off: pass.at(self.meta.table_off),
            page_table: pass.at(self.meta.pages),
        };
        let weights = (head.norm_embed, head.norm_hidden, c.rms_eps);
        g.mtp_join(&self.hidden_plane(cache), &from, (s.x, t), weights, s.joined)?;
        g.gemm(s.joined, head.fc, 0, s.x, (t, h, 2 * h), &s.gemm)?;
        layer(&mut pass, c.num_layers)?;
        pass.logits()
    }

    /// The launches of the round `f` describes, a draft head's with `head`.
    fn pass<'a>(&'a self, cache: &'a Caches, f: &Filled, fuse_rope: bool, fold: bool, head: bool) -> GpuPass<'a> {
        let (t, h, ff) = (f.rows, self.cfg.hidden_size, self.cfg.intermediate_size);
        GpuPass {
            m: self,
            cache,
            t,
            n: f.logit_rows,
            groups: f.groups,
            fuse_rope,
            fold: fold && self.gpu.folds_norm(t, h),
            swiglu: self.gpu.fuses_swiglu(t, 2 * ff, h),
            res: Residual { x: self.scratch.x, spare: self.scratch.x_spare },
            pending: 0,
            norm_w: 0,
            head: head.then_some(f.guesses),
        }
    }

    /// Where the pool's pages keep each position's final hidden state for the draft head.
    fn hidden_plane(&self, cache: &Caches) -> HiddenPlane {
        let c = &self.cfg;
        let linear = c.hybrid.as_ref().map_or(0, |hc| hc.num_linear() * hc.page_state_per_layer(cache.page_tokens));
        HiddenPlane {
            states: cache.states,
            state_elems: cache.state_elems,
            base: linear,
            page_tokens: cache.page_tokens,
            h: c.hidden_size,
        }
    }
}

/// One round's launches: the steps of `forward` as kernels on the GPU's stream.
struct GpuPass<'a> {
    m: &'a Net,
    cache: &'a Caches,
    t: usize,
    n: usize,
    /// Attention row groups in the round's tables.
    groups: usize,
    fuse_rope: bool,
    fold: bool,
    swiglu: bool,
    res: Residual,
    /// A block's output that the stream has not taken yet (0 for none): the next norm, or `logits`, adds it.
    pending: DevPtr,
    /// Where norms fold, the norm weight the next GEMM applies.
    norm_w: DevPtr,
    /// A draft head's round, with the count of lanes whose guess keeps its state; `None` for the model's own.
    head: Option<usize>,
}

impl GpuPass<'_> {
    fn at(&self, off: usize) -> DevPtr {
        self.m.scratch.meta + off as u64
    }

    fn rope(&self, li: usize) -> QkvArgs {
        let (c, s, l) = (&self.m.cfg, &self.m.scratch, &self.m.layers[li]);
        QkvArgs {
            qkv: s.qkv,
            pos: self.at(self.m.meta.pos),
            kv_off: self.at(self.m.meta.kv_off),
            inv_freq: self.m.inv_freq,
            q_norm: l.q_norm,
            k_norm: l.k_norm,
            eps: c.rms_eps,
            kcache: self.cache.k,
            vcache: self.cache.v,
            layer_off: self.layer_off(li),
            rows: self.t,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            interleaved: c.rope_interleaved,
            rotary_dim: c.rotary_dim(),
        }
    }

    /// Layer `li`'s keys within a page: attention layers only are in the pool.
    fn layer_off(&self, li: usize) -> u64 {
        (self.m.cfg.pool_layer(li) * self.cache.page_tokens * self.m.cfg.num_kv_heads * self.m.cfg.head_dim) as u64
    }
}

impl LlamaSteps for GpuPass<'_> {
    type Error = GpuError;

    fn embed(&mut self) -> Result<(), GpuError> {
        let (g, s) = (&*self.m.gpu, &self.m.scratch);
        g.begin_round(self.t);
        let dims = (self.t, self.m.cfg.vocab_size, self.m.cfg.hidden_size);
        g.embed_rows(self.m.embed, self.at(self.m.meta.tokens), s.x, dims)
    }

    fn norm(&mut self, li: usize, which: LayerNorm) -> Result<(), GpuError> {
        let (g, s, c, l) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg, &self.m.layers[li]);
        let w = match which {
            LayerNorm::Input => l.input_norm,
            LayerNorm::PostAttention => l.post_norm,
        };
        // The experts' kernels read the normed rows, as do a layer's several input projections: those never fold.
        let folds = match which {
            LayerNorm::Input => l.input_folds(),
            LayerNorm::PostAttention => l.moe.is_none(),
        };
        if self.fold && folds {
            // The GEMM that reads the norm applies it, with the pending sum.
            self.norm_w = w;
            return Ok(());
        }
        let (x, t, h) = (self.res.x, self.t, c.hidden_size);
        match std::mem::take(&mut self.pending) {
            0 => g.rms_norm(x, 0, t, w, s.normed, h, c.rms_eps),
            delta => g.add_rms_norm(x, delta, w, s.normed, t, h, c.rms_eps),
        }
    }

    fn qkv(&mut self, li: usize) -> Result<(), GpuError> {
        let (g, s, c, l) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg, &self.m.layers[li]);
        let (h, width) = (c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
        if l.gate != 0 {
            // Gated attention: its gates from the same normed rows.
            let gates = (self.t, c.num_heads * c.head_dim, h);
            g.gemm(s.normed, l.gate, 0, s.hybrid.attn_gate, gates, &s.gemm)?;
        }
        if !self.fold || !l.input_folds() {
            return g.gemm(s.normed, l.qkv, l.qkv_bias, s.qkv, (self.t, width, h), &s.gemm);
        }
        let norm = self.res.norm(std::mem::take(&mut self.pending), self.norm_w, c.rms_eps);
        g.gemm_norm(&norm, l.qkv, l.qkv_bias, s.qkv, 0, (self.t, width, h))
    }

    fn rope_store(&mut self, li: usize) -> Result<(), GpuError> {
        // A fused decode round does this inside attention.
        match self.fuse_rope {
            true => Ok(()),
            false => self.m.gpu.qkv_rope_store(&self.rope(li)),
        }
    }

    fn attend(&mut self, li: usize) -> Result<(), GpuError> {
        let (c, s, t) = (&self.m.cfg, &self.m.scratch, self.t);
        let d = c.head_dim;
        // A draft head's row attends from slot 1 to its token's slot.
        let key_pos = if self.head.is_some() { self.m.meta.key_pos } else { self.m.meta.pos };
        let attention = AttentionArgs {
            qkv: s.qkv,
            pos: self.at(key_pos),
            page_table: self.at(self.m.meta.pages),
            table_off: self.at(self.m.meta.table_off),
            kcache: self.cache.k,
            vcache: self.cache.v,
            out: s.attn,
            groups: self.at(self.m.meta.groups),
            num_groups: self.groups,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: d,
            page_tokens: self.cache.page_tokens,
            page_stride: self.cache.page_stride,
            layer_off: self.layer_off(li),
            scale: 1.0 / (d as f32).sqrt(),
            partial: if t <= SPLIT_ROWS { s.partial } else { 0 },
            tickets: s.tickets,
            nsplit: s.nsplit,
            splits: SPLIT_BLOCKS,
            one_row_groups: self.groups == t,
            states: s.partial,
            states_bytes: s.partial_bytes,
            ticket_rows: WIDE_SPLIT_ROWS,
            first_key: usize::from(self.head.is_some()),
        };
        let rope = self.fuse_rope.then(|| self.rope(li));
        self.m.gpu.paged_attention(&attention, rope.as_ref())?;
        match self.m.layers[li].gate {
            0 => Ok(()),
            _ => self.m.gpu.attention_output_gate(s.attn, s.hybrid.attn_gate, t, c.num_heads * d),
        }
    }

    fn o_proj(&mut self, li: usize) -> Result<(), GpuError> {
        let (c, s, l) = (&self.m.cfg, &self.m.scratch, &self.m.layers[li]);
        let dims = (self.t, c.hidden_size, c.num_heads * c.head_dim);
        self.m.gpu.gemm(s.attn, l.o, l.o_bias, s.proj, dims, &s.gemm)
    }

    fn gate_up(&mut self, li: usize) -> Result<(), GpuError> {
        let (g, s, c, l) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg, &self.m.layers[li]);
        let (t, h, f) = (self.t, c.hidden_size, c.intermediate_size);
        let (out, act) = if self.swiglu { (0, s.act) } else { (s.gate_up, 0) };
        if self.fold {
            let norm = self.res.norm(std::mem::take(&mut self.pending), self.norm_w, c.rms_eps);
            g.gemm_norm(&norm, l.gate_up, 0, out, act, (t, 2 * f, h))?;
        } else if self.swiglu {
            g.gemm_swiglu(s.normed, l.gate_up, s.act, (t, 2 * f, h), &s.gemm)?;
        } else {
            g.gemm(s.normed, l.gate_up, 0, s.gate_up, (t, 2 * f, h), &s.gemm)?;
        }
        match self.swiglu {
            true => Ok(()),
            false => g.swiglu(s.gate_up, s.act, t, f),
        }
    }

    fn down(&mut self, li: usize) -> Result<(), GpuError> {
        let (c, s, l) = (&self.m.cfg, &self.m.scratch, &self.m.layers[li]);
        self.m.gpu.gemm(s.act, l.down, 0, s.proj, (self.t, c.hidden_size, c.intermediate_size), &s.gemm)
    }

    fn mlp(&mut self, li: usize) -> Result<(), GpuError> {
        let (g, s, c, l) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg, &self.m.layers[li]);
        let Some(w) = &l.moe else {
            self.gate_up(li)?;
            return self.down(li);
        };
        let (t, h, hs) = (self.t, c.hidden_size, &s.hybrid);
        let shared = match &l.shared {
            None => None,
            Some(sh) => {
                // The shared expert, the dense MLP's kernels at its width, and its gate's logit.
                g.gemm(s.normed, sh.gate_up, 0, hs.shared_gate_up, (t, 2 * sh.f, h), &s.gemm)?;
                g.swiglu(hs.shared_gate_up, hs.shared_act, t, sh.f)?;
                g.gemm(hs.shared_act, sh.down, 0, hs.shared_y, (t, h, sh.f), &s.gemm)?;
                g.moe_shared_gate(&s.moe, s.normed, sh.gate, (t, h), hs.shared_gate)?;
                Some((hs.shared_y, hs.shared_gate))
            }
        };
        g.moe(w, &s.moe, s.normed, (t, h), s.proj, shared)
    }

    fn is_linear(&self, li: usize) -> bool {
        self.m.layers[li].linear.is_some()
    }

    fn linear(&mut self, li: usize) -> Result<(), GpuError> {
        let (g, s, c, l) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg, &self.m.layers[li]);
        let (Some(w), Some(hc)) = (&l.linear, &c.hybrid) else { unreachable!("layer {li} is linear") };
        let (t, h, hs) = (self.t, c.hidden_size, &s.hybrid);
        let (nv, dv, value_dim) = (hc.num_v_heads, hc.v_head_dim, hc.value_dim());
        g.gemm(s.normed, w.qkv, 0, hs.conv_in, (t, hc.conv_dim(), h), &s.gemm)?;
        g.gemm(s.normed, w.z, 0, hs.z, (t, value_dim, h), &s.gemm)?;
        g.gemm(s.normed, w.ba, 0, hs.ba, (t, 2 * nv, h), &s.gemm)?;
        let layer = DeltaNetLayer {
            states: self.cache.states,
            state_elems: self.cache.state_elems,
            ..super::hybrid::delta_layer(hc, li, self.cache.page_tokens)
        };
        let round = DeltaNetRound {
            rows: t,
            lanes: self.cache.lanes,
            pos: self.at(self.m.meta.pos),
            table_off: self.at(self.m.meta.table_off),
            page_table: self.at(self.m.meta.pages),
            lane_table: self.at(self.m.meta.lanes),
        };
        g.deltanet_rows(&layer, &round, (hs.conv_in, hs.ba), (w.neg_a, w.dt_bias))?;
        g.deltanet_heads(&layer, &round, w.conv, hs.core)?;
        g.deltanet_gated_norm(hs.core, hs.z, w.norm, hs.out, (t, nv, dv), c.rms_eps)?;
        g.gemm(hs.out, w.out, 0, s.proj, (t, h, value_dim), &s.gemm)
    }

    fn reduce(&mut self) -> Result<(), GpuError> {
        let Some(group) = &self.m.collective else { return Ok(()) };
        let len = self.t * self.m.cfg.hidden_size;
        group.all_reduce_sum(self.m.scratch.proj, len).map_err(|e| GpuError::Collective(e.to_string()))
    }

    fn add(&mut self) -> Result<(), GpuError> {
        // The next norm adds it, in the same kernel (or GEMM) as it norms.
        self.pending = self.m.scratch.proj;
        Ok(())
    }

    fn logits(&mut self) -> Result<(), GpuError> {
        let (g, s, c) = (&*self.m.gpu, &self.m.scratch, &self.m.cfg);
        let h = c.hidden_size;
        let delta = std::mem::take(&mut self.pending);
        if delta != 0 {
            g.add_rows(self.res.x, delta, self.t, h)?;
        }
        let (m, meta) = (self.m, &self.m.meta);
        let page_table = self.at(meta.pages);
        // Where the model has a draft head: its own rows' states, or every row's for the head to read.
        let (norm, hidden) = match (&m.mtp, self.head) {
            (None, _) => (m.norm, None),
            (Some(_), None) => {
                let to = PageRows { at: self.at(meta.pos), table_off: self.at(meta.table_off), page_table };
                (m.norm, Some((to, 0, self.t)))
            }
            (Some(head), Some(guesses)) => {
                let to = PageRows { at: self.at(meta.guess_pos), table_off: self.at(meta.guess_table), page_table };
                (head.norm, Some((to, self.at(meta.guess_rows), guesses)))
            }
        };
        if let Some((to, rows, count)) = hidden.filter(|h| h.2 > 0) {
            g.mtp_hidden_store(&m.hidden_plane(self.cache), &to, (self.res.x, rows, count), (norm, c.rms_eps))?;
        }
        if self.n == 0 {
            return Ok(());
        }
        g.rms_norm(self.res.x, self.at(meta.rows), self.n, norm, s.normed, h, c.rms_eps)?;
        g.gemm(s.normed, self.m.lm_head, 0, s.logits, (self.n, c.vocab_size, h), &s.gemm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_folded_norm_with_a_sum_moves_the_stream_to_the_other_buffer() {
        let mut res = Residual { x: 100, spare: 200 };
        let first = res.norm(0, 7, 1e-5);
        assert_eq!((first.x, first.delta, first.x_out), (100, 0, 200));
        assert_eq!((res.x, res.spare), (100, 200), "without a delta nothing is stored, so the stream stays");
        let second = res.norm(300, 8, 1e-5);
        assert_eq!((second.x, second.delta, second.x_out, second.w), (100, 300, 200, 8));
        assert_eq!((res.x, res.spare), (200, 100), "the sum lands in the spare buffer, which now holds the stream");
        let third = res.norm(300, 9, 1e-5);
        assert_eq!((third.x, third.x_out), (200, 100));
    }
}
