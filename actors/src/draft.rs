//! Prompt-lookup drafting: a decoding lane proposes the tokens that followed the last place its recent tokens
//! appeared in its own prompt and output, and backs off while its drafts keep failing.

/// Fewest tokens a match needs: shorter ones draft text that copies nothing too often.
const MIN_MATCH: usize = 3;
/// Longest match looked for: a longer one picks, among the places the last tokens appeared, the one most like now.
const MAX_MATCH: usize = 8;

/// A lane's drafting state.
#[derive(Default)]
pub struct Drafter {
    /// Rounds left before the lane drafts again.
    wait: u32,
    /// The wait after the next failure.
    backoff: u32,
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

    /// The round's verdict on the pending draft: (drafted, accepted); a draft with nothing accepted makes the lane
    /// wait before drafting again, longer each time, at most `max_wait` rounds.
    pub fn settle(&mut self, max_wait: u32) -> (usize, usize) {
        let verdict = (self.pending, self.accepted.min(self.pending));
        if self.pending > 0 {
            if verdict.1 == 0 {
                self.backoff = (self.backoff * 2).clamp(1, max_wait.max(1));
                self.wait = self.backoff;
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
