//! Anthropic's Messages API: `/v1/messages`, whole or streamed with Anthropic's events and errors.

pub mod request;
mod stream;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use serde_json::{json, Value};
use tensorfold_actors::request_types::{FinishReason, Usage};

use super::body::{read_body, BodyLimit};
use super::error::ApiError;
use super::random_u64;
use super::turn::{self, End, Part};
use super::{AppState, Backend};

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, at the same status.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct AnthropicError(#[from] pub ApiError);

impl AnthropicError {
    /// Anthropic's error `type` for a status.
    fn kind(status: StatusCode) -> &'static str {
        match status.as_u16() {
            400 | 405 | 408 | 413 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    pub fn body(&self) -> Value {
        let status = self.0.status_code();
        json!({"type": "error", "error": {"type": Self::kind(status), "message": self.0.to_string()}})
    }
}

impl ResponseError for AnthropicError {
    fn status_code(&self) -> StatusCode {
        self.0.status_code()
    }

    fn error_response(&self) -> HttpResponse {
        let response = self.0.error_response();
        let mut reply = HttpResponse::build(self.status_code());
        for (name, value) in response.headers().iter().filter(|(name, _)| **name != header::CONTENT_TYPE) {
            reply.insert_header((name.clone(), value.clone()));
        }
        reply.json(self.body())
    }
}

fn message_id() -> String {
    format!("msg_{:016x}{:016x}", random_u64(), random_u64())
}

/// Anthropic's `stop_reason` for the way the turn ended.
fn stop_reason(end: &End) -> &'static str {
    match end.finish {
        FinishReason::Length => "max_tokens",
        FinishReason::Stop if end.made_calls => "tool_use",
        FinishReason::Stop if end.stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop => "end_turn",
    }
}

fn usage_body(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    })
}

/// A call's arguments as a `tool_use` block's `input` object.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

fn content_block(part: &Part) -> Value {
    match part {
        Part::Reasoning(text) => json!({"type": "thinking", "thinking": text, "signature": ""}),
        Part::Text(text) => json!({"type": "text", "text": text}),
        Part::Call { id, name, arguments } => {
            json!({"type": "tool_use", "id": id, "name": name, "input": tool_input(arguments)})
        }
    }
}

pub(in crate::server) async fn create<B: Backend>(
    state: web::Data<AppState<B>>,
    limit: web::Data<BodyLimit>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, AnthropicError> {
    let body = read_body(&req, payload, limit.0).await?;
    let (chat, streamed) = request::parse(&body)?;
    let turn = turn::start(&state, chat, false).await?;
    let (id, model) = (message_id(), state.model_name.clone());
    if streamed {
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(stream::events(turn, id, model)));
    }
    let (parts, end) = turn.collect().await?;
    let content: Vec<Value> = parts.iter().map(content_block).collect();
    Ok(HttpResponse::Ok().json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(&end),
        "stop_sequence": end.stop_sequence,
        "usage": usage_body(end.usage),
    })))
}
