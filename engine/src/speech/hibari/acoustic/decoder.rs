//! The frame-level half: `m.dec_in` (conv k7), the `m.dec.*` blocks (depthwise k7), `m.dec_norm`, `m.head`.
//!
//! A window of frames is decoded from the decoder input around it: every layer is computed on the
//! positions the next one reads, clipped to the sentence, and re-padded with zeros beyond the
//! sentence exactly as the whole-sentence convolutions pad. Each output row is one fixed-order
//! computation on the same values, so a window equals the same frames of a whole decode bit for bit,
//! and rows kept from the previous window equal the rows a recomputation would give.

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
    ///
    /// Rows that `rows` holds from the previous window are reused when `frames` starts where it ended;
    /// otherwise `rows` starts afresh at `frames`.
    pub fn decode(
        &self,
        dec_input: &[f32],
        num_frames: usize,
        frames: Range<usize>,
        rows: &mut DecoderRows,
    ) -> Vec<f32> {
        let reaches: Vec<usize> =
            std::iter::once(self.input.reach).chain(self.blocks.iter().map(|b| b.reach)).collect();
        // What layer `k` must produce beyond the window: what the later layers read.
        let later = |k: usize| reaches[k + 1..].iter().sum::<usize>();
        if rows.next_frame != Some(frames.start) || rows.layers.len() != reaches.len() {
            let first = |k: usize| frames.start.saturating_sub(later(k));
            rows.layers = (0..reaches.len()).map(|k| Layer { first: first(k), values: Vec::new() }).collect();
        }
        for (k, &reach) in reaches.iter().enumerate() {
            let (have, end) = (rows.layers[k].end(), (frames.end + later(k)).min(num_frames));
            if have >= end {
                continue;
            }
            let want = (have as isize - reach as isize, (end + reach) as isize);
            let new = match k {
                0 => self.input.forward(&with_context(dec_input, DEC_CHANNELS, (0, num_frames), want, num_frames)),
                _ => {
                    let below = &rows.layers[k - 1];
                    let padded = with_context(&below.values, WIDTH, (below.first, below.end()), want, num_frames);
                    self.blocks[k - 1].forward(&padded)
                }
            };
            rows.layers[k].values.extend_from_slice(&new);
        }
        let last = rows.layers.last().expect("the input layer");
        let x = &last.values[(frames.start - last.first) * WIDTH..(frames.end - last.first) * WIDTH];
        let out = self.head.forward(&self.norm.forward(x));
        // Keep of each layer only the rows the next window's new rows of the layer above read.
        for k in 0..reaches.len() {
            let keep_from = match k + 1 < reaches.len() {
                true => rows.layers[k + 1].end().saturating_sub(reaches[k + 1]),
                false => frames.end,
            };
            rows.layers[k].drop_before(keep_from);
        }
        rows.next_frame = Some(frames.end);
        out
    }
}

/// Rows of each decoder layer kept between a sentence's consecutive windows, so context is computed once.
#[derive(Debug, Default)]
pub struct DecoderRows {
    /// The frame the next window starts at, for the rows to be reused.
    next_frame: Option<usize>,
    /// The input convolution's output, then each block's.
    layers: Vec<Layer>,
}

#[derive(Debug)]
struct Layer {
    /// Position of the first row held.
    first: usize,
    values: Vec<f32>,
}

impl Layer {
    fn end(&self) -> usize {
        self.first + self.values.len() / WIDTH
    }

    fn drop_before(&mut self, position: usize) {
        let num = position.saturating_sub(self.first).min(self.values.len() / WIDTH);
        self.values.drain(..num * WIDTH);
        self.first += num;
    }
}
