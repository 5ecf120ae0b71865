//! One request's Hibari stream: frames arrive in any chunks, and samples leave once no later frame can change them.

use super::{Frames, PulsePhase, Vocoder, CONTEXT_FRAMES, NUM_BINS};
use crate::error::CodecError;

/// The frames a stream still needs, its pulse phase, and its sent frames; fewer, larger pulls recompute less context.
pub struct VocoderStream {
    noise_seed: u64,
    /// Stream index of the first frame still held.
    first: usize,
    lh: Vec<f32>,
    theta: Vec<f32>,
    ln: Vec<f32>,
    lr: Vec<f32>,
    phi: Vec<f32>,
    f0: Vec<f32>,
    /// Frames whose samples have gone out.
    sent: usize,
    phase: PulsePhase,
}

impl VocoderStream {
    pub fn new(noise_seed: u64) -> VocoderStream {
        VocoderStream {
            noise_seed,
            first: 0,
            lh: Vec::new(),
            theta: Vec::new(),
            ln: Vec::new(),
            lr: Vec::new(),
            phi: Vec::new(),
            f0: Vec::new(),
            sent: 0,
            phase: PulsePhase::start(),
        }
    }

    /// Frames pushed so far.
    pub fn num_frames(&self) -> usize {
        self.first + self.f0.len()
    }

    /// Appends the next frames of the stream.
    pub fn push(&mut self, frames: &Frames) -> Result<(), CodecError> {
        frames.check()?;
        self.lh.extend_from_slice(frames.lh);
        self.theta.extend_from_slice(frames.theta);
        self.ln.extend_from_slice(frames.ln);
        self.lr.extend_from_slice(frames.lr);
        self.phi.extend_from_slice(frames.phi);
        self.f0.extend_from_slice(frames.f0);
        Ok(())
    }

    /// Samples of the frames that became final since the last pull.
    pub fn pull(&mut self, vocoder: &Vocoder) -> Result<Vec<f32>, CodecError> {
        self.emit(vocoder, false)
    }

    /// Samples of every frame not yet returned, the last frame having been pushed.
    pub fn finish(&mut self, vocoder: &Vocoder) -> Result<Vec<f32>, CodecError> {
        self.emit(vocoder, true)
    }

    fn emit(&mut self, vocoder: &Vocoder, finished: bool) -> Result<Vec<f32>, CodecError> {
        let ready = vocoder.ready_frames(self.num_frames(), finished);
        if ready <= self.sent {
            return Ok(Vec::new());
        }
        let held =
            Frames { lh: &self.lh, theta: &self.theta, ln: &self.ln, lr: &self.lr, phi: &self.phi, f0: &self.f0 };
        let keep = self.sent - self.first..ready - self.first;
        let audio = vocoder.synthesize_window(&held, self.first, keep, self.noise_seed, finished, self.phase)?;
        self.phase = audio.next_phase;
        self.sent = ready;
        self.drop_before(self.sent.saturating_sub(CONTEXT_FRAMES));
        Ok(audio.samples)
    }

    /// Forgets frames before `frame`, which no later window reads.
    fn drop_before(&mut self, frame: usize) {
        let num = frame.saturating_sub(self.first);
        for part in [&mut self.lh, &mut self.theta, &mut self.ln, &mut self.lr, &mut self.phi] {
            part.drain(..num * NUM_BINS);
        }
        self.f0.drain(..num);
        self.first += num;
    }
}
