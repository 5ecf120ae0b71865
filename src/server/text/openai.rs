//! OpenAI's wire types: requests parsed field by field so every error names its field, and responses.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

pub use super::responses::*;
pub use super::rules::ResponseFormat;
use super::tools::{parse_message_calls, parse_tools, ToolRequest};
use crate::server::error::ApiError;
use tensorfold_engine::text::chat::ToolCall;

/// Fields both endpoints share; absent and `null` are both `None`.
#[derive(Debug, Default, PartialEq)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<serde_json::Number>,
    pub stop: Vec<String>,
    pub n: Option<u64>,
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<Map<String, Value>>,
    pub response_format: Option<ResponseFormat>,
    /// `false` skips the prefix cache: no lookup, and the prompt's pages are not kept.
    pub cache: Option<bool>,
    /// `false` turns drafting off for the request; its output is the same either way.
    pub draft: Option<bool>,
}

#[derive(Debug, Default, PartialEq, serde::Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
    /// A function's result, answering an assistant's call.
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A chat message with its text parts already joined.
#[derive(Debug, PartialEq)]
pub struct RequestMessage {
    pub role: Role,
    pub content: String,
    /// An assistant's earlier calls.
    pub tool_calls: Vec<ToolCall>,
    /// On a tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// On a tool message: the function's name, when given.
    pub name: Option<String>,
}

#[derive(Debug, PartialEq)]
pub struct ChatCompletionRequest {
    pub messages: Vec<RequestMessage>,
    /// `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tools are offered.
    pub tools: Option<ToolRequest>,
    pub common: CommonParams,
    pub max_completion_tokens: Option<u64>,
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
    /// Variables for the chat template (`enable_thinking`, ..), as transformers' `apply_chat_template` takes them.
    pub template_kwargs: Map<String, Value>,
}

/// A completions prompt: text, or token ids as they are.
#[derive(Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, PartialEq)]
pub struct CompletionRequest {
    /// One or more prompts; each gets `n` choices.
    pub prompts: Vec<Prompt>,
    pub common: CommonParams,
    pub max_completion_tokens: Option<u64>,
    pub logprobs: Option<u64>,
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

/// A JSON object whose known fields are taken one by one; the rest are ignored as OpenAI does.
pub(in crate::server) struct Fields(Map<String, Value>);

impl Fields {
    pub(in crate::server) fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Fields(map)),
            Ok(_) => Err(ApiError::invalid_body("the request body must be a JSON object")),
            Err(e) => Err(ApiError::invalid_body(format!("the request body is not valid JSON: {e}"))),
        }
    }

    pub(in crate::server) fn take_value(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key).filter(|v| !v.is_null())
    }

    pub(in crate::server) fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ApiError> {
        self.take_value(key)
            .map(|v| serde_json::from_value(v).map_err(|e| ApiError::invalid(key, format!("'{key}': {e}"))))
            .transpose()
    }

    pub(in crate::server) fn required(&mut self, key: &str) -> Result<Value, ApiError> {
        self.take_value(key).ok_or_else(|| ApiError::invalid(key, format!("'{key}' is required")))
    }

    /// A field that must be present, as `T`.
    pub(in crate::server) fn required_as<T: DeserializeOwned>(&mut self, key: &str) -> Result<T, ApiError> {
        self.take(key)?.ok_or_else(|| ApiError::invalid(key, format!("'{key}' is required")))
    }

    fn common(&mut self) -> Result<CommonParams, ApiError> {
        Ok(CommonParams {
            model: self.take("model")?,
            max_tokens: self.take("max_tokens")?,
            temperature: self.take("temperature")?,
            top_p: self.take("top_p")?,
            top_k: self.take("top_k")?,
            min_p: self.take("min_p")?,
            repetition_penalty: self.take("repetition_penalty")?,
            seed: self.take("seed")?,
            stop: self.take_value("stop").map(parse_stop).transpose()?.unwrap_or_default(),
            n: self.take("n")?,
            stream: self.take("stream")?.unwrap_or(false),
            stream_options: self.take("stream_options")?,
            presence_penalty: self.take("presence_penalty")?,
            frequency_penalty: self.take("frequency_penalty")?,
            logit_bias: self.take("logit_bias")?,
            response_format: self.take_value("response_format").map(ResponseFormat::parse).transpose()?,
            cache: self.take("cache")?,
            draft: self.take("draft")?,
        })
    }
}

