//! Hibari's signal stage: per frame exp(lh)·e^{iπ·tanh θ}·STFT(pulses) + exp(ln)·Z + exp(lr)·e^{iφ}, then inverse STFT.

mod branches;
mod pulse;
mod spectrum;
mod stream;

use std::ops::Range;

use rayon::prelude::*;

pub use pulse::PulsePhase;
pub use stream::VocoderStream;

use crate::error::CodecError;
use pulse::{F0Track, Interpolation};
use spectrum::{FrameParts, Spectral, OVERLAP};

pub const SAMPLE_RATE: u32 = 24_000;
/// Samples per frame (12.5 ms).
pub const HOP: usize = 300;
pub const N_FFT: usize = 1200;
/// Frequency bins per frame, N_FFT / 2 + 1.
pub const NUM_BINS: usize = N_FFT / 2 + 1;
/// Context frames a window needs each side (none past an end): hop k reads frames k-1..=k+2, pulses k±3, F0 k±4.
pub const CONTEXT_FRAMES: usize = 4;
/// Hops from a frame's centre to either end of its FFT.
const HALF_FFT_HOPS: usize = N_FFT / 2 / HOP;
/// Frames of pulse train a window makes each side of the frames it keeps.
const PULSE_LEAD: usize = OVERLAP - 1;

/// The network's outputs for `num_frames()` frames, frame-major: `lh[k * NUM_BINS + b]` is bin b of frame k.
#[derive(Clone, Copy, Debug)]
pub struct Frames<'a> {
    /// Log magnitude of the harmonic branch.
    pub lh: &'a [f32],
    /// The harmonic branch's phase shift, before tanh and π.
    pub theta: &'a [f32],
    /// Log magnitude of the noise branch.
    pub ln: &'a [f32],
    /// Log magnitude of the free-phase branch.
    pub lr: &'a [f32],
    /// The free-phase branch's phase.
    pub phi: &'a [f32],
    /// Hz, one per frame; unvoiced below 40, read as 0 where not finite and as Nyquist above it.
    pub f0: &'a [f32],
}

impl<'a> Frames<'a> {
    pub fn num_frames(&self) -> usize {
        self.f0.len()
    }

    /// Frames `range` of these, without copying.
    pub fn slice(&self, range: Range<usize>) -> Frames<'a> {
        let bins = range.start * NUM_BINS..range.end * NUM_BINS;
        Frames {
            lh: &self.lh[bins.clone()],
            theta: &self.theta[bins.clone()],
            ln: &self.ln[bins.clone()],
            lr: &self.lr[bins.clone()],
            phi: &self.phi[bins],
            f0: &self.f0[range],
        }
    }

    /// The frame count, once every part holds NUM_BINS values per frame.
    fn check(&self) -> Result<usize, CodecError> {
        let num_frames = self.num_frames();
        let parts = [("lh", self.lh), ("theta", self.theta), ("ln", self.ln), ("lr", self.lr), ("phi", self.phi)];
        for (name, part) in parts {
            if part.len() != num_frames * NUM_BINS {
                let want = num_frames * NUM_BINS;
                return Err(CodecError::Frames(format!(
                    "{name} holds {} values; {num_frames} frames need {want}",
                    part.len()
                )));
            }
        }
        Ok(num_frames)
    }

    fn parts(&self, frame: usize) -> FrameParts<'a> {
        let bins = frame * NUM_BINS..(frame + 1) * NUM_BINS;
        FrameParts {
            lh: &self.lh[bins.clone()],
            theta: &self.theta[bins.clone()],
            ln: &self.ln[bins.clone()],
            lr: &self.lr[bins.clone()],
            phi: &self.phi[bins],
        }
    }
}

/// Samples of the frames a window kept, and the pulse phase the window that keeps the following frames needs.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowAudio {
    pub samples: Vec<f32>,
    pub next_phase: PulsePhase,
}

/// The signal stage, with its FFT plans made once; one `Vocoder` serves every request.
pub struct Vocoder {
    spectral: Spectral,
    interpolation: Interpolation,
}

impl Default for Vocoder {
    fn default() -> Self {
        Vocoder::new()
    }
}

