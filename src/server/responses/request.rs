//! A Responses API request read as a chat request: input items become messages, flat function tools become
//! chat tools, `text.format` becomes `response_format`; the rest of the request is kept for the reply.

use serde_json::{json, Map, Value};

use crate::server::error::ApiError;
#[cfg(test)]
use crate::server::text::openai::ResponseFormat;
use crate::server::text::openai::{ChatCompletionRequest, Fields};

/// The fields of a Responses request that do not reach the chat request, echoed in the response object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResponseParams {
    pub model: Option<String>,
    pub instructions: Option<String>,
    /// This request's input as a list of items, as `input_items` returns it.
    pub input: Vec<Value>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub background: bool,
    pub stream: bool,
    pub metadata: Map<String, Value>,
    pub user: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub tools: Vec<Value>,
    pub tool_choice: Value,
    pub parallel_tool_calls: bool,
    pub text_format: Value,
    pub reasoning: Value,
}

/// The request's parameters, and the chat body its sampling fields go into (without `messages` yet).
pub fn parse(body: &[u8]) -> Result<(ResponseParams, Map<String, Value>), ApiError> {
    let mut fields = Fields::parse(body)?;
    let input = match fields.required("input")? {
        Value::String(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("input", "'input' must be a string or a list of input items")),
    };
    let text_field = |fields: &mut Fields, key: &str| -> Result<Option<String>, ApiError> { fields.take(key) };
    let mut params = ResponseParams {
        model: text_field(&mut fields, "model")?,
        instructions: text_field(&mut fields, "instructions")?,
        input,
        previous_response_id: text_field(&mut fields, "previous_response_id")?,
        store: fields.take("store")?.unwrap_or(true),
        background: fields.take("background")?.unwrap_or(false),
        stream: fields.take("stream")?.unwrap_or(false),
        metadata: fields.take("metadata")?.unwrap_or_default(),
        user: text_field(&mut fields, "user")?,
        max_output_tokens: fields.take("max_output_tokens")?,
        temperature: fields.take("temperature")?,
        top_p: fields.take("top_p")?,
        tools: Vec::new(),
        tool_choice: fields.take_value("tool_choice").unwrap_or_else(|| json!("auto")),
        parallel_tool_calls: fields.take("parallel_tool_calls")?.unwrap_or(true),
        text_format: json!({"type": "text"}),
        reasoning: fields.take_value("reasoning").unwrap_or_else(|| json!({"effort": null, "summary": null})),
    };
    if params.metadata.len() > 16 {
        return Err(ApiError::invalid("metadata", "'metadata' holds at most 16 pairs"));
    }
    if params.background && !params.store {
        return Err(ApiError::invalid("background", "'background' needs 'store' left true: its result is polled"));
    }
    let mut chat = Map::new();
    if let Some(tools) = fields.take_value("tools") {
        let Value::Array(tools) = tools else {
            return Err(ApiError::invalid("tools", "'tools' must be a list"));
        };
        chat.insert("tools".into(), Value::Array(chat_tools(&tools)?));
        params.tools = tools;
    }
    chat.insert("tool_choice".into(), chat_tool_choice(&params.tool_choice)?);
    chat.insert("parallel_tool_calls".into(), Value::Bool(params.parallel_tool_calls));
    if let Some(text) = fields.take_value("text") {
        if let Some(format) = text.get("format").filter(|f| !f.is_null()) {
            chat.insert("response_format".into(), chat_format(format)?);
            params.text_format = format.clone();
        }
    }
    let sampling = ["top_k", "min_p", "seed", "stop", "repetition_penalty", "presence_penalty", "frequency_penalty"];
    for key in sampling.into_iter().chain(["logit_bias", "cache", "draft"]) {
        if let Some(value) = fields.take_value(key) {
            chat.insert(key.into(), value);
        }
    }
    for (key, value) in [("temperature", params.temperature), ("top_p", params.top_p)] {
        if let Some(value) = value {
            chat.insert(key.into(), json!(value));
        }
    }
    let mut kwargs: Map<String, Value> = fields.take("chat_template_kwargs")?.unwrap_or_default();
    if let Some(effort) = params.reasoning.get("effort").and_then(Value::as_str) {
        kwargs.entry("enable_thinking").or_insert(json!(effort != "none"));
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    if let Some(max) = params.max_output_tokens {
        chat.insert("max_completion_tokens".into(), json!(max));
    }
    chat.insert("model".into(), json!(params.model));
    Ok((params, chat))
}

/// The chat request for `items`, the whole conversation, under `instructions`.
pub fn chat_request(
    instructions: Option<&str>,
    items: &[Value],
    mut chat: Map<String, Value>,
) -> Result<ChatCompletionRequest, ApiError> {
    let mut messages: Vec<Value> = Vec::new();
    if let Some(text) = instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    for (index, item) in items.iter().enumerate() {
        push_item(&mut messages, index, item)?;
    }
    if messages.is_empty() {
        return Err(ApiError::invalid("input", "'input' must hold at least one item"));
    }
    chat.insert("messages".into(), Value::Array(messages));
    ChatCompletionRequest::from_json(Value::Object(chat).to_string().as_bytes()).map_err(|e| e.renamed(NAMES))
}

/// Chat's field names as the Responses API names them.
const NAMES: &[(&str, &str)] = &[
    ("max_completion_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    (".function.", "."),
    ("messages", "input"),
];

/// One input item as chat messages: calls join the assistant message before them, as a chat reply holds both.
fn push_item(messages: &mut Vec<Value>, index: usize, item: &Value) -> Result<(), ApiError> {
    let at = format!("input[{index}]");
    let invalid = |field: &str, message: String| ApiError::invalid(format!("{at}{field}"), message);
    let Value::Object(item) = item else {
        return Err(invalid("", format!("{at} must be an object")));
    };
    let kind =
        item.get("type").and_then(Value::as_str).unwrap_or(if item.contains_key("role") { "message" } else { "" });
    match kind {
        "message" => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some(role @ ("user" | "assistant" | "system")) => role,
                Some("developer") => "system",
                _ => return Err(invalid(".role", format!("{at}.role must be user, assistant, system or developer"))),
            };
            let content = message_text(&at, item.get("content"))?;
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" => {
            let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_string);
            let (Some(call_id), Some(name), Some(arguments)) = (text("call_id"), text("name"), text("arguments"))
            else {
                return Err(invalid("", format!("{at}: a function_call needs string call_id, name and arguments")));
            };
            let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
            match messages.last_mut() {
                Some(last) if last["role"] == "assistant" => match last.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => drop(last.as_object_mut().map(|m| m.insert("tool_calls".into(), json!([call])))),
                },
                _ => messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let Some(call_id) = item.get("call_id").and_then(Value::as_str) else {
                return Err(invalid(".call_id", format!("{at}.call_id must be the id of the call it answers")));
            };
            let output = match item.get("output") {
                Some(Value::String(text)) => text.clone(),
                Some(parts @ Value::Array(_)) => message_text(&at, Some(parts))?,
                _ => return Err(invalid(".output", format!("{at}.output must be a string"))),
            };
            messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
        }
        // Reasoning is the model's own and is not fed back, as chat templates drop earlier thinking.
        "reasoning" => {}
        other => {
            let other = if other.is_empty() { "missing" } else { other };
            let message = format!(
                "{at}: item type '{other}' is not supported; use message, function_call or function_call_output"
            );
            return Err(invalid(".type", message));
        }
    }
    Ok(())
}

