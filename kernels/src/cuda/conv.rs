//! Host side of SNAC's decoder kernels (conv.cu): many codec windows, packed row after row, in each launch.

use std::sync::atomic::Ordering;

use super::{Arg, DevPtr, Gpu, GpuError};

/// Output channels below which a convolution runs one thread an output instead of in GEMM tiles.
const NARROW_CHANNELS: usize = 16;

/// Threads of the elementwise and one-output-a-thread kernels.
const THREADS: u32 = 256;

/// Where each row of a packed batch of windows belongs: per latent step its window, and per window its first
/// latent step and length, as device arrays of i32.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub seg_of: DevPtr,
    pub start: DevPtr,
    pub len: DevPtr,
}

/// One convolution over packed windows; see `ConvArgs` in conv.cu for how rows meet their inputs.
#[derive(Clone, Copy, Debug)]
pub struct ConvLaunch {
    pub x: DevPtr,
    /// `[phases][c_out][taps][c_in]` f32.
    pub w: DevPtr,
    /// 0 for none.
    pub bias: DevPtr,
    pub out: DevPtr,
    pub rate_out: usize,
    pub rate_in: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub taps: usize,
    pub stride: usize,
    pub pad_a: usize,
    pub pad_b: usize,
    pub dilation: usize,
    /// Adds the result to `out` instead of writing it (a residual).
    pub accumulate: bool,
    /// Applies tanh to the result (the decoder's last layer).
    pub tanh: bool,
    pub rows: usize,
}

fn grid_for(n: usize) -> usize {
    n.div_ceil(THREADS as usize).clamp(1, 1 << 20)
}

fn int(v: usize) -> Arg {
    Arg::Int(v as i32)
}

impl Gpu {
    /// Launches after this one wait for the whole of the kernel before them.
    fn whole_launches(&self) {
        self.narrow.store(false, Ordering::Relaxed);
    }

    /// z[l] = the sum over codebooks of out_proj(embedding[code]); `books` are (embedding, out_proj weight, bias).
    pub fn snac_latent(
        &self,
        codes: DevPtr,
        books: [(DevPtr, DevPtr, DevPtr); 3],
        z: DevPtr,
        rows: usize,
        width: usize,
        dim: usize,
    ) -> Result<(), GpuError> {
        self.whole_launches();
        let [(e0, w0, b0), (e1, w1, b1), (e2, w2, b2)] = books;
        let args = [codes, e0, e1, e2, w0, w1, w2, b0, b1, b2, z].map(Arg::Ptr);
        let args: Vec<Arg> = args.into_iter().chain([int(width), int(dim)]).collect();
        self.launch(&self.f.snac_latent, (rows, 1, 1), THREADS, 0, &args)
    }

    /// y = x + sin²(αx) / α per channel over `n` values in rows of `c`; `y` may be `x`.
    pub fn snac_snake(
        &self,
        x: DevPtr,
        y: DevPtr,
        snake: (DevPtr, DevPtr),
        c: usize,
        n: usize,
    ) -> Result<(), GpuError> {
        self.whole_launches();
        let args = [Arg::Ptr(x), Arg::Ptr(y), Arg::Ptr(snake.0), Arg::Ptr(snake.1), int(c), int(n)];
        self.launch(&self.f.snac_snake, (grid_for(n), 1, 1), THREADS, 0, &args)
    }

    /// A depthwise convolution `[kernel][c]` with bias over `rows` rows, then Snake when `snake` is given.
    #[allow(clippy::too_many_arguments)]
    pub fn snac_depthwise(
        &self,
        x: DevPtr,
        y: DevPtr,
        w: DevPtr,
        bias: DevPtr,
        snake: Option<(DevPtr, DevPtr)>,
        win: Windows,
        rate: usize,
        geometry: (usize, usize, usize),
        c: usize,
        rows: usize,
    ) -> Result<(), GpuError> {
        self.whole_launches();
        let (kernel, dilation, padding) = geometry;
        let (alpha, inv) = snake.unwrap_or((0, 0));
        let n = rows * c;
        let ptrs = [x, y, w, bias, alpha, inv, win.seg_of, win.start, win.len].map(Arg::Ptr);
        let args: Vec<Arg> =
            ptrs.into_iter().chain([rate, c, kernel, dilation, padding, n].into_iter().map(int)).collect();
        self.launch(&self.f.snac_depthwise, (grid_for(n), 1, 1), THREADS, 0, &args)
    }

    /// A dense or transposed convolution over packed windows, in GEMM tiles or, for few channels, a thread an output.
    pub fn snac_conv(&self, c: &ConvLaunch, win: Windows) -> Result<(), GpuError> {
        self.whole_launches();
        let ptrs = [c.x, c.w, c.bias, c.out, win.seg_of, win.start, win.len].map(Arg::Ptr);
        let dims = [c.rate_out, c.rate_in, c.c_in, c.c_out, c.taps, c.stride, c.pad_a, c.pad_b, c.dilation];
        let flags = [usize::from(c.accumulate), usize::from(c.tanh), c.rows];
        let args: Vec<Arg> = ptrs.into_iter().chain(dims.into_iter().chain(flags).map(int)).collect();
        if c.c_out < NARROW_CHANNELS {
            return self.launch(&self.f.snac_conv_rows, (grid_for(c.rows * c.c_out), 1, 1), THREADS, 0, &args);
        }
        let grid = ((c.rows / c.stride).div_ceil(64), c.c_out.div_ceil(64), c.stride);
        self.launch(&self.f.snac_conv_gemm, grid, 256, 0, &args)
    }
}
