//! Prompt-lookup drafting: a decoding lane proposes the tokens that followed the last place its recent tokens
//! appeared in its own prompt and output, as many as its drafts have earned at what a verify row costs.

use crate::runner::StepCost;

/// Fewest tokens a match needs: shorter ones draft text that copies nothing too often.
const MIN_MATCH: usize = 3;
/// Longest match looked for: a longer one picks, among the places the last tokens appeared, the one most like now.
const MAX_MATCH: usize = 8;

/// A prior of one draft token kept and one refused: a lane starts out drafting short, then drafts what it earns.
const PRIOR: f64 = 1.0;
/// Each settled draft weighs this much less than the next: a lane's text changes what drafting earns.
const DECAY: f64 = 0.9;

/// A lane's drafting state.
#[derive(Default)]
pub struct Drafter {
    /// Rounds left before the lane drafts again.
    wait: u32,
    /// The wait after the next failure.
    backoff: u32,
    /// Draft tokens kept, and drafts refused (each draft's first wrong token), decayed draft by draft.
    kept: f64,
    refused: f64,
    /// Tokens drafted in the round in flight, and how many of them were accepted so far.
    pub pending: usize,
    pub accepted: usize,
}

impl Drafter {
    /// Whether the lane drafts this round; a round of waiting passes each time it is asked.
    pub fn ready(&mut self) -> bool {
        if self.wait > 0 {
            self.wait -= 1;
            return false;
        }
        true
    }

    /// The chance that a draft token is kept, given the one before it was: what the lane's drafts have earned.
    pub fn rate(&self) -> f64 {
        (self.kept + PRIOR) / (self.kept + self.refused + 2.0 * PRIOR)
    }

    /// How many tokens (at most `most`) the lane drafts this round, 0 for none: the length that gives the round the
    /// most expected tokens a second, where the round has `lanes` decoding lanes in `rows` rows so far. Where no
    /// length pays but a kept token would, one token, as a probe of whether the text repeats now.
    pub fn length(&mut self, most: usize, lanes: usize, rows: usize, cost: &StepCost) -> usize {
        if most == 0 || !self.ready() {
            return 0;
        }
        let (p, lanes) = (self.rate(), lanes as f64);
        let (mut best, mut best_rate) = (0, cost.rate(lanes, rows));
        let (mut kept, mut chance) = (0.0, 1.0);
        for d in 1..=most {
            chance *= p;
            kept += chance;
            let rate = cost.rate(lanes + kept, rows + d);
            if rate > best_rate {
                (best, best_rate) = (d, rate);
            }
        }
        if best > 0 {
            return best;
        }
        // A probe tells whether the text repeats now, where a kept token would pay; failed probes back off in `settle`.
        usize::from(cost.rate(lanes + 1.0, rows + 1) > cost.rate(lanes, rows))
    }

    fn back_off(&mut self, max_wait: u32) {
        self.backoff = (self.backoff * 2).clamp(1, max_wait.max(1));
        self.wait = self.backoff;
    }

    /// The round's verdict on the pending draft: (drafted, accepted); a draft with nothing accepted makes the lane
    /// wait before drafting again, longer each time, at most `max_wait` rounds.
    pub fn settle(&mut self, max_wait: u32) -> (usize, usize) {
        let verdict = (self.pending, self.accepted.min(self.pending));
        if self.pending > 0 {
            self.kept = self.kept * DECAY + verdict.1 as f64;
            self.refused = self.refused * DECAY + f64::from(verdict.1 < verdict.0);
            if verdict.1 == 0 {
                self.back_off(max_wait);
            } else {
                self.backoff /= 2;
            }
        }
        self.pending = 0;
        self.accepted = 0;
        verdict
    }
}

