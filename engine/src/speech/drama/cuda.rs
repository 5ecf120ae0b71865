//! SNAC on the GPU: every codec window of a round decoded together, by conv.cu's kernels in f32.

use std::sync::Arc;

use tensorfold_audio::snac::view::{ChannelConvView, DecoderView, SnakeView};
use tensorfold_audio::snac::{SnacConfig, NUM_CODEBOOKS};
use tensorfold_audio::SnacDecoder;
use tensorfold_kernels::conv::{Conv1d, ConvTranspose1d};
use tensorfold_kernels::cuda::{ConvLaunch, DevPtr, Gpu, GpuError, Windows};

use crate::boundary::{Codec, CodecJob, EngineError};
use crate::error::LoadError;
use crate::memory::{Alloc, Held, MemoryKind};
use crate::speech::drama::stream::window_codes;

/// Frames of windows one pass decodes; a round's windows beyond it take further passes.
pub const PASS_FRAMES: usize = 256;

fn device_err(e: GpuError) -> EngineError {
    EngineError::from(e)
}

/// A convolution's weights on the GPU and the geometry conv.cu reads them with.
#[derive(Clone, Copy)]
struct DevConv {
    w: DevPtr,
    bias: DevPtr,
    c_in: usize,
    c_out: usize,
    taps: usize,
    stride: usize,
    pad_a: usize,
    pad_b: usize,
    dilation: usize,
}

#[derive(Clone, Copy)]
struct DevSnake(DevPtr, DevPtr);

enum DevChannelConv {
    Dense(DevConv),
    Depthwise { w: DevPtr, bias: DevPtr, c: usize, geometry: (usize, usize, usize) },
}

struct DevResidual {
    snake_in: DevSnake,
    conv: DevChannelConv,
    snake_mid: DevSnake,
    pointwise: DevConv,
}

struct DevBlock {
    snake: DevSnake,
    up: DevConv,
    residuals: Vec<DevResidual>,
}

/// Copies host values into memory held under the ledger.
struct Uploads<'a, 'b> {
    gpu: &'a Gpu,
    alloc: &'a mut Alloc<'b>,
    held: Vec<Held>,
}

impl Uploads<'_, '_> {
    fn buffer(&mut self, kind: MemoryKind, bytes: usize) -> Result<DevPtr, LoadError> {
        let held = (self.alloc)(kind, bytes).map_err(|e| LoadError::Device(e.to_string()))?;
        let ptr = held.ptr().0;
        self.held.push(held);
        Ok(ptr)
    }

    fn put(&mut self, values: &[f32]) -> Result<DevPtr, LoadError> {
        let ptr = self.buffer(MemoryKind::Weights, std::mem::size_of_val(values))?;
        self.gpu.upload(ptr, values).map_err(|e| LoadError::Device(e.to_string()))?;
        Ok(ptr)
    }

    fn bias(&mut self, bias: Option<&[f32]>) -> Result<DevPtr, LoadError> {
        bias.map_or(Ok(0), |b| self.put(b))
    }

    fn snake(&mut self, s: SnakeView) -> Result<DevSnake, LoadError> {
        Ok(DevSnake(self.put(s.alpha)?, self.put(s.inv_alpha)?))
    }

    fn conv(&mut self, c: &Conv1d) -> Result<DevConv, LoadError> {
        let g = c.geometry();
        if g.stride != 1 {
            return Err(LoadError::Device(format!("a strided SNAC convolution ({}) has no GPU kernel", g.stride)));
        }
        let (w, bias) = (self.put(c.weight())?, self.bias(c.bias())?);
        let (c_in, c_out) = (c.c_in(), c.c_out());
        Ok(DevConv {
            w,
            bias,
            c_in,
            c_out,
            taps: g.kernel,
            stride: 1,
            pad_a: 0,
            pad_b: g.padding,
            dilation: g.dilation,
        })
    }

    fn transposed(&mut self, c: &ConvTranspose1d) -> Result<DevConv, LoadError> {
        let taps = c.phases().first().map_or(0, |p| p.0);
        if taps == 0 || c.phases().iter().any(|p| p.0 != taps) {
            return Err(LoadError::Device("a SNAC upsampling whose phases differ in taps has no GPU kernel".into()));
        }
        let weights: Vec<f32> = c.phases().iter().flat_map(|p| p.1.iter().copied()).collect();
        let (w, bias) = (self.put(&weights)?, self.bias(c.bias())?);
        let (c_in, c_out, stride, pad_a) = (c.c_in(), c.c_out(), c.stride(), c.padding());
        Ok(DevConv { w, bias, c_in, c_out, taps, stride, pad_a, pad_b: taps - 1, dilation: 1 })
    }

