//! The voice's network: phoneme ids to durations, prosody and spectral frames.
//!
//! It implements hibari.onnx (hibari-tts 0.2.1). The sentence-level layers dequantize its int8 pointwise
//! weights to f32 (`q · scale`) and run float matmuls; the frame decoder keeps them in int8 and quantizes
//! its activations to uint8 at run time as the graph does, but per row rather than per tensor, so a frame
//! never depends on its window. Rows are time-major throughout. The arithmetic, as the graph has it:
//!
//! - Two text encoders over the ids: `m.text` (width 128) and `pn.text` (width 192). Each is an
//!   embedding, two ConvNeXt blocks (depthwise conv k5 → LayerNorm → pointwise 2× MLP with exact GELU
//!   `x · (1 + erf(x / √2)) · 0.5` → gamma → residual), one pre-norm transformer layer (2 heads,
//!   softmax(q·kᵀ / √head_dim) over every position, no mask; GELU MLP) applied 4 times (`m`) or
//!   6 times (`pn`) with the same weights, then LayerNorm. Every LayerNorm has eps 1e-5.
//! - Durations from `pn.text`: conv k3 → GELU → conv k1 gives d per phoneme, and the phoneme lasts
//!   `max(round_half_even((exp(d) − 1) / speed), 1)` steps of 25 ms.
//! - Length regulation repeats each phoneme's features for its steps (`T` steps in all).
//! - Prosody over the `T` steps of `pn.text` features: conv k1, six ConvNeXt blocks (depthwise k7,
//!   dilations 1, 2, 4, 8, 1, 2), conv k1 to four channels `p`. Each step is two 12.5 ms frames, so a
//!   sentence has `F = 2T` frames; frame `2t + b` has f0 = p[b] · 100 and energy p[2 + b] · 5.
//! - The decoder input of frame `2t + b` (130 channels): the `m.text` features of step t's phoneme,
//!   `ln(1 + relu(f0)) / 5` and `energy / 5`.
//! - The frame decoder: conv k7 (130 → 256), eight ConvNeXt blocks (depthwise k7, MLP 256 → 768 → 256),
//!   LayerNorm, and a pointwise head to 3005 = 5 × 601 channels: lh, theta, ln, lr, phi in that order.
//!
//! The split between the two phases is the decoder input: [`AcousticModel::prepare`] runs everything
//! sentence-level up to it (and f0), [`AcousticModel::decode_frames`] the frame decoder on any window.

mod decoder;
mod encoder;
mod layers;
mod weights;

use std::ops::Range;
use std::path::{Path, PathBuf};

pub use decoder::DecoderRows;
use decoder::FrameDecoder;
use encoder::{DurationHead, Prosody, TextEncoder, M_WIDTH, PN_WIDTH};
use weights::GraphWeights;

use crate::checkpoint::onnx::OnnxError;

/// Spectral bins of each of the five outputs per frame.
pub const NUM_BINS: usize = 601;
/// Channels of the frame decoder's input.
pub const DEC_CHANNELS: usize = 130;
/// Phoneme ids the embeddings cover.
pub const VOCAB_SIZE: usize = 178;
/// Speeds outside this range are refused (the voice is trained around 0.5 to 2).
pub const SPEED_RANGE: std::ops::RangeInclusive<f32> = 0.1..=10.0;
const HEAD_WIDTH: usize = 5 * NUM_BINS;

#[derive(Debug, thiserror::Error)]
pub enum AcousticError {
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    #[error("{}: {fault}", path.display())]
    Graph { path: PathBuf, fault: String },
    #[error("no phoneme ids")]
    NoIds,
    #[error("phoneme id {id} at position {position} is not below {VOCAB_SIZE}")]
    UnknownId { id: i64, position: usize },
    #[error("speed {0} is outside {min}..={max}", min = SPEED_RANGE.start(), max = SPEED_RANGE.end())]
    Speed(f32),
}

/// A sentence after the sentence-level phase: what the frame decoder needs, frame-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Prepared {
    /// Frames of 12.5 ms.
    pub num_frames: usize,
    /// Steps of 25 ms (two frames) per phoneme id, pads included.
    pub durations: Vec<usize>,
    /// The frame decoder's input, `[num_frames][DEC_CHANNELS]`.
    pub dec_input: Vec<f32>,
    /// Fundamental frequency per frame, Hz (the graph's `f0` output; may be below zero where unvoiced).
    pub f0: Vec<f32>,
}

