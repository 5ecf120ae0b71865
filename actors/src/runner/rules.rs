//! A lane's logit rules and grammar on the engine thread: masks made beside the forward pass, rows changed before
//! the draw. Each is a function of the lane's own tokens, so neither the batch nor the chunking changes a draw.

use std::collections::HashMap;

use rayon::prelude::*;
use tensorfold_engine::boundary::{Constraint, LogitRules};
use tensorfold_kernels::sampling::{distinct, penalize, SamplingParams};

use crate::round::{LaneGrammar, PlannedLane};

/// A lane's grammar with the mask of each row its step draws, or why they could not be made.
pub struct RowMasks {
    pub grammar: LaneGrammar,
    pub masks: Masks,
}

/// A lane's allowed-token bit words for each drafted row, or why its grammar could not give them.
pub type Masks = Result<Vec<Vec<u32>>, String>;

/// Whether a mask allows a token; ids past its words are not allowed.
pub fn allows(mask: &[u32], id: u32) -> bool {
    mask.get(id as usize / 32).is_some_and(|w| (w >> (id % 32)) & 1 == 1)
}

/// Each grammar lane's row masks, lanes side by side: row j's mask follows the step's first j drafted tokens, and
/// the rows end at the first drafted token its mask refuses, since no row after it is kept.
pub fn row_masks(grammars: Vec<LaneGrammar>, lanes: &[PlannedLane]) -> Vec<RowMasks> {
    let drafts: HashMap<u64, &[u32]> =
        lanes.iter().filter_map(|l| Some((l.lane_id, &l.sample.as_ref()?.draft[..]))).collect();
    grammars
        .into_par_iter()
        .map(|mut g| {
            let draft = drafts.get(&g.lane_id).copied().unwrap_or_default();
            let masks = masks_along(g.grammar.as_mut(), draft);
            RowMasks { grammar: g, masks }
        })
        .collect()
}

fn masks_along(grammar: &mut dyn Constraint, draft: &[u32]) -> Masks {
    let mut masks = vec![grammar.allowed()?];
    let mut committed = 0;
    for &id in draft {
        if !allows(&masks[committed], id) {
            break;
        }
        grammar.commit(id)?;
        committed += 1;
        masks.push(grammar.allowed()?);
    }
    if committed > 0 {
        grammar.rollback(committed)?;
    }
    Ok(masks)
}

/// A row as the draw sees it: the repetition penalty over the lane's tokens, presence and frequency penalties over
/// its generated tokens, the bias, then the mask; the draw itself then applies no penalty.
pub fn shape_row(
    row: &[f32],
    params: &SamplingParams,
    rules: &LogitRules,
    history: &[u32],
    generated: &[u32],
    mask: Option<&[u32]>,
) -> Vec<f32> {
    let mut row = row.to_vec();
    if params.repetition_penalty != 1.0 {
        penalize(&mut row, &distinct(history), params.repetition_penalty);
    }
    if rules.presence != 0.0 || rules.frequency != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        generated.iter().for_each(|&t| *counts.entry(t).or_default() += 1);
        for (&t, &n) in &counts {
            if let Some(l) = row.get_mut(t as usize) {
                *l -= rules.presence + rules.frequency * n as f32;
            }
        }
    }
    for &(t, bias) in &rules.bias {
        if let Some(l) = row.get_mut(t as usize) {
            *l += bias;
        }
    }
    if let Some(mask) = mask {
        row.iter_mut().enumerate().filter(|(i, _)| !allows(mask, *i as u32)).for_each(|(_, l)| *l = f32::NEG_INFINITY);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allows the ids listed; after a committed token, only ids above it.
    struct Rising(Vec<u32>);

    impl Constraint for Rising {
        fn allowed(&mut self) -> Result<Vec<u32>, String> {
            let floor = self.0.last().map_or(0, |t| t + 1);
            let mut words = vec![0u32; 2];
            (floor..64).for_each(|i| words[i as usize / 32] |= 1 << (i % 32));
            Ok(words)
        }
        fn commit(&mut self, id: u32) -> Result<(), String> {
            self.0.push(id);
            Ok(())
        }
        fn rollback(&mut self, n: usize) -> Result<(), String> {
            self.0.truncate(self.0.len() - n);
            Ok(())
        }
    }

    #[test]
    fn test_row_masks_follow_the_draft_until_a_mask_refuses_it_and_leave_the_grammar_as_it_was() {
        let mut grammar = Rising(vec![3]);
        let masks = masks_along(&mut grammar, &[5, 9, 7, 20]).expect("masks");
        assert_eq!(masks.len(), 3, "rows 0..=2: the third draft (7) is refused by row 2's mask");
        assert!(allows(&masks[0], 4) && !allows(&masks[0], 3));
        assert!(!allows(&masks[1], 5) && allows(&masks[1], 6));
        assert!(!allows(&masks[2], 9) && allows(&masks[2], 10));
        assert_eq!(grammar.0, vec![3], "the drafted tokens were taken back");
        assert!(!allows(&masks[0], 64), "ids past the mask's words are refused");
    }

    #[test]
    fn test_shape_row_applies_penalties_on_generated_tokens_then_bias_then_mask() {
        let params = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        let rules = LogitRules { bias: vec![(0, 1.5), (9, 3.0)], presence: 0.5, frequency: 0.25 };
        let row = [1.0, 2.0, -2.0, 4.0];
        let mask = [0b1011u32];
        let shaped = shape_row(&row, &params, &rules, &[2, 1, 1], &[1, 1], Some(&mask));
        // Token 1: 2 / 2 - (0.5 + 2 * 0.25); token 2: -2 * 2 and masked; token 0: biased.
        assert_eq!(shaped, vec![2.5, 0.0, f32::NEG_INFINITY, 4.0]);
        assert_eq!(shape_row(&row, &SamplingParams::default(), &LogitRules::default(), &[1], &[1], None), row);
    }
}
