//! A draft model's turn in a round: it catches each lane's KV up, then drafts greedily a token a step, every lane
//! of the model in one batched pass per step, before the round's forward pass verifies the drafts.

use tensorfold_engine::boundary::{LaneRows, LaneStep, Logits};

use crate::model_slot::ModelSlot;
use crate::round::{PlannedDraft, RoundPlan};

/// Runs the plan's draft steps and hands each lane's draft to its step; returns how many tokens each lane got, and
/// the lanes whose passes failed. A failed pass drafts nothing for its lanes: a draft only changes how fast the lane
/// goes, never its tokens.
pub fn draft(models: &mut [ModelSlot], plan: &mut RoundPlan) -> (Vec<(u64, usize)>, Vec<u64>) {
    let (mut made, mut failed) = (Vec::new(), Vec::new());
    let groups = (0..models.len()).flat_map(|m| [(m, false), (m, true)]);
    for (m, own_head) in groups {
        let ModelSlot::Tokens { engine, pool, .. } = &mut models[m] else { continue };
        let mine: Vec<&PlannedDraft> = plan.drafts.iter().filter(|d| d.model == m && d.own_head == own_head).collect();
        let Some(steps) = mine.iter().map(|d| d.most).max() else { continue };
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); mine.len()];
        for i in 0..steps.max(1) {
            let lanes: Vec<(usize, LaneStep)> = mine
                .iter()
                .enumerate()
                .filter(|(_, d)| i == 0 || d.most > i)
                .map(|(j, d)| {
                    let (tokens, start_pos) = match i {
                        0 => (&d.tokens[..], d.start_pos),
                        _ => (&drafts[j][i - 1..i], d.start_pos + d.tokens.len() + i - 1),
                    };
                    let logits = if d.most > i { Logits::Argmax } else { Logits::None };
                    (j, LaneStep { tokens, start_pos, pages: &d.pages, logits, keep: None })
                })
                .collect();
            let (which, steps): (Vec<usize>, Vec<LaneStep>) = lanes.into_iter().unzip();
            // A model's own head drafts for its own lanes; a draft model runs its forward pass.
            let rows = match own_head {
                true => engine.draft_head(pool, &steps),
                false => engine.forward(pool, &steps),
            };
            match rows {
                Ok(rows) => {
                    for (j, rows) in which.into_iter().zip(rows) {
                        if let LaneRows::Picks(ids) = rows {
                            drafts[j].extend(ids.first());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(model = m, error = %e, "a draft pass failed; its lanes go on without drafts");
                    drafts.iter_mut().for_each(Vec::clear);
                    failed.extend(mine.iter().map(|d| d.lane_id));
                    break;
                }
            }
        }
        made.extend(mine.iter().zip(drafts).filter(|(d, _)| d.most > 0).map(|(d, t)| (d.lane_id, t)));
    }
    let mut counts = Vec::with_capacity(made.len());
    for (lane_id, tokens) in made {
        counts.push((lane_id, tokens.len()));
        let Some(lane) = plan.lanes.iter_mut().find(|l| l.lane_id == lane_id) else { continue };
        if let Some(sample) = lane.sample.as_mut() {
            lane.tokens.extend_from_slice(&tokens);
            sample.draft = tokens;
        }
    }
    (counts, failed)
}
