//! The sentence-level half: two text encoders, the duration head, length regulation and prosody.

use super::layers::{gelu_in_place, ConvNextBlock, DenseConv, LayerNorm, Precision, TransformerLayer};
use super::weights::GraphWeights;
use super::{AcousticError, DEC_CHANNELS};

/// Width of the spectral encoder `m.text` (its features feed the frame decoder).
pub const M_WIDTH: usize = 128;
/// Width of the prosody encoder `pn.text` (durations and prosody).
pub const PN_WIDTH: usize = 192;
/// Prosody channels: f0 and energy, each for the two 12.5 ms frames of a 25 ms step.
const NUM_PROSODY: usize = 4;
/// Scales of the prosody outputs, as the graph multiplies them.
const F0_SCALE: f32 = 100.0;
const ENERGY_SCALE: f32 = 5.0;
/// The decoder sees log-f0 and energy divided by this.
const FEATURE_DIV: f32 = 5.0;
/// The sentence-level layers keep f32, so durations and f0 stay those of the dequantized graph.
const SENTENCE: Precision = Precision::F32;

/// Embedding, ConvNeXt blocks (depthwise k5), one transformer layer applied `num_passes` times, LayerNorm.
pub struct TextEncoder {
    embedding: Vec<f32>,
    width: usize,
    convs: Vec<ConvNextBlock>,
    attn: TransformerLayer,
    num_passes: usize,
    norm: LayerNorm,
}

impl TextEncoder {
    pub fn load(w: &GraphWeights, prefix: &str, width: usize, vocab: usize) -> Result<Self, AcousticError> {
        let mut convs = Vec::new();
        while w.has(&format!("{prefix}.convs.{}.dw.weight", convs.len())) {
            convs.push(ConvNextBlock::load(
                w,
                &format!("{prefix}.convs.{}", convs.len()),
                width,
                2 * width,
                5,
                1,
                SENTENCE,
            )?);
        }
        // The shared layer runs once per LayerNorm node that reads its norm1 weight.
        let num_passes = w.num_uses(&format!("{prefix}.attn.norm1.weight"));
        Ok(Self {
            embedding: w.f32(&format!("{prefix}.emb.weight"), vocab * width)?,
            width,
            convs,
            attn: TransformerLayer::load(w, &format!("{prefix}.attn"), width, 2 * width, 2, SENTENCE)?,
            num_passes,
            norm: LayerNorm::load(w, &format!("{prefix}.norm"), width)?,
        })
    }

    /// `[len][width]` features of the ids (already checked against the vocabulary).
    pub fn forward(&self, ids: &[usize]) -> Vec<f32> {
        let c = self.width;
        let mut x: Vec<f32> = ids.iter().flat_map(|&id| self.embedding[id * c..(id + 1) * c].iter().copied()).collect();
        for block in &self.convs {
            x = block.forward_seq(&x);
        }
        for _ in 0..self.num_passes {
            self.attn.forward(&mut x);
        }
        self.norm.forward(&x)
    }
}

/// Conv k3 + GELU + conv k1 on the prosody encoder's features: log(1 + frames) per phoneme.
pub struct DurationHead {
    hidden: DenseConv,
    out: DenseConv,
}

impl DurationHead {
    pub fn load(w: &GraphWeights) -> Result<Self, AcousticError> {
        Ok(Self {
            hidden: DenseConv::load(w, "pn.dur.0", PN_WIDTH, PN_WIDTH, 3)?,
            out: DenseConv::load(w, "pn.dur.2", PN_WIDTH, 1, 1)?,
        })
    }

    /// Steps of 25 ms per phoneme: `max(round_half_even((exp(d) − 1) / speed), 1)`.
    pub fn durations(&self, pn: &[f32], speed: f32) -> Vec<usize> {
        let mut h = self.hidden.forward_seq(pn);
        gelu_in_place(&mut h);
        let d = self.out.forward_seq(&h);
        d.iter().map(|v| ((v.exp() - 1.0) / speed).round_ties_even().max(1.0) as usize).collect()
    }
}

/// The phoneme that each 25 ms step repeats: step `t` belongs to the first `j` with `t < cumsum[j]`.
pub fn regulate(durations: &[usize]) -> Vec<usize> {
    durations.iter().enumerate().flat_map(|(j, &d)| std::iter::repeat_n(j, d)).collect()
}

/// Conv k1 in, dilated ConvNeXt blocks (k7) over 25 ms steps, conv k1 out to four channels.
pub struct Prosody {
    input: DenseConv,
    blocks: Vec<ConvNextBlock>,
    output: DenseConv,
}

impl Prosody {
    pub fn load(w: &GraphWeights) -> Result<Self, AcousticError> {
        let mut blocks = Vec::new();
        while w.has(&format!("pn.pro.{}.dw.weight", blocks.len())) {
            let prefix = format!("pn.pro.{}", blocks.len());
            let dilation = w.conv_dilation(&format!("{prefix}.dw.weight"))?;
            blocks.push(ConvNextBlock::load(w, &prefix, PN_WIDTH, 2 * PN_WIDTH, 7, dilation, SENTENCE)?);
        }
        Ok(Self {
            input: DenseConv::load(w, "pn.pro_in", PN_WIDTH, PN_WIDTH, 1)?,
            blocks,
            output: DenseConv::load(w, "pn.pro_out", PN_WIDTH, NUM_PROSODY, 1)?,
        })
    }

    /// `[steps][4]` from the prosody encoder's features repeated per step.
    pub fn forward(&self, pn_steps: &[f32]) -> Vec<f32> {
        let mut x = self.input.forward_seq(pn_steps);
        for block in &self.blocks {
            x = block.forward_seq(&x);
        }
        self.output.forward_seq(&x)
    }
}

/// Frame `2t + b` (b = 0, 1) of the decoder input and f0, from step `t` of the phoneme `steps[t]`.
///
/// Channels 0..128 are the spectral encoder's features of that phoneme, channel 128 is
/// `ln(1 + relu(f0)) / 5` and channel 129 is `(energy · 5) / 5`, where f0 = prosody[b] · 100 and
/// energy = prosody[2 + b].
pub fn frame_features(m: &[f32], steps: &[usize], prosody: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let num_frames = 2 * steps.len();
    let mut dec_input = vec![0f32; num_frames * DEC_CHANNELS];
    let mut f0 = vec![0f32; num_frames];
    for (t, &j) in steps.iter().enumerate() {
        let p = &prosody[t * NUM_PROSODY..(t + 1) * NUM_PROSODY];
        for b in 0..2 {
            let frame = 2 * t + b;
            let row = &mut dec_input[frame * DEC_CHANNELS..(frame + 1) * DEC_CHANNELS];
            row[..M_WIDTH].copy_from_slice(&m[j * M_WIDTH..(j + 1) * M_WIDTH]);
            f0[frame] = p[b] * F0_SCALE;
            row[M_WIDTH] = (1.0 + f0[frame].max(0.0)).ln() / FEATURE_DIV;
            row[M_WIDTH + 1] = p[2 + b] * ENERGY_SCALE / FEATURE_DIV;
        }
    }
    (dec_input, f0)
}

/// Features of the 25 ms steps: row `t` is row `steps[t]` of `x`.
pub fn gather_rows(x: &[f32], width: usize, steps: &[usize]) -> Vec<f32> {
    steps.iter().flat_map(|&j| x[j * width..(j + 1) * width].iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_regulate_repeats_each_phoneme_for_its_duration() {
        assert_eq!(regulate(&[2, 1, 3]), [0, 0, 1, 2, 2, 2]);
        assert_eq!(regulate(&[1]), [0]);
    }
}