fn parse_stop(value: Value) -> Result<Vec<String>, ApiError> {
    let wrong = || ApiError::invalid("stop", "'stop' must be a string or a list of strings");
    match value {
        Value::String(s) => Ok(vec![s]),
        Value::Array(items) => items.into_iter().map(|v| v.as_str().map(str::to_string).ok_or_else(wrong)).collect(),
        _ => Err(wrong()),
    }
}

impl ChatCompletionRequest {
    pub fn from_json(body: &[u8]) -> Result<ChatCompletionRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let Value::Array(items) = fields.required("messages")? else {
            return Err(ApiError::invalid("messages", "'messages' must be a list of messages"));
        };
        let messages = items.into_iter().enumerate().map(|(i, m)| parse_message(i, m)).collect::<Result<_, _>>()?;
        let tools = parse_tools(&mut fields)?;
        Ok(ChatCompletionRequest {
            messages,
            tools,
            common: fields.common()?,
            max_completion_tokens: fields.take("max_completion_tokens")?,
            logprobs: fields.take("logprobs")?.unwrap_or(false),
            top_logprobs: fields.take("top_logprobs")?,
            template_kwargs: fields.take("chat_template_kwargs")?.unwrap_or_default(),
        })
    }
}

fn parse_message(index: usize, message: Value) -> Result<RequestMessage, ApiError> {
    let at = |field: &str| format!("messages[{index}]{field}");
    let Value::Object(mut message) = message else {
        return Err(ApiError::invalid(at(""), format!("{} must be an object with 'role' and 'content'", at(""))));
    };
    let role = match message.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool" | "function") => Role::Tool,
        Some(other) => {
            let message =
                format!("{}: role '{other}' is not supported; use system, user, assistant or tool", at(".role"));
            return Err(ApiError::invalid(at(".role"), message));
        }
        None => return Err(ApiError::invalid(at(".role"), format!("{} must be a string", at(".role")))),
    };
    let content = match message.remove("content").unwrap_or(Value::Null) {
        Value::String(text) => text,
        Value::Null if role == Role::Assistant || role == Role::Tool => String::new(),
        Value::Array(parts) => {
            let texts = parts.into_iter().enumerate().map(|(j, part)| {
                let part_at = at(&format!(".content[{j}]"));
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(text)) => Ok(text.to_string()),
                    (Some("text"), None) => {
                        Err(ApiError::invalid(part_at.clone(), format!("{part_at}.text must be a string")))
                    }
                    (kind, _) => {
                        let kind = kind.unwrap_or("missing");
                        let message = format!("{part_at}: content part type '{kind}' is not supported; only 'text'");
                        Err(ApiError::invalid(format!("{part_at}.type"), message))
                    }
                }
            });
            texts.collect::<Result<Vec<_>, _>>()?.join("\n")
        }
        _ => {
            let message = format!("{} must be a string or a list of text parts", at(".content"));
            return Err(ApiError::invalid(at(".content"), message));
        }
    };
    let tool_calls = match message.remove("tool_calls").filter(|v| !v.is_null()) {
        Some(calls) if role == Role::Assistant => parse_message_calls(&at(""), calls)?,
        Some(_) => {
            let message = format!("{} is only allowed on assistant messages", at(".tool_calls"));
            return Err(ApiError::invalid(at(".tool_calls"), message));
        }
        None => Vec::new(),
    };
    let mut text_field = |key: &str| match message.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => {
            let field = at(&format!(".{key}"));
            Err(ApiError::invalid(field.clone(), format!("{field} must be a string")))
        }
    };
    let (tool_call_id, name) = (text_field("tool_call_id")?, text_field("name")?);
    if role == Role::Tool && tool_call_id.is_none() && name.is_none() {
        let message = format!("{} must be the id of the call this message answers", at(".tool_call_id"));
        return Err(ApiError::invalid(at(".tool_call_id"), message));
    }
    Ok(RequestMessage { role, content, tool_calls, tool_call_id, name })
}

