//! Events become OpenAI replies: what both shapes share, token log-probabilities, and the non-streamed body.

use std::sync::Arc;

use serde::Serialize;
use tensorfold_actors::request_types::{Event, FinishReason, TokenLogprob, Usage};
use tokio::sync::mpsc;

use super::openai::{
    ChatChoice, ChatCompletion, ChatLogprobToken, ChatLogprobs, ChunkUsage, Completion, CompletionChoice,
    CompletionLogprobs, TokenMap, TopLogprob,
};
use super::tools::assistant_message;
use super::validate::ReplyOptions;
use crate::server::error::ApiError;
use tensorfold_engine::text::reasoning::{ReasoningSplit, ThinkStart};
use tensorfold_engine::text::tokenizer::Tokenizer;
use tensorfold_engine::text::tool_calls::ToolFormat;

/// JSON has no infinities; OpenAI-compatible servers report impossible tokens with this floor.
const LOGPROB_FLOOR: f32 = -9999.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// The fields every reply and chunk of one request repeats.
#[derive(Clone, Debug)]
pub struct ReplyMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
}

impl ReplyMeta {
    /// A fresh id in OpenAI's style for this kind of request.
    pub fn new(kind: Kind, model: &str, created: u64) -> ReplyMeta {
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        let id = format!("{prefix}-{:016x}{:016x}", crate::server::random_u64(), crate::server::random_u64());
        ReplyMeta { id, created, model: model.to_string(), kind }
    }

    pub fn completion(&self, choices: Vec<CompletionChoice>, usage: ChunkUsage) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }
}

/// Renders the runtime's token log-probabilities as text, keeping the completions text offset.
pub struct LogprobText {
    tokenizer: Arc<Tokenizer>,
    text_offset: usize,
}

impl LogprobText {
    pub fn new(tokenizer: Arc<Tokenizer>) -> LogprobText {
        LogprobText { tokenizer, text_offset: 0 }
    }

    fn token(&self, id: u32) -> String {
        self.tokenizer.decode(&[id])
    }

    pub fn chat(&self, id: u32, logprob: &TokenLogprob) -> ChatLogprobToken {
        let top = logprob.top.iter().map(|&(id, lp)| {
            let token = self.token(id);
            TopLogprob { bytes: token.as_bytes().to_vec(), token, logprob: finite(lp) }
        });
        let token = self.token(id);
        ChatLogprobToken {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: finite(logprob.logprob),
            top_logprobs: top.collect(),
        }
    }

    pub fn push_completion(&mut self, into: &mut CompletionLogprobs, id: u32, logprob: &TokenLogprob) {
        let token = self.token(id);
        let top = logprob.top.iter().map(|&(id, lp)| (self.token(id), finite(lp))).collect();
        into.text_offset.push(self.text_offset);
        self.text_offset += token.chars().count();
        into.tokens.push(token);
        into.token_logprobs.push(finite(logprob.logprob));
        into.top_logprobs.push(TokenMap(top));
    }
}

fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() {
        logprob
    } else {
        LOGPROB_FLOOR
    }
}

/// What a receiver that closes without `Done` or `Error` is reported as.
pub const ENDED_EARLY: &str = "the runtime ended the request without a result";

/// The whole reply of a non-streamed request.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Chat(ChatCompletion),
    Completion(Completion),
}

/// Folds one choice's events into its text, log-probabilities and end.
pub struct Collector {
    kind: Kind,
    tools: Option<ToolFormat>,
    reasoning: Option<ThinkStart>,
    logprobs: Option<LogprobText>,
    text: String,
    chat_logprobs: Vec<ChatLogprobToken>,
    completion_logprobs: CompletionLogprobs,
}

/// One choice, complete.
pub struct Collected {
    text: String,
    tools: Option<ToolFormat>,
    reasoning: Option<ThinkStart>,
    chat_logprobs: Option<ChatLogprobs>,
    completion_logprobs: Option<CompletionLogprobs>,
    finish: FinishReason,
    usage: Usage,
}

