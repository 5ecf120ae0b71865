//! The network's building blocks over time-major rows `[time][channels]`; every row is computed alone.

use rayon::prelude::*;
use tensorfold_kernels::conv::{Conv1d, DepthwiseConv1d, Geometry};
use tensorfold_kernels::gelu;
use tensorfold_kernels::int8::{matmul_int8, Int8Matrix};
use tensorfold_kernels::ops::dot;
use tensorfold_kernels::packed::{matmul_packed, PackedF32};
use tensorfold_kernels::simd::axpy;
use tensorfold_kernels::Weight;

use super::weights::GraphWeights;
use super::AcousticError;

/// The epsilon of every LayerNormalization node in the graph.
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// The graph's exact GELU, `x · (1 + erf(x / √2)) · 0.5`, with erf in f32 (within 4e-7 of the exact GELU).
pub fn gelu_in_place(x: &mut [f32]) {
    x.par_chunks_mut(4096).for_each(gelu::gelu_in_place);
}

/// LayerNormalization over the channels of each row; mean and variance are taken in f64.
pub struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

impl LayerNorm {
    pub fn load(w: &GraphWeights, prefix: &str, width: usize) -> Result<Self, AcousticError> {
        Ok(Self { weight: w.f32(&format!("{prefix}.weight"), width)?, bias: w.f32(&format!("{prefix}.bias"), width)? })
    }

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = self.weight.len();
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(o, row)| {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let (mean, std) = (mean as f32, ((var + LAYER_NORM_EPS as f64).sqrt()) as f32);
            for (((o, v), w), b) in o.iter_mut().zip(row).zip(&self.weight).zip(&self.bias) {
                *o = (v - mean) / std * w + b;
            }
        });
        out
    }
}

/// How a pointwise layer computes: the dequantized weight in f32, or the int8 weight with activations
/// quantized per row to uint8 (the graph's own dynamic quantization, row by row instead of per tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    Int8,
}

enum LinearWeight {
    F32(PackedF32),
    Int8(Int8Matrix),
}

/// `y = x · W + b` with the graph's int8 weight W.
pub struct Linear {
    weight: LinearWeight,
    bias: Vec<f32>,
}

impl Linear {
    /// The pointwise layer whose bias initializer is `bias_name`.
    pub fn load(
        w: &GraphWeights,
        bias_name: &str,
        c_in: usize,
        c_out: usize,
        precision: Precision,
    ) -> Result<Self, AcousticError> {
        let weight = match precision {
            Precision::F32 => match w.dequantized(bias_name, c_in, c_out)? {
                Weight::F32 { data, .. } => LinearWeight::F32(PackedF32::new(&data, c_out, c_in)),
                other => unreachable!("dequantized weights are f32, not {other:?}"),
            },
            Precision::Int8 => LinearWeight::Int8(w.quantized(bias_name, c_in, c_out)?),
        };
        Ok(Self { weight, bias: w.f32(bias_name, c_out)? })
    }

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let n = self.bias.len();
        let num_rows = x.len() / self.c_in();
        let mut out = vec![0f32; num_rows * n];
        match &self.weight {
            LinearWeight::F32(weight) => matmul_packed(x, num_rows, weight, &self.bias, &mut out),
            LinearWeight::Int8(weight) => matmul_int8(x, num_rows, weight, &self.bias, &mut out),
        }
        out
    }

    fn c_in(&self) -> usize {
        match &self.weight {
            LinearWeight::F32(w) => w.cols(),
            LinearWeight::Int8(w) => w.cols(),
        }
    }
}

/// Rows `want` of a sequence of `len` rows, taken from `rows` (which hold positions `have`), zeros outside it.
pub fn with_context(rows: &[f32], width: usize, have: (usize, usize), want: (isize, isize), len: usize) -> Vec<f32> {
    let mut out = vec![0f32; (want.1 - want.0) as usize * width];
    for (i, pos) in (want.0..want.1).enumerate() {
        if pos < 0 || pos as usize >= len {
            continue;
        }
        let pos = pos as usize;
        assert!(have.0 <= pos && pos < have.1, "with_context: position {pos} is not among rows {have:?}");
        out[i * width..(i + 1) * width].copy_from_slice(&rows[(pos - have.0) * width..(pos - have.0 + 1) * width]);
    }
    out
}

/// The whole sequence between `pad` rows of zeros on each side.
pub fn zero_padded(x: &[f32], width: usize, pad: usize) -> Vec<f32> {
    let len = x.len() / width;
    with_context(x, width, (0, len), (-(pad as isize), (len + pad) as isize), len)
}

/// A dense convolution run on rows that already hold its context: `reach` rows each side.
pub struct DenseConv {
    conv: Conv1d,
    pub reach: usize,
}

impl DenseConv {
    pub fn load(
        w: &GraphWeights,
        prefix: &str,
        c_in: usize,
        c_out: usize,
        kernel: usize,
    ) -> Result<Self, AcousticError> {
        let weight = w.f32(&format!("{prefix}.weight"), c_out * c_in * kernel)?;
        let bias = w.f32(&format!("{prefix}.bias"), c_out)?;
        let geometry = Geometry { kernel, stride: 1, dilation: 1, padding: 0 };
        Ok(Self { conv: Conv1d::from_torch(&weight, Some(bias), c_out, c_in, geometry), reach: (kernel - 1) / 2 })
    }

    /// `x` holds `reach` context rows on each side of the outputs.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        self.conv.forward(x, 1, x.len() / self.conv.c_in())
    }

    /// The whole sequence, zero padded at both ends as the graph's Conv pads.
    pub fn forward_seq(&self, x: &[f32]) -> Vec<f32> {
        self.forward(&zero_padded(x, self.conv.c_in(), self.reach))
    }
}

