//! SNAC's decoding path over time-major `[time][channels]` activations: quantizer, blocks, decoder.

use std::ops::RangeInclusive;

use tensorfold_kernels::conv::{Conv1d, ConvTranspose1d, DepthwiseConv1d, Geometry};

use super::checkpoint::Tensors;
use super::config::{SnacConfig, NUM_CODEBOOKS};
use super::noise;
use super::snake::Snake;
use super::view::{BlockView, ChannelConvView, CodebookView, DecoderView, ResidualView};
use crate::error::CodecError;

/// Kernel length of every stride-1 convolution between the latent and the PCM.
const KERNEL: usize = 7;
/// Dilations of the three residual units of each decoder block.
const DILATIONS: [usize; 3] = [1, 3, 9];

fn conv(t: &Tensors, prefix: &str, c_out: usize, c_in: usize, g: Geometry, bias: bool) -> Result<Conv1d, CodecError> {
    let weight = t.conv_weight(prefix, &[c_out, c_in, g.kernel])?;
    let bias = if bias { Some(t.get(&format!("{prefix}.bias"), &[c_out])?) } else { None };
    Ok(Conv1d::from_torch(&weight, bias, c_out, c_in, g))
}

fn snake(t: &Tensors, name: &str, channels: usize) -> Result<Snake, CodecError> {
    Ok(Snake::new(t.get(name, &[1, channels, 1])?))
}

/// A stride-1 convolution that keeps channels: depthwise (groups = channels) or dense (groups = 1).
enum ChannelConv {
    Dense(Conv1d),
    Depthwise(DepthwiseConv1d),
}

impl ChannelConv {
    fn load(t: &Tensors, prefix: &str, channels: usize, g: Geometry, depthwise: bool) -> Result<Self, CodecError> {
        if !depthwise {
            return Ok(Self::Dense(conv(t, prefix, channels, channels, g, true)?));
        }
        let weight = t.conv_weight(prefix, &[channels, 1, g.kernel])?;
        let bias = t.get(&format!("{prefix}.bias"), &[channels])?;
        Ok(Self::Depthwise(DepthwiseConv1d::from_torch(&weight, Some(bias), channels, g)))
    }

    fn forward(&self, x: &[f32], len: usize) -> Vec<f32> {
        match self {
            Self::Dense(c) => c.forward(x, 1, len),
            Self::Depthwise(c) => c.forward(x, 1, len),
        }
    }

    fn input_span(&self, out: RangeInclusive<i64>) -> RangeInclusive<i64> {
        match self {
            Self::Dense(c) => c.input_span(out),
            Self::Depthwise(c) => c.input_span(out),
        }
    }

    fn view(&self) -> ChannelConvView<'_> {
        match self {
            Self::Dense(c) => ChannelConvView::Dense(c),
            Self::Depthwise(c) => ChannelConvView::Depthwise(c),
        }
    }
}

/// One codebook: code to embedding to `out_proj`, held for `stride` latent steps.
struct Codebook {
    stride: usize,
    embedding: Vec<f32>,
    out_proj: Conv1d,
}

/// `quantizer.from_codes`: the sum over codebooks of each projected code, repeated by its stride.
pub(crate) struct Quantizer {
    codebooks: Vec<Codebook>,
    codebook_dim: usize,
    latent_dim: usize,
}

impl Quantizer {
    pub(crate) fn load(t: &Tensors, c: &SnacConfig) -> Result<Self, CodecError> {
        let (dim, latent_dim) = (c.codebook_dim, c.latent_dim());
        let codebooks = (0..NUM_CODEBOOKS)
            .map(|i| {
                let p = format!("quantizer.quantizers.{i}");
                Ok(Codebook {
                    stride: c.vq_strides[i],
                    embedding: t.get(&format!("{p}.codebook.weight"), &[c.codebook_size, dim])?,
                    out_proj: conv(t, &format!("{p}.out_proj"), latent_dim, dim, Geometry::same(1, 1), true)?,
                })
            })
            .collect::<Result<_, CodecError>>()?;
        Ok(Self { codebooks, codebook_dim: dim, latent_dim })
    }