impl Vocoder {
    pub fn new() -> Vocoder {
        Vocoder { spectral: Spectral::new(), interpolation: Interpolation::new() }
    }

    /// Leading frames whose samples no later frame can change, once `num_frames` frames are known.
    pub fn ready_frames(&self, num_frames: usize, finished: bool) -> usize {
        match finished {
            true => num_frames,
            false => num_frames.saturating_sub(CONTEXT_FRAMES),
        }
    }

    /// PCM for all of `frames`, `HOP` samples per frame; Z comes from (noise_seed, frame, bin) alone.
    pub fn synthesize(&self, frames: &Frames, noise_seed: u64) -> Result<Vec<f32>, CodecError> {
        let keep = 0..frames.num_frames();
        Ok(self.synthesize_window(frames, 0, keep, noise_seed, true, PulsePhase::start())?.samples)
    }

    /// PCM for frames `keep` of `window` (stream frames from `first_frame`), as one pass over the stream gives it.
    ///
    /// Needs `CONTEXT_FRAMES` frames each side of `keep` unless at frame 0 or `finished` (the window holds the
    /// last frame), and as `phase` the previous window's `next_phase` or `PulsePhase::start()`.
    pub fn synthesize_window(
        &self,
        window: &Frames,
        first_frame: usize,
        keep: Range<usize>,
        noise_seed: u64,
        finished: bool,
        phase: PulsePhase,
    ) -> Result<WindowAudio, CodecError> {
        let num_frames = window.check()?;
        let plan = Plan::new(num_frames, first_frame, keep, finished, phase)?;
        if plan.keep.is_empty() {
            return Ok(WindowAudio { samples: Vec::new(), next_phase: phase });
        }
        let f0 = F0Track { values: window.f0, first: first_frame };
        let mut phase = phase;
        self.interpolation.advance(&f0, &mut phase, plan.pulses.start);
        let mut pulses = vec![0.0f32; plan.pulses.len() * HOP];
        let mut next_phase = phase;
        for chunk in pulses.chunks_mut(HOP) {
            if phase.frame == plan.next_phase_frame {
                next_phase = phase;
            }
            self.interpolation.frame(&f0, &mut phase, chunk);
        }
        let total_samples = plan.total.map(|t| t * HOP);
        let pulse_at = |sample: isize| pulses[reflect(sample, total_samples) - plan.pulses.start * HOP];
        let mut spectra = vec![0.0f32; plan.spectra.len() * N_FFT];
        // Frames are independent and each is computed the same way on any thread.
        spectra.par_chunks_mut(N_FFT).enumerate().for_each_init(
            || self.spectral.work(),
            |work, (i, out)| {
                let frame = plan.spectra.start + i;
                let start = (frame * HOP) as isize - (N_FFT / 2) as isize;
                let parts = window.parts(frame - first_frame);
                self.spectral.frame(|n| pulse_at(start + n as isize), &parts, noise_seed, frame, work, out);
            },
        );
        let mut samples = Vec::with_capacity(plan.keep.len() * HOP);
        for frame in plan.keep.clone() {
            // Output starts half an FFT into the first frame, so hop k of frame + HALF_FFT_HOPS - k lands here.
            let pieces = std::array::from_fn(|k| {
                let source = (frame + HALF_FFT_HOPS).checked_sub(k).filter(|f| plan.total.is_none_or(|t| *f < t))?;
                let at = (source - plan.spectra.start) * N_FFT;
                Some(&spectra[at..at + N_FFT])
            });
            self.spectral.overlap_add(pieces, &mut samples);
        }
        if phase.frame == plan.next_phase_frame {
            next_phase = phase;
        }
        Ok(WindowAudio { samples, next_phase })
    }
}

/// Which frames, in absolute numbers, one window makes pulses for, analyses and keeps.
struct Plan {
    keep: Range<usize>,
    pulses: Range<usize>,
    spectra: Range<usize>,
    /// The stream's length, known once the window holds its last frame.
    total: Option<usize>,
    next_phase_frame: usize,
}