/// A ConvNeXt-like block: depthwise conv, LayerNorm, pointwise MLP with GELU, gamma scale, residual.
pub struct ConvNextBlock {
    dw: DepthwiseConv1d,
    norm: LayerNorm,
    pw1: Linear,
    pw2: Linear,
    gamma: Vec<f32>,
    width: usize,
    /// Context rows each side that one output reads.
    pub reach: usize,
}

impl ConvNextBlock {
    /// `prefix` names the block's initializers (dw, norm, gamma, pw biases).
    pub fn load(
        w: &GraphWeights,
        prefix: &str,
        width: usize,
        hidden: usize,
        kernel: usize,
        dilation: usize,
        precision: Precision,
    ) -> Result<Self, AcousticError> {
        let dw_weight = w.f32(&format!("{prefix}.dw.weight"), width * kernel)?;
        let dw_bias = w.f32(&format!("{prefix}.dw.bias"), width)?;
        let geometry = Geometry { kernel, stride: 1, dilation, padding: 0 };
        Ok(Self {
            dw: DepthwiseConv1d::from_torch(&dw_weight, Some(dw_bias), width, geometry),
            norm: LayerNorm::load(w, &format!("{prefix}.norm"), width)?,
            pw1: Linear::load(w, &format!("{prefix}.pw1.bias"), width, hidden, precision)?,
            pw2: Linear::load(w, &format!("{prefix}.pw2.bias"), hidden, width, precision)?,
            gamma: w.f32(&format!("{prefix}.gamma"), width)?,
            width,
            reach: (kernel - 1) * dilation / 2,
        })
    }

    /// `x` holds `reach` context rows on each side of the outputs (zeros beyond the sequence).
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let c = self.width;
        let rows = x.len() / c;
        let mut h = self.dw.forward(x, 1, rows);
        h = self.norm.forward(&h);
        h = self.pw1.forward(&h);
        gelu_in_place(&mut h);
        h = self.pw2.forward(&h);
        let residual = &x[self.reach * c..(rows - self.reach) * c];
        h.par_chunks_mut(c).zip(residual.par_chunks(c)).for_each(|(o, r)| {
            for ((o, g), r) in o.iter_mut().zip(&self.gamma).zip(r) {
                *o = r + g * *o;
            }
        });
        h
    }

    /// The whole sequence, zero padded at both ends.
    pub fn forward_seq(&self, x: &[f32]) -> Vec<f32> {
        self.forward(&zero_padded(x, self.width, self.reach))
    }
}

/// A pre-norm transformer layer (self-attention over every position, then a GELU MLP), no mask.
pub struct TransformerLayer {
    norm1: LayerNorm,
    in_proj: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    linear1: Linear,
    linear2: Linear,
    width: usize,
    num_heads: usize,
}

impl TransformerLayer {
    pub fn load(
        w: &GraphWeights,
        prefix: &str,
        width: usize,
        hidden: usize,
        heads: usize,
        precision: Precision,
    ) -> Result<Self, AcousticError> {
        Ok(Self {
            norm1: LayerNorm::load(w, &format!("{prefix}.norm1"), width)?,
            in_proj: Linear::load(w, &format!("{prefix}.self_attn.in_proj_bias"), width, 3 * width, precision)?,
            out_proj: Linear::load(w, &format!("{prefix}.self_attn.out_proj.bias"), width, width, precision)?,
            norm2: LayerNorm::load(w, &format!("{prefix}.norm2"), width)?,
            linear1: Linear::load(w, &format!("{prefix}.linear1.bias"), width, hidden, precision)?,
            linear2: Linear::load(w, &format!("{prefix}.linear2.bias"), hidden, width, precision)?,
            width,
            num_heads: heads,
        })
    }

    pub fn forward(&self, x: &mut [f32]) {
        let qkv = self.in_proj.forward(&self.norm1.forward(x));
        let attn = self.out_proj.forward(&self.attention(&qkv));
        x.iter_mut().zip(&attn).for_each(|(x, a)| *x += a);
        let mut h = self.linear1.forward(&self.norm2.forward(x));
        gelu_in_place(&mut h);
        let ff = self.linear2.forward(&h);
        x.iter_mut().zip(&ff).for_each(|(x, f)| *x += f);
    }

    /// Softmax(q·kᵀ / √head_dim) · v per head, heads side by side in each output row.
    fn attention(&self, qkv: &[f32]) -> Vec<f32> {
        let (d, heads) = (self.width, self.num_heads);
        let head_dim = d / heads;
        let scale = (head_dim as f32).sqrt();
        let len = qkv.len() / (3 * d);
        let row = |t: usize, part: usize, h: usize| &qkv[t * 3 * d + part * d + h * head_dim..][..head_dim];
        let mut out = vec![0f32; len * d];
        out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
            let mut p = vec![0f32; len];
            for h in 0..heads {
                let q = row(i, 0, h);
                p.iter_mut().enumerate().for_each(|(j, s)| *s = dot(q, row(j, 1, h)) / scale);
                softmax_in_place(&mut p);
                let o = &mut o[h * head_dim..(h + 1) * head_dim];
                for (j, pj) in p.iter().enumerate() {
                    axpy(*pj, row(j, 2, h), o);
                }
            }
        });
        out
    }
}

pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_with_context_zero_fills_outside_the_sequence() {
        let rows = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(with_context(&rows, 1, (0, 4), (-1, 5), 4), [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]);
        assert_eq!(with_context(&rows[1..], 1, (1, 4), (1, 6), 4), [2.0, 3.0, 4.0, 0.0, 0.0]);
    }
}
