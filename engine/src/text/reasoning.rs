//! Reasoning split from the answer for chat templates that think (`<think>` .. `</think>`), whole or streamed,
//! with the same pieces either way.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where a reply starts, read off its rendered prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThinkStart {
    /// The model may open a `<think>` block first.
    Maybe,
    /// The prompt opened the block; the reply is reasoning until `</think>`.
    Inside,
}

impl ThinkStart {
    /// `None` when the template never thinks; else where a reply to `prompt` starts.
    pub fn for_prompt(template: &str, prompt: &str) -> Option<ThinkStart> {
        if !template.contains(OPEN) {
            return None;
        }
        Some(if prompt.trim_end().ends_with(OPEN) { ThinkStart::Inside } else { ThinkStart::Maybe })
    }
}

/// A piece of a reply's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Answer(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Maybe,
    Inside,
    /// Just past `</think>`: the newlines that separate it from the answer are dropped.
    AfterThink,
    Answer,
}

/// Splits one reply's text as it streams; text that may be the start of a tag is held back.
#[derive(Clone, Debug)]
pub struct ReasoningSplit {
    state: State,
    held: String,
}

impl ReasoningSplit {
    pub fn new(start: ThinkStart) -> ReasoningSplit {
        let state = match start {
            ThinkStart::Maybe => State::Maybe,
            ThinkStart::Inside => State::Inside,
        };
        ReasoningSplit { state, held: String::new() }
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Maybe => {
                    let start = self.held.trim_start();
                    if let Some(rest) = start.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Inside;
                    } else if OPEN.starts_with(start) {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Inside => match self.held.find(CLOSE) {
                    Some(at) => {
                        push(&mut out, Piece::Reasoning(self.held[..at].to_string()));
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.state = State::AfterThink;
                    }
                    None => {
                        let keep = partial_tag(&self.held, CLOSE);
                        let cut = self.held.len() - keep;
                        push(&mut out, Piece::Reasoning(self.held[..cut].to_string()));
                        self.held.drain(..cut);
                        return out;
                    }
                },
                State::AfterThink => {
                    let rest = self.held.trim_start_matches('\n');
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_string();
                    self.state = State::Answer;
                }
                State::Answer => {
                    push(&mut out, Piece::Answer(std::mem::take(&mut self.held)));
                    return out;
                }
            }
        }
    }

    /// Whatever was held back, at the end of the reply.
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            State::Inside => push(&mut out, Piece::Reasoning(held)),
            State::AfterThink => {}
            State::Maybe | State::Answer => push(&mut out, Piece::Answer(held)),
        }
        out
    }

    /// A whole reply's reasoning (`None` when it had none) and answer.
    pub fn split(start: ThinkStart, text: &str) -> (Option<String>, String) {
        let mut split = ReasoningSplit::new(start);
        let mut pieces = split.push(text);
        pieces.extend(split.finish());
        let (mut reasoning, mut answer) = (None::<String>, String::new());
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => reasoning.get_or_insert_with(String::new).push_str(&text),
                Piece::Answer(text) => answer.push_str(&text),
            }
        }
        (reasoning, answer)
    }
}

fn push(out: &mut Vec<Piece>, piece: Piece) {
    match &piece {
        Piece::Reasoning(text) | Piece::Answer(text) if text.is_empty() => {}
        _ => out.push(piece),
    }
}

/// The length of the longest end of `text` that begins `tag`.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(start: ThinkStart, chunks: &[&str]) -> (Option<String>, String) {
        let mut split = ReasoningSplit::new(start);
        let mut pieces: Vec<Piece> = chunks.iter().flat_map(|c| split.push(c)).collect();
        pieces.extend(split.finish());
        let reasoning: String =
            pieces.iter().filter_map(|p| if let Piece::Reasoning(t) = p { Some(t.as_str()) } else { None }).collect();
        let answer =
            pieces.iter().filter_map(|p| if let Piece::Answer(t) = p { Some(t.as_str()) } else { None }).collect();
        ((!reasoning.is_empty()).then_some(reasoning), answer)
    }

    #[test]
    fn test_a_think_block_splits_the_same_whole_and_in_every_chunking() {
        let text = "<think>\nFirst, 2 + 2.\n</think>\n\nIt is 4.";
        let whole = ReasoningSplit::split(ThinkStart::Maybe, text);
        assert_eq!(whole, (Some("\nFirst, 2 + 2.\n".into()), "It is 4.".into()));
        for size in 1..text.len() {
            let chunks: Vec<&str> =
                text.as_bytes().chunks(size).map(|c| std::str::from_utf8(c).expect("ASCII")).collect();
            assert_eq!(streamed(ThinkStart::Maybe, &chunks), whole, "chunks of {size}");
        }
    }

    #[test]
    fn test_without_a_block_everything_is_answer() {
        assert_eq!(
            ReasoningSplit::split(ThinkStart::Maybe, "Hello <think> there"),
            (None, "Hello <think> there".into())
        );
        assert_eq!(streamed(ThinkStart::Maybe, &["<th", "ink? no"]), (None, "<think? no".into()));
        assert_eq!(ReasoningSplit::split(ThinkStart::Maybe, "<thi"), (None, "<thi".into()));
    }

    #[test]
    fn test_a_block_the_prompt_opened_and_one_never_closed() {
        let (reasoning, answer) = ReasoningSplit::split(ThinkStart::Inside, "plan</think>\n\nDone");
        assert_eq!((reasoning.as_deref(), answer.as_str()), (Some("plan"), "Done"));
        let (reasoning, answer) = ReasoningSplit::split(ThinkStart::Inside, "still thinking </thi");
        assert_eq!((reasoning.as_deref(), answer.as_str()), (Some("still thinking </thi"), ""));
    }

    #[test]
    fn test_where_a_reply_starts_follows_the_prompt() {
        let template = "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}";
        assert_eq!(ThinkStart::for_prompt("{{ messages }}", "x<think>"), None);
        assert_eq!(ThinkStart::for_prompt(template, "<|im_start|>assistant\n"), Some(ThinkStart::Maybe));
        assert_eq!(ThinkStart::for_prompt(template, "assistant\n<think>\n"), Some(ThinkStart::Inside));
        assert_eq!(ThinkStart::for_prompt(template, "assistant\n<think>\n\n</think>\n\n"), Some(ThinkStart::Maybe));
    }
}