impl CompletionRequest {
    pub fn from_json(body: &[u8]) -> Result<CompletionRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let prompts = parse_prompts(fields.required("prompt")?)?;
        Ok(CompletionRequest {
            prompts,
            common: fields.common()?,
            max_completion_tokens: fields.take("max_completion_tokens")?,
            logprobs: fields.take("logprobs")?,
            echo: fields.take("echo")?.unwrap_or(false),
            suffix: fields.take("suffix")?,
            best_of: fields.take("best_of")?,
        })
    }
}

/// A string, a list of token ids, or a list of either: several prompts.
fn parse_prompts(value: Value) -> Result<Vec<Prompt>, ApiError> {
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items.iter().map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok())).collect()
    };
    let wrong = || {
        ApiError::invalid("prompt", "'prompt' must be a string, token ids, or a list of strings or of token id lists")
    };
    match value {
        Value::String(text) => Ok(vec![Prompt::Text(text)]),
        Value::Array(items) => match items.first() {
            None => Err(ApiError::invalid("prompt", "the prompt is empty")),
            Some(Value::String(_) | Value::Array(_)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(text) => Ok(Prompt::Text(text)),
                    Value::Array(inner) => ids(&inner).map(Prompt::Ids).ok_or_else(wrong),
                    _ => Err(wrong()),
                })
                .collect(),
            Some(_) => ids(&items).map(|ids| vec![Prompt::Ids(ids)]).ok_or_else(wrong),
        },
        _ => Err(wrong()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: serde_json::Value) -> Result<ChatCompletionRequest, ApiError> {
        ChatCompletionRequest::from_json(body.to_string().as_bytes())
    }

    fn param_of(result: Result<impl std::fmt::Debug, ApiError>) -> Option<String> {
        match result {
            Err(ApiError::InvalidRequest { param, .. }) => param,
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn test_malformed_json_and_non_objects_are_400_without_param() {
        assert_eq!(param_of(ChatCompletionRequest::from_json(b"{\"messages\": [")), None);
        assert_eq!(param_of(ChatCompletionRequest::from_json(b"[1, 2]")), None);
    }

    #[test]
    fn test_wrong_types_name_the_field() {
        let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            param_of(chat(serde_json::json!({"messages": messages, "temperature": "hot"}))).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            param_of(chat(serde_json::json!({"messages": messages, "max_tokens": -1}))).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(param_of(chat(serde_json::json!({"messages": messages, "stop": [1]}))).as_deref(), Some("stop"));
        assert_eq!(
            param_of(chat(serde_json::json!({"messages": messages, "stream": "yes"}))).as_deref(),
            Some("stream")
        );
        assert_eq!(param_of(chat(serde_json::json!({"messages": "hi"}))).as_deref(), Some("messages"));
        assert_eq!(param_of(chat(serde_json::json!({"model": "x"}))).as_deref(), Some("messages"));
    }

    #[test]
    fn test_messages_accept_strings_and_text_parts_only() {
        let request = chat(serde_json::json!({
            "model": "anything",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null},
            ],
            "user": "ignored",
            "unknown_field": 1,
        }))
        .expect("valid");
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant]);
        assert_eq!(request.messages[1].content, "a\nb");
        assert_eq!(request.messages[2].content, "");
        let image = serde_json::json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]);
        assert_eq!(
            param_of(chat(serde_json::json!({"messages": image}))).as_deref(),
            Some("messages[0].content[0].type")
        );
        let tool = serde_json::json!([{"role": "tool", "content": "x"}]);
        assert_eq!(param_of(chat(serde_json::json!({"messages": tool}))).as_deref(), Some("messages[0].tool_call_id"));
        let robot = serde_json::json!([{"role": "robot", "content": "x"}]);
        assert_eq!(param_of(chat(serde_json::json!({"messages": robot}))).as_deref(), Some("messages[0].role"));
        let number = serde_json::json!([{"role": "user", "content": 3}]);
        assert_eq!(param_of(chat(serde_json::json!({"messages": number}))).as_deref(), Some("messages[0].content"));
        let tools = serde_json::json!({"messages": [{"role": "user", "content": "x"}], "tools": [{}]});
        assert_eq!(param_of(chat(tools)).as_deref(), Some("tools[0].type"));
    }

    #[test]
    fn test_stop_and_nulls_parse() {
        let request = chat(serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "stop": "END", "temperature": null, "stream": true, "stream_options": {"include_usage": true},
        }))
        .expect("valid");
        assert_eq!(request.common.stop, ["END"]);
        assert_eq!(request.common.temperature, None);
        assert!(request.common.stream);
        assert_eq!(request.common.stream_options, Some(StreamOptions { include_usage: true }));
    }

    #[test]
    fn test_prompt_shapes() {
        let prompt = |v: serde_json::Value| {
            CompletionRequest::from_json(serde_json::json!({"prompt": v}).to_string().as_bytes())
        };
        let text = |s: &str| Prompt::Text(s.into());
        assert_eq!(prompt(serde_json::json!("hi")).expect("text").prompts, [text("hi")]);
        assert_eq!(prompt(serde_json::json!(["hi"])).expect("one text").prompts, [text("hi")]);
        assert_eq!(prompt(serde_json::json!([1, 2])).expect("ids").prompts, [Prompt::Ids(vec![1, 2])]);
        assert_eq!(prompt(serde_json::json!([[3]])).expect("nested ids").prompts, [Prompt::Ids(vec![3])]);
        assert_eq!(prompt(serde_json::json!(["a", "b"])).expect("texts").prompts, [text("a"), text("b")]);
        let lists = prompt(serde_json::json!([[1, 2], [3]])).expect("id lists").prompts;
        assert_eq!(lists, [Prompt::Ids(vec![1, 2]), Prompt::Ids(vec![3])]);
        assert_eq!(param_of(prompt(serde_json::json!([1.5]))).as_deref(), Some("prompt"));
        assert_eq!(param_of(prompt(serde_json::json!(["a", 1]))).as_deref(), Some("prompt"));
        assert_eq!(param_of(prompt(serde_json::json!([[1], [-1]]))).as_deref(), Some("prompt"));
        assert_eq!(param_of(prompt(serde_json::json!({}))).as_deref(), Some("prompt"));
        assert_eq!(param_of(prompt(serde_json::json!([]))).as_deref(), Some("prompt"));
    }

    #[test]
    fn test_chunk_usage_is_absent_null_or_counts() {
        let chunk = |usage| {
            serde_json::to_value(Completion {
                id: "cmpl-1".into(),
                object: "text_completion",
                created: 1,
                model: "m".into(),
                choices: vec![],
                usage,
            })
            .expect("serializes")
        };
        assert!(chunk(ChunkUsage::Absent).get("usage").is_none());
        assert_eq!(chunk(ChunkUsage::Null)["usage"], serde_json::Value::Null);
        let counts = UsageBody { prompt_tokens: 2, completion_tokens: 3, total_tokens: 5, ..UsageBody::default() };
        assert_eq!(chunk(ChunkUsage::Usage(counts))["usage"]["total_tokens"], 5);
    }

    #[test]
    fn test_token_map_keeps_order() {
        let map = TokenMap(vec![("b".into(), -0.5), ("a".into(), -1.0)]);
        assert_eq!(serde_json::to_string(&map).expect("serializes"), r#"{"b":-0.5,"a":-1.0}"#);
    }
}
