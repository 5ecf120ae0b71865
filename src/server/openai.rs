//! OpenAI's wire types: requests parsed field by field so every error names its field, and responses.

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use super::error::ApiError;

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
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// A chat message with its text parts already joined.
#[derive(Debug, PartialEq)]
pub struct RequestMessage {
    pub role: Role,
    pub content: String,
}

#[derive(Debug, PartialEq)]
pub struct ChatCompletionRequest {
    pub messages: Vec<RequestMessage>,
    pub common: CommonParams,
    pub max_completion_tokens: Option<u64>,
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
}

/// A completions prompt: text, or token ids as they are.
#[derive(Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, PartialEq)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub common: CommonParams,
    pub logprobs: Option<u64>,
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

/// A JSON object whose known fields are taken one by one; the rest are ignored as OpenAI does.
pub(super) struct Fields(Map<String, Value>);

impl Fields {
    pub(super) fn parse(body: &[u8]) -> Result<Fields, ApiError> {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Fields(map)),
            Ok(_) => Err(ApiError::invalid_body("the request body must be a JSON object")),
            Err(e) => Err(ApiError::invalid_body(format!("the request body is not valid JSON: {e}"))),
        }
    }

    pub(super) fn take_value(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key).filter(|v| !v.is_null())
    }

    pub(super) fn take<T: DeserializeOwned>(&mut self, key: &str) -> Result<Option<T>, ApiError> {
        self.take_value(key)
            .map(|v| serde_json::from_value(v).map_err(|e| ApiError::invalid(key, format!("'{key}': {e}"))))
            .transpose()
    }

    pub(super) fn required(&mut self, key: &str) -> Result<Value, ApiError> {
        self.take_value(key).ok_or_else(|| ApiError::invalid(key, format!("'{key}' is required")))
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
        for unsupported in ["tools", "functions"] {
            if fields.take_value(unsupported).is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
                return Err(ApiError::invalid(unsupported, format!("'{unsupported}' is not supported")));
            }
        }
        if let Some(format) = fields.take_value("response_format") {
            if format.get("type").and_then(Value::as_str) != Some("text") {
                return Err(ApiError::invalid("response_format", "only {\"type\": \"text\"} is supported"));
            }
        }
        Ok(ChatCompletionRequest {
            messages,
            common: fields.common()?,
            max_completion_tokens: fields.take("max_completion_tokens")?,
            logprobs: fields.take("logprobs")?.unwrap_or(false),
            top_logprobs: fields.take("top_logprobs")?,
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
        Some(other) => {
            let message = format!("{}: role '{other}' is not supported; use system, user or assistant", at(".role"));
            return Err(ApiError::invalid(at(".role"), message));
        }
        None => return Err(ApiError::invalid(at(".role"), format!("{} must be a string", at(".role")))),
    };
    let content = match message.remove("content").unwrap_or(Value::Null) {
        Value::String(text) => text,
        Value::Null if role == Role::Assistant => String::new(),
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
    Ok(RequestMessage { role, content })
}

impl CompletionRequest {
    pub fn from_json(body: &[u8]) -> Result<CompletionRequest, ApiError> {
        let mut fields = Fields::parse(body)?;
        let prompt = parse_prompt(fields.required("prompt")?)?;
        Ok(CompletionRequest {
            prompt,
            common: fields.common()?,
            logprobs: fields.take("logprobs")?,
            echo: fields.take("echo")?.unwrap_or(false),
            suffix: fields.take("suffix")?,
            best_of: fields.take("best_of")?,
        })
    }
}

/// A string, a list of one string, a list of token ids, or a list of one list of ids.
fn parse_prompt(value: Value) -> Result<Prompt, ApiError> {
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items.iter().map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok())).collect()
    };
    let batch = || ApiError::invalid("prompt", "only one prompt per request is supported");
    let wrong = || ApiError::invalid("prompt", "'prompt' must be a string, a list of one string, or token ids");
    match value {
        Value::String(text) => Ok(Prompt::Text(text)),
        Value::Array(items) => match items.as_slice() {
            [] => Err(ApiError::invalid("prompt", "the prompt is empty")),
            [Value::String(text)] => Ok(Prompt::Text(text.clone())),
            [Value::Array(inner)] => ids(inner).map(Prompt::Ids).ok_or_else(wrong),
            [Value::String(_) | Value::Array(_), ..] => Err(batch()),
            _ => ids(&items).map(Prompt::Ids).ok_or_else(wrong),
        },
        _ => Err(wrong()),
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct UsageBody {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// OpenAI's breakdown of the prompt: the tokens served from the prefix cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl From<tensorfold_actors::request_types::Usage> for UsageBody {
    fn from(usage: tensorfold_actors::request_types::Usage) -> UsageBody {
        UsageBody {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.prompt_tokens + usage.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: usage.cached_tokens },
        }
    }
}

/// A chunk's `usage`: absent unless asked for, then `null` on every chunk but the last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChunkUsage {
    Absent,
    Null,
    Usage(UsageBody),
}

impl ChunkUsage {
    fn is_absent(&self) -> bool {
        *self == ChunkUsage::Absent
    }
}

impl Serialize for ChunkUsage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ChunkUsage::Usage(usage) => usage.serialize(serializer),
            _ => serializer.serialize_none(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageBody,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(skip_serializing_if = "ChunkUsage::is_absent")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// Both the whole completion and a streamed chunk; they share `object: "text_completion"`.
#[derive(Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "ChunkUsage::is_absent")]
    pub usage: ChunkUsage,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct ChatLogprobToken {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprobToken>,
}

/// The legacy completions layout: parallel lists, one entry per token.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<TokenMap>,
    pub text_offset: Vec<usize>,
}

/// `{token: logprob}` in the runtime's order, most likely first.
#[derive(Debug, Default, PartialEq)]
pub struct TokenMap(pub Vec<(String, f32)>);

impl Serialize for TokenMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[derive(Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Most positions one request may use, prompt plus output, under vLLM's name; absent for a voice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// The same number under the name other servers and clients read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
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
        assert_eq!(param_of(chat(serde_json::json!({"messages": tool}))).as_deref(), Some("messages[0].role"));
        let number = serde_json::json!([{"role": "user", "content": 3}]);
        assert_eq!(param_of(chat(serde_json::json!({"messages": number}))).as_deref(), Some("messages[0].content"));
        let tools = serde_json::json!({"messages": [{"role": "user", "content": "x"}], "tools": [{}]});
        assert_eq!(param_of(chat(tools)).as_deref(), Some("tools"));
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
        assert_eq!(prompt(serde_json::json!("hi")).expect("text").prompt, Prompt::Text("hi".into()));
        assert_eq!(prompt(serde_json::json!(["hi"])).expect("one text").prompt, Prompt::Text("hi".into()));
        assert_eq!(prompt(serde_json::json!([1, 2])).expect("ids").prompt, Prompt::Ids(vec![1, 2]));
        assert_eq!(prompt(serde_json::json!([[3]])).expect("nested ids").prompt, Prompt::Ids(vec![3]));
        assert_eq!(param_of(prompt(serde_json::json!(["a", "b"]))).as_deref(), Some("prompt"));
        assert_eq!(param_of(prompt(serde_json::json!([1.5]))).as_deref(), Some("prompt"));
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
