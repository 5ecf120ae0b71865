//! What a round brings back from the GPU: greedy picks, sampled rows cut to the tokens their draws can take, or
//! whole rows of logits.

use rayon::prelude::*;
use tensorfold_kernels::cuda::{DevPtr, Gpu, GpuError};

use crate::boundary::{EngineError, LaneStep, Logits};

/// Device buffers for sampled rows: their (id, logit) pairs, counts, and the tables `keep_rows` reads.
pub(super) struct KeepBuffers {
    pub pairs: DevPtr,
    pub counts: DevPtr,
    pub rows: DevPtr,
    pub params: DevPtr,
    pub hist_off: DevPtr,
    pub history: DevPtr,
    /// Most history ids a round's tables hold.
    pub history_cap: usize,
}

impl KeepBuffers {
    /// Bytes of each buffer, in field order, for rounds of `lanes` lanes of `context` positions.
    pub(super) fn sizes(lanes: usize, context: usize, vocab: usize) -> [usize; 6] {
        [8 * lanes * vocab, 4 * lanes, 4 * lanes, 8 * lanes, 4 * (lanes + 1), 4 * lanes * context]
    }
}

/// Where one round's logits rows are, on the device and in pinned staging.
pub(super) struct RoundRows<'a> {
    pub logits: DevPtr,
    pub picks: DevPtr,
    /// Pinned staging, at least `n * vocab` floats.
    pub staging: &'a mut [f32],
    pub n: usize,
    pub vocab: usize,
    pub gpu_argmax: bool,
}

fn device(e: GpuError) -> EngineError {
    EngineError::Device(e.to_string())
}

/// Each lane's output: kept (id bits, logit) pairs for lanes with `keep` and one sampled row, picks for greedy
/// lanes when every other lane is greedy or kept, else the rows the lane asked for.
pub(super) fn bring_back(
    g: &Gpu,
    keep: &KeepBuffers,
    round: RoundRows,
    lanes: &[LaneStep],
) -> Result<Vec<Vec<f32>>, EngineError> {
    let RoundRows { logits, picks: picks_ptr, staging, n, vocab, gpu_argmax } = round;
    let mut first = Vec::with_capacity(lanes.len());
    let mut at_row = 0;
    for lane in lanes {
        let k = lane.logits.rows(lane.tokens.len());
        let kept = lane.keep.filter(|_| lane.logits == Logits::Last && k == 1);
        first.push((at_row, k, lane.logits, kept));
        at_row += k;
    }
    let kept: Vec<_> = first.iter().filter_map(|&(row, _, _, keep)| keep.map(|k| (row, k))).collect();
    if !kept.is_empty() {
        let mut history = Vec::new();
        let mut hist_off = vec![0u32];
        for (_, k) in &kept {
            history.extend(k.history.iter().copied().filter(|&id| (id as usize) < vocab));
            hist_off.push(history.len() as u32);
        }
        if history.len() > keep.history_cap {
            let fault = format!("{} penalized tokens exceed the {} a round holds", history.len(), keep.history_cap);
            return Err(EngineError::Sizing(fault));
        }
        let rows: Vec<u32> = kept.iter().map(|&(row, _)| row as u32).collect();
        let params: Vec<f32> = kept.iter().flat_map(|(_, k)| [k.temperature, k.repetition_penalty]).collect();
        g.upload(keep.rows, &rows).map_err(device)?;
        g.upload(keep.params, &params).map_err(device)?;
        g.upload(keep.hist_off, &hist_off).map_err(device)?;
        if !history.is_empty() {
            g.upload(keep.history, &history).map_err(device)?;
        }
        let hist = (keep.hist_off, keep.history);
        g.keep_rows(logits, keep.rows, keep.params, hist, kept.len(), vocab, keep.pairs, keep.counts)
            .map_err(device)?;
    }
    let others = || first.iter().filter(|f| f.3.is_none());
    let picks = gpu_argmax && others().all(|f| matches!(f.2, Logits::None | Logits::Argmax | Logits::Picks));
    let whole = !picks && others().any(|f| f.1 > 0);
    if picks && others().any(|f| f.1 > 0) {
        g.argmax_rows(logits, n, vocab, picks_ptr).map_err(device)?;
        // SAFETY: the staging holds n floats; it stays borrowed until the sync below.
        unsafe { g.download_async(&mut staging[..n], picks_ptr) }.map_err(device)?;
    }
    if whole {
        // SAFETY: the staging holds n rows of `vocab`; it stays borrowed until the sync below.
        unsafe { g.download_async(&mut staging[..n * vocab], logits) }.map_err(device)?;
    }
    let mut counts = vec![0u32; kept.len()];
    if !kept.is_empty() {
        // SAFETY: the counts buffer holds one u32 a kept row; the vector lives until the sync.
        unsafe { g.download_async(&mut counts, keep.counts) }.map_err(device)?;
    }
    g.sync().map_err(device)?;
    let mut pairs: Vec<Vec<u32>> = counts.iter().map(|&c| vec![0u32; 2 * c as usize]).collect();
    for (r, p) in pairs.iter_mut().enumerate().filter(|(_, p)| !p.is_empty()) {
        // SAFETY: row r's pairs start at 8 vocab r bytes and `count` of them were written; synced below.
        unsafe { g.download_async(p, keep.pairs + (8 * vocab * r) as u64) }.map_err(device)?;
    }
    g.sync().map_err(device)?;
    let mut pairs = pairs.into_iter();
    let lane_pairs: Vec<Option<Vec<u32>>> = first.iter().map(|f| f.3.and_then(|_| pairs.next())).collect();
    let staging = &*staging;
    // A greedy lane's pick is read straight from the staging buffer: its row is never copied.
    let out: Vec<Vec<f32>> = first
        .into_par_iter()
        .zip(lane_pairs)
        .map(|((row, k, kind, _), kept)| match (kept, picks) {
            (Some(p), _) => p.into_iter().map(f32::from_bits).collect(),
            (None, true) => staging[row..row + k].iter().map(|id| id.to_bits() as f32).collect(),
            (None, false) => kind.take(&staging[row * vocab..(row + k) * vocab], vocab),
        })
        .collect();
    Ok(out)
}
