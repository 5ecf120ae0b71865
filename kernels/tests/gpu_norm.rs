//! On a GPU: the norm kernels, at every width and block size, give the bits of the order norm.cu defines (the sums of
//! a 1024-thread block), replayed here on the CPU. Skips with a one-line reason where no GPU is found.

mod common;

use common::{bf16_bits, values};
use tensorfold_kernels::cuda::{DevPtr, Gpu, KernelOptions, NORM_NARROW_WIDTH};

/// norm(x + delta) * w as bf16 bits, summed as a 1024-thread block: thread t from +0 over t, t + 1024, ... by fma,
/// the 32 lanes of a warp by xor butterflies, then the 32 warp sums in order.
fn reference(v: &[f32], w: &[f32], eps: f32) -> Vec<u16> {
    let h = v.len();
    let mut lanes = [0f32; 1024];
    for (i, &x) in v.iter().enumerate() {
        lanes[i % 1024] = x.mul_add(x, lanes[i % 1024]);
    }
    let warp_sums: Vec<f32> = lanes
        .chunks(32)
        .map(|warp| {
            let mut s = warp.to_vec();
            for o in [16, 8, 4, 2, 1] {
                s = (0..32).map(|l| s[l] + s[l ^ o]).collect();
            }
            s[0]
        })
        .collect();
    let total = warp_sums[1..].iter().fold(warp_sums[0], |t, &s| t + s);
    let inv = 1.0f32 / (total / h as f32 + eps).sqrt();
    v.iter().zip(w).map(|(&x, &g)| bf16_bits(g * (x * inv))).collect()
}

#[test]
fn test_norms_give_the_bits_of_a_1024_thread_block_at_every_width() {
    let g = match Gpu::open(0, None, KernelOptions::default()) {
        Ok(g) => g,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    let eps = 1e-5f32;
    let rows = 3;
    // Narrow blocks up to NORM_NARROW_WIDTH (a whole block's multiple and not), 1024-thread blocks past it.
    for h in [64, 576, 1000, 3072, NORM_NARROW_WIDTH, NORM_NARROW_WIDTH + 904, 8192] {
        let x = values(h as u64, rows * h, 2.0);
        let delta = values(h as u64 + 1, rows * h, 2.0);
        let w = values(h as u64 + 2, h, 2.0);
        let alloc = |bytes: usize| g.malloc(bytes, false).unwrap();
        let (dx, dd, dw, dout) = (alloc(rows * h * 4), alloc(rows * h * 4), alloc(h * 4), alloc(rows * h * 2));
        let read = |ptr: DevPtr, n: usize| {
            let mut out = vec![0u16; n];
            // SAFETY: the buffer holds n bf16 values and `out` lives until the sync.
            unsafe { g.download_async(&mut out, ptr).unwrap() };
            g.sync().unwrap();
            out
        };
        g.upload(dx, &x).unwrap();
        g.upload(dd, &delta).unwrap();
        g.upload(dw, &w).unwrap();
        g.rms_norm(dx, 0, rows, dw, dout, h, eps).unwrap();
        let plain = read(dout, rows * h);
        g.add_rms_norm(dx, dd, dw, dout, rows, h, eps).unwrap();
        let added = read(dout, rows * h);
        for r in 0..rows {
            let row = &x[r * h..(r + 1) * h];
            let sum: Vec<f32> = row.iter().zip(&delta[r * h..(r + 1) * h]).map(|(a, b)| a + b).collect();
            assert_eq!(plain[r * h..(r + 1) * h], reference(row, &w, eps), "rms_norm, width {h}, row {r}");
            assert_eq!(added[r * h..(r + 1) * h], reference(&sum, &w, eps), "add_rms_norm, width {h}, row {r}");
        }
        for p in [dx, dd, dw, dout] {
            g.free(p, false);
        }
    }
}
