//! Prompt-lookup drafting: a decoding lane proposes the tokens that followed the last place its recent tokens
//! appeared in its own prompt and output, as many as its drafts have earned at what a verify row costs.

/// Fewest tokens a match needs: shorter ones draft text that copies nothing too often.
const MIN_MATCH: usize = 3;
/// Longest match looked for: a longer one picks, among the places the last tokens appeared, the one most like now.
const MAX_MATCH: usize = 8;

/// A prior of one draft token kept and one refused: a lane starts out drafting short, then drafts what it earns.
const PRIOR: f64 = 1.0;
/// Each settled draft weighs this much less than the next: a lane's text changes what drafting earns.
const DECAY: f64 = 0.9;

/// What a forward pass costs on an engine, measured at start-up: `fixed` seconds plus `per_row` for each row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    pub fixed: f64,
    pub per_row: f64,
}

impl StepCost {
    /// Where nothing was timed: rows cost nothing beside the round, so lanes draft what they earn.
    pub const UNKNOWN: StepCost = StepCost { fixed: 1.0, per_row: 0.0 };

    /// From the time of a one-row step and of a step of `rows` rows (more than one).
    pub fn from_times(one_row: f64, many: f64, rows: usize) -> StepCost {
        let per_row = ((many - one_row) / (rows - 1) as f64).max(0.0);
        StepCost { fixed: (one_row - per_row).max(per_row * 1e-3), per_row }
    }

    /// Tokens a second from a round of `rows` rows that yields `tokens` tokens.
    fn rate(&self, tokens: f64, rows: usize) -> f64 {
        tokens / (self.fixed + rows as f64 * self.per_row)
    }
}

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
    /// length pays, one token, as a probe of whether the text repeats now; failed probes wait longer each time.
    pub fn length(&mut self, most: usize, lanes: usize, rows: usize, cost: StepCost) -> usize {
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
        // A failed probe backs off in `settle`, so a lane whose text never repeats pays one row in `max_wait` rounds.
        best.max(1)
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

    /// Rows drafted over `rounds` rounds by a lane whose drafts keep `kept` of their tokens, at `cost`.
    fn drafted_rows(kept: usize, rounds: usize, cost: StepCost) -> (usize, Vec<usize>) {
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
        let cpu = StepCost { fixed: 1.0, per_row: 0.4 };
        let (rows, lengths) = drafted_rows(0, 400, cpu);
        assert!(rows <= 12, "{rows} rows drafted in 400 rounds: {lengths:?}");
        assert!(lengths.iter().all(|&n| n <= 1), "a lane with nothing kept drafts long: {lengths:?}");
    }

    #[test]
    fn test_a_lane_whose_drafts_are_kept_drafts_long() {
        let cpu = StepCost { fixed: 1.0, per_row: 0.4 };
        let (_, lengths) = drafted_rows(8, 40, cpu);
        assert!(lengths[30..].iter().all(|&n| n >= 6), "{lengths:?}");
        let gpu = StepCost { fixed: 1.0, per_row: 0.002 };
        let (_, lengths) = drafted_rows(0, 3, gpu);
        assert!(lengths[0] >= 6, "where rows are nearly free a new lane drafts long: {lengths:?}");
    }

    #[test]
    fn test_wide_rounds_draft_less() {
        let cpu = StepCost { fixed: 1.0, per_row: 0.4 };
        let mut d = Drafter { kept: 3.0, refused: 1.0, ..Default::default() };
        let alone = d.length(8, 1, 1, cpu);
        let among = d.length(8, 16, 16, cpu);
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
