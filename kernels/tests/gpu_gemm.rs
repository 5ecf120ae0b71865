//! On a GPU: every GEMM kernel gives each row the bits the one-row kernel gives it, whatever the batch. Skips with a
//! one-line reason where no GPU is found.

use std::sync::Arc;

use tensorfold_kernels::cuda::{
    family_segments, family_workspace, gemm_segments, pack_weight, DevPtr, GemmScratch, GemmTuning, Gpu, KernelOptions,
    GEMM_COUNTERS,
};

/// The GPU with `options`, or `None` after printing why the test is skipped.
fn gpu(options: KernelOptions) -> Option<Arc<Gpu>> {
    match Gpu::open(0, None, options) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// splitmix64, so the values repeat from run to run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Device memory freed when it drops.
struct Buffer<'a>(&'a Gpu, DevPtr);

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        self.0.free(self.1, false);
    }
}

/// Uniform values in [-1, 1) rounded to bf16.
fn values(rng: &mut Rng, n: usize) -> Vec<half::bf16> {
    (0..n).map(|_| half::bf16::from_f32((rng.below(1 << 16) as f32 / 32768.0) - 1.0)).collect()
}

/// The kernels before the TMA family: packed weights, `gemm_segments`.
const OLDER: KernelOptions = KernelOptions {
    overlap: true,
    wgmma: false,
    gemm: GemmTuning::DEFAULT,
    family: false,
    wide_decode: true,
    wg_prompt: false,
    moe_split: false,
};

#[test]
fn test_every_gemm_kernel_gives_a_row_the_bits_the_one_row_kernel_gives_it() {
    rows_match_the_one_row_kernel(OLDER);
}

#[test]
fn test_the_wgmma_kernel_gives_a_row_the_bits_the_one_row_kernel_gives_it() {
    rows_match_the_one_row_kernel(KernelOptions { wgmma: true, ..OLDER });
}

#[test]
fn test_the_tma_family_gives_a_row_the_bits_it_has_alone_and_fuses_swiglu_exactly() {
    let Some(g) = gpu(KernelOptions::default()) else { return };
    let mut rng = Rng(11);
    // Every decode kernel (1, 4, 5, 16, 17, 32 rows) and the TMA tiles from 64 x 32 to 128 x 256.
    let batches = [1, 3, 4, 5, 16, 17, 32, 33, 64, 65, 130, 300];
    // One segment, four (qkv and o of Llama-8B, N not a tile's multiple), eight (Orpheus-3B's down), a tiny model's,
    // and Llama-8B's down, whose long segments run split from 33 to 128 rows.
    for (n, k) in [(12288, 256), (6144, 4096), (1000, 2048), (3072, 8192), (96, 576), (4096, 14336)] {
        if !g.natural(n, k) {
            eprintln!("skipped: no TMA family on this GPU");
            return;
        }
        eprintln!("{n} x {k}: {} K segments", family_segments(n, k));
        let m = *batches.last().unwrap();
        let a = values(&mut rng, m * k);
        let w = values(&mut rng, n * k);
        let bias: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.01).collect();
        let buf = |bytes: usize| Buffer(&g, g.malloc(bytes.max(4), false).unwrap());
        let (da, dw, db, dc, dact, dref) =
            (buf(2 * m * k), buf(2 * w.len()), buf(4 * n), buf(4 * m * n), buf(m * n), buf(m * n));
        let (ws_floats, counters) = (family_workspace(n, k), buf(4 * GEMM_COUNTERS));
        let ws = buf(4 * ws_floats);
        let scratch = GemmScratch { ws: ws.1, ws_floats, counters: counters.1 };
        g.upload(da.1, &a).unwrap();
        g.upload(dw.1, &w).unwrap();
        g.upload(db.1, &bias).unwrap();
        g.upload(counters.1, &vec![0u32; GEMM_COUNTERS]).unwrap();
        let read = |ptr: DevPtr, len: usize| -> Vec<u32> {
            let mut out = vec![0u32; len];
            // SAFETY: the buffer holds at least `len` words and `out` lives until the sync.
            unsafe { g.download_async(&mut out, ptr).unwrap() };
            g.sync().unwrap();
            out
        };
        let mut alone = Vec::new();
        for r in 0..m {
            g.gemm(da.1 + (2 * r * k) as u64, dw.1, db.1, dc.1, (1, n, k), &scratch).unwrap();
            alone.extend(read(dc.1, n));
        }
        for rows in batches {
            g.gemm(da.1, dw.1, db.1, dc.1, (rows, n, k), &scratch).unwrap();
            let got = read(dc.1, rows * n);
            let first = (0..rows * n).find(|&i| got[i] != alone[i]);
            assert!(first.is_none(), "{n} x {k}, {rows} rows: element {first:?} differs from its row alone");
            if g.fuses_swiglu(rows, n, k) {
                // The fused epilogue and the SwiGLU kernel over the same product (no bias) give the same bf16.
                g.gemm(da.1, dw.1, 0, dc.1, (rows, n, k), &scratch).unwrap();
                g.swiglu(dc.1, dref.1, rows, n / 2).unwrap();
                g.gemm_swiglu(da.1, dw.1, dact.1, (rows, n, k), &scratch).unwrap();
                let (fused, apart) = (read(dact.1, rows * n / 4), read(dref.1, rows * n / 4));
                let first = (0..fused.len()).find(|&i| fused[i] != apart[i]);
                assert!(first.is_none(), "{n} x {k}, {rows} rows: fused SwiGLU differs at pair {first:?}");
            }
        }
        assert!(read(counters.1, GEMM_COUNTERS).iter().all(|&v| v == 0), "the counters are left zero");
    }
}

