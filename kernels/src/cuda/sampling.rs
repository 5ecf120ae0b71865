//! Host side of sampling.cu: greedy picks, and sampled rows cut to the tokens their draws can take.

use std::sync::atomic::Ordering;

use super::{Arg, DevPtr, Gpu, GpuError};

/// u32 a keep row takes in `KeepRows::scratch`: a count for each of the 1024 threads, then the row's max.
pub const KEEP_SCRATCH: usize = 1025;

/// Where `keep_rows` reads and writes, on the device.
#[derive(Clone, Copy, Debug)]
pub struct KeepRows {
    /// The round's logits rows; the repetition penalty is applied to the kept ones in place.
    pub logits: DevPtr,
    /// For keep row r: `rows[r]` (u32), its row within `logits`.
    pub rows: DevPtr,
    /// For keep row r: its temperature and repetition penalty (f32) at 2r and 2r + 1.
    pub params: DevPtr,
    /// For keep row r: its distinct history ids (u32) are `history[hist_off[r]..hist_off[r + 1]]`.
    pub hist_off: DevPtr,
    pub history: DevPtr,
    /// `KEEP_SCRATCH` u32 a keep row.
    pub scratch: DevPtr,
    /// For keep row r: how many pairs it keeps (u32).
    pub counts: DevPtr,
    /// The pairs (id, logit bits), every row's after the rows before it.
    pub out: DevPtr,
}

impl Gpu {
    /// out[r] = the index of the largest of row r's `vocab` logits, as `ops::argmax` picks it, for `n` rows.
    pub fn argmax_rows(&self, logits: DevPtr, n: usize, vocab: usize, out: DevPtr) -> Result<(), GpuError> {
        // After a graph, a launch waits for the whole of it.
        self.narrow.store(false, Ordering::Relaxed);
        let args = [Arg::Ptr(logits), Arg::Int(vocab as i32), Arg::Ptr(out)];
        self.launch(&self.f.argmax_rows, (n, 1, 1), 1024, 0, &args)
    }

    /// `n` sampled rows cut to the tokens their draws can take (`sampling::kept` after the repetition penalty): in
    /// id order, packed row after row from `k.out`, with each row's count in `k.counts`.
    pub fn keep_rows(&self, k: &KeepRows, n: usize, vocab: usize) -> Result<(), GpuError> {
        self.narrow.store(false, Ordering::Relaxed);
        let (vocab, below) = (Arg::Int(vocab as i32), Arg::Double(crate::sampling::KEEP_BELOW_MAX));
        let count = [Arg::Ptr(k.logits), Arg::Ptr(k.rows), Arg::Ptr(k.params), Arg::Ptr(k.hist_off)];
        let count: Vec<Arg> = count
            .into_iter()
            .chain([Arg::Ptr(k.history), vocab, below, Arg::Ptr(k.scratch), Arg::Ptr(k.counts)])
            .collect();
        self.launch(&self.f.keep_count, (n, 1, 1), 1024, 0, &count)?;
        let write = [Arg::Ptr(k.logits), Arg::Ptr(k.rows), Arg::Ptr(k.params), vocab, below];
        let write: Vec<Arg> =
            write.into_iter().chain([Arg::Ptr(k.scratch), Arg::Ptr(k.counts), Arg::Ptr(k.out)]).collect();
        self.launch(&self.f.keep_write, (n, 1, 1), 1024, 0, &write)
    }
}
