//! The convolutions against naive loops, and windows and batches against one long sequence.

use super::*;

type Forward<'a> = dyn Fn(&[f32], usize, usize) -> Vec<f32> + 'a;
type Span<'a> = dyn Fn(RangeInclusive<i64>) -> RangeInclusive<i64> + 'a;
type Weights<'a> = dyn Fn(usize, usize, usize) -> f32 + 'a;

fn random(n: usize, seed: &mut u64) -> Vec<f32> {
    let mut next = || {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    (0..n).map(|_| next()).collect()
}

fn geo(kernel: usize, stride: usize, dilation: usize, padding: usize) -> Geometry {
    Geometry { kernel, stride, dilation, padding }
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()), "{what}: at {i} got {g}, want {w}");
    }
}

/// Any of the three from the definition: tap `k` of input row `t` meets output `to(t, k)` with weight `w(i, o, k)`.
fn naive(x: &[f32], dims: [usize; 4], bias: &[f32], to: &dyn Fn(i64, i64) -> Option<i64>, w: &Weights) -> Vec<f64> {
    let [c_in, c_out, kernel, t_out] = dims;
    let mut out: Vec<f64> = (0..t_out * c_out).map(|j| bias[j % c_out] as f64).collect();
    for (t, row) in x.chunks_exact(c_in).enumerate() {
        for k in 0..kernel {
            let Some(u) = to(t as i64, k as i64).filter(|u| (0..t_out as i64).contains(u)) else { continue };
            for (i, o) in (0..c_in).flat_map(|i| (0..c_out).map(move |o| (i, o))) {
                out[u as usize * c_out + o] += w(i, o, k) as f64 * row[i] as f64;
            }
        }
    }
    out
}

#[test]
fn test_kernels_match_naive_loops() {
    let (mut seed, t_in) = (1, 23);
    for (c_in, c_out, k, stride, dil, pad) in [(5, 19, 7, 1, 1, 3), (12, 33, 7, 1, 3, 9), (9, 4, 4, 2, 1, 1)] {
        let (x, w, b) = (random(t_in * c_in, &mut seed), random(c_out * c_in * k, &mut seed), random(c_out, &mut seed));
        let got = Conv1d::from_torch(&w, Some(b.clone()), c_out, c_in, geo(k, stride, dil, pad)).forward(&x, 1, t_in);
        let to = |t: i64, kk: i64| {
            Some(t + pad as i64 - kk * dil as i64).filter(|u| u % stride as i64 == 0).map(|u| u / stride as i64)
        };
        let want = naive(&x, [c_in, c_out, k, got.len() / c_out], &b, &to, &|i, o, kk| w[(o * c_in + i) * k + kk]);
        assert_close(&got, &want, "conv1d");
    }
    for (c, k, dil) in [(70, 7, 1), (8, 7, 9), (130, 3, 2)] {
        let (x, w, b) = (random(t_in * c, &mut seed), random(c * k, &mut seed), random(c, &mut seed));
        let got = DepthwiseConv1d::from_torch(&w, Some(b.clone()), c, Geometry::same(k, dil)).forward(&x, 1, t_in);
        let to = |t: i64, kk: i64| Some(t + ((k - 1) * dil / 2) as i64 - kk * dil as i64);
        let want = naive(&x, [c, c, k, t_in], &b, &to, &|i, o, kk| if i == o { w[o * k + kk] } else { 0.0 });
        assert_close(&got, &want, "depthwise");
    }
    // SNAC's upsampling shapes, then a kernel shorter than its stride, which leaves phases without taps.
    for (c_in, c_out, k, stride, pad, out_pad) in
        [(6, 20, 16, 8, 4, 0), (9, 5, 6, 3, 2, 1), (17, 3, 2, 1, 1, 1), (3, 2, 2, 3, 0, 0)]
    {
        let (x, w, b) = (random(t_in * c_in, &mut seed), random(c_in * c_out * k, &mut seed), random(c_out, &mut seed));
        let up = ConvTranspose1d::from_torch(&w, Some(b.clone()), c_in, c_out, geo(k, stride, 1, pad), out_pad);
        let got = up.forward(&x, 1, t_in);
        assert_eq!(got.len(), ((t_in - 1) * stride + k + out_pad - 2 * pad) * c_out);
        let to = |t: i64, kk: i64| Some(t * stride as i64 + kk - pad as i64);
        let want = naive(&x, [c_in, c_out, k, got.len() / c_out], &b, &to, &|i, o, kk| w[(i * c_out + o) * k + kk]);
        assert_close(&got, &want, "conv transpose");
    }
}

