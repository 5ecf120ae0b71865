//! An Anthropic Messages request read as a chat request: content blocks become messages, `tool_use` and
//! `tool_result` blocks become calls and tool messages, Anthropic's tool fields become chat's.

use serde_json::{json, Map, Value};

use crate::server::error::ApiError;
use crate::server::text::openai::{ChatCompletionRequest, Fields};

/// The chat request, and whether the reply streams.
pub fn parse(body: &[u8]) -> Result<(ChatCompletionRequest, bool), ApiError> {
    let mut fields = Fields::parse(body)?;
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(system) = fields.take_value("system") {
        messages.push(json!({"role": "system", "content": block_text("system", &system)?}));
    }
    let Value::Array(items) = fields.required("messages")? else {
        return Err(ApiError::invalid("messages", "'messages' must be a list of messages"));
    };
    for (i, message) in items.iter().enumerate() {
        push_message(&mut messages, i, message)?;
    }
    chat.insert("messages".into(), Value::Array(messages));
    let max_tokens: u64 = fields.required_as("max_tokens")?;
    chat.insert("max_completion_tokens".into(), json!(max_tokens));
    if let Some(stops) = fields.take_value("stop_sequences") {
        chat.insert("stop".into(), stops);
    }
    if let Some(tools) = fields.take_value("tools") {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = fields.take_value("tool_choice") {
        let (choice, parallel) = chat_tool_choice(&choice)?;
        chat.insert("tool_choice".into(), choice);
        chat.insert("parallel_tool_calls".into(), json!(parallel));
    }
    let sampling = ["temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty"];
    for key in sampling.into_iter().chain(["model", "logit_bias", "repetition_penalty", "cache", "draft"]) {
        if let Some(value) = fields.take_value(key) {
            chat.insert(key.into(), value);
        }
    }
    let mut kwargs: Map<String, Value> = fields.take("chat_template_kwargs")?.unwrap_or_default();
    if let Some(kind) = fields.take_value("thinking").as_ref().and_then(|t| t.get("type")).and_then(Value::as_str) {
        kwargs.entry("enable_thinking").or_insert(json!(kind != "disabled"));
    }
    if !kwargs.is_empty() {
        chat.insert("chat_template_kwargs".into(), Value::Object(kwargs));
    }
    let stream = fields.take("stream")?.unwrap_or(false);
    let request =
        ChatCompletionRequest::from_json(Value::Object(chat).to_string().as_bytes()).map_err(|e| e.renamed(NAMES))?;
    Ok((request, stream))
}

/// Chat's field names as the Messages API names them.
const NAMES: &[(&str, &str)] =
    &[("max_completion_tokens", "max_tokens"), ("'stop'", "'stop_sequences'"), (".function.", ".")];

/// A string, or text blocks joined by newlines.
fn block_text(at: &str, value: &Value) -> Result<String, ApiError> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(text)) => texts.push(text),
                    (kind, _) => return Err(unsupported(&format!("{at}[{j}]"), kind)),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::invalid(at, format!("'{at}' must be a string or a list of text blocks"))),
    }
}

fn unsupported(at: &str, kind: Option<&str>) -> ApiError {
    let kind = kind.unwrap_or("missing");
    ApiError::invalid(format!("{at}.type"), format!("{at}: block type '{kind}' is not supported here"))
}

