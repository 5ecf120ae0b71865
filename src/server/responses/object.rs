//! The response object and its output items, as OpenAI's Responses API shapes them.

use serde_json::{json, Value};
use tensorfold_actors::request_types::{FinishReason, Usage};

use super::request::ResponseParams;
use crate::server::error::ApiError;
use crate::server::random_u64;
use crate::server::turn::{End, Part};

/// A fresh id with OpenAI's prefix for its kind (`resp`, `msg`, `fc`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:016x}", random_u64(), random_u64())
}

/// Where a response stands; `as_str` is its `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, Status::Queued | Status::InProgress)
    }
}

/// A response's fixed fields: everything but its output, status and usage.
#[derive(Clone, Debug)]
pub struct Frame {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub params: ResponseParams,
}

impl Frame {
    /// The response object with `output` items.
    pub fn object(&self, status: Status, output: Vec<Value>, usage: Option<Usage>, error: Option<&ApiError>) -> Value {
        let p = &self.params;
        let output_text: String = output
            .iter()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|part| part["text"].as_str().map(str::to_string))
            .collect();
        let incomplete = (status == Status::Incomplete).then(|| json!({"reason": "max_output_tokens"}));
        let error =
            error.map(|e| json!({"code": e.body().error.code.unwrap_or("server_error"), "message": e.to_string()}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status.as_str(),
            "background": p.background,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": p.instructions,
            "max_output_tokens": p.max_output_tokens,
            "metadata": p.metadata,
            "model": self.model,
            "output": output,
            "output_text": output_text,
            "parallel_tool_calls": p.parallel_tool_calls,
            "previous_response_id": p.previous_response_id,
            "reasoning": p.reasoning,
            "store": p.store,
            "temperature": p.temperature.unwrap_or(1.0),
            "text": {"format": p.text_format},
            "tool_choice": p.tool_choice,
            "tools": p.tools,
            "top_p": p.top_p.unwrap_or(1.0),
            "truncation": "disabled",
            "usage": usage.map(usage_body),
            "user": p.user,
        })
    }
}

/// The Responses API's usage, cached prompt tokens included.
pub fn usage_body(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

/// A response's final status for the way its lane ended.
pub fn final_status(end: &End) -> Status {
    match end.finish {
        FinishReason::Length => Status::Incomplete,
        FinishReason::Stop => Status::Completed,
    }
}

/// An assistant message item holding `text`.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([text_part(text)]) };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// A reasoning item holding the thinking as `reasoning_text`; no summary is written.
pub fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" { json!([]) } else { json!([{"type": "reasoning_text", "text": text}]) };
    json!({"type": "reasoning", "id": id, "status": status, "summary": [], "content": content})
}

pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A function call item.
pub fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// A whole turn's parts as output items: one message per run of text, one item per call.
pub fn output_items(parts: &[Part]) -> Vec<Value> {
    parts
        .iter()
        .map(|part| match part {
            Part::Reasoning(text) => reasoning_item(&new_id("rs"), text, "completed"),
            Part::Text(text) => message_item(&new_id("msg"), text, "completed"),
            Part::Call { id, name, arguments } => call_item(&new_id("fc"), id, name, arguments, "completed"),
        })
        .collect()
}
