//! What a forward pass costs on each engine, timed on the engine thread at start-up, for drafting's choices.

use std::time::Instant;

use tensorfold_engine::boundary::{EngineError, LaneStep, Logits};

use crate::model_slot::ModelSlot;

/// Points timed at start-up: a step of one row, then steps of this many times the draft rows.
pub const TIMED_WIDTHS: [usize; 3] = [1, 2, 4];

/// What a forward pass costs on an engine, measured at start-up: seconds at each timed number of rows, in between
/// by straight lines, past the last by its slope (a step's rows cost little while the weights' reads bound it,
/// then each row costs its compute).
#[derive(Clone, Debug, PartialEq)]
pub struct StepCost {
    points: Vec<(usize, f64)>,
}

impl StepCost {
    /// Where nothing was timed: rows cost nothing beside the round, so lanes draft what they earn.
    pub fn unknown() -> StepCost {
        StepCost { points: vec![(1, 1.0)] }
    }

    /// From (rows, seconds) pairs; times that fall with more rows are raised to the one before.
    pub fn from_points(mut points: Vec<(usize, f64)>) -> StepCost {
        points.sort_by_key(|p| p.0);
        points.dedup_by_key(|p| p.0);
        for i in 1..points.len() {
            points[i].1 = points[i].1.max(points[i - 1].1);
        }
        if points.is_empty() {
            return StepCost::unknown();
        }
        StepCost { points }
    }

    /// Seconds for a step of `rows` rows.
    pub fn seconds(&self, rows: usize) -> f64 {
        let p = &self.points;
        let i = p.iter().position(|&(r, _)| r >= rows).unwrap_or(p.len() - 1).max(1).min(p.len() - 1);
        if p.len() == 1 {
            return p[0].1;
        }
        let ((r0, t0), (r1, t1)) = (p[i - 1], p[i]);
        let slope = (t1 - t0) / (r1 - r0) as f64;
        (t0 + slope * (rows as f64 - r0 as f64)).max(p[0].1)
    }

    /// Tokens a second from a round of `rows` rows that yields `tokens` tokens.
    pub(crate) fn rate(&self, tokens: f64, rows: usize) -> f64 {
        tokens / self.seconds(rows)
    }
}

/// Times a token model's steps of one row and of `TIMED_WIDTHS` times `rows` rows, the fastest of three each after a
/// warm-up, on KV pages no lane holds yet (a lane writes every position it reads).
pub(super) fn measure_step_cost(slot: &mut ModelSlot, rows: usize) -> StepCost {
    let ModelSlot::Tokens { engine, pool, .. } = slot else { return StepCost::unknown() };
    let widest = rows * TIMED_WIDTHS[TIMED_WIDTHS.len() - 1];
    let pages: Vec<u32> = (0..widest.div_ceil(pool.layout().page_tokens) as u32).collect();
    if rows < 2 || pages.len() > pool.num_pages() {
        return StepCost::unknown();
    }
    let tokens = vec![1u32.min(engine.vocab_size() as u32 - 1); widest];
    let mut time = |n: usize| -> Result<(usize, f64), EngineError> {
        let logits = if n == 1 { Logits::Argmax } else { Logits::Picks };
        let step = LaneStep { tokens: &tokens[..n], start_pos: 0, pages: &pages, logits, keep: None };
        let mut best = f64::INFINITY;
        for i in 0..4 {
            let started = Instant::now();
            engine.forward(pool, std::slice::from_ref(&step))?;
            best = if i == 0 { best } else { best.min(started.elapsed().as_secs_f64()) };
        }
        Ok((n, best))
    };
    let widths = std::iter::once(1).chain(TIMED_WIDTHS.iter().map(|w| w * rows));
    match widths.map(&mut time).collect::<Result<Vec<_>, _>>() {
        Ok(points) => {
            let micros: Vec<(usize, u64)> = points.iter().map(|&(n, s)| (n, (s * 1e6) as u64)).collect();
            tracing::info!(?micros, "step cost (rows, us)");
            StepCost::from_points(points)
        }
        Err(e) => {
            tracing::warn!(error = %e, "timing a step failed; drafting assumes rows are free");
            StepCost::unknown()
        }
    }
}