    fn channel_conv(&mut self, c: ChannelConvView) -> Result<DevChannelConv, LoadError> {
        Ok(match c {
            ChannelConvView::Dense(c) => DevChannelConv::Dense(self.conv(c)?),
            ChannelConvView::Depthwise(d) => {
                let g = d.geometry();
                let (w, bias) = (self.put(d.weight())?, self.bias(d.bias())?);
                DevChannelConv::Depthwise { w, bias, c: d.channels(), geometry: (g.kernel, g.dilation, g.padding) }
            }
        })
    }
}

/// The decoder on one GPU with room for `PASS_FRAMES` frames of windows a pass; Drama decodes without noise.
pub struct CudaSnac {
    gpu: Arc<Gpu>,
    config: SnacConfig,
    books: [(DevPtr, DevPtr, DevPtr); NUM_CODEBOOKS],
    /// Latent steps each code of a codebook is held for.
    strides: [usize; NUM_CODEBOOKS],
    codebook_dim: usize,
    latent_dim: usize,
    input: Vec<DevChannelConv>,
    blocks: Vec<DevBlock>,
    snake: DevSnake,
    output: DevConv,
    /// Three activation buffers of `max_rows` latent steps at the widest layer, and the PCM.
    buffers: [DevPtr; 3],
    pcm: DevPtr,
    /// Codes (three a latent step), then the window of each latent step, then each window's start and length.
    meta: DevPtr,
    max_rows: usize,
    latent_per_frame: usize,
    samples_per_latent: usize,
    sample_rate: u32,
    _held: Vec<Held>,
}

impl CudaSnac {
    /// Uploads `codec`'s weights and buffers for passes of `PASS_FRAMES` frames, every byte through `alloc`.
    pub fn load(codec: &SnacDecoder, gpu: Arc<Gpu>, alloc: &mut Alloc) -> Result<CudaSnac, LoadError> {
        let view: DecoderView = codec.view();
        let mut up = Uploads { gpu: &gpu, alloc, held: Vec::new() };
        let mut books = [(0, 0, 0); NUM_CODEBOOKS];
        let mut strides = [1; NUM_CODEBOOKS];
        for (i, b) in view.codebooks.iter().enumerate().take(NUM_CODEBOOKS) {
            let proj = b.out_proj;
            books[i] = (up.put(b.embedding)?, up.put(proj.weight())?, up.bias(proj.bias())?);
            strides[i] = b.stride;
        }
        let input = view.input.iter().map(|c| up.channel_conv(*c)).collect::<Result<Vec<_>, _>>()?;
        let mut blocks = Vec::new();
        for b in &view.blocks {
            let mut residuals = Vec::new();
            for r in &b.residuals {
                residuals.push(DevResidual {
                    snake_in: up.snake(r.snake_in)?,
                    conv: up.channel_conv(r.conv)?,
                    snake_mid: up.snake(r.snake_mid)?,
                    pointwise: up.conv(r.pointwise)?,
                });
            }
            blocks.push(DevBlock { snake: up.snake(b.snake)?, up: up.transposed(b.up)?, residuals });
        }
        let (snake, output) = (up.snake(view.snake)?, up.conv(view.output)?);
        let latent_per_frame = codec.codes_per_frame()[NUM_CODEBOOKS - 1] * strides[NUM_CODEBOOKS - 1];
        let samples_per_latent = codec.hop_length() / latent_per_frame;
        let max_rows = PASS_FRAMES * latent_per_frame;
        let mut widest = view.latent_dim;
        let mut rate = 1;
        for c in &input {
            if let DevChannelConv::Dense(c) = c {
                widest = widest.max(c.c_out);
            }
        }
        for b in &blocks {
            rate *= b.up.stride;
            widest = widest.max(b.up.c_in * rate / b.up.stride).max(b.up.c_out * rate);
        }
        let floats = |n: usize| n * std::mem::size_of::<f32>();
        let mut buffers = [0; 3];
        for b in &mut buffers {
            *b = up.buffer(MemoryKind::Activations, floats(max_rows * widest))?;
        }
        let pcm = up.buffer(MemoryKind::Activations, floats(max_rows * samples_per_latent))?;
        let meta = up.buffer(MemoryKind::Activations, floats(6 * max_rows))?;
        Ok(CudaSnac {
            books,
            strides,
            codebook_dim: view.codebook_dim,
            latent_dim: view.latent_dim,
            input,
            blocks,
            snake,
            output,
            buffers,
            pcm,
            meta,
            max_rows,
            latent_per_frame,
            samples_per_latent,
            sample_rate: codec.sample_rate(),
            config: codec.config().clone(),
            _held: up.held,
            gpu,
        })
    }

