//! The SNAC 24 kHz codec decoder, codes to mono f32 PCM; docs/speech.md describes its formats and streaming.

mod checkpoint;
mod config;
mod model;
mod noise;
mod snake;
pub mod view;

use std::ops::Range;
use std::path::Path;

pub use config::{SnacConfig, NUM_CODEBOOKS};

use crate::error::CodecError;
use checkpoint::Tensors;
use model::{Decoder, Quantizer};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The published checkpoint's torch pickle, which `tools/make_snac.py --convert` turns into `WEIGHTS_FILE`.
pub const PICKLE_FILE: &str = "pytorch_model.bin";

/// Codes for one sequence: codebook `i` holds `codes_per_frame()[i]` codes per frame.
pub type Codes<'a> = [&'a [u32]; NUM_CODEBOOKS];

pub struct SnacDecoder {
    config: SnacConfig,
    quantizer: Quantizer,
    decoder: Decoder,
    context_frames: usize,
}

impl SnacDecoder {
    /// Loads a codec directory; every fault names the file it is in.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CodecError> {
        let dir = dir.as_ref();
        let config = SnacConfig::from_file(&dir.join(CONFIG_FILE))?;
        let weights = dir.join(WEIGHTS_FILE);
        if !weights.is_file() && dir.join(PICKLE_FILE).is_file() {
            let fault = format!("no {WEIGHTS_FILE}: convert {PICKLE_FILE} once with tools/make_snac.py --convert DIR");
            return Err(CodecError::Format { path: dir.into(), fault });
        }
        let tensors = Tensors::open(&weights)?;
        let quantizer = Quantizer::load(&tensors, &config)?;
        let decoder = Decoder::load(&tensors, &config)?;
        let context_frames = exact_context(&decoder, &config);
        Ok(Self { config, quantizer, decoder, context_frames })
    }

    /// The layers with their folded weights, for running them on another backend.
    pub fn view(&self) -> view::DecoderView<'_> {
        self.quantizer.view(&self.decoder)
    }

    pub fn config(&self) -> &SnacConfig {
        &self.config
    }

    pub fn sample_rate(&self) -> u32 {
        self.config.sampling_rate
    }

    /// Samples per frame of the coarsest codebook.
    pub fn hop_length(&self) -> usize {
        self.config.hop_length()
    }

    /// Codes per frame in each codebook, coarsest first.
    pub fn codes_per_frame(&self) -> [usize; NUM_CODEBOOKS] {
        self.config.codes_per_frame()
    }

    /// Frames of context on each side that make `decode_window` equal `decode` bit for bit.
    pub fn context_frames(&self) -> usize {
        self.context_frames
    }

    /// Leading frames whose samples no later frame can change, once `num_frames` frames are known.
    pub fn ready_frames(&self, num_frames: usize, finished: bool) -> usize {
        match finished {
            true => num_frames,
            false => num_frames.saturating_sub(self.context_frames),
        }
    }

    /// PCM for all frames of `codes`.
    pub fn decode(&self, codes: Codes, noise: Option<u64>) -> Result<Vec<f32>, CodecError> {
        let num_frames = self.config.num_frames(codes)?;
        Ok(self.decode_frames(codes, 0, num_frames, noise))
    }

    /// PCM for frames `frames` of `codes`, decoded with up to `context_frames` frames on each side.
    pub fn decode_window(
        &self,
        codes: Codes,
        frames: Range<usize>,
        context_frames: usize,
        noise: Option<u64>,
    ) -> Result<Vec<f32>, CodecError> {
        let num_frames = self.config.num_frames(codes)?;
        if frames.start > frames.end || frames.end > num_frames {
            return Err(CodecError::Frames(format!("{frames:?} is not within the {num_frames} frames given")));
        }
        if frames.is_empty() {
            return Ok(Vec::new());
        }
        let first = frames.start.saturating_sub(context_frames);
        let end = frames.end.saturating_add(context_frames).min(num_frames);
        let per_frame = self.codes_per_frame();
        let window: Codes = std::array::from_fn(|i| &codes[i][first * per_frame[i]..end * per_frame[i]]);
        self.decode_span(window, first, frames.start - first..frames.end - first, noise)
    }

    /// PCM for frames `keep` of a window of codes whose first frame is frame `first_frame` of the audio.
    pub fn decode_span(
        &self,
        window: Codes,
        first_frame: usize,
        keep: Range<usize>,
        noise: Option<u64>,
    ) -> Result<Vec<f32>, CodecError> {
        let num_frames = self.config.window_frames(window, &keep)?;
        let mut pcm = self.decode_frames(window, first_frame, num_frames, noise);
        let hop = self.hop_length();
        pcm.truncate(keep.end * hop);
        pcm.drain(..keep.start * hop);
        Ok(pcm)
    }

    fn decode_frames(&self, codes: Codes, first_frame: usize, num_frames: usize, noise: Option<u64>) -> Vec<f32> {
        let steps = self.config.vq_strides[0];
        let latent = self.quantizer.latent(codes, num_frames * steps);
        self.decoder.forward(latent, num_frames * steps, (first_frame * steps) as u64, noise)
    }
}

/// The most frames on either side that a frame's samples read, over every padded layer input.
fn exact_context(decoder: &Decoder, config: &SnacConfig) -> usize {
    // Every frame sees the same pattern of layers, so any frame far from position 0 stands for all.
    let frame: i64 = 1 << 16;
    let (hop, steps) = (config.hop_length() as i64, config.vq_strides[0] as i64);
    let reach = decoder.reach(frame * hop..=(frame + 1) * hop - 1);
    let frames = reach.iter().flat_map(|(span, rate)| [span.start(), span.end()].map(|p| p.div_euclid(rate * steps)));
    frames.map(|f| (f - frame).unsigned_abs() as usize).max().unwrap_or(0)
}