    /// The codebooks, and with `decoder` the whole path from codes to PCM.
    pub(crate) fn view<'a>(&'a self, decoder: &'a Decoder) -> DecoderView<'a> {
        let codebooks = self
            .codebooks
            .iter()
            .map(|b| CodebookView { stride: b.stride, embedding: &b.embedding, out_proj: &b.out_proj })
            .collect();
        let residual = |u: &'a ResidualUnit| ResidualView {
            snake_in: u.snake_in.view(),
            conv: u.conv.view(),
            snake_mid: u.snake_mid.view(),
            pointwise: &u.pointwise,
        };
        let blocks = decoder
            .blocks
            .iter()
            .map(|b| BlockView {
                snake: b.snake.view(),
                up: &b.up,
                residuals: b.residuals.iter().map(residual).collect(),
            })
            .collect();
        DecoderView {
            codebooks,
            codebook_dim: self.codebook_dim,
            latent_dim: self.latent_dim,
            input: decoder.input.iter().map(ChannelConv::view).collect(),
            blocks,
            snake: decoder.snake.view(),
            output: &decoder.output,
        }
    }

    /// The latent `[len][latent_dim]` for codes already checked against the codebook size and `len`.
    pub(crate) fn latent(&self, codes: [&[u32]; NUM_CODEBOOKS], len: usize) -> Vec<f32> {
        let (dim, width) = (self.codebook_dim, self.latent_dim);
        let mut z = vec![0f32; len * width];
        for (book, codes) in self.codebooks.iter().zip(codes) {
            let embedded: Vec<f32> = codes
                .iter()
                .flat_map(|&code| &book.embedding[code as usize * dim..(code as usize + 1) * dim])
                .copied()
                .collect();
            let projected = book.out_proj.forward(&embedded, 1, codes.len());
            for (l, row) in z.chunks_exact_mut(width).enumerate() {
                let from = &projected[l / book.stride * width..(l / book.stride + 1) * width];
                row.iter_mut().zip(from).for_each(|(a, b)| *a += b);
            }
        }
        z
    }
}

/// `x + pointwise(snake(conv(snake(x))))` with a dilated kernel-7 convolution.
struct ResidualUnit {
    snake_in: Snake,
    conv: ChannelConv,
    snake_mid: Snake,
    pointwise: Conv1d,
}

impl ResidualUnit {
    fn load(t: &Tensors, p: &str, dim: usize, dilation: usize, depthwise: bool) -> Result<Self, CodecError> {
        Ok(Self {
            snake_in: snake(t, &format!("{p}.block.0.alpha"), dim)?,
            conv: ChannelConv::load(t, &format!("{p}.block.1"), dim, Geometry::same(KERNEL, dilation), depthwise)?,
            snake_mid: snake(t, &format!("{p}.block.2.alpha"), dim)?,
            pointwise: conv(t, &format!("{p}.block.3"), dim, dim, Geometry::same(1, 1), true)?,
        })
    }

    fn forward(&self, x: &mut [f32], len: usize) {
        let mut y = x.to_vec();
        self.snake_in.forward(&mut y);
        let mut y = self.conv.forward(&y, len);
        self.snake_mid.forward(&mut y);
        let y = self.pointwise.forward(&y, 1, len);
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
    }
}

/// Snake, a transposed convolution that upsamples by `stride`, optional noise, three residual units.
struct DecoderBlock {
    stride: usize,
    snake: Snake,
    up: ConvTranspose1d,
    noise: Option<Conv1d>,
    residuals: Vec<ResidualUnit>,
}

