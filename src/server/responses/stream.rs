//! A streamed response: the Responses API's events, each with its `sequence_number`, as named server-sent
//! events or as one JSON text per line for WebSocket messages.

use std::convert::Infallible;

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};

use super::object::{call_item, final_status, message_item, new_id, reasoning_item, text_part, Frame, Status};
use super::Saver;
use crate::server::error::ApiError;
use crate::server::turn::{End, Part, Turn};

/// The message or reasoning item being written, if any.
struct OpenItem {
    reasoning: bool,
    id: String,
    output_index: usize,
    text: String,
}

/// How each event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `event: TYPE` and `data: JSON`, then a blank line.
    Sse,
    /// The JSON alone on one line (JSON text holds no raw newline), one WebSocket message each.
    Lines,
}

/// Turns a turn's parts into events, keeping the output items for the final object.
pub struct EventWriter {
    framing: Framing,
    frame: Frame,
    sequence: u64,
    output: Vec<Value>,
    open: Option<OpenItem>,
}

impl EventWriter {
    pub fn new(frame: Frame, framing: Framing) -> EventWriter {
        EventWriter { framing, frame, sequence: 0, output: Vec::new(), open: None }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        match self.framing {
            Framing::Sse => format!("event: {kind}\ndata: {data}\n\n"),
            Framing::Lines => format!("{data}\n"),
        }
    }

    /// `response.created` and `response.in_progress`.
    pub fn opening(&mut self) -> String {
        let object = self.frame.object(Status::InProgress, Vec::new(), None, None);
        let created = self.event("response.created", json!({"response": object}));
        created + &self.event("response.in_progress", json!({"response": object}))
    }

    pub fn part(&mut self, part: Part) -> String {
        match part {
            Part::Reasoning(delta) => self.write(true, delta),
            Part::Text(delta) => self.write(false, delta),
            Part::Call { id: call_id, name, arguments } => {
                let mut out = self.close_message();
                let (id, output_index) = (new_id("fc"), self.output.len());
                let item = call_item(&id, &call_id, &name, "", "in_progress");
                out += &self.event("response.output_item.added", json!({"output_index": output_index, "item": item}));
                let delta = json!({"item_id": id, "output_index": output_index, "delta": arguments});
                out += &self.event("response.function_call_arguments.delta", delta);
                let done = json!({"item_id": id, "output_index": output_index, "name": name, "arguments": arguments});
                out += &self.event("response.function_call_arguments.done", done);
                let item = call_item(&id, &call_id, &name, &arguments, "completed");
                self.output.push(item.clone());
                out + &self.event("response.output_item.done", json!({"output_index": output_index, "item": item}))
            }
        }
    }

    /// Opens a message (or reasoning) item unless one is open, then writes `delta` into it.
    fn write(&mut self, reasoning: bool, delta: String) -> String {
        let mut out = String::new();
        if self.open.as_ref().is_some_and(|open| open.reasoning != reasoning) {
            out += &self.close_message();
        }
        if self.open.is_none() {
            let output_index = self.output.len();
            let id = new_id(if reasoning { "rs" } else { "msg" });
            let item =
                if reasoning { reasoning_item(&id, "", "in_progress") } else { message_item(&id, "", "in_progress") };
            out += &self.event("response.output_item.added", json!({"output_index": output_index, "item": item}));
            if !reasoning {
                let part =
                    json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": text_part("")});
                out += &self.event("response.content_part.added", part);
            }
            self.output.push(Value::Null);
            self.open = Some(OpenItem { reasoning, id, output_index, text: String::new() });
        }
        let Some(open) = self.open.as_mut() else { return out };
        open.text.push_str(&delta);
        let mut data =
            json!({"item_id": open.id, "output_index": open.output_index, "content_index": 0, "delta": delta});
        if reasoning {
            return out + &self.event("response.reasoning_text.delta", data);
        }
        data["logprobs"] = json!([]);
        out + &self.event("response.output_text.delta", data)
    }

    fn close_message(&mut self) -> String {
        let Some(OpenItem { reasoning, id, output_index, text }) = self.open.take() else { return String::new() };
        let at = json!({"item_id": id, "output_index": output_index, "content_index": 0});
        if reasoning {
            let mut done = at;
            done["text"] = json!(text);
            let out = self.event("response.reasoning_text.done", done);
            let item = reasoning_item(&id, &text, "completed");
            self.output[output_index] = item.clone();
            return out + &self.event("response.output_item.done", json!({"output_index": output_index, "item": item}));
        }
        let mut done = at.clone();
        done["text"] = json!(text);
        done["logprobs"] = json!([]);
        let mut out = self.event("response.output_text.done", done);
        let mut part = at;
        part["part"] = text_part(&text);
        out += &self.event("response.content_part.done", part);
        let item = message_item(&id, &text, "completed");
        self.output[output_index] = item.clone();
        out + &self.event("response.output_item.done", json!({"output_index": output_index, "item": item}))
    }

    /// The last events, and the final object to store.
    pub fn end(&mut self, end: End) -> (String, Value) {
        let out = self.close_message();
        let status = final_status(&end);
        let object = self.frame.object(status, self.output.clone(), Some(end.usage), None);
        let kind = if status == Status::Incomplete { "response.incomplete" } else { "response.completed" };
        (out + &self.event(kind, json!({"response": object})), object)
    }

    /// `response.failed`, carrying the error, and the failed object.
    pub fn failed(&mut self, error: &ApiError) -> (String, Value) {
        let out = self.close_message();
        let object = self.frame.object(Status::Failed, self.output.clone(), None, Some(error));
        (out + &self.event("response.failed", json!({"response": object})), object)
    }
}

/// The text the turn's next step writes, and the final object once the turn is over.
pub async fn next_text(turn: &mut Turn, writer: &mut EventWriter) -> (String, Option<Value>) {
    match turn.next().await {
        Ok(step) => {
            let mut text: String = step.parts.into_iter().map(|part| writer.part(part)).collect();
            let Some(end) = step.end else { return (text, None) };
            let (more, object) = writer.end(end);
            text += &more;
            (text, Some(object))
        }
        Err(error) => {
            let (text, object) = writer.failed(&error);
            (text, Some(object))
        }
    }
}

/// The response body: it owns the turn, so a client that goes away cancels the lane.
pub fn events(turn: Turn, mut writer: EventWriter, saver: Saver) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let opening = writer.opening();
    stream::unfold(Some((turn, writer, saver, Some(opening))), |state| async move {
        let (mut turn, mut writer, saver, opening) = state?;
        if let Some(opening) = opening {
            return Some((Ok(Bytes::from(opening)), Some((turn, writer, saver, None))));
        }
        loop {
            let (text, last) = next_text(&mut turn, &mut writer).await;
            if let Some(object) = last {
                saver.save(object).await;
                return Some((Ok(Bytes::from(text)), None));
            }
            if !text.is_empty() {
                return Some((Ok(Bytes::from(text)), Some((turn, writer, saver, None))));
            }
        }
    })
}
