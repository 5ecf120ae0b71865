//! The frame-level half: `m.dec_in` (conv k7), the `m.dec.*` blocks (depthwise k7), `m.dec_norm`, `m.head`.
//!
//! A window of frames is decoded from the decoder input around it: every layer is computed on the
//! positions the next one reads, clipped to the sentence, and re-padded with zeros beyond the
//! sentence exactly as the whole-sentence convolutions pad. Each output row is one fixed-order
//! computation on the same values, so a window equals the same frames of a whole decode bit for bit.

use std::ops::Range;

use super::layers::{with_context, ConvNextBlock, DenseConv, LayerNorm, Linear, Precision};
use super::weights::GraphWeights;
use super::{AcousticError, DEC_CHANNELS, HEAD_WIDTH};

const WIDTH: usize = 256;
const HIDDEN: usize = 768;
/// The frame decoder runs its pointwise layers in int8, as the graph does.
const DECODER: Precision = Precision::Int8;

pub struct FrameDecoder {
    input: DenseConv,
    blocks: Vec<ConvNextBlock>,
    norm: LayerNorm,
    head: Linear,
}

impl FrameDecoder {
    pub fn load(w: &GraphWeights) -> Result<Self, AcousticError> {
        let mut blocks = Vec::new();
        while w.has(&format!("m.dec.{}.dw.weight", blocks.len())) {
            blocks.push(ConvNextBlock::load(w, &format!("m.dec.{}", blocks.len()), WIDTH, HIDDEN, 7, 1, DECODER)?);
        }
        Ok(Self {
            input: DenseConv::load(w, "m.dec_in", DEC_CHANNELS, WIDTH, 7)?,
            blocks,
            norm: LayerNorm::load(w, "m.dec_norm", WIDTH)?,
            head: Linear::load(w, "m.head.bias", WIDTH, HEAD_WIDTH, DECODER)?,
        })
    }

    /// Frames of decoder input that one output frame reads on each side.
    pub fn context(&self) -> usize {
        self.input.reach + self.blocks.iter().map(|b| b.reach).sum::<usize>()
    }

    /// Head outputs `[frames][HEAD_WIDTH]` for `frames` of a sentence of `num_frames` frames.
    pub fn decode(&self, dec_input: &[f32], num_frames: usize, frames: Range<usize>) -> Vec<f32> {
        // Positions layer `k` must produce: the window widened by what the later layers read.
        let mut later: usize = self.blocks.iter().map(|b| b.reach).sum();
        let span = |extra: usize| {
            ((frames.start as isize - extra as isize).max(0) as usize, (frames.end + extra).min(num_frames))
        };
        let wanted = |have: (usize, usize), reach: usize| (have.0 as isize - reach as isize, (have.1 + reach) as isize);
        let mut have = span(later);
        let x = with_context(dec_input, DEC_CHANNELS, (0, num_frames), wanted(have, self.input.reach), num_frames);
        let mut x = self.input.forward(&x);
        for block in &self.blocks {
            later -= block.reach;
            let next = span(later);
            let padded = with_context(&x, WIDTH, have, wanted(next, block.reach), num_frames);
            x = block.forward(&padded);
            have = next;
        }
        debug_assert_eq!(have, (frames.start, frames.end));
        self.head.forward(&self.norm.forward(&x))
    }
}
