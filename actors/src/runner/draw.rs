//! The draw: each lane's tokens from its rows (sampled, greedy picks, or rows the engine kept), drafts verified
//! row by row, log-probabilities, and the grammars' commits.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tensorfold_engine::boundary::{EngineError, LaneRows, Logits};
use tensorfold_kernels::sampling::{log_softmax, sample, sample_kept, SamplingParams};

use super::rules::{shape_row, Masks, RowMasks};
use crate::request_types::TokenLogprob;
use crate::round::{LaneGrammar, PlannedLane, SampleSpec, Sampled};

/// One model's forward pass: its lanes as indices into the plan, and each lane's rows.
pub(super) struct Pass {
    pub lanes: Vec<usize>,
    pub rows: Result<Vec<LaneRows>, EngineError>,
    pub forward: Duration,
}

/// What the round's passes give back: drawn tokens, lanes that failed, embedding lanes' hidden rows.
#[derive(Default)]
pub(super) struct Drawn {
    pub sampled: Vec<Sampled>,
    pub failed: Vec<(u64, EngineError)>,
    pub hidden: Vec<(u64, Vec<f32>)>,
}

/// Every lane's draw from its rows, then its grammar takes the drawn tokens; a lane whose pass or grammar failed ends.
pub(super) fn draw_all(planned: &[PlannedLane], passes: Vec<Pass>, masks: Vec<RowMasks>) -> (Drawn, Vec<LaneGrammar>) {
    // The grammars stay out of the parallel draw, which reads only their masks.
    let (grammars, masks): (Vec<LaneGrammar>, HashMap<u64, Masks>) =
        masks.into_iter().map(|m| (m.grammar.lane_id, m)).map(|(id, m)| (m.grammar, (id, m.masks))).unzip();
    let Drawn { mut sampled, mut failed, mut hidden } = Drawn::default();
    for pass in passes {
        let rows = match pass.rows {
            Ok(rows) => rows,
            Err(e) => {
                failed.extend(pass.lanes.iter().map(|&i| (planned[i].lane_id, e.clone())));
                continue;
            }
        };
        let started = Instant::now();
        let (embeds, lanes): (Vec<_>, Vec<_>) = pass.lanes.iter().zip(rows).partition(|(&i, _)| planned[i].embed);
        let hidden_rows = embeds.into_iter().map(|(&i, rows)| match rows {
            LaneRows::Hidden(values) => (planned[i].lane_id, values),
            _ => (planned[i].lane_id, Vec::new()),
        });
        hidden.extend(hidden_rows.filter(|(id, _)| !failed.iter().any(|(f, _)| f == id)));
        // Each lane's draw reads only its own rows, so the lanes draw side by side, in plan order.
        let drawn: Vec<Result<Vec<Sampled>, (u64, EngineError)>> = lanes
            .into_par_iter()
            .map(|(&i, rows)| {
                let lane = &planned[i];
                let masks = match masks.get(&lane.lane_id) {
                    None => None,
                    Some(Ok(rows)) => Some(&rows[..]),
                    Some(Err(why)) => return Err((lane.lane_id, EngineError::Grammar(why.clone()))),
                };
                draw(lane, &rows, masks).map_err(|e| (lane.lane_id, e))
            })
            .collect();
        for lane in drawn {
            match lane {
                Ok(tokens) => sampled.extend(tokens),
                Err(lane_failed) => failed.push(lane_failed),
            }
        }
        tracing::debug!(
            forward_us = pass.forward.as_micros() as u64,
            draw_us = started.elapsed().as_micros() as u64,
            "forward"
        );
    }
    let mut kept = Vec::with_capacity(grammars.len());
    for mut grammar in grammars {
        let lane_id = grammar.lane_id;
        if failed.iter().any(|(id, _)| *id == lane_id) {
            continue;
        }
        let taken = sampled.iter().filter(|s| s.lane_id == lane_id).try_for_each(|s| grammar.grammar.commit(s.id));
        match taken {
            Ok(()) => kept.push(grammar),
            Err(why) => failed.push((lane_id, EngineError::Grammar(why))),
        }
    }
    (Drawn { sampled, failed, hidden }, kept)
}

