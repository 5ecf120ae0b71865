//! 1-D convolutions over `[batch][time][channels]`, split across output channels: each output is one fixed-order sum.

use crate::out_ptr::OutPtr;
use std::borrow::Cow;
use std::ops::{Range, RangeInclusive};

use rayon::prelude::*;

use crate::simd::{self, Tile};

/// Output channels per parallel task of the dense convolutions; any value gives the same bits.
const CHANNELS_PER_TASK: usize = 16;
/// Channels per parallel task of the depthwise convolution; a multiple of the SIMD width.
const DEPTHWISE_CHANNELS_PER_TASK: usize = 16;
/// Output positions that share one pass over a weight row.
const TILE: usize = 8;

/// Each `t_in`-row sequence of `x` between `left` and `right` rows of zeros.
fn pad_rows(x: &[f32], batch: usize, t_in: usize, width: usize, left: usize, right: usize) -> Cow<'_, [f32]> {
    if left == 0 && right == 0 {
        return Cow::Borrowed(x);
    }
    let rows = left + t_in + right;
    let mut out = vec![0f32; batch * rows * width];
    for b in 0..batch {
        let seq = &x[b * t_in * width..(b + 1) * t_in * width];
        out[(b * rows + left) * width..(b * rows + left + t_in) * width].copy_from_slice(seq);
    }
    Cow::Owned(out)
}

fn dot_n<const R: usize>(w: &[f32], patches: &[&[f32]], res: &mut [f32; TILE]) {
    let tile = Tile::<R> { rows: std::array::from_fn(|r| patches[r]), block_sums: [&[][..]; R] };
    let mut out = [0f32; R];
    simd::f32_dot(w, &tile, &mut out);
    res[..R].copy_from_slice(&out);
}

/// Dots one weight row with up to `TILE` patches of the same length.
fn dot_tile(w: &[f32], patches: &[&[f32]], res: &mut [f32; TILE]) {
    match patches.len() {
        8 => dot_n::<8>(w, patches, res),
        7 => dot_n::<7>(w, patches, res),
        6 => dot_n::<6>(w, patches, res),
        5 => dot_n::<5>(w, patches, res),
        4 => dot_n::<4>(w, patches, res),
        3 => dot_n::<3>(w, patches, res),
        2 => dot_n::<2>(w, patches, res),
        _ => dot_n::<1>(w, patches, res),
    }
}

/// `out[row, o] = weight[o] · patch (+ bias[o])` for each `(row, patch)`, a weight row read once per tile.
///
/// # Safety
/// Every `row · c_out + o` must lie inside `out`, and no other task may write these channels.
unsafe fn write_tiles(
    out: OutPtr,
    c_out: usize,
    channels: Range<usize>,
    weight: &[f32],
    bias: Option<&[f32]>,
    items: &[(usize, &[f32])],
) {
    let patch_len = weight.len() / c_out;
    for tile in items.chunks(TILE) {
        let mut patches = [&[][..]; TILE];
        tile.iter().zip(&mut patches).for_each(|((_, p), slot)| *slot = *p);
        for o in channels.clone() {
            let mut res = [0f32; TILE];
            if patch_len > 0 {
                dot_tile(&weight[o * patch_len..(o + 1) * patch_len], &patches[..tile.len()], &mut res);
            }
            for ((row, _), v) in tile.iter().zip(res) {
                *out.at(row * c_out + o) = bias.map_or(v, |bias| v + bias[o]);
            }
        }
    }
}

/// Output channels of one task.
fn task_channels(task: usize, per_task: usize, total: usize) -> Range<usize> {
    task * per_task..((task + 1) * per_task).min(total)
}

/// Kernel length, stride, dilation and zero padding on each side of a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub padding: usize,
}

impl Geometry {
    /// Stride 1 with the padding that keeps the length: `(kernel − 1) · dilation / 2` each side.
    pub fn same(kernel: usize, dilation: usize) -> Self {
        Self { kernel, stride: 1, dilation, padding: (kernel - 1) * dilation / 2 }
    }
}

/// A dense convolution: `out[t, o] = bias[o] + Σ_k Σ_i w[o, i, k] · x[t·stride − padding + k·dilation, i]`.
#[derive(Clone, Debug)]
pub struct Conv1d {
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    padding: usize,
    /// `[c_out][kernel][c_in]`, so a patch of consecutive input rows is one contiguous slice.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl Conv1d {
    /// From PyTorch's `[c_out][c_in][kernel]` weight layout.
    pub fn from_torch(weight: &[f32], bias: Option<Vec<f32>>, c_out: usize, c_in: usize, geometry: Geometry) -> Self {
        let Geometry { kernel, stride, dilation, padding } = geometry;
        assert_eq!(weight.len(), c_out * c_in * kernel, "conv1d: weight is not {c_out} x {c_in} x {kernel}");
        assert!(bias.as_ref().is_none_or(|b| b.len() == c_out), "conv1d: bias is not {c_out} long");
        assert!(kernel > 0 && stride > 0 && dilation > 0, "conv1d: zero kernel, stride or dilation");
        let mut w = vec![0f32; weight.len()];
        for o in 0..c_out {
            for i in 0..c_in {
                for k in 0..kernel {
                    w[(o * kernel + k) * c_in + i] = weight[(o * c_in + i) * kernel + k];
                }
            }
        }
        Self { c_in, c_out, kernel, stride, dilation, padding, weight: w, bias }
    }