#[test]
fn test_input_span_is_the_first_and_last_input_read() {
    let (mut seed, t_in) = (4, 40);
    let dense = Conv1d::from_torch(&random(2 * 3 * 7, &mut seed), None, 2, 3, geo(7, 1, 3, 9));
    let dw = DepthwiseConv1d::from_torch(&random(3 * 7, &mut seed), None, 3, geo(7, 1, 1, 3));
    let up = ConvTranspose1d::from_torch(&random(3 * 3 * 6, &mut seed), None, 3, 3, geo(6, 3, 1, 2), 1);
    let layers: [(&Forward, &Span, usize); 3] = [
        (&|x, _, t| dense.forward(x, 1, t), &|r| dense.input_span(r), 2),
        (&|x, _, t| dw.forward(x, 1, t), &|r| dw.input_span(r), 3),
        (&|x, _, t| up.forward(x, 1, t), &|r| up.input_span(r), 3),
    ];
    for (forward, span, c_out) in layers {
        let base = random(t_in * 3, &mut seed);
        let y0 = forward(&base, 1, t_in);
        let mut read: Vec<Vec<i64>> = vec![Vec::new(); y0.len() / c_out];
        for pos in 0..t_in {
            let mut x = base.clone();
            x[pos * 3 + 1] += 1.0;
            let y = forward(&x, 1, t_in);
            for (t, inputs) in read.iter_mut().enumerate() {
                if (0..c_out).any(|o| y[t * c_out + o] != y0[t * c_out + o]) {
                    inputs.push(pos as i64);
                }
            }
        }
        for (t, inputs) in read.iter().enumerate() {
            let s = span(t as i64..=t as i64);
            // Near the edges a dilated kernel's end taps may fall in the padding.
            if *s.start() >= 0 && *s.end() < t_in as i64 {
                assert_eq!((inputs.first(), inputs.last()), (Some(s.start()), Some(s.end())), "output {t}");
            }
            assert!(inputs.iter().all(|p| s.contains(p)), "output {t}");
        }
    }
}

#[test]
fn test_window_and_batch_give_the_same_bits_as_one_long_sequence() {
    let (mut seed, c, t_in) = (5, 24, 64);
    let bias = Some(random(c, &mut seed));
    let dense = Conv1d::from_torch(&random(c * c * 7, &mut seed), bias.clone(), c, c, geo(7, 1, 1, 3));
    let dilated = Conv1d::from_torch(&random(c * c * 7, &mut seed), None, c, c, geo(7, 1, 3, 9));
    let dw = DepthwiseConv1d::from_torch(&random(c * 7, &mut seed), bias.clone(), c, geo(7, 1, 9, 27));
    let up = ConvTranspose1d::from_torch(&random(c * c * 8, &mut seed), bias, c, c, geo(8, 4, 1, 2), 0);
    let layers: [(&Forward, usize); 4] = [
        (&|x, b, t| dense.forward(x, b, t), 1),
        (&|x, b, t| dilated.forward(x, b, t), 1),
        (&|x, b, t| dw.forward(x, b, t), 1),
        (&|x, b, t| up.forward(x, b, t), 4),
    ];
    let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
    for (forward, rate) in layers {
        let x = random(t_in * c, &mut seed);
        let whole = forward(&x, 1, t_in);
        // Rows 30.. alone: outputs 30 rows past the cut read the same inputs in the same order.
        let window = forward(&x[30 * c..], 1, t_in - 30);
        assert!(same(&whole[60 * rate * c..], &window[30 * rate * c..]));
        let mut batch = random(3 * t_in * c, &mut seed);
        batch[t_in * c..2 * t_in * c].copy_from_slice(&x);
        assert!(same(&forward(&batch, 3, t_in)[whole.len()..2 * whole.len()], &whole));
    }
}
