//! Stop strings over streamed text: holds back only what could still become a stop string.

/// Text that is safe to send, and the stop string that ended the stream, if one did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    pub text: String,
    pub stopped: Option<String>,
}

pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), pending: String::new() }
    }

    /// Adds new text; releases what can no longer be part of a stop string, cut before any stop string.
    pub fn push(&mut self, text: &str) -> Released {
        self.pending.push_str(text);
        // The earliest match wins; at one position, the stop listed first.
        let earliest =
            self.stops.iter().filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s))).min_by_key(|m| m.0);
        if let Some((at, stop)) = earliest {
            let text = self.pending[..at].to_string();
            let stopped = Some(stop.clone());
            self.pending.clear();
            return Released { text, stopped };
        }
        let hold = self.longest_partial_suffix();
        let cut = self.pending.len() - hold;
        let text = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Released { text, stopped: None }
    }

    /// Releases whatever is held back when the stream ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    fn longest_partial_suffix(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stops {
            for len in (1..s.len().min(p.len() + 1)).rev() {
                if len > best && p.is_char_boundary(p.len() - len) && s.is_char_boundary(len) && p.ends_with(&s[..len])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_stop_string_split_across_pushes() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("hello E"), Released { text: "hello ".into(), stopped: None });
        assert_eq!(m.push("N"), Released { text: "".into(), stopped: None });
        assert_eq!(m.push("D and more"), Released { text: "".into(), stopped: Some("END".into()) });
    }

    #[test]
    fn test_false_start_is_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("EN").text, "");
        assert_eq!(m.push("x").text, "ENx");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn test_earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(vec!["b".into(), "a".into()]);
        assert_eq!(m.push("xxaxb"), Released { text: "xx".into(), stopped: Some("a".into()) });
    }

    #[test]
    fn test_multibyte_stop_is_held_on_char_boundaries() {
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("caf").text, "caf");
        assert_eq!(m.push("é").text, "");
        assert_eq!(m.finish(), "é");
    }
}
