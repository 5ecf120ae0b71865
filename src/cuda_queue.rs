//! The kernels of one round, queued on the GPU's stream: embedding, the layers, the final norm and logits.

use tensorfold_kernels::cuda::{AttentionArgs, DevPtr, Gpu, GpuError, NormIn, QkvArgs};

use super::{Caches, CudaLlama, SPLIT_BLOCKS, SPLIT_ROWS};

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

impl CudaLlama {
    /// Queues the kernels of a round of `t` rows whose tables are uploaded, with logits for `n` of them;
    /// `fuse_rope` (only where every lane has one token) does RoPE and the cache write inside attention.
    /// Rounds of few rows fold each norm into the GEMM that reads it (`Gpu::folds_norm`): the same bits.
    pub(super) fn queue(
        &self,
        cache: &Caches,
        t: usize,
        n: usize,
        fuse_rope: bool,
        fold: bool,
    ) -> Result<(), GpuError> {
        let (c, s, g, m) = (&self.cfg, &self.scratch, &*self.gpu, self.meta);
        let (kcache, vcache, pt, page_stride) = (cache.k, cache.v, cache.page_tokens, cache.page_stride);
        let kv_dim = c.num_kv_heads * c.head_dim;
        let at = |off: usize| s.meta + off as u64;
        let (h, f, d, eps) = (c.hidden_size, c.intermediate_size, c.head_dim, c.rms_eps);
        let (q_dim, width) = (c.num_heads * d, (c.num_heads + 2 * c.num_kv_heads) * d);
        let fold = fold && Gpu::folds_norm(t, h);
        let swiglu = Gpu::fuses_swiglu(t, 2 * f, h);
        let mut res = Residual { x: s.x, spare: s.x_spare };
        g.begin_round(t);
        g.embed_rows(self.embed, at(m.tokens), s.x, t, h)?;
        if !fold {
            g.rms_norm(s.x, 0, t, self.layers[0].input_norm, s.normed, h, eps)?;
        }
        for (li, l) in self.layers.iter().enumerate() {
            let layer_off = (li * pt * kv_dim) as u64;
            if fold {
                // The previous layer's down projection joins the stream here.
                let delta = if li == 0 { 0 } else { s.proj };
                g.gemm_norm(&res.norm(delta, l.input_norm, eps), l.qkv, l.qkv_bias, s.qkv, 0, t, width, h)?;
            } else {
                g.gemm(s.normed, l.qkv, l.qkv_bias, s.qkv, t, width, h)?;
            }
            let rope = QkvArgs {
                qkv: s.qkv,
                pos: at(m.pos),
                kv_off: at(m.kv_off),
                inv_freq: self.inv_freq,
                q_norm: l.q_norm,
                k_norm: l.k_norm,
                eps,
                kcache,
                vcache,
                layer_off,
                rows: t,
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: d,
                interleaved: c.rope_interleaved,
            };
            let attention = AttentionArgs {
                qkv: s.qkv,
                pos: at(m.pos),
                page_table: at(m.pages),
                table_off: at(m.table_off),
                kcache,
                vcache,
                out: s.attn,
                rows: t,
                num_heads: c.num_heads,
                num_kv_heads: c.num_kv_heads,
                head_dim: d,
                page_tokens: pt,
                page_stride,
                layer_off,
                scale: 1.0 / (d as f32).sqrt(),
                partial: if t <= SPLIT_ROWS { s.partial } else { 0 },
                tickets: s.tickets,
                nsplit: s.nsplit,
                splits: SPLIT_BLOCKS,
            };
            // A decode round may fold RoPE and the cache write into the attention kernel (TENSORFOLD_FUSE_ROPE=1).
            if fuse_rope {
                g.paged_attention(&attention, Some(&rope))?;
            } else {
                g.qkv_rope_store(&rope)?;
                g.paged_attention(&attention, None)?;
            }
            g.gemm(s.attn, l.o, l.o_bias, s.proj, t, h, q_dim)?;
            let (out, act) = if swiglu { (0, s.act) } else { (s.gate_up, 0) };
            if fold {
                g.gemm_norm(&res.norm(s.proj, l.post_norm, eps), l.gate_up, 0, out, act, t, 2 * f, h)?;
            } else {
                g.add_rms_norm(s.x, s.proj, l.post_norm, s.normed, t, h, eps)?;
                match swiglu {
                    true => g.gemm_swiglu(s.normed, l.gate_up, s.act, t, 2 * f, h)?,
                    false => g.gemm(s.normed, l.gate_up, 0, s.gate_up, t, 2 * f, h)?,
                }
            }
            if !swiglu {
                g.swiglu(s.gate_up, s.act, t, f)?;
            }
            g.gemm(s.act, l.down, 0, s.proj, t, h, f)?;
            match self.layers.get(li + 1) {
                Some(next) if !fold => g.add_rms_norm(s.x, s.proj, next.input_norm, s.normed, t, h, eps)?,
                Some(_) => {}
                None => g.add_rows(res.x, s.proj, t, h)?,
            }
        }
        if n > 0 {
            g.rms_norm(res.x, at(m.rows), n, self.norm, s.normed, h, eps)?;
            g.gemm(s.normed, self.lm_head, 0, s.logits, n, c.vocab_size, h)?;
        }
        Ok(())
    }
}