/// Up to `most` tokens that followed the earlier place whose tokens best match the last ones of `tokens`.
pub fn lookup(tokens: &[u32], most: usize) -> Vec<u32> {
    let n = tokens.len();
    // The latest start whose preceding tokens match the most of the last ones, from MIN_MATCH to MAX_MATCH.
    let mut best = (0, 0);
    for end in (MIN_MATCH..n).rev() {
        let len = (1..=MAX_MATCH.min(end)).take_while(|&j| tokens[end - j] == tokens[n - j]).count();
        if len > best.0 {
            best = (len, end);
            if len == MAX_MATCH {
                break;
            }
        }
    }
    match best {
        (len, end) if len >= MIN_MATCH => tokens[end..n.min(end + most)].to_vec(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_longest_match_wins_over_a_later_shorter_one() {
        let tokens = [6, 1, 2, 3, 7, 9, 1, 2, 3, 8, 6, 1, 2, 3];
        assert_eq!(lookup(&tokens, 2), vec![7, 9], "four tokens match before the 7, three before the 8");
    }

    #[test]
    fn test_a_draft_is_what_followed_the_latest_match_of_the_last_tokens() {
        let tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(lookup(&tokens, 4), vec![7, 8, 5, 1]);
        assert_eq!(lookup(&tokens, 2), vec![7, 8]);
        assert_eq!(lookup(&[4, 5, 6], 4), Vec::<u32>::new(), "no earlier match");
        assert_eq!(lookup(&[5, 6, 1, 5, 6], 4), Vec::<u32>::new(), "a bigram is not enough");
    }

    /// A CPU's steps: rows cheap while the weights' reads bound the step, then each row costs its compute.
    fn cpu() -> StepCost {
        StepCost::from_points(vec![(1, 1.0), (4, 2.0), (8, 4.0), (16, 8.8)])
    }

    #[test]
    fn test_step_cost_follows_the_timed_points_and_extends_the_last_slope() {
        let c = cpu();
        assert_eq!((c.seconds(1), c.seconds(4), c.seconds(6)), (1.0, 2.0, 3.0));
        assert!((c.seconds(20) - 11.2).abs() < 1e-9, "{}", c.seconds(20));
        let odd = StepCost::from_points(vec![(4, 0.9), (1, 1.0)]);
        assert_eq!((odd.seconds(1), odd.seconds(4)), (1.0, 1.0), "a time that falls with more rows is raised");
        assert_eq!(StepCost::unknown().seconds(50), 1.0);
    }

    /// Rows drafted over `rounds` rounds by a lane whose drafts keep `kept` of their tokens, at `cost`.
    fn drafted_rows(kept: usize, rounds: usize, cost: &StepCost) -> (usize, Vec<usize>) {
        let mut d = Drafter::default();
        let mut lengths = Vec::new();
        for _ in 0..rounds {
            let n = d.length(8, 1, 1, cost);
            lengths.push(n);
            d.pending = n;
            d.accepted = kept.min(n);
            d.settle(64);
        }
        (lengths.iter().sum(), lengths)
    }

    #[test]
    fn test_a_lane_whose_drafts_always_fail_pays_for_few_rows_where_rows_cost() {
        let cost = cpu();
        let (_, lengths) = drafted_rows(0, 400, &cost);
        let extra: f64 = lengths.iter().map(|&n| cost.seconds(1 + n) - cost.seconds(1)).sum();
        assert!(extra / 400.0 < 0.01, "drafts cost {:.1}% of 400 rounds: {lengths:?}", 100.0 * extra / 400.0);
        assert!(lengths[20..].iter().all(|&n| n <= 1), "a lane with nothing kept drafts long: {lengths:?}");
    }

    #[test]
    fn test_a_lane_whose_drafts_are_kept_drafts_as_long_as_rows_stay_cheap() {
        let (_, lengths) = drafted_rows(8, 40, &cpu());
        assert!(lengths[10..].iter().all(|&n| n == 3), "cheap up to 4 rows, dear past them: {lengths:?}");
        let gpu = StepCost::from_points(vec![(1, 1.0), (13, 1.02), (26, 1.05)]);
        let (_, lengths) = drafted_rows(8, 40, &gpu);
        assert!(lengths[10..].iter().all(|&n| n == 8), "where rows are nearly free, the most: {lengths:?}");
    }

    #[test]
    fn test_a_lane_drafts_nothing_where_even_a_kept_token_would_not_pay() {
        let mut d = Drafter { kept: 9.0, ..Default::default() };
        assert_eq!(d.length(8, 8, 8, &cpu()), 0, "eight lanes on the CPU: a ninth row costs more than it gives");
        assert_eq!(d.length(8, 1, 1, &cpu()), 3);
    }

    #[test]
    fn test_wide_rounds_draft_less() {
        let mut d = Drafter { kept: 3.0, refused: 1.0, ..Default::default() };
        let alone = d.length(8, 1, 1, &cpu());
        let among = d.length(8, 16, 16, &cpu());
        assert!(alone > among, "alone {alone}, among 16 lanes {among}");
    }

    #[test]
    fn test_failed_drafts_make_the_lane_wait_longer_each_time_and_a_success_halves_the_wait() {
        let mut d = Drafter::default();
        assert!(d.ready());
        d.pending = 4;
        assert_eq!(d.settle(16), (4, 0));
        assert!(!d.ready(), "waits one round");
        assert!(d.ready());
        d.pending = 4;
        d.settle(16);
        assert!(!d.ready() && !d.ready(), "then two");
        assert!(d.ready());
        d.pending = 4;
        d.accepted = 2;
        assert_eq!(d.settle(16), (4, 2));
        assert!(d.ready(), "no wait after a success");
        d.pending = 4;
        d.settle(16);
        assert!(!d.ready(), "a failure after it waits half as long as the last");
    }
}
