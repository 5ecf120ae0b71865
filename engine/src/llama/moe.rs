//! A mixture of experts on CPU: routing that is exact and the same for a row alone or in any batch, then only the
//! chosen experts' gated MLPs, their outputs weighted and summed in rank order.

use rayon::prelude::*;
use tensorfold_kernels::matmul::{matmul, matmul_with, Activations};
use tensorfold_kernels::ops;
use tensorfold_kernels::Weight;

/// One expert's gated MLP; gate and up stay apart so that mapped weights are not copied into one.
pub(crate) struct Expert {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// A layer's router and experts.
pub(crate) struct MoeMlp {
    /// Experts x hidden, always f32 so the routing never depends on a weight format's arithmetic.
    pub router: Weight,
    pub experts: Vec<Expert>,
    pub top_k: usize,
    /// Divide the chosen probabilities by their sum.
    pub norm_topk_prob: bool,
    /// An expert every row also runs, where the layer has one (Qwen3-Next).
    pub shared: Option<SharedExpert>,
}

/// An expert every row runs, its output scaled by the sigmoid of the row's gate logit.
pub(crate) struct SharedExpert {
    pub mlp: Expert,
    /// 1 x hidden, f32.
    pub gate: Weight,
}

/// One row's route: the chosen experts, most probable first, and the weight of each.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Softmax of the router logits in f32, the `top_k` most probable experts (of equal probabilities the lower index
/// ranks first), and their probabilities, divided by their sum in rank order when `renormalize`.
pub fn route(logits: &[f32], top_k: usize, renormalize: bool) -> Route {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let exps: Vec<f32> = logits.iter().map(|&v| (v - max).exp()).collect();
    let sum = exps.iter().fold(0f32, |s, &v| s + v);
    let probs: Vec<f32> = exps.iter().map(|&v| v / sum).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    let mut weights: Vec<f32> = order.iter().map(|&e| probs[e]).collect();
    if renormalize {
        let total = weights.iter().fold(0f32, |s, &w| s + w);
        weights.iter_mut().for_each(|w| *w /= total);
    }
    Route { experts: order, weights }
}

impl MoeMlp {
    /// Each row's route over `num_rows` rows of `x`.
    pub fn routes(&self, x: &[f32], num_rows: usize) -> Vec<Route> {
        let num_experts = self.router.rows();
        let mut logits = vec![0f32; num_rows * num_experts];
        matmul(x, num_rows, &self.router, &mut logits);
        logits.chunks_exact(num_experts).map(|row| route(row, self.top_k, self.norm_topk_prob)).collect()
    }

    /// The layer's output for `num_rows` rows of `x`: per row, its experts' MLPs weighted and added in rank order.
    /// Rows are grouped by expert for the matmuls, whose rows never depend on one another.
    pub fn forward(&self, x: &[f32], num_rows: usize, activations: Activations) -> Vec<f32> {
        let h = self.router.cols();
        let routes = self.routes(x, num_rows);
        // Each row's output of each of its ranks, filled expert by expert.
        let mut ranked = vec![0f32; num_rows * self.top_k * h];
        let mut chosen_by: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.experts.len()];
        for (row, r) in routes.iter().enumerate() {
            for (rank, &e) in r.experts.iter().enumerate() {
                chosen_by[e].push((row, rank));
            }
        }
        let active: Vec<_> = self.experts.iter().zip(&chosen_by).filter(|(_, p)| !p.is_empty()).collect();
        // The chosen experts run side by side: an expert's rows get the same bits on any thread.
        let outs: Vec<Vec<f32>> = active
            .par_iter()
            .map(|(expert, picks)| {
                let rows: Vec<f32> =
                    picks.iter().flat_map(|&(row, _)| x[row * h..(row + 1) * h].iter().copied()).collect();
                expert.forward(&rows, picks.len(), activations)
            })
            .collect();
        for ((_, picks), out) in active.iter().zip(&outs) {
            for (&(row, rank), y) in picks.iter().zip(out.chunks_exact(h)) {
                let at = (row * self.top_k + rank) * h;
                ranked[at..at + h].copy_from_slice(y);
            }
        }
        let mut delta = vec![0f32; num_rows * h];
        for ((d, r), ys) in delta.chunks_exact_mut(h).zip(&routes).zip(ranked.chunks_exact(self.top_k * h)) {
            for (&w, y) in r.weights.iter().zip(ys.chunks_exact(h)) {
                d.iter_mut().zip(y).for_each(|(d, &y)| *d += w * y);
            }
        }
        if let Some(shared) = &self.shared {
            // The shared expert's share comes last, after the routed experts' sum.
            let out = shared.mlp.forward(x, num_rows, activations);
            let mut logits = vec![0f32; num_rows];
            matmul(x, num_rows, &shared.gate, &mut logits);
            for ((d, y), &g) in delta.chunks_exact_mut(h).zip(out.chunks_exact(h)).zip(&logits) {
                let w = 1.0 / (1.0 + (-g).exp());
                d.iter_mut().zip(y).for_each(|(d, &y)| *d += w * y);
            }
        }
        delta
    }

    /// Bytes held by the router and the experts.
    pub fn num_bytes(&self) -> usize {
        let expert = |e: &Expert| e.gate.num_bytes() + e.up.num_bytes() + e.down.num_bytes();
        let shared = self.shared.as_ref().map_or(0, |s| expert(&s.mlp) + s.gate.num_bytes());
        self.router.num_bytes() + self.experts.iter().map(expert).sum::<usize>() + shared
    }
}

