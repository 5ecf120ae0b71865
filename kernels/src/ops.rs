//! Row-wise operations: each row is computed on its own, in a fixed order.

use crate::simd::{self, Tile};

/// Dot product with the same fixed reduction order as the f32 matmul.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut out = [0f32; 1];
    simd::f32_dot(a, &Tile::<1> { rows: [b], block_sums: [&[]] }, &mut out);
    out[0]
}

/// RMS-normalizes each `weight.len()`-wide row of `x` into `out`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = weight.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean_sq = dot(xr, xr) / n as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * inv);
        }
    }
}

/// RMS-normalizes each row in place.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    let mut tmp = vec![0f32; n];
    for row in x.chunks_exact_mut(n) {
        rms_norm(row, weight, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

/// `x += y`, element by element.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Adds `bias` to every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// SwiGLU: each row holds `[gate | up]`; writes `silu(gate) * up`.
pub fn swiglu(gate_up: &[f32], width: usize, out: &mut [f32]) {
    for (gu, o) in gate_up.chunks_exact(2 * width).zip(out.chunks_exact_mut(width)) {
        let (g, u) = gu.split_at(width);
        for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + (-g).exp()) * u;
        }
    }
}

/// Rotary position embedding frequencies for one head.
#[derive(Clone, Debug)]
pub struct Rope {
    pub inv_freq: Vec<f32>,
    /// Rotate adjacent pairs instead of the two halves of the head.
    pub interleaved: bool,
}

impl Rope {
    /// Rotates every `head_dim`-wide head of `x` (one row) by absolute position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        self.apply_partial(x, 2 * self.inv_freq.len(), pos);
    }

    /// Rotates the leading `2 * inv_freq.len()` dimensions of every `head_dim`-wide head of `x`; the rest pass.
    pub fn apply_partial(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let half = self.inv_freq.len();
        let (sin, cos): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|f| {
                let angle = (pos as f32 * f) as f64;
                (angle.sin() as f32, angle.cos() as f32)
            })
            .unzip();
        for head in x.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = if self.interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}

/// Index of the largest value; the lowest index wins a tie, NaNs never win, and a NaN first value is returned.
pub fn argmax(x: &[f32]) -> usize {
    const LANES: usize = 16;
    let Some(&first) = x.first().filter(|v| !v.is_nan()) else { return 0 };
    // Independent running maxima vectorize; `>` keeps NaNs out as a sequential scan does.
    let mut lanes = [first; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (best, &v) in lanes.iter_mut().zip(chunk) {
            *best = if v > *best { v } else { *best };
        }
    }
    let max = lanes.iter().chain(chunks.remainder()).fold(first, |m, &v| if v > m { v } else { m });
    // The first value equal to the maximum; signed zeros compare equal, as in a scan.
    let mut start = 0;
    for block in x.chunks(256) {
        if block.iter().fold(false, |hit, &v| hit | (v == max)) {
            return start + block.iter().position(|&v| v == max).unwrap_or(0);
        }
        start += block.len();
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequential scan `argmax` must match.
    fn argmax_scan(x: &[f32]) -> usize {
        let mut best = 0;
        for (i, v) in x.iter().enumerate() {
            if *v > x[best] {
                best = i;
            }
        }
        best
    }

    #[test]
    fn test_argmax_matches_the_sequential_scan() {
        let mut cases: Vec<Vec<f32>> = vec![
            vec![],
            vec![f32::NAN, 1.0],
            vec![-0.0, 0.0],
            vec![-1.0, 0.0, -0.0],
            vec![1.0, f32::NAN, 2.0, 2.0],
            vec![f32::NEG_INFINITY; 40],
            vec![f32::NAN; 33],
        ];
        let mut state = 0x9e3779b97f4a7c15u64;
        for k in 0..3000 {
            let len = 1 + (k * 37) % 700;
            let mut next = || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match state % 13 {
                    0 => f32::NAN,
                    1 => -0.0,
                    2 => 0.0,
                    _ => (state >> 58) as f32 - 30.0,
                }
            };
            cases.push((0..len).map(|_| next()).collect());
        }
        for x in &cases {
            assert_eq!(argmax(x), argmax_scan(x), "{x:?}");
        }
    }

    #[test]
    fn test_rms_norm_unit_rows() {
        let mut out = [0f32; 4];
        rms_norm(&[2.0, 2.0, 2.0, 2.0], &[1.0, 0.5, 1.0, 1.0], 0.0, &mut out);
        assert_eq!(out, [1.0, 0.5, 1.0, 1.0]);
    }

    #[test]
    fn test_rope_halves_and_pairs_agree_after_permutation() {
        let rope = |interleaved| Rope { inv_freq: vec![1.0, 0.1], interleaved };
        let mut halves = [1.0, 2.0, 3.0, 4.0];
        let mut pairs = [1.0, 3.0, 2.0, 4.0];
        rope(false).apply(&mut halves, 5);
        rope(true).apply(&mut pairs, 5);
        assert_eq!([halves[0], halves[2], halves[1], halves[3]], pairs);
        let mut zero = [1.0, 2.0, 3.0, 4.0];
        rope(false).apply(&mut zero, 0);
        assert_eq!(zero, [1.0, 2.0, 3.0, 4.0]);
    }
}
