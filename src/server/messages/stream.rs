//! A streamed message: Anthropic's `message_start`, content block events, `message_delta` and `message_stop`.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use super::{stop_reason, tool_input, usage_body, AnthropicError};
use crate::server::turn::{End, Part, Turn};

fn event(kind: &str, mut data: Value) -> String {
    data["type"] = json!(kind);
    format!("event: {kind}\ndata: {data}\n\n")
}

/// The blocks written so far; a text or thinking block stays open until another kind of block or the end.
struct Blocks {
    count: usize,
    open: Option<&'static str>,
}

impl Blocks {
    /// Opens a block of `kind` unless one is open, then writes `delta` into it.
    fn write(&mut self, kind: &'static str, delta: Value) -> String {
        let mut out = String::new();
        if self.open != Some(kind) {
            out += &self.close();
            let block = match kind {
                "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            out += &event("content_block_start", json!({"index": self.count, "content_block": block}));
            self.open = Some(kind);
        }
        out + &event("content_block_delta", json!({"index": self.count, "delta": delta}))
    }

    fn part(&mut self, part: Part) -> String {
        match part {
            Part::Reasoning(text) => self.write("thinking", json!({"type": "thinking_delta", "thinking": text})),
            Part::Text(text) => self.write("text", json!({"type": "text_delta", "text": text})),
            Part::Call { id, name, arguments } => {
                let mut out = self.close();
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                out += &event("content_block_start", json!({"index": self.count, "content_block": block}));
                let json_text = tool_input(&arguments).to_string();
                let delta = json!({"type": "input_json_delta", "partial_json": json_text});
                out += &event("content_block_delta", json!({"index": self.count, "delta": delta}));
                out += &event("content_block_stop", json!({"index": self.count}));
                self.count += 1;
                out
            }
        }
    }

    fn close(&mut self) -> String {
        if self.open.take().is_none() {
            return String::new();
        }
        self.count += 1;
        event("content_block_stop", json!({"index": self.count - 1}))
    }

    fn end(&mut self, end: End) -> String {
        let out = self.close();
        let delta = json!({"stop_reason": stop_reason(&end), "stop_sequence": end.stop_sequence});
        let out = out + &event("message_delta", json!({"delta": delta, "usage": usage_body(end.usage)}));
        out + &event("message_stop", json!({}))
    }
}

/// The response body: it owns the turn, so a client that goes away cancels the lane.
pub fn events(turn: Turn, id: String, model: String) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let message = json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}});
    let opening = event("message_start", json!({"message": message})) + &event("ping", json!({}));
    let blocks = Blocks { count: 0, open: None };
    stream::unfold(Some((turn, blocks, Some(opening))), |state| async move {
        let (mut turn, mut blocks, opening) = state?;
        if let Some(opening) = opening {
            return Some((Ok(Bytes::from(opening)), Some((turn, blocks, None))));
        }
        loop {
            match turn.next().await {
                Ok(step) => {
                    let mut text: String = step.parts.into_iter().map(|part| blocks.part(part)).collect();
                    if let Some(end) = step.end {
                        text += &blocks.end(end);
                        return Some((Ok(Bytes::from(text)), None));
                    }
                    if !text.is_empty() {
                        return Some((Ok(Bytes::from(text)), Some((turn, blocks, None))));
                    }
                }
                Err(error) => {
                    let text = event("error", AnthropicError(error).body());
                    return Some((Ok(Bytes::from(text)), None));
                }
            }
        }
    })
}