    /// Decodes checked windows of `rows` latent steps each that fit one pass; returns each window's kept samples.
    fn pass(&self, jobs: &[(&CodecJob, usize)]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut codes: Vec<u32> = Vec::new();
        let (mut seg_of, mut start, mut len) = (Vec::new(), Vec::new(), Vec::new());
        for (w, &(job, rows)) in jobs.iter().enumerate() {
            start.push(seg_of.len() as i32);
            len.push(rows as i32);
            for l in 0..rows {
                seg_of.push(w as i32);
                codes.extend((0..NUM_CODEBOOKS).map(|b| job.codes[b][l / self.strides[b]]));
            }
        }
        let (rows, m) = (seg_of.len(), self.max_rows as u64);
        // The meta buffer's parts, in bytes: codes, then the window of each latent step, then starts and lengths.
        let win = Windows { seg_of: self.meta + 12 * m, start: self.meta + 16 * m, len: self.meta + 20 * m };
        let g = &self.gpu;
        g.bind().map_err(device_err)?;
        g.upload(self.meta, &codes).map_err(device_err)?;
        g.upload(win.seg_of, &seg_of).map_err(device_err)?;
        g.upload(win.start, &start).map_err(device_err)?;
        g.upload(win.len, &len).map_err(device_err)?;
        let total = self.forward(win, rows).map_err(device_err)?;
        let mut pcm = vec![0f32; total];
        // SAFETY: the PCM buffer holds `max_rows * samples_per_latent` floats, at least `total`; `sync` waits.
        unsafe { g.download_async(&mut pcm, self.pcm) }.map_err(device_err)?;
        g.sync().map_err(device_err)?;
        let per_frame = self.latent_per_frame * self.samples_per_latent;
        let kept = jobs.iter().zip(&start).map(|((job, _), &first)| {
            let at = first as usize * self.samples_per_latent;
            pcm[at + job.keep.start * per_frame..at + job.keep.end * per_frame].to_vec()
        });
        Ok(kept.collect())
    }

    /// Decodes the windows gathered for one pass into their places in `out`, and empties the gathering.
    fn decode_pending(
        &self,
        pending: &mut Vec<(usize, (&CodecJob, usize))>,
        out: &mut [Result<Vec<f32>, EngineError>],
    ) {
        if pending.is_empty() {
            return;
        }
        let windows: Vec<(&CodecJob, usize)> = pending.iter().map(|p| p.1).collect();
        match self.pass(&windows) {
            Ok(pcm) => pending.iter().zip(pcm).for_each(|(p, pcm)| out[p.0] = Ok(pcm)),
            Err(e) => pending.iter().for_each(|p| out[p.0] = Err(e.clone())),
        }
        pending.clear();
    }

    /// Latent steps of a window, once its codebooks, codes and kept frames are checked.
    fn window_rows(&self, job: &CodecJob) -> Result<usize, EngineError> {
        let frames = self.config.window_frames(window_codes(job)?, &job.keep);
        let frames = frames.map_err(|e| EngineError::Codec(e.to_string()))?;
        let rows = frames * self.latent_per_frame;
        if rows > self.max_rows {
            let fault = format!("a window of {frames} frames is more than the {PASS_FRAMES} a pass holds");
            return Err(EngineError::Codec(fault));
        }
        Ok(rows)
    }

