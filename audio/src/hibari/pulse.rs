//! The band-limited pulse train: F0 interpolated to samples, a cumulative phase, and the Dirichlet kernel.

use super::{HOP, SAMPLE_RATE};

/// Samples whose interpolated frequency is not above this are unvoiced.
const VOICED_HZ: f32 = 40.0;
/// Every harmonic below this frequency sounds at unit amplitude.
const MAX_HARMONIC_HZ: f32 = 11000.0;
/// Where 2·sin(t/2) is this small the kernel takes its limit, the harmonic count plus one half.
const NEAR_PULSE: f32 = 2e-3;
/// F0 above Nyquist has no harmonic to play; clamping keeps the phase sum finite.
const MAX_F0_HZ: f32 = SAMPLE_RATE as f32 / 2.0;

/// The summed frequency of a stream's samples before frame `frame()`, added in f64 sample by sample as one pass does.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PulsePhase {
    pub(super) frame: usize,
    pub(super) sum: f64,
}

impl PulsePhase {
    /// The phase at the first sample of a stream.
    pub fn start() -> PulsePhase {
        PulsePhase::default()
    }

    /// The frame whose first sample this phase is for.
    pub fn frame(&self) -> usize {
        self.frame
    }
}

/// F0 per frame for a window whose first value is frame `first`; reads past either end take the end value.
pub(super) struct F0Track<'a> {
    pub values: &'a [f32],
    pub first: usize,
}

impl F0Track<'_> {
    fn at(&self, frame: isize) -> f32 {
        let i = (frame - self.first as isize).clamp(0, self.values.len() as isize - 1) as usize;
        let f0 = self.values[i];
        if f0.is_finite() {
            f0.min(MAX_F0_HZ)
        } else {
            0.0
        }
    }
}

/// Linear interpolation of F0 to samples (align_corners=False): sample j of a frame lies at k + (j + 0.5) / hop - 0.5.
pub(super) struct Interpolation {
    /// Weight of the later of the two frames a sample lies between.
    later: Vec<f32>,
    earlier: Vec<f32>,
}

impl Interpolation {
    pub fn new() -> Interpolation {
        let later: Vec<f32> = (0..HOP).map(|j| ((j as f64 + 0.5) / HOP as f64 - 0.5).rem_euclid(1.0) as f32).collect();
        let earlier = later.iter().map(|u| 1.0 - u).collect();
        Interpolation { later, earlier }
    }

    /// The frequency of sample `j` of frame `frame`, from that frame and the neighbour on the sample's side.
    fn frequency(&self, f0: &F0Track, frame: usize, j: usize) -> f32 {
        let k = frame as isize;
        let (a, b) = if j < HOP / 2 { (f0.at(k - 1), f0.at(k)) } else { (f0.at(k), f0.at(k + 1)) };
        a * self.earlier[j] + b * self.later[j]
    }

    /// Moves `phase` to the start of frame `to` without making samples.
    pub fn advance(&self, f0: &F0Track, phase: &mut PulsePhase, to: usize) {
        for frame in phase.frame..to {
            for j in 0..HOP {
                phase.sum += self.frequency(f0, frame, j).max(VOICED_HZ) as f64;
            }
        }
        phase.frame = phase.frame.max(to);
    }

    /// Writes one frame of pulses, the frame `phase` stands at, into `out` and moves `phase` past it.
    pub fn frame(&self, f0: &F0Track, phase: &mut PulsePhase, out: &mut [f32]) {
        for (j, sample) in out[..HOP].iter_mut().enumerate() {
            let f = self.frequency(f0, phase.frame, j);
            let voiced = f > VOICED_HZ;
            let f = f.max(VOICED_HZ);
            phase.sum += f as f64;
            *sample = if voiced { pulse(f, phase.sum) } else { 0.0 };
        }
        phase.frame += 1;
    }
}

/// The sum of the cosines of every harmonic of `f` below the limit, at the phase that `sum` cycles·SR give.
fn pulse(f: f32, sum: f64) -> f32 {
    let cycles = sum * (1.0 / SAMPLE_RATE as f64);
    let t = (cycles.fract() * std::f64::consts::TAU) as f32;
    let harmonics = (MAX_HARMONIC_HZ / f).floor() + 0.5;
    let s = (t * 0.5).sin() * 2.0;
    let kernel = if s.abs() <= NEAR_PULSE { harmonics } else { (harmonics * t).sin() / s };
    kernel - 0.5
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pulses(f0: &[f32]) -> Vec<f32> {
        let (interp, track) = (Interpolation::new(), F0Track { values: f0, first: 0 });
        let mut phase = PulsePhase::start();
        let mut out = vec![0.0; f0.len() * HOP];
        for chunk in out.chunks_mut(HOP) {
            interp.frame(&track, &mut phase, chunk);
        }
        out
    }

    #[test]
    fn test_steady_f0_gives_one_peak_per_period() {
        let out = pulses(&[200.0; 8]);
        // 200 Hz is a 120-sample period, and sample n's phase already counts sample n itself.
        let tall: Vec<usize> = (0..out.len()).filter(|&i| out[i] > 20.0).collect();
        assert_eq!(tall, (1..=20).map(|p| 120 * p - 1).collect::<Vec<_>>());
        assert_eq!(out[119], (11000.0f32 / 200.0).floor());
    }

    #[test]
    fn test_unvoiced_frames_are_silent_and_nan_reads_as_unvoiced() {
        let out = pulses(&[0.0, 30.0, f32::NAN, 0.0]);
        assert!(out.iter().all(|s| *s == 0.0));
    }

    #[test]
    fn test_advance_matches_making_the_samples() {
        let f0 = [90.0, 120.0, 0.0, 250.0, 260.0];
        let (interp, track) = (Interpolation::new(), F0Track { values: &f0, first: 0 });
        let (mut made, mut skipped) = (PulsePhase::start(), PulsePhase::start());
        let mut out = vec![0.0; HOP];
        for _ in 0..4 {
            interp.frame(&track, &mut made, &mut out);
        }
        interp.advance(&track, &mut skipped, 4);
        assert_eq!(made, skipped);
    }
}
