//! Drama in the rounds: a request's frames become codec windows, decoded by the SNAC codec on the engine thread.

use std::sync::Arc;

use crate::boundary::{Codec, CodecJob, EngineError, FrameSink};
use tensorfold_audio::snac::{Codes, NUM_CODEBOOKS};
use tensorfold_audio::SnacDecoder;

use super::{Assembled, DramaLayout, FrameAssembler, FrameCodes};

/// Most frames one window keeps: windows grow from one frame so the first audio leaves early.
const MAX_WINDOW_FRAMES: usize = 16;

/// A speech request's codec state: the frames so far, and how many have been sent to decode.
pub struct DramaFrames {
    assembler: FrameAssembler,
    frames: FrameCodes,
    codes_per_frame: [usize; NUM_CODEBOOKS],
    context_frames: usize,
    sent: usize,
    window: usize,
}

impl DramaFrames {
    /// Frames for a codec whose outputs depend on at most `context_frames` frames on each side.
    pub fn with_context(
        layout: &DramaLayout,
        codes_per_frame: [usize; NUM_CODEBOOKS],
        context_frames: usize,
    ) -> DramaFrames {
        DramaFrames {
            assembler: FrameAssembler::new(layout),
            frames: FrameCodes::default(),
            codes_per_frame,
            context_frames,
            sent: 0,
            window: 1,
        }
    }

    /// Frames `sent..ready` with up to `context_frames` known frames on each side.
    fn job(&mut self, ready: usize) -> CodecJob {
        let num_frames = self.frames.num_frames();
        let first = self.sent.saturating_sub(self.context_frames);
        let end = (ready + self.context_frames).min(num_frames);
        let codes = (0..NUM_CODEBOOKS)
            .map(|i| self.frames.codebook(i)[first * self.codes_per_frame[i]..end * self.codes_per_frame[i]].to_vec())
            .collect();
        let job = CodecJob { codes, first_frame: first, keep: self.sent - first..ready - first };
        self.sent = ready;
        self.window = (self.window * 2).min(MAX_WINDOW_FRAMES);
        job
    }
}

impl FrameSink for DramaFrames {
    fn push(&mut self, id: u32) -> Option<CodecJob> {
        match self.assembler.push(id) {
            Assembled::Frame(frame) => self.frames.push(&frame),
            Assembled::Dropped | Assembled::Skipped | Assembled::Pending => return None,
        }
        // A frame's samples are final once `context_frames` frames follow it.
        let ready = self.frames.num_frames().saturating_sub(self.context_frames);
        (ready >= self.sent + self.window).then(|| self.job(ready))
    }

    fn finish(&mut self) -> Option<CodecJob> {
        let ready = self.frames.num_frames();
        (ready > self.sent).then(|| self.job(ready))
    }
}

/// The SNAC decoder as the engine thread runs it; Drama decodes without the codec's noise.
pub struct SnacCodec(pub Arc<SnacDecoder>);

impl Codec for SnacCodec {
    fn sample_rate(&self) -> u32 {
        self.0.sample_rate()
    }

    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, EngineError> {
        let span = self.0.decode_span(window_codes(job)?, job.first_frame, job.keep.clone(), None);
        span.map_err(|e| EngineError::Codec(e.to_string()))
    }
}

/// A job's codes as SNAC's three codebooks.
pub(crate) fn window_codes(job: &CodecJob) -> Result<Codes<'_>, EngineError> {
    match job.codes.as_slice() {
        [a, b, c] => Ok([a, b, c]),
        other => {
            let fault = format!("a SNAC window needs {NUM_CODEBOOKS} codebooks, not {}", other.len());
            Err(EngineError::Codec(fault))
        }
    }
}