    pub fn c_in(&self) -> usize {
        self.c_in
    }

    pub fn c_out(&self) -> usize {
        self.c_out
    }

    pub fn geometry(&self) -> Geometry {
        Geometry { kernel: self.kernel, stride: self.stride, dilation: self.dilation, padding: self.padding }
    }

    /// The weight as `[c_out][kernel][c_in]`.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Output length for `t_in` input rows; zero when the kernel does not fit.
    pub fn out_len(&self, t_in: usize) -> usize {
        let span = (self.kernel - 1) * self.dilation + 1;
        match (t_in + 2 * self.padding).checked_sub(span) {
            Some(n) => n / self.stride + 1,
            None => 0,
        }
    }

    /// Input positions (unpadded, possibly out of range) that outputs `out` read.
    pub fn input_span(&self, out: RangeInclusive<i64>) -> RangeInclusive<i64> {
        let (s, p, reach) = (self.stride as i64, self.padding as i64, ((self.kernel - 1) * self.dilation) as i64);
        out.start() * s - p..=out.end() * s - p + reach
    }

    /// Convolves `batch` sequences of `t_in` rows; returns `batch` sequences of `out_len(t_in)` rows.
    pub fn forward(&self, x: &[f32], batch: usize, t_in: usize) -> Vec<f32> {
        assert_eq!(x.len(), batch * t_in * self.c_in, "conv1d: input is not {batch} x {t_in} x {}", self.c_in);
        let t_out = self.out_len(t_in);
        let (c_in, c_out) = (self.c_in, self.c_out);
        let mut out = vec![0f32; batch * t_out * c_out];
        if t_out == 0 {
            return out;
        }
        let span = (self.kernel - 1) * self.dilation + 1;
        let rows = ((t_out - 1) * self.stride + span).max(self.padding + t_in);
        let xp = pad_rows(x, batch, t_in, c_in, self.padding, rows - self.padding - t_in);
        let patch_len = self.kernel * c_in;
        // Dilated kernels gather their patches first, so that every patch is one contiguous slice.
        let (src, seq_len, step) = match self.dilation {
            1 => (xp, rows * c_in, self.stride * c_in),
            d => {
                let mut cols = vec![0f32; batch * t_out * patch_len];
                for (b, dst) in cols.chunks_exact_mut(t_out * patch_len).enumerate() {
                    for (t, patch) in dst.chunks_exact_mut(patch_len).enumerate() {
                        for (k, part) in patch.chunks_exact_mut(c_in).enumerate() {
                            let row = b * rows + t * self.stride + k * d;
                            part.copy_from_slice(&xp[row * c_in..(row + 1) * c_in]);
                        }
                    }
                }
                (Cow::Owned(cols), t_out * patch_len, patch_len)
            }
        };
        let ptr = OutPtr(out.as_mut_ptr());
        (0..c_out.div_ceil(CHANNELS_PER_TASK)).into_par_iter().for_each(|task| {
            let channels = task_channels(task, CHANNELS_PER_TASK, c_out);
            for b in 0..batch {
                let seq = &src[b * seq_len..(b + 1) * seq_len];
                let items: Vec<_> = (0..t_out).map(|t| (b * t_out + t, &seq[t * step..t * step + patch_len])).collect();
                // SAFETY: rows are outputs of sequence b, and the task's channels are its own.
                unsafe { write_tiles(ptr, c_out, channels.clone(), &self.weight, self.bias.as_deref(), &items) };
            }
        });
        out
    }
}