    /// Queues the decoder over `rows` latent steps; returns how many samples it writes to the PCM buffer.
    fn forward(&self, win: Windows, rows: usize) -> Result<usize, GpuError> {
        let g = &self.gpu;
        let b = self.buffers;
        g.snac_latent(self.meta, self.books, b[0], rows, self.latent_dim, self.codebook_dim)?;
        let (mut x, mut rate) = (0, 1);
        // The two buffers that do not hold x.
        let others = |x: usize| ((x + 1) % 3, (x + 2) % 3);
        for layer in &self.input {
            let y = others(x).0;
            self.channel_conv(layer, None, (b[x], b[y]), win, rate, rows)?;
            x = y;
        }
        for block in &self.blocks {
            let (t, y) = others(x);
            g.snac_snake(b[x], b[t], (block.snake.0, block.snake.1), block.up.c_in, rows * rate * block.up.c_in)?;
            self.conv(&block.up, b[t], b[y], win, (rate * block.up.stride, rate), rows * rate * block.up.stride)?;
            (x, rate) = (y, rate * block.up.stride);
            let c = block.up.c_out;
            for unit in &block.residuals {
                let (t, u) = others(x);
                g.snac_snake(b[x], b[t], (unit.snake_in.0, unit.snake_in.1), c, rows * rate * c)?;
                self.channel_conv(&unit.conv, Some(unit.snake_mid), (b[t], b[u]), win, rate, rows)?;
                let launch = self.launch(&unit.pointwise, b[u], b[x], (rate, rate), rows * rate);
                g.snac_conv(&ConvLaunch { accumulate: true, ..launch }, win)?;
            }
        }
        let (t, _) = others(x);
        let c = self.output.c_in;
        g.snac_snake(b[x], b[t], (self.snake.0, self.snake.1), c, rows * rate * c)?;
        let launch = self.launch(&self.output, b[t], self.pcm, (rate, rate), rows * rate);
        g.snac_conv(&ConvLaunch { tanh: true, ..launch }, win)?;
        Ok(rows * rate * self.output.c_out)
    }

    /// A stride-1 layer that keeps channels, then `snake` (fused into a depthwise one) when given.
    fn channel_conv(
        &self,
        layer: &DevChannelConv,
        snake: Option<DevSnake>,
        (x, y): (DevPtr, DevPtr),
        win: Windows,
        rate: usize,
        rows: usize,
    ) -> Result<(), GpuError> {
        let snake = snake.map(|s| (s.0, s.1));
        match layer {
            DevChannelConv::Dense(c) => {
                self.conv(c, x, y, win, (rate, rate), rows * rate)?;
                snake.map_or(Ok(()), |s| self.gpu.snac_snake(y, y, s, c.c_out, rows * rate * c.c_out))
            }
            DevChannelConv::Depthwise { w, bias, c, geometry } => {
                self.gpu.snac_depthwise(x, y, *w, *bias, snake, win, rate, *geometry, *c, rows * rate)
            }
        }
    }

    fn conv(
        &self,
        c: &DevConv,
        x: DevPtr,
        y: DevPtr,
        win: Windows,
        rates: (usize, usize),
        rows: usize,
    ) -> Result<(), GpuError> {
        self.gpu.snac_conv(&self.launch(c, x, y, rates, rows), win)
    }

    fn launch(&self, c: &DevConv, x: DevPtr, out: DevPtr, rates: (usize, usize), rows: usize) -> ConvLaunch {
        ConvLaunch {
            x,
            w: c.w,
            bias: c.bias,
            out,
            rate_out: rates.0,
            rate_in: rates.1,
            c_in: c.c_in,
            c_out: c.c_out,
            taps: c.taps,
            stride: c.stride,
            pad_a: c.pad_a,
            pad_b: c.pad_b,
            dilation: c.dilation,
            accumulate: false,
            tanh: false,
            rows,
        }
    }
}

impl Codec for CudaSnac {
    fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    fn decode(&self, job: &CodecJob) -> Result<Vec<f32>, EngineError> {
        self.decode_batch(&[job]).pop().unwrap_or_else(|| Err(EngineError::Codec("no window decoded".into())))
    }

    /// Windows in passes of up to `PASS_FRAMES` frames; a bad window fails alone, a pass that fails fails its windows.
    fn decode_batch(&self, jobs: &[&CodecJob]) -> Vec<Result<Vec<f32>, EngineError>> {
        let mut out: Vec<Result<Vec<f32>, EngineError>> = Vec::with_capacity(jobs.len());
        let mut pending: Vec<(usize, (&CodecJob, usize))> = Vec::new();
        let mut rows = 0;
        for (i, job) in jobs.iter().enumerate() {
            match self.window_rows(job) {
                Ok(r) => {
                    if rows + r > self.max_rows {
                        self.decode_pending(&mut pending, &mut out);
                        rows = 0;
                    }
                    rows += r;
                    pending.push((i, (job, r)));
                    out.push(Ok(Vec::new()));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        self.decode_pending(&mut pending, &mut out);
        out
    }
}
