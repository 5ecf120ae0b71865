//! Gated DeltaNet linear attention on CPU (Qwen3-Next's layers between its attention layers).
//!
//! The arithmetic is one: a causal depthwise convolution over each position's q, k and v, then the delta rule's
//! recurrence one position at a time, in absolute-position order. A page keeps its positions' convolution inputs,
//! decays and betas, and the state after its last position; a step that starts inside a page replays the page's
//! earlier positions from the previous page's state. So a position's state and output are the same bits whether its
//! prompt came whole, in any chunks, token by token, from the prefix cache, or beside other lanes.

use rayon::prelude::*;
use tensorfold_kernels::matmul::{matmul_with, Activations};
use tensorfold_kernels::ops;
use tensorfold_kernels::Weight;

use crate::boundary::{KvPool, LaneStep};
use crate::llama::config::HybridConfig;

/// One Gated DeltaNet layer's weights.
pub(crate) struct DeltaNet {
    /// Every q, every k, then every v: the convolution's channels in order.
    pub qkv: Weight,
    /// The output gate of every value head.
    pub z: Weight,
    /// Beta's and the decay's inputs of each key head's group.
    pub ba: Weight,
    /// The convolution: channels x taps, the last tap on the current position.
    pub conv: Vec<f32>,
    /// -exp(A_log) of each value head: the decay's rate.
    pub neg_a: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// The gated RMSNorm's weight over a value head.
    pub norm: Vec<f32>,
    pub out: Weight,
}

/// One value head's outputs for its lane's positions, and the state of each page the step ended (page, state).
type HeadResult = (Vec<f32>, Vec<(u32, Vec<f32>)>);

/// Where a linear layer's rows and state sit in a page's state.
#[derive(Clone, Copy)]
struct Slots {
    base: usize,
    page_tokens: usize,
    row_width: usize,
    head_state: usize,
}

impl Slots {
    fn row(&self, pos: usize) -> usize {
        self.base + (pos % self.page_tokens) * self.row_width
    }