/// A depthwise convolution, one filter per channel, stride 1.
#[derive(Clone, Debug)]
pub struct DepthwiseConv1d {
    channels: usize,
    kernel: usize,
    dilation: usize,
    padding: usize,
    /// `[kernel][channels]`, so one tap of a time row is one contiguous multiply-add.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl DepthwiseConv1d {
    /// From PyTorch's `[channels][1][kernel]` weight layout.
    pub fn from_torch(weight: &[f32], bias: Option<Vec<f32>>, channels: usize, geometry: Geometry) -> Self {
        let Geometry { kernel, stride, dilation, padding } = geometry;
        assert_eq!(stride, 1, "depthwise conv: only stride 1");
        assert_eq!(weight.len(), channels * kernel, "depthwise conv: weight is not {channels} x 1 x {kernel}");
        assert!(bias.as_ref().is_none_or(|b| b.len() == channels), "depthwise conv: bias is not {channels} long");
        assert!(kernel > 0 && dilation > 0, "depthwise conv: zero kernel or dilation");
        let mut w = vec![0f32; weight.len()];
        for c in 0..channels {
            for k in 0..kernel {
                w[k * channels + c] = weight[c * kernel + k];
            }
        }
        Self { channels, kernel, dilation, padding, weight: w, bias }
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    pub fn geometry(&self) -> Geometry {
        Geometry { kernel: self.kernel, stride: 1, dilation: self.dilation, padding: self.padding }
    }

    /// The weight as `[kernel][channels]`.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Output length for `t_in` input rows; zero when the kernel does not fit.
    pub fn out_len(&self, t_in: usize) -> usize {
        (t_in + 2 * self.padding + 1).saturating_sub((self.kernel - 1) * self.dilation + 1)
    }

    /// Input positions (unpadded, possibly out of range) that outputs `out` read.
    pub fn input_span(&self, out: RangeInclusive<i64>) -> RangeInclusive<i64> {
        let (p, reach) = (self.padding as i64, ((self.kernel - 1) * self.dilation) as i64);
        out.start() - p..=out.end() - p + reach
    }

    /// Convolves `batch` sequences of `t_in` rows; returns `batch` sequences of `out_len(t_in)` rows.
    pub fn forward(&self, x: &[f32], batch: usize, t_in: usize) -> Vec<f32> {
        let c = self.channels;
        assert_eq!(x.len(), batch * t_in * c, "depthwise conv: input is not {batch} x {t_in} x {c}");
        let t_out = self.out_len(t_in);
        let mut out = vec![0f32; batch * t_out * c];
        if t_out == 0 {
            return out;
        }
        let rows = t_in + 2 * self.padding;
        let xp = pad_rows(x, batch, t_in, c, self.padding, self.padding);
        let ptr = OutPtr(out.as_mut_ptr());
        (0..c.div_ceil(DEPTHWISE_CHANNELS_PER_TASK)).into_par_iter().for_each(|task| {
            let channels = task_channels(task, DEPTHWISE_CHANNELS_PER_TASK, c);
            for b in 0..batch {
                let seq = &xp[b * rows * c..(b + 1) * rows * c];
                // Sequence b of the output; this task alone writes its `channels` of every row.
                let dst = ptr.at(b * t_out * c);
                #[cfg(target_arch = "x86_64")]
                if simd::has_avx2() {
                    // SAFETY: the CPU supports AVX2 and FMA; `dst` holds `t_out` rows of `c`.
                    unsafe { depthwise_avx2(self, seq, t_out, channels.clone(), dst) };
                    continue;
                }
                // SAFETY: as above.
                unsafe { depthwise_rows(self, seq, t_out, channels.clone(), dst) };
            }
        });
        out
    }
}

/// One task's channels over one padded sequence; the same fused multiply-adds with or without AVX2.
#[inline(always)]
unsafe fn depthwise_rows(conv: &DepthwiseConv1d, seq: &[f32], t_out: usize, channels: Range<usize>, dst: *mut f32) {
    let (c, n, c0) = (conv.channels, channels.len(), channels.start);
    let mut acc = [0f32; DEPTHWISE_CHANNELS_PER_TASK];
    for t in 0..t_out {
        let acc = &mut acc[..n];
        acc.fill(0.0);
        for k in 0..conv.kernel {
            let row = &seq[(t + k * conv.dilation) * c + c0..][..n];
            let w = &conv.weight[k * c + c0..][..n];
            for ((a, w), x) in acc.iter_mut().zip(w).zip(row) {
                *a = w.mul_add(*x, *a);
            }
        }
        if let Some(bias) = &conv.bias {
            for (a, b) in acc.iter_mut().zip(&bias[c0..c0 + n]) {
                *a += b;
            }
        }
        std::ptr::copy_nonoverlapping(acc.as_ptr(), dst.add(t * c + c0), n);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn depthwise_avx2(conv: &DepthwiseConv1d, seq: &[f32], t_out: usize, channels: Range<usize>, dst: *mut f32) {
    depthwise_rows(conv, seq, t_out, channels, dst)
}

/// A transposed convolution (groups 1): input row `i` adds `w[j, o, k] · x[i, j]` to output `i·s − p + k`.
#[derive(Clone, Debug)]
pub struct ConvTranspose1d {
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    output_padding: usize,
    /// Per phase `(t + padding) % stride`: its taps and `[c_out][taps][c_in]`, taps in input order for one slice.
    phases: Vec<(usize, Vec<f32>)>,
    bias: Option<Vec<f32>>,
}

impl ConvTranspose1d {
    /// From PyTorch's `[c_in][c_out][kernel]` weight layout.
    pub fn from_torch(
        weight: &[f32],
        bias: Option<Vec<f32>>,
        c_in: usize,
        c_out: usize,
        geometry: Geometry,
        output_padding: usize,
    ) -> Self {
        let Geometry { kernel, stride, dilation, padding } = geometry;
        assert_eq!(dilation, 1, "conv transpose: only dilation 1");
        assert_eq!(weight.len(), c_in * c_out * kernel, "conv transpose: weight is not {c_in} x {c_out} x {kernel}");
        assert!(bias.as_ref().is_none_or(|b| b.len() == c_out), "conv transpose: bias is not {c_out} long");
        assert!(kernel > 0 && stride > 0, "conv transpose: zero kernel or stride");
        let phases = (0..stride)
            .map(|r| {
                let taps = if r < kernel { (kernel - r).div_ceil(stride) } else { 0 };
                let mut w = vec![0f32; c_out * taps * c_in];
                for o in 0..c_out {
                    for j in 0..taps {
                        // Patch row j is input q − (taps − 1 − j), which meets the output through tap k.
                        let k = r + stride * (taps - 1 - j);
                        for i in 0..c_in {
                            w[(o * taps + j) * c_in + i] = weight[(i * c_out + o) * kernel + k];
                        }
                    }
                }
                (taps, w)
            })
            .collect();
        Self { c_in, c_out, kernel, stride, padding, output_padding, phases, bias }
    }

    pub fn c_in(&self) -> usize {
        self.c_in
    }

    pub fn c_out(&self) -> usize {
        self.c_out
    }

    pub fn stride(&self) -> usize {
        self.stride
    }

    pub fn padding(&self) -> usize {
        self.padding
    }

    /// Per phase `(t + padding) % stride`: its number of taps and its weight `[c_out][taps][c_in]`.
    pub fn phases(&self) -> &[(usize, Vec<f32>)] {
        &self.phases
    }

    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// Output length for `t_in` input rows; zero when the padding eats it all.
    pub fn out_len(&self, t_in: usize) -> usize {
        if t_in == 0 {
            return 0;
        }
        ((t_in - 1) * self.stride + self.kernel + self.output_padding).saturating_sub(2 * self.padding)
    }

    /// Input positions (possibly out of range) that outputs `out` read.
    pub fn input_span(&self, out: RangeInclusive<i64>) -> RangeInclusive<i64> {
        let (s, p, k) = (self.stride as i64, self.padding as i64, self.kernel as i64);
        (out.start() + p - k + 1).div_euclid(s) + i64::from((out.start() + p - k + 1).rem_euclid(s) != 0)
            ..=(out.end() + p).div_euclid(s)
    }

    /// Upsamples `batch` sequences of `t_in` rows; returns `batch` sequences of `out_len(t_in)` rows.
    pub fn forward(&self, x: &[f32], batch: usize, t_in: usize) -> Vec<f32> {
        let (c_in, c_out, s, p) = (self.c_in, self.c_out, self.stride, self.padding);
        assert_eq!(x.len(), batch * t_in * c_in, "conv transpose: input is not {batch} x {t_in} x {c_in}");
        let t_out = self.out_len(t_in);
        let mut out = vec![0f32; batch * t_out * c_out];
        if t_out == 0 {
            return out;
        }
        let left = self.phases.iter().map(|(taps, _)| *taps).max().unwrap_or(0);
        let rows = left + ((t_out - 1 + p) / s + 1).max(t_in);
        let xp = pad_rows(x, batch, t_in, c_in, left, rows - left - t_in);
        let ptr = OutPtr(out.as_mut_ptr());
        (0..c_out.div_ceil(CHANNELS_PER_TASK)).into_par_iter().for_each(|task| {
            let channels = task_channels(task, CHANNELS_PER_TASK, c_out);
            for b in 0..batch {
                let seq = &xp[b * rows * c_in..(b + 1) * rows * c_in];
                for (r, (taps, weight)) in self.phases.iter().enumerate() {
                    // Outputs t ≡ r − p (mod s) end their patch on input row q = (t + p) / s.
                    let items: Vec<_> = ((r + s - p % s) % s..t_out)
                        .step_by(s)
                        .map(|t| {
                            let first_row = (t + p) / s + left + 1 - taps;
                            (b * t_out + t, &seq[first_row * c_in..(first_row + taps) * c_in])
                        })
                        .collect();
                    // SAFETY: rows are outputs of sequence b, and the task's channels are its own.
                    unsafe { write_tiles(ptr, c_out, channels.clone(), weight, self.bias.as_deref(), &items) };
                }
            }
        });
        out
    }
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