/// Whether a lane's rows change before its draw: a grammar's mask, a bias or a presence or frequency penalty.
fn is_shaped(spec: &SampleSpec) -> bool {
    spec.masked || !spec.rules.is_empty()
}

/// A greedy lane without log-probabilities or shaping needs only the index of its largest logit, which the engine
/// finds, in every row when it verifies a draft; other lanes need the last row, or every row with a draft.
pub(super) fn logits_for(spec: &SampleSpec) -> Logits {
    match (spec.draft.is_empty(), spec.params.is_greedy() && spec.logprobs.is_none() && !is_shaped(spec)) {
        (true, true) => Logits::Argmax,
        (false, true) => Logits::Picks,
        (true, false) => Logits::Last,
        (false, false) => Logits::All,
    }
}

/// Whether a lane's draw is of its last row alone, sampled: the draw an engine that keeps rows can cut short. A lane
/// asking for log-probabilities needs its whole row (their sum runs over the vocabulary); at temperature 0 no cut
/// is defined.
pub(super) fn is_kept_draw(spec: &SampleSpec) -> bool {
    logits_for(spec) == Logits::Last && !is_shaped(spec) && spec.logprobs.is_none() && spec.params.temperature > 0.0
}

/// A sampled lane's token from its last row cut to the tokens its draw can take.
fn draw_kept(lane: &PlannedLane, spec: &SampleSpec, pairs: &[(u32, f32)]) -> Vec<Sampled> {
    let (ids, logits): (Vec<u32>, Vec<f32>) = pairs.iter().copied().unzip();
    let id = sample_kept(&ids, &logits, &spec.params, spec.position);
    vec![Sampled { lane_id: lane.lane_id, id, logprob: None }]
}

/// The lane's drawn tokens: one, or with a draft the draw of each row while the one before equaled its draft.
/// Row j draws at position + j with the history and mask plain decoding would have there, so the tokens are the same.
/// Log-probabilities are the model's own, before penalties, bias and mask.
fn draw(lane: &PlannedLane, rows: &LaneRows, masks: Option<&[Vec<u32>]>) -> Result<Vec<Sampled>, EngineError> {
    let Some(spec) = lane.sample.as_ref() else { return Ok(Vec::new()) };
    let logits = match rows {
        LaneRows::Logits(logits) => logits,
        LaneRows::Kept(pairs) => return Ok(draw_kept(lane, spec, pairs)),
        LaneRows::Picks(ids) => {
            // Row j's pick is kept while the row before it equaled its draft.
            let kept = ids.iter().enumerate().take_while(|&(j, _)| j == 0 || spec.draft[j - 1] == ids[j - 1]);
            return Ok(kept.map(|(_, &id)| Sampled { lane_id: lane.lane_id, id, logprob: None }).collect());
        }
        other => return Err(EngineError::Sizing(format!("a drawing lane got {other:?} rows"))),
    };
    let rows = spec.draft.len() + 1;
    let vocab = logits.len() / rows;
    let shaped = masks.is_some() || !spec.rules.is_empty();
    let grows = spec.params.repetition_penalty != 1.0 || spec.rules.presence != 0.0 || spec.rules.frequency != 0.0;
    // A shaped row has its repetition penalty already.
    let unpenalized = SamplingParams { repetition_penalty: 1.0, ..spec.params.clone() };
    let mut history = std::borrow::Cow::Borrowed(&spec.history[..]);
    let mut out = Vec::with_capacity(rows);
    for j in 0..rows {
        let row = &logits[j * vocab..(j + 1) * vocab];
        let position = spec.position + j as u64;
        let id = match (shaped, masks.map(|m| m.get(j))) {
            (_, Some(None)) => break,
            (true, mask) => {
                let mask = mask.flatten().map(Vec::as_slice);
                let generated = history.get(spec.prompt_len..).unwrap_or_default();
                let shaped = shape_row(row, &spec.params, &spec.rules, &history, generated, mask);
                if shaped.iter().all(|l| *l == f32::NEG_INFINITY) {
                    let why = format!("no token of the vocabulary of {vocab} is allowed at position {position}");
                    return Err(EngineError::Grammar(why));
                }
                sample(&shaped, &unpenalized, &[], position)
            }
            (false, _) => sample(row, &spec.params, &history, position),
        };
        out.push(Sampled { lane_id: lane.lane_id, id, logprob: spec.logprobs.map(|n| logprob(row, id, n)) });
        if spec.draft.get(j) != Some(&id) {
            break;
        }
        if grows {
            history.to_mut().push(id);
        }
    }
    Ok(out)
}