impl DecoderBlock {
    fn load(t: &Tensors, p: &str, dims: (usize, usize), stride: usize, c: &SnacConfig) -> Result<Self, CodecError> {
        let (c_in, c_out) = dims;
        let up_prefix = format!("{p}.block.1");
        let weight = t.conv_weight(&up_prefix, &[c_in, c_out, 2 * stride])?;
        let bias = t.get(&format!("{up_prefix}.bias"), &[c_out])?;
        let g = Geometry { kernel: 2 * stride, stride, dilation: 1, padding: stride.div_ceil(2) };
        let noise = match c.noise {
            true => Some(conv(t, &format!("{p}.block.2.linear"), c_out, c_out, Geometry::same(1, 1), false)?),
            false => None,
        };
        let first = 2 + usize::from(c.noise);
        let residuals = DILATIONS
            .iter()
            .enumerate()
            .map(|(i, d)| ResidualUnit::load(t, &format!("{p}.block.{}", first + i), c_out, *d, c.depthwise))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            stride,
            snake: snake(t, &format!("{p}.block.0.alpha"), c_in)?,
            up: ConvTranspose1d::from_torch(&weight, Some(bias), c_in, c_out, g, stride % 2),
            noise,
            residuals,
        })
    }

    /// Upsamples `len` rows; `noise` is (seed, block index, absolute position of the first output row).
    fn forward(&self, mut x: Vec<f32>, len: usize, noise: Option<(u64, usize, u64)>) -> (Vec<f32>, usize) {
        self.snake.forward(&mut x);
        let mut y = self.up.forward(&x, 1, len);
        let len = self.up.out_len(len);
        if let (Some(linear), Some((seed, block, start))) = (&self.noise, noise) {
            let h = linear.forward(&y, 1, len);
            let width = linear.c_out();
            for (pos, (row, h)) in y.chunks_exact_mut(width).zip(h.chunks_exact(width)).enumerate() {
                let n = noise::normal(seed, block, start + pos as u64);
                row.iter_mut().zip(h).for_each(|(a, h)| *a += n * h);
            }
        }
        for unit in &self.residuals {
            unit.forward(&mut y, len);
        }
        (y, len)
    }
}

/// The decoder from the latent to PCM: input convolutions, upsampling blocks, Snake, output convolution, tanh.
pub(crate) struct Decoder {
    input: Vec<ChannelConv>,
    blocks: Vec<DecoderBlock>,
    snake: Snake,
    output: Conv1d,
}

impl Decoder {
    pub(crate) fn load(t: &Tensors, c: &SnacConfig) -> Result<Self, CodecError> {
        let (latent, dim, same) = (c.latent_dim(), c.decoder_dim, Geometry::same(KERNEL, 1));
        let input = match c.depthwise {
            true => vec![
                ChannelConv::load(t, "decoder.model.0", latent, same, true)?,
                ChannelConv::Dense(conv(t, "decoder.model.1", dim, latent, Geometry::same(1, 1), true)?),
            ],
            false => vec![ChannelConv::Dense(conv(t, "decoder.model.0", dim, latent, same, true)?)],
        };
        let blocks = c
            .decoder_rates
            .iter()
            .enumerate()
            .map(|(i, stride)| {
                let p = format!("decoder.model.{}", input.len() + i);
                DecoderBlock::load(t, &p, (dim >> i, dim >> (i + 1)), *stride, c)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (last, width) = (input.len() + blocks.len(), dim >> blocks.len());
        Ok(Self {
            snake: snake(t, &format!("decoder.model.{last}.alpha"), width)?,
            output: conv(t, &format!("decoder.model.{}", last + 1), 1, width, same, true)?,
            input,
            blocks,
        })
    }

    /// PCM for `len` latent rows starting at absolute latent step `offset`; `noise` seeds the NoiseBlocks.
    pub(crate) fn forward(&self, mut x: Vec<f32>, mut len: usize, offset: u64, noise: Option<u64>) -> Vec<f32> {
        for layer in &self.input {
            x = layer.forward(&x, len);
        }
        let mut rate = 1;
        for (i, block) in self.blocks.iter().enumerate() {
            rate *= block.stride as u64;
            (x, len) = block.forward(x, len, noise.map(|seed| (seed, i, offset * rate)));
        }
        self.snake.forward(&mut x);
        let mut pcm = self.output.forward(&x, 1, len);
        pcm.iter_mut().for_each(|v| *v = v.tanh());
        pcm
    }

    /// The span each zero-padded layer input reads for output `samples`, with that input's steps per latent step.
    pub(crate) fn reach(&self, samples: RangeInclusive<i64>) -> Vec<(RangeInclusive<i64>, i64)> {
        let mut rate: i64 = self.blocks.iter().map(|b| b.stride as i64).product();
        let mut span = self.output.input_span(samples);
        let mut seen = vec![(span.clone(), rate)];
        for block in self.blocks.iter().rev() {
            for unit in block.residuals.iter().rev() {
                let read = unit.conv.input_span(span.clone());
                span = (*read.start()).min(*span.start())..=(*read.end()).max(*span.end());
                seen.push((span.clone(), rate));
            }
            rate /= block.stride as i64;
            span = block.up.input_span(span);
            seen.push((span.clone(), rate));
        }
        for layer in self.input.iter().rev() {
            span = layer.input_span(span);
            seen.push((span.clone(), 1));
        }
        seen
    }
}
