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

/// The blocks written so far; a text block stays open until a call or the end.
struct Blocks {
    count: usize,
    text_open: bool,
}

impl Blocks {
    fn part(&mut self, part: Part) -> String {
        match part {
            Part::Text(text) => {
                let mut out = String::new();
                if !self.text_open {
                    let block = json!({"type": "text", "text": ""});
                    out += &event("content_block_start", json!({"index": self.count, "content_block": block}));
                    self.text_open = true;
                }
                let delta = json!({"type": "text_delta", "text": text});
                out + &event("content_block_delta", json!({"index": self.count, "delta": delta}))
            }
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
        if !self.text_open {
            return String::new();
        }
        self.text_open = false;
        self.count += 1;
        event("content_block_stop", json!({"index": self.count - 1}))
    }

    fn end(&mut self, end: End) -> String {
        let out = self.close();
        let delta = json!({"stop_reason": stop_reason(&end), "stop_sequence": null});
        let out = out + &event("message_delta", json!({"delta": delta, "usage": usage_body(end.usage)}));
        out + &event("message_stop", json!({}))
    }
}

/// The response body: it owns the turn, so a client that goes away cancels the lane.
pub fn events(turn: Turn, id: String, model: String) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let message = json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}});
    let opening = event("message_start", json!({"message": message})) + &event("ping", json!({}));
    let blocks = Blocks { count: 0, text_open: false };
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
