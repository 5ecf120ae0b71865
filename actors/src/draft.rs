//! Prompt-lookup drafting: a decoding lane proposes the tokens that followed the last place its recent tokens
//! appeared in its own prompt and output, and backs off while its drafts keep failing.

/// Tokens matched: shorter matches draft text that copies nothing too often.
const NGRAMS: [usize; 1] = [3];
/// Most rounds a lane waits after drafts that failed, doubling from one.
const MAX_BACKOFF: u32 = 16;

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
    /// Up to `most` tokens that followed the latest earlier occurrence of the last n tokens of `tokens`.
    pub fn propose(&mut self, tokens: &[u32], most: usize) -> Vec<u32> {
        if most == 0 {
            return Vec::new();
        }
        if self.wait > 0 {
            self.wait -= 1;
            return Vec::new();
        }
        for n in NGRAMS {
            if tokens.len() <= n {
                continue;
            }
            let key = &tokens[tokens.len() - n..];
            if let Some(i) = (0..tokens.len() - n).rev().find(|&i| &tokens[i..i + n] == key) {
                let draft: Vec<u32> = tokens[i + n..tokens.len().min(i + n + most)].to_vec();
                if !draft.is_empty() {
                    return draft;
                }
            }
        }
        Vec::new()
    }

    /// The round's verdict on the pending draft: (drafted, accepted); a draft with nothing accepted makes the lane
    /// wait before drafting again, longer each time.
    pub fn settle(&mut self) -> (usize, usize) {
        let verdict = (self.pending, self.accepted.min(self.pending));
        if self.pending > 0 {
            if verdict.1 == 0 {
                self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_draft_is_what_followed_the_latest_match_of_the_last_tokens() {
        let mut d = Drafter::default();
        let tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        assert_eq!(d.propose(&tokens, 4), vec![7, 8, 5, 1]);
        assert_eq!(d.propose(&tokens, 2), vec![7, 8]);
        assert_eq!(d.propose(&[4, 5, 6], 4), Vec::<u32>::new(), "no earlier match");
        assert_eq!(d.propose(&[5, 6, 1, 5, 6], 4), Vec::<u32>::new(), "a bigram is not enough");
    }

    #[test]
    fn test_failed_drafts_make_the_lane_wait_longer_each_time_and_a_success_halves_the_wait() {
        let mut d = Drafter::default();
        let tokens = [1, 2, 3, 4, 1, 2, 3];
        let draft = d.propose(&tokens, 4);
        d.pending = draft.len();
        assert_eq!(d.settle(), (4, 0));
        assert!(d.propose(&tokens, 4).is_empty(), "waits one round");
        d.pending = d.propose(&tokens, 4).len();
        d.settle();
        assert!(d.propose(&tokens, 4).is_empty() && d.propose(&tokens, 4).is_empty(), "then two");
        d.pending = d.propose(&tokens, 4).len();
        d.accepted = 2;
        assert_eq!(d.settle(), (4, 2));
        assert!(!d.propose(&tokens, 4).is_empty(), "no wait after a success");
        d.pending = 4;
        d.settle();
        assert!(d.propose(&tokens, 4).is_empty(), "a failure after it waits half as long as the last");
    }
}
