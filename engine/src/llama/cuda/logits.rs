//! What a round brings back from the GPU: greedy picks, sampled rows cut to the tokens their draws can take, or
//! whole rows of logits.

use rayon::prelude::*;
use tensorfold_kernels::cuda::{DevPtr, Gpu, GpuError, KeepRows, KEEP_SCRATCH};

use crate::boundary::{EngineError, Keep, LaneRows, LaneStep, Logits};

/// Device buffers for sampled rows: their packed (id, logit) pairs, counts, scratch, and the tables `keep_rows` reads.
pub(super) struct KeepBuffers {
    pub pairs: DevPtr,
    pub counts: DevPtr,
    pub rows: DevPtr,
    pub params: DevPtr,
    pub hist_off: DevPtr,
    pub history: DevPtr,
    pub scratch: DevPtr,
    /// Most history ids a round's tables hold.
    pub history_cap: usize,
}

impl KeepBuffers {
    /// Bytes of each buffer, in field order, for rounds of `lanes` lanes of `context` positions.
    pub(super) fn sizes(lanes: usize, context: usize, vocab: usize) -> [usize; 7] {
        let scratch = 4 * KEEP_SCRATCH * lanes;
        [8 * lanes * vocab, 4 * lanes, 4 * lanes, 8 * lanes, 4 * (lanes + 1), 4 * lanes * context, scratch]
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
    EngineError::from(e)
}

/// Each lane's output: kept (id, logit) pairs for lanes with `keep` and one sampled row, picks for greedy
/// lanes when every other lane is greedy or kept, else the rows the lane asked for.
pub(super) fn bring_back(
    g: &Gpu,
    keep: &KeepBuffers,
    round: RoundRows,
    lanes: &[LaneStep],
) -> Result<Vec<LaneRows>, EngineError> {
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
        queue_keep(g, keep, logits, staging, &kept, vocab)?;
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
    let k = kept.len();
    let mut counts = vec![0u32; k];
    if k > 0 {
        // SAFETY: the counts buffer holds a u32 a kept row; the vector lives until the sync below.
        unsafe { g.download_async(&mut counts, keep.counts) }.map_err(device)?;
    }
    g.sync().map_err(device)?;
    // The pairs come back in one copy: into the staging after the picks, unless whole rows fill it.
    let total = 2 * counts.iter().map(|&c| c as usize).sum::<usize>();
    let in_staging = !whole && n + total <= staging.len();
    let mut spilled = vec![0u32; if in_staging { 0 } else { total }];
    if total > 0 {
        // SAFETY: the rows' pairs lie packed from the start of the pairs buffer; the destination lives until the sync.
        match in_staging {
            true => unsafe { g.download_async(&mut staging[n..n + total], keep.pairs) },
            false => unsafe { g.download_async(&mut spilled, keep.pairs) },
        }
        .map_err(device)?;
        g.sync().map_err(device)?;
    }
    let spilled: Vec<f32> = spilled.into_iter().map(f32::from_bits).collect();
    let staging = &*staging;
    let pairs = if in_staging { &staging[n..n + total] } else { &spilled[..] };
    let mut at = 0;
    let mut rows = counts.iter().map(|&c| {
        at += 2 * c as usize;
        &pairs[at - 2 * c as usize..at]
    });
    let lane_pairs: Vec<Option<&[f32]>> = first.iter().map(|f| f.3.and_then(|_| rows.next())).collect();
    // A greedy lane's pick is read straight from the staging buffer: its row is never copied.
    let out: Vec<LaneRows> = first
        .into_par_iter()
        .zip(lane_pairs)
        .map(|((row, k, kind, _), kept)| match (kept, picks) {
            (Some(p), _) => LaneRows::Kept(p.chunks_exact(2).map(|pair| (pair[0].to_bits(), pair[1])).collect()),
            (None, _) if k == 0 => LaneRows::None,
            (None, true) => LaneRows::Picks(staging[row..row + k].iter().map(|id| id.to_bits()).collect()),
            (None, false) => kind.take(&staging[row * vocab..(row + k) * vocab], vocab),
        })
        .collect();
    Ok(out)
}

/// Writes the kept rows' tables at the staging's end, queues their copies (the staging is pinned, so nothing waits)
/// and `keep_rows`.
fn queue_keep(
    g: &Gpu,
    keep: &KeepBuffers,
    logits: DevPtr,
    staging: &mut [f32],
    kept: &[(usize, Keep)],
    vocab: usize,
) -> Result<(), EngineError> {
    let k = kept.len();
    let (mut history, mut hist_off) = (Vec::new(), vec![0u32]);
    for (_, kp) in kept {
        history.extend(kp.history.iter().copied().filter(|&id| (id as usize) < vocab));
        hist_off.push(history.len() as u32);
    }
    if history.len() > keep.history_cap {
        let fault = format!("{} penalized tokens exceed the {} a round holds", history.len(), keep.history_cap);
        return Err(EngineError::Sizing(fault));
    }
    let len = 3 * k + hist_off.len() + history.len();
    let at =
        staging.len().checked_sub(len).ok_or_else(|| EngineError::Sizing("no staging for the keep tables".into()))?;
    let (rows, rest) = staging[at..].split_at_mut(k);
    let (params, rest) = rest.split_at_mut(2 * k);
    let (offsets, ids) = rest.split_at_mut(hist_off.len());
    for (i, (row, kp)) in kept.iter().enumerate() {
        rows[i] = f32::from_bits(*row as u32);
        (params[2 * i], params[2 * i + 1]) = (kp.temperature, kp.repetition_penalty);
    }
    offsets.iter_mut().zip(&hist_off).for_each(|(o, &v)| *o = f32::from_bits(v));
    ids.iter_mut().zip(&history).for_each(|(h, &id)| *h = f32::from_bits(id));
    // SAFETY: each table fits its device buffer (sized for a round's lanes and histories); the staging is pinned
    // and is not written again before the round's sync.
    unsafe {
        g.upload_async(keep.rows, &*rows).map_err(device)?;
        g.upload_async(keep.params, &*params).map_err(device)?;
        g.upload_async(keep.hist_off, &*offsets).map_err(device)?;
        if !ids.is_empty() {
            g.upload_async(keep.history, &*ids).map_err(device)?;
        }
    }
    let args = KeepRows {
        logits,
        rows: keep.rows,
        params: keep.params,
        hist_off: keep.hist_off,
        history: keep.history,
        scratch: keep.scratch,
        counts: keep.counts,
        out: keep.pairs,
    };
    g.keep_rows(&args, k, vocab).map_err(device)
}