    fn state(&self, head: usize) -> usize {
        self.base + self.page_tokens * self.row_width + head * self.head_state
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Softplus as torch computes it: linear past 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Scales `x` to unit length (with torch's epsilon inside the root), then by `scale`.
fn l2_normalize(x: &mut [f32], scale: f32) {
    let inv = 1.0 / (x.iter().fold(0f32, |s, v| s + v * v) + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v = *v * inv * scale);
}

/// `out[j] = sum over i of state[i][j] * x[i]`, `i` ascending.
fn state_times(state: &[f32], x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for (row, &xi) in state.chunks_exact(out.len()).zip(x) {
        out.iter_mut().zip(row).for_each(|(o, &s)| *o += s * xi);
    }
}

impl DeltaNet {
    /// The layer's output for a round: `normed` holds each lane's rows in lane order; `layer` is this layer's index
    /// among the linear layers. Writes the rows' convolution inputs, decays and betas, and the state of every page
    /// whose last position the round computes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        hc: &HybridConfig,
        layer: usize,
        eps: f32,
        pool: &mut KvPool,
        lanes: &[LaneStep],
        normed: &[f32],
        activations: Activations,
    ) -> Vec<f32> {
        let (nv, dk, dv) = (hc.num_v_heads, hc.k_head_dim, hc.v_head_dim);
        let num_rows = lanes.iter().map(|l| l.tokens.len()).sum::<usize>();
        let value_dim = hc.value_dim();
        let conv_dim = hc.conv_dim();
        let (mut qkv, mut z) = (vec![0f32; num_rows * conv_dim], vec![0f32; num_rows * value_dim]);
        let mut ba = vec![0f32; num_rows * 2 * nv];
        matmul_with(normed, num_rows, &self.qkv, &mut qkv, activations);
        matmul_with(normed, num_rows, &self.z, &mut z, activations);
        matmul_with(normed, num_rows, &self.ba, &mut ba, activations);
        let page_tokens = pool.layout().page_tokens;
        let slots = Slots {
            base: layer * hc.page_state_per_layer(page_tokens),
            page_tokens,
            row_width: hc.row_width(),
            head_state: dk * dv,
        };
        let mut row = vec![0f32; hc.row_width()];
        let positions = lanes.iter().flat_map(|l| (0..l.tokens.len()).map(move |i| (l.start_pos + i, l.pages)));
        for (r, (pos, pages)) in positions.enumerate() {
            row[..conv_dim].copy_from_slice(&qkv[r * conv_dim..(r + 1) * conv_dim]);
            self.gates(hc, &ba[r * 2 * nv..(r + 1) * 2 * nv], &mut row[conv_dim..]);
            let at = slots.row(pos);
            pool.state_mut(pages[pos / page_tokens])[at..at + row.len()].copy_from_slice(&row);
        }
        // Each lane's value heads run their recurrences side by side; a head's arithmetic is its own.
        let mut starts = Vec::with_capacity(lanes.len());
        lanes.iter().fold(0, |at, l| {
            starts.push(at);
            at + l.tokens.len()
        });
        let tasks: Vec<(usize, usize)> = (0..lanes.len()).flat_map(|l| (0..nv).map(move |h| (l, h))).collect();
        let pool_ref = &*pool;
        let results: Vec<HeadResult> =
            tasks.par_iter().map(|&(l, h)| self.head(hc, slots, pool_ref, &lanes[l], h)).collect();
        let mut core = vec![0f32; num_rows * value_dim];
        for (&(l, h), (outs, states)) in tasks.iter().zip(results) {
            for (i, o) in outs.chunks_exact(dv).enumerate() {
                core[(starts[l] + i) * value_dim + h * dv..][..dv].copy_from_slice(o);
            }
            for (page, state) in states {
                let at = slots.state(h);
                pool.state_mut(page)[at..at + state.len()].copy_from_slice(&state);
            }
        }
        // The gated norm: each head's output normalized, then scaled by silu of its gate.
        let mut normed_core = vec![0f32; core.len()];
        ops::rms_norm(&core, &self.norm, eps, &mut normed_core);
        normed_core.iter_mut().zip(&z).for_each(|(o, &g)| *o *= silu(g));
        let mut delta = vec![0f32; num_rows * self.out.rows()];
        matmul_with(&normed_core, num_rows, &self.out, &mut delta, activations);
        delta
    }

    /// One position's decay and beta of each value head (`out`: decays, then betas), from its `ba` projection,
    /// whose rows come in each key head's group as betas, then decay inputs.
    fn gates(&self, hc: &HybridConfig, ba: &[f32], out: &mut [f32]) {
        let (nv, ratio) = (hc.num_v_heads, hc.num_v_heads / hc.num_k_heads);
        for (g, part) in ba.chunks_exact(2 * ratio).enumerate() {
            for r in 0..ratio {
                let h = g * ratio + r;
                let (b, a) = (part[r], part[ratio + r]);
                out[h] = self.neg_a[h] * softplus(a + self.dt_bias[h]);
                out[nv + h] = 1.0 / (1.0 + (-b).exp());
            }
        }
    }

    /// Value head `h` of one lane: its outputs for the lane's positions, and the state of each page it ends.
    fn head(&self, hc: &HybridConfig, slots: Slots, pool: &KvPool, lane: &LaneStep, h: usize) -> HeadResult {
        let (dk, dv, taps) = (hc.k_head_dim, hc.v_head_dim, hc.conv_kernel);
        let kh = h / (hc.num_v_heads / hc.num_k_heads);
        let key_dim = hc.num_k_heads * dk;
        let conv_dim = hc.conv_dim();
        // Channels of this head's q, k and v in a row.
        let channels = [(kh * dk, dk), (key_dim + kh * dk, dk), (2 * key_dim + h * dv, dv)];
        let p = slots.page_tokens;
        let (start, end) = (lane.start_pos, lane.start_pos + lane.tokens.len());
        let first = start / p * p;
        let mut state = match first {
            0 => vec![0f32; dk * dv],
            _ => {
                let at = slots.state(h);
                pool.state(lane.pages[first / p - 1])[at..at + dk * dv].to_vec()
            }
        };
        let row_at = |t: usize| {
            let at = slots.row(t);
            &pool.state(lane.pages[t / p])[at..at + hc.row_width()]
        };
        let (mut q, mut k, mut v) = (vec![0f32; dk], vec![0f32; dk], vec![0f32; dv]);
        let (mut kv, mut outs, mut ends) = (vec![0f32; dv], vec![0f32; (end - start) * dv], Vec::new());
        for t in first..end {
            // The convolution over the taps that exist, oldest first, then silu.
            for (x, &(c0, n)) in [&mut q, &mut k, &mut v].into_iter().zip(&channels) {
                x.fill(0.0);
                for tap in 0..taps {
                    let Some(src) = (t + tap + 1).checked_sub(taps) else { continue };
                    let input = &row_at(src)[c0..c0 + n];
                    for (c, (xc, &u)) in x.iter_mut().zip(input).enumerate() {
                        *xc += self.conv[(c0 + c) * taps + tap] * u;
                    }
                }
                x.iter_mut().for_each(|xc| *xc = silu(*xc));
            }
            l2_normalize(&mut q, 1.0 / (dk as f32).sqrt());
            l2_normalize(&mut k, 1.0);
            let gates = &row_at(t)[conv_dim..];
            let (decay, beta) = (gates[h].exp(), gates[hc.num_v_heads + h]);
            // The delta rule: decay the state, then move its answer for k toward v by beta.
            state.iter_mut().for_each(|s| *s *= decay);
            state_times(&state, &k, &mut kv);
            kv.iter_mut().zip(&v).for_each(|(m, &vj)| *m = (vj - *m) * beta);
            for (srow, &ki) in state.chunks_exact_mut(dv).zip(&k) {
                srow.iter_mut().zip(&kv).for_each(|(s, &d)| *s += ki * d);
            }
            if t >= start {
                state_times(&state, &q, &mut outs[(t - start) * dv..(t - start + 1) * dv]);
                if t % p == p - 1 {
                    ends.push((lane.pages[t / p], state.clone()));
                }
            }
        }
        (outs, ends)
    }
}