impl Collector {
    /// A choice whose text starts with `prefix` (the prompt, under `echo`).
    pub fn new(kind: Kind, options: ReplyOptions, tokenizer: Arc<Tokenizer>, prefix: String) -> Collector {
        Collector {
            kind,
            tools: options.tools,
            reasoning: options.reasoning,
            logprobs: options.logprobs.then(|| LogprobText::new(tokenizer)),
            text: prefix,
            chat_logprobs: Vec::new(),
            completion_logprobs: CompletionLogprobs::default(),
        }
    }

    /// Takes the next event (`None` when the channel closed); the choice once the runtime is done.
    pub fn push(&mut self, event: Option<Event>) -> Result<Option<Collected>, ApiError> {
        match event {
            Some(Event::Token { id, text, logprob }) => {
                self.text.push_str(&text);
                if let (Some(render), Some(logprob)) = (self.logprobs.as_mut(), logprob.as_ref()) {
                    match self.kind {
                        Kind::Chat => self.chat_logprobs.push(render.chat(id, logprob)),
                        Kind::Completion => render.push_completion(&mut self.completion_logprobs, id, logprob),
                    }
                }
                Ok(None)
            }
            Some(Event::Done { finish, usage, .. }) => Ok(Some(self.collected(finish, usage))),
            Some(Event::Error(e)) => Err(ApiError::Engine(e)),
            Some(Event::Audio { .. } | Event::Embedding { .. }) => {
                Err(ApiError::Internal("audio on a text request".into()))
            }
            None => Err(ApiError::Internal(ENDED_EARLY.to_string())),
        }
    }

    fn collected(&mut self, finish: FinishReason, usage: Usage) -> Collected {
        let wants = self.logprobs.is_some();
        Collected {
            text: std::mem::take(&mut self.text),
            tools: self.tools,
            reasoning: self.reasoning,
            chat_logprobs: (wants && self.kind == Kind::Chat)
                .then(|| ChatLogprobs { content: std::mem::take(&mut self.chat_logprobs) }),
            completion_logprobs: (wants && self.kind == Kind::Completion)
                .then(|| std::mem::take(&mut self.completion_logprobs)),
            finish,
            usage,
        }
    }
}

/// The usage of a request's lanes: each prompt's tokens once (its lanes share it), every lane's output.
pub fn merged_usage(usages: impl IntoIterator<Item = Usage>, n: usize) -> Usage {
    let mut total = Usage { prompt_tokens: 0, completion_tokens: 0, cached_tokens: 0 };
    for (index, usage) in usages.into_iter().enumerate() {
        if index % n.max(1) == 0 {
            total.prompt_tokens += usage.prompt_tokens;
            total.cached_tokens += usage.cached_tokens;
        }
        total.completion_tokens += usage.completion_tokens;
    }
    total
}

/// The reply of every choice, in choice order.
pub fn reply(meta: &ReplyMeta, choices: Vec<Collected>, n: usize) -> Reply {
    let usage = merged_usage(choices.iter().map(|c| c.usage), n);
    match meta.kind {
        Kind::Chat => Reply::Chat(ChatCompletion {
            id: meta.id.clone(),
            object: "chat.completion",
            created: meta.created,
            model: meta.model.clone(),
            choices: choices
                .into_iter()
                .zip(0..)
                .map(|(c, index)| {
                    let (reasoning, text) = match c.reasoning {
                        Some(start) => ReasoningSplit::split(start, &c.text),
                        None => (None, c.text),
                    };
                    let (mut message, finish_reason) = assistant_message(c.tools, text, c.finish.as_str());
                    message.reasoning_content.clone_from(&reasoning);
                    message.reasoning = reasoning;
                    ChatChoice { index, message, logprobs: c.chat_logprobs, finish_reason }
                })
                .collect(),
            usage: usage.into(),
        }),
        Kind::Completion => {
            let choices = choices
                .into_iter()
                .zip(0..)
                .map(|(c, index)| CompletionChoice {
                    index,
                    text: c.text,
                    logprobs: c.completion_logprobs,
                    finish_reason: Some(c.finish.as_str()),
                })
                .collect();
            Reply::Completion(meta.completion(choices, ChunkUsage::Usage(usage.into())))
        }
    }
}