impl Plan {
    fn new(
        num_frames: usize,
        first: usize,
        keep: Range<usize>,
        finished: bool,
        phase: PulsePhase,
    ) -> Result<Plan, CodecError> {
        if keep.start > keep.end || keep.end > num_frames {
            return Err(CodecError::Frames(format!("{keep:?} is not within the {num_frames} frames of the window")));
        }
        let end = first + num_frames;
        let keep = first + keep.start..first + keep.end;
        let total = finished.then_some(end);
        let pulses = keep.start.saturating_sub(PULSE_LEAD)..(keep.end + PULSE_LEAD).min(end);
        let spectra = keep.start.saturating_sub(OVERLAP - 1 - HALF_FFT_HOPS)..(keep.end + HALF_FFT_HOPS).min(end);
        let next_phase_frame = keep.end.saturating_sub(PULSE_LEAD).max(phase.frame);
        let plan = Plan { keep, pulses, spectra, total, next_phase_frame };
        if plan.keep.is_empty() {
            return Ok(plan);
        }
        if first > 0 && plan.keep.start < first + CONTEXT_FRAMES {
            return Err(CodecError::Frames(format!(
                "frames from {} need {CONTEXT_FRAMES} frames of context before them; the window starts at {first}",
                plan.keep.start
            )));
        }
        if !finished && end < plan.keep.end + CONTEXT_FRAMES {
            return Err(CodecError::Frames(format!(
                "frames up to {} need {CONTEXT_FRAMES} frames of context after them; the window ends at {end}",
                plan.keep.end
            )));
        }
        // Interpolating F0 for a frame's pulses reads the frame before it.
        if phase.frame > plan.pulses.start || (first > 0 && phase.frame <= first) {
            return Err(CodecError::Frames(format!(
                "the pulse phase stands at frame {}; a window from frame {first} keeping {:?} needs it in {}..={}",
                phase.frame,
                plan.keep,
                if first > 0 { first + 1 } else { 0 },
                plan.pulses.start
            )));
        }
        Ok(plan)
    }
}

/// numpy's reflect padding of a signal `len` samples long, folding again where a pad is longer than the signal.
fn reflect(sample: isize, len: Option<usize>) -> usize {
    if sample >= 0 && len.is_none_or(|len| (sample as usize) < len) {
        return sample as usize;
    }
    match len {
        Some(1) => 0,
        Some(len) => {
            let period = 2 * (len as isize - 1);
            let folded = sample.rem_euclid(period);
            (if folded >= len as isize { period - folded } else { folded }) as usize
        }
        // Unknown length: the window does not reach the end, and the stream is longer than one pad.
        None => sample.unsigned_abs(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_reflect_folds_like_numpy_pad() {
        let padded: Vec<usize> = (-4..7).map(|i| reflect(i, Some(3))).collect();
        assert_eq!(padded, [0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]);
        assert_eq!(reflect(-5, Some(1)), 0);
        assert_eq!(reflect(-600, None), 600);
        assert_eq!(reflect(17, None), 17);
    }

    #[test]
    fn test_bad_shapes_and_short_context_are_refused() {
        let vocoder = Vocoder::new();
        let (bins, f0) = (vec![0.0f32; 10 * NUM_BINS], vec![100.0f32; 10]);
        let frames = Frames { lh: &bins, theta: &bins, ln: &bins, lr: &bins, phi: &bins, f0: &f0 };
        let short = Frames { lh: &bins[1..], ..frames };
        assert!(vocoder.synthesize(&short, 0).is_err());
        let start = PulsePhase::start();
        assert!(vocoder.synthesize_window(&frames, 0, 0..7, 0, false, start).is_err());
        assert!(vocoder.synthesize_window(&frames, 0, 0..6, 0, false, start).is_ok());
        assert!(vocoder.synthesize_window(&frames, 5, 3..6, 0, false, start).is_err());
        let phase = vocoder.synthesize_window(&frames, 0, 0..6, 0, false, start).unwrap().next_phase;
        assert_eq!(phase.frame(), 3);
        assert!(vocoder.synthesize_window(&frames.slice(2..10), 2, 4..8, 0, true, phase).is_ok());
        assert!(vocoder.synthesize_window(&frames.slice(2..10), 2, 4..8, 0, true, start).is_err());
    }
}