/// A message's content: a string, or text parts joined by newlines.
fn message_text(at: &str, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or("missing");
                match (kind, part.get("text").and_then(Value::as_str)) {
                    ("input_text" | "output_text" | "text", Some(text)) => texts.push(text),
                    ("refusal", _) => texts.push(part.get("refusal").and_then(Value::as_str).unwrap_or_default()),
                    _ => {
                        let message = format!(
                            "{at}.content[{j}]: content type '{kind}' is not supported; only input_text and output_text"
                        );
                        return Err(ApiError::invalid(format!("{at}.content[{j}].type"), message));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => {
            Err(ApiError::invalid(format!("{at}.content"), format!("{at}.content must be a string or a list of parts")))
        }
    }
}

/// `{"type": "function", "name", "description", "parameters", "strict"}` as chat's nested form.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                let message = format!("{at}: tool type '{other}' is not supported; only function tools run here");
                return Err(ApiError::invalid(format!("{at}.type"), message));
            }
            None => return Err(ApiError::invalid(format!("{at}.type"), format!("{at}.type must be 'function'"))),
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(value) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), value.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// `"auto" | "none" | "required" | {"type": "function", "name"}` as chat's `tool_choice`.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(named) => match (named.get("type").and_then(Value::as_str), named.get("name")) {
            (Some("function"), Some(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
            (Some("auto" | "none" | "required"), _) => Ok(named["type"].clone()),
            _ => Err(ApiError::invalid("tool_choice", "'tool_choice' must name a function as {type: function, name}")),
        },
        _ => Err(ApiError::invalid("tool_choice", "'tool_choice' must be auto, none, required or a named function")),
    }
}

/// `text.format` as chat's `response_format`.
fn chat_format(format: &Value) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let mut inner = Map::new();
            for key in ["name", "schema", "strict"] {
                if let Some(value) = format.get(key) {
                    inner.insert(key.into(), value.clone());
                }
            }
            if !inner.contains_key("schema") {
                return Err(ApiError::invalid(
                    "text.format.schema",
                    "'text.format.schema' is required for json_schema",
                ));
            }
            Ok(json!({"type": "json_schema", "json_schema": inner}))
        }
        Some(kind @ ("text" | "json_object")) => Ok(json!({"type": kind})),
        _ => Err(ApiError::invalid("text.format.type", "'text.format.type' must be text, json_object or json_schema")),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