/// The drawn token's log-probability and the `n` most likely, ties to the lower id.
fn logprob(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.select_nth_unstable_by(n.min(lp.len() - 1), |&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    order.truncate(n);
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    TokenLogprob { logprob: lp[id as usize], top: order.iter().map(|&i| (i as u32, lp[i])).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lane whose step carries `draft`, seeded and hot so each position's draw differs, with a penalty.
    fn drafting_lane(draft: Vec<u32>) -> PlannedLane {
        let params = SamplingParams { temperature: 1.5, repetition_penalty: 1.2, seed: 9, ..Default::default() };
        let (rules, history) = (Default::default(), vec![3, 4, 5]);
        let sample =
            SampleSpec { params, history, prompt_len: 3, rules, masked: false, position: 40, logprobs: Some(2), draft };
        let (tokens, pages) = (Vec::new(), Vec::new());
        PlannedLane { lane_id: 1, model: 0, tokens, start_pos: 39, pages, sample: Some(sample), embed: false }
    }

    #[test]
    fn test_a_drafted_step_draws_at_each_row_what_plain_decoding_draws_there() {
        let vocab = 50;
        let rows: Vec<Vec<f32>> =
            (0..5).map(|r| (0..vocab).map(|v| ((r * 13 + v * 7) % 11) as f32 * 0.1).collect()).collect();
        // Plain decoding: one row a step, at positions 40, 41, ..., each with the history before it.
        let mut plain = drafting_lane(Vec::new());
        let mut ids = Vec::new();
        for (j, row) in rows.iter().enumerate() {
            let spec = plain.sample.as_mut().unwrap();
            spec.position = 40 + j as u64;
            let s = draw(&plain, &LaneRows::Logits(row.clone()), None).unwrap().remove(0);
            plain.sample.as_mut().unwrap().history.push(s.id);
            ids.push(s);
        }
        assert!(ids.windows(2).any(|w| w[0].id != w[1].id), "the rows draw different tokens");
        let flat = LaneRows::Logits(rows.concat());
        // A draft of the plain tokens is kept whole, and the row after it draws the next one.
        let all = draw(&drafting_lane(ids[..4].iter().map(|s| s.id).collect()), &flat, None).unwrap();
        let got: Vec<(u32, Option<TokenLogprob>)> = all.iter().map(|s| (s.id, s.logprob.clone())).collect();
        let want: Vec<(u32, Option<TokenLogprob>)> = ids.iter().map(|s| (s.id, s.logprob.clone())).collect();
        assert_eq!(got, want);
        // A draft that goes wrong at its third token keeps the first two and the row that disagreed.
        let mut wrong: Vec<u32> = ids[..4].iter().map(|s| s.id).collect();
        wrong[2] = (wrong[2] + 1) % vocab as u32;
        let some = draw(&drafting_lane(wrong), &flat, None).unwrap();
        assert_eq!(some.iter().map(|s| s.id).collect::<Vec<_>>(), ids[..3].iter().map(|s| s.id).collect::<Vec<_>>());
    }

    #[test]
    fn test_a_greedy_drafted_step_keeps_the_engines_picks_while_the_row_before_equaled_its_draft() {
        let mut lane = drafting_lane(vec![5, 7, 3]);
        lane.sample.as_mut().unwrap().params = SamplingParams { temperature: 0.0, ..Default::default() };
        lane.sample.as_mut().unwrap().logprobs = None;
        assert_eq!(logits_for(lane.sample.as_ref().unwrap()), Logits::Picks);
        let ids = |picks: Vec<u32>| {
            draw(&lane, &LaneRows::Picks(picks), None).unwrap().iter().map(|s| s.id).collect::<Vec<_>>()
        };
        assert_eq!(ids(vec![5, 7, 9, 2]), vec![5, 7, 9], "the third draft failed: its row's pick ends it");
        assert_eq!(ids(vec![5, 7, 3, 2]), vec![5, 7, 3, 2], "all kept, and the row after");
        assert_eq!(ids(vec![6, 7, 3, 2]), vec![6], "the first failed");
    }
}
