//! OpenAI's wire types for replies: completions, chunks, logprobs, usage and the model list.

use serde::{Serialize, Serializer};

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
    /// `null` when a reply holds only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallBody>>,
    /// The reasoning of a template that thinks, under both names clients read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// One call in a reply: `arguments` is JSON text, as OpenAI sends it.
#[derive(Debug, PartialEq, Serialize)]
pub struct ToolCallBody {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionBody,
}

#[derive(Debug, PartialEq, Serialize)]
pub struct FunctionBody {
    pub name: String,
    pub arguments: String,
}

/// A streamed call: `id`, `type` and `function.name` come once, `function.arguments` in one or more pieces.
#[derive(Debug, PartialEq, Serialize)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, PartialEq, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

impl Delta {
    /// A piece of reasoning, under both names clients read.
    pub fn reasoning(text: String) -> Delta {
        Delta { reasoning_content: Some(text.clone()), reasoning: Some(text), ..Delta::default() }
    }
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