/// Waits for every choice; dropping this future drops the receivers, which cancels the lanes still running,
/// and so does the first error.
pub async fn collect(
    lanes: Vec<(mpsc::Receiver<Event>, Collector)>,
    meta: &ReplyMeta,
    n: usize,
) -> Result<Reply, ApiError> {
    let choices = futures_util::future::try_join_all(lanes.into_iter().map(|(mut events, mut collector)| async move {
        loop {
            if let Some(choice) = collector.push(events.recv().await)? {
                return Ok::<_, ApiError>(choice);
            }
        }
    }))
    .await?;
    Ok(reply(meta, choices, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::test_support::tokenizer;
    use tensorfold_actors::request_types::EngineError;

    fn meta(kind: Kind) -> ReplyMeta {
        ReplyMeta { id: "id-1".into(), created: 7, model: "tiny".into(), kind }
    }

    fn options(logprobs: bool) -> ReplyOptions {
        ReplyOptions { stream: false, include_usage: false, logprobs, n: 1, tools: None, reasoning: None }
    }

    fn token(id: u32, text: &str) -> Event {
        let logprob = Some(TokenLogprob { logprob: -0.25, top: vec![(id, -0.25), (4, f32::NEG_INFINITY)] });
        Event::Token { id, text: text.into(), logprob }
    }

    async fn run(kind: Kind, logprobs: bool, events: Vec<Event>) -> Result<serde_json::Value, ApiError> {
        let (sender, receiver) = mpsc::channel(16);
        for event in events {
            sender.try_send(event).expect("room in the channel");
        }
        drop(sender);
        let collector = Collector::new(kind, options(logprobs), tokenizer(), String::new());
        let reply = collect(vec![(receiver, collector)], &meta(kind), 1).await?;
        Ok(serde_json::to_value(reply).expect("serializes"))
    }

    fn done() -> Event {
        Event::Done {
            finish: FinishReason::Length,
            usage: Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0 },
            stop_sequence: None,
        }
    }

    #[actix_web::test]
    async fn test_chat_reply_shape() {
        let json = run(Kind::Chat, false, vec![token(3, "hello"), token(4, " world"), done()]).await.expect("ok");
        assert_eq!(
            json,
            serde_json::json!({
                "id": "id-1", "object": "chat.completion", "created": 7, "model": "tiny",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello world"},
                    "logprobs": null, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}},
            })
        );
    }

    #[actix_web::test]
    async fn test_completion_reply_with_logprobs() {
        let json = run(Kind::Completion, true, vec![token(3, "hello"), token(4, " world"), done()]).await.expect("ok");
        assert_eq!(json["object"], "text_completion");
        assert_eq!(json["choices"][0]["text"], "hello world");
        let logprobs = &json["choices"][0]["logprobs"];
        assert_eq!(logprobs["tokens"], serde_json::json!(["hello", "world"]));
        assert_eq!(logprobs["token_logprobs"], serde_json::json!([-0.25, -0.25]));
        assert_eq!(logprobs["top_logprobs"][0], serde_json::json!({"hello": -0.25, "world": -9999.0}));
        assert_eq!(logprobs["text_offset"], serde_json::json!([0, 5]));
    }

    #[actix_web::test]
    async fn test_chat_logprobs_shape() {
        let json = run(Kind::Chat, true, vec![token(3, "hello"), done()]).await.expect("ok");
        let entry = &json["choices"][0]["logprobs"]["content"][0];
        assert_eq!(entry["token"], "hello");
        assert_eq!(entry["bytes"], serde_json::json!(b"hello".to_vec()));
        assert_eq!(entry["top_logprobs"][1]["token"], "world");
        assert_eq!(entry["top_logprobs"][1]["logprob"], -9999.0);
    }

    #[actix_web::test]
    async fn test_errors_and_early_close_are_500s() {
        let error = Event::Error(EngineError::Device("device lost".into()));
        match run(Kind::Chat, false, vec![token(3, "hello"), error]).await {
            Err(e @ ApiError::Engine(_)) => {
                assert_eq!(e.to_string(), "the GPU failed: device lost");
                assert_eq!(e.body().error.code, Some("engine_device_error"));
            }
            other => panic!("expected a 500, got {other:?}"),
        }
        match run(Kind::Completion, false, vec![token(3, "hello")]).await {
            Err(ApiError::Internal(message)) => assert_eq!(message, ENDED_EARLY),
            other => panic!("expected a 500, got {other:?}"),
        }
    }
}