/// The network's outputs for a window of frames, each `[frames][NUM_BINS]`.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedFrames {
    pub frames: Range<usize>,
    pub lh: Vec<f32>,
    pub theta: Vec<f32>,
    pub ln: Vec<f32>,
    pub lr: Vec<f32>,
    pub phi: Vec<f32>,
    /// `f0` of the same frames.
    pub f0: Vec<f32>,
}

impl DecodedFrames {
    pub fn num_frames(&self) -> usize {
        self.frames.len()
    }
}

pub struct AcousticModel {
    m_text: TextEncoder,
    pn_text: TextEncoder,
    durations: DurationHead,
    prosody: Prosody,
    decoder: FrameDecoder,
}

impl AcousticModel {
    /// Loads `hibari.onnx` from the voice's directory.
    pub fn open_dir(dir: &Path) -> Result<Self, AcousticError> {
        Self::open(&dir.join("hibari.onnx"))
    }

    pub fn open(path: &Path) -> Result<Self, AcousticError> {
        let w = GraphWeights::open(path)?;
        Ok(Self {
            m_text: TextEncoder::load(&w, "m.text", M_WIDTH, VOCAB_SIZE)?,
            pn_text: TextEncoder::load(&w, "pn.text", PN_WIDTH, VOCAB_SIZE)?,
            durations: DurationHead::load(&w)?,
            prosody: Prosody::load(&w)?,
            decoder: FrameDecoder::load(&w)?,
        })
    }

    /// Frames of decoder input that `decode_frames` reads on each side of its window.
    pub fn decoder_context(&self) -> usize {
        self.decoder.context()
    }

    /// The sentence-level phase: ids (with their 0 pads) and speed to durations, f0 and the decoder input.
    pub fn prepare(&self, ids: &[i64], speed: f32) -> Result<Prepared, AcousticError> {
        if ids.is_empty() {
            return Err(AcousticError::NoIds);
        }
        if !SPEED_RANGE.contains(&speed) {
            return Err(AcousticError::Speed(speed));
        }
        let ids = ids
            .iter()
            .enumerate()
            .map(|(position, &id)| match usize::try_from(id) {
                Ok(i) if i < VOCAB_SIZE => Ok(i),
                _ => Err(AcousticError::UnknownId { id, position }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (m, pn) = rayon::join(|| self.m_text.forward(&ids), || self.pn_text.forward(&ids));
        let durations = self.durations.durations(&pn, speed);
        let steps = encoder::regulate(&durations);
        let prosody = self.prosody.forward(&encoder::gather_rows(&pn, PN_WIDTH, &steps));
        let (dec_input, f0) = encoder::frame_features(&m, &steps, &prosody);
        Ok(Prepared { num_frames: f0.len(), durations, dec_input, f0 })
    }

    /// The frame-level phase for `frames`; any split of a sentence into windows gives the same bits as
    /// one whole decode. Panics when `frames` is not within `0..prepared.num_frames`.
    pub fn decode_frames(&self, prepared: &Prepared, frames: Range<usize>) -> DecodedFrames {
        self.decode_next(prepared, frames, &mut DecoderRows::default())
    }

    /// As `decode_frames`, reusing the layers' rows that `rows` kept when `frames` follows its last window.
    pub fn decode_next(&self, prepared: &Prepared, frames: Range<usize>, rows: &mut DecoderRows) -> DecodedFrames {
        assert!(
            frames.start <= frames.end && frames.end <= prepared.num_frames,
            "decode_frames: {frames:?} is not within 0..{}",
            prepared.num_frames
        );
        let head = match frames.is_empty() {
            true => Vec::new(),
            false => self.decoder.decode(&prepared.dec_input, prepared.num_frames, frames.clone(), rows),
        };
        let part = |k: usize| -> Vec<f32> {
            head.chunks_exact(HEAD_WIDTH)
                .flat_map(|row| row[k * NUM_BINS..(k + 1) * NUM_BINS].iter().copied())
                .collect()
        };
        DecodedFrames {
            lh: part(0),
            theta: part(1),
            ln: part(2),
            lr: part(3),
            phi: part(4),
            f0: prepared.f0[frames.clone()].to_vec(),
            frames,
        }
    }
}