impl Expert {
    /// silu(x Wgate) * x Wup, then Wdown, for `num_rows` rows of `x`.
    fn forward(&self, x: &[f32], num_rows: usize, activations: Activations) -> Vec<f32> {
        let f = self.down.cols();
        let (mut gate, mut up) = (vec![0f32; num_rows * f], vec![0f32; num_rows * f]);
        matmul_with(x, num_rows, &self.gate, &mut gate, activations);
        matmul_with(x, num_rows, &self.up, &mut up, activations);
        let gate_up: Vec<f32> =
            gate.chunks_exact(f).zip(up.chunks_exact(f)).flat_map(|(g, u)| [g, u].concat()).collect();
        let mut act = vec![0f32; num_rows * f];
        ops::swiglu(&gate_up, f, &mut act);
        let mut out = vec![0f32; num_rows * self.down.rows()];
        matmul_with(&act, num_rows, &self.down, &mut out, activations);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in (-scale, scale) from a seeded linear congruential sequence.
    fn values(seed: &mut u64, len: usize, scale: f32) -> Vec<f32> {
        (0..len)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn matrix(seed: &mut u64, rows: usize, cols: usize) -> Weight {
        Weight::F32 { rows, cols, data: values(seed, rows * cols, 0.5) }
    }

    /// 12 experts of width 6 over hidden 8, top 3.
    fn moe(norm_topk_prob: bool) -> MoeMlp {
        let seed = &mut 3;
        let router = matrix(seed, 12, 8);
        let expert =
            |seed: &mut u64| Expert { gate: matrix(seed, 6, 8), up: matrix(seed, 6, 8), down: matrix(seed, 8, 6) };
        let experts = (0..12).map(|_| expert(seed)).collect();
        MoeMlp { router, experts, top_k: 3, norm_topk_prob, shared: None }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn test_route_lowest_index_wins_ties() {
        let r = route(&[1.0, 3.0, 0.5, 3.0, 3.0, 2.0], 2, false);
        assert_eq!(r.experts, [1, 3]);
        let r = route(&[0.0; 5], 3, true);
        assert_eq!(r.experts, [0, 1, 2]);
        assert!(r.weights.iter().all(|&w| w == r.weights[0] && (w - 1.0 / 3.0).abs() < 1e-6));
    }

    #[test]
    fn test_route_is_the_f32_softmax_of_the_chosen_experts() {
        let logits = [0.3f32, -1.2, 2.5, 0.9, 2.4, -0.1];
        let exps: Vec<f64> = logits.iter().map(|&v| (v as f64).exp()).collect();
        let total: f64 = exps.iter().sum();
        let r = route(&logits, 3, false);
        assert_eq!(r.experts, [2, 4, 3]);
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            assert!((w as f64 - exps[e] / total).abs() < 1e-6, "expert {e}: {w}");
        }
        let renormalized = route(&logits, 3, true);
        let chosen: f64 = r.experts.iter().map(|&e| exps[e]).sum();
        for (&e, &w) in renormalized.experts.iter().zip(&renormalized.weights) {
            assert!((w as f64 - exps[e] / chosen).abs() < 1e-6, "expert {e}: {w}");
        }
        let sum = renormalized.weights.iter().fold(0f32, |s, w| s + w);
        assert!((sum - 1.0).abs() < 1e-6 && renormalized.weights[0] > r.weights[0]);
    }

    #[test]
    fn test_forward_is_the_weighted_sum_of_the_chosen_experts() {
        let m = moe(true);
        let x = values(&mut 11, 5 * 8, 1.0);
        let got = m.forward(&x, 5, Activations::F32);
        for (row, r) in m.routes(&x, 5).iter().enumerate() {
            let xr = &x[row * 8..(row + 1) * 8];
            let mut want = [0f64; 8];
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                let (gate, up, down) =
                    (m.experts[e].gate.to_f32(), m.experts[e].up.to_f32(), m.experts[e].down.to_f32());
                let dot = |w: &[f32]| w.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>();
                let act: Vec<f64> = (0..6)
                    .map(|j| {
                        let (g, u) = (dot(&gate[j * 8..(j + 1) * 8]), dot(&up[j * 8..(j + 1) * 8]));
                        g / (1.0 + (-g).exp()) * u
                    })
                    .collect();
                for (i, out) in want.iter_mut().enumerate() {
                    *out += w as f64 * (0..6).map(|j| down[i * 6 + j] as f64 * act[j]).sum::<f64>();
                }
            }
            for (i, w) in want.iter().enumerate() {
                assert!((got[row * 8 + i] as f64 - w).abs() < 1e-5, "row {row} column {i}");
            }
        }
    }

    #[test]
    fn test_a_row_alone_gives_the_bits_it_gives_in_a_batch() {
        for norm in [true, false] {
            let m = moe(norm);
            let x = values(&mut 5, 9 * 8, 1.0);
            let routes = m.routes(&x, 9);
            let distinct: std::collections::HashSet<&[usize]> = routes.iter().map(|r| &r.experts[..]).collect();
            assert!(distinct.len() > 3, "the rows should not all choose the same experts");
            let batch = m.forward(&x, 9, Activations::F32);
            for row in 0..9 {
                let alone = m.forward(&x[row * 8..(row + 1) * 8], 1, Activations::F32);
                assert_eq!(bits(&alone), bits(&batch[row * 8..(row + 1) * 8]), "row {row}");
                assert_eq!(m.routes(&x[row * 8..(row + 1) * 8], 1)[0], routes[row]);
            }
            let tail = m.forward(&x[4 * 8..], 5, Activations::F32);
            assert_eq!(bits(&tail), bits(&batch[4 * 8..]));
        }
    }
}
