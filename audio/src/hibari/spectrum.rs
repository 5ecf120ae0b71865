//! One frame's spectrum and its way back to samples: STFT of the pulses, the three branches, inverse FFT, overlap-add.

use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use super::branches::Branches;
use super::{HOP, NUM_BINS, N_FFT};
use crate::normal::normal_pair;

/// Frames that overlap one output sample: the FFT spans this many hops.
pub(super) const OVERLAP: usize = N_FFT / HOP;
/// Exponents above this are clamped before exp, so one wild bin cannot blow up the frame.
const MAX_LOG_GAIN: f32 = 7.0;

/// exp with its argument clamped at `MAX_LOG_GAIN`; NaN stays NaN.
pub(super) fn gain(log_gain: f32) -> f32 {
    (if log_gain > MAX_LOG_GAIN { MAX_LOG_GAIN } else { log_gain }).exp()
}

/// One frame of the network's outputs, NUM_BINS values each.
pub(super) struct FrameParts<'a> {
    pub lh: &'a [f32],
    pub theta: &'a [f32],
    pub ln: &'a [f32],
    pub lr: &'a [f32],
    pub phi: &'a [f32],
}

/// Buffers one window reuses for every frame it transforms.
pub(super) struct Work {
    bins: Vec<Complex32>,
    scratch: Vec<Complex32>,
    branches: Branches,
}

/// The FFT plans and windows, made once and shared by every request.
pub(super) struct Spectral {
    forward: Arc<dyn Fft<f32>>,
    inverse: Arc<dyn Fft<f32>>,
    /// Periodic Hann, the synthesis window.
    window: Vec<f32>,
    /// Hann over a quarter of N_FFT, so a unit cosine comes out of the analysis at magnitude one.
    analysis: Vec<f32>,
    squared: Vec<f32>,
}

impl Spectral {
    pub fn new() -> Spectral {
        let mut planner = FftPlanner::new();
        let window: Vec<f32> =
            (0..N_FFT).map(|n| (0.5 - 0.5 * (std::f64::consts::TAU * n as f64 / N_FFT as f64).cos()) as f32).collect();
        let analysis = window.iter().map(|w| w / (N_FFT / 4) as f32).collect();
        let squared = window.iter().map(|w| w * w).collect();
        Spectral {
            forward: planner.plan_fft_forward(N_FFT),
            inverse: planner.plan_fft_inverse(N_FFT),
            window,
            analysis,
            squared,
        }
    }

    pub fn work(&self) -> Work {
        let scratch = self.forward.get_inplace_scratch_len().max(self.inverse.get_inplace_scratch_len());
        Work {
            bins: vec![Complex32::default(); N_FFT],
            scratch: vec![Complex32::default(); scratch],
            branches: Branches::new(NUM_BINS),
        }
    }

    /// Frame `frame`'s inverse FFT times the Hann window into `out`; `pulse(n)` is pulse n of the N_FFT it analyses.
    pub fn frame(
        &self,
        pulse: impl Fn(usize) -> f32,
        parts: &FrameParts,
        noise_seed: u64,
        frame: usize,
        work: &mut Work,
        out: &mut [f32],
    ) {
        let Work { bins, scratch, branches } = work;
        for (n, bin) in bins.iter_mut().enumerate() {
            *bin = Complex32::new(pulse(n) * self.analysis[n], 0.0);
        }
        self.forward.process_with_scratch(bins, scratch);
        branches.compute(parts);
        let first_noise = frame as u64 * NUM_BINS as u64;
        for (b, bin) in bins[..NUM_BINS].iter_mut().enumerate() {
            let p = *bin;
            let (hr, hi) = (branches.harmonic_re[b], branches.harmonic_im[b]);
            let (mut re, mut im) = (p.re * hr - p.im * hi, p.re * hi + p.im * hr);
            let (zr, zi) = normal_pair(noise_seed, first_noise + b as u64);
            re += zr * branches.noise[b];
            im += zi * branches.noise[b];
            re += branches.free_re[b];
            im += branches.free_im[b];
            *bin = Complex32::new(re, im);
        }
        // A real signal's spectrum: DC and Nyquist are real, the upper half mirrors the lower.
        bins[0].im = 0.0;
        bins[N_FFT / 2].im = 0.0;
        for b in 1..N_FFT / 2 {
            bins[N_FFT - b] = bins[b].conj();
        }
        self.inverse.process_with_scratch(bins, scratch);
        let scale = (1.0 / N_FFT as f64) as f32;
        for ((o, bin), w) in out[..N_FFT].iter_mut().zip(bins.iter()).zip(&self.window) {
            *o = bin.re * scale * w;
        }
    }

    /// One hop of output: hop k of `pieces[k]`, the frame k hops earlier if any, summed over the squared window.
    pub fn overlap_add(&self, pieces: [Option<&[f32]>; OVERLAP], out: &mut Vec<f32>) {
        for j in 0..HOP {
            let (mut sum, mut weight) = (0.0f32, 0.0f32);
            for (k, piece) in pieces.iter().enumerate() {
                if let Some(piece) = piece {
                    sum += piece[k * HOP + j];
                    weight += self.squared[k * HOP + j];
                }
            }
            out.push(sum * (1.0 / weight.max(1e-11)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_gain_clamps_large_exponents_only() {
        assert_eq!(gain(9.0), 7.0f32.exp());
        assert_eq!(gain(-1.5), (-1.5f32).exp());
        assert_eq!(gain(f32::NEG_INFINITY), 0.0);
        assert!(gain(f32::NAN).is_nan());
    }

    #[test]
    fn test_squared_windows_sum_to_one_and_a_half_inside() {
        let spectral = Spectral::new();
        for j in 0..HOP {
            let sum: f32 = (0..OVERLAP).map(|k| spectral.squared[k * HOP + j]).sum();
            assert!((sum - 1.5).abs() < 1e-6, "{sum}");
        }
    }

    #[test]
    fn test_free_phase_bin_alone_gives_its_cosine() {
        let spectral = Spectral::new();
        let (silent, zero) = (vec![-1e9f32; NUM_BINS], vec![0.0f32; NUM_BINS]);
        let mut lr = silent.clone();
        lr[10] = 0.0;
        let parts = FrameParts { lh: &silent, theta: &zero, ln: &silent, lr: &lr, phi: &zero };
        let mut out = vec![0.0; N_FFT];
        spectral.frame(|_| 0.0, &parts, 1, 0, &mut spectral.work(), &mut out);
        for (n, o) in out.iter().enumerate() {
            let want = 2.0 / N_FFT as f64 * (std::f64::consts::TAU * 10.0 * n as f64 / N_FFT as f64).cos();
            assert!((*o as f64 - want * spectral.window[n] as f64).abs() < 1e-6, "sample {n}: {o} vs {want}");
        }
    }
}