fn rows_match_the_one_row_kernel(options: KernelOptions) {
    let Some(g) = gpu(options) else { return };
    let mut rng = Rng(7);
    // Row counts that reach the 8- and 16-row kernels, the untiled wide one and the 64- and 128-row tiles.
    let batches = [5, 12, 40, 130, 300];
    // One K segment and several (the 128-row tiles with and without the fold), and a width that is not a tile's.
    // Then 8 and 16 segments, where the untiled wide kernel takes every batch over 16 rows.
    for (n, k) in [(12288, 256), (12288, 2048), (1000, 2048), (1024, 4096), (1024, 8192)] {
        eprintln!("{n} x {k}: {} K segments", gemm_segments(n, k, GemmTuning::default()));
        let m = *batches.last().unwrap();
        let a = values(&mut rng, m * k);
        let w = pack_weight(&values(&mut rng, n * k), n, k);
        let bias: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.01).collect();
        let buf = |bytes| Buffer(&g, g.malloc(bytes, false).unwrap());
        let (da, dw, db, dc, dact) = (buf(2 * m * k), buf(2 * w.len()), buf(4 * n), buf(4 * m * n), buf(m * n));
        g.upload(da.1, &a).unwrap();
        g.upload(dw.1, &w).unwrap();
        g.upload(db.1, &bias).unwrap();
        let read_f32 = |rows: usize| -> Vec<u32> {
            let mut out = vec![0f32; rows * n];
            // SAFETY: the buffer holds m x n floats and `out` lives until the sync.
            unsafe { g.download_async(&mut out, dc.1).unwrap() };
            g.sync().unwrap();
            out.iter().map(|v| v.to_bits()).collect()
        };
        let read_act = |rows: usize| -> Vec<u16> {
            let mut out = vec![0u16; rows * n / 2];
            // SAFETY: the buffer holds m x n / 2 bf16 values and `out` lives until the sync.
            unsafe { g.download_async(&mut out, dact.1).unwrap() };
            g.sync().unwrap();
            out
        };
        // Each row alone through the one-row kernel: with the bias, and fused into SwiGLU where that runs.
        let fuse = n.is_multiple_of(16) && g.fuses_swiglu(1, n, k);
        let (mut alone, mut alone_act) = (Vec::new(), Vec::new());
        for r in 0..m {
            let row = da.1 + (2 * r * k) as u64;
            g.gemm(row, dw.1, db.1, dc.1, (1, n, k), &GemmScratch::default()).unwrap();
            alone.extend(read_f32(1));
            if fuse {
                g.gemm_swiglu(row, dw.1, dact.1, (1, n, k), &GemmScratch::default()).unwrap();
                alone_act.extend(read_act(1));
            }
        }
        for rows in batches {
            g.gemm(da.1, dw.1, db.1, dc.1, (rows, n, k), &GemmScratch::default()).unwrap();
            let got = read_f32(rows);
            let first = (0..rows * n).find(|&i| got[i] != alone[i]);
            assert!(first.is_none(), "{n} x {k}, {rows} rows: element {first:?} differs from its row alone");
            if fuse {
                g.gemm_swiglu(da.1, dw.1, dact.1, (rows, n, k), &GemmScratch::default()).unwrap();
                assert_eq!(read_act(rows), alone_act[..rows * n / 2], "{n} x {k}, {rows} rows: SwiGLU differs");
            }
        }
    }
}
