//! The decoder's layers in order with their folded weights, for a backend that runs them elsewhere (the GPU).

use tensorfold_kernels::conv::{Conv1d, ConvTranspose1d, DepthwiseConv1d};

/// Snake's per-channel α and `1 / (α + 1e-9)`.
#[derive(Clone, Copy)]
pub struct SnakeView<'a> {
    pub alpha: &'a [f32],
    pub inv_alpha: &'a [f32],
}

/// A stride-1 convolution that keeps its channels.
#[derive(Clone, Copy)]
pub enum ChannelConvView<'a> {
    Dense(&'a Conv1d),
    Depthwise(&'a DepthwiseConv1d),
}

/// One codebook: `[codebook_size][codebook_dim]` embeddings, projected by `out_proj`, held for `stride` latent steps.
pub struct CodebookView<'a> {
    pub stride: usize,
    pub embedding: &'a [f32],
    pub out_proj: &'a Conv1d,
}

/// `x + pointwise(snake_mid(conv(snake_in(x))))`.
pub struct ResidualView<'a> {
    pub snake_in: SnakeView<'a>,
    pub conv: ChannelConvView<'a>,
    pub snake_mid: SnakeView<'a>,
    pub pointwise: &'a Conv1d,
}

/// Snake, the upsampling transposed convolution, then the residual units; the noise is off on this path.
pub struct BlockView<'a> {
    pub snake: SnakeView<'a>,
    pub up: &'a ConvTranspose1d,
    pub residuals: Vec<ResidualView<'a>>,
}

/// Codes to PCM: the quantizer's codebooks, the input convolutions, the blocks, Snake, the output convolution, tanh.
pub struct DecoderView<'a> {
    pub codebooks: Vec<CodebookView<'a>>,
    pub codebook_dim: usize,
    pub latent_dim: usize,
    pub input: Vec<ChannelConvView<'a>>,
    pub blocks: Vec<BlockView<'a>>,
    pub snake: SnakeView<'a>,
    pub output: &'a Conv1d,
}