/// One message as chat messages: a user's tool results become tool messages, an assistant's tool uses calls.
fn push_message(messages: &mut Vec<Value>, index: usize, message: &Value) -> Result<(), ApiError> {
    let at = format!("messages[{index}]");
    let role = match message.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant")) => role,
        _ => return Err(ApiError::invalid(format!("{at}.role"), format!("{at}.role must be user or assistant"))),
    };
    let blocks = match message.get("content") {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => {
            let message = format!("{at}.content must be a string or a list of content blocks");
            return Err(ApiError::invalid(format!("{at}.content"), message));
        }
    };
    let (mut texts, mut calls) = (Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let block_at = format!("{at}.content[{j}]");
        let field = |key: &str| block.get(key).and_then(Value::as_str).map(str::to_string);
        match (role, block.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => texts.push(field("text").unwrap_or_default()),
            (_, Some("thinking" | "redacted_thinking")) => {}
            ("assistant", Some("tool_use")) => {
                let (Some(id), Some(name)) = (field("id"), field("name")) else {
                    return Err(ApiError::invalid(block_at.clone(), format!("{block_at}: tool_use needs id and name")));
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}),
                );
            }
            ("user", Some("tool_result")) => {
                let Some(id) = field("tool_use_id") else {
                    let message = format!("{block_at}.tool_use_id must name the tool_use it answers");
                    return Err(ApiError::invalid(format!("{block_at}.tool_use_id"), message));
                };
                let content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(content) => block_text(&format!("{block_at}.content"), content)?,
                };
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (_, kind) => return Err(unsupported(&block_at, kind)),
        }
    }
    if role == "assistant" {
        let content = (!texts.is_empty()).then(|| texts.join("\n"));
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        messages.push(message);
    } else if !texts.is_empty() {
        messages.push(json!({"role": "user", "content": texts.join("\n")}));
    }
    Ok(())
}

/// `[{name, description, input_schema}]` as chat's function tools.
fn chat_tools(tools: Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else { return Err(ApiError::invalid("tools", "'tools' must be a list")) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        if let Some(kind) = tool.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            let message = format!("tools[{i}]: tool type '{kind}' is not supported; only client tools run here");
            return Err(ApiError::invalid(format!("tools[{i}].type"), message));
        }
        let mut function = Map::new();
        function.insert("name".into(), tool.get("name").cloned().unwrap_or(Value::Null));
        if let Some(description) = tool.get("description") {
            function.insert("description".into(), description.clone());
        }
        function.insert(
            "parameters".into(),
            tool.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
        );
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

/// `{type: auto | any | tool | none, name?, disable_parallel_tool_use?}` as chat's choice and parallel flag.
fn chat_tool_choice(choice: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = choice.get("disable_parallel_tool_use").and_then(Value::as_bool) != Some(true);
    let chat = match (choice.get("type").and_then(Value::as_str), choice.get("name")) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(name)) => json!({"type": "function", "function": {"name": name}}),
        _ => {
            return Err(ApiError::invalid(
                "tool_choice",
                "'tool_choice' must be {type: auto | any | none} or {type: tool, name}",
            ))
        }
    };
    Ok((chat, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: Value) -> Result<ChatCompletionRequest, ApiError> {
        parse(body.to_string().as_bytes()).map(|(request, _)| request)
    }

    fn param_of(result: Result<ChatCompletionRequest, ApiError>) -> Option<String> {
        match result {
            Err(ApiError::InvalidRequest { param, .. }) => param,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn test_tool_use_and_tool_result_blocks_become_calls_and_tool_messages() {
        let messages = json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "cold"},
                {"type": "text", "text": "Thanks."}]},
        ]);
        let request = parsed(json!({"system": "Be brief.", "messages": messages, "max_tokens": 5})).expect("ok");
        let roles: Vec<_> = request.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(request.messages[2].tool_calls[0].function.arguments, json!({"city": "Oslo"}));
        assert_eq!(request.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(request.max_completion_tokens, Some(5));
    }

    #[test]
    fn test_errors_name_the_messages_field() {
        let messages = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param_of(parsed(json!({"messages": messages}))).as_deref(), Some("max_tokens"));
        let stop = json!({"messages": messages, "max_tokens": 4, "stop_sequences": [1]});
        assert_eq!(param_of(parsed(stop)).as_deref(), Some("stop_sequences"));
        let image = json!([{"role": "user", "content": [{"type": "image"}]}]);
        assert_eq!(
            param_of(parsed(json!({"messages": image, "max_tokens": 4}))).as_deref(),
            Some("messages[0].content[0].type")
        );
        let choice = json!({"messages": messages, "max_tokens": 4, "tool_choice": {"type": "sometimes"}});
        assert_eq!(param_of(parsed(choice)).as_deref(), Some("tool_choice"));
    }
}
